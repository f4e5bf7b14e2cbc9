/**
 * The Trainer's checkpoint files under `outDir/checkpoints`: periodic `step-NNNNNNNN.safetensors`
 * files of which the last `keepLast` are kept, the `latest.json` pointer, `best.safetensors` with
 * `best.json`, the removal of partial files a killed run left, and finding and reading the
 * checkpoint to resume from.
 * @packageDocumentation
 */
import { mkdir, readFile, readdir, stat, unlink } from 'node:fs/promises';
import { basename, dirname, join, resolve } from 'node:path';
import { ResnetError, defined, invalid } from '../errors.js';
import { decodeSafetensors, removeTemporaries, writeFileAtomic } from './checkpoint.js';
import type { EpochProgress } from './epoch-meter.js';
import type { BestValue, EarlyStoppingState } from './monitors.js';
import type { EpochRecord } from './trainer-types.js';

/** The loop's state saved in a checkpoint's `extra` metadata besides the parts. */
export interface RunState {
  /** The micro-batch of the epoch to continue at (0 at an epoch's end). */
  batch: number;
  epochs: number;
  best: BestValue | null;
  earlyStopping: EarlyStoppingState | null;
  earlyMonitor: string | null;
  history: EpochRecord[];
  trainLossPoints: [number, number][];
  /** The periodic checkpoint files kept, this one included. */
  periodic: string[];
  /**
   * The training data: its seed, length and per-rank batch size, and the number of data-parallel
   * ranks (absent in checkpoints of one-process runs of older releases: 1).
   */
  data: { trainSeed: number; trainLength: number; batchSize: number; worldSize?: number };
  config: Record<string, unknown>;
  /** The epoch's loss, images and time so far, in a checkpoint written inside an epoch. */
  epochProgress?: EpochProgress | null;
}

/** What `Trainer.readCheckpointInfo` returns. */
export interface CheckpointInfo {
  /** The checkpoint file (a pointer or folder resolved). */
  file: string;
  /** The `config` the Trainer was given. */
  config: Record<string, unknown>;
  /** The epoch to continue at (from 0). */
  epoch: number;
  /** Optimizer steps taken. */
  step: number;
  /** The class names of the training data, when it had them. */
  classNames: string[] | null;
  /** The loop's own state (position, best, history); null in checkpoints not written by `Trainer.fit`. */
  run: RunState | null;
  /** What else it holds: the learning-rate state's kind, a moving average, the optimizer's group count. */
  parts: { lr: 'schedule' | 'plateau' | null; ema: boolean; optimizerGroups: number | null };
}

/** Where the latest checkpoint is, for a resume: the pointer file `latest.json` names it. */
export interface LatestPointer {
  file: string;
  epoch: number;
  batch: number;
  step: number;
}

function stepFileName(step: number): string {
  return `step-${String(step).padStart(8, '0')}.safetensors`;
}

/** Writes and prunes the checkpoints of one run folder; see the module documentation. */
export class CheckpointManager {
  /** The checkpoint folder, `outDir/checkpoints`. */
  readonly dir: string;
  readonly #keepLast: number;
  #periodic: string[] = [];
  #lastStep = -1;

  constructor(outDir: string, keepLast: number) {
    this.dir = join(outDir, 'checkpoints');
    this.#keepLast = keepLast;
  }

  /** Creates the folder and removes partial files of a killed run there and in `outDir`. */
  async prepare(): Promise<void> {
    await mkdir(this.dir, { recursive: true });
    await removeTemporaries(this.dir);
    await removeTemporaries(dirname(this.dir));
  }

  /** Continues keep-last-k over a resumed run's files, when it was resumed from this folder. */
  adopt(run: RunState, file: string): void {
    if (resolve(dirname(file)) !== resolve(this.dir)) return;
    // Files of older releases list the kept files without themselves.
    const name = basename(file);
    this.#periodic =
      run.periodic.includes(name) || !/^step-\d+\.safetensors$/.test(name)
        ? [...run.periodic]
        : [...run.periodic, name];
  }

  /** Whether a periodic checkpoint was already written at `step`. */
  hasStep(step: number): boolean {
    return this.#lastStep === step;
  }

