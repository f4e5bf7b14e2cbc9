/**
 * The native image code behind the transforms: PIL's resampling (checked against outputs of
 * Pillow 13.0's Image.resize on known images) and the JPEG decoder that decodes only the region a
 * crop and resize read (checked against a full decode followed by the same resampling).
 */
import sharp from 'sharp';
import { beforeAll, describe, expect, it } from 'vitest';
import { addon, type RawImage, type RawJpegRequest } from '../lib/binding.js';
import { sampleRandom } from '../lib/data/sample-random.js';
import { Compose, RandomResizedCrop, Resize } from '../lib/data/transforms.js';
import { decodeImage } from '../lib/data/transforms/decode.js';
import { resizedCrop } from '../lib/data/transforms/functional.js';
import type { DecodedImage } from '../lib/data/types.js';
import { photo } from './helpers/photo.js';

type Filter = 'nearest' | 'bilinear' | 'bicubic' | 'lanczos';
const code = (c: string): unknown => expect.objectContaining({ code: c });

/** The addon's decode of a grey, YCbCr or RGB JPEG (the colour spaces it does not hand to sharp). */
function decodeJpeg(request: RawJpegRequest): RawImage {
  const image = addon().jpegDecode(request);
  if (image === null) throw new Error('jpegDecode handed a grey, YCbCr or RGB JPEG back to sharp');
  return image;
}

/** The test image of the PIL cases: byte (y, x, c) = (31 y + 7 x + 101 c) mod 256. */
function patterned(height: number, width: number, channels: number): DecodedImage {
  const data = new Uint8Array(height * width * channels);
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      for (let c = 0; c < channels; c++) data[(y * width + x) * channels + c] = (y * 31 + x * 7 + c * 101) & 255;
    }
  }
  return { data, height, width, channels };
}

function mirrored(data: Uint8Array, height: number, width: number, channels: number): Uint8Array {
  const out = new Uint8Array(data.length);
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      for (let c = 0; c < channels; c++) {
        out[(y * width + x) * channels + c] = data[(y * width + width - 1 - x) * channels + c]!;
      }
    }
  }
  return out;
}

/**
 * Pillow 13.0.0: `Image.fromarray(patterned(...)).crop((left, top, left + w, top + h))
 * .resize((ow, oh), filter)` (mode L for one channel), the bytes in base64. The window case is a
 * resize to 8x12 followed by the crop of rows 2..6 and columns 3..9. Three cases take Pillow's
 * vertical pass first (its first pass is rounded to uint8, so a wrong order is off by one).
 */
