import sharp from 'sharp';
import { beforeAll, describe, expect, it } from 'vitest';
import { sampleRandom } from '../lib/data/sample-random.js';
import {
  CenterCrop,
  ColorJitter,
  Compose,
  Grayscale,
  Normalize,
  RandomHorizontalFlip,
  RandomResizedCrop,
  RandomRotation,
  Resize,
  ToRGB,
  transformFromSpec,
  type Transform,
} from '../lib/data/transforms.js';
import { decodeImage } from '../lib/data/transforms/decode.js';
import { centerCrop, hflip, resizeOutputSize } from '../lib/data/transforms/functional.js';
import { addon } from '../lib/binding.js';
import type { DecodedImage, RawSample, SampleRandom } from '../lib/data/types.js';

const code = (c: string): unknown => expect.objectContaining({ code: c });

/** An image whose every byte is a function of its position. */
function patterned(
  height: number,
  width: number,
  channels: number,
  f: (y: number, x: number, c: number) => number = (y, x, c) => (y * 31 + x * 7 + c * 101) & 255,
): DecodedImage {
  const data = new Uint8Array(height * width * channels);
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      for (let c = 0; c < channels; c++) data[(y * width + x) * channels + c] = f(y, x, c);
    }
  }
  return { data, height, width, channels };
}

function px(img: DecodedImage, y: number, x: number): number[] {
  const s = (y * img.width + x) * img.channels;
  return Array.from(img.data.subarray(s, s + img.channels));
}

function decoded(image: DecodedImage): RawSample {
  return { source: { kind: 'decoded', image }, label: 0 };
}

function encoded(bytes: Uint8Array, path = 'images/sample.jpg'): RawSample {
  return { source: { kind: 'encoded', bytes, path }, label: 0 };
}

/** A SampleRandom that replays fixed values of next(). */
function scripted(values: number[]): SampleRandom {
  let i = 0;
  const next = () => {
    if (i >= values.length) throw new Error('scripted rng exhausted');
    return values[i++]!;
  };
  return { next, uniform: (lo, hi) => lo + (hi - lo) * next() };
}

/** Smooth gradients with a few shapes and a little noise, as an encodable photo stand-in. */
function photo(height: number, width: number, seed = 1): Buffer {
  const data = Buffer.alloc(height * width * 3);
  let s = seed >>> 0;
  const noise = () => (s = (Math.imul(s, 1103515245) + 12345) >>> 0) >>> 27;
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const inDisc = (x - width * 0.3) ** 2 + (y - height * 0.4) ** 2 < (height * 0.2) ** 2;
      const inBox = x > width * 0.6 && x < width * 0.85 && y > height * 0.2 && y < height * 0.7;
      const o = (y * width + x) * 3;
      data[o] = inDisc ? 220 : Math.round((255 * x) / width);
      data[o + 1] = inBox ? 30 : Math.round((255 * y) / height);
      data[o + 2] = (inDisc ? 40 : 128) + noise();
    }
  }
  return data;
}

async function jpeg(height: number, width: number, seed = 1): Promise<Uint8Array> {
  return new Uint8Array(
    await sharp(photo(height, width, seed), { raw: { width, height, channels: 3 } })
      .jpeg({ quality: 92 })
      .toBuffer(),
  );
}

let smallJpeg: Uint8Array;
let bigJpeg: Uint8Array;
beforeAll(async () => {
  smallJpeg = await jpeg(75, 100);
  bigJpeg = await jpeg(900, 1200, 2);
});

describe('sampleRandom', () => {
  it('gives the same draws for the same (seed, epoch, index) and different ones otherwise', () => {
    const draws = (seed: number, epoch: number, index: number) => {
      const r = sampleRandom(seed, epoch, index);
      return Array.from({ length: 8 }, () => r.next());
    };
    expect(draws(7, 3, 11)).toEqual(draws(7, 3, 11));
    const base = draws(7, 3, 11);
    for (const other of [draws(7, 3, 12), draws(7, 4, 11), draws(8, 3, 11), draws(7, 3, 11 + 2 ** 32)]) {
      expect(other).not.toEqual(base);
    }
    let sum = 0;
    const r = sampleRandom(0, 0, 0);
    for (let i = 0; i < 20000; i++) {
      const v = r.next();
      expect(v >= 0 && v < 1).toBe(true);
      sum += v;
    }
    expect(Math.abs(sum / 20000 - 0.5)).toBeLessThan(0.01);
    // First draws of neighbouring indices are spread out, not correlated.
    const firsts = Array.from({ length: 1000 }, (_, i) => sampleRandom(5, 0, i).next());
    expect(Math.abs(firsts.reduce((a, b) => a + b, 0) / 1000 - 0.5)).toBeLessThan(0.04);
    expect(sampleRandom(1, 0, 0).uniform(2, 3)).toBeGreaterThanOrEqual(2);
  });

  it('rejects bad arguments', () => {
    expect(() => sampleRandom(1.5, 0, 0)).toThrow(code('ERR_RC_INVALID_ARGUMENT'));
    expect(() => sampleRandom(1, -1, 0)).toThrow(/epoch/);
    expect(() => sampleRandom(1, 0, Number.NaN)).toThrow(/index/);
  });
});

