/**
 * The standalone inference artifact: a folder that holds everything needed to run a trained model
 * and nothing of its training, the role TorchScript's `torch.jit.save` file (or a saved ONNX model
 * plus its preprocessing notes) plays in a PyTorch deployment:
 *
 * - `model.safetensors`: the weights and batch-norm statistics, with torchvision's names (PyTorch
 *   reads them with `safetensors.torch.load_file` and `load_state_dict`);
 * - `model.json`: the format and its version, the architecture, the preprocessing (resize, crop,
 *   interpolation, mean, std), the class names and the SHA-256 of every file beside it;
 * - optionally `model.onnx`: the same network as ONNX ({@link exportOnnxBytes}), for ONNX Runtime
 *   or TensorRT.
 *
 * {@link loadInferenceArtifact} checks all of it and rebuilds the model in evaluation mode, with a
 * factory of {@link Predictor}s (the fused inference path) and the evaluation transform.
 * @packageDocumentation
 */
import { createHash } from 'node:crypto';
import { mkdir, readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { CenterCrop, Compose, Normalize, Resize } from '../data/transforms.js';
import { INTERPOLATIONS } from '../data/transforms/functional.js';
import {
  ResnetError,
  expectInt,
  expectNumber,
  expectOneOf,
  expectOptions,
  invalid,
  isArray,
  mismatch,
} from '../errors.js';
import { IMAGENET_MEAN, IMAGENET_STD, InputNormalize } from '../nn/input.js';
import type { StateDict } from '../nn/module.js';
import { Conv2d } from '../nn/layers.js';
import { ResNet } from '../nn/resnet.js';
import type { DType } from '../tensor.js';
import { decodeSafetensors, encodeSafetensors, writeFileAtomic } from '../train/checkpoint.js';
import {
  ARTIFACT_FILES,
  ARTIFACT_FORMAT,
  ARTIFACT_VERSION,
  artifactError,
  parseArtifactManifest,
  type ArtifactArchitecture,
  type ArtifactFile,
  type ArtifactManifest,
  type ArtifactPreprocessing,
} from './artifact-manifest.js';
import { exportOnnxBytes, type OnnxExportOptions } from '../export/onnx.js';
import { Predictor, type PredictorOptions } from './predictor.js';

/** Options of {@link saveInferenceArtifact}. */
export interface SaveInferenceArtifactOptions {
  /** Class names in label order, one per output of the model; default none (classes are shown by index). */
  classes?: readonly string[] | null;
  /**
   * The evaluation transform. Defaults: resize 256 and crop 224 (32 and 32 with the small-image
   * stem), bilinear, ImageNet's mean and std (needed explicitly when the input is not 3 channels).
   * A one-value mean or std is used for every channel.
   */
  preprocessing?: Partial<ArtifactPreprocessing>;
  /**
   * Also write the network as `model.onnx` ({@link exportOnnxBytes}), recorded with its checksum:
   * `true` for the defaults (opset 17, dynamic batch, NCHW, f32, the crop as a fixed input size),
   * or export options over them. The class names, mean and std are the artifact's.
   */
  onnx?: boolean | ArtifactOnnxOptions;
}

/** The ONNX options an artifact takes: those of {@link exportOnnxBytes} that the artifact does not fix. */
export type ArtifactOnnxOptions = Omit<OnnxExportOptions, 'classNames' | 'mean' | 'std'>;

/** The architecture of a ResNet as the manifest records it. */
export function artifactArchitecture(model: ResNet): ArtifactArchitecture {
  const conv1 = model.getSubmodule('conv1');
  if (!(conv1 instanceof Conv2d)) invalid('model', 'a ResNet (its conv1 a Conv2d)', conv1);
  const arch: ArtifactArchitecture = {
    family: 'resnet',
    depth: model.depth,
    numClasses: model.numClasses,
    smallInput: conv1.kernelSize[0] === 3,
    inChannels: conv1.inChannels,
  };
  if (model.pruned) arch.blockWidths = model.blockWidths.map((w) => [...w]);
  return arch;
}

/** `value` (one number, or one per channel) as one number per channel, each checked. */
function perChannel(name: string, value: unknown, channels: number, positive: boolean): number[] {
  if (!isArray(value) || (value.length !== 1 && value.length !== channels)) {
    invalid(name, `an array of 1 or ${channels} numbers (one per input channel)`, value);
  }
  const out = value.map((v, i) => expectNumber(`${name}[${i}]`, v, positive ? Number.MIN_VALUE : -Infinity));
  return out.length === 1 ? new Array<number>(channels).fill(out[0]!) : out;
}

/** The preprocessing to record: the options' fields, checked, over the defaults for `arch`. */
function resolvePreprocessing(arch: ArtifactArchitecture, given: unknown): ArtifactPreprocessing {
  const o = expectOptions<ArtifactPreprocessing>('options.preprocessing', given ?? {}, [
    'resize',
    'crop',
    'interpolation',
    'mean',
    'std',
  ]);
  const small = arch.smallInput;
  const crop = expectInt('options.preprocessing.crop', o.crop ?? (small ? 32 : 224), 1);
  const resize = expectInt('options.preprocessing.resize', o.resize ?? Math.max(crop, small ? 32 : 256), 1);
  if (crop > resize) {
    mismatch('options.preprocessing.crop', `at most the resize (${resize})`, String(crop));
  }
  const imagenet = arch.inChannels === 3;
  if (!imagenet && (o.mean === undefined || o.std === undefined)) {
    invalid(
      o.mean === undefined ? 'options.preprocessing.mean' : 'options.preprocessing.std',
      `the per-channel values of a ${arch.inChannels}-channel input (ImageNet's are for 3 channels)`,
      undefined,
    );
  }
  return {
    resize,
    crop,
    interpolation: expectOneOf('options.preprocessing.interpolation', o.interpolation ?? 'bilinear', INTERPOLATIONS),
    mean: perChannel('options.preprocessing.mean', o.mean ?? [...IMAGENET_MEAN], arch.inChannels, false),
    std: perChannel('options.preprocessing.std', o.std ?? [...IMAGENET_STD], arch.inChannels, true),
  };
}

function sha256(bytes: Uint8Array): string {
  return createHash('sha256').update(bytes).digest('hex');
}

function describeFile(file: string, bytes: Uint8Array): ArtifactFile {
  return { file, sha256: sha256(bytes), bytes: bytes.byteLength };
}

/**
 * Writes `model` as an inference artifact in the folder `dir` (created if needed): the weights as
 * `model.safetensors`, then `model.json` (last, so that an interrupted write leaves no manifest
 * that names missing files). Each file is written atomically. Resolves to the manifest written.
 * @throws `ERR_RC_INVALID_ARGUMENT` for a bad option (the message names it).
 */
export async function saveInferenceArtifact(
  model: ResNet,
  dir: string,
  options: SaveInferenceArtifactOptions = {},
): Promise<ArtifactManifest> {
  if (!(model instanceof ResNet)) {
    invalid('model', 'a ResNet (ResNet18() ... ResNet152(), or new ResNet(depth))', model);
  }
  if (typeof dir !== 'string' || dir.length === 0) invalid('dir', 'a folder path', dir);
  const o = expectOptions<SaveInferenceArtifactOptions>('options', options, ['classes', 'preprocessing', 'onnx']);
  const architecture = artifactArchitecture(model);
  const preprocessing = resolvePreprocessing(architecture, o.preprocessing);
  let classes: string[] | null = null;
  if (o.classes !== undefined && o.classes !== null) {
    if (!isArray(o.classes) || !o.classes.every((c) => typeof c === 'string')) {
      invalid('options.classes', 'an array of class names (strings)', o.classes);
    }
    if (o.classes.length !== architecture.numClasses) {
      mismatch(
        'options.classes',
        `${architecture.numClasses} names (one per output of the model)`,
        `${o.classes.length}`,
      );
    }
    classes = [...o.classes];
  }
  let onnx: Uint8Array | null = null;
  if (o.onnx !== undefined && o.onnx !== false) {
    if (o.onnx !== true && (o.onnx === null || typeof o.onnx !== 'object')) {
      invalid('options.onnx', 'true, false or ONNX export options', o.onnx);
    }
    const given = o.onnx === true ? {} : o.onnx;
    for (const key of ['classNames', 'mean', 'std'] as const) {
      if (key in given) {
        invalid(`options.onnx.${key}`, "nothing (the artifact's own is written)", given[key as keyof typeof given]);
      }
    }
    onnx = exportOnnxBytes(model, {
      inputSize: preprocessing.crop,
      ...given,
      ...(classes ? { classNames: classes } : {}),
      mean: preprocessing.mean,
      std: preprocessing.std,
    }).bytes;
  }

  const weights = encodeSafetensors(model.stateDict(), { format: 'pt' });
  const manifest: ArtifactManifest = {
    format: ARTIFACT_FORMAT,
    version: ARTIFACT_VERSION,
    architecture,
    preprocessing,
    classes,
    weights: describeFile(ARTIFACT_FILES.weights, weights),
  };
  if (onnx) manifest.onnx = describeFile(ARTIFACT_FILES.onnx, onnx);
  await mkdir(dir, { recursive: true });
  await writeFileAtomic(join(dir, ARTIFACT_FILES.weights), weights);
  if (onnx) await writeFileAtomic(join(dir, ARTIFACT_FILES.onnx), onnx);
  await writeFileAtomic(join(dir, ARTIFACT_FILES.manifest), `${JSON.stringify(manifest, null, 2)}\n`);
  return manifest;
}

/** Options of {@link loadInferenceArtifact}. */
export interface LoadInferenceArtifactOptions {
  /** Device the model (and, by default, its predictors) is placed on; default `'cpu'`. */
  device?: string;
}

/**
 * A loaded inference artifact: the model in evaluation mode, what it expects of its input and
 * what its outputs mean. Dispose it to free the model.
 */
export class InferenceArtifact {
  /** The folder it was read from. */
  readonly dir: string;
  /** The checked contents of `model.json`. */
  readonly manifest: ArtifactManifest;
  /** The network with the artifact's weights, in evaluation mode. */
  readonly model: ResNet;

  /** @internal Made by {@link loadInferenceArtifact}. */
  constructor(dir: string, manifest: ArtifactManifest, model: ResNet) {
    this.dir = dir;
    this.manifest = manifest;
    this.model = model;
  }

  /** The network's architecture. */
  get architecture(): ArtifactArchitecture {
    return this.manifest.architecture;
  }

  /** The evaluation transform the model expects. */
  get preprocessing(): ArtifactPreprocessing {
    return this.manifest.preprocessing;
  }

  /** Class names in label order, or null when the artifact names none. */
  get classes(): string[] | null {
    return this.manifest.classes;
  }

  /** The name of class `index`: its recorded name, else the index as text. */
  className(index: number): string {
    return this.manifest.classes?.[index] ?? String(index);
  }

  /**
   * A {@link Predictor} of the model (the fused inference path): it lowers the network now, so
   * later changes to the model do not reach it. The device defaults to the model's.
   */
  createPredictor(options: PredictorOptions = {}): Predictor {
    const o = expectOptions<PredictorOptions>('options', options, ['device', 'dtype']);
    return new Predictor(this.model, { device: o.device ?? this.model.device ?? 'cpu', dtype: o.dtype ?? 'f32' });
  }

  /**
   * The evaluation transform as a pipeline for a `DataLoader`: `Resize`, `CenterCrop` and the
   * `Normalize` that the loader hands to the device's input normalisation.
   */
  transform(): Compose {
    const p = this.manifest.preprocessing;
    const channels = this.manifest.architecture.inChannels;
    if (channels !== 1 && channels !== 3) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `transform: image pipelines produce 1 or 3 channels, and this model takes ${channels}`,
      );
    }
    return new Compose(
      [
        new Resize({ size: p.resize, interpolation: p.interpolation }),
        new CenterCrop({ size: p.crop }),
        new Normalize({ mean: p.mean, std: p.std }),
      ],
      { outputChannels: channels },
    );
  }

  /** The conversion of u8 NHWC images to the model's normalised input (`(x / 255 - mean) / std`). */
  inputNormalize(dtype: DType = 'f32'): InputNormalize {
    const p = this.manifest.preprocessing;
    return new InputNormalize({ mean: p.mean, std: p.std, dtype });
  }

  /** Frees the model. */
  dispose(): void {
    this.model.dispose();
  }
}

