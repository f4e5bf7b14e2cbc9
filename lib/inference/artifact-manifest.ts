/**
 * The manifest of an inference artifact (`model.json`): the format name and version, the
 * architecture, the preprocessing, the class names and the checksums of the files beside it. This
 * file reads and checks one; {@link saveInferenceArtifact} writes it.
 * @packageDocumentation
 */
import { ResnetError } from '../errors.js';
import { INTERPOLATIONS, type Interpolation } from '../data/transforms/functional.js';
import { RESNET_DEPTHS, type ResNetDepth } from '../nn/resnet.js';

/** The `format` of every artifact manifest. */
export const ARTIFACT_FORMAT = 'resnet-cuda.inference-artifact';

/** The manifest version this package writes and the newest it reads. */
export const ARTIFACT_VERSION = 1;

/** The file names inside an artifact folder. */
export const ARTIFACT_FILES = {
  manifest: 'model.json',
  weights: 'model.safetensors',
  onnx: 'model.onnx',
} as const;

/** The network of an artifact: a ResNet as {@link ResNet}'s constructor takes it. */
export interface ArtifactArchitecture {
  /** Always `'resnet'` (the family the package builds). */
  family: 'resnet';
  /** 18, 34, 50, 101 or 152. */
  depth: ResNetDepth;
  /** Output classes. */
  numClasses: number;
  /** The small-image stem (3x3 stride-1 convolution, no max pooling). */
  smallInput: boolean;
  /** Channels of the input images. */
  inChannels: number;
  /** The blocks' inner widths of a channel-pruned model; absent for torchvision's widths. */
  blockWidths?: number[][];
}

/**
 * The evaluation transform the model expects, as torchvision's `Resize(resize, interpolation)`,
 * `CenterCrop(crop)`, `ToTensor()` and `Normalize(mean, std)`.
 */
export interface ArtifactPreprocessing {
  /** The smaller edge is resized to this many pixels. */
  resize: number;
  /** Then the center `crop x crop` pixels are kept (the network's input size). */
  crop: number;
  /** The resize's interpolation. */
  interpolation: Interpolation;
  /** Per-channel mean, in [0, 1] units. */
  mean: number[];
  /** Per-channel standard deviation, in [0, 1] units. */
  std: number[];
}

/** A file of the artifact with its checksum. */
export interface ArtifactFile {
  /** Its name in the artifact folder. */
  file: string;
  /** SHA-256 of its bytes, lower-case hex. */
  sha256: string;
  /** Its size in bytes. */
  bytes: number;
}

/** The contents of `model.json`. */
export interface ArtifactManifest {
  /** {@link ARTIFACT_FORMAT}. */
  format: typeof ARTIFACT_FORMAT;
  /** The manifest version ({@link ARTIFACT_VERSION} when written by this package). */
  version: number;
  architecture: ArtifactArchitecture;
  preprocessing: ArtifactPreprocessing;
  /** Class names in label order (one per output), or null when the model's classes are unnamed. */
  classes: string[] | null;
  /** The weights: safetensors with torchvision's names. */
  weights: ArtifactFile;
  /** The same network as ONNX, when the artifact carries it. */
  onnx?: ArtifactFile;
}

/** A problem with an artifact, as a {@link ResnetError} naming the file and what is wrong. */
export function artifactError(source: string, problem: string): never {
  throw new ResnetError('ERR_RC_CHECKPOINT', `inference artifact ${source}: ${problem}`);
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}

/** Reads the manifest fields one by one, each problem naming the field. */
class FieldReader {
  constructor(readonly source: string) {}

  fail(field: string, expected: string, got: unknown): never {
    return artifactError(this.source, `'${field}' should be ${expected}, got ${JSON.stringify(got) ?? 'nothing'}`);
  }

  record(field: string, value: unknown): Record<string, unknown> {
    return isRecord(value) ? value : this.fail(field, 'an object', value);
  }

  int(field: string, value: unknown, min: number, max = Number.MAX_SAFE_INTEGER): number {
    if (typeof value === 'number' && Number.isInteger(value) && value >= min && value <= max) return value;
    return this.fail(field, `an integer from ${min}${max < Number.MAX_SAFE_INTEGER ? ` to ${max}` : ''}`, value);
  }

  bool(field: string, value: unknown): boolean {
    return typeof value === 'boolean' ? value : this.fail(field, 'true or false', value);
  }

  numbers(field: string, value: unknown, length: number, positive: boolean): number[] {
    const ok =
      Array.isArray(value) &&
      value.length === length &&
      value.every((v) => typeof v === 'number' && Number.isFinite(v) && (!positive || v > 0));
    return ok ? [...(value as number[])] : this.fail(field, `${length} ${positive ? 'positive ' : ''}numbers`, value);
  }

