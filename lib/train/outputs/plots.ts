/**
 * Training plots as PNG files, drawn into an RGBA buffer here and encoded by sharp, so no plotting
 * library or font is needed: curves (loss, accuracy, learning rate) with axes, ticks and a legend,
 * and a confusion-matrix heat map. Text uses a built-in 5x7 bitmap font of upper-case letters,
 * digits and common punctuation; lower case is drawn in upper case.
 * @packageDocumentation
 */
import { mkdir, rename, unlink, writeFile } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { expectInt, expectOptions, invalid, isArray } from '../../errors.js';
import { ConfusionMatrix } from '../metrics.js';

// 5x7 glyphs, one hex byte per row from top to bottom, bit 4 the leftmost column (the classic
// HD44780 character-ROM shapes).
const FONT: Record<string, string> = {
  '0': '0e11131519110e',
  '1': '040c040404040e',
  '2': '0e11010204081f',
  '3': '1f02040201110e',
  '4': '02060a121f0202',
  '5': '1f101e0101110e',
  '6': '0608101e11110e',
  '7': '1f010204080808',
  '8': '0e11110e11110e',
  '9': '0e11110f01020c',
  A: '0e1111111f1111',
  B: '1e11111e11111e',
  C: '0e11101010110e',
  D: '1c12111111121c',
  E: '1f10101e10101f',
  F: '1f10101e101010',
  G: '0e11101711110f',
  H: '1111111f111111',
  I: '0e04040404040e',
  J: '0702020202120c',
  K: '11121418141211',
  L: '1010101010101f',
  M: '111b1515111111',
  N: '11111915131111',
  O: '0e11111111110e',
  P: '1e11111e101010',
  Q: '0e11111115120d',
  R: '1e11111e141211',
  S: '0f10100e01011e',
  T: '1f040404040404',
  U: '1111111111110e',
  V: '11111111110a04',
  W: '1111111515150a',
  X: '11110a040a1111',
  Y: '1111110a040404',
  Z: '1f01020408101f',
  ' ': '00000000000000',
  '.': '00000000000c0c',
  ',': '000000000c0408',
  '-': '0000001f000000',
  '+': '0004041f040400',
  ':': '000c0c000c0c00',
  '/': '00010204081000',
  '(': '02040808080402',
  ')': '08040202020408',
  '%': '18190204081303',
  _: '0000000000001f',
  '=': '00001f001f0000',
  "'": '0c040800000000',
  '?': '0e110102040004',
  '!': '04040404000004',
  '*': '0004150e150400',
  '#': '0a0a1f0a1f0a0a',
  '[': '0e08080808080e',
  ']': '0e02020202020e',
  '<': '02040810080402',
  '>': '08040201020408',
  '@': '0e11010d15150e',
  '&': '0c12140815120d',
  '|': '04040404040404',
};

type RGB = readonly [number, number, number];

const BLACK: RGB = [0, 0, 0];
const WHITE: RGB = [255, 255, 255];
const GRID: RGB = [225, 225, 225];
const AXIS: RGB = [60, 60, 60];

/** Matplotlib's `tab10` colours, so series look like the usual Python plots. */
const PALETTE: readonly RGB[] = [
  [31, 119, 180],
  [255, 127, 14],
  [44, 160, 44],
  [214, 39, 40],
  [148, 103, 189],
  [140, 86, 75],
  [227, 119, 194],
  [127, 127, 127],
  [188, 189, 34],
  [23, 190, 207],
];

/** An RGBA image being drawn, white and opaque to start with, with an optional clip rectangle. */
class Canvas {
  readonly data: Buffer;
  #clip: [number, number, number, number];

  constructor(
    readonly width: number,
    readonly height: number,
  ) {
    this.data = Buffer.alloc(width * height * 4, 255);
    this.#clip = [0, 0, width, height];
  }

  /** Restricts drawing to `[x0, x1) x [y0, y1)`; no arguments lifts the restriction. */
  clip(x0 = 0, y0 = 0, x1 = this.width, y1 = this.height): void {
    this.#clip = [Math.max(0, x0), Math.max(0, y0), Math.min(this.width, x1), Math.min(this.height, y1)];
  }

  pixel(x: number, y: number, c: RGB): void {
    x = Math.round(x);
    y = Math.round(y);
    const [x0, y0, x1, y1] = this.#clip;
    if (x < x0 || y < y0 || x >= x1 || y >= y1) return;
    const i = (y * this.width + x) * 4;
    this.data[i] = c[0];
    this.data[i + 1] = c[1];
    this.data[i + 2] = c[2];
    this.data[i + 3] = 255;
  }

