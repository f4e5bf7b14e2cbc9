/**
 * Gradient checkpointing (the role of `torch.utils.checkpoint.checkpoint_sequential`): the residual
 * blocks of a ResNet are grouped into segments, per stage or every k blocks. A segment keeps only
 * its input and output between forward and backward; its backward runs its forward again from the
 * saved input, then its backward.
 *
 * Modules own their outputs here, so dropping activations means sharing memory: every module of a
 * checkpointed segment takes its outputs, saved statistics and input gradients from one pool shared
 * by all the segments of the model, sized by the largest segment. A segment's forward and its
 * recomputation write over what the segment before it left there; only the segment's output (a
 * copy, kept until backward) and the gradient of its input (a copy into one of two slots that
 * consecutive segments alternate, since it lives only until the previous segment has used it)
 * leave the pool. The pool is sized on the first step and reused, so a step allocates nothing
 * afterwards and can still be captured as a CUDA graph.
 *
 * Batch normalisation: the recomputed forward normalises with the same batch statistics (it sees
 * the same input) but leaves the running statistics and `num_batches_tracked` alone, so that they
 * are updated once per step. ResNets have no dropout or other randomness in the forward, so the
 * recomputation repeats the first forward exactly.
 * @packageDocumentation
 */
import { ResnetError, defined, expectInt, expectOptions, invalid } from '../errors.js';
import { Tensor, type DType } from '../tensor.js';
import { Chain, type ChainRunner } from './containers.js';
import { releaseGradient } from './gradient-pool.js';
import { BatchNorm2d } from './layers.js';
import { Module, ShapeCache, type BufferSource } from './module.js';

/** How the blocks are grouped: each stage (`layer1` … `layer4`) as one segment, or every k blocks. */
export type CheckpointSegments = 'stage' | { every: number };

/** Options of {@link setCheckpointing}. */
export interface CheckpointingOptions {
  /**
   * `'stage'`: each stage is one segment; `{ every: k }`: groups of k consecutive blocks inside a
   * stage (the last group of a stage may be shorter; k at least the stage's length is `'stage'`).
   */
  segments: CheckpointSegments;
}

/** Views start at multiples of this many bytes in the pool's chunks (what vector loads like). */
const ALIGN_BYTES = 256;
const DTYPE_BYTES: Readonly<Record<DType, number>> = { f32: 4, bf16: 2, f16: 2, i32: 4, i64: 8, u8: 1 };
/** Input shapes a segment keeps buffers for at once, as a layer's ShapeCache does. */
const SHAPES_KEPT = 4;

function alignUp(value: number, step: number): number {
  return Math.ceil(value / step) * step;
}