describe('RandomHorizontalFlip', () => {
  it('mirrors the pixels exactly with p = 1 and leaves them with p = 0', async () => {
    const img = patterned(3, 4, 3);
    const flipped = (await new Compose([new RandomHorizontalFlip({ p: 1 })]).run(decoded(img), sampleRandom(1, 0, 0)))
      .image;
    for (let y = 0; y < 3; y++) for (let x = 0; x < 4; x++) expect(px(flipped, y, x)).toEqual(px(img, y, 3 - x));
    const kept = await new Compose([new RandomHorizontalFlip({ p: 0 })]).run(decoded(img), sampleRandom(1, 0, 0));
    expect(kept.image.data).toEqual(img.data);
    expect(kept.flip).toBe(false);
    // The input image is never modified.
    expect(img.data).toEqual(patterned(3, 4, 3).data);
  });

  it('flips about half of the samples with p = 0.5', () => {
    const flip = new RandomHorizontalFlip();
    let n = 0;
    for (let i = 0; i < 2000; i++) if (flip.draw(sampleRandom(3, 0, i))) n++;
    expect(n).toBeGreaterThan(900);
    expect(n).toBeLessThan(1100);
  });

  it('defers the flip to the caller with deferFlip, drawing the same decisions', async () => {
    const pipeline = new Compose([
      new RandomResizedCrop({ size: 24 }),
      new RandomHorizontalFlip(),
      new ColorJitter({ brightness: 0.3, contrast: 0.3, saturation: 0.3, hue: 0.05 }),
    ]);
    expect(pipeline.canDeferAllFlips()).toBe(true);
    let flips = 0;
    for (const sample of [decoded(patterned(40, 50, 3)), encoded(smallJpeg)]) {
      for (let i = 0; i < 8; i++) {
        const plain = await pipeline.run(sample, sampleRandom(9, 0, i));
        const deferred = await pipeline.run(sample, sampleRandom(9, 0, i), { deferFlip: true });
        expect(plain.flip).toBe(false);
        if (deferred.flip) flips++;
        expect((deferred.flip ? hflip(deferred.image) : deferred.image).data).toEqual(plain.image.data);
      }
    }
    expect(flips).toBeGreaterThan(0);
    expect(flips).toBeLessThan(16);
  });

  it('does a flip that a geometric transform follows on the pixels even with deferFlip', async () => {
    const pipeline = new Compose([new RandomHorizontalFlip({ p: 1 }), new CenterCrop({ size: [2, 3] })]);
    expect(pipeline.canDeferAllFlips()).toBe(false);
    const img = patterned(2, 4, 1);
    const r = await pipeline.run(decoded(img), sampleRandom(1, 0, 0), { deferFlip: true });
    expect(r.flip).toBe(false);
    // Flipped then cropped at left = round(1 / 2) = 0.
    expect(px(r.image, 0, 0)).toEqual(px(toRGBRef(img), 0, 3));
  });
});

function toRGBRef(img: DecodedImage): DecodedImage {
  return new ToRGB().apply(img);
}

describe('CenterCrop', () => {
  it("takes the central box with Python's rounding of odd differences", () => {
    const img = patterned(5, 7, 2);
    // top = round(1.5) = 2, left = round(2.5) = 2 (halves to even).
    const a = centerCrop(img, [2, 2]);
    expect([a.height, a.width]).toEqual([2, 2]);
    for (let y = 0; y < 2; y++) for (let x = 0; x < 2; x++) expect(px(a, y, x)).toEqual(px(img, 2 + y, 2 + x));
    // top = round(0.5) = 0, left = round(3.5) = 4.
    const b = centerCrop(patterned(4, 9, 1), [3, 2]);
    expect(Array.from(b.data)).toEqual([0, 1, 2].flatMap((y) => [4, 5].map((x) => px(patterned(4, 9, 1), y, x)[0]!)));
  });

  it('pads with zeros where the image is smaller', () => {
    const img: DecodedImage = { data: Uint8Array.from([1, 2, 3, 4, 5, 6]), height: 2, width: 3, channels: 1 };
    expect(Array.from(centerCrop(img, [4, 4]).data)).toEqual([0, 0, 0, 0, 1, 2, 3, 0, 4, 5, 6, 0, 0, 0, 0, 0]);
    // Padded rows, cropped columns: left = round((7 - 3) / 2) = 2.
    const wide = patterned(2, 7, 1);
    const c = centerCrop(wide, [4, 3]);
    expect(Array.from(c.data)).toEqual([
      0,
      0,
      0,
      ...[2, 3, 4].map((x) => px(wide, 0, x)[0]!),
      ...[2, 3, 4].map((x) => px(wide, 1, x)[0]!),
      0,
      0,
      0,
    ]);
  });

  it('crops a JPEG in the decoder to the same pixels as after a full decode', async () => {
    const full = await decodeImage(smallJpeg, 'a.jpg');
    for (const size of [
      [40, 51],
      [75, 100],
      [80, 20],
    ] as [number, number][]) {
      const r = await new Compose([new CenterCrop({ size })]).run(encoded(smallJpeg), sampleRandom(0, 0, 0));
      expect(r.image.data).toEqual(centerCrop(full, size).data);
    }
  });
});

