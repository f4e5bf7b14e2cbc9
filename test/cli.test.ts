/**
 * The command line: help and usage errors of every command (exit code 2, one line naming the
 * option), config files, `doctor`, a tiny `bench`, `predict` and `eval` on written image files,
 * and short `train` runs whose output folders are checked. Commands run in this process through
 * `main(argv, io)`; two runs go through the compiled entry point as a child process.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { gzipSync } from 'node:zlib';
import { join } from 'node:path';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { benchCommand } from '../lib/cli/bench.js';
import { doctorCommand, type DoctorReport } from '../lib/cli/doctor.js';
import { launchCommand } from '../lib/cli/launch.js';
import { embedCommand } from '../lib/cli/embed.js';
import { evalCommand } from '../lib/cli/eval.js';
import { lrFindCommand } from '../lib/cli/lr-find.js';
import type { Command } from '../lib/cli/options.js';
import { predictCommand } from '../lib/cli/predict.js';
import { trainCommand } from '../lib/cli/train.js';
import { ImageFiles, NO_LABEL } from '../lib/data/image-files.js';
import { datasetFromSpec } from '../lib/data/registry.js';
import { ShapesDataset } from '../lib/data/shapes-dataset.js';
import { ResNet18 } from '../lib/nn/resnet.js';
import { saveWeights } from '../lib/train/checkpoint.js';
import { defined } from './helpers/defined.js';
import { objectContaining, stringContaining, stringMatching } from './helpers/matchers.js';
import { runCli, type CliRun } from './helpers/cli.js';

const dir = mkdtempSync(join(tmpdir(), 'rc-cli-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const root = join(import.meta.dirname, '..');
const COMMANDS: Record<string, Command> = {
  train: trainCommand,
  eval: evalCommand,
  predict: predictCommand,
  'lr-find': lrFindCommand,
  embed: embedCommand,
  bench: benchCommand,
  launch: launchCommand,
  doctor: doctorCommand,
};

// The fields of the JSON files and outputs that the tests read (the assertions check their values).

/** package.json. */
interface PackageJson {
  version: string;
  bin: Record<string, string>;
}

/** What `predict --json` prints. */
interface PredictOutput {
  images: { file: string; predictions: { class: string; probability: number }[] }[];
  failed: { file: string; code: string }[];
}

/** What `eval --json` prints. */
interface EvalOutput {
  count: number;
  acc1: number;
  acc5: number;
  confusion: number[][];
}

/** A line of a run's log.jsonl. */
interface LogRecord {
  type: string;
  metrics?: Record<string, number>;
}

/** Runs the command line in this process, collecting its output. */
function cli(args: string[], cwd = dir): Promise<CliRun> {
  return runCli(args, cwd);
}

/** A weights file of a fresh ResNet-18 with the small-image stem and 4 classes. */
const weightsFile = join(dir, 'fresh.safetensors');
/** An ImageFolder with train/ (16 images) and val/ (8 images), 16 px, 4 classes. */
const folder = join(dir, 'shapes');
let pngs: string[] = [];
/** Weights of fresh small-stem ResNet-18s with 10 and 3 classes. */
const weights10 = join(dir, 'fresh10.safetensors');
const weights3 = join(dir, 'fresh3.safetensors');

/** CIFAR-10's binary layout (8 random records per file) and MNIST's IDX files (gzipped images), random pixels. */
function writeFakeCifarAndMnist(): void {
  const cifar = join(dir, 'cifar', 'cifar-10-batches-bin');
  mkdirSync(cifar, { recursive: true });
  for (const name of ['data_batch_1', 'data_batch_2', 'data_batch_3', 'data_batch_4', 'data_batch_5', 'test_batch']) {
    const records = Buffer.alloc(8 * 3073);
    for (let r = 0; r < 8; r++) {
      records[r * 3073] = r % 10;
      for (let i = 1; i < 3073; i++) records[r * 3073 + i] = (r * 7919 + i * 31) & 255;
    }
    writeFileSync(join(cifar, `${name}.bin`), records);
  }
  const mnist = join(dir, 'mnist', 'raw');
  mkdirSync(mnist, { recursive: true });
  for (const [prefix, n] of [
    ['train', 8],
    ['t10k', 12],
  ] as const) {
    const images = Buffer.alloc(16 + n * 784);
    images.writeUInt32BE(0x803, 0);
    images.writeUInt32BE(n, 4);
    images.writeUInt32BE(28, 8);
    images.writeUInt32BE(28, 12);
    for (let i = 16; i < images.length; i++) images[i] = (i * 13) & 255;
    writeFileSync(join(mnist, `${prefix}-images-idx3-ubyte.gz`), gzipSync(images));
    const labels = Buffer.alloc(8 + n);
    labels.writeUInt32BE(0x801, 0);
    labels.writeUInt32BE(n, 4);
    for (let i = 0; i < n; i++) labels[8 + i] = i % 10;
    writeFileSync(join(mnist, `${prefix}-labels-idx1-ubyte`), labels);
  }
}

