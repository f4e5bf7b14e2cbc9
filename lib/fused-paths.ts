/**
 * The switches of the fused CUDA paths, all off by default: the one place that reads the
 * `RESNET_CUDA_FUSED` environment variable. Its value is a comma-separated list of path names
 * (`optim`), `all`, or empty (off). A fused path computes what the path it replaces computes
 * (within the tolerances its tests state) in fewer launches and fewer bytes; each stays off until
 * a run on a GPU has shown it correct and faster there. The variable is read on every call, so a
 * process can switch a path on or off between steps.
 * @packageDocumentation
 */
import { ResnetError } from './errors.js';

/** The environment variable that switches fused paths on. */
export const FUSED_ENV = 'RESNET_CUDA_FUSED';

/**
 * The fused paths there are:
 * - `optim`: the GradScaler's inf/NaN check, the SGD, AdamW or LAMB update (unscaling as it
 *   reads the gradients), the scale update and the gradient zeroing in one op on CUDA, taken by
 *   {@link GradScaler.stepAndZeroGrad} (and so by the Trainer) and, in a step captured in a CUDA
 *   graph, by {@link GradScaler.stepOnDeviceAndZeroGrad}.
 * - `bn-add-relu`: a downsample block's two batch norms, the residual add and the ReLU in one pass
 *   on CUDA (`y = relu(bn(main) + bn(shortcut))` from the raw convolution outputs), and its
 *   backward, taken by {@link Residual} when both batch norms are local (not synchronised).
 * - `conv-bn`: batch norm through cuDNN's graph API around the convolutions on CUDA: the
 *   statistics in the epilogue of the convolution that makes the activation, and the
 *   normalisation and ReLU in the prologue of the convolution that reads it (bf16 and f16). In
 *   training, a {@link Conv2d} writes its output's channel sums and the {@link BatchNorm2d} that
 *   reads the output finalizes them instead of its statistics pass; inside a {@link Chain} or a
 *   {@link Residual} main branch, an adjacent BatchNorm2d with ReLU and Conv2d run as a pair
 *   (lib/nn/prologue.ts): the batch norm's output is not written, the convolution applies it in its
 *   prologue, and in their backward the convolution's weight gradient applies it again as it loads
 *   the input (`convWgradSbr`) while the batch norm's gradient runs through the convolution
 *   (`convDgradDbn`, `batchNormBackwardApply`). With `bn-add-relu` too, the dual batch norm takes
 *   both convolutions' sums.
 *   A shape whose graphs cuDNN refuses runs unfused, with one warning per refusal
 *   (lib/nn/conv-bn-support.ts).
 */
export const FUSED_PATH_NAMES = ['optim', 'bn-add-relu', 'conv-bn'] as const;

/** The name of a fused path (see {@link FUSED_PATH_NAMES}). */
export type FusedPath = (typeof FUSED_PATH_NAMES)[number];

function isFusedPath(name: string): name is FusedPath {
  return (FUSED_PATH_NAMES as readonly string[]).includes(name);
}

/**
 * The fused paths switched on in `env` (default `process.env`). Throws a ResnetError naming the
 * variable for a name it does not know, so that a typo never silently leaves a path off.
 */
export function fusedPaths(env: NodeJS.ProcessEnv = process.env): ReadonlySet<FusedPath> {
  const value = (env[FUSED_ENV] ?? '').trim();
  const on = new Set<FusedPath>();
  if (value === '') return on;
  for (const raw of value.split(',')) {
    const name = raw.trim();
    if (name === '') continue;
    if (name === 'all') FUSED_PATH_NAMES.forEach((p) => on.add(p));
    else if (isFusedPath(name)) on.add(name);
    else {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `${FUSED_ENV}: unknown fused path '${name}'; known: ${FUSED_PATH_NAMES.join(', ')}, all`,
      );
    }
  }
  return on;
}

/** Whether fused path `path` is on for work on `device` (fused paths exist on CUDA devices only). */
export function fusedPathOn(path: FusedPath, device: string, env: NodeJS.ProcessEnv = process.env): boolean {
  return device.startsWith('cuda') && fusedPaths(env).has(path);
}
