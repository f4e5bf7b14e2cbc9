/**
 * `resnet-cuda embed`: the pooled features of trained weights over a dataset split, written as
 * `.npy` (and/or safetensors) files, and their Barnes-Hut t-SNE drawn as a PNG scatter coloured by
 * class, with the coordinates as `.npy` and JSON.
 * @packageDocumentation
 */
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { extractFeatures, saveFeatures, type ExtractedFeatures } from '../analysis/features.js';
import { encodeNpy } from '../analysis/npy.js';
import { tsne } from '../analysis/tsne.js';
import { DataLoader } from '../data/loader.js';
import { Subset } from '../data/split.js';
import type { Dataset } from '../data/types.js';
import type { Interpolation } from '../data/transforms.js';
import { Random } from '../random.js';
import { writeFileAtomic } from '../train/checkpoint.js';
import { plotScatter, writePng } from '../train/outputs/plots.js';
import {
  SHARED_OPTIONS,
  checkDevice,
  displayPath,
  locateData,
  openEvalData,
  openTrainData,
  precisionText,
  timestampName,
  valTransform,
  workerCount,
  type AmpName,
  type DatasetName,
  type ModelName,
} from './common.js';
import { checkModelSource, inferencePrecision, inputOptions, loadModel, modelSourceOptions } from './inference.js';
import { EVAL_DATASET_OPTION, EVAL_DATA_POSITIONAL, EVAL_INPUT_NAMES, resolveEvalData } from './eval-data.js';
import { UsageError, type CliIO, type Command, type CommandSpec, type ParsedCommand } from './options.js';

const S_TSNE = 't-SNE';

const SPEC: CommandSpec = {
  name: 'embed',
  summary: 'Extract pooled features and draw their t-SNE.',
  description:
    "Runs trained weights in evaluation mode over a dataset split and writes the pooled features (the global average pool's output that fc reads: 512 values per image for ResNet-18/34, 2048 for ResNet-50/101/152) " +
    'as features.npy (float32 [N, D]) with labels.npy and indices.npy (int64 [N]), classes.txt and, for image files, files.txt; then embeds them in 2-D with Barnes-Hut t-SNE ' +
    '(van der Maaten, JMLR 15:3221, 2014) and writes tsne.png (a scatter coloured by class), tsne.npy (float64 [N, 2]) and tsne.json. ' +
    "DATA is read as eval reads it; without DATA, the run's own data, else the built-in dataset. " +
    't-SNE finds nearest neighbours exactly (time N² × D): use --max-samples beyond about 10,000 images.',
  positionals: [EVAL_DATA_POSITIONAL],
  options: [
    ...modelSourceOptions('Model'),
    EVAL_DATASET_OPTION,
    {
      name: 'split',
      type: 'choice',
      choices: ['val', 'train'],
      default: 'val',
      help: 'Which part of the data: the validation (test) split or the training split.',
      section: 'Data',
    },
    {
      name: 'max-samples',
      type: 'int',
      min: 3,
      valueName: 'N',
      defaultText: 'all',
      help: 'Embed a seeded random subset of N images of the split (kept in dataset order).',
      section: 'Data',
    },
    ...inputOptions(EVAL_INPUT_NAMES, 'Data', 'Run'),
    { ...SHARED_OPTIONS.workers, section: 'Data' },
    {
      name: 'perplexity',
      type: 'number',
      min: 1,
      default: 30,
      help: "t-SNE's perplexity, the effective number of neighbours (must be below the number of images less one).",
      section: S_TSNE,
    },
    {
      name: 'tsne-iter',
      type: 'int',
      min: 1,
      default: 1000,
      valueName: 'N',
      help: 'Gradient-descent iterations (the first 250 with early exaggeration 12).',
      section: S_TSNE,
    },
    {
      name: 'theta',
      type: 'number',
      min: 0,
      default: 0.5,
      help: 'Barnes-Hut accuracy: 0 is exact (slow), larger is faster and coarser.',
      section: S_TSNE,
    },
    {
      name: 'learning-rate',
      type: 'number',
      min: 0,
      exclusiveMin: true,
      valueName: 'LR',
      defaultText: 'max(N / 48, 50)',
      help: "t-SNE's learning rate (scikit-learn's convention, gradient with its factor 4).",
      section: S_TSNE,
    },
    {
      name: 'init',
      type: 'choice',
      choices: ['pca', 'random'],
      default: 'pca',
      help: 'Starting layout: the first two principal components, or seeded random.',
      section: S_TSNE,
    },
    {
      name: 'seed',
      type: 'int',
      min: 0,
      default: 0,
      help: 'Seed of the t-SNE initialisation and of --max-samples.',
      section: S_TSNE,
    },
    { name: 'no-tsne', type: 'boolean', help: 'Write the features only.', section: S_TSNE },
    {
      name: 'output-dir',
      type: 'path',
      valueName: 'DIR',
      defaultText: 'embeddings/<date>_<time>',
      help: 'Where the files go (created when missing).',
      section: 'Output',
    },
    {
      name: 'format',
      type: 'choice',
      choices: ['npy', 'safetensors', 'both'],
      default: 'npy',
      help: 'The feature files: features.npy, labels.npy and indices.npy; or features.safetensors; or both.',
      section: 'Output',
    },
    { name: 'quiet', short: 'q', type: 'boolean', help: 'No progress lines.', section: 'Output' },
  ],
  examples: [
    'resnet-cuda embed --checkpoint runs/demo --output-dir runs/demo/embed',
    'resnet-cuda embed data/pets --weights runs/pets/model.safetensors --output-dir pets-embed --perplexity 50',
    'resnet-cuda embed data/imagenet --weights resnet50.safetensors --max-samples 5000 --device cuda --no-tsne',
  ],
};