beforeAll(async () => {
  await saveWeights(weightsFile, ResNet18({ numClasses: 4, smallInput: true, seed: 3 }));
  await saveWeights(weights10, ResNet18({ numClasses: 10, smallInput: true, seed: 4 }));
  await saveWeights(weights3, ResNet18({ numClasses: 3, smallInput: true, seed: 5 }));
  writeFakeCifarAndMnist();
  await ShapesDataset.writeImageFolder(join(folder, 'train'), { count: 16, size: 16, seed: 1 });
  pngs = await ShapesDataset.writeImageFolder(join(folder, 'val'), { count: 8, size: 16, seed: 2 });
});

describe('help and version', () => {
  it('lists the commands, prints the version, and rejects a missing or unknown command', async () => {
    const help = await cli(['--help']);
    expect(help.code).toBe(0);
    for (const name of Object.keys(COMMANDS)) expect(help.stdout).toMatch(new RegExp(`^  ${name} `, 'm'));
    const { version } = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as PackageJson;
    expect(await cli(['--version'])).toEqual({ code: 0, stdout: `${version}\n`, stderr: '' });
    const none = await cli([]);
    expect(none.code).toBe(2);
    expect(none.stderr).toContain('Usage: resnet-cuda <command>');
    const typo = await cli(['trian']);
    expect(typo.code).toBe(2);
    expect(typo.stderr).toContain("unknown command 'trian' (did you mean 'train'?)");
  });

  for (const [name, command] of Object.entries(COMMANDS)) {
    it(`${name} --help prints the usage and every option with its default`, async () => {
      const run = await cli([name, '--help']);
      expect(run.code).toBe(0);
      expect(run.stderr).toBe('');
      expect(run.stdout).toMatch(new RegExp(`^Usage: resnet-cuda ${name} \\[options\\]`));
      for (const option of command.spec.options) {
        expect(run.stdout, `--${option.name}`).toContain(`--${option.name}`);
        const shown =
          option.defaultText ??
          (option.default === undefined || option.default === false ? undefined : String(option.default));
        if (shown !== undefined) {
          expect(run.stdout.replace(/\s+/g, ' '), `default of --${option.name}`).toContain(
            `(default: ${shown.split(';')[0]!.replace(/\s+/g, ' ')}`,
          );
        }
      }
      expect(run.stdout).toContain('-h, --help');
      // -h works too, and wins over other problems with the arguments.
      expect((await cli([name, '--no-such-flag', '-h'])).code).toBe(0);
    });
  }
});

describe('usage errors: exit code 2 and one line naming the option, before any work', () => {
  const cases: [string[], RegExp][] = [
    [['train', '--lr', 'abc'], /^resnet-cuda train: --lr expects a number above 0, got 'abc'$/m],
    [['train', '--epochs', '0'], /--epochs expects an integer of at least 1, got 0/],
    [['train', '--learning-rate', '0.1'], /unknown option '--learning-rate'/],
    [['train', '--opt', 'rmsprop'], /--opt expects one of sgd, sgd-nesterov, adamw, lamb, got 'rmsprop'/],
    [
      ['train', '--lr-scheduler', 'plateau', '--lr-warmup-epochs', '1'],
      /--lr-warmup-epochs cannot be combined with --lr-scheduler plateau/,
    ],
    [['train', '--lr-scheduler', 'multisteplr'], /--lr-scheduler multisteplr needs --lr-milestones/],
    [
      ['train', '--lr-step-size', '5', '--lr-scheduler', 'cosineannealinglr'],
      /--lr-step-size is not used by --lr-scheduler cosineannealinglr/,
    ],
    [['train', '--amp', 'fp16'], /--amp fp16 needs a CUDA device, but --device is cpu/],
    [['train', '--device', 'gpu'], /--device expects cpu, cuda or cuda:N, got 'gpu'/],
    [['train', '--norm-weight-decay', '0.1'], /--norm-weight-decay expects a number from 0 to 0, got 0.1/],
    [['train', '--model-ema-decay', '0.999'], /--model-ema-steps and --model-ema-decay need --model-ema/],
    [['train', '--qat-freeze-observers', '100'], /--qat-freeze-observers needs --qat/],
    [['train', '--qat', '--model-ema'], /--qat cannot be combined with --model-ema/],
    [
      ['train', '--qat', '--qat-freeze-observers=-1'],
      /--qat-freeze-observers expects an integer of at least 0, got -1/,
    ],
    [['train', '--momentum', '0.8', '--opt', 'adamw'], /--momentum applies to --opt sgd and sgd-nesterov, not adamw/],
    [['train', 'no-such-folder'], /DATA folder '.*no-such-folder' does not exist/],
    [['train', '--dataset', 'cifar10'], /--dataset cifar10 needs DATA/],
    [['train', '--weights', 'missing.safetensors'], /--weights '.*missing.safetensors' does not exist/],
    [['train', '--dry-run', '2', '--resume', 'x'], /--dry-run .* cannot --resume/],
    [['train', '--lr'], /--lr needs a value/],
    [['train', '--resume'], /--resume latest: no run with a checkpoint under '.*runs'/],
    [['train', '--resume', 'missing.safetensors'], /--resume '.*missing.safetensors' does not exist/],
    [['eval'], /give the model to use with --weights FILE or --checkpoint FILE/],
    [['eval', '--weights', 'missing.safetensors'], /--weights '.*missing.safetensors' does not exist/],
    [['eval', '--checkpoint', 'missing'], /--checkpoint '.*missing' does not exist/],
    [['eval', '--batch-size=-3'], /--batch-size expects an integer of at least 1, got -3/],
    [
      ['eval', '--batch-size', '-3'],
      /--batch-size needs a value; to pass one that starts with '-', write --batch-size=VALUE/,
    ],
    [['predict', '--topk', '0', 'x.png'], /--topk expects an integer of at least 1, got 0/],
    [['predict', '--weights', weightsFile], /missing IMAGE/],
    [['bench', '--size', 'big'], /--size expects an integer of at least 8, got 'big'/],
    [['bench', '--cuda-graph'], /--cuda-graph needs a CUDA device/],
    [['bench', '--amp', 'fp8'], /--amp expects one of none, bf16, fp16, got 'fp8'/],
    [['doctor', '--json=yes'], /--json takes no value/],
    [['doctor', 'extra'], /'doctor' takes no arguments, got 'extra'/],
    [['doctor', '--config', 'x.json'], /unknown option '--config'/],
  ];
  for (const [args, message] of cases) {
    it(args.join(' '), async () => {
      const run = await cli(args);
      expect(run.code, run.stderr).toBe(2);
      expect(run.stdout).toBe('');
      const lines = run.stderr.trimEnd().split('\n');
      expect(lines).toHaveLength(2);
      expect(lines[0]).toMatch(new RegExp(`^resnet-cuda ${args[0]}: `));
      expect(lines[0]).toMatch(message);
    });
  }

  it('suggests the option meant and prints the stack only with --verbose or RC_DEBUG', async () => {
    const typo = await cli(['train', '--batchsize', '8']);
    expect(typo.stderr).toContain("unknown option '--batchsize' (did you mean '--batch-size'?)");
    // A PNG is not a weights file: a failure while working, exit code 1.
    const runtime = await cli(['eval', '--weights', pngs[0]!]);
    expect(runtime.code).toBe(1);
    expect(runtime.stderr).not.toMatch(/\n\s+at /);
    const verbose = await cli(['eval', '--verbose', '--weights', pngs[0]!]);
    expect(verbose.code).toBe(1);
    expect(verbose.stderr).toMatch(/\n\s+at /);
  });
});