  /**
   * Writes the periodic checkpoint of `step` through `write` (given the path and the list of kept
   * files, this one included, to save in it), points `latest.json` at it and removes the files
   * beyond `keepLast`. Returns the file's name.
   */
  async save(
    pointer: Omit<LatestPointer, 'file'>,
    write: (path: string, kept: string[]) => Promise<void>,
  ): Promise<string> {
    const name = stepFileName(pointer.step);
    const kept = [...this.#periodic.filter((n) => n !== name), name].slice(-this.#keepLast);
    await write(join(this.dir, name), kept);
    this.#lastStep = pointer.step;
    await writeFileAtomic(join(this.dir, 'latest.json'), JSON.stringify({ file: name, ...pointer }, null, 2) + '\n');
    const dropped = this.#periodic.filter((n) => !kept.includes(n));
    this.#periodic = kept;
    for (const old of dropped) await unlink(join(this.dir, old)).catch(() => undefined);
    return name;
  }

  /** The periodic files kept so far (for a run state written outside {@link CheckpointManager.save}). */
  get kept(): string[] {
    return [...this.#periodic];
  }

  /** Writes `best.safetensors` through `write` and `best.json` describing it. */
  async saveBest(best: BestValue & { step: number }, write: (path: string) => Promise<void>): Promise<void> {
    await write(join(this.dir, 'best.safetensors'));
    await writeFileAtomic(join(this.dir, 'best.json'), JSON.stringify(best, null, 2) + '\n');
  }
}

/**
 * The checkpoint to resume from: for `true`, the one `outDir/checkpoints/latest.json` names, or
 * null when the folder holds none yet (a first run starts fresh); for a string, that file, pointer
 * or folder.
 */
export async function findResumeFile(resume: true | string, outDir: string | null): Promise<string | null> {
  if (resume !== true) return resolveCheckpointPath(resume);
  const pointer = join(defined(outDir, 'the output folder (resume: true needs one)'), 'checkpoints', 'latest.json');
  if (!(await stat(pointer).catch(() => null))) return null;
  return resolveCheckpointPath(pointer);
}

/** A checkpoint file from a file path, a `latest.json` pointer, or a folder holding one (or `checkpoints/latest.json`). */
export async function resolveCheckpointPath(path: string): Promise<string> {
  if (typeof path !== 'string' || path.length === 0) invalid('checkpoint path', 'a file or folder path', path);
  const info = await stat(path).catch(() => null);
  if (!info) throw new ResnetError('ERR_RC_CHECKPOINT', `${path}: no such checkpoint file or folder`);
  let pointer: string | null = null;
  if (info.isDirectory()) {
    const entries = await readdir(path);
    if (entries.includes('latest.json')) pointer = join(path, 'latest.json');
    else if (entries.includes('checkpoints')) pointer = join(path, 'checkpoints', 'latest.json');
    else throw new ResnetError('ERR_RC_CHECKPOINT', `${path}: holds no latest.json checkpoint pointer`);
  } else if (path.endsWith('.json')) {
    pointer = path;
  }
  if (pointer === null) return path;
  let parsed: { file?: unknown };
  try {
    parsed = JSON.parse(await readFile(pointer, 'utf8')) as { file?: unknown };
  } catch (error) {
    throw new ResnetError(
      'ERR_RC_CHECKPOINT',
      `${pointer}: cannot be read as a checkpoint pointer (${(error as Error).message})`,
    );
  }
  if (parsed === null || typeof parsed.file !== 'string' || parsed.file.includes('/') || parsed.file.includes('\\')) {
    throw new ResnetError('ERR_RC_CHECKPOINT', `${pointer}: does not name a checkpoint file`);
  }
  return join(dirname(pointer), parsed.file);
}

/** Reads the config, progress, run state and parts of a checkpoint without restoring anything. */
export async function readCheckpointInfo(path: string): Promise<CheckpointInfo> {
  const file = await resolveCheckpointPath(path);
  const bytes = await readFile(file).catch((error: unknown) => {
    const reason = error instanceof Error ? error.message : String(error);
    throw new ResnetError('ERR_RC_CHECKPOINT', `${file}: cannot be read (${reason})`);
  });
  const { metadata } = decodeSafetensors(bytes, file);
  if (metadata.format !== 'resnet-cuda-checkpoint') {
    throw new ResnetError('ERR_RC_CHECKPOINT', `${file}: is not a resnet-cuda checkpoint`);
  }
  let progress: { epoch: number; step: number };
  let extra: { run?: RunState; classNames?: string[] };
  let lr: { kind?: string } | null;
  let optimizer: { paramGroups?: unknown[] } | null;
  try {
    progress = JSON.parse(metadata.progress ?? '{}') as { epoch: number; step: number };
    extra = JSON.parse(metadata.extra ?? '{}') as { run?: RunState; classNames?: string[] };
    lr = metadata.scheduler === undefined ? null : (JSON.parse(metadata.scheduler) as { kind?: string });
    optimizer =
      metadata.optimizer === undefined ? null : (JSON.parse(metadata.optimizer) as { paramGroups?: unknown[] });
  } catch {
    throw new ResnetError('ERR_RC_CHECKPOINT', `${file}: has unreadable metadata`);
  }
  if (progress === null || typeof progress !== 'object' || extra === null || typeof extra !== 'object') {
    throw new ResnetError('ERR_RC_CHECKPOINT', `${file}: has malformed progress metadata`);
  }
  return {
    file,
    config: extra.run?.config ?? {},
    epoch: progress.epoch,
    step: progress.step,
    classNames: extra.classNames ?? null,
    run: extra.run ?? null,
    parts: {
      lr: lr?.kind === 'schedule' || lr?.kind === 'plateau' ? lr.kind : null,
      ema: metadata.ema !== undefined,
      optimizerGroups: Array.isArray(optimizer?.paramGroups) ? optimizer.paramGroups.length : null,
    },
  };
}
