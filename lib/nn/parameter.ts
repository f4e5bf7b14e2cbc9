/**
 * Parameters and the flat parameter arena: every parameter of a model is a view into one f32
 * tensor, and every gradient a view into a second one, so optimizers, clipping, checkpoints and
 * all-reduce each work on one contiguous block.
 * @packageDocumentation
 */
import { addon } from '../binding.js';
import { ResnetError, defined } from '../errors.js';
import { Tensor } from '../tensor.js';

/** How a parameter's internal layout maps to its state-dict (torchvision) layout. */
export type ParameterLayout = 'plain' | 'ohwi';

/** What a parameter is, for per-group settings such as "no weight decay on norms and biases". */
export type ParameterKind = 'weight' | 'bias' | 'norm';

/** Offsets inside the arena are multiples of this many elements (64 bytes). */
const ALIGN = 16;

/** A learnable tensor: its value and gradient live in the model's arena once materialised. */
export class Parameter {
  /** Internal shape (conv weights are `[K, R, S, C]`, OHWI). */
  readonly shape: readonly number[];
  /** How the internal layout relates to the state-dict layout (OIHW for conv weights). */
  readonly layout: ParameterLayout;
  /** What the parameter is. */
  readonly kind: ParameterKind;
  /** Whether the optimizer updates it; frozen parameters keep their values. */
  requiresGrad = true;
  /** The values until the parameter is placed in an arena (null from then on). */
  #initial: Float32Array | null;
  #arena: ParameterArena | null = null;
  #offset = 0;

  /** @param initial - the initial values in the internal layout. */
  constructor(shape: readonly number[], initial: Float32Array, layout: ParameterLayout, kind: ParameterKind) {
    this.shape = Object.freeze([...shape]);
    this.layout = layout;
    this.kind = kind;
    this.#initial = initial;
  }

  /** The number of elements. */
  get numel(): number {
    return this.shape.reduce((a, b) => a * b, 1);
  }

  /** The state-dict shape (`[K, C, R, S]` for conv weights). */
  get stateShape(): number[] {
    if (this.layout === 'ohwi') {
      const [k, r, s, c] = this.shape as [number, number, number, number];
      return [k, c, r, s];
    }
    return [...this.shape];
  }

  /** The arena this parameter lives in, or null before the model is materialised. */
  get arena(): ParameterArena | null {
    return this.#arena;
  }

  /** Element offset inside the arena. */
  get offset(): number {
    return this.#offset;
  }

  /** The value, a view into the arena. */
  get data(): Tensor {
    if (!this.#arena) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        'This parameter has not been placed on a device yet; call module.to(device) or run forward once',
      );
    }
    return this.#arena.paramView(this);
  }

  /** The gradient, a view into the gradient arena. */
  get grad(): Tensor {
    if (!this.#arena) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        'This parameter has not been placed on a device yet; call module.to(device) or run forward once',
      );
    }
    return this.#arena.gradView(this);
  }

  /** The values in the internal layout, from the device (or the initial values). */
  values(): Float32Array {
    if (this.#arena) return this.data.toFloat32Array();
    return this.#unplacedValues().slice();
  }

  /** @internal Moves the parameter into `arena` at `offset`, copying its current values. */
  place(arena: ParameterArena, offset: number): void {
    const values = this.#arena ? this.values() : this.#unplacedValues();
    this.#arena = arena;
    this.#offset = offset;
    this.#initial = null;
    arena.paramView(this).raw.copyFromHost(values);
  }

  /** Overwrites the values (internal layout). */
  setValues(values: Float32Array): void {
    if (values.length !== this.numel) {
      throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `Expected ${this.numel} values but received ${values.length}`);
    }
    if (this.#arena) this.data.raw.copyFromHost(values);
    else this.#initial = values.slice();
  }

  // The host values of a parameter not in an arena.
  #unplacedValues(): Float32Array {
    return defined(this.#initial, "an unplaced parameter's values");
  }
}

/** One f32 block for all parameters of a model and one for their gradients. */
export class ParameterArena {
  /** The device holding the arena. */
  readonly device: string;
  /** All parameter values. */
  readonly params: Tensor;
  /** All gradients, in the same order. */
  readonly grads: Tensor;
  /** The parameters, in arena order. */
  readonly entries: readonly Parameter[];
  readonly #views = new Map<Parameter, { data: Tensor; grad: Tensor }>();

  /** Builds an arena for `parameters` on `device`, copying their current values in. */
  constructor(parameters: readonly Parameter[], device: string) {
    this.device = device;
    let total = 0;
    const offsets: number[] = [];
    for (const p of parameters) {
      offsets.push(total);
      total += Math.ceil(p.numel / ALIGN) * ALIGN;
    }
    this.params = Tensor.zeros([Math.max(total, 1)], { device });
    this.grads = Tensor.zeros([Math.max(total, 1)], { device });
    this.entries = Object.freeze([...parameters]);
    const old = new Set<ParameterArena>();
    parameters.forEach((p, i) => {
      if (p.arena) old.add(p.arena);
      p.place(this, offsets[i]!);
    });
    for (const arena of old) arena.releaseIfUnused();
  }

  /** Total elements, padding included. */
  get size(): number {
    return this.params.numel;
  }

  /** @internal */
  paramView(p: Parameter): Tensor {
    return this.#viewsOf(p).data;
  }

  /** @internal */
  gradView(p: Parameter): Tensor {
    return this.#viewsOf(p).grad;
  }

  /** Sets every gradient to zero. */
  zeroGrad(): void {
    addon().fill({ tensor: this.grads.raw, value: 0 });
  }

  /** @internal Frees the arena once no parameter lives in it any more. */
  releaseIfUnused(): void {
    if (this.entries.every((p) => p.arena !== this)) this.dispose();
  }

  /**
   * Frees the values and gradients now; the parameters living here can no longer be read
   * (`ERR_RC_DISPOSED`). `Module.dispose()` calls it for the arena of a whole model.
   */
  dispose(): void {
    for (const v of this.#views.values()) {
      v.data.dispose();
      v.grad.dispose();
    }
    this.#views.clear();
    this.params.dispose();
    this.grads.dispose();
  }

  #viewsOf(p: Parameter): { data: Tensor; grad: Tensor } {
    let v = this.#views.get(p);
    if (!v) {
      if (p.arena !== this) {
        throw new ResnetError('ERR_RC_INVALID_ARGUMENT', 'This parameter does not live in this arena');
      }
      v = { data: this.params.view(p.offset, p.shape), grad: this.grads.view(p.offset, p.shape) };
      this.#views.set(p, v);
    }
    return v;
  }
}