describe('Resize', () => {
  it("resizes the smaller edge to size with torchvision's long-side rule", async () => {
    expect(resizeOutputSize([375, 500], 256)).toEqual([256, 341]);
    expect(resizeOutputSize([500, 375], 256)).toEqual([341, 256]);
    expect(resizeOutputSize([3, 10], 4)).toEqual([4, 13]);
    expect(resizeOutputSize([100, 100], 32)).toEqual([32, 32]);
    expect(resizeOutputSize([375, 500], 256, 300)).toEqual([225, 300]);
    expect(resizeOutputSize([375, 500], [10, 20])).toEqual([10, 20]);
    const img = patterned(30, 100, 3);
    const r = await new Compose([new Resize({ size: 8 })]).run(decoded(img), sampleRandom(0, 0, 0));
    expect([r.image.height, r.image.width, r.image.channels]).toEqual([8, 26, 3]);
    // Grey stays one channel through libvips (IDX images), until the pipeline's output conversion.
    const grey = new Resize({ size: 8 }).apply(patterned(30, 100, 1));
    expect([grey.height, grey.width, grey.channels, grey.data.length]).toEqual([8, 26, 1, 208]);
    const exact = await new Compose([new Resize({ size: [7, 9] })]).run(decoded(img), sampleRandom(0, 0, 0));
    expect([exact.image.height, exact.image.width]).toEqual([7, 9]);
    // A constant image stays constant, and a same-size resize changes nothing.
    const flat = patterned(20, 30, 3, () => 77);
    expect(
      new Set((await new Compose([new Resize({ size: 11 })]).run(decoded(flat), sampleRandom(0, 0, 0))).image.data),
    ).toEqual(new Set([77]));
    expect((await new Compose([new Resize({ size: 30 })]).run(decoded(img), sampleRandom(0, 0, 0))).image.data).toEqual(
      img.data,
    );
  });

  it('resizes a JPEG in the decoder (shrink-on-load) close to a full decode and resize', async () => {
    const pipeline = new Compose([new Resize({ size: 150 })]);
    const fused = (await pipeline.run(encoded(bigJpeg), sampleRandom(0, 0, 0))).image;
    const viaRaw = (await pipeline.run(decoded(await decodeImage(bigJpeg, 'big.jpg')), sampleRandom(0, 0, 0))).image;
    expect([fused.height, fused.width]).toEqual([150, 200]);
    expect([viaRaw.height, viaRaw.width]).toEqual([150, 200]);
    expect(meanAbsDiff(fused, viaRaw)).toBeLessThan(4);
  });
});

