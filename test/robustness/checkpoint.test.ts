// Misuse and fuzz cases of checkpoint loading: every damaged or mismatched file gives a coded error
// naming the file, and a refused load leaves the model, the optimizer and the other parts as they were.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, assert, describe, expect, it } from 'vitest';
import {
  AdamW,
  CrossEntropyLoss,
  Flatten,
  GradScaler,
  Linear,
  ReLU,
  SGD,
  Scheduler,
  Sequential,
  StepLR,
  Tensor,
} from '../../lib/index.js';
import type { Module } from '../../lib/nn/module.js';
import { decodeSafetensors, loadCheckpoint, saveCheckpoint } from '../../lib/train/checkpoint.js';
import { Rng } from '../reference/rng.js';

const dir = mkdtempSync(join(tmpdir(), 'resnet-cuda-robust-checkpoint-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
let files = 0;
const fileName = (): string => join(dir, `case-${files++}.safetensors`);

/** A seeded uniform generator, so that a failing case replays. */
function random(seed: number): () => number {
  const rng = new Rng(seed);
  return () => rng.uniform();
}

function net(seed: number): Module {
  return new Sequential(
    new Flatten(),
    new Linear({ inFeatures: 12, outFeatures: 6, seed }),
    new ReLU(),
    new Linear({ inFeatures: 6, outFeatures: 3, seed: seed + 1 }),
  ).to('cpu');
}

/** A model, an SGD with momentum, a scaler and a schedule, after `steps` steps. */
function run(seed: number, steps: number) {
  const model = net(seed);
  const optimizer = new SGD(model, { lr: 0.1, momentum: 0.9 });
  const scaler = new GradScaler({ enabled: true, initScale: 256 });
  const scheduler = new Scheduler(optimizer, new StepLR({ stepSize: 2, gamma: 0.5 }));
  const loss = new CrossEntropyLoss();
  const x = Tensor.randn([4, 2, 2, 3], { seed: seed + 2 });
  for (let i = 0; i < steps; i++) {
    loss.forward(model.forward(x), [0, 1, 2, 0]);
    model.backward(loss.backward());
    optimizer.step();
    optimizer.zeroGrad();
    scheduler.step();
  }
  return { model, optimizer, scaler, scheduler };
}

/** Everything a load could change, as comparable plain data. */
function snapshot(parts: ReturnType<typeof run>): unknown {
  const weights = [...parts.model.stateDict()].map(([name, e]) => [name, Array.from(e.data as Float32Array)]);
  const o = parts.optimizer.state();
  const buffers = Object.entries(o.buffers).map(([name, data]) => [name, Array.from(data)]);
  return {
    weights,
    step: o.step,
    groups: o.paramGroups,
    buffers,
    scaler: parts.scaler.state(),
    scheduler: parts.scheduler.state(),
  };
}

/** Rewrites a safetensors file's JSON header, keeping its data bytes. */
function editHeader(bytes: Buffer, edit: (header: Record<string, unknown>) => unknown): Buffer {
  const length = Number(bytes.readBigUInt64LE(0));
  const header = JSON.parse(bytes.subarray(8, 8 + length).toString('utf8')) as Record<string, unknown>;
  const json = Buffer.from(JSON.stringify(edit(header)));
  const head = Buffer.alloc(8);
  head.writeBigUInt64LE(BigInt(json.length));
  return Buffer.concat([head, json, bytes.subarray(8 + length)]);
}

const saved = await (async () => {
  const source = run(1, 3);
  const path = fileName();
  await saveCheckpoint(path, source, { epoch: 1, step: 3 });
  return readFileSync(path);
})();

/** Loads `bytes` into a fresh run and asserts a coded error naming the file and nothing changed. */
async function expectRefused(bytes: Uint8Array, pattern?: RegExp, into = run(7, 1)): Promise<void> {
  const path = fileName();
  writeFileSync(path, bytes);
  const before = snapshot(into);
  const error = (await loadCheckpoint(path, into).then(
    () => null,
    (e: unknown) => e,
  )) as { code?: string; message?: string } | null;
  assert.isNotNull(error, 'the load was refused');
  expect(error.code).toMatch(/^ERR_RC_(CHECKPOINT|STATE_DICT)$/);
  expect(error.message).toContain(path);
  if (pattern) expect(error.message).toMatch(pattern);
  expect(snapshot(into)).toEqual(before);
}

describe('checkpoint loading refuses damaged files whole', () => {
  it('loads the intact file (the control case)', async () => {
    const path = fileName();
    writeFileSync(path, saved);
    const into = run(7, 1);
    await expect(loadCheckpoint(path, into)).resolves.toMatchObject({ epoch: 1, step: 3 });
    expect(into.optimizer.stepCount).toBe(3);
  });

  it.each([
    ['a null header', () => null],
    ['an array header', () => []],
    ['a null entry', (h: Record<string, unknown>) => ({ ...h, [Object.keys(h)[1]!]: null })],
    [
      'a string shape',
      (h: Record<string, unknown>) => ({
        ...h,
        [Object.keys(h)[1]!]: { ...(h[Object.keys(h)[1]!] as object), shape: '6,12' },
      }),
    ],
    [
      'a fractional shape',
      (h: Record<string, unknown>) => ({
        ...h,
        [Object.keys(h)[1]!]: { ...(h[Object.keys(h)[1]!] as object), shape: [36, 2.5] },
      }),
    ],
    [
      'reversed offsets',
      (h: Record<string, unknown>) => {
        const key = Object.keys(h)[1]!;
        const e = h[key] as { data_offsets: [number, number] };
        return { ...h, [key]: { ...e, data_offsets: [e.data_offsets[1], e.data_offsets[0]] } };
      },
    ],
    [
      'overlapping offsets',
      (h: Record<string, unknown>) => {
        const keys = Object.keys(h);
        const a = keys[1]!;
        const b = keys[2]!;
        const first = h[a] as { data_offsets: [number, number] };
        const second = h[b] as { data_offsets: [number, number]; shape: number[] };
        const size = second.data_offsets[1] - second.data_offsets[0];
        return { ...h, [b]: { ...second, data_offsets: [first.data_offsets[0], first.data_offsets[0] + size] } };
      },
    ],
    [
      'non-string metadata',
      (h: Record<string, unknown>) => ({ ...h, __metadata__: { ...(h.__metadata__ as object), progress: 7 } }),
    ],
  ])('%s', async (_name, edit) => {
    await expectRefused(editHeader(saved, edit));
  });

  it('decodeSafetensors gives the coded error for malformed headers too', () => {
    const namesTheFile: unknown = expect.stringContaining('w.safetensors');
    expect(() =>
      decodeSafetensors(
        editHeader(saved, () => null),
        'w.safetensors',
      ),
    ).toThrow(expect.objectContaining({ code: 'ERR_RC_CHECKPOINT', message: namesTheFile }));
  });

  it.each([
    ['unreadable progress', 'progress', '{"epoch":'],
    ['a negative step', 'progress', '{"epoch":1,"step":-4}'],
    ['unreadable optimizer settings', 'optimizer', 'not json'],
    ['an optimizer state without groups', 'optimizer', '{"step":3}'],
    ['unreadable scaler state', 'scaler', '{'],
    ['unreadable schedule state', 'scheduler', '[1,'],
  ])('corrupt metadata: %s', async (_name, key, value) => {
    await expectRefused(
      editHeader(saved, (h) => ({ ...h, __metadata__: { ...(h.__metadata__ as object), [key]: value } })),
    );
  });

  it('a missing tensor (the momentum of SGD) is named', async () => {
    await expectRefused(
      editHeader(saved, (h) => {
        const { 'optimizer.momentum': _gone, ...rest } = h;
        return rest;
      }),
      /optimizer\.momentum/,
    );
  });

  it('an SGD checkpoint loaded into AdamW is refused before anything changes', async () => {
    const into = run(7, 1);
    const adamw = { ...into, optimizer: new AdamW(into.model, { lr: 0.01 }) };
    await expectRefused(saved, /SGD.*AdamW|AdamW.*SGD/, adamw as unknown as ReturnType<typeof run>);
  });

  it('a schedule state that does not fit is refused before the weights change', async () => {
    await expectRefused(
      editHeader(saved, (h) => ({
        ...h,
        __metadata__: { ...(h.__metadata__ as object), scheduler: '{"step":2,"baseLrs":[0.1,0.1,0.1]}' },
      })),
    );
  });

  it('flipped bits in the tensor data fail the checksum (seeded)', async () => {
    const next = random(11);
    const length = Number(saved.readBigUInt64LE(0));
    const dataStart = 8 + length;
    for (let trial = 0; trial < 12; trial++) {
      const bytes = Buffer.from(saved);
      const at = dataStart + Math.floor(next() * (bytes.length - dataStart));
      bytes[at]! ^= 1 << Math.floor(next() * 8);
      await expectRefused(bytes, /checksum/);
    }
  });

  it('truncated files are refused at any length (seeded)', async () => {
    const next = random(12);
    for (let trial = 0; trial < 16; trial++) await expectRefused(saved.subarray(0, Math.floor(next() * saved.length)));
  });

  it('random header bytes either load whole or are refused whole (seeded)', async () => {
    const next = random(13);
    const length = Number(saved.readBigUInt64LE(0));
    for (let trial = 0; trial < 40; trial++) {
      const bytes = Buffer.from(saved);
      const at = 8 + Math.floor(next() * length);
      bytes[at] = Math.floor(next() * 256);
      const path = fileName();
      writeFileSync(path, bytes);
      const into = run(7, 1);
      const before = snapshot(into);
      const error = await loadCheckpoint(path, into).then(
        () => null,
        (e: unknown) => e as Error & { code?: string },
      );
      if (error === null) {
        // The tensors are checksummed, so a load that went through restored them exactly; a changed
        // metadata value of the right type (a digit of the lr, say) is not detectable.
        const intact = snapshot(await loadInto(saved)) as { weights: unknown; buffers: unknown };
        expect(snapshot(into), `byte ${at}`).toMatchObject({ weights: intact.weights, buffers: intact.buffers });
      } else {
        expect(error.code, `byte ${at}: ${String(error)}`).toMatch(/^ERR_RC_(CHECKPOINT|STATE_DICT)$/);
        expect(error.message).toContain(path);
        expect(snapshot(into)).toEqual(before);
      }
    }
  });

  it('a checkpoint without checksums (an older release) still loads', async () => {
    const old = editHeader(saved, (h) => {
      const { checksums: _gone, ...metadata } = h.__metadata__ as Record<string, string>;
      return { ...h, __metadata__: metadata };
    });
    const loaded = await loadInto(old);
    expect(loaded.optimizer.stepCount).toBe(3);
  });
});

async function loadInto(bytes: Uint8Array): Promise<ReturnType<typeof run>> {
  const path = fileName();
  writeFileSync(path, bytes);
  const into = run(7, 1);
  await loadCheckpoint(path, into);
  return into;
}
