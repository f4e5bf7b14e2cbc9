/**
 * `resnet-cuda train`: torchvision's `references/classification/train.py` as a command. Options
 * are checked together before anything is built; then checkpoint (when resuming) → data → model
 * → optimizer and schedule → Trainer → the epoch loop, with Ctrl-C stopping cleanly after the
 * current step.
 * @packageDocumentation
 */
import { randomInt } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync } from 'node:fs';
import { basename, dirname, join, resolve } from 'node:path';
import { DataLoader } from '../data/loader.js';
import type { Interpolation } from '../data/transforms.js';
import { ResnetError, defined } from '../errors.js';
import { parseCheckpointSegments, setCheckpointing } from '../nn/checkpoint.js';
import type { StateDict } from '../nn/module.js';
import { loadPretrained, readWeightsFile } from '../nn/pretrained.js';
import type { ResNet } from '../nn/resnet.js';
import { AdamW, LAMB } from '../optim/adam.js';
import { parameterGroups, type Optimizer } from '../optim/optimizer.js';
import { SGD } from '../optim/sgd.js';
import { ProfileStepsCallback, parseStepRange } from '../profile/trainer-callback.js';
import { writeFileAtomic } from '../train/checkpoint.js';
import { formatDuration } from '../train/outputs/logging.js';
import {
  ConstantSchedule,
  ConstantWarmup,
  CosineAnnealingLR,
  ExponentialLR,
  LinearWarmup,
  MultiStepLR,
  OneCycleLR,
  Schedule,
  SequentialSchedule,
  StepLR,
  scaleLrForBatch,
} from '../train/schedules.js';
import { Trainer, type TrainerOptions } from '../train/trainer.js';
import {
  DATASET_NAMES,
  DATA_LAYOUTS,
  MODEL_NAMES,
  SHARED_OPTIONS,
  ampOption,
  architectureOf,
  buildModel,
  checkAmp,
  checkBatchMemory,
  checkDevice,
  datasetDefaults,
  displayPath,
  imageSizeOption,
  latestRun,
  locateData,
  openTrainData,
  partialRunConfig,
  percent,
  precisionText,
  timestampName,
  trainTransform,
  valResizeFor,
  valTransform,
  warnBf16ComputedInF32,
  workerCount,
  type AmpName,
  type Architecture,
  type DataFiles,
  type DatasetName,
  type ModelName,
  type RunConfig,
} from './common.js';
import {
  FINE_TUNE_DEPENDENT,
  FINE_TUNE_OPTIONS,
  applyFreezeBackbone,
  checkFineTune,
  fineTuneParams,
  type FineTuneArgs,
} from './fine-tune.js';
import { PRUNE_DEPENDENT, PRUNE_TRAIN_OPTIONS, trainPruning, type PruneArgs } from './prune-train.js';
import {
  CliError,
  UsageError,
  kebabCase,
  type CliIO,
  type Command,
  type CommandSpec,
  type OptionSpec,
  type OptionValue,
  type ParsedCommand,
} from './options.js';
import { TEACHER_DEPENDENT, TEACHER_OPTIONS, loadTeacher, type LoadedTeacher, type TeacherArgs } from './teacher.js';
import { writeRunArtifact } from './train-artifact.js';
import {
  isRestart,
  joinGroup,
  launchedWorldSize,
  relaunch,
  restartResume,
  shareRunSettings,
} from './train-distributed.js';

const SCHEDULERS = [
  'cosineannealinglr',
  'steplr',
  'multisteplr',
  'exponentiallr',
  'onecyclelr',
  'plateau',
  'constant',
] as const;
type SchedulerName = (typeof SCHEDULERS)[number];
/** The `--opt` values. */
export const OPTIMIZERS = ['sgd', 'sgd-nesterov', 'adamw', 'lamb'] as const;
type OptimizerName = (typeof OPTIMIZERS)[number];
const MONITORS = [
  'val/acc1',
  'val/acc5',
  'val/loss',
  'train/loss',
  'val_ema/acc1',
  'val_ema/acc5',
  'val_ema/loss',
] as const;

/**
 * The defaults of the built-in demo (no DATA): ResNet-18 with the small-image stem on 32 px
 * shapes, SGD with Nesterov momentum, a 10-step linear warm-up and cosine decay; 100 steps
 * of 32 images reach 95-100% validation accuracy, in a few minutes on two CPU cores.
 */
const DEMO_DEFAULTS: Record<string, OptionValue> = {
  epochs: 2,
  opt: 'sgd-nesterov',
  lr: 0.01,
  weightDecay: 5e-4,
  labelSmoothing: 0.05,
  lrScheduler: 'cosineannealinglr',
  lrWarmupEpochs: 0.2,
  lrWarmupMethod: 'linear',
  lrWarmupDecay: 0.1,
  workers: 1,
};

function option(spec: OptionSpec): OptionSpec {
  const demo = DEMO_DEFAULTS[spec.name.replace(/-([a-z])/g, (_, c: string) => c.toUpperCase())];
  if (demo === undefined) return spec;
  const base = spec.defaultText ?? (spec.default === undefined ? 'none' : String(spec.default));
  return { ...spec, defaultText: `${base}; built-in dataset: ${String(demo)}` };
}

const S_DATA = 'Data';
const S_MODEL = 'Model';
const S_OPT = 'Optimizer';
const S_LR = 'Learning-rate schedule';
const S_TRAIN = 'Training';
const S_OUT = 'Checkpoints and logs';

