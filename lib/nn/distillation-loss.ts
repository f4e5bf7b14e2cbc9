/**
 * Knowledge distillation's loss (Hinton, Vinyals and Dean 2015, "Distilling the Knowledge in a
 * Neural Network", arXiv:1503.02531): the student's temperature-softened distribution pulled
 * towards the teacher's, mixed with the usual cross-entropy on the labels; loss and gradient in
 * one native pass.
 * @packageDocumentation
 */
import { addon } from '../binding.js';
import { expectNumber, expectOptions, invalid, mismatch } from '../errors.js';
import { expectTensor, type Tensor } from '../tensor.js';
import { LogitsLoss, type LossLabels } from './loss.js';

/** Options of {@link DistillationLoss}. */
export interface DistillationLossOptions {
  /** The softmax temperature T (> 0) of both distributions in the KL term; default 4. */
  temperature?: number;
  /** The weight of the KL term, in [0, 1]; the cross-entropy gets `1 - alpha`. Default 0.5. */
  alpha?: number;
  /** Label smoothing of the cross-entropy term, as in {@link CrossEntropyLoss}; default 0. */
  labelSmoothing?: number;
}

/** The checked settings of a distillation loss. */
export interface DistillationSettings {
  temperature: number;
  alpha: number;
}

/**
 * Checks a temperature and a mixing weight, naming them with `prefix` (`'distillation.'` in the
 * Trainer's options): the temperature must be a finite number > 0, alpha a number in [0, 1].
 */
export function checkDistillationSettings(
  o: { temperature?: unknown; alpha?: unknown },
  prefix = '',
): DistillationSettings {
  const temperature = expectNumber(`${prefix}temperature`, o.temperature ?? 4, 0);
  if (!(temperature > 0) || !Number.isFinite(temperature)) {
    invalid(`${prefix}temperature`, 'a finite number > 0', o.temperature);
  }
  return { temperature, alpha: expectNumber(`${prefix}alpha`, o.alpha ?? 0.5, 0, 1) };
}

/**
 * Mean over a batch of `alpha * T² * KL(softmax(t/T) ‖ softmax(s/T)) + (1 - alpha) * CE(s, y)`,
 * for student logits `s` and teacher logits `t` `[N, K]` and integer labels `y`: PyTorch's
 * `F.kl_div(F.log_softmax(s/T), F.softmax(t/T), reduction='batchmean') * T*T` mixed with
 * `F.cross_entropy(s, y, label_smoothing=ε)`. The T² keeps the soft term's gradient on the scale
 * of the hard one's as T changes (Hinton et al., section 2). `forward` also computes the gradient
 * with respect to the student's logits (times `gradScale`), which `backward` returns; the teacher
 * gets none. With `alpha = 0` it is exactly {@link CrossEntropyLoss}.
 */
export class DistillationLoss extends LogitsLoss {
  /** The softmax temperature of the KL term. */
  readonly temperature: number;
  /** The weight of the KL term; the cross-entropy's is `1 - alpha`. */
  readonly alpha: number;
  /** The label smoothing of the cross-entropy term. */
  readonly labelSmoothing: number;
  protected readonly lossName = 'DistillationLoss';

  constructor(options: DistillationLossOptions = {}) {
    super();
    const o = expectOptions<DistillationLossOptions>('DistillationLoss options', options, [
      'temperature',
      'alpha',
      'labelSmoothing',
    ]);
    const settings = checkDistillationSettings(o);
    this.temperature = settings.temperature;
    this.alpha = settings.alpha;
    this.labelSmoothing = expectNumber('labelSmoothing', o.labelSmoothing ?? 0, 0, 1);
  }

  /**
   * The mean loss as a one-element f32 tensor on the logits' device (read it with `item()`).
   * `teacherLogits` must have the student's shape, dtype and device; `labels` is an i32 tensor
   * `[N]` on that device, or host integers.
   */
  forward(logits: Tensor, teacherLogits: Tensor, labels: LossLabels): Tensor {
    LogitsLoss.checkLogits(logits);
    expectTensor('teacherLogits', teacherLogits, { rank: 2, dtype: [logits.dtype], device: logits.device });
    if (teacherLogits.shape[0] !== logits.shape[0] || teacherLogits.shape[1] !== logits.shape[1]) {
      mismatch(
        'teacherLogits',
        `the student's shape [${logits.shape.join(', ')}] (the teacher must have as many classes as the student)`,
        `[${teacherLogits.shape.join(', ')}]`,
      );
    }
    return this.compute(logits, labels, 'distillation_loss', (out) => {
      addon().distillationLoss({
        logits: logits.raw,
        teacherLogits: teacherLogits.raw,
        labels: out.labels.raw,
        loss: out.loss.raw,
        dLogits: out.dLogits.raw,
        temperature: this.temperature,
        alpha: this.alpha,
        labelSmoothing: this.labelSmoothing,
        gradScale: this.gradScale,
      });
    });
  }
}
