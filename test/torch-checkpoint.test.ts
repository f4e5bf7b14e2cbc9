import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ResNet, ResNet18, ResNet34, Tensor } from '../lib/index.js';
import { saveWeights } from '../lib/train/checkpoint.js';
import { loadTorchCheckpoint, readTorchCheckpoint, TorchTensor, type TorchValue } from '../lib/nn/torch-checkpoint.js';
import { ZipArchive } from '../lib/nn/zip.js';
import { defined, lookup } from './helpers/defined.js';
import { makeZip, type ZipInput } from './helpers/zip-writer.js';

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

/** Bytes from opcodes (numbers) and latin1 text. */
const bytesOf = (...parts: (number | string | Buffer)[]) =>
  Buffer.concat(
    parts.map((p) => (typeof p === 'number' ? Buffer.from([p]) : typeof p === 'string' ? Buffer.from(p, 'latin1') : p)),
  );
/** SHORT_BINUNICODE of `text`. */
const str = (text: string) => bytesOf(0x8c, text.length, text);
/** A torch.save-like zip holding `pickle` as its data.pkl. */
const torchZip = (pickle: Buffer, extra: ZipInput[] = []) =>
  makeZip([{ name: 'archive/data.pkl', data: pickle }, ...extra]);
/** The entries of a fixture, to rewrite. */
function fixtureEntries(name: string): ZipInput[] {
  const zip = new ZipArchive(readFileSync(fixture(name)), name);
  return zip.entries.map((e) => ({ name: e.name, data: zip.read(e.name) }));
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
    // A Parameter pickled itself (torch._utils._rebuild_parameter) shares the state dict's storage.
    const [head] = all.get('head') as TorchTensor[];
    const model = all.get('model') as Map<string, TorchValue>;
    expect(defined(head, 'head').requiresGrad).toBe(true);
    expect((model.get('module.3.weight') as TorchTensor).requiresGrad).toBe(false);
    expect(head?.storage).toBe((model.get('module.3.weight') as TorchTensor).storage);
    expect(head?.values()).toEqual(lookup(state, '3.weight').data);
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
      for (let k = 0; k < p.length; k++) {
        expect(p[k]!, `${name}[${k}]`).toBeCloseTo(k / 10 - i - 0.1 * Number(buf[k]), 5);
      }
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

  it('refuses every global, call and opcode outside the allowlist, naming it', () => {
    const cases: [string, Buffer, RegExp][] = [
      [
        'STACK_GLOBAL',
        bytesOf(0x80, 4, str('builtins'), str('eval'), 0x93, str('1+1'), 0x85, 'R.'),
        /global builtins\.eval/,
      ],
      ['GLOBAL of a class', bytesOf(0x80, 2, 'cargparse\nNamespace\n)R.'), /global argparse\.Namespace/],
      ['INST', bytesOf(0x80, 2, '(ios\nsystem\n.'), /INST \(0x69\)/],
      ['NEWOBJ', bytesOf(0x80, 2, 'ccollections\nOrderedDict\n)', 0x81, '.'), /NEWOBJ \(0x81\)/],
      ['EXT1', bytesOf(0x80, 2, 0x82, 1, '.'), /EXT1 \(0x82\)/],
      ['an unknown opcode', bytesOf(0x80, 2, 0xff, '.'), /unknown opcode 0xff/],
      ['REDUCE of a type', bytesOf(0x80, 2, 'ctorch\nFloatStorage\n)R.'), /calls torch\.FloatStorage/],
      ['BUILD on a list', bytesOf(0x80, 2, ']}b.'), /BUILD/],
      ['a persistent id that is no storage', bytesOf(0x80, 2, str('x'), 'Q.'), /not a tensor storage/],
    ];
    for (const [what, pickle, message] of cases) {
      expect(() => readTorchCheckpoint(torchZip(pickle), 'bad.pt'), what).toThrow(message);
      expect(() => readTorchCheckpoint(torchZip(pickle), 'bad.pt'), what).toThrow(/^bad\.pt/);
    }
    // The same file with plain data only is read.
    const plain = bytesOf(
      0x80,
      2,
      '}',
      str('epoch'),
      'K',
      3,
      's',
      str('lr'),
      'G',
      Buffer.from([0x3f, 0xb9, 0x99, 0x99, 0x99, 0x99, 0x99, 0x9a]),
      's.',
    );
    expect(readTorchCheckpoint(torchZip(plain))).toEqual(
      new Map<string, number>([
        ['epoch', 3],
        ['lr', 0.1],
      ]),
    );
  });

  it('reads deflated entries, ZIP64 records and big-endian storages', () => {
    const entries = fixtureEntries('torch-state.pt');
    expectState(
      loadTorchCheckpoint(
        makeZip(
          entries.map((e) => ({ ...e, deflate: true })),
          { zip64: true },
        ),
      ),
    );
    // byteorder 'big': every element's bytes reversed.
    const tensors = [...(readTorchCheckpoint(fixture('torch-state.pt')) as Map<string, TorchTensor>).values()];
    const size = new Map(
      tensors.map((t) => [t.storage.key, { f32: 4, f64: 8, f16: 2, bf16: 2, i64: 8 }[t.dtype as 'f32']]),
    );
    const big = entries.map((e) => {
      const key = /\/data\/(\d+)$/.exec(e.name)?.[1];
      if (e.name.endsWith('/byteorder')) return { ...e, data: Buffer.from('big') };
      if (key === undefined) return e;
      const data = Uint8Array.from(e.data);
      const n = defined(size.get(key), `storage ${key}`);
      for (let i = 0; i < data.length; i += n) data.subarray(i, i + n).reverse();
      return { ...e, data };
    });
    expectState(loadTorchCheckpoint(makeZip(big)));
  });

  it('says what is wrong with files it cannot read', () => {
    const entries = fixtureEntries('torch-state.pt');
    const bytes = makeZip(entries);
    const corrupt = Buffer.from(bytes);
    const at = corrupt.indexOf(Buffer.from('torch-state/data/0')) + 'torch-state/data/0'.length;
    corrupt[at + 5] = (corrupt[at + 5]! + 1) % 256;
    expect(() => loadTorchCheckpoint(corrupt, { name: 'c.pt' })).toThrow(
      /c\.pt: zip archive entry 'torch-state\/data\/0' fails its CRC-32 check/,
    );
    expect(() => loadTorchCheckpoint(bytes.subarray(0, bytes.length - 30), { name: 't.pt' })).toThrow(
      /t\.pt: zip archive has no end-of-central-directory record/,
    );
    const legacy = readFileSync(fixture('torch-legacy.pt'));
    expect(() => loadTorchCheckpoint(legacy.subarray(0, legacy.length - 10), { name: 'l.pt' })).toThrow(
      /l\.pt: ends inside storage/,
    );
    const script = makeZip([
      ...entries,
      { name: 'torch-state/constants.pkl', data: Buffer.from([0x80, 2, 0x29, 0x2e]) },
    ]);
    expect(() => readTorchCheckpoint(script, 'm.pt')).toThrow(/TorchScript archive \(torch\.jit\.save\)/);
    expect(() => readTorchCheckpoint(Buffer.from('{"not": "torch"}'), 'x.json')).toThrow(
      /x\.json: is not a torch\.save file/,
    );
    const tar = Buffer.alloc(1024);
    tar.write('ustar', 257);
    expect(() => readTorchCheckpoint(tar, 'old.tar')).toThrow(/tar archive .* torch\.save\(obj, path\)/);
    expect(() => readTorchCheckpoint('/nonexistent/w.pth')).toThrow(/\/nonexistent\/w\.pth: cannot be read/);
    const checkpoint = fixture('torch-checkpoint.pt');
    expect(() => loadTorchCheckpoint(checkpoint, { key: 'optimizer' })).toThrow(
      /entry 'optimizer' that is not a dict of tensors/,
    );
    expect(() => loadTorchCheckpoint(checkpoint, { key: 'ema' })).toThrow(
      /no entry 'ema'; its keys are model, optimizer, epoch, best_acc1, arch, head/,
    );
    const noModel = bytesOf(0x80, 2, '}', str('epoch'), 'K', 3, 's.');
    expect(() => loadTorchCheckpoint(torchZip(noModel))).toThrow(/holds no state dict/);
  });
});

