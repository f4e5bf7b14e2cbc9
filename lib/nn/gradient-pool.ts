/**
 * The memory of the input gradients of one backward pass. A module's input gradient lives only
 * until the module before it has read it, so instead of every module keeping a gradient buffer
 * of its own from step to step (as large, together, as the forward's outputs), the modules of a
 * backward take their input gradients from one pool, and the containers hand each back as soon as
 * the module it was passed to has returned (see `releaseGradient`).
 *
 * The pool belongs to the module whose `backward` was called from outside any other backward (the
 * root of the pass: a model, or a layer used on its own). Each root backward starts with every
 * buffer free, so the gradient a root returns stays valid until its next backward, as every
 * module's outputs do. Buffers are grouped by element count, dtype and device and handed out last
 * freed first; a pass that repeats the one before it (every training step) gets the same buffers in
 * the same order, so after the first step nothing is allocated and a step can be captured as a
 * CUDA graph.
 * @packageDocumentation
 */
import { Tensor, type DType } from '../tensor.js';

/** One buffer of the pool: its memory, its views per shape, and whether a module holds it. */
interface Slot {
  readonly base: Tensor;
  readonly key: string;
  readonly views: Map<string, Tensor>;
  inUse: boolean;
}

/** Input-gradient buffers shared by the modules of a backward pass, reused across passes. */
export class GradientPool {
  /** Per `device|dtype|numel`, every slot in creation order. */
  readonly #slots = new Map<string, Slot[]>();
  /** Per key, the free slots; the last is handed out next. */
  readonly #free = new Map<string, Slot[]>();
  /** The slot behind each view handed out. */
  readonly #byView = new WeakMap<Tensor, Slot>();

  /** An uninitialised tensor of `shape` that no other module holds until it is released. */
  acquire(shape: readonly number[], dtype: DType, device: string): Tensor {
    const numel = shape.reduce((a, b) => a * b, 1);
    const key = `${device}|${dtype}|${numel}`;
    const slot = this.#free.get(key)?.pop() ?? this.#newSlot(key, numel, dtype, device);
    slot.inUse = true;
    const shapeKey = shape.join(',');
    let view = slot.views.get(shapeKey);
    if (!view || view.disposed) {
      view = slot.base.view(0, shape);
      slot.views.set(shapeKey, view);
      this.#byView.set(view, slot);
    }
    return view;
  }

  /** Hands `t` back; a tensor the pool did not hand out, or one already released, is left alone. */
  release(t: Tensor): void {
    const slot = this.#byView.get(t);
    if (!slot?.inUse) return;
    slot.inUse = false;
    this.#freeList(slot.key).push(slot);
  }

  /** Frees every slot for a new pass, in the order the first pass created them. */
  reset(): void {
    for (const [key, slots] of this.#slots) {
      for (const slot of slots) slot.inUse = false;
      this.#free.set(key, [...slots].reverse());
    }
  }

  /** Bytes held by the pool's buffers. */
  bytes(): number {
    let total = 0;
    for (const slots of this.#slots.values()) {
      for (const slot of slots) total += slot.base.raw.nbytes;
    }
    return total;
  }

  /** Drops the pool's references to its memory (views still held elsewhere keep theirs). */
  dispose(): void {
    for (const slots of this.#slots.values()) {
      for (const slot of slots) {
        for (const view of slot.views.values()) view.dispose();
        slot.base.dispose();
      }
    }
    this.#slots.clear();
    this.#free.clear();
  }

  #newSlot(key: string, numel: number, dtype: DType, device: string): Slot {
    const slot: Slot = { base: Tensor.empty([numel], { dtype, device }), key, views: new Map(), inUse: false };
    const slots = this.#slots.get(key) ?? [];
    slots.push(slot);
    this.#slots.set(key, slots);
    return slot;
  }

  #freeList(key: string): Slot[] {
    let list = this.#free.get(key);
    if (!list) {
      list = [];
      this.#free.set(key, list);
    }
    return list;
  }
}

/** The pool of the backward pass running now, or null outside any backward. */
let active: GradientPool | null = null;

/** The pool of the backward pass running now, or null outside any backward. */
export function activeGradientPool(): GradientPool | null {
  return active;
}

/**
 * Runs `body` as a backward pass: when no pass is running, with `pool` reset and active (so that
 * `body` is the root of the pass); inside a pass, as part of it.
 */
export function inGradientPass<T>(pool: () => GradientPool, body: () => T): T {
  if (active !== null) return body();
  const own = pool();
  own.reset();
  active = own;
  try {
    return body();
  } finally {
    active = null;
  }
}

/**
 * Hands `consumed` (a gradient a module was passed) back to the running pass's pool now that the
 * module returned `result`, unless `result` is `consumed` or shares its memory (a reshape).
 */
export function releaseGradient(consumed: Tensor, result: Tensor | null): void {
  if (active === null || consumed === result) return;
  if (result && !consumed.disposed && !result.disposed && result.raw.sharesStorage(consumed.raw)) return;
  active.release(consumed);
}
