/**
 * JPEG decoding on the device (lib/data/gpu-decode.ts, native/cuda/jpeg_*): the GPU decode of a
 * batch against the CPU decoder (libjpeg-turbo + rc::image's resampling) with the same crops and
 * flips, the hardware decoder's batched path and its fallback, and the errors. Runs in the
 * 'cuda-emulator-cases' project on the emulated device (emulated nvJPEG: libjpeg on the host, our
 * kernels translated); without a usable CUDA backend the device cases are skipped with the reason.
 *
 * Tolerance: test/helpers/decode-tolerance.ts, the bound for batches that hold 4:2:0 JPEGs (these
 * mix both). The emulated nvJPEG decodes with libjpeg, so on the emulated device the difference is
 * 0, and the test requires that there.
 */
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import sharp, { type JpegOptions } from 'sharp';
import { beforeAll, describe, expect, it } from 'vitest';
import {
  CenterCrop,
  Compose,
  GpuJpegDecoder,
  Normalize,
  RandomHorizontalFlip,
  RandomResizedCrop,
  Resize,
  listBackends,
  sampleRandom,
  type GpuDecodeSample,
} from '../lib/index.js';
import { addon } from '../lib/binding.js';
import { objectContaining, stringContaining, stringMatching } from './helpers/matchers.js';
import { DECODE_TOLERANCE as TOLERANCE, decodeDifference } from './helpers/decode-tolerance.js';
import { photo } from './helpers/photo.js';

const cuda = listBackends().find((b) => b.name === 'cuda');
const reason = cuda?.available ? undefined : (cuda?.reason ?? 'no CUDA backend');
const emulated = (process.env.RESNET_CUDA_BACKEND_LIBRARY ?? '').includes('emulator');

let files: GpuDecodeSample[] = [];

beforeAll(async () => {
  const encode = (h: number, w: number, seed: number, options: JpegOptions) =>
    sharp(photo(h, w, seed), { raw: { width: w, height: h, channels: 3 } })
      .jpeg(options)
      .toBuffer();
  const grey = await sharp(photo(40, 44, 3), { raw: { width: 44, height: 40, channels: 3 } })
    .toColourspace('b-w')
    .jpeg({ quality: 90 })
    .toBuffer();
  const encoded = [
    ['420.jpg', await encode(48, 64, 1, { quality: 90 })],
    ['444.jpg', await encode(37, 53, 2, { quality: 90, chromaSubsampling: '4:4:4' })],
    ['grey.jpg', grey],
    ['progressive.jpg', await encode(52, 40, 4, { quality: 85, progressive: true })],
    // A reduction of 4x or more: the CPU loader starts it with DCT scaling, the device decodes whole.
    ['large.jpg', await encode(120, 160, 5, { quality: 90 })],
  ] as const;
  files = encoded.map(([path, b], index) => ({ path, bytes: new Uint8Array(b), index: index + 10 }));
});

/** Interleaved RGB of 1- or 3-channel pixels (grey replicated, as the device decoder does). */
function rgb(data: Uint8Array, channels: number): Uint8Array {
  return channels === 3 ? data : Uint8Array.from({ length: data.length * 3 }, (_, i) => data[(i / 3) | 0]!);
}

/** Statistics of |a - b|: the mean, the largest, and the share of outliers (TOLERANCE.level). */
function compare(a: Uint8Array, b: Uint8Array): { mean: number; max: number; outliers: number } {
  expect(a.length).toBe(b.length);
  const d = decodeDifference(a, b);
  return { mean: d.mean, max: d.max, outliers: d.over[TOLERANCE.level] };
}

/**
 * The CPU decoder's pixels for each file with the pipeline's draws: the same request as the
 * device's, decoded at full size (dctScaling off, as the device does) by libjpeg-turbo.
 */
function cpuReference(transform: Compose, seed: number, epoch: number, deferFlip: boolean) {
  const pixels: Uint8Array[] = [];
  const flips: number[] = [];
  for (const f of files) {
    const plan = transform.deviceJpegPlan(f.bytes, f.path, sampleRandom(seed, epoch, f.index), deferFlip);
    const img = addon().jpegDecode({ bytes: f.bytes, ...plan.request, dctScaling: false });
    if (!img) throw new Error(`${f.path}: not decoded`);
    pixels.push(rgb(img.data, img.channels));
    flips.push(plan.flip ? 1 : 0);
  }
  return { pixels, flips };
}