  rect(x: number, y: number, w: number, h: number, c: RGB): void {
    for (let j = Math.round(y); j < Math.round(y + h); j++) {
      for (let i = Math.round(x); i < Math.round(x + w); i++) this.pixel(i, j, c);
    }
  }

  /** A rectangle's outline, one pixel wide. */
  frame(x: number, y: number, w: number, h: number, c: RGB): void {
    this.rect(x, y, w, 1, c);
    this.rect(x, y + h - 1, w, 1, c);
    this.rect(x, y, 1, h, c);
    this.rect(x + w - 1, y, 1, h, c);
  }

  /** A straight line (Bresenham's), `thickness` pixels wide. */
  line(xa: number, ya: number, xb: number, yb: number, c: RGB, thickness = 1): void {
    let x = Math.round(xa);
    let y = Math.round(ya);
    const x1 = Math.round(xb);
    const y1 = Math.round(yb);
    const dx = Math.abs(x1 - x);
    const dy = -Math.abs(y1 - y);
    const sx = x < x1 ? 1 : -1;
    const sy = y < y1 ? 1 : -1;
    let err = dx + dy;
    const off = Math.floor((thickness - 1) / 2);
    for (;;) {
      if (thickness === 1) this.pixel(x, y, c);
      else this.rect(x - off, y - off, thickness, thickness, c);
      if (x === x1 && y === y1) break;
      const e2 = 2 * err;
      if (e2 >= dy) {
        err += dy;
        x += sx;
      }
      if (e2 <= dx) {
        err += dx;
        y += sy;
      }
    }
  }

  /**
   * Draws text with the bitmap font, each font pixel a `scale`-sized square. `vertical` turns it a
   * quarter turn counter-clockwise (reading bottom to top), with `(x, y)` its bottom-left corner.
   */
  text(s: string, x: number, y: number, c: RGB, scale: number, vertical = false): void {
    let pen = 0;
    for (const ch of s.toUpperCase()) {
      const glyph = FONT[ch] ?? FONT['?']!;
      for (let row = 0; row < 7; row++) {
        const bits = parseInt(glyph.slice(row * 2, row * 2 + 2), 16);
        for (let col = 0; col < 5; col++) {
          if (!(bits & (0x10 >> col))) continue;
          if (vertical) this.rect(x + row * scale, y - (pen + col + 1) * scale, scale, scale, c);
          else this.rect(x + (pen + col) * scale, y + row * scale, scale, scale, c);
        }
      }
      pen += 6;
    }
  }
}

/** Width in pixels of `s` drawn at `scale` (6 font pixels per character, less the last gap). */
function textWidth(s: string, scale: number): number {
  const n = Array.from(s).length; // characters are code points: the font draws one glyph for each
  return n === 0 ? 0 : (n * 6 - 1) * scale;
}

/** Shortens `s` with a trailing "." until it fits in `max` pixels. */
function fit(s: string, max: number, scale: number): string {
  if (textWidth(s, scale) <= max) return s;
  const chars = Array.from(s);
  while (chars.length > 0 && textWidth(chars.join('') + '.', scale) > max) chars.pop();
  return chars.length === 0 ? '' : chars.join('') + '.';
}

/** Evenly spaced "nice" tick values (steps of 1, 2 or 5 times a power of ten) covering [lo, hi]. */
function niceTicks(lo: number, hi: number, target: number): { lo: number; hi: number; step: number; ticks: number[] } {
  const raw = (hi - lo) / Math.max(1, target);
  const pow = 10 ** Math.floor(Math.log10(raw));
  const f = raw / pow;
  const step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * pow;
  const start = Math.floor(lo / step + 1e-9) * step;
  const end = Math.ceil(hi / step - 1e-9) * step;
  const ticks: number[] = [];
  for (let i = 0; start + i * step <= end + step * 1e-9; i++) ticks.push(start + i * step);
  return { lo: start, hi: end, step, ticks };
}

/**
 * A tick label: fixed decimals matched to the step, or, for very large or small values, exponent
 * form with as many mantissa digits as the step needs (`1.5E8`, `2E-5`).
 */
function tickLabel(v: number, step: number, maxAbs: number): string {
  if (Math.abs(v) < step * 1e-9) return '0';
  if (maxAbs >= 1e6 || step < 1e-4) {
    const digits = Math.floor(Math.log10(Math.abs(v)) + 1e-9) - Math.floor(Math.log10(step) + 1e-9);
    return v.toExponential(Math.max(0, Math.min(6, digits))).replace('e+', 'e');
  }
  const decimals = Math.max(0, Math.ceil(-Math.log10(step) - 1e-9));
  return v.toFixed(decimals);
}

