/**
 * One SGD step over a flat parameter arena, in float64, with torch.optim.SGD's semantics.
 * @packageDocumentation
 */

/** A parameter group's hyperparameters; unset ones are 0 / false. */
export interface SgdGroup {
  lr: number;
  momentum?: number;
  dampening?: number;
  weightDecay?: number;
  nesterov?: boolean;
}

/** Elements [offset, offset + count) of the arena, stepped with groups[group]. */
export interface SgdSegment {
  offset: number;
  count: number;
  group: number;
}

/** Inputs of {@link sgdStep}; the arrays are not modified. */
export interface SgdStepOptions {
  params: ArrayLike<number>;
  grads: ArrayLike<number>;
  momentumBuffer?: ArrayLike<number> | undefined;
  groups: readonly SgdGroup[];
  segments: readonly SgdSegment[];
  /** The momentum buffers do not exist yet: they start as the first d_p. */
  firstStep?: boolean;
  /** Non-zero: the GradScaler found inf/NaN and the step is skipped. */
  foundInf?: number;
  /** Grads are multiplied by this first (GradScaler unscale). */
  gradScaleInv?: number;
}

/**
 * The parameters and momentum buffers after the step. Per element of a segment:
 * d = g·gradScaleInv + wd·p; with momentum, buf = first ? d : m·buf + (1−dampening)·d and
 * d = nesterov ? d + m·buf : buf; then p −= lr·d. Elements outside every segment are untouched.
 */
export function sgdStep(o: SgdStepOptions): { params: Float64Array; momentumBuffer: Float64Array | undefined } {
  const params = Float64Array.from(o.params);
  const buf = o.momentumBuffer ? Float64Array.from(o.momentumBuffer) : undefined;
  if (o.foundInf) return { params, momentumBuffer: buf };
  const inv = o.gradScaleInv ?? 1;
  for (const seg of o.segments) {
    const g = o.groups[seg.group];
    if (!g) throw new Error(`sgdStep: segment names group ${seg.group} of ${o.groups.length}`);
    const momentum = g.momentum ?? 0;
    for (let i = seg.offset; i < seg.offset + seg.count; ++i) {
      let d = o.grads[i]! * inv + (g.weightDecay ?? 0) * params[i]!;
      if (momentum !== 0) {
        if (!buf) throw new Error('sgdStep: momentum needs a momentum buffer');
        const b = o.firstStep ? d : momentum * buf[i]! + (1 - (g.dampening ?? 0)) * d;
        buf[i] = b;
        d = g.nesterov ? d + momentum * b : b;
      }
      params[i] = params[i]! - g.lr * d;
    }
  }
  return { params, momentumBuffer: buf };
}