const PIL_CASES: {
  name: string;
  source: [number, number, number];
  box?: [number, number, number, number] | null;
  size: [number, number];
  window?: [number, number, number, number];
  filter: Filter;
  expected: string;
}[] = [
  {
    name: 'bilinear down',
    source: [11, 17, 3],
    box: null,
    size: [5, 7],
    filter: 'bilinear',
    expected:
      'IIW5L5ShQKVsUbY4Yscsc8s9grhMXME8a8tDfLRGjZ1XnmNor2F5vjuIok9ssVh7vTqMxD+dp0muqFq8aGnEwE2ymly/b23ASn63M4+UO6CJSq9MSImMNZiRRKlPVbpBZsswd9dBhqJQ',
  },
  {
    name: 'bicubic down, cropped',
    source: [11, 17, 3],
    box: [1, 2, 9, 13],
    size: [4, 6],
    filter: 'bicubic',
    expected: 'RrNqVcQjZNUudL4+g8NNkqBcirlMmn9hsGBxvzWCyzCR2jqjzTGbzD2vnUrChmHGRHLUV4K/PHnjQYiuJ5eVOKdOSbZAWMU8',
  },
  {
    name: 'lanczos down, grey',
    source: [11, 17, 1],
    box: null,
    size: [3, 8],
    filter: 'lanczos',
    expected: 'KTtMY3SLmaissrerpoqYbIVaWkFJR1dm',
  },
  {
    name: 'bilinear up',
    source: [4, 5, 3],
    box: null,
    size: [9, 7],
    filter: 'bilinear',
    expected:
      'AGXKBGnOCW7TDnPYE3jdGH3iHIHmBWrPCW7TDnPYE3jdGH3iHYLVIYbAE3jdF3zhHIHmIYbrJovwK5CyL5RcIYbcJYrgKo/lL5TqNJnvOZ6NPaIHL5R5M5h9OJ2CPaKHQqeMR6xaS7AVPKEVQKUZRaoeSq8jT7QoVLkmWL0iSq8UTrMYU7gdWL0iXcInYscsZsswWL0iXMEmYcYrZsswa9A1cNU6dNk+XcInYcYrZsswa9A1cNU6ddo/ed5D',
  },
  {
    name: 'bicubic up, grey',
    source: [4, 5, 1],
    box: null,
    size: [7, 11],
    filter: 'bicubic',
    expected:
      'AAACBgkMDxIWGRsICQwQExYZHCAjJRweISUoKy4xNTg6LTAzNzo9QENHSkw/QURIS05RVFhbXVRWWV1gY2ZpbXByXmBjZ2ptcHN3enw=',
  },
  {
    name: 'lanczos up, cropped',
    source: [6, 7, 3],
    box: [1, 1, 4, 5],
    size: [9, 10],
    filter: 'lanczos',
    expected:
      'Iof/JIn/KI3/LJH/MJX/MpflNps/Op8APqMAQKUUKI3TKo/TLpPSMpfiNpvjOJ21PKE2QKQDRKgERqoYNJlqNptrOp9tPqN3Qqd5RKpkSK4qTLAUULAWUrAgRqsFSK0HTLELULUPVLkTVrsXWr8iXsQoYsotZMwuVLkAVrsAWr8AXsMCYsgHZMcQaMwqbNo2cPI7cvw6YcYoY8gqZ8wua9Ayb9Q2cdY4ddo+eeFDfetHf+9Jc9hEddpFed5JfeFOgeJSg+tSh+1Si9RUj51YkYhbf+RKgeZMhepQie1UjetYj/tak/xel8Nhm0plnRxnhepPh+xRi/BVj/JZk+9dlf9fmf9jnbhnoRprowBt',
  },
  {
    name: 'nearest down',
    source: [11, 17, 3],
    box: null,
    size: [5, 4],
    filter: 'nearest',
    expected: 'LZL3Sa4TZcovgeZLa9A1h+xRowhtvySJqQ5zxSqP4Uar/WLH50yxA2jNH4TpO6AFJYrvQaYLXcIned5D',
  },
  {
    name: 'nearest up, cropped',
    source: [6, 7, 1],
    box: [2, 1, 4, 5],
    size: [9, 7],
    filter: 'nearest',
    expected: 'RUxMU1paYUVMTFNaWmFka2tyeXmAZGtrcnl5gIOKipGYmJ+DioqRmJifg4qKkZiYn6KpqbC3t76iqamwt7e+',
  },
  {
    name: 'bilinear, width up and height down',
    source: [11, 5, 3],
    box: null,
    size: [4, 9],
    filter: 'bilinear',
    expected:
      'JImYJouaKo+eLpOiMpemNpuqOp+jPqNwQKVRcZo/c5xBd6BFe6RJf6hNg6xRh7BUi7RWjbZXwTePwzmRxz2VukGZqEWdrEmhsE2ltFGptlOraHeVanmXbn2bV4GfOIWjPImnQI2rRJGvRpOx',
  },
  {
    name: 'bicubic, height only',
    source: [11, 6, 3],
    box: null,
    size: [4, 6],
    filter: 'bicubic',
    expected: 'HYmbJJCiK5epMp6wOaVTQLFab6I0dqk7gbBCiLdJj75OlmxVzCuY0zKfsTmmuECtv0e0xkS5ZX2TbISaL4uhNpKoPZmvRKFS',
  },
  {
    name: 'bicubic, vertical pass first, cropped',
    source: [12, 10, 3],
    box: [1, 1, 10, 8],
    size: [4, 11],
    filter: 'bicubic',
    expected:
      'P69jQ7NnSLhvTb1vUsMtWMQcXcUnYsssZ9AxbNU2cNk6iYpMkY5QmpNVnphao6RlqHFsrj5yt0p3vE98wVSBxViF3TSrvDivpj20r0K5tEe/wE/ArVbBY1vHYmDMa2XRb2nVYYmUPY2YJZKdLpeiM5yvOaJ3PKc+PKxLQbFQRrZVSrpZ',
  },
  {
    name: 'lanczos, vertical pass first, grey',
    source: [30, 20, 1],
    box: null,
    size: [5, 18],
    filter: 'lanczos',
    expected:
      'YWdrcnx7fIWMfoWNmY2DkZl6lJF1hY98dICGcXh8hIJ1eYN/f4qGcX+PdnSAkI5xgY9+dYGKfoeMgXyEi3d4gIuIcXuLc3F9aG98d2dzfXBye4SHhY6UnISF',
  },
  {
    name: 'window',
    source: [11, 17, 3],
    size: [8, 12],
    window: [2, 3, 4, 6],
    filter: 'bilinear',
    expected: 'es1EhMJOjsxYmG9ioj1srEd2pmJwsB56uiiExCyOzjOY2D2izjOY0j2i2Ues2lG2bFvAYWXKxF/EVGnONXPYPH2/J4e2LJHA',
  },
];

