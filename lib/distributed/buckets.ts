/**
 * The gradient buckets of DistributedDataParallel: contiguous ranges of a model's gradient arena,
 * in the order backward finishes them, each about a size cap, cut at parameter boundaries.
 * @packageDocumentation
 */
import type { Parameter, ParameterArena } from '../nn/parameter.js';

/** One gradient bucket: a contiguous range of the gradient arena reduced by one all-reduce. */
export interface GradientBucket {
  /** Position in launch order (0 is reduced first). */
  readonly index: number;
  /** First arena element of the range. */
  readonly offset: number;
  /** Elements in the range, the arena's alignment padding included. */
  readonly length: number;
  /** The parameters whose gradients the range holds, in arena order. */
  readonly parameters: readonly Parameter[];
}

/**
 * Splits `arena` into buckets of about `capBytes` f32 bytes each. Backward computes the gradients
 * of the last layers first, so the buckets take the parameters in reverse arena order (the arena
 * follows the module tree's registration order, which is forward order): a parameter joins the
 * current bucket, and the bucket closes once it holds `capBytes` or more (PyTorch's rule), so a
 * bucket may exceed the cap by its last parameter and a parameter larger than the cap gets a
 * bucket of its own. Together the buckets cover the whole arena exactly once, each ending where
 * the parameter after its last one starts (the padding travels with the parameter before it).
 */
export function planBuckets(arena: ParameterArena, capBytes: number): GradientBucket[] {
  const entries = [...arena.entries].sort((a, b) => a.offset - b.offset);
  const buckets: GradientBucket[] = [];
  let members: Parameter[] = [];
  let end = arena.size;
  let start = end;
  const close = (): void => {
    if (members.length === 0) return;
    buckets.push({ index: buckets.length, offset: start, length: end - start, parameters: members.reverse() });
    members = [];
    end = start;
  };
  for (let i = entries.length - 1; i >= 0; i--) {
    const p = entries[i]!;
    members.push(p);
    start = i === 0 ? 0 : p.offset;
    if ((end - start) * Float32Array.BYTES_PER_ELEMENT >= capBytes) close();
  }
  close();
  return buckets;
}
