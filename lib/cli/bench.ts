/**
 * `resnet-cuda bench`: training throughput on synthetic data that stays on the device, so that
 * only the model is measured: input conversion, forward, loss, backward and the SGD step, timed
 * between device synchronisations after a warm-up (as the project's GPU benchmark does), eagerly
 * or replayed as one CUDA graph; or, with `--model-only`, the roofline model of the step (lib/analysis/roofline.ts).
 * @packageDocumentation
 */
import { resolve } from 'node:path';
import { GPU_NAMES, type GpuName } from '../analysis/gpu-peaks.js';
import { stepRoofline, type RooflinePlan } from '../analysis/roofline.js';
import { listBackends } from '../device.js';
import { ResnetError } from '../errors.js';
import { FUSED_ENV, FUSED_PATH_NAMES, fusedPaths, type FusedPath } from '../fused-paths.js';
import { parseCheckpointSegments, setCheckpointing } from '../nn/checkpoint.js';
import { Profiler } from '../profile/profiler.js';
import type { ProfileSummary } from '../profile/report.js';
import { benchmarkTraining } from '../train/benchmark.js';
import {
  MODEL_NAMES,
  SHARED_OPTIONS,
  buildModel,
  checkAmp,
  checkDevice,
  type AmpName,
  type ModelName,
} from './common.js';
import { UsageError, type CliIO, type Command, type CommandSpec, type ParsedCommand } from './options.js';

const SPEC: CommandSpec = {
  name: 'bench',
  summary: 'Measure training throughput.',
  description:
    'Measures training throughput with synthetic images already on the device: one step is the input conversion, forward, cross-entropy, backward and an SGD step (momentum, Nesterov, weight decay). ' +
    'After --warmup steps, --steps steps are timed between device synchronisations; the result is ms/step, images/s and the peak device memory. The data loader is not part of it. ' +
    "With --model-only nothing runs: the step's roofline model gives per op type its FLOPs, bytes and launches and the lower bound of the step time on --gpu, for the default (unfused) plan, the plan as built with the fused paths of --fused on, and the fused target.",
  positionals: [],
  options: [
    { name: 'model', type: 'choice', choices: MODEL_NAMES, default: 'resnet50', help: 'The network.' },
    {
      name: 'batch-size',
      short: 'b',
      type: 'int',
      min: 1,
      valueName: 'N',
      defaultText: '256 on cuda, 16 on cpu',
      help: 'Images per step.',
    },
    { name: 'size', type: 'int', min: 8, default: 224, valueName: 'PX', help: 'Image height and width.' },
    { name: 'num-classes', type: 'int', min: 1, default: 1000, valueName: 'N', help: 'Output classes.' },
    {
      name: 'small-input',
      type: 'boolean',
      help: 'Use the small-image stem (3x3 stride-1, no pooling), as train does for crops up to 64 px.',
    },
    SHARED_OPTIONS.device,
    { ...SHARED_OPTIONS.amp, default: undefined, defaultText: 'bf16 on cuda, none on cpu' },
    { name: 'steps', type: 'int', min: 1, valueName: 'N', defaultText: '30 on cuda, 5 on cpu', help: 'Timed steps.' },
    {
      name: 'warmup',
      type: 'int',
      min: 0,
      valueName: 'N',
      defaultText: '5 on cuda, 2 on cpu',
      help: 'Untimed steps first (algorithm selection, allocations).',
    },
    { name: 'cuda-graph', type: 'boolean', help: 'Capture one step as a CUDA graph and time its replays (CUDA only).' },
    {
      name: 'grad-checkpoint',
      type: 'string',
      valueName: 'stage|N',
      help: 'Gradient checkpointing per stage (stage) or every N blocks, to measure its memory saving and time cost.',
    },
    {
      name: 'profile',
      type: 'boolean',
      help: 'Profile the timed steps: per-op times by op type and layer, printed, and a Chrome trace (see --profile-trace).',
    },
    {
      name: 'profile-trace',
      type: 'string',
      valueName: 'FILE',
      default: 'trace.json',
      help: 'Where --profile writes the Chrome trace (open it in Perfetto or chrome://tracing).',
    },
    {
      name: 'model-only',
      type: 'boolean',
      help: 'Run nothing: print the roofline model of the step (FLOPs, GB moved, launches and the lower bound of the time, per op type) for --gpu.',
    },
    {
      name: 'gpu',
      type: 'choice',
      choices: GPU_NAMES,
      default: 'h200',
      help: 'With --model-only: the GPU whose peaks bound the step.',
    },
    {
      name: 'plan',
      type: 'choice',
      choices: ['current', 'built', 'fused', 'both', 'all'],
      default: 'both',
      help: 'With --model-only: the default (unfused) kernels, the kernels as built with the --fused paths on, the fused target; both: current and fused; all: the three.',
    },
    {
      name: 'fused',
      type: 'string',
      valueName: 'LIST|all',
      defaultText: `the ${FUSED_ENV} names`,
      help: `With --model-only and --plan built or all: the fused paths switched on, as ${FUSED_ENV} takes them (${FUSED_PATH_NAMES.join(', ')}, all, or none).`,
    },
    {
      name: 'launch-overhead-us',
      type: 'number',
      min: 0,
      default: 0,
      valueName: 'US',
      help: 'With --model-only: microseconds added to the bound per kernel launch.',
    },
    SHARED_OPTIONS.json,
  ],
  examples: [
    'resnet-cuda bench --device cuda --amp bf16 -b 256',
    'resnet-cuda bench --model resnet18 --size 64 -b 8 --steps 3',
    'resnet-cuda bench --device cuda --cuda-graph --json',
    'resnet-cuda bench --model resnet18 --size 32 --small-input -b 8 --steps 3 --profile',
    'resnet-cuda bench --model-only --gpu h200 --amp bf16 -b 256 --plan both',
    'resnet-cuda bench --model-only --gpu h200 --amp bf16 -b 256 --plan all --fused all',
  ],
};

