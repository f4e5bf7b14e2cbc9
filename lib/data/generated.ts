/**
 * A generated, learnable image dataset: coloured shapes of random size, position and tint on a
 * noisy background, one class per shape. Seeded, so the same seed gives the same images. It is
 * the built-in dataset for the demo and the tests.
 * @packageDocumentation
 */
import { expectInt, expectOptions } from '../errors.js';
import { Random } from '../random.js';

/** The shapes drawn, in class-index order. */
export const SHAPE_CLASSES = ['square', 'circle', 'triangle', 'cross', 'ring', 'bar'] as const;

/** Options of {@link generateShapes}. */
export interface GenerateShapesOptions {
  /** Number of images. */
  count: number;
  /** Image height and width in pixels; default 32. */
  size?: number;
  /** Number of classes, 2 to 6 (the first entries of {@link SHAPE_CLASSES}); default 4. */
  classes?: number;
  /** Seed; random when omitted. */
  seed?: number;
}

/** A batch of generated images. */
export interface GeneratedImages {
  /** `count * size * size * 3` bytes, NHWC, RGB. */
  images: Uint8Array;
  /** Class index per image. */
  labels: Int32Array;
  /** `[count, size, size, 3]`. */
  shape: [number, number, number, number];
  /** Class names by index. */
  classNames: string[];
}

/** One of {@link SHAPE_CLASSES}. */
export type ShapeClass = (typeof SHAPE_CLASSES)[number];

function inside(kind: ShapeClass, dx: number, dy: number, r: number): boolean {
  const ax = Math.abs(dx);
  const ay = Math.abs(dy);
  switch (kind) {
    case 'square':
      return ax <= r && ay <= r;
    case 'circle':
      return dx * dx + dy * dy <= r * r;
    case 'triangle':
      return dy <= r && dy >= -r && ax <= (dy + r) / 2;
    case 'cross':
      return (ax <= r / 3 && ay <= r) || (ay <= r / 3 && ax <= r);
    case 'ring': {
      const d = Math.sqrt(dx * dx + dy * dy);
      return d <= r && d >= r * 0.55;
    }
    case 'bar':
      return ax <= r && ay <= r / 4;
  }
}

/**
 * Draws one image of `kind` into `out` at byte `offset` (`size * size * 3` bytes, HWC, RGB),
 * drawing its background, tint, size, position and noise from `rng`. {@link generateShapes} feeds
 * it one stream for the whole batch, `ShapesDataset` a stream per index, so the two share the
 * drawing but not the images.
 */
export function drawShape(out: Uint8Array, offset: number, size: number, kind: ShapeClass, rng: Random): void {
  const background = [rng.uniform(20, 110), rng.uniform(20, 110), rng.uniform(20, 110)];
  const colour = [rng.uniform(140, 255), rng.uniform(140, 255), rng.uniform(140, 255)];
  const r = rng.uniform(0.2, 0.38) * size;
  const cx = rng.uniform(r, size - r);
  const cy = rng.uniform(r, size - r);
  for (let y = 0; y < size; y++) {
    for (let x = 0; x < size; x++) {
      const on = inside(kind, x + 0.5 - cx, y + 0.5 - cy, r);
      const p = offset + (y * size + x) * 3;
      for (let c = 0; c < 3; c++) {
        const v = (on ? colour[c]! : background[c]!) + rng.normal() * 18;
        out[p + c] = v < 0 ? 0 : v > 255 ? 255 : Math.round(v);
      }
    }
  }
}

/** Draws `count` labelled images; classes are balanced and shuffled. */
export function generateShapes(options: GenerateShapesOptions): GeneratedImages {
  const o = expectOptions<GenerateShapesOptions>('generateShapes options', options, [
    'count',
    'size',
    'classes',
    'seed',
  ]);
  const count = expectInt('count', o.count, 1);
  const size = expectInt('size', o.size ?? 32, 8, 4096);
  const classes = expectInt('classes', o.classes ?? 4, 2, SHAPE_CLASSES.length);
  const rng = new Random(o.seed === undefined ? undefined : expectInt('seed', o.seed));
  const images = new Uint8Array(count * size * size * 3);
  const labels = new Int32Array(count);
  for (let i = 0; i < count; i++) labels[i] = i % classes;
  for (let i = count - 1; i > 0; i--) {
    const j = rng.int(i + 1);
    const t = labels[i]!;
    labels[i] = labels[j]!;
    labels[j] = t;
  }
  for (let i = 0; i < count; i++) drawShape(images, i * size * size * 3, size, SHAPE_CLASSES[labels[i]!]!, rng);
  return { images, labels, shape: [count, size, size, 3], classNames: SHAPE_CLASSES.slice(0, classes) };
}
