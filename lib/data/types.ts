/**
 * The data pipeline's contracts: datasets that can be rebuilt inside worker threads from a plain
 * description, transforms described the same way and seeded per sample, and the decoded image
 * layout (uint8, height x width x channels, RGB).
 * @packageDocumentation
 */

/** A decoded image: `data` holds `height * width * channels` bytes, row-major HWC, RGB(A). */
export interface DecodedImage {
  data: Uint8Array;
  height: number;
  width: number;
  channels: number;
}

/** What a dataset yields for one index before transforms. */
export interface RawSample {
  /**
   * The encoded file (JPEG/PNG/WebP bytes, decoded by the transform pipeline with sharp, which can
   * shrink on load) or an already decoded image (IDX, CIFAR, generated and synthetic datasets).
   */
  source: { kind: 'encoded'; bytes: Uint8Array; path: string } | { kind: 'decoded'; image: DecodedImage };
  label: number;
}

/**
 * A plain, structured-clone-safe description from which `datasetFromSpec` rebuilds the dataset in
 * a worker thread (file lists, not file contents; generated datasets by their seed).
 */
export interface DatasetSpec {
  kind: string;
  [key: string]: unknown;
}

/** A map-style dataset, like `torch.utils.data.Dataset`. */
export interface Dataset {
  /** Number of samples. */
  readonly length: number;
  /** Class names by label index (empty when the dataset has none). */
  readonly classes: readonly string[];
  /**
   * `[height, width, channels]` when every sample is a decoded image of this shape (in-memory
   * datasets), so that a loader can batch them without a transform; undefined when sizes vary.
   */
  readonly imageShape?: readonly [number, number, number];
  /** Label of sample `index`, without reading the sample (for stratified splits and samplers). */
  label(index: number): number;
  /** Sample `index`: `0 <= index < length`; throws a RangeError-coded error otherwise. */
  get(index: number): Promise<RawSample>;
  /** The description workers rebuild the dataset from. */
  spec(): DatasetSpec;
}

/** A transform step's plain description (e.g. `{ kind: 'RandomResizedCrop', size: 224, ... }`). */
export interface TransformSpec {
  kind: string;
  [key: string]: unknown;
}

/**
 * Per-sample randomness for transforms: the same `(seed, epoch, index)` always gives the same
 * draws, whichever worker processes the sample.
 */
export interface SampleRandom {
  /** A uniform float in [0, 1). */
  next(): number;
  /** A uniform float in [low, high). */
  uniform(low: number, high: number): number;
}