const OPTIONS: OptionSpec[] = [
  {
    name: 'dataset',
    type: 'choice',
    choices: DATASET_NAMES,
    valueName: 'KIND',
    defaultText: 'imagefolder with DATA, else shapes (the built-in dataset)',
    help: 'What DATA holds.',
    section: S_DATA,
  },
  {
    name: 'data-path',
    type: 'path',
    mustExist: 'dir',
    valueName: 'DIR',
    help: 'DATA given as an option, as train.py takes it.',
    section: S_DATA,
  },
  option({ ...SHARED_OPTIONS.workers, section: S_DATA }),
  {
    name: 'decode',
    type: 'choice',
    choices: ['cpu', 'gpu'],
    default: 'cpu',
    help: 'Where the JPEGs are decoded: cpu (the workers decode and augment), or gpu (the workers only read the files; nvJPEG decodes and the device crops, resizes and flips, overlapping the previous step). gpu needs --device cuda and --dataset imagefolder of JPEGs.',
    section: S_DATA,
  },
  imageSizeOption(
    'train-crop-size',
    'Training crop size (RandomResizedCrop).',
    '224; 32 for CIFAR and the built-in dataset, 28 for MNIST',
    S_DATA,
  ),
  imageSizeOption(
    'val-resize-size',
    'Validation resize of the smaller edge.',
    "for imagefolder the validation crop size x 256/224 (torchvision's 256 for 224), else the validation crop size",
    S_DATA,
  ),
  imageSizeOption('val-crop-size', 'Validation center crop size.', 'the training crop size', S_DATA),
  { ...SHARED_OPTIONS.interpolation, default: 'bilinear', section: S_DATA },

  { name: 'model', type: 'choice', choices: MODEL_NAMES, default: 'resnet18', help: 'The network.', section: S_MODEL },
  {
    name: 'num-classes',
    type: 'int',
    min: 1,
    valueName: 'N',
    defaultText: "the dataset's classes; 4 for the built-in dataset, 1000 for synthetic",
    help: 'Output classes.',
    section: S_MODEL,
  },
  {
    name: 'stem',
    type: 'choice',
    choices: ['auto', 'imagenet', 'small'],
    default: 'auto',
    help: 'The first layers: imagenet (7x7 stride-2 convolution and max pooling) or small (3x3 stride-1, no pooling, for 28-64 px images); auto picks small for crops up to 64 px.',
    section: S_MODEL,
  },
  {
    name: 'weights',
    aliases: ['pretrained'],
    type: 'path',
    mustExist: 'file',
    valueName: 'FILE',
    help: "Start from these pretrained weights (fine-tuning): safetensors, or PyTorch's .pth/.pt (torch.save of a state dict, such as torchvision's model zoo files, or a training checkpoint holding one under model). With a different number of classes, fc is new and everything else is loaded.",
    section: S_MODEL,
  },
  {
    name: 'freeze',
    type: 'strings',
    valueName: 'PREFIXES',
    help: 'Comma-separated parameter prefixes not to train, e.g. conv1,bn1,layer1.',
    section: S_MODEL,
  },
  ...FINE_TUNE_OPTIONS,
  ...PRUNE_TRAIN_OPTIONS,
  {
    name: 'grad-checkpoint',
    type: 'string',
    valueName: 'stage|N',
    help: 'Gradient checkpointing: keep only the input and output of each stage (stage) or of every N blocks, and recompute the activations inside in backward; less memory for about one more forward of those blocks per step.',
    section: S_MODEL,
  },
  ...TEACHER_OPTIONS,

  option({ name: 'opt', type: 'choice', choices: OPTIMIZERS, default: 'sgd', help: 'The optimizer.', section: S_OPT }),
  option({
    name: 'lr',
    type: 'number',
    min: 0,
    exclusiveMin: true,
    default: 0.1,
    valueName: 'LR',
    help: 'Initial (peak) learning rate.',
    section: S_OPT,
  }),
  {
    name: 'lr-scale-batch',
    type: 'int',
    min: 1,
    valueName: 'B',
    help: 'Linear scaling rule: multiply --lr by (batch size x --accumulate) / B, e.g. 256 for ImageNet recipes.',
    section: S_OPT,
  },
  {
    name: 'momentum',
    type: 'number',
    min: 0,
    max: 1,
    default: 0.9,
    valueName: 'M',
    help: 'SGD momentum.',
    section: S_OPT,
  },
  option({
    name: 'weight-decay',
    aliases: ['wd'],
    type: 'number',
    min: 0,
    default: 1e-4,
    valueName: 'WD',
    help: 'Weight decay.',
    section: S_OPT,
  }),
  {
    name: 'norm-weight-decay',
    type: 'number',
    min: 0,
    max: 0,
    valueName: '0',
    help: 'Weight decay of BatchNorm parameters and biases: 0 (none) is the one value supported; without it they decay like the weights.',
    section: S_OPT,
  },
  option({
    name: 'label-smoothing',
    type: 'number',
    min: 0,
    max: 1,
    default: 0,
    valueName: 'S',
    help: 'Label smoothing of the cross-entropy loss.',
    section: S_OPT,
  }),
  {
    name: 'clip-grad-norm',
    type: 'number',
    min: 0,
    exclusiveMin: true,
    valueName: 'NORM',
    help: 'Clip the gradients to this total L2 norm.',
    section: S_OPT,
  },

  option({
    name: 'lr-scheduler',
    type: 'choice',
    choices: SCHEDULERS,
    default: 'steplr',
    help: 'The schedule after the warm-up (plateau: divide by --lr-gamma when --monitor stops improving).',
    section: S_LR,
  }),
  option({
    name: 'lr-warmup-epochs',
    type: 'number',
    min: 0,
    default: 0,
    valueName: 'E',
    help: 'Warm-up length in epochs (fractions allowed; applied per step).',
    section: S_LR,
  }),
  option({
    name: 'lr-warmup-method',
    type: 'choice',
    choices: ['linear', 'constant'],
    default: 'constant',
    help: 'Warm-up shape.',
    section: S_LR,
  }),
  option({
    name: 'lr-warmup-decay',
    type: 'number',
    min: 0,
    max: 1,
    exclusiveMin: true,
    default: 0.01,
    valueName: 'F',
    help: 'The warm-up starts at --lr times this.',
    section: S_LR,
  }),
  {
    name: 'lr-step-size',
    type: 'int',
    min: 1,
    default: 30,
    valueName: 'E',
    help: 'steplr: epochs between decays.',
    section: S_LR,
  },
  {
    name: 'lr-milestones',
    type: 'ints',
    min: 1,
    valueName: 'E,E,...',
    help: 'multisteplr: epochs (after the warm-up) at which to decay.',
    section: S_LR,
  },
  {
    name: 'lr-gamma',
    type: 'number',
    min: 0,
    exclusiveMin: true,
    default: 0.1,
    valueName: 'G',
    help: 'Decay factor of steplr, multisteplr, exponentiallr (per epoch) and plateau.',
    section: S_LR,
  },
  {
    name: 'lr-min',
    type: 'number',
    min: 0,
    default: 0,
    valueName: 'LR',
    help: 'The floor of cosineannealinglr and plateau.',
    section: S_LR,
  },
  {
    name: 'lr-plateau-patience',
    type: 'int',
    min: 0,
    default: 10,
    valueName: 'N',
    help: 'plateau: evaluations without improvement before the decay.',
    section: S_LR,
  },

  { ...SHARED_OPTIONS.device, section: S_TRAIN },
  {
    name: 'batch-size',
    short: 'b',
    type: 'int',
    min: 1,
    default: 32,
    valueName: 'N',
    help: 'Images per batch.',
    section: S_TRAIN,
  },
  option({
    name: 'epochs',
    type: 'int',
    min: 1,
    default: 90,
    valueName: 'N',
    help: 'Epochs to train (a resumed run continues to this number).',
    section: S_TRAIN,
  }),
  { ...SHARED_OPTIONS.amp, section: S_TRAIN },
  {
    name: 'accumulate',
    type: 'int',
    min: 1,
    default: 1,
    valueName: 'K',
    help: 'Batches per optimizer step (gradient accumulation).',
    section: S_TRAIN,
  },
  {
    name: 'cuda-graph',
    type: 'boolean',
    help: 'Capture the training step as one CUDA graph after a few eager steps and replay it (CUDA only; a configuration that cannot be captured trains eagerly and says why).',
    section: S_TRAIN,
  },
  {
    name: 'sync-bn',
    type: 'boolean',
    help: 'Data-parallel training: batch-norm statistics over every rank (SyncBatchNorm) instead of per rank.',
    section: S_TRAIN,
  },
  {
    name: 'nproc-per-node',
    type: 'int',
    min: 1,
    valueName: 'N',
    help: 'Run N data-parallel processes on this machine (resnet-cuda launch --nproc-per-node N -- train ...); --batch-size is per process.',
    section: S_TRAIN,
  },
  {
    name: 'model-ema',
    type: 'boolean',
    help: 'Keep an exponential moving average of the weights and evaluate it too.',
    section: S_TRAIN,
  },
  {
    name: 'model-ema-steps',
    type: 'int',
    min: 1,
    default: 32,
    valueName: 'N',
    help: 'Optimizer steps between updates of the average.',
    section: S_TRAIN,
  },
  {
    name: 'model-ema-decay',
    type: 'number',
    min: 0,
    max: 1,
    default: 0.99998,
    valueName: 'D',
    help: 'Decay of the average, adjusted for batch size, --model-ema-steps and epochs as train.py does.',
    section: S_TRAIN,
  },
  {
    name: 'qat',
    type: 'boolean',
    help: 'Quantization-aware training: fake-quantized INT8 weights (per channel) and inputs (per tensor, observed) in every convolution and the fc; start from a trained model with --weights and a low lr.',
    section: S_TRAIN,
  },
  {
    name: 'qat-freeze-observers',
    type: 'int',
    min: 0,
    valueName: 'STEPS',
    help: 'With --qat: freeze the activation observers after this many optimizer steps.',
    section: S_TRAIN,
  },
  {
    name: 'seed',
    type: 'int',
    min: 0,
    max: 2 ** 31 - 1,
    valueName: 'N',
    defaultText: "random (printed; a resumed run takes its checkpoint's)",
    help: 'Seed of the initialisation, shuffling and augmentation.',
    section: S_TRAIN,
  },
  {
    name: 'early-stopping-patience',
    type: 'int',
    min: 1,
    valueName: 'N',
    help: 'Stop when --monitor has not improved for N evaluations.',
    section: S_TRAIN,
  },
  {
    name: 'early-stopping-min-delta',
    type: 'number',
    min: 0,
    default: 0,
    valueName: 'D',
    help: 'The least change of --monitor that counts as an improvement.',
    section: S_TRAIN,
  },
  {
    name: 'monitor',
    type: 'choice',
    choices: MONITORS,
    default: 'val/acc1',
    help: 'The metric for the best checkpoint, early stopping and plateau.',
    section: S_TRAIN,
  },
  {
    name: 'max-steps',
    type: 'int',
    min: 1,
    valueName: 'N',
    help: 'Stop after N optimizer steps in all (a checkpoint is written there).',
    section: S_TRAIN,
  },
  {
    name: 'dry-run',
    type: 'int',
    min: 1,
    valueName: 'N',
    help: 'Debugging: train and evaluate on the first N batches only, every epoch (a model that cannot overfit them has a bug); no checkpoints.',
    section: S_TRAIN,
  },
  {
    name: 'profile-steps',
    type: 'string',
    valueName: 'A:B',
    help: 'Profile optimizer steps A to B (or step A): per-op times by op type and layer, printed, and a Chrome trace written to trace.json in the output folder.',
    section: S_OUT,
  },

  {
    name: 'output-dir',
    type: 'path',
    valueName: 'DIR',
    defaultText: 'runs/<date>_<time>',
    help: 'Where checkpoints, logs, charts and the final weights go.',
    section: S_OUT,
  },
  {
    name: 'resume',
    type: 'string',
    valueName: 'CKPT',
    valueWhenBare: 'latest',
    help: "Continue a run: a checkpoint file, a run folder, or latest (also the flag alone) for --output-dir's latest checkpoint (the newest run under runs/ without --output-dir).",
    section: S_OUT,
  },
  {
    name: 'keep-last',
    type: 'int',
    min: 1,
    default: 3,
    valueName: 'K',
    help: 'Periodic checkpoints kept (best.safetensors is kept apart).',
    section: S_OUT,
  },
  {
    name: 'checkpoint-every-steps',
    type: 'int',
    min: 1,
    valueName: 'N',
    help: 'Also write a checkpoint every N optimizer steps within epochs.',
    section: S_OUT,
  },
  {
    name: 'print-freq',
    type: 'int',
    min: 1,
    default: 10,
    valueName: 'N',
    help: 'Optimizer steps between training-loss records (log, TensorBoard, progress).',
    section: S_OUT,
  },
  { name: 'no-tensorboard', type: 'boolean', help: 'Write no TensorBoard event files.', section: S_OUT },
  {
    name: 'mlflow',
    type: 'path',
    valueName: 'DIR',
    valueWhenBare: 'mlruns',
    help: 'Also track the run in an MLflow file store (mlflow ui --backend-store-uri DIR): parameters, metrics, weights and charts as artifacts. The flag alone means ./mlruns; put it after DATA, or write --mlflow=DIR.',
    section: S_OUT,
  },
  {
    name: 'mlflow-experiment',
    type: 'string',
    valueName: 'NAME',
    default: 'Default',
    help: 'The MLflow experiment (created when the store has none of that name); the run is named after the output folder.',
    section: S_OUT,
  },
  { name: 'no-plots', type: 'boolean', help: 'Write no PNG charts.', section: S_OUT },
  {
    name: 'quiet',
    short: 'q',
    type: 'boolean',
    help: 'No progress lines: only the summary at the end and errors.',
    section: S_OUT,
  },
];

