/**
 * The artifact on the command line: `export --format artifact` writes a folder from a weights
 * file, `predict --model DIR` and `eval --model DIR` run it with the same results as `--weights`,
 * and `predict`/`eval` give the same classes and numbers on the fused inference path (the default)
 * as on the training modules (`--engine modules`). Images are the built-in dataset's, written as
 * an image folder; the model's classifier is fitted to the class means of its features (a random
 * network's own gives every image the same class).
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import * as ort from 'onnxruntime-node';
import { ResnetError } from '../lib/errors.js';
import type { ArtifactManifest } from '../lib/inference/artifact-manifest.js';
import { Predictor } from '../lib/inference/predictor.js';
import { IMAGENET_MEAN, IMAGENET_STD, ResNet18, ShapesDataset, Tensor, generateShapes } from '../lib/index.js';
import { decodeSafetensors, saveWeights } from '../lib/train/checkpoint.js';
import { runCli, type CliRun } from './helpers/cli.js';
import { fitNearestMeanClassifier, nhwcToNchw, randomizeBatchNorms, relativeError } from './helpers/onnx.js';

const dir = mkdtempSync(join(tmpdir(), 'rc-artifact-cli-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** What `predict --json` prints. */
interface PredictOutput {
  engine: string;
  resize: number;
  crop: number;
  images: { file: string; predictions: { index: number; class: string; probability: number }[] }[];
}

/** What `eval --json` prints. */
interface EvalOutput {
  engine: string;
  loss: number;
  acc1: number;
  acc5: number;
  count: number;
  confusion: number[][];
  classes: string[] | null;
}

function cli(args: string[]): Promise<CliRun> {
  return runCli(args, dir);
}

async function json<T>(args: string[]): Promise<T> {
  const run = await cli([...args, '--json']);
  expect(run.code, run.stderr).toBe(0);
  return JSON.parse(run.stdout) as T;
}

/** Whether the CPU backend has an inference plan (false only on ERR_RC_BACKEND_UNAVAILABLE). */
function cpuHasInferencePlan(): boolean {
  const model = ResNet18({ numClasses: 2, smallInput: true, seed: 1 }).eval();
  const predictor = new Predictor(model);
  const x = Tensor.zeros([1, 8, 8, 3]);
  try {
    predictor.predict(x).dispose();
    return true;
  } catch (error) {
    if (error instanceof ResnetError && error.code === 'ERR_RC_BACKEND_UNAVAILABLE') return false;
    throw error;
  } finally {
    x.dispose();
    predictor.dispose();
    model.dispose();
  }
}

const weights = join(dir, 'model.safetensors');
const artifactDir = join(dir, 'artifact');
const classesFile = join(dir, 'classes.txt');
const CLASSES = ['circle', 'cross', 'square', 'triangle'];
const folder = join(dir, 'shapes');
let pngs: string[] = [];
const fused = cpuHasInferencePlan();
const expectedEngine = fused ? 'fused' : 'modules';
/** What `export --format artifact` of `weights` (in beforeAll) printed. */
let exported: CliRun;

/** The artifact export of `weights` into `output` (relative to the test folder), with `extra` options. */
function exportTo(output: string, extra: string[]): Promise<CliRun> {
  return cli(['export', '--format', 'artifact', '--weights', weights, '--output', output, ...extra]);
}

function readManifest(folder: string): ArtifactManifest {
  return JSON.parse(readFileSync(join(dir, folder, 'model.json'), 'utf8')) as ArtifactManifest;
}

beforeAll(async () => {
  const model = ResNet18({ numClasses: 4, smallInput: true, seed: 21 });
  randomizeBatchNorms(model, 22);
  const { images, labels } = generateShapes({ count: 32, size: 16, classes: 4, seed: 24 });
  const x = Float32Array.from(images, (v, i) => (v / 255 - IMAGENET_MEAN[i % 3]!) / IMAGENET_STD[i % 3]!);
  fitNearestMeanClassifier(model, x, labels, 16);
  await saveWeights(weights, model);
  model.dispose();
  writeFileSync(classesFile, `${CLASSES.join('\n')}\n`);
  pngs = await ShapesDataset.writeImageFolder(join(folder, 'val'), { count: 12, size: 20, seed: 23 });
  exported = await exportTo('artifact', [
    '--val-resize-size',
    '20',
    '--val-crop-size',
    '16',
    '--interpolation',
    'bicubic',
    '--classes',
    classesFile,
  ]);
});

