/**
 * Containers: a chain of named children, and a residual block. Their backward is derived from
 * their children's.
 * @packageDocumentation
 */
import { addon } from '../binding.js';
import { ResnetError, defined, invalid, isArray } from '../errors.js';
import { fusedPathOn } from '../fused-paths.js';
import { opRecorder } from '../profile/hooks.js';
import { Tensor, expectTensor } from '../tensor.js';
import { releaseGradient } from './gradient-pool.js';
import { BatchNorm2d, Conv2d } from './layers.js';
import { Module, ShapeCache } from './module.js';
import { backwardRun, forwardRun } from './prologue.js';

/**
 * Runs a chain's children in place of its own loop: gradient checkpointing's segments
 * (`lib/nn/checkpoint.ts`), which recompute their forward in backward.
 */
export interface ChainRunner {
  /** The chain's output for `x` (the chain has checked and placed it). */
  forward(x: Tensor): Tensor;
  /** The chain's backward; the input gradient only when `requiresInputGrad`. */
  backward(gradOutput: Tensor, requiresInputGrad: boolean): Tensor | null;
  /** Frees what the runner holds for the chain (called when the chain's buffers are released). */
  release(): void;
}

/**
 * Runs named children in order; backward runs them in reverse. On the `conv-bn` fused path a
 * batch norm with ReLU and the convolution after it run as one pair (`lib/nn/prologue.ts`).
 */
export class Chain extends Module {
  readonly #sequence: Module[] = [];
  /** The prologue pairs of the last forward (see `lib/nn/prologue.ts`). */
  #pairs: readonly number[] = [];
  /** Runs the children instead of the plain loop when set (gradient checkpointing). @internal */
  runner: ChainRunner | null = null;

  /** @param entries - `[name, module]` pairs; names become state-dict prefixes. */
  constructor(entries: readonly (readonly [string, Module])[]) {
    super();
    if (!Array.isArray(entries)) invalid('entries', 'an array of [name, module] pairs', entries);
    for (const entry of entries) {
      if (!Array.isArray(entry) || typeof entry[0] !== 'string' || !(entry[1] instanceof Module)) {
        invalid('entries', 'an array of [name, module] pairs', entry);
      }
      this.#sequence.push(this.registerModule(entry[0], entry[1]));
    }
  }

  /** The children in execution order. */
  get modules(): readonly Module[] {
    return this.#sequence;
  }

  override forward(x: Tensor): Tensor {
    this.prepare(x, this.constructor.name);
    this.#pairs = [];
    if (this.runner) return this.runner.forward(x);
    const run = forwardRun(this.#sequence, x);
    this.#pairs = run.pairs;
    return run.output;
  }

  override backward(gradOutput: Tensor): Tensor | null {
    return this.backwardOnce(this.constructor.name, () => this.#backward(gradOutput));
  }

  #backward(gradOutput: Tensor): Tensor | null {
    if (this.runner) return this.runner.backward(gradOutput, this.requiresInputGrad);
    const g = backwardRun(
      this.#sequence,
      this.#pairs,
      gradOutput,
      this.requiresInputGrad,
      (i) => `the input gradient of ${this.constructor.name} layer ${i}`,
    );
    return this.#sequence.length === 0 && !this.requiresInputGrad ? null : g;
  }

  protected override disposeCache(): void {
    this.#pairs = [];
    this.runner?.release();
  }
}

/** `torch.nn.Sequential`: children named `0`, `1`, ... */
export class Sequential extends Chain {
  constructor(...modules: Module[]) {
    modules.forEach((m, i) => {
      if (!(m instanceof Module)) invalid(`Sequential argument ${i}`, 'a Module', m);
    });
    super(modules.map((m, i) => [String(i), m] as const));
  }
}

/** Whether `m` is a Conv2d that can add its input gradient into another's ({@link Conv2d.backwardInto}). */
function addsInto(m: Module | undefined): m is Conv2d {
  return m instanceof Conv2d && m.quantizer === null && !Object.prototype.hasOwnProperty.call(m, 'backward');
}

/**
 * A residual block: `y = relu(main(x) + shortcut(x))`, where `main` ends in a BatchNorm2d that
 * performs the add and the ReLU in its own pass (create it with `relu: true`). Without a shortcut
 * the identity is added. The children are registered under their own names (torchvision's
 * `conv1`, `bn1`, ..., `downsample`).
 *
 * With the fused path `bn-add-relu` on (lib/fused-paths.ts) on a CUDA device, a shortcut that is a
 * chain ending in a BatchNorm2d without ReLU (torchvision's `downsample`: a 1x1 convolution and a
 * batch norm) has its batch norm applied in the main batch norm's pass: one dual batch norm reads
 * both convolution outputs and writes the block's output, and its backward computes both batch
 * norms' gradients in one pass. The blocks keep the two passes when a batch norm is synchronised
 * (SyncBatchNorm) in training, when the two are in different modes, or when the shortcut chain is
 * run by a checkpointing runner of its own.
 *
 * In backward the block's input gradient (main branch plus shortcut) is summed by the main
 * branch's first convolution, which adds its input gradient into the shortcut's in its own pass
 * (see {@link Conv2d.backwardInto}; torchvision's blocks all start with one): the shortcut's
 * gradient is computed first, and the identity's is the last batch norm's residual gradient,
 * which then holds the sum. Other blocks add the two in a pass of their own.
 */
export class Residual extends Module {
  readonly #main: Module[] = [];
  readonly #last: BatchNorm2d;
  readonly #shortcut: Module | null;
  readonly #sums = new ShapeCache<Tensor>();
  #input: Tensor | null = null;
  /** The shortcut's batch norm when the last forward ran the dual pass, else null. */
  #dual: BatchNorm2d | null = null;
  /** The prologue pairs of the main branch in the last forward (see `lib/nn/prologue.ts`). */
  #pairs: readonly number[] = [];