const SPEC: CommandSpec = {
  name: 'train',
  summary: 'Train a ResNet.',
  description:
    "Trains a ResNet like torchvision's references/classification/train.py. Without DATA it runs the demo: ResNet-18 on the built-in generated dataset (coloured shapes, 32 px, 4 classes), which reaches 95-100% validation accuracy in 100 steps (a few minutes on two CPU cores).\n\n" +
    'The output folder receives checkpoints/ (latest, best and the last --keep-last), log.jsonl, tensorboard/, curves-*.png, confusion-matrix.png, classification-report.txt, model.safetensors, artifact/ (the best model as an inference artifact, for predict --model DIR), summary.json and config.json (every option the run reads, defaults included, re-runnable with --config). Ctrl-C (SIGINT), SIGTERM (docker stop, Slurm and Kubernetes preemption) and SIGHUP stop the run after the current step and write a checkpoint (exit codes 130, 143 and 129); a second signal while stopping quits at once.',
  positionals: [
    {
      name: 'DATA',
      help: `The dataset folder. imagefolder: ${DATA_LAYOUTS.imagefolder}; cifar10, cifar100, mnist and fashion-mnist: their binary files; nothing for synthetic and shapes.`,
      configKey: 'data',
    },
  ],
  options: OPTIONS,
  examples: [
    'resnet-cuda train                                   # the demo on the built-in dataset',
    'resnet-cuda train data/imagenet --model resnet50 --device cuda --amp bf16 -b 256 --lr 0.1 --epochs 90',
    'resnet-cuda train data/imagenet --model resnet50 --opt sgd --lr 0.5 --lr-scheduler cosineannealinglr --lr-warmup-epochs 5 \\',
    '    --lr-warmup-method linear --label-smoothing 0.1 --wd 2e-5 --norm-weight-decay 0 --model-ema --device cuda --amp bf16',
    'resnet-cuda train data/cifar-10-batches-bin --dataset cifar10 --epochs 30 --lr-scheduler onecyclelr --opt sgd-nesterov',
    'resnet-cuda train data/pets --weights resnet50.safetensors --freeze conv1,bn1,layer1 --lr 0.01 --epochs 10',
    'resnet-cuda train data/pets --model resnet50 --pretrained resnet50-11ad3fa6.pth --backbone-lr-scale 0.1 --lr 0.01 --epochs 10',
    'resnet-cuda train --resume --output-dir runs/r50    # continue where it stopped',
    'resnet-cuda train data/imagenet --model resnet50 --teacher runs/r152 --kd-temperature 4 --kd-alpha 0.9 --device cuda',
  ],
};

