/**
 * Random images for benchmarks: every sample is reproducible from the seed and its index alone, so
 * any worker can produce any sample without files or shared state.
 * @packageDocumentation
 */
import { expectInt, expectOptions } from '../errors.js';
import {
  checkIndex,
  expectSpec,
  indexSeed,
  numberedClasses,
  promiseOf,
  resolveClassNames,
  resolveSeed,
} from './dataset.js';
import type { Dataset, DatasetSpec, RawSample } from './types.js';

/** Options of {@link SyntheticDataset}. */
export interface SyntheticDatasetOptions {
  /** Number of samples. */
  length: number;
  /** Image height; default 224. */
  height?: number;
  /** Image width; default 224. */
  width?: number;
  /** Channels, 1 to 4; default 3. */
  channels?: number;
  /** Class names or their number; default 1000 (ImageNet's). */
  classes?: readonly string[] | number;
  /** Seed; random when omitted (and recorded in the spec, so workers agree). */
  seed?: number;
}

/** The spec of a {@link SyntheticDataset}. */
export interface SyntheticSpec extends DatasetSpec {
  kind: 'Synthetic';
  length: number;
  height: number;
  width: number;
  channels: number;
  classes: string[];
  seed: number;
}

/**
 * A dataset of uniformly random pixels and random labels, for measuring the input pipeline and
 * training throughput without storage. Sample `i` depends only on `(seed, i)`.
 */
export class SyntheticDataset implements Dataset {
  /** Number of samples. */
  readonly length: number;
  /** Image height. */
  readonly height: number;
  /** Image width. */
  readonly width: number;
  /** Image channels. */
  readonly channels: number;
  /** Class names by label. */
  readonly classes: readonly string[];
  /** The seed every sample derives from. */
  readonly seed: number;

  /** @throws `ERR_RC_INVALID_ARGUMENT` for bad options. */
  /** `[height, width, channels]` of every sample. */
  get imageShape(): readonly [number, number, number] {
    return [this.height, this.width, this.channels];
  }

  constructor(options: SyntheticDatasetOptions) {
    const o = expectOptions<SyntheticDatasetOptions>('SyntheticDataset options', options, [
      'length',
      'height',
      'width',
      'channels',
      'classes',
      'seed',
    ]);
    this.length = expectInt('length', o.length, 0);
    this.height = expectInt('height', o.height ?? 224, 1, 65535);
    this.width = expectInt('width', o.width ?? 224, 1, 65535);
    this.channels = expectInt('channels', o.channels ?? 3, 1, 4);
    this.classes = Object.freeze(resolveClassNames('classes', o.classes, numberedClasses(1000)));
    this.seed = resolveSeed('seed', o.seed);
  }

  /** Rebuilds the dataset from {@link SyntheticDataset.spec}. */
  static fromSpec(spec: DatasetSpec): SyntheticDataset {
    const s = expectSpec(spec, 'Synthetic');
    return new SyntheticDataset({
      length: s.length as number,
      height: s.height as number,
      width: s.width as number,
      channels: s.channels as number,
      classes: s.classes as string[],
      seed: s.seed as number,
    });
  }

  /** Label of sample `index`: uniform over the classes, from `(seed, index)`. */
  label(index: number): number {
    return indexSeed(this.seed, checkIndex(index, this.length), 1) % this.classes.length;
  }

  /** Sample `index`: `height x width x channels` random bytes. */
  get(index: number): Promise<RawSample> {
    return promiseOf(() => this.#sample(index));
  }

  // `get`'s sample, read from memory (or drawn) at once.
  #sample(index: number): RawSample {
    const label = this.label(index);
    const data = new Uint8Array(this.height * this.width * this.channels);
    // mulberry32 (as in Random), four bytes per draw: a 224 px image is 37k draws, well under a
    // millisecond, so synthetic data never limits a benchmark.
    let state = indexSeed(this.seed, index, 0);
    const n = data.length;
    for (let i = 0; i < n; i += 4) {
      let t = (state = (state + 0x6d2b79f5) >>> 0);
      t = Math.imul(t ^ (t >>> 15), t | 1);
      t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
      t = (t ^ (t >>> 14)) >>> 0;
      data[i] = t;
      if (i + 1 < n) data[i + 1] = t >>> 8;
      if (i + 2 < n) data[i + 2] = t >>> 16;
      if (i + 3 < n) data[i + 3] = t >>> 24;
    }
    return {
      source: { kind: 'decoded', image: { data, height: this.height, width: this.width, channels: this.channels } },
      label,
    };
  }

  /** The sizes, class names and seed. */
  spec(): SyntheticSpec {
    return {
      kind: 'Synthetic',
      length: this.length,
      height: this.height,
      width: this.width,
      channels: this.channels,
      classes: [...this.classes],
      seed: this.seed,
    };
  }
}
