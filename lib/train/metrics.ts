/**
 * Classification metrics computed on the host from logits copied out of the model: top-k accuracy,
 * running averages for logging, and a confusion matrix with per-class precision, recall and F1 and
 * a text report in scikit-learn's `classification_report` layout.
 * @packageDocumentation
 */
import { expectInt, expectNumber, expectOptions, invalid, isArray, mismatch } from '../errors.js';

/** Logits (or scores) of a batch, row-major `[n, numClasses]`. */
export type Logits = Float32Array | Float64Array;

/** Class indices, one per sample. */
export type Labels = ArrayLike<number>;

function checkLabels(name: string, labels: Labels, numClasses: number): void {
  if (labels === null || typeof labels !== 'object' || typeof labels.length !== 'number') {
    invalid(name, 'an array of class indices', labels);
  }
  for (let i = 0; i < labels.length; i++) {
    const l = labels[i];
    if (typeof l !== 'number' || !Number.isInteger(l) || l < 0 || l >= numClasses) {
      invalid(`${name}[${i}]`, `a class index between 0 and ${numClasses - 1}`, l);
    }
  }
}

/** Checks a logits/labels pair and returns the number of classes (the row length). */
function checkLogits(logits: Logits, labels: Labels): number {
  if (!(logits instanceof Float32Array || logits instanceof Float64Array)) {
    invalid('logits', 'a Float32Array or Float64Array of shape [n, numClasses]', logits);
  }
  if (labels === null || typeof labels !== 'object' || typeof labels.length !== 'number') {
    invalid('labels', 'an array of class indices', labels);
  }
  const n = labels.length;
  if (n === 0) {
    if (logits.length !== 0) mismatch('logits', 'no logits for an empty batch of labels', `${logits.length} values`);
    return 0;
  }
  if (logits.length === 0 || logits.length % n !== 0) {
    mismatch('logits', `a multiple of ${n} values (one row of class scores per label)`, `${logits.length} values`);
  }
  const k = logits.length / n;
  checkLabels('labels', labels, k);
  return k;
}

/** `a` ranks above `b` as in torch.topk/argmax: NaN is the largest value. */
function above(a: number, b: number): boolean {
  return a > b || (a !== a && b === b);
}

/** `a` and `b` are tied (NaN ties with NaN). */
function tied(a: number, b: number): boolean {
  return a === b || (a !== a && b !== b);
}

/**
 * Counts the samples whose label is among the `k` highest-scoring classes, for each `k` in `ks`
 * (each clamped to the number of classes, so top-5 of a 3-class problem is top-3).
 *
 * Ties: `torch.topk` leaves the order of equal values unspecified, so a hit on a tied logit can
 * differ between its CPU and CUDA kernels. Here ties are broken deterministically toward the lower
 * class index (the stable-sort order, which `tf.math.top_k` documents and PyTorch's stable top-k
 * uses): the label's rank is the number of classes with a larger logit plus the number of
 * lower-indexed classes with an equal one, and it is a hit when that rank is below `k`. NaN counts
 * as the largest value, as in `torch.topk`.
 * @param logits - row-major `[n, numClasses]` scores.
 * @param labels - `n` class indices.
 * @param ks - the values of k; default `[1, 5]`.
 * @returns the number of hits for each k.
 */
export function topkCorrect(logits: Logits, labels: Labels, ks: readonly number[] = [1, 5]): number[] {
  const k = checkLogits(logits, labels);
  if (!Array.isArray(ks) || ks.length === 0) invalid('ks', 'a non-empty array of integers of at least 1', ks);
  const clamped = ks.map((v, i) => Math.min(expectInt(`ks[${i}]`, v, 1), Math.max(k, 1)));
  const hits = new Array<number>(ks.length).fill(0);
  for (let s = 0; s < labels.length; s++) {
    const row = s * k;
    const label = labels[s]!;
    const target = logits[row + label]!;
    let rank = 0;
    for (let c = 0; c < k; c++) {
      const v = logits[row + c]!;
      if (above(v, target) || (c < label && tied(v, target))) rank++;
    }
    clamped.forEach((kk, i) => {
      if (rank < kk) hits[i]!++;
    });
  }
  return hits;
}

