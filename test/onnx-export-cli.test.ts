/**
 * `resnet-cuda export --format onnx`: the file written from a weights file runs in ONNX Runtime
 * with the model's logits (within 1e-4, relative to the largest logit), the options reach the file,
 * and bad options are usage errors naming the option.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ExportResult } from '../lib/cli/export.js';
import { decodeOnnxModel } from '../lib/export/onnx-schema.js';
import { ResNet18, saveWeights, type ResNet } from '../lib/index.js';
import { runCli } from './helpers/cli.js';
import { eagerLogits, randomizeBatchNorms, relativeError, runOnnx, shapeImages } from './helpers/onnx.js';

const dir = mkdtempSync(join(tmpdir(), 'rc-export-cli-'));
const weights = join(dir, 'model.safetensors');
let model: ResNet;

beforeAll(async () => {
  model = ResNet18({ numClasses: 4, smallInput: true, seed: 31 });
  randomizeBatchNorms(model, 32);
  await saveWeights(weights, model);
});
afterAll(() => {
  model.dispose();
  rmSync(dir, { recursive: true, force: true });
});

describe('resnet-cuda export --format onnx', () => {
  it('writes a file that ONNX Runtime runs with the model’s logits', async () => {
    const out = join(dir, 'out', 'r18.onnx');
    const run = await runCli(
      [
        'export',
        '--format',
        'onnx',
        '--weights',
        weights,
        '--output',
        out,
        '--layout',
        'nhwc',
        '--image-size',
        '16',
        '--json',
      ],
      dir,
    );
    expect(run.code, run.stderr).toBe(0);
    const result = JSON.parse(run.stdout) as ExportResult;
    expect(result).toMatchObject({
      format: 'onnx',
      output: join('out', 'r18.onnx'),
      details: { opset: 17, input: { name: 'input', shape: ['batch', 16, 16, 3] }, output: { shape: ['batch', 4] } },
    });
    const bytes = readFileSync(out);
    expect(result.bytes).toBe(bytes.length);
    const session = await ort.InferenceSession.create(out);
    const x = shapeImages(3, 16, 33);
    expect(relativeError(await runOnnx(session, x, [3, 16, 16, 3]), eagerLogits(model, x, 3, 16))).toBeLessThan(1e-4);
    await session.release();
    // Without a run config the normalisation recorded is ImageNet's, as predict assumes.
    const meta = new Map(decodeOnnxModel(bytes).metadataProps.map((p) => [p.key, JSON.parse(p.value) as unknown]));
    expect(meta.get('mean')).toEqual([0.485, 0.456, 0.406]);
  });

  it('passes the opset, batch, dtype and a dynamic size to the file, and prints a summary', async () => {
    const out = join(dir, 'r18-f16.onnx');
    const run = await runCli(
      ['export', '--weights', weights, '-o', out, '--opset', '13', '--batch', '2', '--dtype', 'f16'],
      dir,
    );
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toMatch(/^exported weights model\.safetensors to r18-f16\.onnx \(onnx, [\d.]+ MB\)\n/);
    expect(run.stdout).toContain("opset 13, f16; input 'input' 2 x 3 x height x width (NCHW), output 'logits' 2 x 4");
    const m = decodeOnnxModel(readFileSync(out));
    expect([m.irVersion, m.opsetImport[0]?.version]).toEqual([7, 13]);
    expect(m.graph.initializer.find((t) => t.name === 'conv1.weight')?.dataType).toBe(10);
  });

  it('refuses bad options with usage errors that name them', async () => {
    const cases: [string[], RegExp][] = [
      [['--weights', weights], /--output is required/],
      [['--output', 'x.onnx'], /--weights FILE or --checkpoint FILE/],
      [['--weights', weights, '-o', 'x.onnx', '--batch', '0'], /--batch must be 'dynamic' or a positive integer/],
      [['--weights', weights, '-o', 'x.onnx', '--image-size', 'big'], /--image-size must be 'dynamic' or an integer/],
      [['--weights', weights, '-o', 'x.onnx', '--opset', '12'], /--opset/],
      [['--weights', weights, '-o', 'x.onnx', '--layout', 'chw'], /--layout/],
      [['--weights', weights, '-o', 'x.onnx', '--format', 'tflite'], /--format/],
    ];
    for (const [args, message] of cases) {
      const run = await runCli(['export', ...args], dir);
      expect(run.code, args.join(' ')).toBe(2);
      expect(run.stderr, args.join(' ')).toMatch(message);
    }
  });

  it('lists its options in --help and is a command of the top-level help', async () => {
    const help = await runCli(['export', '--help'], dir);
    expect(help.code).toBe(0);
    for (const flag of ['--format', '--output', '--opset', '--batch', '--layout', '--dtype', '--image-size']) {
      expect(help.stdout).toContain(flag);
    }
    expect((await runCli(['--help'], dir)).stdout).toMatch(/\n {2}export +Export trained weights/);
  });
});