  file(field: string, value: unknown, name: string): ArtifactFile {
    const v = this.record(field, value);
    if (v.file !== name) this.fail(`${field}.file`, `'${name}'`, v.file);
    const sha256 = v.sha256;
    if (typeof sha256 !== 'string' || !/^[0-9a-f]{64}$/.test(sha256)) {
      this.fail(`${field}.sha256`, 'a SHA-256 checksum (64 lower-case hex digits)', sha256);
    }
    return { file: name, sha256, bytes: this.int(`${field}.bytes`, v.bytes, 0) };
  }
}

function readArchitecture(r: FieldReader, value: unknown): ArtifactArchitecture {
  const v = r.record('architecture', value);
  if (v.family !== 'resnet') r.fail('architecture.family', "'resnet'", v.family);
  const depths = Object.keys(RESNET_DEPTHS).map(Number);
  if (typeof v.depth !== 'number' || !depths.includes(v.depth)) {
    r.fail('architecture.depth', `one of ${depths.join(', ')}`, v.depth);
  }
  const depth = v.depth as ResNetDepth;
  const arch: ArtifactArchitecture = {
    family: 'resnet',
    depth,
    numClasses: r.int('architecture.numClasses', v.numClasses, 1),
    smallInput: r.bool('architecture.smallInput', v.smallInput),
    inChannels: r.int('architecture.inChannels', v.inChannels, 1),
  };
  if (v.blockWidths !== undefined) {
    const spec = RESNET_DEPTHS[depth];
    const blocks = spec.layers.reduce((a, b) => a + b, 0);
    const inner = spec.block === 'bottleneck' ? 2 : 1;
    const ok =
      Array.isArray(v.blockWidths) &&
      v.blockWidths.length === blocks &&
      v.blockWidths.every(
        (w) => Array.isArray(w) && w.length === inner && w.every((x) => Number.isInteger(x) && (x as number) >= 1),
      );
    if (!ok) {
      r.fail(
        'architecture.blockWidths',
        `${blocks} lists of ${inner} positive integers (one per block)`,
        v.blockWidths,
      );
    }
    arch.blockWidths = (v.blockWidths as number[][]).map((w) => [...w]);
  }
  return arch;
}

function readPreprocessing(r: FieldReader, value: unknown, channels: number): ArtifactPreprocessing {
  const v = r.record('preprocessing', value);
  const resize = r.int('preprocessing.resize', v.resize, 1);
  const crop = r.int('preprocessing.crop', v.crop, 1, resize);
  if (typeof v.interpolation !== 'string' || !(INTERPOLATIONS as readonly string[]).includes(v.interpolation)) {
    r.fail('preprocessing.interpolation', `one of ${INTERPOLATIONS.join(', ')}`, v.interpolation);
  }
  return {
    resize,
    crop,
    interpolation: v.interpolation as Interpolation,
    mean: r.numbers('preprocessing.mean', v.mean, channels, false),
    std: r.numbers('preprocessing.std', v.std, channels, true),
  };
}

function readClasses(r: FieldReader, value: unknown, numClasses: number): string[] | null {
  if (value === null) return null;
  const ok = Array.isArray(value) && value.length === numClasses && value.every((c) => typeof c === 'string');
  return ok ? [...value] : r.fail('classes', `null or ${numClasses} strings (one per class)`, value);
}

/**
 * Checks the parsed contents of `model.json` (`source` names it in errors) and returns the
 * manifest. An unknown format or a newer version is refused before any other field is read.
 * @throws `ERR_RC_CHECKPOINT` naming the field that is missing or wrong.
 */
export function parseArtifactManifest(value: unknown, source: string): ArtifactManifest {
  const r = new FieldReader(source);
  const v = r.record('(top level)', value);
  if (v.format !== ARTIFACT_FORMAT) {
    artifactError(
      source,
      `is not a resnet-cuda inference artifact manifest ('format' is ${JSON.stringify(v.format) ?? 'missing'}, expected '${ARTIFACT_FORMAT}')`,
    );
  }
  const version = r.int('version', v.version, 1);
  if (version > ARTIFACT_VERSION) {
    artifactError(
      source,
      `has format version ${version}, newer than this package reads (${ARTIFACT_VERSION}); upgrade resnet-cuda to load it`,
    );
  }
  const architecture = readArchitecture(r, v.architecture);
  const manifest: ArtifactManifest = {
    format: ARTIFACT_FORMAT,
    version,
    architecture,
    preprocessing: readPreprocessing(r, v.preprocessing, architecture.inChannels),
    classes: readClasses(r, v.classes, architecture.numClasses),
    weights: r.file('weights', v.weights, ARTIFACT_FILES.weights),
  };
  if (v.onnx !== undefined) manifest.onnx = r.file('onnx', v.onnx, ARTIFACT_FILES.onnx);
  return manifest;
}