/**
 * Top-k accuracy as fractions in [0, 1] (torchvision's reference script reports the same values
 * times 100). An empty batch gives 0 for every k. See {@link topkCorrect} for ties and clamping.
 * @param logits - row-major `[n, numClasses]` scores.
 * @param labels - `n` class indices.
 * @param ks - the values of k; default `[1, 5]`.
 */
export function accuracy(logits: Logits, labels: Labels, ks: readonly number[] = [1, 5]): number[] {
  const hits = topkCorrect(logits, labels, ks);
  return hits.map((h) => (labels.length === 0 ? 0 : h / labels.length));
}

/**
 * The highest-scoring class of each row (the first one on ties, NaN highest, as `torch.argmax`).
 * @param logits - row-major `[n, numClasses]` scores.
 * @param numClasses - the row length.
 */
export function argmax(logits: Logits, numClasses: number): Int32Array {
  expectInt('numClasses', numClasses, 1);
  if (!(logits instanceof Float32Array || logits instanceof Float64Array) || logits.length % numClasses !== 0) {
    invalid('logits', `a Float32Array or Float64Array whose length is a multiple of ${numClasses}`, logits);
  }
  const n = logits.length / numClasses;
  const out = new Int32Array(n);
  for (let s = 0; s < n; s++) {
    const row = s * numClasses;
    let best = 0;
    for (let c = 1; c < numClasses; c++) if (above(logits[row + c]!, logits[row + best]!)) best = c;
    out[s] = best;
  }
  return out;
}

/** Options of {@link RunningAverage}. */
export interface RunningAverageOptions {
  /** How many recent values {@link RunningAverage.avg}, `median` and `max` cover; default 20. */
  window?: number;
}

/**
 * A value tracked over training, like torchvision's `SmoothedValue`: the latest value, statistics
 * over a window of recent values, and the average over everything since the last reset.
 */
export class RunningAverage {
  readonly window: number;
  #recent: number[] = [];
  #total = 0;
  #count = 0;

  constructor(options?: RunningAverageOptions) {
    const o = expectOptions<RunningAverageOptions>('RunningAverage options', options, ['window']);
    this.window = expectInt('RunningAverage options.window', o.window ?? 20, 1);
  }