  constructor(main: readonly (readonly [string, Module])[], shortcut: readonly [string, Module] | null = null) {
    super();
    if (!isArray(main) || main.length === 0) invalid('main', 'a non-empty array of [name, module] pairs', main);
    for (const [name, m] of main) this.#main.push(this.registerModule(name, m));
    const last = this.#main[this.#main.length - 1];
    if (!(last instanceof BatchNorm2d)) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        'Residual: the main branch must end in a BatchNorm2d, which fuses the residual add (and ReLU)',
      );
    }
    this.#last = last;
    this.#shortcut = shortcut ? this.registerModule(shortcut[0], shortcut[1]) : null;
  }

  /** The main branch in execution order; its last module is the BatchNorm2d that adds the shortcut. */
  get main(): readonly Module[] {
    return this.#main;
  }

  /** The shortcut (torchvision's `downsample`), or null for the identity. */
  get shortcut(): Module | null {
    return this.#shortcut;
  }

  /**
   * Whether backward sums the block's input gradient in the main branch's first convolution
   * (when the block passes one on) rather than in an add of its own.
   * @internal
   */
  get addsInFirstConv(): boolean {
    return this.#firstConvAdding() !== null;
  }

  override forward(x: Tensor): Tensor {
    this.prepare(x, this.constructor.name);
    const dual = this.#dualShortcutNorm(x.device);
    let identity: Tensor;
    if (this.#shortcut) {
      // The shortcut's batch norm only records its input; the dual pass below normalises it.
      dual?.deferNextForward();
      try {
        identity = this.#shortcut.forward(x);
      } finally {
        dual?.deferNextForward(false);
      }
    } else {
      identity = x;
    }
    const run = forwardRun(this.#main.slice(0, -1), x);
    const h = run.output;
    this.#pairs = run.pairs;
    expectTensor(`${this.constructor.name} shortcut output`, identity, { shape: h.shape, dtype: h.dtype });
    this.#input = x;
    this.#dual = dual;
    return dual ? this.#last.forwardDual(h, dual) : this.#last.forward(h, identity);
  }

  /**
   * The shortcut's batch norm when this forward takes the dual pass (fused path `bn-add-relu` on
   * for `device`; the shortcut a chain without a runner ending in a BatchNorm2d without ReLU, in
   * the main batch norm's mode; neither synchronised in training), else null.
   */
  #dualShortcutNorm(device: string): BatchNorm2d | null {
    const shortcut = this.#shortcut;
    if (!(shortcut instanceof Chain) || shortcut.runner || !fusedPathOn('bn-add-relu', device)) return null;
    const norm = shortcut.modules[shortcut.modules.length - 1];
    if (!(norm instanceof BatchNorm2d) || norm.relu) return null;
    const last = this.#last;
    if (norm.training !== last.training) return null;
    if (last.training && (norm.sync?.active === true || last.sync?.active === true)) return null;
    return norm;
  }

  override backward(gradOutput: Tensor): Tensor | null {
    return this.backwardOnce(this.constructor.name, () => this.#backward(gradOutput));
  }

  #backward(gradOutput: Tensor): Tensor | null {
    const input = this.#input;
    if (!input) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `${this.constructor.name}.backward() was called before forward()`,
      );
    }
    let g: Tensor | null = this.#last.backward(gradOutput);
    // After a dual pass the shortcut's batch norm already holds its input gradient (computed by the
    // main batch norm's backward) and checks only the shape of the gradient it is handed.
    const dIdentity = this.#dual
      ? gradOutput
      : defined(this.#last.residualGrad, `the residual gradient of ${this.constructor.name}`);
    const first = this.#firstConvAdding();
    if (first && this.requiresInputGrad) return this.#backwardAddingInFirstConv(first, g, dIdentity, gradOutput);
    const gLast = defined(g, `the input gradient of ${this.constructor.name} main layer ${this.#main.length}`);
    g = backwardRun(
      this.#main.slice(0, -1),
      this.#pairs,
      gLast,
      this.requiresInputGrad,
      (i) => `the input gradient of ${this.constructor.name} main layer ${i + 1}`,
    );
    releaseGradient(gLast, g);
    if (this.#shortcut) this.#shortcut.requiresInputGrad = this.requiresInputGrad;
    const dShortcut = this.#shortcut ? this.#shortcut.backward(dIdentity) : dIdentity;
    if (dIdentity !== gradOutput) releaseGradient(dIdentity, dShortcut);
    if (!this.requiresInputGrad) return null;
    const sum = this.#sums.get(input, () => this.activationBuffer(input.shape, input.dtype, input.device));
    const main = defined(g, `the main-branch input gradient of ${this.constructor.name}`);
    const shortcut = defined(dShortcut, `the shortcut input gradient of ${this.constructor.name}`);
    const recorder = opRecorder;
    const token = recorder ? recorder.begin('add', this, sum.device) : 0;
    addon().add({ a: main.raw, b: shortcut.raw, out: sum.raw });
    recorder?.end(token);
    releaseGradient(main, sum);
    if (shortcut !== gradOutput) releaseGradient(shortcut, sum);
    return sum;
  }

  /**
   * The main branch's first module when it can add its input gradient into the shortcut's
   * ({@link Conv2d.backwardInto}), else null: a Conv2d without a quantizer and without a backward
   * replaced on the instance, with a shortcut whose input gradient is a buffer only this block
   * hands on: the identity's (the last batch norm's {@link BatchNorm2d.residualGrad}) or a Chain's
   * run by the chain itself that starts with such a Conv2d (torchvision's `downsample`).
   */
  #firstConvAdding(): Conv2d | null {
    const first = this.#main[0];
    if (!addsInto(first)) return null;
    const shortcut = this.#shortcut;
    if (shortcut === null) return first;
    return shortcut instanceof Chain && !shortcut.runner && addsInto(shortcut.modules[0]) ? first : null;
  }

  /**
   * The block's input gradient with the addition done by the main branch's first convolution: the
   * shortcut's gradient first, then the main branch down to its first convolution, which adds into
   * it. No pass of its own for the sum.
   */
  #backwardAddingInFirstConv(first: Conv2d, gLast: Tensor | null, dIdentity: Tensor, gradOutput: Tensor): Tensor {
    const name = this.constructor.name;
    const shortcut = this.#shortcut;
    if (shortcut) shortcut.requiresInputGrad = true;
    const dShortcut = defined(
      shortcut ? shortcut.backward(dIdentity) : dIdentity,
      `the shortcut input gradient of ${name}`,
    );
    if (dIdentity !== gradOutput) releaseGradient(dIdentity, dShortcut);
    const gMain = defined(gLast, `the input gradient of ${name} main layer ${this.#main.length}`);
    const g = defined(
      backwardRun(
        this.#main.slice(1, -1),
        this.#pairs.map((i) => i - 1),
        gMain,
        true,
        (i) => `the input gradient of ${name} main layer ${i + 2}`,
      ),
      `the input gradient of ${name} main layer 2`,
    );
    releaseGradient(gMain, g);
    const sum = first.backwardInto(g, dShortcut);
    releaseGradient(g, sum);
    return sum;
  }

  protected override disposeCache(): void {
    this.#sums.clear();
    this.#input = null;
    this.#dual = null;
    this.#pairs = [];
  }
}