/** The value range of finite numbers, widened when empty or a single value. */
function extent(values: number[]): [number, number] {
  // A loop, not Math.min(...values): spreading a million points overflows the call stack.
  let lo = Infinity;
  let hi = -Infinity;
  for (const v of values) {
    if (!Number.isFinite(v)) continue;
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  if (lo > hi) return [0, 1];
  if (lo === hi) {
    const pad = lo === 0 ? 1 : Math.abs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  return [lo, hi];
}

async function encode(canvas: Canvas): Promise<Buffer> {
  // Loaded on first use, so that importing the package does not load libvips.
  const { default: sharp } = await import('sharp');
  return sharp(canvas.data, { raw: { width: canvas.width, height: canvas.height, channels: 4 } })
    .png()
    .toBuffer();
}

/** One line of a {@link plotCurves} chart. */
export interface Series {
  /** The legend entry. */
  name: string;
  /** `[x, y]` points in drawing order; a non-finite y (NaN, a diverged loss) breaks the line. */
  points: readonly (readonly [number, number])[];
}

/** Options of {@link plotCurves}. */
export interface PlotOptions {
  /** Drawn above the chart. */
  title?: string;
  /** Label of the horizontal axis, e.g. "step". */
  xLabel?: string;
  /** Label of the vertical axis, e.g. "loss". */
  yLabel?: string;
  /** Image width in pixels; default 800. */
  width?: number;
  /** Image height in pixels; default 500. */
  height?: number;
  /** Use a logarithmic y axis (for a learning rate or a loss over orders of magnitude); default false. */
  logY?: boolean;
  /** Use a logarithmic x axis (a learning-rate sweep); default false. Points with x <= 0 are left out. */
  logX?: boolean;
}

/** Series with at most this many points get a marker at every point. */
const MARKED_POINTS = 30;

/**
 * Draws line charts (loss, accuracy, learning rate...) with axes, nice ticks, a grid, one colour
 * per series and a legend, and encodes them as a PNG.
 * @param series - the lines; up to 10 get distinct colours, then the colours repeat.
 * @param options - see {@link PlotOptions}.
 * @returns the PNG file's bytes.
 */
export async function plotCurves(series: readonly Series[], options?: PlotOptions): Promise<Buffer> {
  const o = expectOptions<PlotOptions>('plotCurves options', options, [
    'title',
    'xLabel',
    'yLabel',
    'width',
    'height',
    'logY',
    'logX',
  ]);
  const width = expectInt('plotCurves options.width', o.width ?? 800, 160, 10000);
  const height = expectInt('plotCurves options.height', o.height ?? 500, 120, 10000);
  const logY = o.logY ?? false;
  const logX = o.logX ?? false;
  for (const key of ['title', 'xLabel', 'yLabel'] as const) {
    if (o[key] !== undefined && typeof o[key] !== 'string') invalid(`plotCurves options.${key}`, 'a string', o[key]);
  }
  // A plain boolean test: Array.isArray's type guard would narrow readonly arrays to any[].
  const isArray = (v: unknown): boolean => Array.isArray(v);
  if (!isArray(series)) invalid('series', 'an array of { name, points }', series);
  series.forEach((s, i) => {
    if (s === null || typeof s !== 'object' || typeof s.name !== 'string' || !isArray(s.points)) {
      invalid(`series[${i}]`, 'an object { name: string, points: [x, y][] }', s);
    }
    s.points.forEach((p, j) => {
      if (!isArray(p) || p.length !== 2 || typeof p[0] !== 'number' || typeof p[1] !== 'number') {
        invalid(`series[${i}].points[${j}]`, 'an [x, y] pair of numbers', p);
      }
    });
  });

  const canvas = new Canvas(width, height);
  const scale = width >= 640 && height >= 400 ? 2 : 1;
  const lineH = 7 * scale;
  const ty = (y: number): number => (logY ? (y > 0 ? Math.log10(y) : NaN) : y);
  const tx = (x: number): number => (logX ? (x > 0 ? Math.log10(x) : NaN) : x);

  const xs = series.flatMap((s) => s.points.map((p) => tx(p[0])));
  const ys = series.flatMap((s) => s.points.map((p) => ty(p[1])));
  const [xLo, xHi] = extent(xs);
  const [yLo, yHi] = extent(ys);
  const top = lineH * 2 + 8;
  const bottom = height - (lineH * 2 + 8 + (o.xLabel ? lineH + 6 : 0));
  const xTarget = Math.max(2, Math.floor(width / (60 * scale)));
  const xTicks = logX ? niceTicks(Math.floor(xLo), Math.ceil(xHi), xTarget) : niceTicks(xLo, xHi, xTarget);
  // A log axis ticks whole decades only.
  if (logX && xTicks.step < 1) {
    Object.assign(xTicks, niceTicks(Math.floor(xLo), Math.ceil(xHi), Math.max(1, Math.ceil(xHi) - Math.floor(xLo))));
  }
  const yTicks = logY
    ? niceTicks(Math.floor(yLo), Math.ceil(yHi), Math.max(2, Math.floor((bottom - top) / (25 * scale))))
    : niceTicks(yLo, yHi, Math.max(2, Math.floor((bottom - top) / (25 * scale))));
  if (logY && yTicks.step < 1) {
    Object.assign(yTicks, niceTicks(Math.floor(yLo), Math.ceil(yHi), Math.max(1, Math.ceil(yHi) - Math.floor(yLo))));
  }
  const yMaxAbs = Math.max(Math.abs(yTicks.lo), Math.abs(yTicks.hi));
  const xMaxAbs = Math.max(Math.abs(xTicks.lo), Math.abs(xTicks.hi));
  const yLabels = yTicks.ticks.map((v) => (logY ? `1E${Math.round(v)}` : tickLabel(v, yTicks.step, yMaxAbs)));
  const left = 10 + (o.yLabel ? lineH + 8 : 0) + Math.max(...yLabels.map((l) => textWidth(l, scale))) + 8;
  const right = width - 20;
  if (right - left < 40 || bottom - top < 40) {
    invalid('plotCurves options.width/height', 'a size that leaves room for the plot area', `${width}x${height}`);
  }
  const px = (x: number): number => left + ((x - xTicks.lo) / (xTicks.hi - xTicks.lo)) * (right - left);
  const py = (y: number): number => bottom - ((y - yTicks.lo) / (yTicks.hi - yTicks.lo)) * (bottom - top);

  // Grid and tick labels.
  xTicks.ticks.forEach((v) => {
    const x = px(v);
    canvas.rect(x, top, 1, bottom - top, GRID);
    canvas.rect(x, bottom, 1, 5, AXIS);
    const label = logX ? `1E${Math.round(v)}` : tickLabel(v, xTicks.step, xMaxAbs);
    canvas.text(
      label,
      Math.min(width - textWidth(label, scale) - 1, Math.max(0, x - textWidth(label, scale) / 2)),
      bottom + 8,
      BLACK,
      scale,
    );
  });
  yTicks.ticks.forEach((v, i) => {
    const y = py(v);
    canvas.rect(left, y, right - left, 1, GRID);
    canvas.rect(left - 5, y, 5, 1, AXIS);
    const label = yLabels[i]!;
    canvas.text(label, left - 8 - textWidth(label, scale), y - lineH / 2, BLACK, scale);
  });
  canvas.frame(left, top, right - left + 1, bottom - top + 1, AXIS);

  // Titles.
  if (o.title) {
    const t = fit(o.title, width - 20, scale);
    canvas.text(t, (width - textWidth(t, scale)) / 2, 6, BLACK, scale);
  }
  if (o.xLabel) {
    const t = fit(o.xLabel, right - left, scale);
    canvas.text(t, (left + right - textWidth(t, scale)) / 2, height - lineH - 6, BLACK, scale);
  }
  if (o.yLabel) {
    const t = fit(o.yLabel, bottom - top, scale);
    canvas.text(t, 8, (top + bottom + textWidth(t, scale)) / 2, BLACK, scale, true);
  }

  // Curves, clipped to the plot area; a non-finite point ends a segment.
  canvas.clip(left + 1, top + 1, right, bottom);
  series.forEach((s, i) => {
    const colour = PALETTE[i % PALETTE.length]!;
    // A short curve (a few evaluations) marks every point, so that each value can be told apart.
    const markAll = s.points.length <= MARKED_POINTS;
    let prev: [number, number] | null = null;
    let run = 0;
    const mark = (p: [number, number] | null): void => {
      if (p) canvas.rect(p[0] - 2, p[1] - 2, 5, 5, colour);
    };
    for (const [xRaw, yRaw] of s.points) {
      const x = tx(xRaw);
      const y = ty(yRaw);
      if (!Number.isFinite(x) || !Number.isFinite(y)) {
        if (run === 1) mark(prev);
        prev = null;
        run = 0;
        continue;
      }
      const p: [number, number] = [px(x), py(y)];
      if (prev) canvas.line(prev[0], prev[1], p[0], p[1], colour, 2);
      if (markAll) mark(p);
      prev = p;
      run++;
    }
    if (run === 1) mark(prev);
  });
  canvas.clip();

  // Legend in the corner of the plot area that covers the fewest drawn curve pixels (matplotlib's
  // loc='best', simplified to the four corners), top right on a tie.
  if (series.length > 0) {
    const names = series.map((s) => fit(s.name, (right - left) / 2, scale));
    const boxW = Math.max(...names.map((n) => textWidth(n, scale))) + 14 * scale + 16;
    const rowH = lineH + 6;
    const boxH = names.length * rowH + 8;
    const corners: [number, number][] = [
      [right - boxW - 8, top + 8],
      [left + 8, top + 8],
      [right - boxW - 8, bottom - boxH - 8],
      [left + 8, bottom - boxH - 8],
    ];
    const covered = ([x0, y0]: [number, number]): number => {
      let n = 0;
      for (let y = Math.max(0, Math.round(y0)); y < Math.min(height, Math.round(y0 + boxH)); y++) {
        for (let x = Math.max(0, Math.round(x0)); x < Math.min(width, Math.round(x0 + boxW)); x++) {
          const i = (y * width + x) * 4;
          const r = canvas.data[i]!;
          // Anything but the background, the grid and the frame is a curve.
          if ((r !== 255 && r !== GRID[0] && r !== AXIS[0]) || canvas.data[i + 1] !== r || canvas.data[i + 2] !== r) {
            n++;
          }
        }
      }
      return n;
    };
    let [bx, by] = corners[0]!;
    let best = covered(corners[0]!);
    for (const c of corners.slice(1)) {
      const n = covered(c);
      if (n < best) [bx, by, best] = [c[0], c[1], n];
    }
    canvas.rect(bx, by, boxW, boxH, WHITE);
    canvas.frame(bx, by, boxW, boxH, AXIS);
    names.forEach((n, i) => {
      const y = by + 6 + i * rowH;
      canvas.rect(bx + 6, y + lineH / 2 - 1, 12 * scale, 3, PALETTE[i % PALETTE.length]!);
      canvas.text(n, bx + 10 + 12 * scale, y, BLACK, scale);
    });
  }
  return encode(canvas);
}

/** Options of {@link plotConfusionMatrix}. */
export interface ConfusionPlotOptions {
  /** Drawn above the matrix; default "Confusion matrix". */
  title?: string;
  /** Colour each row by its share of the row (recall per cell) instead of the raw count; default false. */
  normalize?: boolean;
}

/**
 * Draws a confusion matrix as a heat map (rows true classes, columns predicted classes, darker is
 * more), with each cell's count written in it when it fits, and encodes it as a PNG. The image
 * size follows the number of classes.
 * @param matrix - a {@link ConfusionMatrix} or square array of counts.
 * @param classNames - one per class; default the indices.
 * @param options - see {@link ConfusionPlotOptions}.
 * @returns the PNG file's bytes.
 */
export async function plotConfusionMatrix(
  matrix: ConfusionMatrix | readonly (readonly number[])[],
  classNames?: readonly string[],
  options?: ConfusionPlotOptions,
): Promise<Buffer> {
  const o = expectOptions<ConfusionPlotOptions>('plotConfusionMatrix options', options, ['title', 'normalize']);
  const counts = matrix instanceof ConfusionMatrix ? matrix.toArray() : ConfusionMatrix.fromArray(matrix).toArray();
  const n = counts.length;
  const names = classNames ?? Array.from({ length: n }, (_, i) => String(i));
  if (!isArray(names) || names.length !== n || names.some((s) => typeof s !== 'string')) {
    invalid('classNames', `an array of ${n} strings`, classNames);
  }
  const normalize = o.normalize ?? false;
  const title = o.title ?? 'Confusion matrix';

  const scale = n <= 20 ? 2 : 1;
  const lineH = 7 * scale;
  const cell = Math.max(6, Math.min(64, Math.floor(640 / n)));
  const labelMax = 160;
  const shown = names.map((s) => fit(s, labelMax, scale));
  const nameW = Math.max(...shown.map((s) => textWidth(s, scale)));
  const showNames = cell >= lineH + 2;
  const left = 10 + lineH + 10 + (showNames ? nameW + 8 : 0);
  const top = 10 + lineH + 14;
  const size = cell * n;
  const bottom = top + size;
  const width = left + size + 20;
  const height = bottom + 8 + (showNames ? nameW + 8 : 0) + lineH + 10;
  const canvas = new Canvas(Math.max(width, textWidth(title, scale) + 20), height);

  const values = counts.map((row) => {
    const sum = row.reduce((a, b) => a + b, 0);
    return row.map((v) => (normalize ? (sum === 0 ? 0 : v / sum) : v));
  });
  const max = values.reduce((m, row) => row.reduce((a, b) => Math.max(a, b), m), 1e-12);
  // Matplotlib's "Blues" end points, interpolated.
  const light: RGB = [247, 251, 255];
  const dark: RGB = [8, 48, 107];
  for (let t = 0; t < n; t++) {
    for (let p = 0; p < n; p++) {
      const f = values[t]![p]! / max;
      const colour: RGB = [0, 1, 2].map((k) => Math.round(light[k]! + (dark[k]! - light[k]!) * f)) as unknown as RGB;
      const x = left + p * cell;
      const y = top + t * cell;
      canvas.rect(x, y, cell, cell, colour);
      const label = normalize ? values[t]![p]!.toFixed(2) : String(counts[t]![p]!);
      for (const s of [scale, 1]) {
        if (textWidth(label, s) <= cell - 4 && 7 * s <= cell - 4) {
          canvas.text(label, x + (cell - textWidth(label, s)) / 2, y + (cell - 7 * s) / 2, f > 0.5 ? WHITE : BLACK, s);
          break;
        }
      }
    }
  }
  canvas.frame(left - 1, top - 1, size + 2, size + 2, AXIS);

  canvas.text(
    fit(title, canvas.width - 20, scale),
    (canvas.width - textWidth(fit(title, canvas.width - 20, scale), scale)) / 2,
    8,
    BLACK,
    scale,
  );
  if (showNames) {
    shown.forEach((s, i) => {
      canvas.text(s, left - 8 - textWidth(s, scale), top + i * cell + (cell - lineH) / 2, BLACK, scale);
      canvas.text(s, left + i * cell + (cell - lineH) / 2, bottom + 8 + textWidth(s, scale), BLACK, scale, true);
    });
  }
  const xTitle = 'predicted';
  canvas.text(xTitle, left + (size - textWidth(xTitle, scale)) / 2, height - lineH - 8, BLACK, scale);
  const yTitle = 'true';
  canvas.text(yTitle, 10, top + (size + textWidth(yTitle, scale)) / 2, BLACK, scale, true);
  return encode(canvas);
}

/**
 * Writes a file atomically: the bytes go to a temporary file in the same directory, which is then
 * renamed over `path`, so a reader (or a crash) never sees half an image. Creates the directory.
 * @param path - the destination, e.g. `runs/exp1/loss.png`.
 * @param buffer - the bytes, e.g. from {@link plotCurves}.
 */
export async function writePng(path: string, buffer: Uint8Array): Promise<void> {
  if (typeof path !== 'string' || path.length === 0) invalid('path', 'a non-empty file path', path);
  if (!(buffer instanceof Uint8Array)) invalid('buffer', 'a Buffer or Uint8Array', buffer);
  const dir = dirname(path);
  await mkdir(dir, { recursive: true });
  // Same directory, so the rename stays on one file system and is atomic.
  const temp = join(dir, `.${basename(path)}.${process.pid}.${Math.random().toString(36).slice(2)}.tmp`);
  try {
    await writeFile(temp, buffer);
    await rename(temp, path);
  } catch (e) {
    await unlink(temp).catch(() => undefined);
    throw e;
  }
}

/** Options of {@link plotScatter}. */
export interface ScatterOptions {
  /** One name per class, for the legend; default the class indices. */
  classNames?: readonly string[];
  /** Drawn above the chart. */
  title?: string;
  /** Image width in pixels; default 900. */
  width?: number;
  /** Image height in pixels; default 700. */
  height?: number;
  /** Marker radius in pixels; default 3 up to 2,000 points, else 2. */
  pointRadius?: number;
}

/** The light halves of matplotlib's `tab20` pairs, for classes 10 to 19. */
const LIGHT_PALETTE: readonly RGB[] = [
  [174, 199, 232],
  [255, 187, 120],
  [152, 223, 138],
  [255, 152, 150],
  [197, 176, 213],
  [196, 156, 148],
  [247, 182, 210],
  [199, 199, 199],
  [219, 219, 141],
  [158, 218, 229],
];

/**
 * The colour of class `c`: matplotlib's `tab10` for the first ten, the light `tab20` colours for
 * the next ten, then hues a golden angle apart; grey for a negative label (no class).
 */
function classColour(c: number): RGB {
  if (c < 0) return [150, 150, 150];
  const listed = c < 10 ? PALETTE[c] : LIGHT_PALETTE[c - 10];
  if (listed) return listed;
  const hue = ((c * 137.508) % 360) / 60;
  const x = 1 - Math.abs((hue % 2) - 1);
  const [r, g, b] =
    hue < 1
      ? [1, x, 0]
      : hue < 2
        ? [x, 1, 0]
        : hue < 3
          ? [0, 1, x]
          : hue < 4
            ? [0, x, 1]
            : hue < 5
              ? [x, 0, 1]
              : [1, 0, x];
  // Saturation 0.7 and value 0.8: readable on white.
  const tone = (v: number): number => Math.round(255 * 0.8 * (1 - 0.7 + 0.7 * v));
  return [tone(r), tone(g), tone(b)];
}

/**
 * Draws labelled 2-D points (a t-SNE embedding) as a scatter plot, one colour per class, with the
 * same scale on both axes (distances read the same in every direction) and a legend of the class
 * names beside the plot, and encodes it as a PNG. Points are drawn in their order.
 * @param points - `[x0, y0, x1, y1, ...]`.
 * @param labels - one class index per point (negative: no class, drawn grey).
 * @param options - see {@link ScatterOptions}.
 * @returns the PNG file's bytes.
 */
export async function plotScatter(
  points: ArrayLike<number>,
  labels: ArrayLike<number>,
  options?: ScatterOptions,
): Promise<Buffer> {
  const o = expectOptions<ScatterOptions>('plotScatter options', options, [
    'classNames',
    'title',
    'width',
    'height',
    'pointRadius',
  ]);
  const isNumbers = (v: unknown): v is ArrayLike<number> =>
    (ArrayBuffer.isView(v) && !(v instanceof DataView)) || Array.isArray(v);
  if (!isNumbers(points) || points.length % 2 !== 0) invalid('points', 'an array of x, y pairs', points);
  const n = points.length / 2;
  if (!isNumbers(labels) || labels.length !== n) invalid('labels', `${n} class indices (one per point)`, labels);
  const width = expectInt('plotScatter options.width', o.width ?? 900, 200, 10000);
  const height = expectInt('plotScatter options.height', o.height ?? 700, 160, 10000);
  const radius = expectInt('plotScatter options.pointRadius', o.pointRadius ?? (n <= 2000 ? 3 : 2), 1, 20);
  if (o.title !== undefined && typeof o.title !== 'string') invalid('plotScatter options.title', 'a string', o.title);
  let classes = 0;
  for (let i = 0; i < n; i++) {
    const c = Number(labels[i]);
    if (!Number.isInteger(c)) invalid('labels', 'integer class indices', labels[i]);
    classes = Math.max(classes, c + 1);
  }
  const names = o.classNames ?? Array.from({ length: classes }, (_, i) => String(i));
  if (!isArray(names) || names.some((s) => typeof s !== 'string') || names.length < classes) {
    invalid('plotScatter options.classNames', `at least ${classes} strings (one per class)`, o.classNames);
  }

  const canvas = new Canvas(width, height);
  const scale = width >= 640 && height >= 400 ? 2 : 1;
  const lineH = 7 * scale;
  // The legend: one row per class that has points, on the right.
  const present = new Set<number>();
  for (let i = 0; i < n; i++) present.add(Number(labels[i]));
  const entries = [...present].filter((c) => c >= 0).sort((a, b) => a - b);
  if ([...present].some((c) => c < 0)) entries.push(-1);
  const legendNames = entries.map((c) => fit(c < 0 ? 'no class' : names[c]!, width / 4, scale));
  const legendW = entries.length > 0 ? Math.max(...legendNames.map((s) => textWidth(s, scale))) + 16 + 4 * radius : 0;
  const top = lineH * 2 + 8;
  const bottom = height - (lineH + 16);
  const right = width - 20 - (legendW > 0 ? legendW + 16 : 0);

  const xs: number[] = [];
  const ys: number[] = [];
  for (let i = 0; i < n; i++) {
    xs.push(Number(points[2 * i]));
    ys.push(Number(points[2 * i + 1]));
  }
  let [xLo, xHi] = extent(xs);
  let [yLo, yHi] = extent(ys);
  // A margin of 5% around the points, then one scale for both axes.
  const pad = 0.05 * Math.max(xHi - xLo, yHi - yLo);
  [xLo, xHi, yLo, yHi] = [xLo - pad, xHi + pad, yLo - pad, yHi + pad];
  const yTicksFirst = niceTicks(yLo, yHi, Math.max(2, Math.floor((bottom - top) / (40 * scale))));
  const yLabelW = Math.max(
    ...yTicksFirst.ticks.map((v) =>
      textWidth(tickLabel(v, yTicksFirst.step, Math.max(Math.abs(yLo), Math.abs(yHi))), scale),
    ),
  );
  const left = 10 + yLabelW + 8;
  if (right - left < 40 || bottom - top < 40) {
    invalid('plotScatter options.width/height', 'a size that leaves room for the plot area', `${width}x${height}`);
  }
  const unit = Math.min((right - left) / (xHi - xLo), (bottom - top) / (yHi - yLo));
  // Centre the points' box in the plot area; the axes cover what is visible.
  const xMid = (xLo + xHi) / 2;
  const yMid = (yLo + yHi) / 2;
  const visX: [number, number] = [xMid - (right - left) / unit / 2, xMid + (right - left) / unit / 2];
  const visY: [number, number] = [yMid - (bottom - top) / unit / 2, yMid + (bottom - top) / unit / 2];
  const px = (x: number): number => left + (x - visX[0]) * unit;
  const py = (y: number): number => bottom - (y - visY[0]) * unit;

  const xTicks = niceTicks(visX[0], visX[1], Math.max(2, Math.floor((right - left) / (70 * scale))));
  const yTicks = niceTicks(visY[0], visY[1], Math.max(2, Math.floor((bottom - top) / (40 * scale))));
  const xMaxAbs = Math.max(Math.abs(visX[0]), Math.abs(visX[1]));
  const yMaxAbs = Math.max(Math.abs(visY[0]), Math.abs(visY[1]));
  for (const v of xTicks.ticks) {
    if (v < visX[0] || v > visX[1]) continue;
    const x = px(v);
    canvas.rect(x, top, 1, bottom - top, GRID);
    canvas.rect(x, bottom, 1, 5, AXIS);
    const label = tickLabel(v, xTicks.step, xMaxAbs);
    canvas.text(label, x - textWidth(label, scale) / 2, bottom + 8, BLACK, scale);
  }
  for (const v of yTicks.ticks) {
    if (v < visY[0] || v > visY[1]) continue;
    const y = py(v);
    canvas.rect(left, y, right - left, 1, GRID);
    canvas.rect(left - 5, y, 5, 1, AXIS);
    const label = tickLabel(v, yTicks.step, yMaxAbs);
    canvas.text(label, left - 8 - textWidth(label, scale), y - lineH / 2, BLACK, scale);
  }
  canvas.frame(left, top, right - left + 1, bottom - top + 1, AXIS);
  if (o.title) {
    const t = fit(o.title, width - 20, scale);
    canvas.text(t, (width - textWidth(t, scale)) / 2, 6, BLACK, scale);
  }

  const disc = (cx: number, cy: number, colour: RGB): void => {
    for (let dy = -radius; dy <= radius; dy++) {
      for (let dx = -radius; dx <= radius; dx++) {
        if (dx * dx + dy * dy <= radius * radius + radius) canvas.pixel(cx + dx, cy + dy, colour);
      }
    }
  };
  canvas.clip(left + 1, top + 1, right, bottom);
  for (let i = 0; i < n; i++) {
    if (!Number.isFinite(xs[i]) || !Number.isFinite(ys[i])) continue;
    disc(px(xs[i]!), py(ys[i]!), classColour(Number(labels[i])));
  }
  canvas.clip();

  if (entries.length > 0) {
    const rowH = Math.max(lineH, 2 * radius + 1) + 6;
    const fits = Math.max(1, Math.floor((bottom - top - 8) / rowH));
    const shown = entries.length > fits ? fits - 1 : entries.length;
    const bx = right + 16;
    const by = top;
    const rows = shown + (shown < entries.length ? 1 : 0);
    canvas.frame(bx, by, legendW, rows * rowH + 8, AXIS);
    for (let r = 0; r < shown; r++) {
      const y = by + 6 + r * rowH;
      disc(bx + 6 + radius * 2, y + lineH / 2, classColour(entries[r]!));
      canvas.text(legendNames[r]!, bx + 12 + 4 * radius, y, BLACK, scale);
    }
    if (shown < entries.length) {
      canvas.text(`+${entries.length - shown} more`, bx + 6, by + 6 + shown * rowH, BLACK, scale);
    }
  }
  return encode(canvas);
}
