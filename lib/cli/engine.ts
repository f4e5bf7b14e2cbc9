/**
 * The forward `eval` and `predict` run: the fused inference path (a {@link Predictor}: batch norm
 * folded, ReLU and residual add fused into the convolutions, one native plan per batch shape), or
 * the training modules' eval forward through a Trainer (`--engine modules`). Both give the same
 * results to f32 rounding.
 * @packageDocumentation
 */
import type { DataLoader } from '../data/loader.js';
import { ResnetError } from '../errors.js';
import { Predictor, type PredictorDType } from '../inference/predictor.js';
import { evaluatePredictor, predictLoader } from '../inference/predictor-runs.js';
import type { ResNet } from '../nn/resnet.js';
import type { EvalResult, Predictions } from '../train/evaluation.js';
import type { AmpName } from './common.js';
import { inferenceTrainer } from './inference.js';
import { CliError, type CliStream, type OptionSpec } from './options.js';

/** The forwards `eval` and `predict` can run. */
export const ENGINES = ['fused', 'modules'] as const;

/** A forward: the fused inference path or the training modules. */
export type EngineName = (typeof ENGINES)[number];

/** The `--engine` option of `eval` and `predict`. */
export function engineOption(section: string): OptionSpec {
  return {
    name: 'engine',
    type: 'choice',
    choices: ENGINES,
    defaultText: 'fused',
    help: "fused: the inference path (batch norm folded, ReLU and residual add fused into the convolutions, no gradient buffers); modules: the training modules' eval forward. Both give the same results to f32 rounding.",
    section,
  };
}

/** What {@link openEngine} returns: evaluation and prediction over a loader, on one forward. */
export interface InferenceEngine {
  /** The forward that runs. */
  readonly name: EngineName;
  /** Loss, Acc@1, Acc@5, confusion matrix and report over the loader. */
  evaluate(loader: DataLoader): Promise<EvalResult>;
  /** The `topk` best classes of every sample, in the loader's order. */
  predict(loader: DataLoader, topk: number): Promise<Predictions>;
  /** Frees what the engine holds (not the model). */
  dispose(): Promise<void>;
}

/** The Predictor precision of a run's mixed precision. */
function predictorDType(amp: AmpName): PredictorDType {
  return amp === 'bf16' ? 'bf16' : amp === 'fp16' ? 'f16' : 'f32';
}

function modulesEngine(
  model: ResNet,
  o: { device: string; amp: AmpName; progress: CliStream | false; classNames?: readonly string[] | undefined },
): InferenceEngine {
  const trainer = inferenceTrainer(model, o);
  return {
    name: 'modules',
    evaluate: (loader) => trainer.evaluate(loader),
    predict: (loader, topk) => trainer.predict(loader, { topk }),
    dispose: () => trainer.dispose(),
  };
}

/**
 * The engine `eval` or `predict` runs `model` on. The fused one makes its plan for `batchShape`
 * (a full batch, NHWC) now, so that a backend without an inference plan is known before any work:
 * then, unless `--engine fused` was given, the modules run instead and `note` says why.
 * @throws {@link CliError} when `--engine fused` was given and the device has no inference plan
 *   for the model and precision.
 */
export function openEngine(
  model: ResNet,
  o: {
    engine: EngineName | undefined;
    device: string;
    amp: AmpName;
    progress: CliStream | false;
    classNames?: readonly string[] | undefined;
    batchShape: readonly [number, number, number, number];
  },
): { engine: InferenceEngine; note?: string } {
  if (o.engine === 'modules') return { engine: modulesEngine(model, o) };
  const dtype = predictorDType(o.amp);
  const predictor = new Predictor(model, { device: o.device, dtype });
  try {
    predictor.implementation(o.batchShape);
  } catch (error) {
    predictor.dispose();
    if (!(error instanceof ResnetError) || error.code !== 'ERR_RC_BACKEND_UNAVAILABLE') throw error;
    if (o.engine === 'fused') {
      throw new CliError(
        `--engine fused: ${error.message}`,
        "Run the training modules' forward with --engine modules.",
        error.code,
      );
    }
    return {
      engine: modulesEngine(model, o),
      note: `note: no fused inference path for ${dtype} on ${o.device} (${error.message}); running the training modules' forward`,
    };
  }
  const classNames = o.classNames;
  return {
    engine: {
      name: 'fused',
      evaluate: (loader) =>
        evaluatePredictor(predictor, loader, {
          progress: o.progress,
          ...(classNames ? { classNames } : {}),
        }),
      predict: (loader, topk) => predictLoader(predictor, loader, { topk }),
      dispose: () => {
        predictor.dispose();
        return Promise.resolve();
      },
    },
  };
}