describe('Resize + CenterCrop on a JPEG', () => {
  it('crops in the decoder pipeline to the same pixels as a CenterCrop after the resize, mirrored or not', async () => {
    const cases: [number | [number, number], number | [number, number]][] = [
      [60, 50], // 60x80, crop at top 5, left 15
      [61, [40, 51]], // 61x81: odd differences, Python's rounding
      [[45, 70], 45], // exact output size, crop of the width only
      [150, [150, 200]], // a crop of the whole resized image
    ];
    for (const [size, cropSize] of cases) {
      const resized = (await new Compose([new Resize({ size })]).run(encoded(bigJpeg), sampleRandom(0, 0, 0))).image;
      const crop = typeof cropSize === 'number' ? ([cropSize, cropSize] as [number, number]) : cropSize;
      const expected = centerCrop(resized, crop);
      const fused = await new Compose([new Resize({ size }), new CenterCrop({ size: cropSize })]).run(
        encoded(bigJpeg),
        sampleRandom(0, 0, 0),
      );
      expect([fused.image.height, fused.image.width]).toEqual(crop);
      expect(fused.image.data).toEqual(expected.data);
      // A flip right after the crop is mirrored in the same pipeline (or deferred).
      const flipped = new Compose([
        new Resize({ size }),
        new CenterCrop({ size: cropSize }),
        new RandomHorizontalFlip({ p: 1 }),
      ]);
      expect((await flipped.run(encoded(bigJpeg), sampleRandom(0, 0, 0))).image.data).toEqual(hflip(expected).data);
      const deferred = await flipped.run(encoded(bigJpeg), sampleRandom(0, 0, 0), { deferFlip: true });
      expect(deferred.flip).toBe(true);
      expect(deferred.image.data).toEqual(expected.data);
    }
    // A crop larger than the resized image pads with zeros, after the decoder's resize.
    const padded = await new Compose([new Resize({ size: 20 }), new CenterCrop({ size: [24, 30] })]).run(
      encoded(smallJpeg),
      sampleRandom(0, 0, 0),
    );
    const small = (await new Compose([new Resize({ size: 20 })]).run(encoded(smallJpeg), sampleRandom(0, 0, 0))).image;
    expect(padded.image.data).toEqual(centerCrop(small, [24, 30]).data);
  });
});

function meanAbsDiff(a: DecodedImage, b: DecodedImage): number {
  expect(a.data.length).toBe(b.data.length);
  let s = 0;
  for (let i = 0; i < a.data.length; i++) s += Math.abs(a.data[i]! - b.data[i]!);
  return s / a.data.length;
}

describe('RandomResizedCrop', () => {
  it("follows torchvision's get_params draw for draw", () => {
    // area = 20000 * (0.08 + 0.92 * 0.25) = 6200, aspect = exp(0) = 1, w = h = round(78.74) = 79,
    // top = randint(0, 22) = floor(0.5 * 22), left = randint(0, 122) = floor(0.5 * 122).
    expect(RandomResizedCrop.getParams(100, 200, scripted([0.25, 0.5, 0.5, 0.5]))).toEqual({
      top: 11,
      left: 61,
      height: 79,
      width: 79,
    });
    // sqrt(area) = 10.5 rounds half to even (Python's round), to 10.
    expect(RandomResizedCrop.getParams(21, 21, scripted([0, 0, 0, 0]), [0.25, 0.25], [1, 1])).toEqual({
      top: 0,
      left: 0,
      height: 10,
      width: 10,
    });
    // A rejected attempt (h = 104 > 100) draws no position; the second is accepted.
    const box = RandomResizedCrop.getParams(100, 200, scripted([0.5, 0.5, 0.25, 0.5, 0, 0.999]));
    expect(box).toEqual({ top: 0, left: 121, height: 79, width: 79 });
  });

  it('keeps its crops within the scale and ratio bounds over many draws', () => {
    const rrc = new RandomResizedCrop({ size: 224 });
    let minArea = 1;
    let maxArea = 0;
    let minRatio = Infinity;
    let maxRatio = 0;
    for (let i = 0; i < 3000; i++) {
      const b = rrc.getParams(375, 500, sampleRandom(1, 0, i));
      expect(
        b.top >= 0 && b.left >= 0 && b.top + b.height <= 375 && b.left + b.width <= 500 && b.height > 0 && b.width > 0,
      ).toBe(true);
      const area = (b.height * b.width) / (375 * 500);
      const ratio = b.width / b.height;
      // Rounding w and h to integers moves area and ratio a little past the bounds.
      expect(area).toBeGreaterThan(0.08 * 0.97);
      expect(area).toBeLessThanOrEqual(1);
      expect(ratio).toBeGreaterThan((3 / 4) * 0.98);
      expect(ratio).toBeLessThan((4 / 3) * 1.02);
      minArea = Math.min(minArea, area);
      maxArea = Math.max(maxArea, area);
      minRatio = Math.min(minRatio, ratio);
      maxRatio = Math.max(maxRatio, ratio);
    }
    expect(minArea).toBeLessThan(0.09);
    expect(maxArea).toBeGreaterThan(0.6);
    expect(minRatio).toBeLessThan(0.77);
    expect(maxRatio).toBeGreaterThan(1.3);
  });

  it('falls back to the central crop with the ratio clamped', () => {
    const r = sampleRandom(2, 0, 0);
    // scale [1, 1] on a 10x100 image: every attempt is taller than 10 pixels.
    expect(RandomResizedCrop.getParams(10, 100, r, [1, 1])).toEqual({ top: 0, left: 43, height: 10, width: 13 });
    expect(RandomResizedCrop.getParams(100, 10, r, [1, 1])).toEqual({ top: 43, left: 0, height: 13, width: 10 });
    const wide = scripted(new Array<number>(20).fill(0.999));
    expect(RandomResizedCrop.getParams(10, 10, wide, [1, 1], [0.5, 2])).toEqual({
      top: 0,
      left: 0,
      height: 10,
      width: 10,
    });
  });

  it('crops and resizes to size, in the decoder for a JPEG, like the decoded path', async () => {
    const pipeline = new Compose([new RandomResizedCrop({ size: [24, 32] })]);
    const full = await decodeImage(smallJpeg, 'a.jpg');
    for (let i = 0; i < 6; i++) {
      const a = (await pipeline.run(encoded(smallJpeg), sampleRandom(4, 0, i))).image;
      const b = (await pipeline.run(decoded(full), sampleRandom(4, 0, i))).image;
      expect([a.height, a.width, a.channels]).toEqual([24, 32, 3]);
      expect(a.data).toEqual(b.data);
    }
  });

  it('shrinks a large JPEG on load and keeps the crop where it was drawn', async () => {
    const pipeline = new Compose([new RandomResizedCrop({ size: 64, scale: [0.5, 1] }), new RandomHorizontalFlip()]);
    const full = await decodeImage(bigJpeg, 'big.jpg');
    let flips = 0;
    for (let i = 0; i < 6; i++) {
      const a = await pipeline.run(encoded(bigJpeg), sampleRandom(5, 0, i), { deferFlip: true });
      const b = await pipeline.run(decoded(full), sampleRandom(5, 0, i), { deferFlip: true });
      expect(a.flip).toBe(b.flip);
      expect(meanAbsDiff(a.image, b.image)).toBeLessThan(6);
      // Mirrored in the decoder, the result is the exact mirror image.
      const mirrored = await pipeline.run(encoded(bigJpeg), sampleRandom(5, 0, i));
      expect(mirrored.image.data).toEqual((a.flip ? hflip(a.image) : a.image).data);
      if (a.flip) flips++;
    }
    expect(flips).toBeGreaterThan(0);
  });
});

