/**
 * SyncBatchNorm (torch.nn.SyncBatchNorm): batch normalisation whose training statistics span the
 * batches of every process of a {@link ProcessGroup}, and `convertSyncBatchNorm`, which makes the
 * BatchNorm2d layers of a model synchronise.
 *
 * A training forward runs three steps: each rank's per-channel count, mean and M2 (native
 * `syncBatchNormStats`), an all-gather of them, and the forward (`syncBatchNormForward`), which
 * merges the gathered statistics in double with Chan et al.'s pairwise update, normalises, and
 * updates the running statistics with the global unbiased variance. PyTorch all-gathers per-rank
 * mean, inverse std and count for the same reason: sums of squares in f32 cancel when |mean| >> std.
 * The backward reduces sum(g) and sum(g·x̂) locally (`syncBatchNormBackwardReduce`, which also
 * accumulates the local dγ and dβ, as PyTorch: DistributedDataParallel averages them), all-reduces
 * them with the row count, and computes dx from the global sums (`syncBatchNormBackwardElementwise`).
 * @packageDocumentation
 */
import { addon } from '../binding.js';
import { expectOptions, invalid, mismatch } from '../errors.js';
import {
  BatchNorm2d,
  type BatchNorm2dOptions,
  type BatchNormBackwardArgs,
  type BatchNormForwardArgs,
} from '../nn/layers.js';
import type { BatchNormSync } from '../nn/layers.js';
import { Module, disposeAll } from '../nn/module.js';
import { Tensor } from '../tensor.js';
import type { ProcessGroup } from './types.js';

/** The collectives a SyncBatchNorm uses. */
const GROUP_METHODS = ['allGather', 'allReduce', 'wait'] as const;

/** Refuses anything that is not a process group, naming the parameter. */
function expectGroup(name: string, group: unknown): ProcessGroup {
  const g = group as Partial<ProcessGroup> | null;
  if (
    g === null ||
    typeof g !== 'object' ||
    !Number.isInteger(g.worldSize) ||
    (g.worldSize ?? 0) < 1 ||
    typeof g.device !== 'string' ||
    GROUP_METHODS.some((m) => typeof g[m] !== 'function')
  ) {
    invalid(name, 'a ProcessGroup (initProcessGroup)', group);
  }
  return group as ProcessGroup;
}

/** Per-layer scratch: this rank's statistics, everyone's, and the backward sums. */
interface Scratch {
  device: string;
  channels: number;
  stats: Tensor;
  gathered: Tensor;
  sums: Tensor;
}

/** A {@link BatchNormSync} over a process group: one per layer, holding that layer's scratch. */
class GroupBatchNormSync implements BatchNormSync {
  #scratch: Scratch | null = null;

  constructor(readonly group: ProcessGroup) {}

  get active(): boolean {
    return this.group.worldSize > 1;
  }

  checkInput(x: Tensor): void {
    if (x.device !== this.group.device) {
      mismatch(
        'SyncBatchNorm input',
        `a tensor on ${this.group.device} (the process group's device)`,
        `a tensor on ${x.device}`,
      );
    }
  }

  forward(a: BatchNormForwardArgs): void {
    const s = this.#buffers(a.x.device, a.gamma.shape[0] ?? 0);
    addon().syncBatchNormStats({ x: a.x, stats: s.stats.raw });
    this.group.allGather(s.stats, s.gathered);
    this.group.wait();
    addon().syncBatchNormForward({
      x: a.x,
      gamma: a.gamma,
      beta: a.beta,
      ...(a.residual ? { residual: a.residual } : {}),
      y: a.y,
      stats: s.gathered.raw,
      runningMean: a.runningMean,
      runningVar: a.runningVar,
      saveMean: this.#defined(a.saveMean, 'saveMean'),
      saveInvStd: this.#defined(a.saveInvStd, 'saveInvStd'),
      relu: a.relu ?? false,
      momentum: a.momentum ?? 0.1,
      eps: a.eps ?? 1e-5,
    });
  }

