/**
 * The inference artifact: written by saveInferenceArtifact and read back by loadInferenceArtifact.
 * A round trip gives bit-identical logits through the training modules' eval forward, and the
 * loaded model's Predictor (the fused inference path) equals them to f32 rounding; the manifest
 * records what the model expects; every way an artifact can be wrong is refused with an error that
 * names the file and the problem.
 *
 * The Predictor rows run where the device has an inference plan; where the backend reports
 * ERR_RC_BACKEND_UNAVAILABLE for it they check that code and say so in their name, and any other
 * failure of the probe fails the file.
 */
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, unlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { CenterCrop, Normalize, Resize } from '../lib/data/transforms.js';
import { ResnetError } from '../lib/errors.js';
import { ARTIFACT_FORMAT, ARTIFACT_VERSION, type ArtifactManifest } from '../lib/inference/artifact-manifest.js';
import { loadInferenceArtifact, saveInferenceArtifact } from '../lib/inference/artifact.js';
import { Predictor } from '../lib/inference/predictor.js';
import { evaluatePredictor, predictLoader } from '../lib/inference/predictor-runs.js';
import type { EvalResult } from '../lib/train/evaluation.js';
import { openEngine } from '../lib/cli/engine.js';
import {
  CenterCrop as Crop,
  Compose,
  DataLoader,
  Normalize as Norm,
  ResNet,
  ResNet18,
  ShapesDataset,
  Tensor,
  listBackends,
} from '../lib/index.js';
import { noiseImages, randomizeBatchNorms, relativeError } from './helpers/onnx.js';

/** f32 through a folded, fused network against the modules' forward (the issue's bound). */
const F32_TOLERANCE = 1e-5;

