/**
 * Rebuilds a dataset from its spec: what each loader worker does with the spec the main thread
 * sends it, so every dataset kind of the package must be listed here.
 * @packageDocumentation
 */
import { ResnetError, invalid } from '../errors.js';
import { CifarDataset } from './cifar.js';
import { IdxDataset } from './idx.js';
import { ImageFiles } from './image-files.js';
import { ImageFolder } from './image-folder.js';
import { ShapesDataset } from './shapes-dataset.js';
import { Subset } from './split.js';
import { SyntheticDataset } from './synthetic.js';
import type { Dataset, DatasetSpec } from './types.js';

const builders: Record<string, (spec: DatasetSpec) => Dataset | Promise<Dataset>> = {
  ImageFolder: (spec) => ImageFolder.fromSpec(spec),
  ImageFiles: (spec) => ImageFiles.fromSpec(spec),
  Idx: (spec) => IdxDataset.fromSpec(spec),
  Cifar: (spec) => CifarDataset.fromSpec(spec),
  Synthetic: (spec) => SyntheticDataset.fromSpec(spec),
  Shapes: (spec) => ShapesDataset.fromSpec(spec),
  Subset: async (spec) => {
    if (spec.dataset === null || typeof spec.dataset !== 'object') {
      invalid('spec.dataset', "the parent dataset's spec", spec.dataset);
    }
    if (!Array.isArray(spec.indices) && !(spec.indices instanceof Int32Array)) {
      invalid('spec.indices', 'an array of indices', spec.indices);
    }
    return new Subset(await datasetFromSpec(spec.dataset as DatasetSpec), spec.indices as number[]);
  },
};

/** The dataset kinds {@link datasetFromSpec} rebuilds. */
export const DATASET_KINDS: readonly string[] = Object.freeze(Object.keys(builders));

/**
 * Rebuilds the dataset a {@link Dataset.spec} describes: an `ImageFolder` from its file list
 * (without scanning), IDX and CIFAR datasets by reopening their files, generated ones from their
 * seed, and a `Subset` from its parent's spec and its indices.
 *
 * @throws `ERR_RC_DATASET` for an unknown kind (a dataset class of your own cannot be rebuilt in
 *   a worker); the kind's own errors for a malformed spec or files that changed.
 */
export async function datasetFromSpec(spec: DatasetSpec): Promise<Dataset> {
  if (spec === null || typeof spec !== 'object' || Array.isArray(spec)) invalid('spec', 'a dataset spec object', spec);
  if (typeof spec.kind !== 'string') invalid('spec.kind', 'a dataset kind string', spec.kind);
  const build = Object.hasOwn(builders, spec.kind) ? builders[spec.kind] : undefined;
  if (build === undefined) {
    throw new ResnetError(
      'ERR_RC_DATASET',
      `Unknown dataset kind '${spec.kind}' in a dataset spec; the kinds that can be rebuilt from a spec are: ${DATASET_KINDS.join(', ')}`,
    );
  }
  return build(spec);
}
