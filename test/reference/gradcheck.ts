/**
 * Central finite differences, to check the reference backward functions against their forwards.
 * @packageDocumentation
 */

/**
 * dL/dv for every element of `v` by central differences (L(v+h) − L(v−h)) / 2h. `v` is perturbed
 * in place and restored; `loss` must read it afresh on every call.
 */
export function numericGradient(v: Float64Array, loss: () => number, h = 1e-6): Float64Array {
  const grad = new Float64Array(v.length);
  for (let i = 0; i < v.length; ++i) {
    const saved = v[i]!;
    v[i] = saved + h;
    const plus = loss();
    v[i] = saved - h;
    const minus = loss();
    v[i] = saved;
    grad[i] = (plus - minus) / (2 * h);
  }
  return grad;
}

/** Σ a·b, the scalar loss whose gradient with respect to a is b. */
export function dot(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let s = 0;
  for (let i = 0; i < a.length; ++i) s += a[i]! * b[i]!;
  return s;
}