describe('ColorJitter', () => {
  it('with brightness only, scales every value by the factor (truncated, clipped)', async () => {
    const img = patterned(6, 7, 3);
    const out = (
      await new Compose([new ColorJitter({ brightness: [1.5, 1.5] })]).run(decoded(img), sampleRandom(0, 0, 0))
    ).image;
    expect(Array.from(out.data)).toEqual(Array.from(img.data, (v) => Math.min(255, Math.floor(v * 1.5))));
  });

  it('with contrast, blends with the rounded mean grey level', () => {
    const img: DecodedImage = { data: Uint8Array.from([10, 20, 30, 200, 100, 50]), height: 1, width: 2, channels: 3 };
    // Luma 18 and 124, mean 71; 71 + 0.5 * (v - 71), truncated.
    expect(Array.from(new ColorJitter({ contrast: [0.5, 0.5] }).apply(img, sampleRandom(0, 0, 0)).data)).toEqual([
      40, 45, 50, 135, 85, 60,
    ]);
  });

  it('with saturation 0, gives grey', () => {
    const img = patterned(5, 5, 3);
    const out = new ColorJitter({ saturation: [0, 0] }).apply(img, sampleRandom(0, 0, 0));
    for (let y = 0; y < 5; y++) {
      for (let x = 0; x < 5; x++) {
        const [r, g, b] = px(out, y, x) as [number, number, number];
        const [r0, g0, b0] = px(img, y, x) as [number, number, number];
        expect(g).toBe(r);
        expect(b).toBe(r);
        expect(Math.abs(r - (0.299 * r0 + 0.587 * g0 + 0.114 * b0))).toBeLessThanOrEqual(0.5);
      }
    }
  });

  it('shifts pure red by a third of a turn to green, and back by minus a third to blue', () => {
    const red: DecodedImage = { data: Uint8Array.from([255, 0, 0, 255, 0, 0]), height: 1, width: 2, channels: 3 };
    expect(Array.from(new ColorJitter({ hue: [1 / 3, 1 / 3] }).apply(red, sampleRandom(0, 0, 0)).data)).toEqual([
      0, 255, 0, 0, 255, 0,
    ]);
    expect(Array.from(new ColorJitter({ hue: [-1 / 3, -1 / 3] }).apply(red, sampleRandom(0, 0, 0)).data)).toEqual([
      0, 0, 255, 0, 0, 255,
    ]);
    // Two half turns come back to the start, up to rounding; grey pixels do not change.
    const img = patterned(6, 6, 3);
    const half = new ColorJitter({ hue: [0.5, 0.5] });
    const back = half.apply(half.apply(img, sampleRandom(0, 0, 0)), sampleRandom(0, 0, 0));
    expect(Math.max(...Array.from(img.data, (v, i) => Math.abs(v - back.data[i]!)))).toBeLessThanOrEqual(2);
    const grey = patterned(2, 2, 3, (y, x) => 40 * y + 10 * x);
    expect(half.apply(grey, sampleRandom(0, 0, 0)).data).toEqual(grey.data);
  });

  it("draws torchvision's ranges and a random order", () => {
    const jitter = new ColorJitter({ brightness: 0.4, contrast: 0.4, saturation: 1.5, hue: 0.1 });
    expect(jitter.spec()).toEqual({
      kind: 'ColorJitter',
      brightness: [0.6, 1.4],
      contrast: [0.6, 1.4],
      saturation: [0, 2.5],
      hue: [-0.1, 0.1],
    });
    // A drawn factor in [low, high) (null, for an adjustment left out, is not).
    const within = (factor: number | null, low: number, high: number) =>
      factor !== null && factor >= low && factor < high;
    const orders = new Set<string>();
    for (let i = 0; i < 200; i++) {
      const p = jitter.getParams(sampleRandom(1, 0, i));
      orders.add(p.order.join(''));
      expect([...p.order].sort()).toEqual([0, 1, 2, 3]);
      expect(within(p.brightness, 0.6, 1.4)).toBe(true);
      expect(within(p.saturation, 0, 2.5)).toBe(true);
      expect(within(p.hue, -0.1, 0.1)).toBe(true);
    }
    expect(orders.size).toBe(24);
    expect(new ColorJitter({ brightness: 0 }).brightness).toBeNull();
    expect(() => new ColorJitter({ hue: 0.6 })).toThrow(/hue/);
    expect(() => new ColorJitter({ brightness: -1 })).toThrow(code('ERR_RC_INVALID_ARGUMENT'));
  });
});

