import { spawnSync } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { assert, describe, expect, it } from 'vitest';
import {
  BatchNorm2d,
  Conv2d,
  CrossEntropyLoss,
  InputNormalize,
  Linear,
  MaxPool2d,
  ResNet18,
  CudaGraph,
  SGD,
  Sequential,
  initProcessGroup,
  Tensor,
  listBackends,
  memoryStats,
} from '../lib/index.js';
import { ERROR_CODES } from '../lib/errors.js';

const code = (c: string): unknown => expect.objectContaining({ code: c });

describe('bad input gets a clear error', () => {
  it('rejects an input of the wrong channel count, rank or dtype, naming what was expected and received', () => {
    const conv = new Conv2d({ inChannels: 3, outChannels: 4, kernelSize: 3, seed: 1 });
    expect(() => conv.forward(Tensor.zeros([1, 8, 8, 5]))).toThrow(
      /Expected an NHWC tensor with 3 channels \(last dimension\) for Conv2d input but received shape \[1, 8, 8, 5\]/,
    );
    expect(() => conv.forward(Tensor.zeros([8, 8, 3]))).toThrow(/a tensor of rank 4.*shape \[8, 8, 3\]/);
    expect(() => conv.forward(Tensor.zeros([1, 8, 8, 3], { dtype: 'i32' }))).toThrow(code('ERR_RC_INVALID_ARGUMENT'));
    expect(() => conv.forward(Tensor.zeros([1, 2, 2, 3]))).toThrow(/spatial size at least the kernel size/);
    const linear = new Linear({ inFeatures: 4, outFeatures: 2, seed: 1 });
    expect(() => linear.forward(Tensor.zeros([3, 5]))).toThrow(
      /Expected a \[N, 4\] tensor for Linear input but received shape \[3, 5\]/,
    );
    expect(() => new BatchNorm2d({ numFeatures: 4 }).forward(Tensor.zeros([2, 3, 3, 5]))).toThrow(/4 channels/);
    expect(() => ResNet18({ numClasses: 3, smallInput: true, seed: 1 }).forward(Tensor.zeros([2, 16, 16, 1]))).toThrow(
      /3 channels/,
    );
  });

  it('rejects BN training on a single value per channel (evaluation mode takes one)', () => {
    const bn = new BatchNorm2d({ numFeatures: 2 });
    expect(() => bn.forward(Tensor.zeros([1, 1, 1, 2]))).toThrow(/more than one value per channel/);
    bn.eval();
    bn.forward(Tensor.zeros([1, 1, 1, 2]));
  });

  it('rejects backward before forward and a gradient of the wrong shape', () => {
    const conv = new Conv2d({ inChannels: 1, outChannels: 1, kernelSize: 1, seed: 1 });
    expect(() => conv.backward(Tensor.zeros([1, 2, 2, 1]))).toThrow(/backward\(\) was called before forward\(\)/);
    conv.forward(Tensor.zeros([1, 2, 2, 1]));
    expect(() => conv.backward(Tensor.zeros([1, 3, 2, 1]))).toThrow(
      /shape \[1, 2, 2, 1\] for Conv2d gradOutput but received a tensor of shape \[1, 3, 2, 1\]/,
    );
    expect(() => new CrossEntropyLoss().backward()).toThrow(/before forward/);
  });

  it('rejects a label count that does not match the batch, and labels out of range', () => {
    const loss = new CrossEntropyLoss();
    const logits = Tensor.zeros([4, 3]);
    expect(() => loss.forward(logits, [0, 1, 2])).toThrow(
      /Expected 4 labels \(one per row of logits\) for labels but received 3 labels/,
    );
    expect(() => loss.forward(logits, Tensor.from([0, 1], [2], { dtype: 'i32' }))).toThrow(/4 labels/);
    expect(() => loss.forward(logits, [0, 1, 2, 3])).toThrow(/class index in \[0, 3\) for labels\[3\]/);
    expect(() => loss.forward(logits, Tensor.from([0, 1, 2, 9], [4], { dtype: 'i32' }))).toThrow(
      code('ERR_RC_INVALID_ARGUMENT'),
    );
    expect(() => loss.forward(logits, Tensor.from([0, 1, 2, 0], [4], { dtype: 'f32' }))).toThrow(/dtype i32/);
  });

  it('rejects a disposed tensor with ERR_RC_DISPOSED and leaves the module usable', () => {
    const relu = new Sequential(new MaxPool2d({ kernelSize: 2 }));
    const x = Tensor.randn([1, 4, 4, 2], { seed: 1 });
    x.dispose();
    expect(x.disposed).toBe(true);
    expect(() => relu.forward(x)).toThrow(code('ERR_RC_DISPOSED'));
    expect(() => x.toFloat32Array()).toThrow(/was disposed/);
    expect(relu.forward(Tensor.randn([1, 4, 4, 2], { seed: 2 })).shape).toEqual([1, 2, 2, 2]);
  });

  it('rejects unknown devices and unavailable backends with their codes', () => {
    expect(() => Tensor.zeros([2], { device: 'tpu' })).toThrow(code('ERR_RC_DEVICE'));
    expect(() => Tensor.zeros([2], { device: 'cuda:x' })).toThrow(/'cpu', 'cuda' or 'cuda:N'/);
    expect(() => memoryStats('gpu')).toThrow(code('ERR_RC_DEVICE'));
    const cuda = listBackends().find((b) => b.name === 'cuda');
    assert.isDefined(cuda, 'listBackends() lists cuda');
    if (!cuda.available) {
      expect(() => Tensor.zeros([2], { device: 'cuda' })).toThrow(code('ERR_RC_BACKEND_UNAVAILABLE'));
      expect(cuda.reason).toMatch(/CUDA/);
    }
  });

  it('rejects malformed options, naming the option', () => {
    expect(() => new Conv2d({ inChannels: 0, outChannels: 1, kernelSize: 1 })).toThrow(
      /integer of at least 1 for inChannels but received number 0/,
    );
    expect(() => new Conv2d({ inChannels: 1, outChannels: 1, kernelSize: 1, strides: 2 } as never)).toThrow(
      /Unknown option 'strides'/,
    );
    expect(() => new SGD(new Linear({ inFeatures: 1, outFeatures: 1 }), { lr: -1 })).toThrow(/lr/);
    expect(() => new SGD(new Linear({ inFeatures: 1, outFeatures: 1 }), { lr: 0.1, nesterov: true })).toThrow(
      /Nesterov momentum requires/,
    );
    expect(() => new MaxPool2d({ kernelSize: 2, padding: 2 })).toThrow(/at most half the kernel size/);
    expect(() => new InputNormalize({ mean: [0.5], std: [0.5, 0.5] })).toThrow(/1 values/);
    expect(() => Tensor.from([1, 2, 3], [2, 2])).toThrow(
      /Expected 4 values for shape \[2, 2\] for data but received 3 values/,
    );
    expect(() => ResNet18({ depth: 18 } as never)).toThrow(/Unknown option 'depth'/);
  });

  it('says that graphs and collectives need a CUDA device', () => {
    expect(() =>
      CudaGraph.capture('cpu', () => {
        // Never runs: the device is refused before the capture starts.
      }),
    ).toThrow(/graph capture needs a CUDA device/);
    expect(() => initProcessGroup({ backend: 'nccl', device: 'cpu', worldSize: 1, rank: 0 })).toThrow(
      /a CUDA device \('cuda:N'\) for the NCCL backend/,
    );
  });

  it('rejects an optimizer over parameters of two different models', () => {
    const a = new Linear({ inFeatures: 2, outFeatures: 2 }).to('cpu');
    const b = new Linear({ inFeatures: 2, outFeatures: 2 }).to('cpu');
    const opt = new SGD([...a.parameters(), ...b.parameters()], { lr: 0.1 });
    expect(() => opt.step()).toThrow(/one parameter arena/);
  });
});