describe('config files', () => {
  const write = (name: string, json: unknown): string => {
    const file = join(dir, name);
    writeFileSync(file, typeof json === 'string' ? json : JSON.stringify(json));
    return file;
  };

  it('merges a config file under the command line (camelCase and kebab-case keys)', async () => {
    const file = write('bench.json', {
      model: 'resnet18',
      'batch-size': 2,
      size: 16,
      smallInput: true,
      steps: 5,
      warmup: 0,
      json: true,
    });
    const run = await cli(['bench', '--config', file, '--steps', '1']);
    expect(run.code, run.stderr).toBe(0);
    const result: unknown = JSON.parse(run.stdout);
    expect(result).toMatchObject({
      model: 'resnet18',
      batchSize: 2,
      size: 16,
      steps: 1,
      warmup: 0,
      amp: 'none',
      device: 'cpu',
    });
  });

  it('rejects unknown keys, values of the wrong type, and conflicts coming from the file', async () => {
    const unknown = await cli(['train', '--config', write('unknown.json', { learningRate: 0.1 })]);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toMatch(/unknown key 'learningRate' in --config file '.*unknown.json'/);
    const typo = await cli(['train', '--config', write('typo.json', { lrSchedular: 'steplr' })]);
    expect(typo.stderr).toContain("(did you mean 'lrScheduler'?)");
    const type = await cli(['train', '--config', write('type.json', { lr: 'fast' })]);
    expect(type.code).toBe(2);
    expect(type.stderr).toMatch(/'lr' in .*type.json expects a number above 0, got 'fast'/);
    const conflict = await cli([
      'train',
      '--config',
      write('conflict.json', { lrScheduler: 'plateau', lrWarmupEpochs: 1 }),
    ]);
    expect(conflict.code).toBe(2);
    expect(conflict.stderr).toContain('--lr-warmup-epochs cannot be combined with --lr-scheduler plateau');
    const data = await cli(['train', '--config', write('data.json', { data: 'nowhere' })]);
    expect(data.code).toBe(2);
    expect(data.stderr).toMatch(/DATA folder '.*nowhere' does not exist/);
    const notObject = await cli(['train', '--config', write('array.json', '[1, 2]')]);
    expect(notObject.stderr).toContain('must hold a JSON object of options');
    const broken = await cli(['train', '--config', write('broken.json', '{"lr": ')]);
    expect(broken.code).toBe(2);
    expect(broken.stderr).toContain('is not valid JSON');
    const missing = await cli(['train', '--config', join(dir, 'none.json')]);
    expect(missing.stderr).toMatch(/--config file '.*none.json' does not exist/);
  });
});

