/**
 * `resnet-cuda export --format artifact`: a trained model (weights or checkpoint) as an inference
 * artifact folder (`model.safetensors` + `model.json`, optionally `model.onnx`) that
 * `predict --model DIR` and `loadInferenceArtifact` read without the training run. The resize,
 * crop, interpolation, normalisation and class names are the run's when the checkpoint (or the
 * weights' run folder) records them, else the options', else ImageNet's defaults.
 * @packageDocumentation
 */
import type { Interpolation } from '../data/transforms.js';
import { saveInferenceArtifact } from '../inference/artifact.js';
import type { ArtifactManifest } from '../inference/artifact-manifest.js';
import { IMAGENET_MEAN, IMAGENET_STD } from '../nn/input.js';
import { SHARED_OPTIONS, displayPath, imageSizeOption, readClassNames } from './common.js';
import type { ExportResult } from './export.js';
import { inputSettings, type LoadedModel } from './inference.js';
import { UsageError, type OptionSpec } from './options.js';

/** The option names of the input pipeline recorded in the artifact (those of `eval`). */
const INPUT_NAMES = { resize: 'val-resize-size', crop: 'val-crop-size' };

/** The options of the artifact format (beside the model source and the output of `export`). */
export function artifactExportOptions(section: string): OptionSpec[] {
  return [
    imageSizeOption(
      INPUT_NAMES.resize,
      'Resize of the smaller edge recorded in the artifact.',
      "the run's, else 256 (32 for small-stem models)",
      section,
    ),
    imageSizeOption(
      INPUT_NAMES.crop,
      'Center crop (the network input size) recorded in the artifact.',
      "the run's, else 224 (32 for small-stem models)",
      section,
    ),
    { ...SHARED_OPTIONS.interpolation, defaultText: "the run's, else bilinear", section },
    {
      name: 'classes',
      type: 'path',
      mustExist: 'file',
      valueName: 'FILE',
      defaultText: "the run's class names, else none",
      help: 'Class names, one per line, in label order, recorded in the artifact.',
      section,
    },
    {
      name: 'with-onnx',
      type: 'boolean',
      help: 'Also write model.onnx in the artifact (with --opset, --batch, --layout and --dtype; the crop as its input size).',
      section,
    },
  ];
}

/** The keys of the options {@link artifactExportOptions} adds, and the ONNX ones `--with-onnx` reads. */
export const ARTIFACT_EXPORT_KEYS = [
  'valResizeSize',
  'valCropSize',
  'interpolation',
  'classes',
  'withOnnx',
  'opset',
  'batch',
  'layout',
  'dtype',
] as const;

/** The parsed values of {@link artifactExportOptions}. */
export interface ArtifactExportValues {
  valResizeSize: number | undefined;
  valCropSize: number | undefined;
  interpolation: Interpolation | undefined;
  classes: string | undefined;
  withOnnx: boolean;
  /** The ONNX options of `export` (read with `--with-onnx`). */
  opset: string;
  batch: string;
  layout: 'nchw' | 'nhwc';
  dtype: 'f32' | 'f16';
}

/**
 * Writes `loaded`'s model as an artifact in the folder `output` (with `model.onnx` on `--with-onnx`),
 * as the `artifact` format of `export`. Resolves to the result `export --json` prints, the
 * manifest, and a line that says what was written.
 * @throws {@link UsageError} when the class names do not match the model or the crop exceeds the resize.
 */
export async function exportArtifact(
  loaded: LoadedModel,
  output: string,
  values: ArtifactExportValues,
  cwd: string,
): Promise<{ result: ExportResult; manifest: ArtifactManifest; line: string }> {
  const { arch, config } = loaded;
  const small = arch.smallInput;
  const settings = inputSettings(
    { resize: values.valResizeSize, crop: values.valCropSize, interpolation: values.interpolation },
    config,
    { resize: small ? 32 : 256, crop: small ? 32 : 224, mean: [...IMAGENET_MEAN], std: [...IMAGENET_STD] },
    INPUT_NAMES,
  );
  const classFile = values.classes !== undefined ? readClassNames(values.classes) : undefined;
  if (classFile !== undefined && classFile.length !== arch.numClasses) {
    throw new UsageError(
      `--classes '${values.classes}' names ${classFile.length} classes but the model has ${arch.numClasses}`,
    );
  }
  const manifest = await saveInferenceArtifact(loaded.model, output, {
    classes: classFile ?? loaded.classes ?? null,
    preprocessing: {
      resize: settings.valResizeSize,
      crop: settings.valCropSize,
      interpolation: settings.interpolation,
      mean: settings.mean,
      std: settings.std,
    },
    ...(values.withOnnx
      ? {
          onnx: {
            opset: Number(values.opset),
            batch: values.batch === 'dynamic' ? 'dynamic' : Number(values.batch),
            layout: values.layout,
            dtype: values.dtype,
          },
        }
      : {}),
  });
  const files = ['model.json', 'model.safetensors', ...(manifest.onnx ? ['model.onnx'] : [])];
  const p = manifest.preprocessing;
  const line =
    `artifact ${files.join(', ')}: ${arch.model}, ${arch.numClasses} classes` +
    `${manifest.classes ? ' (named)' : ''}, resize ${p.resize}, crop ${p.crop}, ${p.interpolation}`;
  const result: ExportResult = {
    format: 'artifact',
    output: displayPath(output, cwd),
    bytes: manifest.weights.bytes + (manifest.onnx?.bytes ?? 0),
    source: loaded.source,
    details: {
      files,
      architecture: manifest.architecture,
      preprocessing: manifest.preprocessing,
      classes: manifest.classes,
    },
  };
  return { result, manifest, line };
}