interface BenchArgs {
  model: ModelName;
  batchSize: number | undefined;
  size: number;
  numClasses: number;
  smallInput: boolean;
  device: string;
  amp: AmpName | undefined;
  steps: number | undefined;
  warmup: number | undefined;
  cudaGraph: boolean;
  gradCheckpoint: string | undefined;
  profile: boolean;
  profileTrace: string;
  modelOnly: boolean;
  gpu: GpuName;
  plan: RooflinePlan | 'both' | 'all';
  fused: string | undefined;
  launchOverheadUs: number;
  json: boolean;
}

/** What `bench --json` prints. */
export interface BenchResult {
  model: ModelName;
  device: string;
  deviceName: string | undefined;
  amp: AmpName;
  batchSize: number;
  size: number;
  steps: number;
  warmup: number;
  cudaGraph: boolean;
  msPerStep: number;
  imagesPerSecond: number;
  peakMemoryBytes: number;
  loss: number;
  /** With --profile: the per-op totals (their times include the profiler's cost in the step time). */
  profile?: ProfileSummary;
  /** With --profile: the trace file written. */
  trace?: string;
}

// The benchmark runs synchronously; the command's `run` still reports a failure as a rejection.
function bench(parsed: ParsedCommand, io: CliIO): number {
  const a = parsed.values as unknown as BenchArgs;
  if (a.modelOnly) return modelOnly(a, parsed, io);
  for (const [key, flag] of [
    ['gpu', 'gpu'],
    ['plan', 'plan'],
    ['fused', 'fused'],
    ['launchOverheadUs', 'launch-overhead-us'],
  ] as const) {
    if (parsed.explicit.has(key)) throw new UsageError(`--${flag} goes with --model-only`);
  }
  const device = checkDevice(a.device);
  const cuda = device.startsWith('cuda');
  const amp: AmpName = a.amp ?? (cuda ? 'bf16' : 'none');
  checkAmp(amp, device);
  if (a.cudaGraph && !cuda) throw new UsageError(`--cuda-graph needs a CUDA device, but --device is ${device}`);
  const segments = a.gradCheckpoint === undefined ? null : parseCheckpointSegments(a.gradCheckpoint);
  if (a.gradCheckpoint !== undefined && segments === null) {
    throw new UsageError(`--grad-checkpoint expects stage or a number of blocks N >= 1, got '${a.gradCheckpoint}'`);
  }
  if (a.profile && a.cudaGraph) {
    throw new UsageError('--profile times the ops of eager steps; a replayed --cuda-graph runs none: leave one out');
  }
  const batch = a.batchSize ?? (cuda ? 256 : 16);
  const steps = a.steps ?? (cuda ? 30 : 5);
  const warmup = a.warmup ?? (cuda ? 5 : 2);
  const backend = listBackends().find((b) => b.name === (cuda ? 'cuda' : 'cpu'));
  const dtype = amp === 'bf16' ? 'bf16' : amp === 'fp16' ? 'f16' : 'f32';

  const model = buildModel({ model: a.model, numClasses: a.numClasses, smallInput: a.smallInput }, { device, seed: 1 });
  if (segments !== null) setCheckpointing(model, { segments });
  const say = (text: string) => {
    if (!a.json) io.stderr.write(`${text}\n`);
  };
  const props = backend?.properties ?? {};
  const detail = cuda
    ? [props.runtime && `CUDA ${props.runtime}`, props.cudnn && `cuDNN ${props.cudnn}`]
    : [
        props.onednn && `oneDNN ${props.onednn}`,
        props.isa,
        props.bf16 === 'native' ? undefined : props.bf16 && `bf16 ${props.bf16}`,
        props.threads && `${props.threads} threads`,
      ];
  say(
    `resnet-cuda bench: ${a.model}, batch ${batch}, ${a.size} px, ${amp === 'none' ? 'fp32' : amp}, ${device} (${[backend?.device, ...detail].filter(Boolean).join(', ')})`,
  );
  say(`warm-up: ${warmup} step${warmup === 1 ? '' : 's'}, then ${steps} timed step${steps === 1 ? '' : 's'}`);
  const profiler = a.profile ? new Profiler({ model }) : null;
  const measured = benchmarkTraining({
    model,
    device,
    numClasses: a.numClasses,
    dtype,
    batch,
    size: a.size,
    steps,
    warmup,
    cudaGraph: a.cudaGraph,
    ...(profiler ? { profiler } : {}),
  });
  const ms = measured.msPerStep;
  const result: BenchResult = {
    model: a.model,
    device,
    deviceName: backend?.device,
    amp,
    batchSize: batch,
    size: a.size,
    steps,
    warmup,
    cudaGraph: a.cudaGraph,
    msPerStep: ms,
    imagesPerSecond: measured.imagesPerSecond,
    peakMemoryBytes: measured.peakMemoryBytes,
    loss: measured.loss,
  };
  let profileText = '';
  if (profiler) {
    const trace = resolve(io.cwd, a.profileTrace);
    profiler.writeChromeTrace(trace);
    result.profile = profiler.summary();
    result.trace = trace;
    profileText = `\n${profiler.table()}trace: ${trace} (open it in https://ui.perfetto.dev or chrome://tracing)\n`;
  }
  if (a.json) {
    io.stdout.write(`${JSON.stringify(result, null, 2)}\n`);
  } else {
    io.stdout.write(
      `${ms.toFixed(1)} ms/step, ${result.imagesPerSecond.toFixed(1)} img/s, peak memory ${(result.peakMemoryBytes / 2 ** 30).toFixed(2)} GiB` +
        ` (${a.model}, batch ${batch}, ${a.size} px, ${amp === 'none' ? 'fp32' : amp}, ${device}${a.cudaGraph ? ', CUDA graph' : ''}${a.gradCheckpoint !== undefined ? `, gradient checkpointing ${a.gradCheckpoint}` : ''})\n`,
    );
  }
  if (!a.json) io.stdout.write(profileText);
  return 0;
}