/** The options of `train` after defaults and presets, by camelCase name. */
interface TrainArgs extends TeacherArgs, PruneArgs, FineTuneArgs {
  dataset: DatasetName;
  data: string | undefined;
  workers: number;
  decode: 'cpu' | 'gpu';
  trainCropSize: number;
  valResizeSize: number;
  valCropSize: number;
  interpolation: Interpolation;
  model: ModelName;
  numClasses: number | undefined;
  stem: 'auto' | 'imagenet' | 'small';
  weights: string | undefined;
  freeze: string[] | undefined;
  gradCheckpoint: string | undefined;
  opt: OptimizerName;
  lr: number;
  lrScaleBatch: number | undefined;
  momentum: number;
  weightDecay: number;
  normWeightDecay: number | undefined;
  labelSmoothing: number;
  clipGradNorm: number | undefined;
  lrScheduler: SchedulerName;
  lrWarmupEpochs: number;
  lrWarmupMethod: 'linear' | 'constant';
  lrWarmupDecay: number;
  lrStepSize: number;
  lrMilestones: number[] | undefined;
  lrGamma: number;
  lrMin: number;
  lrPlateauPatience: number;
  device: string;
  batchSize: number;
  epochs: number;
  amp: AmpName;
  accumulate: number;
  cudaGraph: boolean;
  syncBn: boolean;
  nprocPerNode: number | undefined;
  modelEma: boolean;
  modelEmaSteps: number;
  modelEmaDecay: number;
  qat: boolean;
  qatFreezeObservers: number | undefined;
  seed: number | undefined;
  earlyStoppingPatience: number | undefined;
  earlyStoppingMinDelta: number;
  monitor: (typeof MONITORS)[number];
  maxSteps: number | undefined;
  dryRun: number | undefined;
  profileSteps: string | undefined;
  outputDir: string | undefined;
  resume: string | undefined;
  keepLast: number;
  checkpointEverySteps: number | undefined;
  printFreq: number;
  noTensorboard: boolean;
  mlflow: string | undefined;
  mlflowExperiment: string;
  noPlots: boolean;
  quiet: boolean;
}

/** Which schedulers read which options. */
const SCHEDULER_OPTIONS: Record<string, readonly SchedulerName[]> = {
  lrStepSize: ['steplr'],
  lrMilestones: ['multisteplr'],
  lrGamma: ['steplr', 'multisteplr', 'exponentiallr', 'plateau'],
  lrMin: ['cosineannealinglr', 'plateau'],
  lrPlateauPatience: ['plateau'],
};

/**
 * Options that only some runs read. Giving one that this run ignores is a mistake (refused with
 * `refusal`); `config.json` leaves them out, so that it can be passed back with `--config`.
 */
const DEPENDENT_OPTIONS: readonly {
  keys: readonly string[];
  applies: (a: TrainArgs) => boolean;
  refusal: (a: TrainArgs, flag: string) => string;
}[] = [
  ...Object.entries(SCHEDULER_OPTIONS).map(([key, users]) => ({
    keys: [key],
    applies: (a: TrainArgs) => users.includes(a.lrScheduler),
    refusal: (a: TrainArgs, flag: string) =>
      `${flag} is not used by --lr-scheduler ${a.lrScheduler} (only by ${users.join(', ')})`,
  })),
  {
    keys: ['momentum'],
    applies: (a) => a.opt === 'sgd' || a.opt === 'sgd-nesterov',
    refusal: (a) => `--momentum applies to --opt sgd and sgd-nesterov, not ${a.opt}`,
  },
  {
    keys: ['lrWarmupMethod', 'lrWarmupDecay'],
    applies: (a) => a.lrWarmupEpochs > 0,
    refusal: (_, flag) => `${flag} needs --lr-warmup-epochs above 0`,
  },
  {
    keys: ['modelEmaSteps', 'modelEmaDecay'],
    applies: (a) => a.modelEma,
    refusal: () => '--model-ema-steps and --model-ema-decay need --model-ema',
  },
  {
    keys: ['qatFreezeObservers'],
    applies: (a) => a.qat,
    refusal: () => '--qat-freeze-observers needs --qat',
  },
  {
    keys: ['earlyStoppingMinDelta'],
    applies: (a) => a.earlyStoppingPatience !== undefined,
    refusal: () => '--early-stopping-min-delta needs --early-stopping-patience',
  },
  {
    keys: ['mlflowExperiment'],
    applies: (a) => a.mlflow !== undefined,
    refusal: () => '--mlflow-experiment needs --mlflow',
  },
  {
    keys: ['checkpointEverySteps', 'keepLast'],
    applies: (a) => a.dryRun === undefined,
    refusal: () => '--dry-run writes no checkpoints: drop --checkpoint-every-steps and --keep-last',
  },
  TEACHER_DEPENDENT,
  PRUNE_DEPENDENT,
  FINE_TUNE_DEPENDENT,
];

/**
 * Resolves the parsed options: the built-in dataset's presets, the per-dataset image sizes, and
 * every check that involves more than one option.
 * @throws {@link UsageError} for contradictions, naming the options.
 */
function resolveArgs(parsed: ParsedCommand, warn: (text: string) => void): { args: TrainArgs; files: DataFiles } {
  const v = { ...parsed.values } as Record<string, OptionValue | undefined>;
  const explicit = parsed.explicit;
  const set = (key: string) => explicit.has(key);

  if (parsed.positionals.length > 0 && v.dataPath !== undefined) {
    throw new UsageError('give DATA either as an argument or with --data-path, not both');
  }
  const data = parsed.positionals[0] ?? (v.dataPath as string | undefined);
  const dataset = (v.dataset as DatasetName | undefined) ?? (data === undefined ? 'shapes' : 'imagefolder');
  if (dataset === 'shapes') for (const [key, value] of Object.entries(DEMO_DEFAULTS)) if (!set(key)) v[key] = value;
  v.trainCropSize ??= datasetDefaults(dataset).trainCropSize;
  // Evaluation at the scale of training: photographs resized in train.py's ratio (256 for a
  // 224 crop) and center-cropped, the small fixed-size datasets taken whole.
  v.valCropSize ??= v.trainCropSize;
  v.valResizeSize ??= dataset === 'imagefolder' ? valResizeFor(v.valCropSize as number) : v.valCropSize;
  v.workers = workerCount(v.workers as number | undefined, warn);
  const a = { ...v, dataset, data } as unknown as TrainArgs;

  const files = locateData(dataset, data, 'train');

  if (dataset === 'shapes' && a.numClasses !== undefined && (a.numClasses < 2 || a.numClasses > 6)) {
    throw new UsageError(`--num-classes must be 2 to 6 with the built-in dataset, got ${a.numClasses}`);
  }
  if (a.valCropSize > a.valResizeSize) {
    throw new UsageError(
      `--val-crop-size ${a.valCropSize} is larger than --val-resize-size ${a.valResizeSize}: the crop would be padded`,
    );
  }
  if (a.normWeightDecay !== undefined && a.normWeightDecay !== 0) {
    throw new UsageError('--norm-weight-decay supports only 0 (no decay on BatchNorm parameters and biases)');
  }
  for (const dependent of DEPENDENT_OPTIONS) {
    const given = dependent.keys.find((key) => set(key));
    if (given !== undefined && !dependent.applies(a)) {
      throw new UsageError(dependent.refusal(a, `--${kebabCase(given)}`));
    }
  }
  if (a.lrScheduler === 'multisteplr' && a.lrMilestones === undefined) {
    throw new UsageError('--lr-scheduler multisteplr needs --lr-milestones, e.g. --lr-milestones 30,60,80');
  }
  if (a.lrWarmupEpochs > 0 && a.lrScheduler === 'plateau') {
    throw new UsageError(
      '--lr-warmup-epochs cannot be combined with --lr-scheduler plateau: the plateau reduction sets the learning rate itself',
      'Drop the warm-up, or use a schedule such as cosineannealinglr.',
    );
  }
  if (a.lrWarmupEpochs > 0 && a.lrScheduler === 'onecyclelr') {
    throw new UsageError(
      '--lr-warmup-epochs cannot be combined with --lr-scheduler onecyclelr, whose first phase is its own warm-up',
    );
  }
  if (a.lrWarmupEpochs >= a.epochs) {
    throw new UsageError(`--lr-warmup-epochs ${a.lrWarmupEpochs} must be less than --epochs ${a.epochs}`);
  }
  if (a.monitor.startsWith('val_ema') && !a.modelEma) throw new UsageError(`--monitor ${a.monitor} needs --model-ema`);
  if (a.qat && a.modelEma) throw new UsageError('--qat cannot be combined with --model-ema');
  if (a.stem === 'small' && a.trainCropSize > 128) {
    throw new UsageError(
      `--stem small keeps full resolution through the first stage; it is meant for crops up to 64 px, not --train-crop-size ${a.trainCropSize}`,
    );
  }
  if (a.gradCheckpoint !== undefined && parseCheckpointSegments(a.gradCheckpoint) === null) {
    throw new UsageError(`--grad-checkpoint expects stage or a number of blocks N >= 1, got '${a.gradCheckpoint}'`);
  }
  if (a.profileSteps !== undefined) profileRange(a.profileSteps);
  checkFineTune(a);
  const device = checkDeviceName(a.device);
  checkAmp(a.amp, device);
  warnBf16ComputedInF32(a.amp, device, warn);
  if (a.decode === 'gpu' && dataset !== 'imagefolder') {
    throw new UsageError(`--decode gpu decodes JPEG files (--dataset imagefolder), not the ${dataset} dataset`);
  }
  if (a.decode === 'gpu' && !device.startsWith('cuda')) {
    throw new UsageError(
      `--decode gpu decodes on the training device: use it with --device cuda or cuda:N, not ${device}`,
    );
  }
  return { args: { ...a, device }, files };
}