const pipelines: [string, () => Compose, boolean][] = [
  [
    'RandomResizedCrop + flip (deferred) + Normalize',
    () =>
      new Compose([
        new RandomResizedCrop({ size: 24 }),
        new RandomHorizontalFlip(),
        new Normalize({ mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225] }),
      ]),
    true,
  ],
  [
    'RandomResizedCrop + flip (mirrored in the decode)',
    () => new Compose([new RandomResizedCrop({ size: [20, 28], scale: [0.3, 1] }), new RandomHorizontalFlip()]),
    false,
  ],
  ['Resize + CenterCrop', () => new Compose([new Resize({ size: 30 }), new CenterCrop({ size: 24 })]), true],
  ['CenterCrop', () => new Compose([new CenterCrop({ size: [30, 36] })]), true],
  // Height shrinks while the width grows or shrinks less: PIL's order runs the vertical pass first.
  ['Resize to [12, 60] (vertical pass first)', () => new Compose([new Resize({ size: [12, 60] })]), true],
  ['Resize with bicubic filter', () => new Compose([new Resize({ size: [26, 22], interpolation: 'bicubic' })]), true],
];

// The host-side cases run once, in the CPU project.
describe.skipIf(process.env.RESNET_TEST_BACKENDS === 'cuda')('the device decode plan', () => {
  it('draws what the CPU pipeline draws: its request decodes to the CPU loader pixels and flips', async () => {
    const transform = new Compose([new RandomResizedCrop({ size: 24 }), new RandomHorizontalFlip()]);
    for (const f of files) {
      const plan = transform.deviceJpegPlan(f.bytes, f.path, sampleRandom(3, 1, f.index), true);
      const cpu = await transform.run(
        { source: { kind: 'encoded', bytes: f.bytes, path: f.path }, label: 0 },
        sampleRandom(3, 1, f.index),
        { deferFlip: true },
      );
      const img = addon().jpegDecode({ bytes: f.bytes, ...plan.request });
      expect(img && rgb(img.data, img.channels)).toEqual(cpu.image.data);
      expect(plan.flip).toBe(cpu.flip);
    }
  });

  it('refuses pipelines the device does not run, naming the transform', () => {
    const f = files[0]!;
    const rotate = new Compose([new RandomResizedCrop({ size: 24 }), new Resize({ size: [20, 20] })]);
    expect(() => rotate.deviceJpegPlan(f.bytes, f.path, sampleRandom(0, 0, 0), true)).toThrow(/transform.*Resize/s);
    const grey = new Compose([new CenterCrop({ size: 8 })], { outputChannels: 1 });
    expect(() => grey.deviceJpegPlan(f.bytes, f.path, sampleRandom(0, 0, 0), true)).toThrow(/outputChannels/);
  });

  it('names a truncated or non-JPEG file', () => {
    const transform = new Compose([new CenterCrop({ size: 8 })]);
    const f = files[0]!;
    expect(() => transform.deviceJpegPlan(f.bytes.subarray(0, 200), 'cut.jpg', sampleRandom(0, 0, 0), true)).toThrow(
      objectContaining({ code: 'ERR_RC_CORRUPT_FILE', message: stringContaining("'cut.jpg'") }),
    );
    expect(() => transform.deviceJpegPlan(new Uint8Array([1, 2, 3]), 'a.png', sampleRandom(0, 0, 0), true)).toThrow(
      /'a\.png'.*not a JPEG/,
    );
  });

  it("refuses the CPU as the decoder's device", () => {
    const transform = new Compose([new CenterCrop({ size: 8 })]);
    expect(() => new GpuJpegDecoder({ transform, device: 'cpu', seed: 0 })).toThrow(/CUDA device.*for device/);
  });
});