function numelOf(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

function shapeKey(x: Tensor): string {
  return `${x.shape.join(',')}|${x.dtype}|${x.device}`;
}

/**
 * The memory the checkpointed segments of one model share: chunks per device and dtype, which
 * every segment lays its buffers into from the start (so segments overlap each other), and the
 * two slots that hold the gradients passed from one segment to the previous one.
 */
class ActivationPool {
  readonly #chunks = new Map<string, Tensor[]>();
  readonly #gradientSlots = new Map<string, Tensor>();
  /** Segments holding buffers in the pool; when the last one lets go, the memory is freed. */
  readonly #users = new Set<Segment>();
  /** The segment whose forward wrote the pool last: its activations are still there. */
  holder: Segment | null = null;

  /** The chunks of `dtype` on `device`, oldest first. */
  chunks(device: string, dtype: DType): readonly Tensor[] {
    return this.#chunks.get(`${device}|${dtype}`) ?? [];
  }

  /** Appends a chunk of `numel` elements. */
  addChunk(device: string, dtype: DType, numel: number): Tensor {
    const chunk = Tensor.empty([numel], { dtype, device });
    const key = `${device}|${dtype}`;
    this.#chunks.set(key, [...this.chunks(device, dtype), chunk]);
    return chunk;
  }

  /**
   * Gradient slot `parity` (0 or 1) seen as `shape`, grown when too small. Growing is safe in
   * forward and in backward: the slot a segment writes is not the one its gradient came in.
   */
  gradientSlot(parity: number, shape: readonly number[], dtype: DType, device: string): Tensor {
    const key = `${device}|${dtype}|${parity}`;
    const numel = numelOf(shape);
    let slot = this.#gradientSlots.get(key);
    if (!slot || slot.numel < numel) {
      slot?.dispose();
      slot = Tensor.empty([Math.max(numel, 1)], { dtype, device });
      this.#gradientSlots.set(key, slot);
    }
    return slot.view(0, shape);
  }

  /** Records that `segment` holds buffers in the pool. */
  use(segment: Segment): void {
    this.#users.add(segment);
  }

  /** Records that `segment` let go of its buffers; frees the pool once no segment holds any. */
  leave(segment: Segment): void {
    this.#users.delete(segment);
    if (this.holder === segment) this.holder = null;
    if (this.#users.size > 0) return;
    for (const list of this.#chunks.values()) for (const chunk of list) chunk.dispose();
    for (const slot of this.#gradientSlots.values()) slot.dispose();
    this.#chunks.clear();
    this.#gradientSlots.clear();
  }

  /** Bytes held: chunks and gradient slots. */
  bytes(): number {
    let total = 0;
    for (const list of this.#chunks.values()) {
      for (const chunk of list) total += chunk.numel * DTYPE_BYTES[chunk.dtype];
    }
    for (const slot of this.#gradientSlots.values()) total += slot.numel * DTYPE_BYTES[slot.dtype];
    return total;
  }
}

/**
 * One segment's allocations in the pool: each buffer goes to the first chunk with room after the
 * segment's own earlier buffers there (first fit), or into a new chunk of its size. A segment's
 * buffers never overlap each other; they overlap the other segments'.
 */
class SegmentBuffers implements BufferSource {
  /** Per `device|dtype`, the elements used in each chunk by this segment. */
  readonly #used = new Map<string, number[]>();

  constructor(private readonly pool: ActivationPool) {}

  empty(shape: readonly number[], dtype: DType, device: string): Tensor {
    const numel = numelOf(shape);
    const align = Math.max(1, ALIGN_BYTES / DTYPE_BYTES[dtype]);
    const key = `${device}|${dtype}`;
    const used = this.#used.get(key) ?? [];
    this.#used.set(key, used);
    const chunks = this.pool.chunks(device, dtype);
    for (const [i, chunk] of chunks.entries()) {
      const start = alignUp(used[i] ?? 0, align);
      if (start + numel <= chunk.numel) {
        used[i] = start + numel;
        return chunk.view(start, shape);
      }
    }
    const chunk = this.pool.addChunk(device, dtype, alignUp(Math.max(numel, 1), align));
    used[chunks.length] = numel;
    return chunk.view(0, shape);
  }

  /** Forgets every allocation (the modules must have dropped their views). */
  reset(): void {
    this.#used.clear();
  }
}

/** Every module of a subtree, the root included. */
function subtree(modules: readonly Module[]): Module[] {
  return modules.flatMap((m) => m.namedModules().map(([, sub]) => sub));
}

/** A run of a chain's children whose activations are recomputed in backward. */
class Segment {
  readonly #buffers: SegmentBuffers;
  readonly #norms: BatchNorm2d[];
  /** This segment's output, a copy out of the pool, per input shape. */
  readonly #outputs = new ShapeCache<Tensor>(SHAPES_KEPT);
  readonly #shapes = new Set<string>();
  #input: Tensor | null = null;

  /**
   * @param modules - the children, in order.
   * @param parity - which gradient slot this segment's input gradient goes to (segments next to
   *   each other use different ones).
   */
  constructor(
    private readonly pool: ActivationPool,
    readonly modules: readonly Module[],
    readonly names: readonly string[],
    private readonly parity: number,
  ) {
    this.#buffers = new SegmentBuffers(pool);
    const all = subtree(modules);
    this.#norms = all.filter((m): m is BatchNorm2d => m instanceof BatchNorm2d);
    // Buffers the modules already hold are their own: drop them so that they come from the pool.
    for (const m of modules) m.releaseBuffers();
    for (const m of all) m.bufferSource = this.#buffers;
  }

  forward(x: Tensor): Tensor {
    this.#admit(x);
    this.pool.use(this);
    this.pool.holder = this;
    const h = this.#run(x);
    const out = this.#outputs.get(x, () => Tensor.empty(h.shape, { dtype: h.dtype, device: h.device }));
    out.copyFrom(h);
    if (this.modules.some((m) => m.training)) this.pool.gradientSlot(this.parity, x.shape, x.dtype, x.device);
    this.#input = x;
    return out;
  }

  backward(gradOutput: Tensor, requiresInputGrad: boolean): Tensor | null {
    const x = this.#input;
    if (!x) throw new ResnetError('ERR_RC_INVALID_ARGUMENT', `backward of ${this.names[0]} before its forward`);
    if (this.pool.holder !== this) {
      for (const bn of this.#norms) bn.recomputing = true;
      try {
        this.#run(x);
      } finally {
        for (const bn of this.#norms) bn.recomputing = false;
      }
      this.pool.holder = this;
    }
    let g: Tensor | null = gradOutput;
    for (let i = this.modules.length - 1; i >= 0; i--) {
      const m = this.modules[i]!;
      m.requiresInputGrad = i > 0 || requiresInputGrad;
      g = m.backward(defined(g, `the input gradient of ${this.names[i + 1] ?? this.names[i]}`));
    }
    if (!requiresInputGrad) return null;
    const dx = defined(g, `the input gradient of ${this.names[0]}`);
    const slot = this.pool.gradientSlot(this.parity, dx.shape, dx.dtype, dx.device);
    slot.copyFrom(dx);
    return slot;
  }

  /** Drops every buffer of the segment (its modules' included) and leaves the pool. */
  release(): void {
    for (const m of this.modules) m.releaseBuffers();
    this.#buffers.reset();
    this.#outputs.clear();
    this.#shapes.clear();
    this.#input = null;
    this.pool.leave(this);
  }

  /** Releases the segment and gives its modules back their own buffers. */
  detach(): void {
    this.release();
    for (const m of subtree(this.modules)) m.bufferSource = null;
  }

  #run(x: Tensor): Tensor {
    let h = x;
    for (const m of this.modules) h = m.forward(h);
    return h;
  }

  /**
   * Buffers for a new input shape are laid out after those of the shapes already seen; past
   * {@link SHAPES_KEPT} shapes, everything is dropped and laid out again for the new one.
   */
  #admit(x: Tensor): void {
    const key = shapeKey(x);
    if (this.#shapes.has(key)) return;
    if (this.#shapes.size >= SHAPES_KEPT) this.release();
    this.#shapes.add(key);
  }
}

/** A chain's children run as segments (and single modules between them). */
class CheckpointRunner implements ChainRunner {
  constructor(
    readonly chain: Chain,
    readonly steps: readonly (Segment | Module)[],
  ) {}

  forward(x: Tensor): Tensor {
    let h = x;
    for (const step of this.steps) h = step.forward(h);
    return h;
  }

  backward(gradOutput: Tensor, requiresInputGrad: boolean): Tensor | null {
    let g: Tensor | null = gradOutput;
    for (let i = this.steps.length - 1; i >= 0; i--) {
      const step = this.steps[i]!;
      const needed = i > 0 || requiresInputGrad;
      const input = defined(g, `the input gradient of step ${i + 2} of a checkpointed chain`);
      if (step instanceof Segment) {
        g = step.backward(input, needed);
      } else {
        step.requiresInputGrad = needed;
        g = step.backward(input);
      }
      if (input !== gradOutput) releaseGradient(input, g);
    }
    return this.steps.length === 0 && !requiresInputGrad ? null : g;
  }

  release(): void {
    for (const step of this.steps) if (step instanceof Segment) step.release();
  }

  /** Gives the chain back its plain loop. */
  detach(): void {
    this.chain.runner = null;
    for (const step of this.steps) if (step instanceof Segment) step.detach();
  }
}

/** What checkpointing installed on a model. */
interface Installation {
  pool: ActivationPool;
  runners: CheckpointRunner[];
  segments: string[][];
}

const INSTALLED = new WeakMap<Module, Installation>();

/** The stages of a ResNet-like model: children named `layer1`, `layer2`, … that are chains. */
function stagesOf(model: Module): [string, Chain][] {
  const stages = model
    .children()
    .filter((entry): entry is [string, Chain] => /^layer\d+$/.test(entry[0]) && entry[1] instanceof Chain);
  if (stages.length === 0) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      `${model.constructor.name} has no stages to checkpoint (children named layer1, layer2, ... holding blocks)`,
    );
  }
  return stages;
}

/** The group size for `segments` in a stage of `blocks` blocks. */
function groupSize(segments: CheckpointSegments, blocks: number): number {
  return segments === 'stage' ? blocks : segments.every;
}

function parseOptions(options: unknown): CheckpointSegments | null {
  if (options === false || options === null) return null;
  const o = expectOptions<CheckpointingOptions>('checkpointing options', options, ['segments']);
  const segments = o.segments;
  if (segments === 'stage') return segments;
  if (segments !== null && typeof segments === 'object' && !Array.isArray(segments)) {
    const s = expectOptions<{ every: number }>('segments', segments, ['every']);
    return { every: expectInt('segments.every', s.every, 1) };
  }
  return invalid('segments', "'stage' or { every: k } with k >= 1", segments);
}

/**
 * Turns gradient checkpointing on for a ResNet's stages (`options`), or off (`false`). Replaces
 * any earlier setting; the model's buffers for the checkpointed blocks are dropped and laid out
 * again on the next forward. Parameters, gradients, running statistics and the state dict are
 * unchanged, and so are the results: the gradients equal those of the model without
 * checkpointing.
 * @returns the segments, each a list of block paths such as `layer1.0`.
 */
export function setCheckpointing(model: Module, options: CheckpointingOptions | false): string[][] {
  if (!(model instanceof Module)) invalid('model', 'a Module', model);
  const segments = parseOptions(options);
  const stages = stagesOf(model);
  INSTALLED.get(model)?.runners.forEach((r) => r.detach());
  INSTALLED.delete(model);
  if (segments === null) return [];
  const pool = new ActivationPool();
  const installation: Installation = { pool, runners: [], segments: [] };
  for (const [stageName, chain] of stages) {
    const blocks = chain.children();
    const size = groupSize(segments, blocks.length);
    const steps: Segment[] = [];
    for (let start = 0; start < blocks.length; start += size) {
      const group = blocks.slice(start, start + size);
      const names = group.map(([name]) => `${stageName}.${name}`);
      steps.push(
        new Segment(
          pool,
          group.map(([, m]) => m),
          names,
          installation.segments.length % 2,
        ),
      );
      installation.segments.push(names);
    }
    const runner = new CheckpointRunner(chain, steps);
    chain.runner = runner;
    installation.runners.push(runner);
  }
  INSTALLED.set(model, installation);
  return installation.segments.map((names) => [...names]);
}

/** What {@link checkpointingOf} reports. */
export interface CheckpointingState {
  /** The segments, each a list of block paths (`layer1.0`, `layer1.1`, …). */
  segments: string[][];
  /** Bytes the shared activation pool holds now (0 before the first forward). */
  poolBytes: number;
}

/** The model's checkpointing, or null when it is off. */
export function checkpointingOf(model: Module): CheckpointingState | null {
  const installed = INSTALLED.get(model);
  if (!installed) return null;
  return { segments: installed.segments.map((names) => [...names]), poolBytes: installed.pool.bytes() };
}

/**
 * Reads the command line's form of {@link CheckpointSegments}: `stage`, or a whole number N of
 * blocks per segment. Returns null for anything else.
 */
export function parseCheckpointSegments(text: string): CheckpointSegments | null {
  if (text === 'stage') return 'stage';
  return /^[1-9]\d{0,5}$/.test(text) ? { every: Number(text) } : null;
}