interface EmbedArgs {
  weights: string | undefined;
  checkpoint: string | undefined;
  model: ModelName | undefined;
  numClasses: number | undefined;
  dataset: DatasetName | undefined;
  split: 'val' | 'train';
  maxSamples: number | undefined;
  valResizeSize: number | undefined;
  valCropSize: number | undefined;
  interpolation: Interpolation | undefined;
  batchSize: number;
  workers: number | undefined;
  device: string;
  amp: AmpName | undefined;
  perplexity: number;
  tsneIter: number;
  theta: number;
  learningRate: number | undefined;
  init: 'pca' | 'random';
  seed: number;
  noTsne: boolean;
  outputDir: string | undefined;
  format: 'npy' | 'safetensors' | 'both';
  quiet: boolean;
}

/** A seeded random subset of `count` samples of `dataset`, in dataset order; the dataset itself when it is not larger. */
function sampleSubset(dataset: Dataset, count: number | undefined, seed: number): Dataset {
  if (count === undefined || count >= dataset.length) return dataset;
  const order = Int32Array.from({ length: dataset.length }, (_, i) => i);
  const rng = new Random(seed);
  // The first `count` places of a Fisher-Yates shuffle.
  for (let i = 0; i < count; i++) {
    const j = i + rng.int(dataset.length - i);
    [order[i], order[j]] = [order[j]!, order[i]!];
  }
  return new Subset(dataset, order.subarray(0, count).sort());
}

