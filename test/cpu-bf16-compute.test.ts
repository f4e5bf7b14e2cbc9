/**
 * bf16 on a CPU where oneDNN has no bf16 kernels (AVX2 only: AMD Zen 2/3, Intel client parts), or
 * where they are slower than its f32 ones (AVX-512 Xeons without AMX): the convolutions, linear
 * layers and average pooling compute in f32 on the bf16 values, round their outputs to bf16 and
 * say so (native/cpu/compute_type.h). The 'cpu-avx2' test project runs this file and the op table
 * under ONEDNN_MAX_CPU_ISA=AVX2, so that path is tested on every machine; in the main project this
 * file checks what this CPU does, and child processes check the choice under RESNET_CPU_BF16.
 */
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { Conv2d, CrossEntropyLoss, Predictor, Tensor, listBackends } from '../lib/index.js';
import { warnBf16ComputedInF32 } from '../lib/cli/common.js';
import { CLASSES, SIZE, grads, images, labels, smallResNet } from './helpers/ddp-fixtures.js';

const cpu = listBackends().find((b) => b.name === 'cpu');
const capped = process.env.ONEDNN_MAX_CPU_ISA?.toUpperCase() === 'AVX2';
const inF32 = cpu?.properties?.bf16 === 'computed in f32';
const avx512 = cpu?.properties?.isa?.startsWith('avx512') === true;

/** The CPU backend's bf16 properties (or the error) in a fresh process with `env` added. */
function bf16In(env: Record<string, string>): { bf16?: string; reason?: string; error?: string } {
  const index = join(import.meta.dirname, '..', 'dist', 'lib', 'index.js');
  const script = `import(${JSON.stringify(index)}).then((m) => {
    const p = m.listBackends().find((b) => b.name === 'cpu').properties;
    console.log(JSON.stringify({ bf16: p.bf16, reason: p.bf16Reason }));
  }).catch((e) => console.log(JSON.stringify({ error: e.message })));`;
  const run = spawnSync(process.execPath, ['-e', script], {
    encoding: 'utf8',
    timeout: 120_000,
    env: { ...process.env, ...env },
  });
  expect(run.status, run.stderr).toBe(0);
  return JSON.parse(run.stdout) as { bf16?: string; reason?: string; error?: string };
}

/** Whether a measured choice follows its own timing: native when bf16 took at most 1.1x f32. */
function followsTiming(said: { bf16?: string; reason?: string }): boolean {
  const m = /^oneDNN's bf16 1x1 convolution took (\d+) us against (\d+) us in f32 on this CPU \(avx512\w*\)$/.exec(
    said.reason ?? '',
  );
  if (m === null) throw new Error(`not a timing: ${said.reason}`);
  const [bf16, f32] = [Number(m[1]), Number(m[2])];
  // The printed times are rounded to microseconds; the decision used the unrounded ones.
  if (Math.abs(bf16 - 1.1 * f32) <= 1) return true;
  return said.bf16 === (bf16 <= 1.1 * f32 ? 'native' : 'computed in f32');
}

/** The loss and every parameter's gradient after one forward and backward of the small ResNet-18 in `dtype`. */
function firstStep(dtype: 'f32' | 'bf16'): { loss: number; grad: number[] } {
  const model = smallResNet(11);
  const loss = new CrossEntropyLoss();
  const f32 = images(0, 8);
  const x = dtype === 'f32' ? f32 : f32.to('bf16');
  const y = Tensor.from(labels(0, 8), [8], { dtype: 'i32' });
  const value = loss.forward(model.forward(x), y).item();
  model.backward(loss.backward());
  const grad = grads(model).flatMap((g) => Array.from(g));
  for (const t of new Set([f32, x, y])) t.dispose();
  model.dispose();
  return { loss: value, grad };
}

