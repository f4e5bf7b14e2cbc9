/**
 * AdamW and LAMB steps, the gradient norm, GradScaler's unscale-and-check and scale update, and
 * gradient clipping over a flat arena, in float64, with PyTorch's semantics (torch.optim.AdamW,
 * timm's Lamb / NVIDIA's FusedLAMB, torch.nn.utils.clip_grad_norm_, torch.amp.GradScaler).
 * @packageDocumentation
 */
import type { SgdSegment } from './sgd.js';

/** One AdamW or LAMB group; unset ones take the native defaults. */
export interface AdamGroup {
  lr: number;
  beta1?: number;
  beta2?: number;
  eps?: number;
  weightDecay?: number;
  /** LAMB: apply the trust ratio without weight decay too. */
  alwaysAdapt?: boolean;
}

/** Inputs of {@link adamwStep} and {@link lambStep}; the arrays are not modified. */
export interface AdamStepOptions {
  params: ArrayLike<number>;
  grads: ArrayLike<number>;
  expAvg: ArrayLike<number>;
  expAvgSq: ArrayLike<number>;
  groups: readonly AdamGroup[];
  segments: readonly SgdSegment[];
  /** t, 1 on the first step. */
  step: number;
  /** Non-zero: the step is skipped. */
  foundInf?: number;
  gradScaleInv?: number;
}

/** Parameters and moments after a step. */
export interface AdamStepResult {
  params: Float64Array;
  expAvg: Float64Array;
  expAvgSq: Float64Array;
}

function hyper(g: AdamGroup): Required<AdamGroup> {
  return {
    lr: g.lr,
    beta1: g.beta1 ?? 0.9,
    beta2: g.beta2 ?? 0.999,
    eps: g.eps ?? 1e-8,
    weightDecay: g.weightDecay ?? 0,
    alwaysAdapt: g.alwaysAdapt ?? false,
  };
}

function start(o: AdamStepOptions): AdamStepResult {
  return {
    params: Float64Array.from(o.params),
    expAvg: Float64Array.from(o.expAvg),
    expAvgSq: Float64Array.from(o.expAvgSq),
  };
}

/** Updates m and v of element i in `s` with gradient g; returns [m, v]. */
function moments(s: AdamStepResult, i: number, g: number, h: Required<AdamGroup>): [number, number] {
  const m = h.beta1 * s.expAvg[i]! + (1 - h.beta1) * g;
  const v = h.beta2 * s.expAvgSq[i]! + (1 - h.beta2) * g * g;
  s.expAvg[i] = m;
  s.expAvgSq[i] = v;
  return [m, v];
}

/**
 * torch.optim.AdamW (amsgrad off) per element of a segment, g = grad·gradScaleInv:
 * p ← p(1 − lr·wd); m ← β1·m + (1−β1)g; v ← β2·v + (1−β2)g²;
 * p ← p − lr/(1−β1^t) · m / (√v/√(1−β2^t) + ε). Elements outside every segment are untouched.
 */
export function adamwStep(o: AdamStepOptions): AdamStepResult {
  const s = start(o);
  if (o.foundInf) return s;
  const inv = o.gradScaleInv ?? 1;
  for (const seg of o.segments) {
    const h = hyper(o.groups[seg.group]!);
    const bc1 = 1 - h.beta1 ** o.step;
    const bc2 = 1 - h.beta2 ** o.step;
    for (let i = seg.offset; i < seg.offset + seg.count; ++i) {
      const p = s.params[i]! * (1 - h.lr * h.weightDecay);
      const [m, v] = moments(s, i, o.grads[i]! * inv, h);
      s.params[i] = p - (h.lr / bc1) * (m / (Math.sqrt(v) / Math.sqrt(bc2) + h.eps));
    }
  }
  return s;
}

/**
 * LAMB per segment (one parameter tensor): m and v as AdamW; u = m̂/(√v̂ + ε) + wd·p;
 * r = ‖p‖/‖u‖ when the group adapts (weightDecay ≠ 0 or alwaysAdapt) and both norms are
 * positive, else 1; p ← p − lr·r·u.
 */