function checkDeviceName(device: string): string {
  if (device === 'cpu' || device === 'cuda' || /^cuda:\d{1,4}$/.test(device)) return device;
  throw new UsageError(`--device expects cpu, cuda or cuda:N, got '${device}'`);
}

/**
 * Where the run writes, and the checkpoint it continues from.
 * @throws {@link UsageError} for `--resume` with options that start a run afresh, a checkpoint
 *   that is not there, or an output folder that already holds a run (without `--resume`).
 */
function resolveOutput(
  a: { outputDir?: string; resume?: string; dryRun?: number; weights?: string },
  cwd: string,
  existingRun: 'refuse' | 'allow' = 'refuse',
): { outDir: string; resume: string | undefined } {
  if (a.resume !== undefined) {
    if (a.dryRun !== undefined) throw new UsageError('--dry-run (a debugging run without checkpoints) cannot --resume');
    if (a.weights !== undefined) {
      throw new UsageError(
        '--weights starts a new run from a weights file and --resume continues a run from its checkpoint: give one of them',
      );
    }
    if (a.resume.length === 0) throw new UsageError('--resume needs a checkpoint path or latest');
  }
  const runsRoot = join(cwd, 'runs');
  if (a.resume === undefined) {
    const outDir = a.outputDir ?? uniqueDir(join(runsRoot, timestampName()));
    if (existingRun === 'refuse' && existsSync(join(outDir, 'checkpoints', 'latest.json')) && a.dryRun === undefined) {
      throw new UsageError(
        `--output-dir '${outDir}' already holds a run (checkpoints/latest.json)`,
        'Continue it with --resume, or choose another --output-dir.',
      );
    }
    return { outDir, resume: undefined };
  }
  if (a.resume === 'latest') {
    const outDir = a.outputDir ?? latestRun(runsRoot);
    if (outDir === undefined) {
      throw new UsageError(
        `--resume latest: no run with a checkpoint under '${runsRoot}'`,
        'Name the run with --output-dir, or the checkpoint file with --resume FILE.',
      );
    }
    if (!existsSync(join(outDir, 'checkpoints', 'latest.json'))) {
      throw new UsageError(`--resume latest: '${outDir}' holds no checkpoints/latest.json`);
    }
    return { outDir, resume: join(outDir, 'checkpoints') };
  }
  const target = resolve(cwd, a.resume);
  if (!existsSync(target)) throw new UsageError(`--resume '${target}' does not exist`);
  // A checkpoint inside a run's checkpoints/ folder continues that run's folder.
  const inRun =
    basename(dirname(target)) === 'checkpoints'
      ? dirname(dirname(target))
      : existsSync(join(target, 'checkpoints'))
        ? target
        : undefined;
  return { outDir: a.outputDir ?? inRun ?? uniqueDir(join(runsRoot, timestampName())), resume: target };
}

function uniqueDir(base: string): string {
  let dir = base;
  for (let i = 2; existsSync(dir); i++) dir = `${base}-${i}`;
  return dir;
}

/** The learning-rate schedule over `stepsPerEpoch` optimizer steps per epoch (as the Trainer counts them). */
function buildSchedule(a: TrainArgs, stepsPerEpoch: number): Schedule | undefined {
  if (a.lrScheduler === 'plateau') return undefined;
  const warmupSteps = Math.round(a.lrWarmupEpochs * stepsPerEpoch);
  const mainSteps = Math.max(1, a.epochs * stepsPerEpoch - warmupSteps);
  let main: Schedule;
  switch (a.lrScheduler) {
    // Cosine and one-cycle are smooth curves: per step. The step decays count epochs, as in train.py.
    case 'cosineannealinglr':
      main = new CosineAnnealingLR({ tMax: mainSteps, minLr: a.lrMin });
      break;
    case 'onecyclelr':
      main = new OneCycleLR({ totalSteps: a.epochs * stepsPerEpoch });
      break;
    case 'steplr':
      main = new StepLR({ stepSize: a.lrStepSize, gamma: a.lrGamma, interval: 'epoch' });
      break;
    case 'multisteplr':
      main = new MultiStepLR({ milestones: a.lrMilestones ?? [], gamma: a.lrGamma, interval: 'epoch' });
      break;
    case 'exponentiallr':
      main = new ExponentialLR({ gamma: a.lrGamma, interval: 'epoch' });
      break;
    case 'constant':
      main = new ConstantSchedule();
      break;
  }
  if (warmupSteps === 0) return main;
  const warmup =
    a.lrWarmupMethod === 'linear'
      ? new LinearWarmup({ totalIters: warmupSteps, startFactor: a.lrWarmupDecay })
      : new ConstantWarmup({ totalIters: warmupSteps, factor: a.lrWarmupDecay });
  return new SequentialSchedule({ schedules: [warmup, main], milestones: [warmupSteps] });
}