const encodings: Record<string, Uint8Array> = {};
let big: Uint8Array;

beforeAll(async () => {
  const [h, w] = [75, 101];
  const raw = () => sharp(photo(h, w), { raw: { width: w, height: h, channels: 3 } });
  encodings['4:2:0'] = new Uint8Array(await raw().jpeg({ quality: 90 }).toBuffer());
  encodings['4:4:4'] = new Uint8Array(await raw().jpeg({ quality: 90, chromaSubsampling: '4:4:4' }).toBuffer());
  encodings.progressive = new Uint8Array(await raw().jpeg({ quality: 85, progressive: true }).toBuffer());
  const rgb = photo(h, w);
  const grey = Buffer.alloc(h * w);
  for (let i = 0; i < h * w; i++) grey[i] = (rgb[3 * i]! + rgb[3 * i + 1]! + rgb[3 * i + 2]!) / 3;
  encodings.grey = new Uint8Array(
    await sharp(grey, { raw: { width: w, height: h, channels: 1 } })
      .toColourspace('b-w')
      .jpeg({ quality: 90 })
      .toBuffer(),
  );
  big = new Uint8Array(
    await sharp(photo(900, 1200), { raw: { width: 1200, height: 900, channels: 3 } })
      .jpeg({ quality: 90 })
      .toBuffer(),
  );
});

function meanAbsDiff(a: Uint8Array, b: Uint8Array): number {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += Math.abs(a[i]! - b[i]!);
  return s / a.length;
}