describe('RandomRotation', () => {
  it('rotates by 90 degrees counter-clockwise exactly (nearest)', async () => {
    const img = patterned(4, 4, 3);
    const out = (
      await new Compose([new RandomRotation({ degrees: [90, 90] })]).run(decoded(img), sampleRandom(0, 0, 0))
    ).image;
    // The right column becomes the top row.
    for (let y = 0; y < 4; y++) for (let x = 0; x < 4; x++) expect(px(out, y, x)).toEqual(px(img, x, 3 - y));
    const half = new RandomRotation({ degrees: [180, 180] }).apply(patterned(3, 5, 1), sampleRandom(0, 0, 0));
    for (let y = 0; y < 3; y++) {
      for (let x = 0; x < 5; x++) expect(px(half, y, x)).toEqual(px(patterned(3, 5, 1), 2 - y, 4 - x));
    }
  });

  it('keeps the size and fills the corners rotated in from outside', () => {
    const white = patterned(21, 21, 3, () => 255);
    for (const interpolation of ['nearest', 'bilinear'] as const) {
      const out = new RandomRotation({ degrees: [45, 45], fill: [1, 2, 3], interpolation }).apply(
        white,
        sampleRandom(0, 0, 0),
      );
      expect([out.height, out.width]).toEqual([21, 21]);
      expect(px(out, 0, 0)).toEqual([1, 2, 3]);
      expect(px(out, 10, 10)).toEqual([255, 255, 255]);
    }
    const rot = new RandomRotation({ degrees: 10 });
    for (let i = 0; i < 100; i++) {
      const a = rot.getParams(sampleRandom(0, 0, i));
      expect(a >= -10 && a < 10).toBe(true);
    }
  });
});