async function readArtifactFile(dir: string, entry: ArtifactFile): Promise<Uint8Array> {
  const path = join(dir, entry.file);
  let bytes: Uint8Array;
  try {
    bytes = await readFile(path);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    return artifactError(
      dir,
      code === 'ENOENT'
        ? `is missing ${entry.file}, which model.json lists`
        : `cannot read ${entry.file} (${(error as Error).message})`,
    );
  }
  if (bytes.byteLength !== entry.bytes) {
    artifactError(
      dir,
      `${entry.file} is ${bytes.byteLength} bytes but model.json records ${entry.bytes}; the file was changed or truncated`,
    );
  }
  const actual = sha256(bytes);
  if (actual !== entry.sha256) {
    artifactError(
      dir,
      `${entry.file} does not match its checksum in model.json (SHA-256 ${actual}, expected ${entry.sha256}); the file was changed or corrupted`,
    );
  }
  return bytes;
}

async function readManifest(dir: string): Promise<ArtifactManifest> {
  const found = await stat(dir).catch(() => null);
  if (!found) artifactError(dir, 'does not exist');
  if (!found.isDirectory()) {
    artifactError(dir, 'is not a folder (an artifact is a folder with model.json and model.safetensors)');
  }
  const path = join(dir, ARTIFACT_FILES.manifest);
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (error) {
    return artifactError(
      dir,
      (error as NodeJS.ErrnoException).code === 'ENOENT'
        ? 'has no model.json (write an artifact with saveInferenceArtifact or `resnet-cuda export --format artifact`)'
        : `cannot read model.json (${(error as Error).message})`,
    );
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    return artifactError(path, `is not valid JSON (${(error as Error).message})`);
  }
  return parseArtifactManifest(value, path);
}

