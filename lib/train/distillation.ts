/**
 * Knowledge distillation in the Trainer: a teacher network, frozen and in evaluation mode, runs on
 * the same converted input as the student in every step, and the student learns from
 * {@link DistillationLoss} instead of the plain cross-entropy.
 * @packageDocumentation
 */
import { ResnetError, expectOptions, invalid } from '../errors.js';
import { DistillationLoss, checkDistillationSettings } from '../nn/distillation-loss.js';
import { Module } from '../nn/module.js';
import type { Tensor } from '../tensor.js';

/** The Trainer's `distillation` option. */
export interface DistillationOptions {
  /**
   * The teacher: any model with the student's classes (a ResNet loaded from trained weights). It
   * is moved to the Trainer's device, kept in evaluation mode and never given gradients; the
   * optimizer does not see it, so its weights do not change.
   */
  teacher: Module;
  /** The softmax temperature T (> 0); default 4. */
  temperature?: number;
  /** The weight of the KL term, in [0, 1]; the cross-entropy gets `1 - alpha`. Default 0.5. */
  alpha?: number;
}

/** The `distillation` option, checked. */
export interface DistillationSpec {
  teacher: Module;
  temperature: number;
  alpha: number;
}

/** The number of classes a model declares (ResNet's `numClasses`), if it declares one. */
function declaredClasses(model: Module): number | undefined {
  const n = (model as { numClasses?: unknown }).numClasses;
  return typeof n === 'number' ? n : undefined;
}

/**
 * Checks the Trainer's `distillation` option against the student: a usable Module other than the
 * student, with its own parameters, and as many classes as the student when both say.
 */
export function parseDistillation(value: unknown, student: Module): DistillationSpec | null {
  if (value === undefined || value === false) return null;
  const o = expectOptions<DistillationOptions>('distillation', value, ['teacher', 'temperature', 'alpha']);
  const teacher = o.teacher;
  if (!(teacher instanceof Module)) invalid('distillation.teacher', 'a Module (e.g. a trained ResNet)', teacher);
  if (teacher.disposed) {
    throw new ResnetError('ERR_RC_DISPOSED', 'distillation.teacher was disposed and cannot be used');
  }
  const studentParameters = new Set(student.parameters());
  if (teacher === student || teacher.parameters().some((p) => studentParameters.has(p))) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      'distillation.teacher must be a separate model, not the student nor one sharing its parameters',
    );
  }
  const teacherClasses = declaredClasses(teacher);
  const studentClasses = declaredClasses(student);
  if (teacherClasses !== undefined && studentClasses !== undefined && teacherClasses !== studentClasses) {
    throw new ResnetError(
      'ERR_RC_INVALID_ARGUMENT',
      `distillation.teacher has ${teacherClasses} classes but the student ${studentClasses}; the teacher must classify the same classes`,
    );
  }
  return { teacher, ...checkDistillationSettings(o, 'distillation.') };
}

/**
 * The teacher and the distillation loss of a Trainer. Per step: `forward` runs the teacher on the
 * student's input and returns the loss; `backward` returns the gradient for the student's logits.
 */
export class Distillation {
  /** The teacher, in evaluation mode on the Trainer's device. */
  readonly teacher: Module;
  /** The loss the student trains on (its `gradScale` is set every step). */
  readonly loss: DistillationLoss;

  constructor(spec: DistillationSpec, options: { device: string; labelSmoothing: number }) {
    this.teacher = spec.teacher.device === options.device ? spec.teacher : spec.teacher.to(options.device);
    this.teacher.eval();
    this.loss = new DistillationLoss({
      temperature: spec.temperature,
      alpha: spec.alpha,
      labelSmoothing: options.labelSmoothing,
    });
  }

  /**
   * The teacher's forward on `input` (the converted batch the student saw), then the loss of the
   * student's `logits` against the teacher's and the labels; a one-element tensor on the device.
   */
  forward(input: Tensor, logits: Tensor, labels: Tensor): Tensor {
    // Evaluation mode every step (running statistics, never batch ones), whatever changed it since.
    this.teacher.eval();
    return this.loss.forward(logits, this.teacher.forward(input), labels);
  }

  /** The gradient with respect to the student's logits of the last `forward`. */
  backward(): Tensor {
    return this.loss.backward();
  }

  /** Frees the loss's buffers (the teacher belongs to the caller). */
  dispose(): void {
    this.loss.dispose();
  }
}