/** Whether two typed arrays hold the same bytes (fast on millions of values, unlike a deep equality). */
function sameBits(a: ArrayBufferView, b: ArrayBufferView): boolean {
  return Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength));
}

/** An f32 file as written by numpy's tofile (little-endian). */
function readF32(path: string): Float32Array {
  const bytes = readFileSync(path);
  return new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
}

/** NCHW values as NHWC. */
function nchwToNhwc(x: Float32Array, shape: readonly number[]): Float32Array {
  const [n = 0, c = 0, h = 0, w = 0] = shape;
  const out = new Float32Array(x.length);
  for (let i = 0; i < n * c * h * w; i++) {
    const [b, ch, y, xx] = [Math.floor(i / (c * h * w)), Math.floor(i / (h * w)) % c, Math.floor(i / w) % h, i % w];
    out[((b * h + y) * w + xx) * c + ch] = x[i]!;
  }
  return out;
}

/** The largest difference between `a` and `b`, relative to the largest magnitude in `b` (at least 1). */
function relativeError(a: Float32Array, b: Float32Array): number {
  let diff = 0;
  let scale = 1;
  for (let i = 0; i < b.length; i++) {
    diff = Math.max(diff, Math.abs(a[i]! - b[i]!));
    scale = Math.max(scale, Math.abs(b[i]!));
  }
  return diff / scale;
}

