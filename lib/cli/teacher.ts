/**
 * `train --teacher`: knowledge distillation on the command line. The options, their checks, and
 * the teacher loaded from a run folder, a training checkpoint or a weights file, with the loading
 * `eval` and `predict` use.
 * @packageDocumentation
 */
import { existsSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { isTorchFile } from '../nn/pretrained.js';
import type { ResNet } from '../nn/resnet.js';
import { MODEL_NAMES, readSafetensors, type ModelName } from './common.js';
import { loadModel } from './inference.js';
import { UsageError, type OptionSpec } from './options.js';

const SECTION = 'Knowledge distillation';

/** The options of `train` that distil a teacher into the model being trained. */
export const TEACHER_OPTIONS: OptionSpec[] = [
  {
    name: 'teacher',
    type: 'path',
    valueName: 'PATH',
    help: "Distil this trained model into the one being trained: a run folder (its model.safetensors, else its latest checkpoint), a training checkpoint, or a weights file with torchvision's names (safetensors, or PyTorch's .pth/.pt). It must have the run's classes.",
    section: SECTION,
  },
  {
    name: 'teacher-model',
    type: 'choice',
    choices: MODEL_NAMES,
    defaultText: 'read from the file',
    help: "The teacher's network, checked against the file.",
    section: SECTION,
  },
  {
    name: 'kd-temperature',
    type: 'number',
    min: 0,
    exclusiveMin: true,
    default: 4,
    valueName: 'T',
    help: 'Softmax temperature of the distillation term.',
    section: SECTION,
  },
  {
    name: 'kd-alpha',
    type: 'number',
    min: 0,
    max: 1,
    default: 0.5,
    valueName: 'A',
    help: 'Weight of the distillation term; the cross-entropy on the labels gets 1 - A.',
    section: SECTION,
  },
];

/** The values of {@link TEACHER_OPTIONS}, by camelCase name. */
export interface TeacherArgs {
  teacher: string | undefined;
  teacherModel: ModelName | undefined;
  kdTemperature: number;
  kdAlpha: number;
}

/** The options that only a run with `--teacher` reads, for `train`'s table of dependent options. */
export const TEACHER_DEPENDENT = {
  keys: ['teacherModel', 'kdTemperature', 'kdAlpha'],
  applies: (a: { teacher?: string | undefined }): boolean => a.teacher !== undefined,
  refusal: (_: unknown, flag: string): string => `${flag} needs --teacher PATH`,
} as const;

/** A loaded teacher, in evaluation mode on the run's device. */
export interface LoadedTeacher {
  model: ResNet;
  /** A line for the run's log: what was loaded, from where. */
  note: string;
}

/** What `--teacher PATH` names: a training checkpoint (or a run folder of them) or a weights file. */
async function teacherSource(path: string): Promise<{ checkpoint: string } | { weights: string }> {
  if (!existsSync(path)) throw new UsageError(`--teacher '${path}' does not exist`);
  if (statSync(path).isDirectory()) {
    const weights = join(path, 'model.safetensors');
    return existsSync(weights) ? { weights } : { checkpoint: path };
  }
  if (path.endsWith('.json')) return { checkpoint: path };
  if (isTorchFile(path)) return { weights: path };
  const { metadata } = await readSafetensors(path);
  return metadata.format === 'resnet-cuda-checkpoint' ? { checkpoint: path } : { weights: path };
}

/**
 * Loads `--teacher` on `device` and checks it against `--teacher-model` and the run's classes.
 * @throws {@link UsageError} when it is another network than `--teacher-model` names, or
 *   classifies another number of classes.
 */
export async function loadTeacher(
  a: TeacherArgs,
  run: { device: string; numClasses: number },
  cwd: string,
): Promise<LoadedTeacher | undefined> {
  if (a.teacher === undefined) return undefined;
  const loaded = await loadModel(await teacherSource(a.teacher), run.device, cwd);
  const { arch } = loaded;
  try {
    if (a.teacherModel !== undefined && a.teacherModel !== arch.model) {
      throw new UsageError(`--teacher-model ${a.teacherModel} does not match --teacher, which holds a ${arch.model}`);
    }
    if (arch.numClasses !== run.numClasses) {
      throw new UsageError(
        `--teacher has ${arch.numClasses} classes but this run's data has ${run.numClasses}`,
        'Distil a teacher trained on the same classes.',
      );
    }
  } catch (error) {
    loaded.model.dispose();
    throw error;
  }
  return {
    model: loaded.model,
    note: `distilling a ${arch.model} teacher from ${loaded.source}: temperature ${a.kdTemperature}, alpha ${a.kdAlpha}`,
  };
}
