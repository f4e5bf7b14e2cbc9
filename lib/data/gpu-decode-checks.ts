/**
 * What `DataLoader({ decode: 'gpu' })` takes, checked when the loader is made: a CUDA device, a
 * dataset of JPEG files, and a transform that the device decoder reproduces.
 * @packageDocumentation
 */
import { ResnetError } from '../errors.js';
import { parseDevice } from '../device.js';
import { Compose } from './transforms.js';
import type { Dataset, DatasetSpec } from './types.js';

/** The transforms the device decoder can start a pipeline with (crop and resize in its kernel). */
const FUSED_FIRST: readonly string[] = ['RandomResizedCrop', 'Resize', 'CenterCrop'];

/** File name endings of JPEG files, lower case. */
const JPEG_EXTENSIONS: readonly string[] = ['.jpg', '.jpeg', '.jpe', '.jfif'];

/** The CUDA device a `decode: 'gpu'` loader decodes on, or a clear error for anything else. */
export function gpuDecodeDevice(device: unknown): string {
  if (device === undefined) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      "DataLoader: decode: 'gpu' decodes on a CUDA device and hands the batches over there: give device: 'cuda' or 'cuda:N'",
    );
  }
  const parsed = parseDevice(device, 'device');
  if (!parsed.startsWith('cuda')) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      `DataLoader: decode: 'gpu' needs a CUDA device ('cuda' or 'cuda:N') for device, but received '${parsed}': ` +
        "for batches on the CPU, decode on the CPU (decode: 'cpu', the default)",
    );
  }
  return parsed;
}

/**
 * Refuses a transform the device decoder does not reproduce, naming the transforms it cannot do:
 * the device runs a RandomResizedCrop, Resize or CenterCrop first (a CenterCrop may follow a
 * Resize), then only RandomHorizontalFlip (deferred to `InputNormalize`, or, with `deferFlip:
 * false`, one right after the crop, mirrored in the decode) and Normalize (which `InputNormalize`
 * applies), into 3 channels. Normalize steps before the crop do nothing to pixels and are allowed.
 */
export function expectGpuTransform(transform: Compose, deferFlip: boolean): void {
  const kinds = transform.transforms.map((t) => t.kind);
  const fail = (why: string): never => {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      `DataLoader: decode: 'gpu' cannot run this transform (${kinds.join(', ') || 'empty'}): ${why}. ` +
        'The device decoder runs RandomResizedCrop, Resize or CenterCrop first (CenterCrop may follow Resize), ' +
        "then only RandomHorizontalFlip and Normalize; use decode: 'cpu' for other pipelines",
    );
  };
  if (transform.outputChannels !== 3) fail(`it makes ${transform.outputChannels}-channel images, the device 3 (RGB)`);
  let k = 0;
  while (kinds[k] === 'Normalize') k++;
  if (k === kinds.length || !FUSED_FIRST.includes(kinds[k]!)) {
    fail(k === kinds.length ? 'it has no crop or resize' : `transforms[${k}] is ${kinds[k]}, not a crop or resize`);
  }
  const fuser = transform.transforms[k]!;
  k++;
  if (fuser.takesCenterCrop && kinds[k] === 'CenterCrop') k++;
  if (!deferFlip && kinds[k] === 'RandomHorizontalFlip') k++; // mirrored in the decode
  const refused: string[] = [];
  for (; k < kinds.length; k++) {
    const kind = kinds[k]!;
    if (kind === 'Normalize' || (deferFlip && kind === 'RandomHorizontalFlip')) continue;
    refused.push(`${kind} (transforms[${k}])`);
  }
  if (refused.length > 0) {
    const flips = !deferFlip && refused.some((r) => r.startsWith('RandomHorizontalFlip'));
    fail(
      `the device does not do ${refused.join(', ')} after the crop` +
        (flips ? ' (with deferFlip: false only a flip right after the crop is mirrored in the decode)' : ''),
    );
  }
}

/**
 * The files a dataset yields, in sample order, for the datasets whose spec lists them
 * (ImageFolder, ImageFiles, and Subsets of those); undefined for any other dataset.
 */
function specFiles(spec: DatasetSpec): string[] | undefined {
  if (spec.kind === 'ImageFiles' && Array.isArray(spec.files)) return spec.files as string[];
  if (spec.kind === 'ImageFolder' && Array.isArray(spec.files) && typeof spec.root === 'string') {
    const root = spec.root.endsWith('/') ? spec.root : `${spec.root}/`;
    return (spec.files as string[]).map((f) => root + f);
  }
  if (
    spec.kind === 'Subset' &&
    Array.isArray(spec.indices) &&
    spec.dataset !== null &&
    typeof spec.dataset === 'object'
  ) {
    const files = specFiles(spec.dataset as DatasetSpec);
    return files && (spec.indices as number[]).map((i) => files[i]!);
  }
  return undefined;
}

/**
 * Refuses a dataset the device decoder cannot read: one of decoded images (IDX, CIFAR, synthetic,
 * generated, Shapes), or an ImageFolder/ImageFiles (or a Subset of one) with files that are not
 * JPEGs by their name (PNG, WebP), naming the first. Other datasets are checked sample by sample:
 * a sample that is not an encoded JPEG fails the epoch, naming it.
 */
export function expectGpuDataset(dataset: Dataset, spec: DatasetSpec): void {
  if (dataset.imageShape !== undefined) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      `DataLoader: decode: 'gpu' decodes JPEG files (ImageFolder or ImageFiles of JPEGs), but this dataset (${spec.kind}) ` +
        "yields decoded images: use decode: 'cpu' for it",
    );
  }
  const files = specFiles(spec);
  if (!files) return;
  const bad = files.filter((f) => !JPEG_EXTENSIONS.some((e) => f.toLowerCase().endsWith(e)));
  if (bad.length > 0) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      `DataLoader: decode: 'gpu' decodes JPEG files only, but ${bad.length} of the dataset's ${files.length} files ` +
        `are not JPEGs by their name, such as '${bad[0]}': use decode: 'cpu' (which also reads PNG and WebP), ` +
        "or open the ImageFolder with extensions: ['.jpg', '.jpeg']",
    );
  }
}
