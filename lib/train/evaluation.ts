/**
 * Evaluation and prediction over batches: loss, top-1/top-k counts and the confusion matrix,
 * and the top classes of each sample with their probabilities.
 * @packageDocumentation
 */
import { ResnetError } from '../errors.js';
import type { Tensor } from '../tensor.js';
import { throwIfAborted } from './abort.js';
import type { DeviceBatch } from './batches.js';
import type { EvalCounts } from './distributed.js';
import { ConfusionMatrix, topkCorrect } from './metrics.js';
import type { ProgressBar } from './outputs/logging.js';

/** What `Trainer.evaluate` returns. */
export interface EvalResult {
  /** Mean cross-entropy (with the trainer's label smoothing, as torchvision's reference evaluates). */
  loss: number;
  /** Top-1 accuracy, a fraction in [0, 1]. */
  acc1: number;
  /** Top-k accuracy (k = 5, or the number of classes when fewer), a fraction in [0, 1]. */
  acc5: number;
  /** Samples evaluated. */
  count: number;
  /** Rows: true class, columns: predicted class. */
  confusion: ConfusionMatrix;
  /** Per-class precision, recall, F1 and support, formatted as scikit-learn's `classification_report`. */
  report: string;
}

/** What `Trainer.predict` returns. */
export interface Predictions {
  /** Classes of the model's output. */
  numClasses: number;
  /** Classes reported per sample. */
  topk: number;
  /** The `topk` best classes of each sample, best first: `[n * topk]`. */
  classes: Int32Array;
  /** Their softmax probabilities: `[n * topk]`. */
  probabilities: Float32Array;
  /** All logits, `[n * numClasses]`. */
  logits: Float32Array;
  /** The dataset index of each sample (0..n-1 for a tensor). */
  indices: Int32Array;
}

/**
 * Runs `forward` over `batches` and counts hits and the confusion matrix, over the first `limit`
 * samples only (those of a rank's share that are not padding; see `ownSamples`): `forward` gets
 * how many of the batch's leading samples count and returns the logits of the batch with the mean
 * loss of those (0 when none counts). A batch with none to count is skipped, unless no batch was
 * run yet (the number of classes comes from the logits).
 */
export async function evaluateBatches(
  batches: AsyncIterable<DeviceBatch> | Iterable<DeviceBatch>,
  forward: (batch: DeviceBatch, keep: number) => { logits: Tensor; loss: number },
  bar: ProgressBar | null,
  signal: AbortSignal | null,
  limit = Infinity,
): Promise<EvalCounts> {
  let confusion: ConfusionMatrix | null = null;
  let lossTotal = 0;
  let topHits = 0;
  let count = 0;
  let seen = 0;
  let done = 0;
  for await (const batch of batches) {
    throwIfAborted(signal, 'evaluation');
    const keep = Math.max(0, Math.min(batch.size, limit - seen));
    seen += batch.size;
    if (keep > 0 || !confusion) {
      const { logits: logitsTensor, loss } = forward(batch, keep);
      const all = logitsTensor.toFloat32Array();
      const numClasses = all.length / batch.size;
      const logits = keep === batch.size ? all : all.subarray(0, keep * numClasses);
      const labels = keep === batch.size ? batch.hostLabels : batch.hostLabels.subarray(0, keep);
      confusion ??= new ConfusionMatrix(numClasses);
      confusion.update(logits, labels);
      topHits += topkCorrect(logits, labels, [Math.min(5, numClasses)])[0]!;
      lossTotal += loss * keep;
      count += keep;
    }
    bar?.update(++done);
  }
  bar?.finish();
  if (!confusion) throw new ResnetError('ERR_RC_INVALID_ARGUMENT', 'evaluate: the loader yields no batches');
  return { confusion, lossTotal, topHits, count };
}

/**
 * Class names for `classes` classes: the given names, with the classes the names do not cover
 * (a model with more outputs than the dataset has classes) named by their index.
 */
export function namesFor(classes: number, names: readonly string[] | null): string[] | undefined {
  if (!names) return undefined;
  return Array.from({ length: classes }, (_, i) => names[i] ?? String(i));
}

/** The result of an evaluation's counts (summed over ranks when data-parallel). */
export function evalResult(counts: EvalCounts, classNames: readonly string[] | null): EvalResult {
  const { confusion, lossTotal, topHits, count } = counts;
  return {
    loss: lossTotal / count,
    acc1: confusion.accuracy(),
    acc5: topHits / count,
    count,
    confusion,
    report: confusion.classificationReport(namesFor(confusion.toArray().length, classNames)),
  };
}

/** The top `topkWanted` classes of each sample with their softmax probabilities, from chunks of logits. */
export function rankPredictions(
  chunks: readonly { logits: Float32Array; indices: Int32Array }[],
  numClasses: number,
  topkWanted: number,
): Predictions {
  const n = chunks.reduce((a, c) => a + c.indices.length, 0);
  const topk = Math.min(topkWanted, Math.max(numClasses, 1));
  const logits = new Float32Array(n * numClasses);
  const indices = new Int32Array(n);
  let at = 0;
  for (const c of chunks) {
    logits.set(c.logits, at * numClasses);
    indices.set(c.indices, at);
    at += c.indices.length;
  }
  const classes = new Int32Array(n * topk);
  const probabilities = new Float32Array(n * topk);
  const order = new Array<number>(numClasses);
  for (let s = 0; s < n; s++) {
    const row = logits.subarray(s * numClasses, (s + 1) * numClasses);
    let max = -Infinity;
    for (const v of row) if (v > max) max = v;
    let sum = 0;
    for (const v of row) sum += Math.exp(v - max);
    for (let c = 0; c < numClasses; c++) order[c] = c;
    order.sort((a, b) => row[b]! - row[a]! || a - b);
    for (let j = 0; j < topk; j++) {
      classes[s * topk + j] = order[j]!;
      probabilities[s * topk + j] = Math.exp(row[order[j]!]! - max) / sum;
    }
  }
  return { numClasses, topk, classes, probabilities, logits, indices };
}