describe('torchvision weights in ResNet', () => {
  // A Python with torch and torchvision, when one is named (e.g. RESNET_TORCH_PYTHON=venv/bin/python).
  const python = process.env.RESNET_TORCH_PYTHON;
  const reason = python ? '' : ' (skipped: set RESNET_TORCH_PYTHON to a Python with torch and torchvision)';
  const dir = mkdtempSync(join(tmpdir(), 'resnet-cuda-torchvision-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('loads safetensors or a state dict, replaces a classifier of another size, and refuses weights that do not fit', async () => {
    using source = ResNet18({ numClasses: 10, smallInput: true, seed: 1 });
    const file = join(dir, 'r18.safetensors');
    await saveWeights(file, source);
    const state = source.stateDict();
    using same = ResNet18({ smallInput: true, weights: file });
    expect(same.numClasses).toBe(10);
    const loaded = same.stateDict();
    for (const [name, entry] of state) expect(sameBits(lookup(loaded, name).data, entry.data), name).toBe(true);
    using tuned = ResNet18({ smallInput: true, weights: state, numClasses: 3, seed: 5 });
    using fresh = ResNet18({ smallInput: true, numClasses: 3, seed: 5 });
    const [tunedState, freshState] = [tuned.stateDict(), fresh.stateDict()];
    for (const [name, entry] of tunedState) {
      const want = lookup(name.startsWith('fc.') ? freshState : state, name);
      expect(sameBits(entry.data, want.data), name).toBe(true);
    }
    expect(() => ResNet34({ smallInput: true, weights: file })).toThrow(
      /weights of '.*r18\.safetensors' do not fit this ResNet: missing key 'layer1\.2\.conv1\.weight'/,
    );
    expect(() => ResNet18({ weights: file })).toThrow(
      /'conv1\.weight' has shape \[64, 3, 3, 3\].* expects \[64, 3, 7, 7\]/,
    );
    expect(() => ResNet18({ weights: 42 as unknown as string })).toThrow(/for weights/);
    expect(() => ResNet18({ weights: join(dir, 'missing.pth') })).toThrow(/missing\.pth: cannot be read/);
  });

  it.skipIf(!python)(
    `PyTorch's own weights_only loader agrees on the fixtures: it reads the same values and refuses the same global${reason}`,
    () => {
      const script = [
        'import sys, torch',
        'for name in sys.argv[1:]:',
        '    try:',
        '        value = torch.load(name, weights_only=True)',
        '        print(name, "ok", float(value["f32"].sum()) if "f32" in value else value["epoch"])',
        '    except Exception as error:',
        '        print(name, "refused", "posix.system" in str(error))',
      ].join('\n');
      const files = ['torch-state.pt', 'torch-legacy.pt', 'torch-checkpoint.pt', 'torch-malicious.pt'].map(fixture);
      const lines = execFileSync(defined(python, 'RESNET_TORCH_PYTHON'), ['-c', script, ...files], { encoding: 'utf8' })
        .trim()
        .split('\n');
      const sum = lookup(expectedState(), 'f32').data as Float32Array;
      const total = sum.reduce((a, b) => a + b, 0);
      expect(lines).toEqual([
        `${files[0]} ok ${total.toFixed(1)}`,
        `${files[1]} ok ${total.toFixed(1)}`,
        `${files[2]} ok 3`,
        `${files[3]} refused True`,
      ]);
      expect(existsSync(MARKER)).toBe(false);
    },
  );

  for (const depth of [18, 50] as const) {
    it.skipIf(!python)(`ResNet-${depth} given torchvision's .pth computes torchvision's logits${reason}`, () => {
      const out = join(dir, String(depth));
      execFileSync('mkdir', ['-p', out]);
      execFileSync(defined(python, 'RESNET_TORCH_PYTHON'), [
        join(import.meta.dirname, 'helpers', 'torchvision-resnet.py'),
        String(depth),
        out,
      ]);
      const shapes = JSON.parse(readFileSync(join(out, 'shapes.json'), 'utf8')) as Record<string, number[]>;
      const inputShape = defined(shapes.input, 'input shape');
      const [n = 0, , h = 0, w = 0] = inputShape;
      const x = Tensor.from(nchwToNhwc(readF32(join(out, 'input.f32')), inputShape), [n, h, w, 3]);

      using model = new ResNet(depth, { weights: join(out, 'weights.pth') });
      model.eval();
      expect(model.numClasses).toBe(1000);
      const logits = model.forward(x).toFloat32Array();
      expect(logits.length).toBe(n * 1000);
      expect(relativeError(logits, readF32(join(out, 'logits.f32')))).toBeLessThan(1e-4);

      // The training checkpoint {'model': DataParallel state dict, ...} loads the same weights;
      // with 7 classes the classifier is new and the features are torchvision's.
      using tuned = new ResNet(depth, { weights: join(out, 'checkpoint.pth'), numClasses: 7, seed: 3 });
      tuned.eval();
      expect(tuned.numClasses).toBe(7);
      const features = tuned.forwardFeatures(x).toFloat32Array();
      expect(relativeError(features, readF32(join(out, 'features.f32')))).toBeLessThan(1e-4);
      const fresh = new ResNet(depth, { numClasses: 7, seed: 3 });
      expect(lookup(tuned.stateDict(), 'fc.weight').data).toEqual(lookup(fresh.stateDict(), 'fc.weight').data);
      fresh.dispose();
    });
  }
});
