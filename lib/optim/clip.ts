/**
 * Gradient norm and clipping over the gradient arena, computed on the device without a host
 * synchronisation (`torch.nn.utils.clip_grad_norm_` with the L2 norm).
 * @packageDocumentation
 */
import { addon } from '../binding.js';
import { expectNumber, invalid } from '../errors.js';
import { Module } from '../nn/module.js';
import { ParameterArena, type Parameter } from '../nn/parameter.js';
import { opRecorder } from '../profile/hooks.js';
import { Tensor } from '../tensor.js';

/** What the gradient norm is taken over: a model's parameters, or every parameter of an arena. */
export type GradTarget = Module | ParameterArena;

// One f32[1] result per arena, reused by every call, so that a training loop allocates nothing.
const normTensors = new WeakMap<ParameterArena, Tensor>();

function resolve(target: GradTarget): { arena: ParameterArena; segments: Int32Array } {
  let arena: ParameterArena;
  let params: readonly Parameter[];
  if (target instanceof Module) {
    params = target.parameters();
    if (params.length === 0) invalid('target', 'a module with parameters', target);
    arena = target.arena();
  } else if (target instanceof ParameterArena) {
    arena = target;
    params = target.entries;
  } else {
    return invalid('target', 'a Module or a ParameterArena', target);
  }
  // Parameters that do not require gradients have none, as in PyTorch, and do not count.
  const triples: number[] = [];
  for (const p of params) if (p.requiresGrad) triples.push(p.offset, p.numel, 0);
  return { arena, segments: Int32Array.from(triples) };
}

function normTensor(arena: ParameterArena): Tensor {
  let t = normTensors.get(arena);
  if (!t || t.disposed || t.device !== arena.device) {
    t = Tensor.zeros([1], { device: arena.device });
    normTensors.set(arena, t);
  }
  return t;
}

function computeNorm(arena: ParameterArena, segments: Int32Array): Tensor {
  const out = normTensor(arena);
  const recorder = opRecorder;
  const token = recorder ? recorder.begin('grad_norm', 'optimizer', arena.device) : 0;
  // An empty table would mean "the whole arena" to the native op; no gradients means norm 0.
  if (segments.length === 0) addon().fill({ tensor: out.raw, value: 0 });
  else addon().gradNorm({ grads: arena.grads.raw, out: out.raw, segments });
  recorder?.end(token);
  return out;
}

/**
 * The total L2 norm of the gradients (of the parameters that require them) as an f32[1] tensor
 * on the device; read it with `item()` (which waits for the device). The tensor belongs to the
 * arena's cache and is overwritten by the next call: `clone()` it to keep the value.
 */
export function gradNorm(target: GradTarget): Tensor {
  const { arena, segments } = resolve(target);
  return computeNorm(arena, segments);
}

/**
 * Scales the gradients by `min(1, maxNorm / (norm + 1e-6))`, with the total L2 norm computed and
 * read on the device (no host synchronisation), as `torch.nn.utils.clip_grad_norm_` does. Returns
 * the total norm before clipping (see {@link gradNorm} for who owns it). With a GradScaler, call
 * `scaler.unscale(optimizer)` first, as in PyTorch.
 */
export function clipGradNorm(target: GradTarget, maxNorm: number): Tensor {
  const max = expectNumber('maxNorm', maxNorm, 0);
  const { arena, segments } = resolve(target);
  const norm = computeNorm(arena, segments);
  if (segments.length > 0) {
    const recorder = opRecorder;
    const token = recorder ? recorder.begin('clip_grad_norm', 'optimizer', arena.device) : 0;
    addon().clipGradNorm({ grads: arena.grads.raw, norm: norm.raw, maxNorm: max, segments });
    recorder?.end(token);
  }
  return norm;
}
