/**
 * A {@link Predictor} over a DataLoader: evaluation (loss, top-1/top-5, confusion matrix, report)
 * and top-k prediction, the same results as `Trainer.evaluate` and `Trainer.predict` compute with
 * the training modules' eval forward, from the fused inference path.
 * @packageDocumentation
 */
import type { DataLoader } from '../data/loader.js';
import { expectInt, expectOptions, invalid } from '../errors.js';
import { IMAGENET_MEAN, IMAGENET_STD, InputNormalize } from '../nn/input.js';
import { CrossEntropyLoss } from '../nn/loss.js';
import type { Tensor } from '../tensor.js';
import { throwIfAborted } from '../train/abort.js';
import { isLoader, loaderBatches, type DeviceBatch } from '../train/batches.js';
import {
  evalResult,
  evaluateBatches,
  rankPredictions,
  type EvalResult,
  type Predictions,
} from '../train/evaluation.js';
import { ProgressBar, type ProgressStream } from '../train/outputs/logging.js';
import { Predictor } from './predictor.js';

/** Options of {@link evaluatePredictor}. */
export interface EvaluatePredictorOptions {
  /** Class names for the report; default the dataset's. */
  classNames?: readonly string[];
  /** Where a progress bar is drawn; none by default. */
  progress?: ProgressStream | false;
  /** Label smoothing of the reported loss, as the Trainer's `labelSmoothing`; default 0. */
  labelSmoothing?: number;
  /** Stops at the next batch with an `AbortError`. */
  signal?: AbortSignal;
}

/** Checks the predictor and the loader of a run. */
function checkRun(predictor: unknown, loader: unknown): void {
  if (!(predictor instanceof Predictor)) invalid('predictor', 'a Predictor', predictor);
  if (!isLoader(loader)) invalid('loader', 'a DataLoader', loader);
}

/**
 * The input conversion of `loader`'s batches: its pipeline's `Normalize` (ImageNet's mean and std
 * when it has none, as the Trainer does), to f32 for the predictor.
 */
function normalizerFor(loader: DataLoader): InputNormalize {
  const stats = loader.normalization() ?? { mean: [...IMAGENET_MEAN], std: [...IMAGENET_STD] };
  return new InputNormalize({ mean: stats.mean, std: stats.std, dtype: 'f32' });
}

/**
 * Runs `predictor` on each batch of `loader`'s current epoch; `use` sees the batch and its logits,
 * which are freed after it returns.
 */
async function eachBatch(
  predictor: Predictor,
  loader: DataLoader,
  use: (batch: DeviceBatch, logits: Tensor) => void,
  signal: AbortSignal | undefined,
): Promise<void> {
  const normalize = normalizerFor(loader);
  try {
    for await (const batch of loaderBatches(loader, predictor.device, loader.epoch, 0)) {
      throwIfAborted(signal ?? null, 'predictor');
      const logits = predictor.predict(normalize.forward(batch.images, batch.flips));
      try {
        use(batch, logits);
      } finally {
        logits.dispose();
      }
    }
  } finally {
    normalize.dispose();
  }
}

/**
 * Evaluates `predictor` on `loader` (on the predictor's device): mean cross-entropy, top-1, top-5,
 * the confusion matrix and the per-class report, as `Trainer.evaluate` reports them.
 */
export async function evaluatePredictor(
  predictor: Predictor,
  loader: DataLoader,
  options: EvaluatePredictorOptions = {},
): Promise<EvalResult> {
  checkRun(predictor, loader);
  const o = expectOptions<EvaluatePredictorOptions>('options', options, [
    'classNames',
    'progress',
    'labelSmoothing',
    'signal',
  ]);
  const loss = new CrossEntropyLoss({ labelSmoothing: o.labelSmoothing ?? 0 });
  const bar =
    o.progress && loader.length > 0
      ? new ProgressBar({ total: loader.length, label: 'val', printEvery: 0, stream: o.progress })
      : null;
  const normalize = normalizerFor(loader);
  // evaluateBatches reads a batch's logits before it asks for the next batch: each batch's
  // logits are freed when the next ones are computed, the last ones at the end.
  let previous: Tensor | null = null;
  try {
    const counts = await evaluateBatches(
      loaderBatches(loader, predictor.device, loader.epoch, 0),
      (batch) => {
        previous?.dispose();
        previous = null;
        const logits = predictor.predict(normalize.forward(batch.images, batch.flips));
        previous = logits;
        return { logits, loss: loss.forward(logits, batch.labels).item() };
      },
      bar,
      o.signal ?? null,
    );
    const names = o.classNames ?? (loader.dataset.classes.length > 0 ? loader.dataset.classes : null);
    return evalResult(counts, names);
  } finally {
    (previous as Tensor | null)?.dispose();
    normalize.dispose();
    loss.dispose();
  }
}

/**
 * The `topk` best classes of every sample of `loader` (in its order) with their softmax
 * probabilities, from `predictor`, as `Trainer.predict` returns them.
 */
export async function predictLoader(
  predictor: Predictor,
  loader: DataLoader,
  options: { topk?: number; signal?: AbortSignal } = {},
): Promise<Predictions> {
  checkRun(predictor, loader);
  const o = expectOptions<{ topk?: number; signal?: AbortSignal }>('options', options, ['topk', 'signal']);
  const topk = expectInt('topk', o.topk ?? 5, 1);
  const chunks: { logits: Float32Array; indices: Int32Array }[] = [];
  let numClasses = 0;
  await eachBatch(
    predictor,
    loader,
    (batch, logits) => {
      const values = logits.toFloat32Array();
      numClasses = values.length / batch.size;
      chunks.push({ logits: values, indices: batch.indices });
    },
    o.signal,
  );
  return rankPredictions(chunks, numClasses, topk);
}