describe('doctor', () => {
  it('reports the addon, the backends and sharp, in text and JSON', async () => {
    const text = await cli(['doctor']);
    expect(text.code).toBe(0);
    expect(text.stdout).toMatch(/^ {2}node {3}v\d+/m);
    expect(text.stdout).toMatch(/^ {2}addon {2}loaded/m);
    expect(text.stdout).toMatch(/^ {2}cpu {4}ok: .*oneDNN/m);
    expect(text.stdout).toMatch(/^ {2}cuda {3}/m);
    expect(text.stdout).toMatch(/^ {2}sharp {2}\d+\.\d+\.\d+ \(libvips \d/m);
    const json = await cli(['doctor', '--json']);
    expect(json.code).toBe(0);
    const report = JSON.parse(json.stdout) as DoctorReport;
    expect(report.ok).toBe(true);
    expect(report.addon.loaded).toBe(true);
    expect(report.backends.find((b: { name: string }) => b.name === 'cpu')).toMatchObject({
      built: true,
      available: true,
      works: true,
    });
    const cuda = report.backends.find((b: { name: string }) => b.name === 'cuda');
    expect(cuda).toBeDefined();
    // Every problem says what to do; CUDA missing on a machine without a GPU is only a warning.
    for (const p of report.problems) expect(p.fix.length).toBeGreaterThan(10);
    if (!defined(cuda, 'the cuda backend').available) {
      expect(report.problems.find((p: { component: string }) => p.component === 'cuda')?.severity).toBe('warning');
    }
    // A build with the CUDA backend lists where its libraries were looked for, in the text too.
    if (defined(cuda, 'the cuda backend').built) {
      expect(report.cudaLibraries?.libraries.map((l) => l.name)).toEqual([
        'cuBLASLt',
        'cuBLAS',
        'cuDNN',
        'NCCL',
        'NVRTC',
        'nvJPEG',
      ]);
      expect(text.stdout).toMatch(/^ {9}searched in order: .*the dynamic loader's search/m);
    }
    expect(report.sharp.version).toMatch(/^\d+\.\d+\.\d+$/);
  });
});

describe('bench', () => {
  it('times a tiny model on the CPU', async () => {
    const run = await cli([
      'bench',
      '--model',
      'resnet18',
      '--small-input',
      '--size',
      '16',
      '-b',
      '2',
      '--steps',
      '2',
      '--warmup',
      '1',
    ]);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toMatch(
      /^\d+\.\d ms\/step, \d+\.\d img\/s, peak memory \d+\.\d\d GiB \(resnet18, batch 2, 16 px, fp32, cpu\)\n$/,
    );
    expect(run.stderr).toContain('warm-up: 1 step');
  });
});

describe('predict', () => {
  it('prints the top-k classes of image files, as text and JSON, with class names from a file', async () => {
    const text = await cli(['predict', '--weights', weightsFile, '--topk', '2', pngs[0]!, pngs[1]!]);
    expect(text.code, text.stderr).toBe(0);
    const lines = text.stdout.trimEnd().split('\n');
    expect(lines).toHaveLength(6);
    expect(lines[1]).toMatch(/^ {2} *\d+\.\d\d% {2}[0-3]$/);

    const classesFile = join(dir, 'classes.txt');
    writeFileSync(classesFile, 'a\nb\n\nc\nd\n');
    const json = await cli([
      'predict',
      '--weights',
      weightsFile,
      '--classes',
      classesFile,
      '--json',
      '--topk',
      '9',
      join(folder, 'val', 'circle'),
      pngs[2]!,
    ]);
    expect(json.code, json.stderr).toBe(0);
    const out = JSON.parse(json.stdout) as PredictOutput;
    expect(out).toMatchObject({ model: 'resnet18', numClasses: 4, resize: 32, crop: 32 });
    const circles = readdirSync(join(folder, 'val', 'circle')).length;
    expect(out.images).toHaveLength(circles + 1);
    for (const image of out.images) {
      expect(image.predictions).toHaveLength(4);
      expect(image.predictions.map((p) => p.class).sort()).toEqual(['a', 'b', 'c', 'd']);
      const total = image.predictions.reduce((s, p) => s + p.probability, 0);
      expect(total).toBeCloseTo(1, 5);
      const probabilities = image.predictions.map((p) => p.probability);
      expect(probabilities).toEqual([...probabilities].sort((x, y) => y - x));
    }
    expect(defined(out.images.at(-1), 'an image').file).toBe(pngs[2]);
  });

  it('prints the classes of every good file and a coded error line for each bad one, and exits with 1', async () => {
    const empty = join(dir, 'zero.jpg');
    writeFileSync(empty, '');
    const garbage = join(dir, 'garbage.png');
    writeFileSync(garbage, 'not an image');
    const run = await cli(['predict', '--weights', weightsFile, '--topk', '2', pngs[0]!, empty, pngs[1]!, garbage]);
    expect(run.code).toBe(1);
    const lines = run.stdout.trimEnd().split('\n');
    expect(lines).toHaveLength(6);
    expect(lines[0]).toBe(pngs[0]!.slice(dir.length + 1));
    expect(lines[3]).toBe(pngs[1]!.slice(dir.length + 1));
    const errors = run.stderr.trimEnd().split('\n');
    expect(errors).toHaveLength(2);
    expect(errors[0]).toMatch(/^resnet-cuda predict: zero\.jpg: [A-Z][A-Z0-9_]+: /);
    expect(errors[1]).toMatch(/^resnet-cuda predict: garbage\.png: [A-Z][A-Z0-9_]+: /);
    const json = await cli(['predict', '--weights', weightsFile, '--json', empty, pngs[2]!]);
    expect(json.code).toBe(1);
    const out = JSON.parse(json.stdout) as PredictOutput;
    expect(out.images.map((i) => i.file)).toEqual([pngs[2]]);
    expect(out.failed).toEqual([objectContaining({ file: empty, code: stringMatching(/^[A-Z][A-Z0-9_]+$/) })]);
  });

  it('rejects a missing image, a class file of the wrong length and a model that contradicts the file', async () => {
    const missing = await cli(['predict', '--weights', weightsFile, join(dir, 'nope.png')]);
    expect(missing.code).toBe(2);
    expect(missing.stderr).toMatch(/IMAGE '.*nope.png' does not exist/);
    const short = join(dir, 'short.txt');
    writeFileSync(short, 'one\ntwo\n');
    const wrong = await cli(['predict', '--weights', weightsFile, '--classes', short, pngs[0]!]);
    expect(wrong.code).toBe(2);
    expect(wrong.stderr).toContain('names 2 classes but the model has 4');
    const model = await cli(['predict', '--weights', weightsFile, '--model', 'resnet50', pngs[0]!]);
    expect(model.code).toBe(2);
    expect(model.stderr).toMatch(/--model resnet50 does not match '.*fresh.safetensors', which holds a resnet18/);
  });
});

describe('ImageFiles', () => {
  it('reads the files in the order given, unlabelled, and rebuilds from its spec in a worker', async () => {
    const images = await ImageFiles.open([pngs[3]!, pngs[1]!]);
    expect(images.length).toBe(2);
    expect(images.classes).toEqual([]);
    expect(images.label(1)).toBe(NO_LABEL);
    const sample = await images.get(0);
    expect(sample).toMatchObject({ label: NO_LABEL, source: { kind: 'encoded', path: pngs[3] } });
    const again = await datasetFromSpec(structuredClone(images.spec()));
    expect(again).toBeInstanceOf(ImageFiles);
    if (!(again instanceof ImageFiles)) throw new Error('expected an ImageFiles');
    expect(again.files).toEqual([pngs[3], pngs[1]]);
    await expect(ImageFiles.open([join(dir, 'absent.png')])).rejects.toMatchObject({
      code: 'ERR_RC_DATASET',
      message: stringContaining('absent.png'),
    });
    await expect(ImageFiles.open([dir])).rejects.toThrow(/is not a file/);
    expect(() => ImageFiles.fromSpec({ kind: 'ImageFiles', files: ['relative.png'] })).toThrow(/an absolute path/);
  });
});

describe('eval', () => {
  it('evaluates weights on an image folder and writes the report and the confusion matrix', async () => {
    const out = join(dir, 'eval-out');
    const run = await cli([
      'eval',
      folder,
      '--weights',
      weightsFile,
      '--val-resize-size',
      '16',
      '--val-crop-size',
      '16',
      '-j',
      '0',
      '--json',
      '--output-dir',
      out,
    ]);
    expect(run.code, run.stderr).toBe(0);
    const result = JSON.parse(run.stdout) as EvalOutput;
    expect(result).toMatchObject({
      count: 8,
      model: 'resnet18',
      numClasses: 4,
      classes: ['circle', 'cross', 'square', 'triangle'],
    });
    expect(result.acc1).toBeGreaterThanOrEqual(0);
    expect(result.acc5).toBe(1);
    expect(result.confusion.flat().reduce((a, b) => a + b, 0)).toBe(8);
    expect(readFileSync(join(out, 'classification-report.txt'), 'utf8')).toMatch(/Acc@1 .*\n\n.*precision {4}recall/);
    const png = await sharp(join(out, 'confusion-matrix.png')).metadata();
    expect(png.format).toBe('png');

    const text = await cli([
      'eval',
      folder,
      '--weights',
      weightsFile,
      '--val-resize-size',
      '16',
      '--val-crop-size',
      '16',
      '-j',
      '0',
      '--quiet',
    ]);
    expect(text.code, text.stderr).toBe(0);
    expect(text.stdout).toMatch(/^loss \d+\.\d{4} {2}Acc@1 \d+\.\d\d% {2}Acc@5 100\.00% {2}\(8 images\)\n\n/);
    expect(text.stdout).toContain('weighted avg');
  });

  it('caps the workers by the CPU cores, with a warning', async () => {
    const cores = availableParallelism();
    const run = await cli([
      'eval',
      folder,
      '--weights',
      weightsFile,
      '--val-resize-size',
      '16',
      '--val-crop-size',
      '16',
      '-j',
      '1000',
      '--quiet',
    ]);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stderr).toBe(
      `warning: --workers 1000 is more than the ${cores} CPU core${cores === 1 ? '' : 's'} here; using ${cores}\n`,
    );
  });
});

describe('eval on CIFAR-10 and MNIST files', () => {
  it('finds the files under DATA (or its usual sub-folders) and evaluates their test split', async () => {
    const cifar = await cli([
      'eval',
      join(dir, 'cifar'),
      '--dataset',
      'cifar10',
      '--weights',
      weights10,
      '-j',
      '0',
      '--json',
    ]);
    expect(cifar.code, cifar.stderr).toBe(0);
    expect(JSON.parse(cifar.stdout)).toMatchObject({
      count: 8,
      classes: ['airplane', 'automobile', 'bird', 'cat', 'deer', 'dog', 'frog', 'horse', 'ship', 'truck'],
    });
    const mnist = await cli([
      'eval',
      join(dir, 'mnist'),
      '--dataset',
      'mnist',
      '--weights',
      weights10,
      '-j',
      '0',
      '--json',
    ]);
    expect(mnist.code, mnist.stderr).toBe(0);
    expect(JSON.parse(mnist.stdout)).toMatchObject({
      count: 12,
      classes: ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9'],
    });
    const fewer = await cli(['eval', join(dir, 'cifar'), '--dataset', 'cifar10', '--weights', weightsFile, '-j', '0']);
    expect(fewer.code).toBe(1);
    expect(fewer.stderr).toContain('the data has 10 classes but the model only 4');
    const wrongKind = await cli(['eval', join(dir, 'cifar'), '--dataset', 'mnist', '--weights', weights10]);
    expect(wrongKind.code).toBe(2);
    expect(wrongKind.stderr).toMatch(
      /DATA folder '.*cifar' does not hold the IDX files t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte/,
    );
  });
});

describe('train', () => {
  const run1 = join(dir, 'run-folder');

  it('trains one epoch on an image folder and writes every output', async () => {
    const args = [
      folder,
      '--epochs',
      '1',
      '-b',
      '8',
      '-j',
      '0',
      '--train-crop-size',
      '16',
      '--val-resize-size',
      '16',
      '--val-crop-size',
      '16',
      '--seed',
      '5',
      '--output-dir',
      run1,
    ];
    const run = await cli(['train', ...args]);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stderr).toMatch(/resnet18 \(small-image stem\), 4 classes, on imagefolder/);
    expect(run.stdout).toMatch(/^finished after 1 epoch \(2 steps\) in .*: val loss \d+\.\d{4}, acc@1 /);
    for (const name of [
      'model.safetensors',
      'model-best.safetensors',
      'log.jsonl',
      'summary.json',
      'config.json',
      'classification-report.txt',
      'confusion-matrix.png',
      'curves-loss.png',
      'curves-accuracy.png',
    ]) {
      expect(existsSync(join(run1, name)), name).toBe(true);
    }
    expect(readdirSync(join(run1, 'checkpoints')).sort()).toEqual([
      'best.json',
      'best.safetensors',
      'latest.json',
      'step-00000002.safetensors',
    ]);
    expect(readdirSync(join(run1, 'tensorboard')).some((f) => f.startsWith('events.out.tfevents.'))).toBe(true);
    const log = readFileSync(join(run1, 'log.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as LogRecord);
    expect(log.some((r) => r.type === 'epoch' && r.metrics?.['val/acc1'] !== undefined)).toBe(true);
    // config.json holds the options as given (and the seed), re-runnable with --config.
    const config = JSON.parse(readFileSync(join(run1, 'config.json'), 'utf8')) as { outputDir?: string };
    expect(config).toMatchObject({ data: folder, epochs: 1, batchSize: 8, seed: 5, trainCropSize: 16 });
    expect(config.outputDir).toBeUndefined();

    // The run folder's summary lets eval rebuild the input pipeline from the weights alone.
    const ev = await cli(['eval', folder, '--weights', join(run1, 'model.safetensors'), '-j', '0', '--json']);
    expect(ev.code, ev.stderr).toBe(0);
    expect((JSON.parse(ev.stdout) as EvalOutput).count).toBe(8);
  });

  it('resumes the run from its latest checkpoint and refuses to overwrite it', async () => {
    const again = await cli([
      'train',
      folder,
      '--epochs',
      '1',
      '-b',
      '8',
      '-j',
      '0',
      '--train-crop-size',
      '16',
      '--output-dir',
      run1,
    ]);
    expect(again.code).toBe(2);
    expect(again.stderr).toContain('already holds a run');
    // The checkpoint's options (DATA, batch size, sizes, seed…) carry over; --epochs extends the run.
    const resumed = await cli(['train', '--resume', '--output-dir', run1, '--epochs', '2', '--quiet']);
    expect(resumed.code, resumed.stderr).toBe(0);
    expect(resumed.stdout).toMatch(/^finished after 2 epochs \(4 steps\)/);
    expect(readdirSync(join(run1, 'checkpoints'))).toContain('step-00000004.safetensors');
    // Without DATA, eval takes the run's own validation data from the checkpoint's config.
    const evaluated = await cli(['eval', '--checkpoint', run1, '-j', '0', '--json']);
    expect(evaluated.code, evaluated.stderr).toBe(0);
    expect(JSON.parse(evaluated.stdout)).toMatchObject({
      count: 8,
      classes: ['circle', 'cross', 'square', 'triangle'],
    });
    const predicted = await cli(['predict', '--checkpoint', run1, '--json', pngs[0]!]);
    expect(predicted.code, predicted.stderr).toBe(0);
    expect(JSON.parse(predicted.stdout)).toMatchObject({ resize: 16, crop: 16 });
    expect((JSON.parse(predicted.stdout) as PredictOutput).images[0]!.predictions[0]!.class).toMatch(
      /^(circle|cross|square|triangle)$/,
    );
  });

  it('runs the built-in dataset with a step limit, writing a checkpoint where it stopped', async () => {
    const out = join(dir, 'demo');
    const run = await cli([
      'train',
      '--max-steps',
      '2',
      '-b',
      '4',
      '--train-crop-size',
      '16',
      '-j',
      '0',
      '--output-dir',
      out,
      '--no-tensorboard',
      '--no-plots',
      '--seed',
      '1',
    ]);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stderr).toMatch(/on the built-in dataset \(1600 training, 512 validation images, 16 px\)/);
    expect(run.stderr).toMatch(
      /sgd-nesterov lr 0\.01, cosineannealinglr after \d+ warm-up steps, 2 epochs of 400 steps, seed 1/,
    );
    expect(run.stdout).toMatch(/^stopped after 0 epochs \(2 steps\)/);
    // Stopped before any evaluation: no report, no charts, and the closing line names only what is there.
    expect(run.stdout).toMatch(/\noutputs in demo: model\.safetensors, checkpoints\/, log\.jsonl\n$/);
    expect(readdirSync(join(out, 'checkpoints'))).toContain('step-00000002.safetensors');
    expect(existsSync(join(out, 'model.safetensors'))).toBe(true);
    expect(existsSync(join(out, 'tensorboard'))).toBe(false);
    expect(readdirSync(out).filter((f) => f.endsWith('.png'))).toEqual([]);
  });

  it("evaluates at the scale of a small training crop, records the resolved options, and eval keeps the run's precision", async () => {
    const out = join(dir, 'bf16');
    const run = await cli([
      'train',
      folder,
      '--epochs',
      '1',
      '-b',
      '8',
      '-j',
      '0',
      '--train-crop-size',
      '16',
      '--amp',
      'bf16',
      '--seed',
      '5',
      '--output-dir',
      out,
      '--no-tensorboard',
    ]);
    expect(run.code, run.stderr).toBe(0);
    // torchvision's ratio: resize 256 for a 224 crop, so 18 for 16.
    expect(run.stderr).toContain('input: training crop 16 px; validation resize 18 px and center crop 16 px');
    expect(run.stderr).toMatch(/cpu, batch 8, amp bf16, sgd lr 0\.1/);
    const config: unknown = JSON.parse(readFileSync(join(out, 'config.json'), 'utf8'));
    expect(config).toMatchObject({
      data: folder,
      dataset: 'imagefolder',
      model: 'resnet18',
      numClasses: 4,
      stem: 'small',
      epochs: 1,
      batchSize: 8,
      workers: 0,
      trainCropSize: 16,
      valResizeSize: 18,
      valCropSize: 16,
      interpolation: 'bilinear',
      amp: 'bf16',
      opt: 'sgd',
      lr: 0.1,
      momentum: 0.9,
      weightDecay: 1e-4,
      lrScheduler: 'steplr',
      lrStepSize: 30,
      lrGamma: 0.1,
      keepLast: 3,
      seed: 5,
    });
    // Only the options this run reads: it is re-runnable with --config.
    for (const unused of [
      'lrMin',
      'lrPlateauPatience',
      'lrWarmupMethod',
      'modelEmaSteps',
      'earlyStoppingMinDelta',
      'outputDir',
      'quiet',
    ]) {
      expect(config, unused).not.toHaveProperty(unused);
    }

    const trained = /val loss (\d+\.\d{4}), acc@1 (\d+\.\d\d%)/.exec(run.stdout);
    expect(trained, run.stdout).not.toBeNull();
    // The training modules in the run's bf16 give exactly the numbers train reported (the fused
    // inference path, eval's default, rounds bf16 at other points: batch norm is folded first).
    const evaluated = await cli(['eval', '--checkpoint', out, '-b', '8', '-j', '0', '--engine', 'modules']);
    expect(evaluated.code, evaluated.stderr).toBe(0);
    expect(evaluated.stderr).toMatch(/resize 18, crop 16, cpu, amp bf16\n/);
    const [, loss, acc1] = defined(trained, 'the validation line');
    expect(evaluated.stdout).toContain(`loss ${loss}  Acc@1 ${acc1}`);
    // Told otherwise, it evaluates in fp32.
    const fp32 = await cli(['eval', '--checkpoint', out, '-b', '8', '-j', '0', '--amp', 'none']);
    expect(fp32.stderr).toMatch(/resize 18, crop 16, cpu, fp32\n/);

    const again = await cli([
      'train',
      '--config',
      join(out, 'config.json'),
      '--max-steps',
      '1',
      '--output-dir',
      join(dir, 'bf16-again'),
      '--quiet',
    ]);
    expect(again.code, again.stderr).toBe(0);
  });

  it('refuses a batch that cannot fit in memory, with the size and what to try', async () => {
    const run = await cli([
      'train',
      '-b',
      '1000000000',
      '--max-steps',
      '1',
      '-j',
      '0',
      '--output-dir',
      join(dir, 'huge-batch'),
    ]);
    expect(run.code).toBe(1);
    expect(run.stderr).toMatch(
      /^resnet-cuda train: out of memory: a batch of 1,000,000,000 images of 32x32 px needs 2861\.0 GiB for its pixels alone, more than this machine's \d+\.\d GiB\n/,
    );
    expect(run.stderr).toMatch(/\nUse a smaller -b\/--batch-size; --accumulate K/);
    expect(existsSync(join(dir, 'huge-batch'))).toBe(false);
    // The validation batches count too.
    const val = await cli([
      'train',
      '-b',
      '100000',
      '--train-crop-size',
      '8',
      '--val-crop-size',
      '4096',
      '--val-resize-size',
      '4096',
      '--max-steps',
      '1',
      '-j',
      '0',
      '--output-dir',
      join(dir, 'huge-val'),
    ]);
    expect(val.code).toBe(1);
    expect(val.stderr).toMatch(
      /^resnet-cuda train: out of memory: a batch of 100,000 images of 4096x4096 px needs 4687\.5 GiB/,
    );
  });

  it('trains on synthetic data without DATA', async () => {
    const run = await cli([
      'train',
      '--dataset',
      'synthetic',
      '--num-classes',
      '10',
      '--max-steps',
      '1',
      '-b',
      '2',
      '--train-crop-size',
      '16',
      '-j',
      '0',
      '--output-dir',
      join(dir, 'synthetic'),
    ]);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stderr).toContain(
      'resnet18 (small-image stem), 10 classes, on synthetic data (200 training, 20 validation images, 16 px)',
    );
  });

  it('train --cuda-graph on the CPU says once that CUDA graphs need a CUDA device, and trains', async () => {
    const run = await cli([
      'train',
      '--dataset',
      'synthetic',
      '--num-classes',
      '10',
      '--max-steps',
      '2',
      '-b',
      '2',
      '--train-crop-size',
      '16',
      '-j',
      '0',
      '--cuda-graph',
      '--output-dir',
      join(dir, 'synthetic-graph'),
    ]);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stderr.split('cudaGraph: the device is cpu (CUDA graphs need a CUDA device)').length).toBe(2);
  });

  it('overfits a few batches with --dry-run and writes no checkpoint', async () => {
    const out = join(dir, 'dry');
    mkdirSync(out);
    const run = await cli([
      'train',
      '--dry-run',
      '1',
      '--epochs',
      '2',
      '-b',
      '4',
      '--train-crop-size',
      '16',
      '-j',
      '0',
      '--output-dir',
      out,
      '--quiet',
      '--no-plots',
    ]);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toMatch(/^finished after 2 epochs \(2 steps\)/);
    expect(readdirSync(join(out, 'checkpoints'))).toEqual([]);
  });

  it('fine-tunes from weights with another number of classes, leaving out the classifier, and freezes layers', async () => {
    const out = join(dir, 'finetune');
    const run = await cli([
      'train',
      folder,
      '--weights',
      weights3,
      '--freeze',
      'conv1,bn1,layer1',
      '--max-steps',
      '1',
      '-b',
      '8',
      '-j',
      '0',
      '--train-crop-size',
      '16',
      '--output-dir',
      out,
      '--no-tensorboard',
    ]);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stderr).toMatch(/loaded .*fresh3.safetensors without its classifier \(3 classes; this run has 4\)/);
    expect(run.stderr).toContain('froze conv1, bn1, layer1 (');
    const stem = await cli([
      'train',
      folder,
      '--weights',
      weights3,
      '--stem',
      'imagenet',
      '--output-dir',
      join(dir, 'stem'),
    ]);
    expect(stem.code).toBe(2);
    expect(stem.stderr).toMatch(/has the small stem, but this run uses the imagenet one\nPass --stem small\.\n$/);
    const model = await cli([
      'train',
      folder,
      '--weights',
      weights3,
      '--model',
      'resnet50',
      '--output-dir',
      join(dir, 'r50'),
    ]);
    expect(model.code).toBe(2);
    expect(model.stderr).toContain('holds a resnet18, but --model is resnet50');
  });

  it('rejects --freeze prefixes that match no parameter, naming the modules', async () => {
    const run = await cli([
      'train',
      '--freeze',
      'layer9',
      '--max-steps',
      '1',
      '--train-crop-size',
      '16',
      '-j',
      '0',
      '--output-dir',
      join(dir, 'frozen'),
    ]);
    expect(run.code).toBe(2);
    expect(run.stderr).toContain("--freeze: no parameter is under 'layer9'");
    expect(run.stderr).toContain('conv1, bn1, layer1, layer2, layer3, layer4, fc');
  });
});

describe('the compiled entry point', () => {
  const entry = join(root, 'dist', 'lib', 'cli', 'main.js');

  it("is the package bin, starts with a shebang, and exits with the command line's codes", () => {
    const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as PackageJson;
    expect(pkg.bin).toEqual({ 'resnet-cuda': './dist/lib/cli/main.js' });
    expect(readFileSync(entry, 'utf8').startsWith('#!/usr/bin/env node\n')).toBe(true);
    const version = spawnSync(process.execPath, [entry, '--version'], { encoding: 'utf8' });
    expect(version.status).toBe(0);
    expect(version.stdout.trim()).toBe(pkg.version);
    const bad = spawnSync(process.execPath, [entry, 'train', '--lr', 'abc'], { encoding: 'utf8', cwd: dir });
    expect(bad.status).toBe(2);
    expect(bad.stderr).toBe(
      "resnet-cuda train: --lr expects a number above 0, got 'abc'\nRun 'resnet-cuda train --help' for the options.\n",
    );
    const help = spawnSync(process.execPath, [entry, 'predict', '--help'], { encoding: 'utf8' });
    expect(help.status).toBe(0);
    expect(help.stdout).toContain('Usage: resnet-cuda predict [options] IMAGE...');
  });
});