describe('bf16 on the CPU', () => {
  it('says how bf16 is computed: natively, or in f32 where oneDNN has no bf16 kernels', () => {
    expect(['native', 'computed in f32']).toContain(cpu?.properties?.bf16);
    if (capped) {
      expect(cpu?.properties?.isa).toBe('avx2');
      expect(inF32).toBe(true);
      expect(cpu?.properties?.bf16Reason).toBe('oneDNN has no bf16 kernels on this CPU (avx2)');
    } else if (process.env.RESNET_CPU_BF16 === undefined && avx512) {
      const reason = cpu?.properties?.bf16Reason ?? '';
      if (reason === 'AMX') expect(inF32).toBe(false);
      else expect(followsTiming({ bf16: cpu?.properties?.bf16, reason })).toBe(true);
    }
  });

  it('RESNET_CPU_BF16 chooses f32 or native, and refuses native without bf16 kernels and other values', () => {
    expect(bf16In({ RESNET_CPU_BF16: 'f32' })).toEqual({ bf16: 'computed in f32', reason: 'RESNET_CPU_BF16=f32' });
    expect(bf16In({ RESNET_CPU_BF16: 'fast' }).error).toContain(
      "RESNET_CPU_BF16 expects auto, native or f32, got 'fast'",
    );
    expect(bf16In({ RESNET_CPU_BF16: 'native', ONEDNN_MAX_CPU_ISA: 'AVX2' }).error).toContain(
      'RESNET_CPU_BF16=native, but oneDNN has no bf16 kernels on this CPU (avx2)',
    );
    if (avx512) {
      expect(bf16In({ RESNET_CPU_BF16: 'native' })).toEqual({ bf16: 'native', reason: 'RESNET_CPU_BF16=native' });
    }
  });

  it.skipIf(!avx512)("without AMX, times oneDNN's bf16 convolution against f32 and takes the faster", () => {
    // Capped at AVX-512 without AVX512-BF16, oneDNN emulates bf16 (several times slower than f32):
    // the timing is taken there on every AVX-512 machine, AMX or not.
    const said = bf16In({ RESNET_CPU_BF16: 'auto', ONEDNN_MAX_CPU_ISA: 'AVX512_CORE' });
    expect(followsTiming(said)).toBe(true);
    expect(said.bf16).toBe('computed in f32');
  });

  it('train and lr-find warn that --amp bf16 is no faster than --amp none where it computes in f32', () => {
    const said: string[] = [];
    warnBf16ComputedInF32('bf16', 'cpu', (text) => said.push(text));
    warnBf16ComputedInF32('none', 'cpu', (text) => said.push(text));
    warnBf16ComputedInF32('bf16', 'cuda', (text) => said.push(text));
    expect(said).toEqual(
      inF32
        ? [
            expect.stringMatching(
              /^warning: --amp bf16 computes its convolutions in f32 on this CPU \(.+\) and is no faster /,
            ),
          ]
        : [],
    );
  });

  it('a bf16 model and its bf16 Predictor name the type they compute in', () => {
    const model = smallResNet(5);
    const x = Tensor.randn([2, SIZE, SIZE, 3], { seed: 9 });
    const xb = x.to('bf16');
    model.eval();
    model.forward(xb).dispose();
    const conv = model.namedModules().find(([, m]) => m instanceof Conv2d)?.[1] as Conv2d;
    expect(conv.implementation().includes('(bf16 computed in f32)')).toBe(inF32);
    const predictor = new Predictor(model, { dtype: 'bf16' });
    const implementation = predictor.implementation([2, SIZE, SIZE, 3]);
    expect(implementation.startsWith(inF32 ? 'onednn bf16 computed in f32: ' : 'onednn bf16: ')).toBe(true);
    const logits = predictor.predict(x).toFloat32Array();
    const reference = model.forward(x).toFloat32Array();
    const scale = Math.max(...reference.map(Math.abs));
    const worst = Math.max(...logits.map((v, i) => Math.abs(v - reference[i]!)));
    expect(logits.length).toBe(2 * CLASSES);
    expect(worst / scale, implementation).toBeLessThan(1e-2);
    for (const t of [x, xb]) t.dispose();
    predictor.dispose();
    model.dispose();
  });

  it('a bf16 training step gives the loss and gradients of the f32 step within bf16 rounding', () => {
    const f32 = firstStep('f32');
    const bf16 = firstStep('bf16');
    expect(Math.abs(bf16.loss - f32.loss)).toBeLessThan(1e-2 * f32.loss);
    let diff = 0;
    let norm = 0;
    for (let i = 0; i < f32.grad.length; i++) {
      diff += (bf16.grad[i]! - f32.grad[i]!) ** 2;
      norm += f32.grad[i]! ** 2;
    }
    expect(norm).toBeGreaterThan(0);
    // Through the 20 batch norms of a freshly initialised network, bf16 rounding moves the whole
    // gradient by 0.25-0.3 (relative L2) from f32's, here and on the emulated CUDA backend alike;
    // a wrong conversion at a primitive's edge gives 1 or more. The op table checks each op tightly.
    expect(Math.sqrt(diff / norm)).toBeLessThan(0.5);
  });
});