async function run(parsed: ParsedCommand, io: CliIO): Promise<number> {
  const a = parsed.values as unknown as EmbedArgs;
  const given = parsed.positionals[0];
  checkModelSource(a);
  if (given !== undefined) locateData(a.dataset ?? 'imagefolder', given, a.split === 'val' ? 'eval' : 'train');
  const device = checkDevice(a.device);
  const workers = workerCount(a.workers, (text) => io.stderr.write(`${text}\n`));
  const log = (text: string): void => {
    if (!a.quiet) io.stderr.write(`${text}\n`);
  };

  const loaded = await loadModel(a, device, io.cwd);
  const { config } = loaded;
  const precision = inferencePrecision(a.amp, config.amp, device);
  // The data, as `eval` chooses it.
  const { dataset, data, files, settings, generated } = resolveEvalData(
    a,
    given,
    loaded,
    a.split === 'val' ? 'eval' : 'train',
  );
  const split =
    a.split === 'val' ? await openEvalData(files, generated) : (await openTrainData(files, generated)).train;
  const chosen = sampleSubset(split, a.maxSamples, a.seed);
  if (!a.noTsne && a.perplexity >= chosen.length - 1) {
    throw new UsageError(
      `--perplexity ${a.perplexity} must be below the number of images less one (${chosen.length - 1})`,
      'Lower --perplexity, or embed more images.',
    );
  }
  const outDir = a.outputDir ?? join(io.cwd, 'embeddings', timestampName());
  mkdirSync(outDir, { recursive: true });

  log(`resnet-cuda embed: ${loaded.arch.model}, ${loaded.arch.numClasses} classes, from ${loaded.source}`);
  log(
    `on ${data !== undefined ? `${dataset} '${displayPath(data, io.cwd)}'` : 'the built-in dataset'} (${a.split}): ${chosen.length}${chosen === split ? '' : ` of ${split.length}`} images, resize ${settings.valResizeSize}, crop ${settings.valCropSize}, ${device}, ${precisionText(precision.amp)}`,
  );
  const loader = new DataLoader(chosen, { batchSize: a.batchSize, transform: valTransform(settings), workers, device });
  let extracted: ExtractedFeatures;
  try {
    extracted = await extractFeatures(loaded.model, loader, {
      dtype: precision.amp === 'bf16' ? 'bf16' : precision.amp === 'fp16' ? 'f16' : 'f32',
      onBatch: (done, total) => {
        if (!a.quiet && (done === total || done % 10 === 0)) io.stderr.write(`features: batch ${done}/${total}\n`);
      },
    });
  } finally {
    await loader.close();
    loaded.model.dispose();
  }
  // Indices into the split, not into the sampled subset of it.
  if (chosen instanceof Subset && chosen !== split) {
    extracted.indices = Int32Array.from(extracted.indices, (i) => chosen.indices[i]!);
  }
  const classes = loaded.classes ?? (extracted.classes.length > 0 ? [...extracted.classes] : undefined);
  const written = await saveFeatures(outDir, extracted, { format: a.format });
  log(`features: ${extracted.count} x ${extracted.dims}, written to ${displayPath(outDir, io.cwd)}`);

  if (!a.noTsne) {
    const started = Date.now();
    const result = tsne(extracted.features, extracted.dims, {
      perplexity: a.perplexity,
      iterations: a.tsneIter,
      theta: a.theta,
      init: a.init,
      seed: a.seed,
      ...(a.learningRate !== undefined ? { learningRate: a.learningRate } : {}),
      reportEvery: 50,
      onProgress: (r) => {
        if (r.iteration % 250 === 0) {
          log(`t-SNE: iteration ${r.iteration}/${a.tsneIter}, KL divergence ${r.kl.toFixed(4)}`);
        }
      },
    });
    const seconds = (Date.now() - started) / 1000;
    const names = classes ?? [];
    const png = join(outDir, 'tsne.png');
    await writePng(
      png,
      await plotScatter(result.embedding, extracted.labels, {
        title: `t-SNE of ${loaded.arch.model} features (perplexity ${a.perplexity}, KL ${result.kl.toFixed(3)})`,
        ...(names.length > 0 ? { classNames: names } : {}),
      }),
    );
    await writeFileAtomic(join(outDir, 'tsne.npy'), encodeNpy(result.embedding, [result.count, 2]));
    const points = Array.from({ length: result.count }, (_, i) => ({
      x: result.embedding[2 * i]!,
      y: result.embedding[2 * i + 1]!,
      label: extracted.labels[i]!,
      index: extracted.indices[i]!,
      ...(extracted.files ? { file: extracted.files[i]! } : {}),
    }));
    await writeFileAtomic(
      join(outDir, 'tsne.json'),
      `${JSON.stringify(
        {
          model: loaded.arch.model,
          perplexity: result.perplexity,
          neighbours: result.neighbours,
          iterations: result.iterations,
          theta: a.theta,
          learningRate: result.learningRate,
          init: a.init,
          seed: a.seed,
          kl: result.kl,
          history: result.history,
          classes: names,
          points,
        },
        null,
        1,
      )}\n`,
    );
    written.push(png, join(outDir, 'tsne.npy'), join(outDir, 'tsne.json'));
    log(`t-SNE: KL divergence ${result.kl.toFixed(4)} after ${result.iterations} iterations (${seconds.toFixed(1)} s)`);
  }
  io.stdout.write(`${written.map((p) => displayPath(p, io.cwd)).join('\n')}\n`);
  return 0;
}

/** The `embed` command. */
export const embedCommand: Command = { spec: SPEC, run };