/** The model of `arch` on `device` with `tensors` loaded, or an error saying that they do not fit. */
function buildArtifactModel(arch: ArtifactArchitecture, tensors: StateDict, device: string, dir: string): ResNet {
  const model = new ResNet(arch.depth, {
    numClasses: arch.numClasses,
    smallInput: arch.smallInput,
    inChannels: arch.inChannels,
    ...(arch.blockWidths ? { blockWidths: arch.blockWidths } : {}),
    device,
  });
  try {
    model.loadStateDict(tensors);
  } catch (error) {
    model.dispose();
    if (!(error instanceof ResnetError) || error.code !== 'ERR_RC_STATE_DICT') throw error;
    const what = `ResNet-${arch.depth}, ${arch.numClasses} classes, ${arch.inChannels}-channel input${arch.smallInput ? ', small-image stem' : ''}${arch.blockWidths ? ', pruned widths' : ''}`;
    return artifactError(
      dir,
      `${ARTIFACT_FILES.weights} does not fit the architecture in model.json (${what}): ${error.message}`,
    );
  }
  return model.eval();
}

/**
 * Reads the inference artifact in the folder `dir`: checks `model.json` (format, version, every
 * field), the checksums of the files it lists, and that the weights fit the architecture, then
 * builds the model on `options.device` in evaluation mode.
 * @throws `ERR_RC_CHECKPOINT` naming the folder or file and what is wrong: no manifest, an unknown
 *   format or a newer version, a bad field, a missing file, a checksum mismatch, weights of
 *   another architecture.
 */
export async function loadInferenceArtifact(
  dir: string,
  options: LoadInferenceArtifactOptions = {},
): Promise<InferenceArtifact> {
  if (typeof dir !== 'string' || dir.length === 0) invalid('dir', 'the path of an artifact folder', dir);
  const o = expectOptions<LoadInferenceArtifactOptions>('options', options, ['device']);
  const device = o.device ?? 'cpu';
  const manifest = await readManifest(dir);
  const weights = await readArtifactFile(dir, manifest.weights);
  if (manifest.onnx) await readArtifactFile(dir, manifest.onnx);
  const { tensors } = decodeSafetensors(weights, join(dir, ARTIFACT_FILES.weights));
  return new InferenceArtifact(dir, manifest, buildArtifactModel(manifest.architecture, tensors, device, dir));
}