  /**
   * Records a value.
   * @param value - e.g. a batch's mean loss.
   * @param n - how many samples it averages, which weights it in {@link RunningAverage.globalAvg}; default 1.
   */
  update(value: number, n = 1): void {
    if (typeof value !== 'number') invalid('value', 'a number', value);
    expectNumber('n', n, 0);
    this.#recent.push(value);
    if (this.#recent.length > this.window) this.#recent.shift();
    this.#total += value * n;
    this.#count += n;
  }

  /** The latest value (NaN before the first). */
  get value(): number {
    return this.#recent.length === 0 ? NaN : this.#recent[this.#recent.length - 1]!;
  }

  /** Mean of the values in the window (NaN when empty). */
  get avg(): number {
    if (this.#recent.length === 0) return NaN;
    return this.#recent.reduce((a, b) => a + b, 0) / this.#recent.length;
  }

  /** Median of the values in the window; the lower middle for an even count, as `torch.median`. */
  get median(): number {
    if (this.#recent.length === 0) return NaN;
    const sorted = [...this.#recent].sort((a, b) => a - b);
    return sorted[Math.floor((sorted.length - 1) / 2)]!;
  }

  /** Largest value in the window (NaN when empty). */
  get max(): number {
    return this.#recent.length === 0 ? NaN : Math.max(...this.#recent);
  }

  /** Weighted mean of every value since the last reset (NaN when empty). */
  get globalAvg(): number {
    return this.#count === 0 ? NaN : this.#total / this.#count;
  }

  /** Sum of `value * n` since the last reset. */
  get total(): number {
    return this.#total;
  }

  /** Sum of `n` since the last reset. */
  get count(): number {
    return this.#count;
  }

  /** Forgets every value. */
  reset(): void {
    this.#recent = [];
    this.#total = 0;
    this.#count = 0;
  }
}

/** Precision, recall and F1 of one class or an average of them, with the support (true samples). */
export interface ClassScores {
  precision: number;
  recall: number;
  f1: number;
  support: number;
}

/**
 * A confusion matrix: rows are true classes, columns predicted classes, like scikit-learn's
 * `confusion_matrix`. Scores follow scikit-learn's `precision_recall_fscore_support` with
 * `zero_division=0`: a ratio whose denominator is zero is 0.
 */
export class ConfusionMatrix {
  readonly numClasses: number;
  // Float64 so counts stay exact far beyond 2^32 samples.
  #counts: Float64Array;

  constructor(numClasses: number) {
    this.numClasses = expectInt('numClasses', numClasses, 1);
    this.#counts = new Float64Array(numClasses * numClasses);
  }

  /**
   * A confusion matrix from counts, e.g. one saved with {@link ConfusionMatrix.toArray} or summed
   * over processes.
   */
  static fromArray(matrix: readonly (readonly number[])[]): ConfusionMatrix {
    if (!Array.isArray(matrix) || matrix.length === 0) invalid('matrix', 'a non-empty square array of counts', matrix);
    const cm = new ConfusionMatrix(matrix.length);
    matrix.forEach((row, t) => {
      if (!Array.isArray(row) || row.length !== matrix.length) {
        invalid(`matrix[${t}]`, `an array of ${matrix.length} counts`, row);
      }
      row.forEach((v, p) => {
        cm.#counts[t * cm.numClasses + p] = expectNumber(`matrix[${t}][${p}]`, v, 0);
      });
    });
    return cm;
  }

  /**
   * Adds a batch.
   * @param outputs - logits (a Float32Array or Float64Array `[n, numClasses]`, reduced with
   *   {@link argmax}) or predicted class indices (an Int32Array or any other integer array, `n` long).
   * @param labels - `n` true class indices.
   */
  update(outputs: Logits | Labels, labels: Labels): void {
    const n = this.numClasses;
    checkLabels('labels', labels, n);
    let predictions: Labels;
    if (outputs instanceof Float32Array || outputs instanceof Float64Array) {
      if (outputs.length !== labels.length * n) {
        mismatch(
          'outputs',
          `logits of shape [${labels.length}, ${n}] (${labels.length * n} values)`,
          `${outputs.length} values`,
        );
      }
      predictions = argmax(outputs, n);
    } else {
      if (outputs === null || typeof outputs !== 'object' || outputs.length !== labels.length) {
        invalid(
          'outputs',
          `logits (a Float32Array of shape [${labels.length}, ${n}]) or ${labels.length} predicted class indices`,
          outputs,
        );
      }
      checkLabels('outputs', outputs, n);
      predictions = outputs;
    }
    for (let i = 0; i < labels.length; i++) this.#counts[labels[i]! * n + predictions[i]!]!++;
  }

  /** Adds another matrix's counts (e.g. from another process). */
  merge(other: ConfusionMatrix): void {
    if (!(other instanceof ConfusionMatrix) || other.numClasses !== this.numClasses) {
      invalid('other', `a ConfusionMatrix of ${this.numClasses} classes`, other);
    }
    for (let i = 0; i < this.#counts.length; i++) this.#counts[i]! += other.#counts[i]!;
  }

  /** Sets every count to zero. */
  reset(): void {
    this.#counts.fill(0);
  }

  /** Samples of class `trueClass` predicted as `predicted`. */
  at(trueClass: number, predicted: number): number {
    expectInt('trueClass', trueClass, 0, this.numClasses - 1);
    expectInt('predicted', predicted, 0, this.numClasses - 1);
    return this.#counts[trueClass * this.numClasses + predicted]!;
  }

  /** The counts as rows (true classes) of columns (predicted classes). */
  toArray(): number[][] {
    const n = this.numClasses;
    return Array.from({ length: n }, (_, t) => Array.from(this.#counts.subarray(t * n, (t + 1) * n)));
  }

  /** Samples counted. */
  get total(): number {
    return this.#counts.reduce((a, b) => a + b, 0);
  }

  /** Correct predictions over all samples (0 when empty); equal to micro-averaged F1. */
  accuracy(): number {
    const total = this.total;
    let correct = 0;
    for (let c = 0; c < this.numClasses; c++) correct += this.#counts[c * this.numClasses + c]!;
    return total === 0 ? 0 : correct / total;
  }

  /** True samples of each class (row sums). */
  support(): number[] {
    const n = this.numClasses;
    return Array.from({ length: n }, (_, t) => this.#counts.subarray(t * n, (t + 1) * n).reduce((a, b) => a + b, 0));
  }

  /** Predictions of each class (column sums). */
  predicted(): number[] {
    const n = this.numClasses;
    const out = new Array<number>(n).fill(0);
    for (let t = 0; t < n; t++) for (let p = 0; p < n; p++) out[p]! += this.#counts[t * n + p]!;
    return out;
  }

  /** Per class: correct predictions of the class over predictions of it. */
  precision(): number[] {
    const predicted = this.predicted();
    return predicted.map((d, c) => ratio(this.#tp(c), d));
  }

  /** Per class: correct predictions of the class over its true samples. */
  recall(): number[] {
    const support = this.support();
    return support.map((d, c) => ratio(this.#tp(c), d));
  }

  /**
   * Per class: the harmonic mean of precision and recall, computed as scikit-learn does,
   * `2 tp / (support + predicted)`.
   */
  f1(): number[] {
    const support = this.support();
    const predicted = this.predicted();
    return support.map((s, c) => ratio(2 * this.#tp(c), s + predicted[c]!));
  }

  /** Every class's scores. */
  perClass(): ClassScores[] {
    const [p, r, f, s] = [this.precision(), this.recall(), this.f1(), this.support()];
    return p.map((_, c) => ({ precision: p[c]!, recall: r[c]!, f1: f[c]!, support: s[c]! }));
  }

  /** Unweighted mean of the per-class scores over all classes; `support` is the total. */
  macroAvg(): ClassScores {
    const rows = this.perClass();
    const mean = (key: 'precision' | 'recall' | 'f1'): number => rows.reduce((a, r) => a + r[key], 0) / rows.length;
    return { precision: mean('precision'), recall: mean('recall'), f1: mean('f1'), support: this.total };
  }

  /** Mean of the per-class scores weighted by support (0 when there are no samples); `support` is the total. */
  weightedAvg(): ClassScores {
    const rows = this.perClass();
    const total = this.total;
    const mean = (key: 'precision' | 'recall' | 'f1'): number =>
      total === 0 ? 0 : rows.reduce((a, r) => a + r[key] * r.support, 0) / total;
    return { precision: mean('precision'), recall: mean('recall'), f1: mean('f1'), support: total };
  }

  /**
   * A text report laid out exactly like scikit-learn's `classification_report(y_true, y_pred,
   * labels=range(numClasses), target_names=classNames, digits=digits, zero_division=0)`: one row per
   * class, then `accuracy`, `macro avg` and `weighted avg`. Numbers are rounded as Python's
   * `format` rounds them (exact value of the double, ties to even).
   * @param classNames - one name per class; default the class indices.
   * @param digits - decimals of the scores; default 2.
   */
  classificationReport(classNames?: readonly string[], digits = 2): string {
    const n = this.numClasses;
    const names = classNames ?? Array.from({ length: n }, (_, i) => String(i));
    if (!isArray(names) || names.length !== n || names.some((s) => typeof s !== 'string')) {
      invalid('classNames', `an array of ${n} strings`, classNames);
    }
    expectInt('digits', digits, 0, 20);
    const headers = ['precision', 'recall', 'f1-score', 'support'];
    const width = Math.max(...names.map(textLength), 'weighted avg'.length, digits);
    const right = (s: string, w: number): string => ' '.repeat(Math.max(0, w - textLength(s))) + s;
    const row = (name: string, s: ClassScores): string =>
      `${right(name, width)} ` +
      [s.precision, s.recall, s.f1].map((v) => ` ${right(formatFixed(v, digits), 9)}`).join('') +
      ` ${right(formatCount(s.support), 9)}\n`;
    let report = `${right('', width)} ` + headers.map((h) => ` ${right(h, 9)}`).join('') + '\n\n';
    this.perClass().forEach((s, c) => {
      report += row(names[c]!, s);
    });
    report += '\n';
    report += `${right('accuracy', width)} ${' '.repeat(10)}${' '.repeat(10)} ${right(formatFixed(this.accuracy(), digits), 9)} ${right(formatCount(this.total), 9)}\n`;
    report += row('macro avg', this.macroAvg());
    report += row('weighted avg', this.weightedAvg());
    return report;
  }

  #tp(c: number): number {
    return this.#counts[c * this.numClasses + c]!;
  }
}

function ratio(num: number, den: number): number {
  return den === 0 ? 0 : num / den;
}

/** Length in code points, as Python's `len` counts for its padding. */
function textLength(s: string): number {
  return Array.from(s).length;
}

function formatCount(v: number): string {
  // Supports are whole numbers; scikit-learn prints them as integers.
  return Number.isInteger(v) ? String(v) : formatFixed(v, 2);
}

/**
 * Formats `x` with `digits` decimals the way Python's `format(x, '.{digits}f')` does: from the
 * exact binary value, ties to even. `Number.prototype.toFixed` differs on exact ties (0.125 gives
 * "0.13" where Python gives "0.12"), so this works on the exact value with BigInt arithmetic.
 * @param x - the number.
 * @param digits - decimals, 0 to 100.
 */
export function formatFixed(x: number, digits: number): string {
  expectInt('digits', digits, 0, 100);
  if (typeof x !== 'number') invalid('x', 'a number', x);
  if (Number.isNaN(x)) return 'nan';
  if (!Number.isFinite(x)) return x > 0 ? 'inf' : '-inf';
  const negative = x < 0 || Object.is(x, -0);
  // x = mantissa * 2^exponent exactly.
  const view = new DataView(new ArrayBuffer(8));
  view.setFloat64(0, Math.abs(x));
  const hi = view.getUint32(0);
  const lo = view.getUint32(4);
  const biased = (hi >>> 20) & 0x7ff;
  let mantissa = (BigInt(hi & 0xfffff) << 32n) | BigInt(lo);
  let exponent = -1074;
  if (biased !== 0) {
    mantissa |= 1n << 52n;
    exponent = biased - 1075;
  }
  const scaled = mantissa * 10n ** BigInt(digits);
  let q: bigint;
  if (exponent >= 0) {
    q = scaled << BigInt(exponent);
  } else {
    const den = 1n << BigInt(-exponent);
    q = scaled / den;
    const twice = 2n * (scaled % den);
    if (twice > den || (twice === den && q % 2n === 1n)) q += 1n;
  }
  let text = q.toString().padStart(digits + 1, '0');
  if (digits > 0) text = `${text.slice(0, text.length - digits)}.${text.slice(text.length - digits)}`;
  return negative ? `-${text}` : text;
}