describe('Normalize, channels and sizes', () => {
  it('leaves the pixels alone and reports the mean and std', async () => {
    const mean = [0.485, 0.456, 0.406];
    const std = [0.229, 0.224, 0.225];
    const pipeline = new Compose([new Normalize({ mean: [0.5], std: [0.5] }), new Normalize({ mean, std })]);
    const img = patterned(5, 6, 3);
    expect((await pipeline.run(decoded(img), sampleRandom(0, 0, 0))).image.data).toEqual(img.data);
    expect(pipeline.normalization()).toEqual({ mean, std });
    expect(new Compose([new Normalize({ mean: [0.5], std: [0.25] })]).normalization()).toEqual({
      mean: [0.5, 0.5, 0.5],
      std: [0.25, 0.25, 0.25],
    });
    expect(new Compose([new CenterCrop({ size: 4 })]).normalization()).toBeNull();
    expect(() => new Normalize({ mean: [0.5, 0.5, 0.5], std: [0.2, 0, 0.2] })).toThrow(/std\[1\]/);
    expect(
      () => new Compose([new Normalize({ mean: [0.5, 0.5, 0.5], std: [1, 1, 1] })], { outputChannels: 1 }),
    ).toThrow(/Normalize mean/);
  });

  it('expands grey images to RGB, drops alpha, and converts to grey on request', async () => {
    const grey = patterned(3, 4, 1);
    const rgb = (await new Compose([]).run(decoded(grey), sampleRandom(0, 0, 0))).image;
    expect(rgb.channels).toBe(3);
    expect(px(rgb, 2, 3)).toEqual([px(grey, 2, 3)[0], px(grey, 2, 3)[0], px(grey, 2, 3)[0]]);
    expect(new ToRGB().apply(grey).data).toEqual(rgb.data);
    const rgba = patterned(3, 4, 4);
    const dropped = (await new Compose([new RandomHorizontalFlip({ p: 0 })]).run(decoded(rgba), sampleRandom(0, 0, 0)))
      .image;
    expect(px(dropped, 1, 2)).toEqual(px(rgba, 1, 2).slice(0, 3));
    const asGrey = (
      await new Compose([], { outputChannels: 1 }).run(decoded(patterned(3, 4, 3)), sampleRandom(0, 0, 0))
    ).image;
    expect(asGrey.channels).toBe(1);
    expect(new Grayscale({ numOutputChannels: 3 }).apply(patterned(2, 2, 3)).channels).toBe(3);
    // A grey PNG with alpha decodes to RGB.
    const png = await sharp(Buffer.from(patterned(6, 5, 2).data), { raw: { width: 5, height: 6, channels: 2 } })
      .png()
      .toBuffer();
    const fromPng = (
      await new Compose([new CenterCrop({ size: 4 })]).run(encoded(new Uint8Array(png), 'a.png'), sampleRandom(0, 0, 0))
    ).image;
    expect([fromPng.height, fromPng.width, fromPng.channels]).toEqual([4, 4, 3]);
  });

  it('knows the fixed output size when there is one', () => {
    expect(new Compose([new RandomResizedCrop({ size: 224 }), new RandomHorizontalFlip()]).fixedOutputSize()).toEqual([
      224, 224,
    ]);
    expect(
      new Compose([
        new Resize({ size: 256 }),
        new CenterCrop({ size: 224 }),
        new Normalize({ mean: [0], std: [1] }),
      ]).fixedOutputSize(),
    ).toEqual([224, 224]);
    expect(new Compose([new Resize({ size: [32, 48] }), new RandomRotation({ degrees: 5 })]).fixedOutputSize()).toEqual(
      [32, 48],
    );
    expect(new Compose([new Resize({ size: 256 })]).fixedOutputSize()).toBeNull();
    expect(new Compose([new Resize({ size: 256 })]).outputSize([375, 500])).toEqual([256, 341]);
    expect(new Compose([new ColorJitter({ brightness: 0.1 })]).fixedOutputSize()).toBeNull();
  });
});

