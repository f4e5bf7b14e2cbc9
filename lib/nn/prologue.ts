/**
 * The batch norm + ReLU of a block taken into the next convolution's prologue (the `conv-bn`
 * fused path, lib/fused-paths.ts): how a container runs its children forward and backward so that
 * an adjacent BatchNorm2d (`relu: true`) and Conv2d become one pair.
 *
 * The pairing is explicit and made by the container, never inferred from a tensor: in a run of
 * children where each child's output is read only by the next one (a Chain's children, a
 * Residual's main branch before its last batch norm), a BatchNorm2d followed by a Conv2d is paired
 * when both take the path for the tensor at hand ({@link BatchNorm2d.feedsPrologue},
 * {@link Conv2d.takesPrologue}) and neither has its `forward` replaced on the instance (a hook
 * that would watch the output). The batch norm then only finalises its statistics from the channel
 * sums its input's convolution wrote, and hands its input with the scale and shift to the
 * convolution, which normalises in its prologue: the activation between them is never written.
 * The same run's backward treats the pair as one step ({@link prologuePairBackward}); calling the
 * pair's modules' `backward` on their own is refused with an error saying so.
 * @packageDocumentation
 */
import { defined } from '../errors.js';
import type { Tensor } from '../tensor.js';
import { releaseGradient } from './gradient-pool.js';
import { BatchNorm2d, Conv2d } from './layers.js';
import type { Module } from './module.js';

/** The result of {@link forwardRun}: the last child's output and the pairs it formed. */
export interface PrologueRun {
  /** The output of the last child run. */
  output: Tensor;
  /** The indices `i` where child `i` (a batch norm) fed child `i + 1`'s prologue, ascending. */
  pairs: readonly number[];
}

/** Whether `m`'s forward is its class's (nothing on the instance watches its input or output). */
function plainForward(m: Module): boolean {
  return !Object.prototype.hasOwnProperty.call(m, 'forward');
}

/**
 * Runs `modules` in order on `x`, each reading the previous one's output only, pairing an
 * adjacent batch norm and convolution where the `conv-bn` prologue applies (see the file's
 * comment). Returns the last output and the pairs, which {@link backwardRun} needs.
 */
export function forwardRun(modules: readonly Module[], x: Tensor): PrologueRun {
  const pairs: number[] = [];
  let h = x;
  for (let i = 0; i < modules.length; i++) {
    const m = modules[i]!;
    const next = modules[i + 1];
    if (
      m instanceof BatchNorm2d &&
      next instanceof Conv2d &&
      plainForward(m) &&
      plainForward(next) &&
      m.feedsPrologue(h) &&
      next.takesPrologue(h)
    ) {
      h = next.forwardPrologue(m.forwardPrologue(h));
      pairs.push(i);
      i++;
    } else {
      h = m.forward(h);
    }
  }
  return { output: h, pairs };
}

/**
 * The backward of a {@link forwardRun} of `modules` with its `pairs`: children in reverse order,
 * a pair as one step. Child `i` gets `requiresInputGrad = i > 0 || requiresInputGrad`. `what(i)`
 * names the input gradient of child `i` in the error when a child returns none. Each gradient a
 * child returned goes back to the pass's pool once the child before it has used it; `gradOutput`
 * stays the caller's.
 */
export function backwardRun(
  modules: readonly Module[],
  pairs: readonly number[],
  gradOutput: Tensor,
  requiresInputGrad: boolean,
  what: (i: number) => string,
): Tensor | null {
  const paired = new Set(pairs);
  let g: Tensor | null = gradOutput;
  for (let i = modules.length - 1; i >= 0; i--) {
    const m = modules[i]!;
    const input = defined(g, what(i + 1));
    const norm = paired.has(i - 1) ? modules[i - 1] : undefined;
    if (norm instanceof BatchNorm2d && m instanceof Conv2d) {
      norm.requiresInputGrad = i - 1 > 0 || requiresInputGrad;
      g = prologuePairBackward(norm, m, input);
      i--;
    } else {
      m.requiresInputGrad = i > 0 || requiresInputGrad;
      g = m.backward(input);
    }
    if (input !== gradOutput) releaseGradient(input, g);
  }
  return g;
}

/**
 * The backward of a batch norm that fed convolution `conv`'s prologue, and of that convolution,
 * from the gradient of the convolution's output: the gradient of the batch norm's input (null
 * when `norm.requiresInputGrad` is false), with both modules' parameter gradients accumulated.
 * The convolution's weight gradient applies the batch norm and ReLU to its input as it loads it
 * ({@link Conv2d.backwardPrologue}); the batch norm's backward runs through the convolution in one
 * dgrad-dReLU-dBN graph and one per-channel pass ({@link BatchNorm2d.backwardPrologue}). Neither
 * the activation nor its gradient is written.
 */
export function prologuePairBackward(norm: BatchNorm2d, conv: Conv2d, gradOutput: Tensor): Tensor | null {
  conv.backwardPrologue(gradOutput);
  return norm.backwardPrologue(gradOutput, conv);
}