describe('resampling (PIL semantics)', () => {
  it.each(PIL_CASES)("gives Pillow's bytes: $name", ({ source, box, size, window, filter, expected }) => {
    const [h, w, c] = source;
    const img = patterned(h, w, c);
    const b = box ?? [0, 0, h, w];
    const want = new Uint8Array(Buffer.from(expected, 'base64'));
    const out = addon().imageResample({
      data: img.data,
      height: h,
      width: w,
      channels: c,
      box: [b[1], b[0], b[1] + b[3], b[0] + b[2]],
      size,
      ...(window ? { window } : {}),
      filter,
    });
    expect(new Uint8Array(out)).toEqual(want);
    const [oh, ow] = window ? [window[2], window[3]] : size;
    const flipped = addon().imageResample({
      data: img.data,
      height: h,
      width: w,
      channels: c,
      box: [b[1], b[0], b[1] + b[3], b[0] + b[2]],
      size,
      ...(window ? { window } : {}),
      filter,
      mirror: true,
    });
    expect(new Uint8Array(flipped)).toEqual(mirrored(want, oh, ow, c));
    if (!window) {
      // The transforms' entry point, with the crop box in torchvision's order.
      const viaTransform = resizedCrop(img, { top: b[0], left: b[1], height: b[2], width: b[3] }, size, filter);
      expect([viaTransform.height, viaTransform.width, viaTransform.channels]).toEqual([size[0], size[1], c]);
      expect(viaTransform.data).toEqual(want);
    }
  });

  it('keeps a constant image constant and copies a same-size box', () => {
    const flat = { data: new Uint8Array(30 * 40 * 3).fill(77), height: 30, width: 40, channels: 3 };
    for (const filter of ['bilinear', 'bicubic', 'lanczos', 'nearest'] as const) {
      for (const size of [
        [7, 9],
        [61, 83],
        [30, 11],
      ] as [number, number][]) {
        expect(new Set(resizedCrop(flat, { top: 3, left: 5, height: 20, width: 30 }, size, filter).data)).toEqual(
          new Set([77]),
        );
      }
    }
    const img = patterned(12, 20, 3);
    const copy = addon().imageResample({
      data: img.data,
      height: 12,
      width: 20,
      channels: 3,
      box: [4, 2, 14, 10],
      size: [8, 10],
    });
    const expected: number[] = [];
    for (let y = 2; y < 10; y++) expected.push(...img.data.subarray((y * 20 + 4) * 3, (y * 20 + 14) * 3));
    expect(Array.from(copy)).toEqual(expected);
  });

  it('rejects a box outside the image, a window outside the output and bad arguments', () => {
    const img = patterned(10, 12, 3);
    const base = { data: img.data, height: 10, width: 12, channels: 3, size: [5, 5] as [number, number] };
    expect(() => addon().imageResample({ ...base, box: [0, 0, 13, 10] })).toThrow(code('ERR_RC_INVALID_ARGUMENT'));
    expect(() => addon().imageResample({ ...base, box: [5, 0, 5, 10] })).toThrow(/x0 < x1/);
    expect(() => addon().imageResample({ ...base, box: [0, 0, 12, 10], window: [3, 0, 3, 5] })).toThrow(
      /window inside the 5x5 output/,
    );
    expect(() => addon().imageResample({ ...base, box: [0, 0, 12, 10], size: [0, 5] })).toThrow(/output size/);
    expect(() => addon().imageResample({ ...base, box: [0, 0, 12, 10], filter: 'box' as Filter })).toThrow(
      /'nearest', 'bilinear', 'bicubic' or 'lanczos'/,
    );
    expect(() => addon().imageResample({ ...base, height: 11, box: [0, 0, 12, 10] })).toThrow(/fewer than 11x12x3/);
    expect(() => addon().imageResample({ ...base, channels: 5, box: [0, 0, 12, 10] })).toThrow(/1 to 4 channels/);
  });
});