describe('export --format artifact, predict --model DIR, eval --model DIR', () => {
  it('writes the artifact of a weights file with the given preprocessing and class names', async () => {
    expect(exported.code, exported.stderr).toBe(0);
    expect(exported.stdout).toMatch(
      /^exported weights model\.safetensors to artifact \(artifact, \d+\.\d MB\)\nartifact model\.json, model\.safetensors: resnet18, 4 classes \(named\), resize 20, crop 16, bicubic\n$/,
    );
    expect(readManifest('artifact')).toMatchObject({
      architecture: { depth: 18, numClasses: 4, smallInput: true, inChannels: 3 },
      preprocessing: { resize: 20, crop: 16, interpolation: 'bicubic', mean: [0.485, 0.456, 0.406] },
      classes: CLASSES,
    });
    // The weights are the file's: the same tensors in the same safetensors encoding.
    expect(readFileSync(join(artifactDir, 'model.safetensors')).equals(readFileSync(weights))).toBe(true);

    const bad = await exportTo('bad', ['--val-resize-size', '16', '--val-crop-size', '20']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/--val-crop-size 20 is larger than --val-resize-size 16/);
    const onnxOnly = await exportTo('bad', ['--image-size', '16']);
    expect(onnxOnly.code).toBe(2);
    expect(onnxOnly.stderr).toMatch(/--image-size applies to --format onnx only/);
  });

  it('with --with-onnx, also writes model.onnx, which ONNX Runtime runs to the same logits', async () => {
    const run = await exportTo('with-onnx', ['--with-onnx', '--val-resize-size', '16', '--json']);
    expect(run.code, run.stderr).toBe(0);
    const result = JSON.parse(run.stdout) as { format: string; details: { files: string[] } };
    expect(result.format).toBe('artifact');
    expect(result.details.files).toEqual(['model.json', 'model.safetensors', 'model.onnx']);
    const manifest = readManifest('with-onnx');
    const onnxFile = join(dir, 'with-onnx', 'model.onnx');
    expect(manifest.onnx).toMatchObject({ file: 'model.onnx', bytes: readFileSync(onnxFile).byteLength });
    const session = await ort.InferenceSession.create(onnxFile);
    const x = Float32Array.from({ length: 2 * 16 * 16 * 3 }, (_, i) => Math.sin(i * 0.37));
    const out = await session.run({ input: new ort.Tensor('float32', nhwcToNchw(x, 2, 16, 16, 3), [2, 3, 16, 16]) });
    const got = out.logits?.data as Float32Array;
    const model = ResNet18({ numClasses: 4, smallInput: true });
    const { tensors } = decodeSafetensors(readFileSync(weights), weights);
    model.loadStateDict(tensors);
    model.eval();
    const input = Tensor.from(x, [2, 16, 16, 3]);
    const want = model.forward(input).toFloat32Array();
    input.dispose();
    model.dispose();
    await session.release();
    expect(relativeError(got, want)).toBeLessThan(1e-4);
  });

  it('predict --model DIR gives the classes and probabilities of predict --weights with the same input', async () => {
    const fromArtifact = await json<PredictOutput>(['predict', '--model', 'artifact', '--topk', '4', ...pngs]);
    const fromWeights = await json<PredictOutput>([
      'predict',
      '--weights',
      weights,
      '--classes',
      classesFile,
      '--resize',
      '20',
      '--crop',
      '16',
      '--interpolation',
      'bicubic',
      '--topk',
      '4',
      ...pngs,
    ]);
    expect(fromArtifact).toMatchObject({ resize: 20, crop: 16, engine: expectedEngine });
    expect(fromArtifact.images.map((i) => i.file)).toEqual(pngs);
    // The same weights through the same forward: the same numbers, not merely the same top-1.
    expect(fromArtifact.images).toEqual(fromWeights.images);
    expect(new Set(fromArtifact.images.map((i) => i.predictions[0]!.class)).size).toBeGreaterThan(1);
    expect(fromArtifact.images[0]!.predictions.map((p) => p.class).sort()).toEqual(CLASSES);
  });

  it(`predict and eval give the same results on the fused path and the training modules${fused ? '' : ' (no CPU inference plan in this build: the default falls back to the modules with a note)'}`, async () => {
    const modules = await json<PredictOutput>([
      'predict',
      '--model',
      'artifact',
      '--engine',
      'modules',
      '--topk',
      '4',
      ...pngs,
    ]);
    const run = await cli(['predict', '--model', 'artifact', '--topk', '4', '--json', ...pngs]);
    expect(run.code, run.stderr).toBe(0);
    const byDefault = JSON.parse(run.stdout) as PredictOutput;
    expect(modules.engine).toBe('modules');
    expect(byDefault.engine).toBe(expectedEngine);
    expect(run.stderr).toBe(fused ? '' : expect.stringMatching(/^note: no fused inference path for f32 on cpu /));
    for (const [i, image] of byDefault.images.entries()) {
      const want = modules.images[i]!;
      expect(image.predictions.map((p) => p.index)).toEqual(want.predictions.map((p) => p.index));
      for (const [j, p] of image.predictions.entries()) {
        expect(Math.abs(p.probability - want.predictions[j]!.probability)).toBeLessThan(1e-5);
      }
    }

    const evalArgs = ['eval', folder, '--model', 'artifact', '-j', '0', '-b', '5'];
    const evalModules = await json<EvalOutput>([...evalArgs, '--engine', 'modules']);
    const evalDefault = await json<EvalOutput>(evalArgs);
    expect(evalModules.engine).toBe('modules');
    expect(evalDefault.engine).toBe(expectedEngine);
    expect(evalDefault.count).toBe(12);
    expect(evalDefault.classes).toEqual(CLASSES);
    expect(evalDefault.acc1).toBe(evalModules.acc1);
    expect(evalDefault.acc5).toBe(evalModules.acc5);
    expect(evalDefault.confusion).toEqual(evalModules.confusion);
    expect(Math.abs(evalDefault.loss - evalModules.loss)).toBeLessThanOrEqual(1e-5 * Math.max(1, evalModules.loss));
    // The confusion matrix counts every image once, whatever the forward.
    expect(evalDefault.confusion.flat().reduce((a, b) => a + b, 0)).toBe(12);
  });

  it('eval --model DIR equals eval --weights with the same input pipeline', async () => {
    const fromArtifact = await json<EvalOutput>([
      'eval',
      folder,
      '--model',
      'artifact',
      '-j',
      '0',
      '--engine',
      'modules',
    ]);
    const fromWeights = await json<EvalOutput>([
      'eval',
      folder,
      '--weights',
      weights,
      '--val-resize-size',
      '20',
      '--val-crop-size',
      '16',
      '--interpolation',
      'bicubic',
      '-j',
      '0',
      '--engine',
      'modules',
    ]);
    expect(fromArtifact.loss).toBe(fromWeights.loss);
    expect(fromArtifact.confusion).toEqual(fromWeights.confusion);
  });

  it('train leaves its best model as an artifact that predict --model runs as predict --weights runs model-best', async () => {
    await ShapesDataset.writeImageFolder(join(folder, 'train'), { count: 16, size: 20, seed: 25 });
    const run = await cli([
      'train',
      folder,
      '--epochs',
      '1',
      '-b',
      '8',
      '-j',
      '0',
      '--train-crop-size',
      '16',
      '--val-resize-size',
      '18',
      '--val-crop-size',
      '16',
      '--seed',
      '3',
      '--no-tensorboard',
      '--no-plots',
      '--output-dir',
      'run',
    ]);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toMatch(/\noutputs in run: model\.safetensors, artifact\/, /);
    expect(readManifest(join('run', 'artifact'))).toMatchObject({
      architecture: { depth: 18, numClasses: 4, smallInput: true },
      preprocessing: { resize: 18, crop: 16, interpolation: 'bilinear', mean: [0.485, 0.456, 0.406] },
      classes: CLASSES,
    });
    const fromArtifact = await json<PredictOutput>(['predict', '--model', 'run/artifact', '--topk', '4', ...pngs]);
    const fromBest = await json<PredictOutput>([
      'predict',
      '--weights',
      'run/model-best.safetensors',
      '--topk',
      '4',
      ...pngs,
    ]);
    expect(fromArtifact).toMatchObject({ resize: 18, crop: 16 });
    expect(fromArtifact.images).toEqual(fromBest.images);
  });

  it('refuses a --model that is neither a network nor a folder, an artifact given with --weights, and a broken artifact', async () => {
    const nowhere = await cli(['predict', '--model', 'nowhere', pngs[0]!]);
    expect(nowhere.code).toBe(2);
    expect(nowhere.stderr).toMatch(
      /--model expects one of resnet18, .* or an inference artifact folder, got 'nowhere'/,
    );
    const both = await cli(['predict', '--model', 'artifact', '--weights', weights, pngs[0]!]);
    expect(both.code).toBe(2);
    expect(both.stderr).toMatch(/give either an artifact \(--model artifact\) or --weights, not both/);
    const none = await cli(['predict', pngs[0]!]);
    expect(none.code).toBe(2);
    expect(none.stderr).toMatch(/--model DIR/);
    const classes = await cli(['eval', folder, '--model', 'artifact', '--num-classes', '3']);
    expect(classes.code).toBe(2);
    expect(classes.stderr).toMatch(/--num-classes 3 does not match the artifact, whose model has 4 classes/);

    expect((await exportTo('broken', [])).code).toBe(0);
    writeFileSync(join(dir, 'broken', 'model.json'), JSON.stringify({ ...readManifest('broken'), version: 9 }));
    const run = await cli(['predict', '--model', 'broken', pngs[0]!]);
    expect(run.code).toBe(1);
    expect(run.stderr).toMatch(/format version 9, newer than this package reads \(1\)/);
  });
});