/** The optimizer `--opt`, `--momentum`, `--weight-decay` and `--norm-weight-decay` describe, at `lr` (`lr-find` builds its own so). */
export function buildOptimizer(
  a: Pick<TrainArgs, 'opt' | 'momentum' | 'weightDecay' | 'normWeightDecay'> &
    Partial<Pick<TrainArgs, 'backboneLrScale'>>,
  model: ResNet,
  lr: number,
): Optimizer<{ lr: number }> {
  const groups =
    a.normWeightDecay === 0
      ? parameterGroups(model, { weightDecay: a.weightDecay, noWeightDecayOnNormAndBias: true })
      : undefined;
  const params = fineTuneParams({ backboneLrScale: a.backboneLrScale }, model, groups, lr) ?? model;
  switch (a.opt) {
    case 'sgd':
    case 'sgd-nesterov':
      return new SGD(params, {
        lr,
        momentum: a.momentum,
        weightDecay: a.weightDecay,
        nesterov: a.opt === 'sgd-nesterov',
      });
    case 'adamw':
      return new AdamW(params, { lr, weightDecay: a.weightDecay });
    case 'lamb':
      return new LAMB(params, { lr, weightDecay: a.weightDecay });
  }
}

/** Marks the parameters under the given prefixes as not trained. */
function freeze(model: ResNet, prefixes: readonly string[]): number {
  const named = model.namedParameters();
  let frozen = 0;
  for (const prefix of prefixes) {
    const matches = named.filter(([name]) => name === prefix || name.startsWith(`${prefix}.`));
    if (matches.length === 0) {
      const top = [...new Set(named.map(([name]) => name.split('.')[0]!))];
      throw new UsageError(
        `--freeze: no parameter is under '${prefix}'`,
        `The top-level modules are ${top.join(', ')}; deeper prefixes such as layer1.0 work too.`,
      );
    }
    for (const [, p] of matches) {
      if (p.requiresGrad) frozen += p.numel;
      p.requiresGrad = false;
    }
  }
  return frozen;
}

/**
 * Reads `--weights` and checks it against the run's model and stem, before any data is opened.
 * @throws {@link UsageError} when the file holds another architecture than the options ask for.
 */
function readStartWeights(file: string, model: ModelName, smallInput: boolean): StateDict {
  const tensors = readWeightsFile(file);
  const found = architectureOf(tensors);
  if (!found) {
    throw new CliError(
      `--weights '${file}' does not hold ResNet weights with torchvision's names (conv1.weight, layer1.0…, fc.weight)`,
    );
  }
  if (found.model !== model) {
    throw new UsageError(
      `--weights '${file}' holds a ${found.model}, but --model is ${model}`,
      `Pass --model ${found.model}.`,
    );
  }
  if (found.smallInput !== smallInput) {
    throw new UsageError(
      `--weights '${file}' has the ${found.smallInput ? 'small' : 'imagenet'} stem, but this run uses the ${smallInput ? 'small' : 'imagenet'} one`,
      `Pass --stem ${found.smallInput ? 'small' : 'imagenet'}.`,
    );
  }
  return tensors;
}

/** Loads the `--weights` tensors, leaving out the classifier when its number of classes differs (see `loadPretrained`). */
function loadStartWeights(tensors: StateDict, model: ResNet, numClasses: number, file: string): string {
  // readStartWeights has recognised the architecture, classifier included.
  const fc = defined(tensors.get('fc.weight'), `fc.weight of ${file}`);
  const { replacedHead } = loadPretrained(model, tensors, `--weights '${file}'`);
  if (!replacedHead) return `loaded ${file}`;
  return `loaded ${file} without its classifier (${fc.shape[0]} classes; this run has ${numClasses}): fc is new`;
}

/** `--profile-steps`, read, or a usage error saying what is wrong with it. */
function profileRange(text: string): { first: number; last: number } {
  try {
    return parseStepRange(text, '--profile-steps');
  } catch (error) {
    if (error instanceof ResnetError) throw new UsageError(error.message);
    throw error;
  }
}

/** Options that say where and how verbosely this invocation works, not what the run is. */
const INVOCATION_OPTIONS = ['outputDir', 'resume', 'dataPath', 'verbose', 'quiet', 'profileSteps', 'nprocPerNode'];

/**
 * The options file written into the run folder: every option the run uses, resolved (defaults,
 * presets, sizes, seed, classes and stem included), re-runnable with `--config`.
 */
function resolvedOptions(
  parsed: ParsedCommand,
  a: TrainArgs,
  resolved: { seed: number; numClasses: number; smallInput: boolean },
): Record<string, unknown> {
  const unused = new Set(DEPENDENT_OPTIONS.filter((d) => !d.applies(a)).flatMap((d) => d.keys));
  const out: Record<string, unknown> = {};
  if (a.data !== undefined) out.data = a.data;
  for (const key of Object.keys(parsed.values)) {
    const value = (a as unknown as Record<string, unknown>)[key];
    if (value !== undefined && !INVOCATION_OPTIONS.includes(key) && !unused.has(key)) out[key] = value;
  }
  return {
    ...out,
    seed: resolved.seed,
    numClasses: resolved.numClasses,
    stem: resolved.smallInput ? 'small' : 'imagenet',
  };
}

/** The exit code of a run stopped by each signal (128 + its number, as shells report it). */
const STOP_SIGNALS: Readonly<Record<string, number>> = { SIGINT: 130, SIGTERM: 143, SIGHUP: 129 };

/** What a finished run may have written, in the order the closing line names them. */
const OUTPUTS = [
  'model.safetensors',
  'artifact/',
  'model-ema.safetensors',
  'checkpoints/',
  'log.jsonl',
  'tensorboard/',
  '*.png',
  'classification-report.txt',
];

/** The outputs of {@link OUTPUTS} that are in `outDir` (a folder when it holds something). */
function writtenOutputs(outDir: string): string[] {
  const present = new Set(
    readdirSync(outDir, { withFileTypes: true })
      .filter((e) => !e.isDirectory() || readdirSync(join(outDir, e.name)).length > 0)
      .map((e) => (e.isDirectory() ? `${e.name}/` : e.name.endsWith('.png') ? '*.png' : e.name)),
  );
  return OUTPUTS.filter((name) => present.has(name));
}

/**
 * A resumed run continues with the options it was started with: those saved in its checkpoint
 * fill in every option not given now (DATA included), as if given again.
 */
function withSavedOptions(parsed: ParsedCommand, saved: Record<string, unknown> | undefined): ParsedCommand {
  if (saved === undefined) return parsed;
  const values = { ...parsed.values };
  const explicit = new Set(parsed.explicit);
  for (const [key, value] of Object.entries(saved)) {
    // Weights only start a run, and a step limit is where it stopped, not where it should stop again.
    if (key === 'data' || key === 'weights' || key === 'maxSteps' || explicit.has(key) || !Object.hasOwn(values, key)) {
      continue;
    }
    values[key] = value as OptionValue;
    explicit.add(key);
  }
  const data =
    typeof saved.data === 'string' && parsed.positionals.length === 0 && values.dataPath === undefined
      ? [saved.data]
      : parsed.positionals;
  return { ...parsed, values, explicit, positionals: data };
}