describe('seeding, specs and errors', () => {
  const pipeline = () =>
    new Compose([
      new RandomResizedCrop({ size: 32 }),
      new RandomHorizontalFlip(),
      new ColorJitter({ brightness: 0.4, contrast: 0.4, saturation: 0.4, hue: 0.1 }),
      new RandomRotation({ degrees: 15, interpolation: 'bilinear' }),
      new Normalize({ mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225] }),
    ]);

  it('gives identical outputs for the same (seed, epoch, index) and different ones otherwise', async () => {
    const p = pipeline();
    for (const sample of [decoded(patterned(48, 64, 3)), encoded(smallJpeg)]) {
      const a = await p.run(sample, sampleRandom(3, 1, 10));
      const b = await p.run(sample, sampleRandom(3, 1, 10));
      expect(a.image.data).toEqual(b.image.data);
      expect((await p.run(sample, sampleRandom(3, 1, 11))).image.data).not.toEqual(a.image.data);
      expect((await p.run(sample, sampleRandom(3, 2, 10))).image.data).not.toEqual(a.image.data);
    }
    const boxes = new Set(
      Array.from({ length: 10 }, (_, i) =>
        JSON.stringify(new RandomResizedCrop({ size: 8 }).getParams(100, 100, sampleRandom(3, 0, i))),
      ),
    );
    expect(boxes.size).toBe(10);
  });

  it('round-trips every spec, also through structured cloning, and rebuilds the same pipeline', async () => {
    const transforms: Transform[] = [
      new RandomResizedCrop({ size: [20, 30], scale: [0.2, 0.9], ratio: [0.5, 2], interpolation: 'bicubic' }),
      new RandomHorizontalFlip({ p: 0.3 }),
      new ColorJitter({ brightness: 0.2, hue: [-0.05, 0.1] }),
      new RandomRotation({ degrees: [-5, 20], fill: 9 }),
      new Resize({ size: 40, interpolation: 'lanczos', maxSize: 60 }),
      new CenterCrop({ size: 16 }),
      new Normalize({ mean: [0.1, 0.2, 0.3], std: [0.4, 0.5, 0.6] }),
      new ToRGB(),
      new Grayscale({ numOutputChannels: 3 }),
    ];
    for (const t of transforms) {
      expect(transformFromSpec(structuredClone(t.spec())).spec()).toEqual(t.spec());
      expect(transformFromSpec(t.spec())).toBeInstanceOf(t.constructor);
    }
    const compose = new Compose(transforms, { outputChannels: 3 });
    const spec = compose.spec();
    expect(Compose.fromSpec(structuredClone(spec)).spec()).toEqual(spec);
    expect(Compose.fromSpec(transforms.map((t) => t.spec())).spec()).toEqual(spec);
    const p = pipeline();
    const rebuilt = Compose.fromSpec(structuredClone(p.spec()));
    const img = patterned(48, 64, 3);
    expect((await rebuilt.run(decoded(img), sampleRandom(1, 0, 5))).image.data).toEqual(
      (await p.run(decoded(img), sampleRandom(1, 0, 5))).image.data,
    );
    expect(rebuilt.normalization()).toEqual(p.normalization());
    expect(() => transformFromSpec({ kind: 'RandomErasing' })).toThrow(/RandomResizedCrop/);
    expect(() => transformFromSpec({ kind: 'Resize', size: 10, antialias: true })).toThrow(
      /Unknown option 'antialias'/,
    );
  });

  it('names the file and the reason of a corrupt JPEG', async () => {
    const truncated = smallJpeg.subarray(0, Math.floor(smallJpeg.length / 2));
    expect(addon().jpegHeader({ bytes: truncated })).toEqual({ height: 75, width: 100, channels: 3, supported: true });
    for (const p of [pipeline(), new Compose([new RandomHorizontalFlip()]), new Compose([])]) {
      const err = await p
        .run(encoded(truncated, 'train/n01/broken.jpg'), sampleRandom(0, 0, 0))
        .catch((e: unknown) => e);
      expect(err).toEqual(code('ERR_RC_CORRUPT_FILE'));
      expect((err as Error).message).toMatch(/train\/n01\/broken\.jpg.*premature end/i);
    }
    // Also when the crop lies in the part of the file that is intact.
    const mostly = smallJpeg.subarray(0, Math.floor(smallJpeg.length * 0.9));
    const crop = new Compose([new RandomResizedCrop({ size: 8, scale: [0.01, 0.02] })]);
    for (let i = 0; i < 10; i++) {
      await expect(crop.run(encoded(mostly, 'b.jpg'), sampleRandom(0, 0, i))).rejects.toThrow(
        code('ERR_RC_CORRUPT_FILE'),
      );
    }
    for (const p of [pipeline(), new Compose([])]) {
      const empty = await p
        .run(encoded(new Uint8Array(0), 'x/empty.jpg'), sampleRandom(0, 0, 0))
        .catch((e: unknown) => e);
      expect(empty).toEqual(code('ERR_RC_CORRUPT_FILE'));
      expect((empty as Error).message).toMatch(/x\/empty\.jpg.*empty/);
    }
    const garbage = await new Compose([])
      .run(encoded(new TextEncoder().encode('not an image'), 'x/y.jpg'), sampleRandom(0, 0, 0))
      .catch((e: unknown) => e);
    expect(garbage).toEqual(code('ERR_RC_CORRUPT_FILE'));
    expect((garbage as Error).message).toMatch(/x\/y\.jpg.*unsupported image format/);
  });

  it('rejects bad options and inputs', async () => {
    expect(() => new RandomResizedCrop({ size: 0 })).toThrow(/size/);
    expect(() => new RandomResizedCrop({ size: 8, scale: [1, 0.5] })).toThrow(/scale/);
    expect(() => new RandomResizedCrop({ size: 8, interpolation: 'area' as 'nearest' })).toThrow(/interpolation/);
    expect(() => new RandomHorizontalFlip({ p: 2 })).toThrow(/p/);
    expect(() => new Resize({ size: [4, 4], maxSize: 9 })).toThrow(/maxSize/);
    // A plain object where a Transform belongs, as a JavaScript caller could pass.
    expect(() => new Compose([{} as never])).toThrow(/transforms\[0\]/);
    await expect(
      new Compose([]).run(
        decoded({ data: new Uint8Array(5), height: 2, width: 2, channels: 3 }),
        sampleRandom(0, 0, 0),
      ),
    ).rejects.toThrow(/12 bytes/);
  });
});