export function lambStep(o: AdamStepOptions): AdamStepResult & { ratios: number[] } {
  const s = start(o);
  const ratios: number[] = [];
  if (o.foundInf) return { ...s, ratios };
  const inv = o.gradScaleInv ?? 1;
  for (const seg of o.segments) {
    const h = hyper(o.groups[seg.group]!);
    const bc1 = 1 - h.beta1 ** o.step;
    const bc2 = 1 - h.beta2 ** o.step;
    const u = new Float64Array(seg.count);
    let pp = 0;
    let uu = 0;
    for (let k = 0; k < seg.count; ++k) {
      const i = seg.offset + k;
      const [m, v] = moments(s, i, o.grads[i]! * inv, h);
      u[k] = m / bc1 / (Math.sqrt(v / bc2) + h.eps) + h.weightDecay * s.params[i]!;
      pp += s.params[i]! ** 2;
      uu += u[k]! ** 2;
    }
    const adapt = h.weightDecay !== 0 || h.alwaysAdapt;
    const r = adapt && pp > 0 && uu > 0 ? Math.sqrt(pp) / Math.sqrt(uu) : 1;
    ratios.push(r);
    for (let k = 0; k < seg.count; ++k) s.params[seg.offset + k] = s.params[seg.offset + k]! - h.lr * r * u[k]!;
  }
  return { ...s, ratios };
}

/** The segments an op without groups works on: the ones given, else all `length` elements. */
function segmentsOrAll(segments: readonly SgdSegment[] | undefined, length: number): readonly SgdSegment[] {
  return segments && segments.length > 0 ? segments : [{ offset: 0, count: length, group: 0 }];
}

/** √(Σ g²) over the segments (all elements when none), and whether an element is inf or NaN. */
export function gradNorm(
  grads: ArrayLike<number>,
  segments?: readonly SgdSegment[],
): { norm: number; nonFinite: boolean } {
  let sum = 0;
  let nonFinite = false;
  for (const seg of segmentsOrAll(segments, grads.length)) {
    for (let i = seg.offset; i < seg.offset + seg.count; ++i) {
      sum += grads[i]! ** 2;
      nonFinite ||= !Number.isFinite(grads[i]!);
    }
  }
  return { norm: Math.sqrt(sum), nonFinite };
}

/** grads·invScale inside the segments (all when none); foundInf when an element was inf/NaN. */
export function unscaleAndCheck(
  grads: ArrayLike<number>,
  invScale: number,
  segments?: readonly SgdSegment[],
): { grads: Float64Array; foundInf: boolean } {
  const out = Float64Array.from(grads);
  let foundInf = false;
  for (const seg of segmentsOrAll(segments, grads.length)) {
    for (let i = seg.offset; i < seg.offset + seg.count; ++i) {
      foundInf ||= !Number.isFinite(out[i]!);
      out[i] = out[i]! * invScale;
    }
  }
  return { grads: out, foundInf };
}

/** grads·min(1, maxNorm/(norm + 1e-6)) inside the segments (all when none); NaN stays NaN. */
export function clipGradNorm(
  grads: ArrayLike<number>,
  norm: number,
  maxNorm: number,
  segments?: readonly SgdSegment[],
): Float64Array {
  const out = Float64Array.from(grads);
  const coef = maxNorm / (norm + 1e-6);
  const factor = coef > 1 ? 1 : coef;
  for (const seg of segmentsOrAll(segments, grads.length)) {
    for (let i = seg.offset; i < seg.offset + seg.count; ++i) out[i] = out[i]! * factor;
  }
  return out;
}

/** torch.amp's _amp_update_scale_: back off on inf/NaN, grow after growthInterval clean steps. */
export function scalerUpdate(o: {
  scale: number;
  growthTracker: number;
  foundInf: number;
  growthFactor: number;
  backoffFactor: number;
  growthInterval: number;
}): { scale: number; growthTracker: number } {
  if (o.foundInf !== 0) return { scale: Math.fround(o.scale * o.backoffFactor), growthTracker: 0 };
  const successful = o.growthTracker + 1;
  if (successful >= o.growthInterval) {
    const grown = Math.fround(o.scale * o.growthFactor);
    return { scale: Number.isFinite(grown) ? grown : o.scale, growthTracker: 0 };
  }
  return { scale: o.scale, growthTracker: successful };
}
