/**
 * The artifact on the command line: the artifact export handler writes a folder from a weights
 * file, `predict --model DIR` and `eval --model DIR` run it with the same results as `--weights`,
 * and `predict`/`eval` give the same classes and numbers on the fused inference path (the default)
 * as on the training modules (`--engine modules`). Images are the built-in dataset's, written as
 * an image folder.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { exportArtifact } from '../lib/cli/export-artifact.js';
import { loadModel } from '../lib/cli/inference.js';
import { ResnetError } from '../lib/errors.js';
import type { ArtifactManifest } from '../lib/inference/artifact-manifest.js';
import { Predictor } from '../lib/inference/predictor.js';
import { ResNet18, ShapesDataset, Tensor } from '../lib/index.js';
import { saveWeights } from '../lib/train/checkpoint.js';
import { runCli, type CliRun } from './helpers/cli.js';
import { randomizeBatchNorms } from './helpers/onnx.js';

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
/** What the artifact export of `weights` (in beforeAll) returned. */
let exported: { manifest: ArtifactManifest; line: string };

beforeAll(async () => {
  const model = ResNet18({ numClasses: 4, smallInput: true, seed: 21 });
  randomizeBatchNorms(model, 22);
  await saveWeights(weights, model);
  model.dispose();
  writeFileSync(classesFile, `${CLASSES.join('\n')}\n`);
  pngs = await ShapesDataset.writeImageFolder(join(folder, 'val'), { count: 12, size: 20, seed: 23 });
  const loaded = await loadModel({ weights }, 'cpu', dir);
  exported = await exportArtifact(
    loaded,
    artifactDir,
    { valResizeSize: 20, valCropSize: 16, interpolation: 'bicubic', classes: classesFile },
    dir,
  );
  loaded.model.dispose();
});

describe('export --format artifact, predict --model DIR, eval --model DIR', () => {
  it('writes the artifact of a weights file with the given preprocessing and class names', async () => {
    const { manifest, line } = exported;
    expect(line).toBe(
      'wrote model.json, model.safetensors to artifact: resnet18, 4 classes (named), resize 20, crop 16, bicubic',
    );
    const written = JSON.parse(readFileSync(join(artifactDir, 'model.json'), 'utf8')) as ArtifactManifest;
    expect(written).toEqual(manifest);
    expect(written).toMatchObject({
      architecture: { depth: 18, numClasses: 4, smallInput: true, inChannels: 3 },
      preprocessing: { resize: 20, crop: 16, interpolation: 'bicubic', mean: [0.485, 0.456, 0.406] },
      classes: CLASSES,
    });
    // The weights are the file's, byte for byte in their tensors: the same safetensors encoding.
    expect(readFileSync(join(artifactDir, 'model.safetensors')).equals(readFileSync(weights))).toBe(true);

    const loaded2 = await loadModel({ weights }, 'cpu', dir);
    await expect(
      exportArtifact(
        loaded2,
        join(dir, 'bad'),
        { valResizeSize: 16, valCropSize: 20, interpolation: undefined, classes: undefined },
        dir,
      ),
    ).rejects.toThrow(/--val-crop-size 20 is larger than --val-resize-size 16/);
    loaded2.model.dispose();
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
    // Each image gets its own probabilities: the input reaches the network.
    expect(new Set(fromArtifact.images.map((i) => i.predictions[0]!.probability)).size).toBe(pngs.length);
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

    const broken = join(dir, 'broken');
    const loaded = await loadModel({ weights }, 'cpu', dir);
    await exportArtifact(
      loaded,
      broken,
      { valResizeSize: 20, valCropSize: 16, interpolation: undefined, classes: undefined },
      dir,
    );
    loaded.model.dispose();
    const manifest = JSON.parse(readFileSync(join(broken, 'model.json'), 'utf8')) as ArtifactManifest;
    writeFileSync(join(broken, 'model.json'), JSON.stringify({ ...manifest, version: 9 }));
    const run = await cli(['predict', '--model', 'broken', pngs[0]!]);
    expect(run.code).toBe(1);
    expect(run.stderr).toMatch(/format version 9, newer than this package reads \(1\)/);
  });
});
