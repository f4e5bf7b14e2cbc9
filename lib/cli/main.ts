#!/usr/bin/env node
/**
 * `resnet-cuda`, the command line: `train`, `eval`, `predict`, `lr-find`, `embed`, `bench`, `summary`, `prune`,
 * `export`, `launch`, `doctor` and `install-cuda`, like torchvision's `references/classification/train.py` split into subcommands.
 *
 * Exit codes: 0 on success, 2 for a usage error (reported before any work starts), 1 for a
 * failure while working. Errors are one line, `resnet-cuda <command>: <message>`, and a hint;
 * `--verbose` or `RC_DEBUG=1` adds the stack trace.
 * @packageDocumentation
 */
import { realpathSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import {
  CliError,
  UsageError,
  closest,
  formatHelp,
  packageVersion,
  parseCommand,
  processIO,
  type CliIO,
  type Command,
} from './options.js';

/** The commands, loaded on demand so that `--help` and `--version` stay instant. */
const COMMANDS: Record<string, { summary: string; load: () => Promise<Command> }> = {
  train: {
    summary: 'Train a ResNet on an image folder, CIFAR, MNIST, synthetic data or the built-in demo dataset.',
    load: async () => (await import('./train.js')).trainCommand,
  },
  eval: {
    summary: 'Evaluate weights or a checkpoint: loss, Acc@1, Acc@5 and a per-class report.',
    load: async () => (await import('./eval.js')).evalCommand,
  },
  predict: {
    summary: 'Classify image files and print the top-k classes with their probabilities.',
    load: async () => (await import('./predict.js')).predictCommand,
  },
  'lr-find': {
    summary: 'Find a learning rate: the range test (fastai lr_find, pytorch-lr-finder), with a plot.',
    load: async () => (await import('./lr-find.js')).lrFindCommand,
  },
  embed: {
    summary: 'Extract the pooled features of a dataset to .npy files and draw their t-SNE as a PNG.',
    load: async () => (await import('./embed.js')).embedCommand,
  },
  bench: {
    summary: 'Measure training throughput (forward, backward and SGD step) on synthetic data.',
    load: async () => (await import('./bench.js')).benchCommand,
  },
  summary: {
    summary: "Print a model's layers, output shapes, parameters, MACs and activation memory (torchinfo's table).",
    load: async () => (await import('./summary.js')).summaryCommand,
  },
  prune: {
    summary: 'Prune trained weights: global magnitude (sparse) or channels (a smaller dense ResNet).',
    load: async () => (await import('./prune.js')).pruneCommand,
  },
  export: {
    summary: 'Export trained weights for deployment: ONNX (batch norm folded) for ONNX Runtime and TensorRT.',
    load: async () => (await import('./export.js')).exportCommand,
  },
  launch: {
    summary: 'Start a data-parallel job: one process per GPU or CPU share, supervised (as torchrun does).',
    load: async () => (await import('./launch.js')).launchCommand,
  },
  doctor: {
    summary: 'Check the installation: the addon, each backend, sharp; says what to fix.',
    load: async () => (await import('./doctor.js')).doctorCommand,
  },
  'install-cuda': {
    summary:
      'Download the pinned CUDA libraries (cuDNN, cuBLAS, NCCL) into the cache, where the CUDA backend finds them.',
    load: async () => (await import('./install-cuda.js')).installCudaCommand,
  },
};

function topLevelHelp(): string {
  const width = Math.max(...Object.keys(COMMANDS).map((c) => c.length)) + 4;
  return (
    'Usage: resnet-cuda <command> [options]\n\n' +
    'Train and use the ResNet family from the command line, on NVIDIA GPUs (cuDNN) or on the CPU (oneDNN).\n\n' +
    'Commands:\n' +
    Object.entries(COMMANDS)
      .map(([name, c]) => `  ${name.padEnd(width)}${c.summary}\n`)
      .join('') +
    '\nOptions:\n' +
    '  -h, --help       Print this help; `resnet-cuda <command> --help` describes a command.\n' +
    '  -V, --version    Print the version.\n\n' +
    'Examples:\n' +
    '  resnet-cuda train                                    # the demo: ResNet-18 on the built-in dataset, on the CPU\n' +
    '  resnet-cuda train data/imagenet --model resnet50 --device cuda --amp bf16 -b 256 --lr 0.1\n' +
    '  resnet-cuda eval data/imagenet --checkpoint runs/x/checkpoints/best.safetensors\n' +
    '  resnet-cuda predict --weights runs/x/model.safetensors cat.jpg dog.jpg\n' +
    '  resnet-cuda lr-find --model resnet50 --device cuda --amp bf16 -b 256\n' +
    '  resnet-cuda embed --checkpoint runs/x --output-dir runs/x/embed\n' +
    '  resnet-cuda bench --device cuda --amp bf16\n' +
    '  resnet-cuda summary --model resnet50\n' +
    '  resnet-cuda prune --checkpoint runs/x --structured --amount 0.3 --output-dir runs/x-slim\n' +
    '  resnet-cuda export --checkpoint runs/x --output runs/x/model.onnx\n' +
    '  resnet-cuda launch --nproc-per-node gpu -- resnet-cuda train data/imagenet --device cuda\n' +
    '  resnet-cuda doctor\n'
  );
}

function debugEnabled(io: CliIO, argv: readonly string[]): boolean {
  const flag = io.env.RC_DEBUG;
  return (flag !== undefined && flag !== '' && flag !== '0' && flag !== 'false') || argv.includes('--verbose');
}

/** The hint printed under a runtime error, from what the error says about itself. */
function runtimeHint(error: Error & { code?: string }, command: string): string {
  if (error instanceof CliError && error.hint) return error.hint;
  if (/"sharp" module|Cannot find (module|package) 'sharp'/.test(error.message)) {
    return "The image library sharp does not load; run 'resnet-cuda doctor' for what to do.";
  }
  switch (error.code) {
    case 'ERR_RC_DEVICE':
      return "Run 'resnet-cuda doctor' to see which devices this installation can use.";
    case 'ERR_RC_ADDON_LOAD':
      return "Run 'resnet-cuda doctor' for what to install or rebuild.";
    case 'ERR_RC_STATE_DICT':
      return 'Check that --model and --num-classes match the file (or pass the training checkpoint, which records them).';
    case 'ERR_RC_CHECKPOINT':
    case 'ERR_RC_CORRUPT_FILE':
    case 'ERR_RC_DATASET':
      return `Check the file or folder named above; 'resnet-cuda ${command} --help' describes the layouts read.`;
    default:
      return 'Run again with --verbose (or RC_DEBUG=1) for the stack trace.';
  }
}

/**
 * Runs the command line `argv` (the words after `resnet-cuda`) and resolves to the exit code.
 * Never throws and never exits the process: errors are written to `io.stderr`.
 */
export async function main(argv: readonly string[], io: CliIO = processIO()): Promise<number> {
  const [name, ...rest] = argv;
  if (name === undefined || name === '--help' || name === '-h' || name === 'help') {
    if (name === 'help' && rest[0] !== undefined && Object.hasOwn(COMMANDS, rest[0])) {
      return main([rest[0], '--help'], io);
    }
    // Without a command it is a usage error: the help goes where errors go.
    (name === undefined ? io.stderr : io.stdout).write(topLevelHelp());
    return name === undefined ? 2 : 0;
  }
  if (name === '--version' || name === '-V' || name === 'version') {
    io.stdout.write(`${packageVersion()}\n`);
    return 0;
  }
  const entry = Object.hasOwn(COMMANDS, name) ? COMMANDS[name] : undefined;
  if (entry === undefined) {
    const guess = closest(name, Object.keys(COMMANDS));
    const what = name.startsWith('-') ? `unknown option '${name}'` : `unknown command '${name}'`;
    io.stderr.write(`resnet-cuda: ${what}${guess ? ` (did you mean '${guess}'?)` : ''}\n`);
    io.stderr.write(`The commands are ${Object.keys(COMMANDS).join(', ')}; run 'resnet-cuda --help' for more.\n`);
    return 2;
  }

  const debug = debugEnabled(io, rest);
  try {
    const command = await entry.load();
    const parsed = parseCommand(command.spec, rest, io.cwd);
    if (parsed === 'help') {
      io.stdout.write(formatHelp(command.spec));
      return 0;
    }
    return await command.run(parsed, io);
  } catch (caught) {
    const error = caught instanceof Error ? (caught as Error & { code?: string }) : new Error(String(caught));
    const usage = error instanceof UsageError;
    // Multi-line messages (an addon load failure) keep their lines; the first one leads.
    io.stderr.write(`resnet-cuda ${name}: ${error.message}\n`);
    const hint = usage ? (error.hint ?? `Run 'resnet-cuda ${name} --help' for the options.`) : runtimeHint(error, name);
    io.stderr.write(`${hint}\n`);
    if (debug && error.stack) io.stderr.write(`${error.stack}\n`);
    return usage ? 2 : 1;
  }
}

/** Whether this module is the program being run (`node main.js`, or the `resnet-cuda` bin link). */
function isEntryPoint(): boolean {
  const script = process.argv[1];
  if (script === undefined) return false;
  try {
    return realpathSync(script) === realpathSync(fileURLToPath(import.meta.url));
  } catch {
    return false;
  }
}

if (isEntryPoint()) {
  const code = await main(process.argv.slice(2));
  // Let pending output drain; the exit code is all that remains to be said.
  process.exitCode = code;
}
