import { existsSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { deflateRawSync, crc32 } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { loadTorchCheckpoint, readTorchCheckpoint, TorchTensor, type TorchValue } from '../lib/nn/torch-checkpoint.js';
import { ZipArchive } from '../lib/nn/zip.js';
import { defined, lookup } from './helpers/defined.js';

// Written once by real PyTorch: test/fixtures/make-torch-fixtures.py says how, and with which formulas.
const fixture = (name: string) => join(import.meta.dirname, 'fixtures', name);
/** The file the malicious fixture's pickle would create if anything in it ran. */
const MARKER = '/tmp/resnet-cuda-malicious-pickle-ran';

const range = (n: number, f: (i: number) => number) => Float32Array.from({ length: n }, (_, i) => f(i));

/** The values make-torch-fixtures.py's state() stores, recomputed: name -> [shape, values]. */
function expectedState(): Map<string, { shape: number[]; data: Float32Array | BigInt64Array }> {
  const base = range(20, (i) => i * 0.5 - 2);
  const grid = (r: number, c: number) => r * 6 + c;
  return new Map<string, { shape: number[]; data: Float32Array | BigInt64Array }>([
    ['f32', { shape: [2, 3, 4], data: range(24, (i) => i * 0.25 - 1.5) }],
    ['f16', { shape: [3, 4], data: range(12, (i) => i / 8 - 0.75) }],
    ['bf16', { shape: [10], data: range(10, (i) => i * 0.375 - 2) }],
    ['f64', { shape: [2, 3], data: range(6, (i) => i / 3) }],
    ['i64', { shape: [5], data: BigInt64Array.from({ length: 5 }, (_, i) => BigInt(i) * 1000000007n - 3n) }],
    ['count', { shape: [], data: BigInt64Array.of(12345n) }],
    // square.t(): element [r][c] is square[c][r] = c * 4 + r - 5.
    ['transposed', { shape: [4, 3], data: range(12, (i) => Math.floor(i % 3) * 4 + Math.floor(i / 3) - 5) }],
    // grid[1:4, ::2]
    ['slice', { shape: [3, 3], data: range(9, (i) => grid(1 + Math.floor(i / 3), 2 * (i % 3))) }],
    ['shared_a', { shape: [2, 3], data: base.slice(2, 8) }],
    ['shared_b', { shape: [10], data: base.slice(10) }],
  ]);
}

function expectState(state: Map<string, { shape: number[]; dtype: string; data: Float32Array | BigInt64Array }>) {
  const expected = expectedState();
  expect([...state.keys()]).toEqual([...expected.keys()]);
  for (const [name, want] of expected) {
    const got = lookup(state, name);
    expect(got.shape, name).toEqual(want.shape);
    expect(got.dtype, name).toBe(want.data instanceof Float32Array ? 'f32' : 'i64');
    expect(got.data, name).toEqual(want.data);
  }
}

describe('torch.save files', () => {
  it('reads a zip-format state dict: f32, f16, bf16, f64 and int64, strided views and shared storage', () => {
    const state = loadTorchCheckpoint(fixture('torch-state.pt'));
    expectState(state);
    // f64 arrives rounded to f32: i / 3 is not exact in either, and the f32 is the rounding of the f64.
    expect(lookup(state, 'f64').data[1]).toBe(Math.fround(1 / 3));
  });

  it('keeps the views of one storage apart but reads the storage once', () => {
    const value = readTorchCheckpoint(fixture('torch-state.pt'));
    expect(value).toBeInstanceOf(Map);
    const map = value as Map<string, TorchValue>;
    const a = map.get('shared_a') as TorchTensor;
    const b = map.get('shared_b') as TorchTensor;
    expect(a.storage).toBe(b.storage);
    expect([a.storageOffset, b.storageOffset]).toEqual([2, 10]);
    expect(a.storage.numel).toBe(20);
    const t = map.get('transposed') as TorchTensor;
    expect([t.shape, t.stride]).toEqual([
      [4, 3],
      [1, 4],
    ]);
    expect(t.dtype).toBe('f32');
    expect((map.get('f16') as TorchTensor).dtype).toBe('f16');
  });

  it('reads the same dict from the legacy (pre-1.6) format', () => {
    expect(readFileSync(fixture('torch-legacy.pt')).subarray(0, 2)).toEqual(Buffer.from([0x80, 0x02]));
    expectState(loadTorchCheckpoint(fixture('torch-legacy.pt')));
  });

  it("finds a training checkpoint's model, strips DataParallel's module. prefix, and reads the rest as plain data", () => {
    const state = loadTorchCheckpoint(fixture('torch-checkpoint.pt'));
    expect([...state.keys()]).toEqual([
      '0.weight',
      '1.weight',
      '1.bias',
      '1.running_mean',
      '1.running_var',
      '1.num_batches_tracked',
      '3.weight',
      '3.bias',
    ]);
    expect(lookup(state, '0.weight').shape).toEqual([3, 2, 3, 3]);
    // One training forward after 7 recorded batches.
    expect(lookup(state, '1.num_batches_tracked')).toEqual({ shape: [], dtype: 'i64', data: BigInt64Array.of(8n) });

    const all = readTorchCheckpoint(fixture('torch-checkpoint.pt')) as Map<string, TorchValue>;
    expect(all.get('epoch')).toBe(3);
    expect(all.get('best_acc1')).toBe(0.625);
    expect(all.get('arch')).toBe('tiny');
    const optimizer = all.get('optimizer') as Map<string, TorchValue>;
    const group = (optimizer.get('param_groups') as Map<string, TorchValue>[])[0]!;
    expect(group.get('lr')).toBe(0.1);
    expect(group.get('momentum')).toBe(0.9);
    expect(group.get('nesterov')).toBe(false);
    expect(group.get('params')).toEqual([0, 1, 2, 3, 4]);
    // SGD's first step: p = p0 - lr * buf, with p0 the script's formula arange(n) / 10 - i.
    const momentum = optimizer.get('state') as Map<number, Map<string, TorchValue>>;
    const names = ['0.weight', '1.weight', '1.bias', '3.weight', '3.bias'];
    names.forEach((name, i) => {
      const p = lookup(state, name).data as Float32Array;
      const buf = (defined(momentum.get(i), `state ${i}`).get('momentum_buffer') as TorchTensor).values();
      for (let k = 0; k < p.length; k++)
        expect(p[k]!, `${name}[${k}]`).toBeCloseTo(k / 10 - i - 0.1 * Number(buf[k]), 5);
    });
  });

  it('refuses a pickle that calls os.system, naming the global and the file, and runs nothing', () => {
    rmSync(MARKER, { force: true });
    const file = fixture('torch-malicious.pt');
    // The fixture is what it says: its pickle names posix.system (os.system) with a touch command.
    const zip = new ZipArchive(readFileSync(file), file);
    const pickle = Buffer.from(zip.read('torch-malicious/data.pkl')).toString('latin1');
    expect(pickle).toContain('posix\nsystem\n');
    expect(pickle).toContain(`touch ${MARKER}`);
    for (const load of [() => loadTorchCheckpoint(file), () => readTorchCheckpoint(readFileSync(file), 'upload.pt')]) {
      expect(load).toThrow(/refused: the pickle names the global posix\.system/);
    }
    expect(() => loadTorchCheckpoint(file)).toThrow(file);
    expect(existsSync(MARKER)).toBe(false);
  });
});