/** What `bench --model-only --json` prints. */
export interface BenchModelResult {
  model: ModelName;
  size: number;
  /** One entry per plan: {@link StepRoofline.toJSON}. */
  plans: Record<string, unknown>[];
}

// --model-only: the roofline of the step (lib/analysis/roofline.ts); nothing runs on a device.
function modelOnly(a: BenchArgs, parsed: ParsedCommand, io: CliIO): number {
  for (const [key, flag] of [
    ['device', 'device'],
    ['steps', 'steps'],
    ['warmup', 'warmup'],
    ['cudaGraph', 'cuda-graph'],
    ['gradCheckpoint', 'grad-checkpoint'],
    ['profile', 'profile'],
  ] as const) {
    if (parsed.explicit.has(key)) throw new UsageError(`--model-only runs nothing: leave out --${flag}`);
  }
  const amp = a.amp ?? 'bf16';
  if (amp === 'none') {
    throw new UsageError(
      '--model-only models mixed precision (--amp bf16 or fp16); f32 runs on CUDA cores, which the peaks table does not list',
    );
  }
  const plans: RooflinePlan[] =
    a.plan === 'both' ? ['current', 'fused'] : a.plan === 'all' ? ['current', 'built', 'fused'] : [a.plan];
  if (a.fused !== undefined && !plans.includes('built')) throw new UsageError('--fused goes with --plan built or all');
  const fused = plans.includes('built') ? [...builtFusedPaths(a.fused, io.env)] : [];
  const model = buildModel(
    { model: a.model, numClasses: a.numClasses, smallInput: a.smallInput },
    { device: 'cpu', seed: 1 },
  );
  try {
    const results = plans.map((plan) =>
      stepRoofline(model, {
        batchSize: a.batchSize ?? 256,
        inputSize: a.size,
        amp,
        gpu: a.gpu,
        plan,
        ...(plan === 'built' ? { fused } : {}),
        launchOverheadUs: a.launchOverheadUs,
      }),
    );
    if (a.json) {
      const out: BenchModelResult = { model: a.model, size: a.size, plans: results.map((r) => r.toJSON()) };
      io.stdout.write(`${JSON.stringify(out, null, 2)}\n`);
      return 0;
    }
    io.stdout.write(`resnet-cuda bench --model-only: ${a.model}, ${a.size} px, ${amp}; lower bounds, nothing run\n\n`);
    for (const r of results) io.stdout.write(`${r.format()}\n`);
    const current = results.find((r) => r.plan === 'current');
    for (const r of results) {
      if (!current || r === current) continue;
      io.stdout.write(
        `${r.plan} / current: ${(r.bytes / current.bytes).toFixed(2)}x the bytes, ${r.total.launches} / ${current.total.launches} launches, ` +
          `bound ${r.imagesPerSecond.toFixed(0)} / ${current.imagesPerSecond.toFixed(0)} images/s (${(r.imagesPerSecond / current.imagesPerSecond).toFixed(2)}x)\n`,
      );
    }
    return 0;
  } finally {
    model.dispose();
  }
}

/**
 * The fused paths of the built plan: --fused parsed as RESNET_CUDA_FUSED is (`none` for none), or
 * that variable's names when --fused is left out.
 */
function builtFusedPaths(value: string | undefined, env: CliIO['env']): ReadonlySet<FusedPath> {
  const list = value?.trim() === 'none' ? '' : value;
  try {
    return fusedPaths(list === undefined ? { [FUSED_ENV]: env[FUSED_ENV] } : { [FUSED_ENV]: list });
  } catch (error) {
    if (!(error instanceof ResnetError) || list === undefined) throw error;
    throw new UsageError(`--fused: ${error.message.replace(`${FUSED_ENV}: `, '')}, none`);
  }
}

/** The `bench` command. */
export const benchCommand: Command = {
  spec: SPEC,
  run: (parsed, io) =>
    new Promise((resolve) => {
      resolve(bench(parsed, io));
    }),
};