describe.skipIf(reason !== undefined)(`JPEG decoding on CUDA${reason ? ` (skipped: ${reason})` : ''}`, () => {
  for (const [name, make, deferFlip] of pipelines) {
    it(`matches the CPU decoder within the tolerance: ${name}`, () => {
      const transform = make();
      const decoder = new GpuJpegDecoder({ transform, device: 'cuda', seed: 7, deferFlip });
      try {
        const [h, w] = decoder.size;
        for (const epoch of [0, 1]) {
          const batch = decoder.decode(files, epoch);
          expect(batch.images.shape).toEqual([files.length, h, w, 3]);
          const gpu = batch.images.toArray() as Uint8Array;
          const ref = cpuReference(transform, 7, epoch, deferFlip);
          expect([...batch.flips]).toEqual(ref.flips);
          const all = new Uint8Array(gpu.length);
          ref.pixels.forEach((p, i) => all.set(p, i * h * w * 3));
          const d = compare(gpu, all);
          expect(d.mean).toBeLessThanOrEqual(TOLERANCE.mean);
          expect(d.outliers).toBeLessThanOrEqual(TOLERANCE.outliers);
          // The emulated nvJPEG is libjpeg: there the two paths must agree exactly.
          if (emulated) expect(d.max).toBe(0);
        }
      } finally {
        decoder.dispose();
      }
    });
  }

  it('double-buffers: a batch stays valid while the next one is decoded', () => {
    const transform = new Compose([new RandomResizedCrop({ size: 16 })]);
    const decoder = new GpuJpegDecoder({ transform, device: 'cuda', seed: 1 });
    try {
      const first = decoder.decode(files.slice(0, 2), 0);
      const second = decoder.decode(files.slice(2, 4), 0);
      expect(first.images).not.toBe(second.images);
      const a = first.images.toArray() as Uint8Array;
      const ref = cpuReference(transform, 1, 0, true);
      expect(compare(a, new Uint8Array([...ref.pixels[0]!, ...ref.pixels[1]!])).mean).toBeLessThanOrEqual(
        TOLERANCE.mean,
      );
      decoder.synchronize(30);
      expect(second.images.shape).toEqual([2, 16, 16, 3]);
    } finally {
      decoder.dispose();
    }
  });

  it('decodes batches on the hardware decoder, and what it refuses (progressive) on the hybrid one', () => {
    const before = process.env.RESNET_CUDA_EMU_NVJPEG_HARDWARE;
    const transform = new Compose([new Resize({ size: [24, 24] })]);
    let hybridPixels: Uint8Array;
    const hybrid = new GpuJpegDecoder({ transform, device: 'cuda', seed: 0 });
    try {
      expect(hybrid.implementation).toBe('nvjpeg:hybrid');
      hybridPixels = Uint8Array.from(hybrid.decode(files, 0).images.toArray() as Uint8Array);
    } finally {
      hybrid.dispose();
    }
    process.env.RESNET_CUDA_EMU_NVJPEG_HARDWARE = '1';
    try {
      const hardware = new GpuJpegDecoder({ transform, device: 'cuda', seed: 0 });
      try {
        expect(hardware.implementation).toBe('nvjpeg:hardware');
        const baseline = files.filter((f) => f.path !== 'progressive.jpg');
        const idx = files.map((f, i) => (f.path === 'progressive.jpg' ? -1 : i)).filter((i) => i >= 0);
        const px = 24 * 24 * 3;
        const got = hardware.decode(baseline, 0).images.toArray() as Uint8Array;
        idx.forEach((i, k) =>
          expect(got.subarray(k * px, (k + 1) * px)).toEqual(hybridPixels.subarray(i * px, (i + 1) * px)),
        );
        // The progressive file makes the hardware refuse the batch: the hybrid decoder takes it.
        expect(hardware.decode(files, 0).images.toArray()).toEqual(hybridPixels);
      } finally {
        hardware.dispose();
      }
    } finally {
      if (before === undefined) delete process.env.RESNET_CUDA_EMU_NVJPEG_HARDWARE;
      else process.env.RESNET_CUDA_EMU_NVJPEG_HARDWARE = before;
    }
  });

  it('names the file whose entropy-coded data is broken', () => {
    const transform = new Compose([new CenterCrop({ size: 8 })]);
    const decoder = new GpuJpegDecoder({ transform, device: 'cuda', seed: 0 });
    try {
      const good = files[0]!;
      // Garbage in the middle of the scan (after the headers), the end-of-image marker kept.
      const broken = Uint8Array.from(good.bytes);
      const sos = broken.findIndex((b, i) => b === 0xff && broken[i + 1] === 0xda);
      for (let i = sos + 40; i < broken.length - 40; i++) broken[i] = 0xff;
      const samples = [good, { path: 'broken.jpg', bytes: broken, index: 1 }];
      expect(() => decoder.decode(samples, 0)).toThrow(
        objectContaining({
          code: 'ERR_RC_CORRUPT_FILE',
          message: stringMatching(/'broken\.jpg'.*image 1/),
        }),
      );
    } finally {
      decoder.dispose();
    }
  });

  // The emulated nvJPEG itself: pixels against libjpeg's, the documented argument checks and
  // status codes, in its own C++ test next to the emulated backend.
  const library = process.env.RESNET_CUDA_BACKEND_LIBRARY;
  const nvjpegTest = library ? join(dirname(library), 'rc_emu_nvjpeg_test') : '';
  it.skipIf(!existsSync(nvjpegTest))("the emulator's nvJPEG: pixels, image information, argument checks", () => {
    const env = { ...process.env };
    delete env.RESNET_CUDA_EMU_NVJPEG_HARDWARE;
    const r = spawnSync(nvjpegTest, [], { encoding: 'utf8', env, timeout: 60_000 });
    expect(r.stdout + r.stderr).toMatch(/nvjpeg: \d+ passed, 0 failed/);
    expect(r.status).toBe(0);
  });

  it('checks its arguments', () => {
    const transform = new Compose([new CenterCrop({ size: 8 })]);
    const decoder = new GpuJpegDecoder({ transform, device: 'cuda', seed: 0 });
    expect(() => decoder.decode([], 0)).toThrow(/samples/);
    expect(() => decoder.decode(files, -1)).toThrow(/epoch/);
    decoder.dispose();
    expect(() => decoder.decode(files, 0)).toThrow(objectContaining({ code: 'ERR_RC_DISPOSED' }));
  });
});