async function run(given: ParsedCommand, io: CliIO): Promise<number> {
  const nproc = given.values.nprocPerNode as number | undefined;
  if (nproc !== undefined && launchedWorldSize(io.env) === 1) {
    return relaunch(nproc, given, resolveOutput(given.values, io.cwd).outDir, io);
  }
  // A restarted group continues from its latest checkpoint; only rank 0 refuses a folder that holds
  // a run (the others may find rank 0's first files there).
  const invocation = { ...given.values, resume: restartResume(given.values, io.cwd, io.env) };
  const rankZero = Number(io.env.RANK ?? '0') === 0;
  const resolved = resolveOutput(invocation, io.cwd, rankZero && !isRestart(io.env) ? 'refuse' : 'allow');
  const resume = resolved.resume;
  let outDir = resolved.outDir;
  // Resuming: the checkpoint's options, seed (the data order depends on it) and architecture.
  let resumed: Partial<RunConfig> = {};
  let savedSeed: number | undefined;
  if (resume !== undefined) {
    const info = await Trainer.readCheckpointInfo(resume);
    resumed = partialRunConfig(info.config);
    savedSeed = info.run?.data.trainSeed ?? resumed.seed;
  }
  const parsed = withSavedOptions(given, resumed.options);
  const { args: a, files } = resolveArgs(parsed, (text) => io.stderr.write(`${text}\n`));
  const rank = joinGroup(a.device, io.env);
  const group = rank.group;
  const main = group === null || group.rank === 0;
  const worldSize = group?.worldSize ?? 1;
  const say = (text: string) => {
    if (!a.quiet && main) io.stderr.write(`${text}\n`);
  };
  const device = checkDevice(rank.device);
  // The training and the validation loader each hold batches of this size.
  checkBatchMemory(a.batchSize, Math.max(a.trainCropSize, a.valCropSize));
  if (resume !== undefined) {
    if (savedSeed !== undefined && a.seed !== undefined && a.seed !== savedSeed) {
      throw new UsageError(
        `--seed ${a.seed} differs from the resumed run's seed ${savedSeed}; an exact resume needs the same data order`,
        'Drop --seed when resuming.',
      );
    }
    if (resumed.model !== undefined && resumed.model !== a.model) {
      throw new UsageError(`--model ${a.model} differs from the resumed run's ${resumed.model}`);
    }
    if (resumed.dataset !== undefined && resumed.dataset !== a.dataset) {
      throw new UsageError(`the resumed run trained on --dataset ${resumed.dataset}, this one on ${a.dataset}`);
    }
  }
  // Every rank takes rank 0's seed (the same data order and augmentation) and output folder.
  const shared = shareRunSettings(group, { seed: a.seed ?? savedSeed ?? randomInt(0, 2 ** 31), outDir });
  const seed = shared.seed;
  outDir = shared.outDir;
  const transformSettings = {
    trainCropSize: a.trainCropSize,
    valResizeSize: a.valResizeSize,
    valCropSize: a.valCropSize,
    mean: datasetDefaults(a.dataset).mean,
    std: datasetDefaults(a.dataset).std,
    interpolation: a.interpolation,
  };

  const smallInput = resumed.smallInput ?? (a.stem === 'small' || (a.stem === 'auto' && a.trainCropSize <= 64));
  const startWeights =
    a.weights !== undefined
      ? { file: a.weights, tensors: readStartWeights(a.weights, a.model, smallInput) }
      : undefined;

  const data = await openTrainData(files, {
    seed,
    size: a.trainCropSize,
    numClasses: a.numClasses ?? (a.dataset === 'synthetic' ? 1000 : 4),
    batchSize: a.batchSize,
  });
  const numClasses = data.classes.length;
  if (a.numClasses !== undefined && a.numClasses !== numClasses) {
    throw new UsageError(`--num-classes ${a.numClasses} does not match the dataset, which has ${numClasses} classes`);
  }
  // A channel-pruned model's widths: from the checkpoint resumed, else from the --weights file.
  const blockWidths =
    resumed.blockWidths ?? (startWeights ? architectureOf(startWeights.tensors)?.blockWidths : undefined);
  const arch: Architecture = { model: a.model, numClasses, smallInput, ...(blockWidths ? { blockWidths } : {}) };

  const config: RunConfig = {
    ...arch,
    classes: [...data.classes],
    dataset: a.dataset,
    seed,
    trainCropSize: a.trainCropSize,
    valResizeSize: a.valResizeSize,
    valCropSize: a.valCropSize,
    interpolation: a.interpolation,
    mean: transformSettings.mean,
    std: transformSettings.std,
    amp: a.amp,
    options: resolvedOptions(parsed, a, { seed, numClasses, smallInput }),
  };

  const model = buildModel(arch, { device, seed });
  const notes: string[] = [];
  if (data.note) notes.push(data.note);
  if (a.syncBn && group === null) notes.push('--sync-bn: one process, so batch norm is the same as without it');
  if (startWeights !== undefined) {
    notes.push(loadStartWeights(startWeights.tensors, model, numClasses, displayPath(startWeights.file, io.cwd)));
  }
  if (a.freeze !== undefined) {
    const frozen = freeze(model, a.freeze);
    notes.push(`froze ${a.freeze.join(', ')} (${frozen.toLocaleString('en-US')} parameters)`);
  }
  if (a.qat) {
    const freeze = a.qatFreezeObservers === undefined ? '' : `, observers frozen after ${a.qatFreezeObservers} steps`;
    notes.push(`quantization-aware training: INT8 fake quantization of every convolution and fc${freeze}`);
  }
  const frozeBackbone = applyFreezeBackbone(a, model);
  if (frozeBackbone !== undefined) notes.push(frozeBackbone);
  if (a.gradCheckpoint !== undefined) {
    const segments = defined(parseCheckpointSegments(a.gradCheckpoint), '--grad-checkpoint');
    notes.push(
      `gradient checkpointing: ${setCheckpointing(model, { segments }).length} segments recomputed in backward`,
    );
  }
  let teacher: LoadedTeacher | undefined;
  // The global batch: every rank's micro-batches of every step (the linear scaling rule).
  const globalBatch = a.batchSize * a.accumulate * worldSize;
  const lr = a.lrScaleBatch !== undefined ? scaleLrForBatch(a.lr, globalBatch, a.lrScaleBatch) : a.lr;
  const share = group ? { distributed: { rank: group.rank, worldSize: group.worldSize } } : {};
  const optimizer = buildOptimizer(a, model, lr);

  const trainLoader = new DataLoader(data.train, {
    batchSize: a.batchSize,
    transform: trainTransform(a.dataset, transformSettings),
    shuffle: true,
    seed,
    workers: a.workers,
    persistentWorkers: true,
    device,
    decode: a.decode,
    ...share,
  });
  const valLoader = new DataLoader(data.val, {
    batchSize: a.batchSize,
    transform: valTransform(transformSettings),
    seed,
    workers: a.workers,
    persistentWorkers: true,
    device,
    decode: a.decode,
    ...share,
  });
  let trainer: Trainer | undefined;
  let profiling: ProfileStepsCallback | undefined;
  // SIGINT (Ctrl-C), SIGTERM (docker stop, Slurm and Kubernetes preemption) and SIGHUP (the
  // terminal closed) stop the run after the current step, with a checkpoint; a second signal
  // while stopping quits at once, as a second Ctrl-C does in most tools.
  let stoppedBy: string | undefined;
  const onSignal = (signal: string): void => {
    if (trainer === undefined || stoppedBy !== undefined) process.exit(STOP_SIGNALS[signal]);
    stoppedBy = signal;
    io.stderr.write(
      `\n${signal}: stopping after this step and writing a checkpoint (a second Ctrl-C or signal quits at once)\n`,
    );
    trainer.requestStop();
  };
  try {
    teacher = await loadTeacher(a, { device, numClasses }, io.cwd);
    if (teacher) notes.push(teacher.note);
    const batches = a.dryRun !== undefined ? Math.min(a.dryRun, trainLoader.length) : trainLoader.length;
    const stepsPerEpoch = Math.ceil(batches / a.accumulate);
    const schedule = buildSchedule(a, stepsPerEpoch);
    const mode = a.monitor.endsWith('loss') ? 'min' : 'max';
    // train.py's adjustment: the decay is given per image of an epoch, the average updates every few steps.
    const emaDecay = 1 - Math.min(1, (1 - a.modelEmaDecay) * ((a.batchSize * worldSize * a.modelEmaSteps) / a.epochs));
    const pruning = trainPruning(a, model, { epochs: a.epochs, stepsPerEpoch });
    const options: TrainerOptions = {
      model,
      optimizer,
      device,
      labelSmoothing: a.labelSmoothing,
      amp: ampOption(a.amp),
      accumulate: a.accumulate,
      ...(a.cudaGraph ? { cudaGraph: true } : {}),
      outDir,
      checkpoint: {
        everyEpochs: 1,
        keepLast: a.keepLast,
        monitor: a.monitor,
        mode,
        ...(a.checkpointEverySteps !== undefined ? { everySteps: a.checkpointEverySteps } : {}),
      },
      logEvery: a.printFreq,
      progress: a.quiet ? false : io.stderr,
      tensorboard: !a.noTensorboard,
      plots: !a.noPlots,
      ...(a.mlflow !== undefined ? { mlflow: { trackingDir: a.mlflow, experimentName: a.mlflowExperiment } } : {}),
      classNames: data.classes,
      config: config as unknown as Record<string, unknown>,
      ...(group ? { distributed: { processGroup: group, syncBatchNorm: a.syncBn } } : {}),
      ...(pruning ? { callbacks: [pruning] } : {}),
      ...(schedule ? { schedule } : {}),
      ...(a.lrScheduler === 'plateau'
        ? { plateau: { mode, factor: a.lrGamma, patience: a.lrPlateauPatience, minLr: a.lrMin, monitor: a.monitor } }
        : {}),
      ...(a.clipGradNorm !== undefined ? { clipGradNorm: a.clipGradNorm } : {}),
      ...(teacher ? { distillation: { teacher: teacher.model, temperature: a.kdTemperature, alpha: a.kdAlpha } } : {}),
      ...(a.modelEma
        ? {
            ema: { decay: emaDecay, every: a.modelEmaSteps, warmupSteps: Math.round(a.lrWarmupEpochs * stepsPerEpoch) },
          }
        : {}),
      ...(a.qat
        ? { qat: a.qatFreezeObservers !== undefined ? { freezeObserversAfter: a.qatFreezeObservers } : true }
        : {}),
      ...(a.earlyStoppingPatience !== undefined
        ? {
            earlyStopping: {
              monitor: a.monitor,
              patience: a.earlyStoppingPatience,
              minDelta: a.earlyStoppingMinDelta,
              mode,
            },
          }
        : {}),
    };
    if (a.profileSteps !== undefined) {
      const report = (text: string) => io.stdout.write(text);
      profiling = new ProfileStepsCallback({ steps: profileRange(a.profileSteps), outDir, report });
      options.callbacks = [profiling];
    }
    trainer = new Trainer(options);

    if (main) {
      mkdirSync(outDir, { recursive: true });
      await writeFileAtomic(join(outDir, 'config.json'), JSON.stringify(config.options, null, 2) + '\n');
    }
    const where = displayPath(outDir, io.cwd);
    const source =
      a.dataset === 'shapes'
        ? 'the built-in dataset'
        : a.data === undefined
          ? `${a.dataset} data`
          : `${a.dataset} '${displayPath(a.data, io.cwd)}'`;
    const what = `${source} (${data.train.length} training, ${data.val.length} validation images${a.data === undefined ? `, ${a.trainCropSize} px` : ''})`;
    say(
      `resnet-cuda train: ${a.model}${arch.smallInput ? ' (small-image stem)' : ''}, ${numClasses} classes, on ${what}`,
    );
    say(
      `${group ? `${worldSize} processes (${group.backend}), ` : ''}${device}, batch ${a.batchSize}${a.accumulate > 1 ? ` x ${a.accumulate}` : ''}${group ? ` per process (${globalBatch} per step in all)` : ''}${a.syncBn && group ? ', SyncBatchNorm' : ''}, ${precisionText(a.amp)}, ${a.opt} lr ${lr}` +
        `, ${a.lrScheduler}${a.lrWarmupEpochs > 0 ? ` after ${Math.round(a.lrWarmupEpochs * stepsPerEpoch)} warm-up steps` : ''}, ${a.epochs} epoch${a.epochs === 1 ? '' : 's'} of ${stepsPerEpoch} steps, seed ${seed}`,
    );
    say(
      `input: training crop ${a.trainCropSize} px; validation resize ${a.valResizeSize} px and center crop ${a.valCropSize} px`,
    );
    for (const note of notes) say(note);
    say(`writing to ${where}`);

    for (const signal of Object.keys(STOP_SIGNALS)) process.on(signal, onSignal);
    const started = performance.now();
    const result = await trainer.fit(trainLoader, {
      epochs: a.epochs,
      val: valLoader,
      ...(resume !== undefined ? { resume } : {}),
      ...(a.dryRun !== undefined ? { overfitBatches: a.dryRun } : {}),
      ...(a.maxSteps !== undefined ? { maxSteps: a.maxSteps } : {}),
    });
    const seconds = (performance.now() - started) / 1000;
    // Rank 0 reports and leaves the artifact; the others only train.
    if (!main) return stoppedBy !== undefined ? STOP_SIGNALS[stoppedBy]! : 0;

    const ended = result.stoppedEarly ? 'stopped early' : result.interrupted ? 'stopped' : 'finished';
    const final = result.lastEval;
    let summary = `${ended} after ${result.epochs} epoch${result.epochs === 1 ? '' : 's'} (${result.steps} steps) in ${formatDuration(seconds)}`;
    if (final) {
      summary += `: val loss ${final.loss.toFixed(4)}, acc@1 ${percent(final.acc1)}, acc@5 ${percent(final.acc5)}`;
    }
    if (result.lastEvalEma) summary += ` (moving average: acc@1 ${percent(result.lastEvalEma.acc1)})`;
    if (result.best?.monitor !== undefined) {
      const value = result.best.monitor.endsWith('loss') ? result.best.value.toFixed(4) : percent(result.best.value);
      summary += `; best ${result.best.monitor} ${value} (epoch ${result.best.epoch + 1})`;
    }
    io.stdout.write(`${summary}\n`);
    if (final && !a.quiet) io.stdout.write(`\n${final.report}\n`);
    // A finished, evaluated run leaves its best model as an inference artifact (predict --model DIR).
    if (final && stoppedBy === undefined) await writeRunArtifact(outDir, model, config);
    io.stdout.write(`outputs in ${where}: ${writtenOutputs(outDir).join(', ')}\n`);
    // Stopped by a signal: the checkpoint is written, but the run did not finish.
    return stoppedBy !== undefined ? STOP_SIGNALS[stoppedBy]! : 0;
  } finally {
    for (const signal of Object.keys(STOP_SIGNALS)) process.removeListener(signal, onSignal);
    profiling?.abandon();
    await trainer?.dispose();
    teacher?.model.dispose();
    await trainLoader.close();
    await valLoader.close();
    group?.destroy();
  }
}

/** The `train` command. */
export const trainCommand: Command = { spec: SPEC, run };