const dir = mkdtempSync(join(tmpdir(), 'rc-artifact-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const onlyCuda = process.env.RESNET_TEST_BACKENDS === 'cuda';

/**
 * Whether `device` has an inference plan: true when a tiny network runs through a Predictor,
 * false when the backend answers ERR_RC_BACKEND_UNAVAILABLE; any other error is thrown.
 */
function hasInferencePlan(device: string): boolean {
  const model = ResNet18({ numClasses: 2, smallInput: true, seed: 1, device }).eval();
  const predictor = new Predictor(model, { device });
  const x = Tensor.zeros([1, 8, 8, 3], { device });
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

/** A small-stem ResNet-18 with non-trivial batch-norm statistics, as a trained one has. */
function trainedLike(numClasses: number, seed: number, device = 'cpu'): ResNet {
  const model = ResNet18({ numClasses, smallInput: true, seed, device });
  randomizeBatchNorms(model, seed + 100);
  return model.eval();
}

function logitsOf(model: ResNet, x: Float32Array, shape: number[], device = 'cpu'): Float32Array {
  const input = Tensor.from(x, shape, { device });
  try {
    return model.forward(input).toFloat32Array();
  } finally {
    input.dispose();
  }
}

function predictorLogits(predictor: Predictor, x: Float32Array, shape: number[]): Float32Array {
  const input = Tensor.from(x, shape, { device: predictor.device });
  const y = predictor.predict(input);
  try {
    return y.toFloat32Array();
  } finally {
    y.dispose();
    input.dispose();
  }
}

function bits(values: Float32Array): Uint32Array {
  return new Uint32Array(values.buffer, values.byteOffset, values.length);
}

function readManifest(folder: string): ArtifactManifest {
  return JSON.parse(readFileSync(join(folder, 'model.json'), 'utf8')) as ArtifactManifest;
}

function writeManifest(folder: string, manifest: unknown): void {
  writeFileSync(join(folder, 'model.json'), JSON.stringify(manifest));
}

let counter = 0;
/** A fresh artifact folder of a small 3-class model. */
async function freshArtifact(model = trainedLike(3, 7)): Promise<string> {
  const folder = join(dir, `a${counter++}`);
  await saveInferenceArtifact(model, folder, { classes: ['cat', 'dog', 'fox'] });
  return folder;
}

describe.skipIf(onlyCuda)('inference artifact on the CPU', () => {
  const fused = hasInferencePlan('cpu');

  it('records the format, architecture, preprocessing, classes and the SHA-256 of the weights', async () => {
    const model = trainedLike(3, 1);
    const folder = join(dir, 'manifest');
    const written = await saveInferenceArtifact(model, folder, {
      classes: ['cat', 'dog', 'fox'],
      preprocessing: { resize: 40, crop: 32, interpolation: 'bicubic', mean: [0.5], std: [0.25, 0.5, 1] },
    });
    const manifest = readManifest(folder);
    expect(manifest).toEqual(written);
    const weights = readFileSync(join(folder, 'model.safetensors'));
    expect(manifest).toEqual({
      format: ARTIFACT_FORMAT,
      version: ARTIFACT_VERSION,
      architecture: { family: 'resnet', depth: 18, numClasses: 3, smallInput: true, inChannels: 3 },
      preprocessing: { resize: 40, crop: 32, interpolation: 'bicubic', mean: [0.5, 0.5, 0.5], std: [0.25, 0.5, 1] },
      classes: ['cat', 'dog', 'fox'],
      weights: {
        file: 'model.safetensors',
        sha256: createHash('sha256').update(weights).digest('hex'),
        bytes: weights.byteLength,
      },
    });
    // The defaults: torchvision's evaluation transform for ImageNet-sized models, 32 px for the small stem.
    const big = join(dir, 'defaults');
    const m = await saveInferenceArtifact(ResNet18({ numClasses: 2, seed: 2 }), big);
    expect(m.preprocessing).toEqual({
      resize: 256,
      crop: 224,
      interpolation: 'bilinear',
      mean: [0.485, 0.456, 0.406],
      std: [0.229, 0.224, 0.225],
    });
    expect(m.classes).toBeNull();
    expect((await saveInferenceArtifact(model, join(dir, 'small'))).preprocessing).toMatchObject({
      resize: 32,
      crop: 32,
    });
    model.dispose();
  });

  it('loads back in eval mode with bit-identical logits through the training modules', async () => {
    const model = trainedLike(5, 3);
    const folder = join(dir, 'roundtrip');
    await saveInferenceArtifact(model, folder);
    const artifact = await loadInferenceArtifact(folder);
    expect(artifact.model.training).toBe(false);
    expect(artifact.classes).toBeNull();
    expect(artifact.className(4)).toBe('4');
    const x = noiseImages(3, 16, 11);
    const want = logitsOf(model, x, [3, 16, 16, 3]);
    const got = logitsOf(artifact.model, x, [3, 16, 16, 3]);
    expect(bits(got)).toEqual(bits(want));
    // Not a constant network: the logits differ between samples and classes.
    expect(new Set(want).size).toBe(want.length);
    artifact.dispose();
    model.dispose();
  });

  it('keeps channel-pruned models (basic and bottleneck blocks) and an input of other channels', async () => {
    const depth18 = [[16], [64], [32], [128], [64], [256], [100], [512]];
    // A narrow ResNet-50: every bottleneck's inner convolutions at 8 channels, its outputs torchvision's.
    const depth50 = Array.from({ length: 16 }, () => [8, 8]);
    const cases: { model: ResNet; channels: number }[] = [
      { model: new ResNet(18, { numClasses: 4, smallInput: true, blockWidths: depth18, seed: 4 }), channels: 3 },
      { model: new ResNet(18, { numClasses: 2, smallInput: true, inChannels: 1, seed: 5 }), channels: 1 },
      { model: new ResNet(50, { numClasses: 3, smallInput: true, blockWidths: depth50, seed: 6 }), channels: 3 },
    ];
    for (const [i, { model, channels }] of cases.entries()) {
      randomizeBatchNorms(model, 50 + i);
      const folder = join(dir, `arch${i}`);
      await saveInferenceArtifact(model, folder, channels === 1 ? { preprocessing: { mean: [0.5], std: [0.5] } } : {});
      const artifact = await loadInferenceArtifact(folder);
      expect(artifact.architecture.blockWidths).toEqual([depth18, undefined, depth50][i]);
      expect(artifact.architecture.inChannels).toBe(channels);
      expect(artifact.model.depth).toBe(model.depth);
      const x = noiseImages(2, 8, 20 + i, channels);
      const shape = [2, 8, 8, channels];
      expect(bits(logitsOf(artifact.model, x, shape))).toEqual(bits(logitsOf(model, x, shape)));
      artifact.dispose();
      model.dispose();
    }
  });

  it('gives a transform and an input conversion with the recorded preprocessing', async () => {
    const folder = join(dir, 'transform');
    await saveInferenceArtifact(trainedLike(2, 9), folder, {
      preprocessing: { resize: 36, crop: 30, interpolation: 'nearest', mean: [0.1, 0.2, 0.3], std: [0.4, 0.5, 0.6] },
    });
    const artifact = await loadInferenceArtifact(folder);
    const [resize, crop, normalize] = artifact.transform().transforms;
    expect(resize).toBeInstanceOf(Resize);
    expect(resize).toMatchObject({ size: 36, interpolation: 'nearest' });
    expect(crop).toBeInstanceOf(CenterCrop);
    expect(crop).toMatchObject({ size: 30 });
    expect(normalize).toBeInstanceOf(Normalize);
    expect(artifact.transform().normalization()).toEqual({ mean: [0.1, 0.2, 0.3], std: [0.4, 0.5, 0.6] });
    const convert = artifact.inputNormalize();
    const pixels = Tensor.from([0, 51, 255], [1, 1, 1, 3], { dtype: 'u8' });
    const out = Array.from(convert.forward(pixels).toFloat32Array());
    expect(out[0]).toBeCloseTo((0 - 0.1) / 0.4, 6);
    expect(out[1]).toBeCloseTo((0.2 - 0.2) / 0.5, 6);
    expect(out[2]).toBeCloseTo((1 - 0.3) / 0.6, 6);
    convert.dispose();
    pixels.dispose();
    artifact.dispose();
  });

  it(`runs on the Predictor equal to the modules within ${F32_TOLERANCE} (f32)${fused ? '' : ' (no CPU inference plan in this build: the probe answered ERR_RC_BACKEND_UNAVAILABLE)'}`, async () => {
    const model = trainedLike(6, 12);
    const folder = join(dir, 'predictor');
    await saveInferenceArtifact(model, folder);
    const artifact = await loadInferenceArtifact(folder);
    const predictor = artifact.createPredictor();
    expect(predictor.device).toBe('cpu');
    expect(predictor.dtype).toBe('f32');
    const x = noiseImages(4, 16, 13);
    const want = logitsOf(model, x, [4, 16, 16, 3]);
    if (!fused) {
      expect(() => predictorLogits(predictor, x, [4, 16, 16, 3])).toThrow(
        expect.objectContaining({ code: 'ERR_RC_BACKEND_UNAVAILABLE' }) as Error,
      );
    } else {
      const got = predictorLogits(predictor, x, [4, 16, 16, 3]);
      expect(relativeError(got, want)).toBeLessThanOrEqual(F32_TOLERANCE);
      // A batch of one and another shape reuse nothing of the first plan's shapes and agree too.
      const one = predictorLogits(predictor, x.subarray(0, 16 * 16 * 3), [1, 16, 16, 3]);
      expect(relativeError(one, want.subarray(0, 6))).toBeLessThanOrEqual(F32_TOLERANCE);
    }
    predictor.dispose();
    artifact.dispose();
    model.dispose();
  });

  it('refuses bad save options, naming the option', async () => {
    const model = trainedLike(3, 14);
    const folder = join(dir, 'bad-options');
    await expect(saveInferenceArtifact(model, folder, { classes: ['a', 'b'] })).rejects.toThrow(
      /3 names \(one per output of the model\) for options\.classes but received 2/,
    );
    await expect(saveInferenceArtifact(model, folder, { preprocessing: { resize: 16, crop: 32 } })).rejects.toThrow(
      /at most the resize \(16\) for options\.preprocessing\.crop but received 32/,
    );
    await expect(saveInferenceArtifact(model, folder, { preprocessing: { std: [1, 0, 1] } })).rejects.toThrow(
      /options\.preprocessing\.std\[1\]/,
    );
    await expect(
      saveInferenceArtifact(model, folder, { preprocessing: { interpolation: 'cubic' as 'bicubic' } }),
    ).rejects.toThrow(/options\.preprocessing\.interpolation/);
    await expect(saveInferenceArtifact(JSON.parse('{}') as ResNet, folder)).rejects.toThrow(/a ResNet .* for model/);
    const gray = new ResNet(18, { numClasses: 2, smallInput: true, inChannels: 1, seed: 1 });
    await expect(saveInferenceArtifact(gray, folder)).rejects.toThrow(
      /1-channel input .* for options\.preprocessing\.mean/,
    );
    gray.dispose();
    model.dispose();
  });

  it('runs a Predictor over a DataLoader as the Trainer runs the modules, and checks the arguments', async () => {
    const model = trainedLike(4, 41);
    const loader = new DataLoader(new ShapesDataset({ length: 10, size: 16, classes: 4, seed: 42 }), {
      batchSize: 4,
      transform: new Compose([new Crop({ size: 16 })]),
      workers: 0,
    });
    const predictor = new Predictor(model);
    const modules = openEngine(model, {
      engine: 'modules',
      device: 'cpu',
      amp: 'none',
      progress: false,
      batchShape: [4, 16, 16, 3],
    });
    const want = await modules.engine.predict(loader, 3);
    await modules.engine.dispose();
    if (fused) {
      const got = await predictLoader(predictor, loader, { topk: 3 });
      expect(Array.from(got.indices)).toEqual(Array.from(want.indices));
      expect(Array.from(got.classes)).toEqual(Array.from(want.classes));
      expect(relativeError(got.logits, want.logits)).toBeLessThanOrEqual(F32_TOLERANCE);
      const result = await evaluatePredictor(predictor, loader, { classNames: ['a', 'b', 'c', 'd'] });
      expect(result.count).toBe(10);
      expect(result.report).toMatch(/^ +a /m);
    }
    await expect(evaluatePredictor(model as unknown as Predictor, loader)).rejects.toThrow(/a Predictor for predictor/);
    await expect(predictLoader(predictor, [] as unknown as DataLoader)).rejects.toThrow(/a DataLoader for loader/);
    await expect(predictLoader(predictor, loader, { topk: 0 })).rejects.toThrow(/topk/);
    predictor.dispose();
    await loader.close();
    model.dispose();
  });

  describe('refuses a broken artifact with an error naming the file and the problem', () => {
    async function expectRefused(folder: string, pattern: RegExp): Promise<void> {
      const error: unknown = await loadInferenceArtifact(folder).then(
        () => null,
        (e: unknown) => e,
      );
      if (!(error instanceof ResnetError)) {
        throw new Error(`the load should fail with a ResnetError, got ${String(error)}`);
      }
      expect(error.code).toBe('ERR_RC_CHECKPOINT');
      expect(error.message).toMatch(pattern);
    }

    it('a missing folder, a file, a folder without model.json, and model.json that is not JSON', async () => {
      await expectRefused(join(dir, 'nowhere'), /nowhere: does not exist/);
      const file = join(dir, 'plain-file');
      writeFileSync(file, 'x');
      await expectRefused(file, /is not a folder/);
      const folder = await freshArtifact();
      unlinkSync(join(folder, 'model.json'));
      await expectRefused(folder, /has no model\.json.*export --format artifact/);
      writeFileSync(join(folder, 'model.json'), '{"format": ');
      await expectRefused(folder, /model\.json: is not valid JSON/);
    });

    it('an unknown format, a newer version and each malformed field', async () => {
      const folder = await freshArtifact();
      const good = readManifest(folder);
      const cases: [unknown, RegExp][] = [
        [{ ...good, format: 'tflite' }, /not a resnet-cuda inference artifact manifest \('format' is "tflite"/],
        [{ ...good, version: 2 }, /format version 2, newer than this package reads \(1\); upgrade resnet-cuda/],
        [{ ...good, version: '1' }, /'version' should be an integer from 1, got "1"/],
        [
          { ...good, architecture: { ...good.architecture, depth: 20 } },
          /'architecture\.depth' should be one of 18, 34, 50, 101, 152/,
        ],
        [{ ...good, architecture: { ...good.architecture, numClasses: 0 } }, /'architecture\.numClasses'/],
        [
          { ...good, architecture: { ...good.architecture, blockWidths: [[64]] } },
          /'architecture\.blockWidths' should be 8 lists of 1/,
        ],
        [
          { ...good, preprocessing: { ...good.preprocessing, crop: 64 } },
          /'preprocessing\.crop' should be an integer from 1 to 32/,
        ],
        [
          { ...good, preprocessing: { ...good.preprocessing, mean: [0.5] } },
          /'preprocessing\.mean' should be 3 numbers/,
        ],
        [
          { ...good, preprocessing: { ...good.preprocessing, std: [1, 0, 1] } },
          /'preprocessing\.std' should be 3 positive numbers/,
        ],
        [
          { ...good, preprocessing: { ...good.preprocessing, interpolation: 'area' } },
          /'preprocessing\.interpolation'/,
        ],
        [{ ...good, classes: ['cat'] }, /'classes' should be null or 3 strings/],
        [{ ...good, weights: { ...good.weights, sha256: 'abc' } }, /'weights\.sha256' should be a SHA-256 checksum/],
        [
          { ...good, weights: { ...good.weights, file: '../elsewhere.safetensors' } },
          /'weights\.file' should be 'model\.safetensors'/,
        ],
        [{ ...good, weights: undefined }, /'weights' should be an object, got nothing/],
      ];
      for (const [manifest, pattern] of cases) {
        writeManifest(folder, manifest);
        await expectRefused(folder, pattern);
      }
    });

    it('a missing weights file, a changed byte (checksum) and weights of another architecture', async () => {
      const folder = await freshArtifact();
      const good = readManifest(folder);
      const weights = readFileSync(join(folder, 'model.safetensors'));
      unlinkSync(join(folder, 'model.safetensors'));
      await expectRefused(folder, /is missing model\.safetensors, which model\.json lists/);

      const changed = Buffer.from(weights);
      changed[changed.length - 5]! ^= 0x40;
      writeFileSync(join(folder, 'model.safetensors'), changed);
      await expectRefused(
        folder,
        /model\.safetensors does not match its checksum in model\.json \(SHA-256 [0-9a-f]{64}, expected/,
      );

      writeFileSync(join(folder, 'model.safetensors'), weights.subarray(0, weights.length - 8));
      await expectRefused(folder, /model\.safetensors is \d+ bytes but model\.json records \d+/);

      // The manifest says 4 classes, consistently with itself, but the weights are a 3-class model's.
      writeFileSync(join(folder, 'model.safetensors'), weights);
      writeManifest(folder, { ...good, architecture: { ...good.architecture, numClasses: 4 }, classes: null });
      await expectRefused(
        folder,
        /model\.safetensors does not fit the architecture in model\.json \(ResNet-18, 4 classes.*fc\.weight/,
      );
      writeManifest(folder, { ...good, architecture: { ...good.architecture, depth: 34 } });
      await expectRefused(folder, /does not fit the architecture in model\.json \(ResNet-34/);

      // Put right, it loads.
      writeManifest(folder, good);
      (await loadInferenceArtifact(folder)).dispose();
    });
  });
});

const cuda = listBackends().find((b) => b.name === 'cuda');
const cudaReason = cuda?.available ? undefined : (cuda?.reason ?? 'no CUDA backend');

describe.skipIf(cudaReason !== undefined)(
  `inference artifact on CUDA${cudaReason ? ` (skipped: ${cudaReason})` : ''}`,
  () => {
    it('loads onto the device; its Predictor, and eval on the fused engine, equal the modules', async () => {
      const source = trainedLike(4, 31);
      const folder = join(dir, 'cuda');
      await saveInferenceArtifact(source, folder, { preprocessing: { resize: 16, crop: 16 } });
      const artifact = await loadInferenceArtifact(folder, { device: 'cuda' });
      expect(artifact.model.device).toBe('cuda:0');
      const x = noiseImages(2, 16, 32);
      const want = logitsOf(source, x, [2, 16, 16, 3]);
      expect(relativeError(logitsOf(artifact.model, x, [2, 16, 16, 3], 'cuda'), want)).toBeLessThanOrEqual(
        F32_TOLERANCE,
      );
      const predictor = artifact.createPredictor();
      expect(predictor.device).toBe('cuda:0');
      expect(relativeError(predictorLogits(predictor, x, [2, 16, 16, 3]), want)).toBeLessThanOrEqual(F32_TOLERANCE);
      predictor.dispose();

      // eval's two engines over the same loader on the device: the same counts, the loss to f32 rounding.
      const loader = new DataLoader(new ShapesDataset({ length: 6, size: 16, classes: 4, seed: 33 }), {
        batchSize: 4,
        transform: new Compose([
          new Crop({ size: 16 }),
          new Norm({ mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225] }),
        ]),
        workers: 0,
        device: 'cuda',
      });
      const evaluate = async (engine: 'fused' | 'modules'): Promise<EvalResult> => {
        const opened = openEngine(artifact.model, {
          engine,
          device: 'cuda:0',
          amp: 'none',
          progress: false,
          batchShape: [4, 16, 16, 3],
        });
        expect(opened.engine.name).toBe(engine);
        try {
          return await opened.engine.evaluate(loader);
        } finally {
          await opened.engine.dispose();
        }
      };
      const fusedResult = await evaluate('fused');
      const modulesResult = await evaluate('modules');
      await loader.close();
      expect(fusedResult.count).toBe(6);
      expect(fusedResult.confusion.toArray()).toEqual(modulesResult.confusion.toArray());
      expect(fusedResult.acc5).toBe(modulesResult.acc5);
      expect(Math.abs(fusedResult.loss - modulesResult.loss)).toBeLessThanOrEqual(
        1e-5 * Math.max(1, modulesResult.loss),
      );
      artifact.dispose();
      source.dispose();
    });
  },
);