describe('JPEG decoding', () => {
  it("decodes whole images to sharp's (libvips') pixels", async () => {
    for (const [name, bytes] of Object.entries(encodings)) {
      const mine = decodeJpeg({ bytes });
      const theirs = await sharp(bytes).raw().toBuffer({ resolveWithObject: true });
      expect([name, mine.height, mine.width, mine.channels]).toEqual([
        name,
        theirs.info.height,
        theirs.info.width,
        name === 'grey' ? 1 : 3,
      ]);
      // sharp hands grey back as three equal channels.
      const ref =
        name === 'grey' ? new Uint8Array(theirs.data).filter((_, i) => i % 3 === 0) : new Uint8Array(theirs.data);
      expect(new Uint8Array(mine.data)).toEqual(ref);
      expect(addon().jpegHeader({ bytes })).toEqual({
        height: 75,
        width: 101,
        channels: name === 'grey' ? 1 : 3,
        supported: true,
      });
    }
    expect(addon().libjpegTurboVersion).toMatch(/^\d+\.\d+\.\d+$/);
  });

  it('decodes only the region a crop and resize read, to the same bytes as the full decode', () => {
    // Offsets on the 16-pixel MCU grid and next to it (where libjpeg's upsampling needs the
    // neighbouring row or column), odd sizes, the edges, up- and downscaling, mirrored or not.
    const boxes: [number, number, number, number][] = [
      [16, 16, 40, 48],
      [32, 32, 20, 20],
      [15, 17, 33, 31],
      [0, 0, 75, 101],
      [74, 100, 1, 1],
      [40, 3, 35, 98],
      [1, 64, 60, 37],
    ];
    const sizes: [number, number][] = [
      [24, 32],
      [13, 7],
      [90, 120],
      [1, 1],
    ];
    const filters: Filter[] = ['bilinear', 'bicubic', 'lanczos', 'nearest'];
    let n = 0;
    for (const [name, bytes] of Object.entries(encodings)) {
      const full = decodeJpeg({ bytes });
      for (const [i, box] of boxes.entries()) {
        for (const [j, size] of sizes.entries()) {
          const filter = filters[(i + j) % 4]!;
          const mirror = (i + j) % 3 === 0;
          const got = decodeJpeg({ bytes, crop: box, size, filter, mirror, dctScaling: false });
          const [top, left, h, w] = box;
          const want = addon().imageResample({
            data: full.data,
            height: full.height,
            width: full.width,
            channels: full.channels,
            box: [left, top, left + w, top + h],
            size,
            filter,
            mirror,
          });
          expect([name, box, size, got.height, got.width]).toEqual([name, box, size, size[0], size[1]]);
          expect(new Uint8Array(got.data)).toEqual(new Uint8Array(want));
          n++;
        }
        // A plain crop (no resize) is the decoded pixels themselves.
        const crop = decodeJpeg({ bytes, crop: box });
        const [top, left, h, w] = box;
        const rows: number[] = [];
        for (let y = top; y < top + h; y++) {
          rows.push(
            ...full.data.subarray((y * full.width + left) * full.channels, (y * full.width + left + w) * full.channels),
          );
        }
        expect(Array.from(crop.data)).toEqual(rows);
      }
      // A window of the resized image (Resize + CenterCrop).
      const win = decodeJpeg({ bytes, size: [64, 86], window: [20, 30, 40, 50] });
      const whole = decodeJpeg({ bytes, size: [64, 86] });
      const rows: number[] = [];
      for (let y = 20; y < 60; y++) {
        rows.push(...whole.data.subarray((y * 86 + 30) * whole.channels, (y * 86 + 80) * whole.channels));
      }
      expect(Array.from(win.data)).toEqual(rows);
    }
    expect(n).toBe(4 * 7 * 4);
  });

  it('starts a 4x or larger reduction at 1/2, 1/4 or 1/8 scale in the DCT domain, close to the full decode', () => {
    const cases: { crop: [number, number, number, number]; size: [number, number] }[] = [
      { crop: [0, 0, 900, 1200], size: [150, 200] }, // 6x: decoded at 1/2
      { crop: [100, 240, 800, 800], size: [64, 64] }, // 12.5x: 1/4
      { crop: [0, 0, 900, 1200], size: [40, 50] }, // 22x: 1/8
      { crop: [450, 600, 300, 400], size: [224, 224] }, // 1.3x: full size either way
    ];
    for (const { crop, size } of cases) {
      const fast = decodeJpeg({ bytes: big, crop, size });
      const exact = decodeJpeg({ bytes: big, crop, size, dctScaling: false });
      expect([fast.height, fast.width]).toEqual(size);
      expect(meanAbsDiff(fast.data, exact.data)).toBeLessThan(2);
      if (size[0] === 224) expect(fast.data).toEqual(exact.data);
    }
  });

  it('hands CMYK JPEGs to sharp, and the transforms still crop and resize them', async () => {
    const cmyk = new Uint8Array(
      await sharp(photo(75, 101), { raw: { width: 101, height: 75, channels: 3 } })
        .toColourspace('cmyk')
        .jpeg({ quality: 90 })
        .toBuffer(),
    );
    expect(addon().jpegHeader({ bytes: cmyk }).supported).toBe(false);
    expect(addon().jpegDecode({ bytes: cmyk })).toBeNull();
    const rgb = await decodeImage(encodings['4:4:4']!, 'rgb.jpg');
    const viaSharp = await decodeImage(cmyk, 'cmyk.jpg');
    expect([viaSharp.height, viaSharp.width, viaSharp.channels]).toEqual([75, 101, 3]);
    expect(meanAbsDiff(viaSharp.data, rgb.data)).toBeLessThan(20);
    const out = await new Compose([new RandomResizedCrop({ size: 24 })]).run(
      { source: { kind: 'encoded', bytes: cmyk, path: 'cmyk.jpg' }, label: 0 },
      sampleRandom(0, 0, 0),
    );
    expect([out.image.height, out.image.width, out.image.channels]).toEqual([24, 24, 3]);
    const resized = await new Compose([new Resize({ size: 30 })]).run(
      { source: { kind: 'encoded', bytes: cmyk, path: 'cmyk.jpg' }, label: 0 },
      sampleRandom(0, 0, 0),
    );
    expect([resized.image.height, resized.image.width]).toEqual([30, 40]);
  });

  it('reports broken data and a crop outside the image', () => {
    const bytes = encodings['4:2:0']!;
    expect(() => addon().jpegDecode({ bytes: new TextEncoder().encode('not a jpeg') })).toThrow(
      code('ERR_RC_CORRUPT_FILE'),
    );
    expect(() => addon().jpegDecode({ bytes: new Uint8Array(0) })).toThrow(code('ERR_RC_CORRUPT_FILE'));
    expect(() => addon().jpegDecode({ bytes: bytes.subarray(0, bytes.length >> 1) })).toThrow(
      /Premature end of JPEG file/,
    );
    expect(() => addon().jpegHeader({ bytes: bytes.subarray(0, 10) })).toThrow(code('ERR_RC_CORRUPT_FILE'));
    expect(() => addon().jpegDecode({ bytes, crop: [10, 10, 70, 20] })).toThrow(
      /crop 70x20 at \(10, 10\) is not inside the 75x101 image/,
    );
    expect(() => addon().jpegDecode({ bytes, crop: [0, 0, 10, 10], size: [5, 5], window: [0, 0, 6, 5] })).toThrow(
      code('ERR_RC_INVALID_ARGUMENT'),
    );
    expect(() =>
      addon().jpegDecode({ bytes, crop: [0, 0, 10] as unknown as [number, number, number, number] }),
    ).toThrow(/'crop' must have 4 values/);
    expect(() => addon().jpegDecode({ bytes: Array.from(bytes) as unknown as Uint8Array })).toThrow(
      /'bytes' must be a Uint8Array/,
    );
  });

  it('refuses a frame header that claims more pixels than the data holds, or more than the pixel limit, naming the file', async () => {
    const bytes = encodings['4:2:0']!;
    const claiming = (height: number, width: number): Uint8Array => {
      const edited = bytes.slice();
      let i = 2;
      while (edited[i + 1] !== 0xc0) i += 2 + ((edited[i + 2]! << 8) | edited[i + 3]!);
      edited.set([height >> 8, height & 255, width >> 8, width & 255], i + 5);
      return edited;
    };
    // libjpeg meets the end-of-image marker inside the data it still needs ("premature end of data segment").
    expect(() => addon().jpegDecode({ bytes: claiming(2000, 3000) })).toThrow(/Corrupt JPEG data/);
    expect(() => addon().jpegDecode({ bytes: claiming(20000, 20000) })).toThrow(/20000x20000 pixels, over the limit/);
    for (const [h, w] of [
      [2000, 3000],
      [20000, 20000],
    ] as const) {
      for (const pipeline of [
        new Compose([]),
        new Compose([new RandomResizedCrop({ size: 24 })]),
        new Compose([new Resize({ size: 32 })]),
      ]) {
        const run = pipeline.run(
          { source: { kind: 'encoded', bytes: claiming(h, w), path: 'edited/frame.jpg' }, label: 0 },
          sampleRandom(0, 0, 0),
        );
        const namesTheFile: unknown = expect.stringContaining('edited/frame.jpg');
        await expect(run).rejects.toMatchObject({ code: 'ERR_RC_CORRUPT_FILE', message: namesTheFile });
      }
    }
  });
});