describe('error codes', () => {
  it('lists every code the native side raises', () => {
    const header = readFileSync(new URL('../native/core/error.h', import.meta.url), 'utf8');
    const native = [...header.matchAll(/"(ERR_RC_[A-Z_]+)"/g)].map((m) => m[1]!);
    expect(native.length).toBeGreaterThanOrEqual(12);
    for (const c of native) expect(ERROR_CODES).toContain(c);
  });

  it('reports an addon that cannot load with a ResnetError coded ERR_RC_ADDON_LOAD', () => {
    // The compiled loader in a package folder with no build: node-gyp-build finds no binary.
    const dir = mkdtempSync(join(tmpdir(), 'resnet-cuda-addon-load-'));
    try {
      mkdirSync(join(dir, 'lib'));
      for (const f of ['binding.js', 'errors.js', 'openmp-env.js', 'addon-load-hint.js']) {
        copyFileSync(new URL(`../dist/lib/${f}`, import.meta.url), join(dir, 'lib', f));
      }
      writeFileSync(join(dir, 'package.json'), '{"type":"module"}');
      writeFileSync(join(dir, 'CMakeLists.txt'), '');
      symlinkSync(fileURLToPath(new URL('../node_modules', import.meta.url)), join(dir, 'node_modules'));
      const program = `
        import { addon } from ${JSON.stringify(pathToFileURL(join(dir, 'lib', 'binding.js')).href)};
        import { ResnetError } from ${JSON.stringify(pathToFileURL(join(dir, 'lib', 'errors.js')).href)};
        try { addon(); } catch (e) { console.log(JSON.stringify({ typed: e instanceof ResnetError, code: e.code, message: e.message })); }`;
      const child = spawnSync(process.execPath, ['--input-type=module', '-e', program], {
        encoding: 'utf8',
        timeout: 30_000,
      });
      const result = JSON.parse(child.stdout) as { typed: boolean; code: string; message: string };
      expect(result).toMatchObject({ typed: true, code: 'ERR_RC_ADDON_LOAD' });
      expect(result.message).toMatch(/native addon failed to load[\s\S]*npm rebuild resnet-cuda/);
      expect(result.message).not.toMatch(/scripts\/setup/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