  backward(a: BatchNormBackwardArgs): void {
    const s = this.#buffers(a.x.device, a.gamma.shape[0] ?? 0);
    const relu = a.relu ?? false;
    addon().syncBatchNormBackwardReduce({
      x: a.x,
      ...(relu && a.y ? { y: a.y } : {}),
      dy: a.dy,
      saveMean: a.saveMean,
      saveInvStd: a.saveInvStd,
      sums: s.sums.raw,
      dGamma: a.dGamma,
      dBeta: a.dBeta,
      relu,
    });
    this.group.allReduce(s.sums, { op: 'sum' });
    this.group.wait();
    addon().syncBatchNormBackwardElementwise({
      x: a.x,
      ...(relu && a.y ? { y: a.y } : {}),
      dy: a.dy,
      gamma: a.gamma,
      saveMean: a.saveMean,
      saveInvStd: a.saveInvStd,
      sums: s.sums.raw,
      dx: a.dx,
      ...(a.dResidual ? { dResidual: a.dResidual } : {}),
      relu,
    });
  }

  release(): void {
    const s = this.#scratch;
    if (s) disposeAll(s.stats, s.gathered, s.sums);
    this.#scratch = null;
  }

  #defined<T>(value: T | undefined, what: string): T {
    if (value === undefined) invalid(`SyncBatchNorm ${what}`, 'a tensor for the saved statistics', value);
    return value;
  }

  #buffers(device: string, channels: number): Scratch {
    const s = this.#scratch;
    if (s?.device === device && s.channels === channels) return s;
    this.release();
    const fresh: Scratch = {
      device,
      channels,
      stats: Tensor.zeros([3, channels], { device }),
      gathered: Tensor.zeros([this.group.worldSize, 3, channels], { device }),
      sums: Tensor.zeros([3, channels], { device }),
    };
    this.#scratch = fresh;
    return fresh;
  }
}

/** Options of {@link SyncBatchNorm}: those of BatchNorm2d and the process group. */
export interface SyncBatchNormOptions extends BatchNorm2dOptions {
  /** The processes whose batches share the statistics (torch's `process_group`). */
  group: ProcessGroup;
}

/**
 * torch.nn.SyncBatchNorm over NHWC activations: in training, the batch statistics (and the
 * gradient sums of backward) span every rank of `group`, so that ranks holding parts of a batch
 * normalise as one process holding all of it; in evaluation it is plain BatchNorm2d with the running
 * statistics. Same options, parameters, buffers and state-dict names as {@link BatchNorm2d}
 * (checkpoints are interchangeable); in a group of one process it runs BatchNorm2d's own ops, so it
 * equals BatchNorm2d exactly. Ranks may hold different batch sizes (at least one sample each).
 */
export class SyncBatchNorm extends BatchNorm2d {
  /** The group the statistics are shared with. */
  readonly group: ProcessGroup;

  constructor(options: SyncBatchNormOptions) {
    const o = expectOptions<SyncBatchNormOptions>('SyncBatchNorm options', options, [
      'numFeatures',
      'eps',
      'momentum',
      'relu',
      'group',
    ]);
    const group = expectGroup('group', o.group);
    const { group: _group, ...bn } = o;
    super(bn as BatchNorm2dOptions);
    this.group = group;
    this.attachSync(new GroupBatchNormSync(group));
  }
}

/**
 * Makes every BatchNorm2d of `model` (the model itself included) a SyncBatchNorm over `group`, in
 * place (torch.nn.SyncBatchNorm.convert_sync_batchnorm): the layers keep their parameters, buffers,
 * state-dict names and values, so the parameter arena, an optimizer built on it and checkpoints stay
 * valid; only their training-mode statistics become global. Call it on every rank, before
 * training. Returns `model`.
 */
export function convertSyncBatchNorm<M extends Module>(model: M, group: ProcessGroup): M {
  if (!(model instanceof Module)) invalid('model', 'a Module', model);
  const g = expectGroup('group', group);
  for (const [, m] of model.namedModules()) {
    if (m instanceof BatchNorm2d) m.attachSync(new GroupBatchNormSync(g));
  }
  return model;
}
