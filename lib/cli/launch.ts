/**
 * `resnet-cuda launch`: torchrun for this package. Starts one process per GPU (or per share of the
 * CPU cores) with the environment `initProcessGroup` reads, prefixes their output with the rank,
 * and supervises them (see lib/distributed/launcher.ts).
 * @packageDocumentation
 */
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:net';
import { allowedCpus, findExecutable } from '../distributed/cpu-binding.js';
import { normalizeHost } from '../distributed/env.js';
import { describeExit, launchRanks, signalExitCode, type RankBinding } from '../distributed/launcher.js';
import { CliError, UsageError, type CliIO, type Command, type CommandSpec, type ParsedCommand } from './options.js';

/** torchrun's default `--master-port` for a job of several nodes. */
export const DEFAULT_MULTI_NODE_PORT = 29500;

const SPEC: CommandSpec = {
  name: 'launch',
  summary: 'Start a data-parallel job: one process per GPU or CPU share, supervised (torchrun).',
  description:
    "Starts --nproc-per-node processes of COMMAND (given after '--') on this node, as torchrun does: each gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, the job's store token RESNET_STORE_TOKEN, and RESNET_RESTART_COUNT (0, then 1, 2 ... after restarts). Every line a process prints is prefixed with '[rank N] '.\n\n" +
    "Binding: with GPUs, a process uses CUDA device LOCAL_RANK (every GPU stays visible; initProcessGroup picks cuda:<LOCAL_RANK>) and OMP_NUM_THREADS is its share of the cores. On the CPU, the cores this launcher may use are split into disjoint contiguous shares, one per process: OMP_NUM_THREADS is the share's size (unless OMP_NUM_THREADS is set) and the process is pinned to it with taskset when taskset is installed, else through OMP_PLACES and OMP_PROC_BIND (which pin the OpenMP threads only).\n\n" +
    'Supervision: when a process exits with an error or is killed, the others get SIGTERM, then SIGKILL after --grace-period seconds, and the launcher exits with code 1 naming the rank and its exit code or signal. With --max-restarts K, the whole local group is started again instead, up to K times, with the same ranks; the program is expected to resume from its latest checkpoint (resnet-cuda train does when RESNET_RESTART_COUNT is above 0). SIGINT, SIGTERM and SIGHUP sent to the launcher are forwarded to every process; the launcher then exits with 130, 143 or 129.\n\n' +
    'Several nodes: run the same command on each node with --nnodes, its --node-rank, and the --master-addr (and --master-port) of node 0, where global rank 0 serves the key-value store. The store token must be the same on every node: export RESNET_STORE_TOKEN (a random secret) before launching. The store port must not be reachable from outside the cluster.',
  positionals: [{ name: 'COMMAND', variadic: true, help: "The program and its arguments, after '--'." }],
  options: [
    {
      name: 'nproc-per-node',
      type: 'string',
      valueName: 'N|gpu|cpu',
      default: '1',
      help: 'Processes on this node: a number, gpu (one per visible GPU) or cpu (one per CPU core this launcher may use).',
    },
    {
      name: 'bind',
      type: 'choice',
      choices: ['auto', 'gpu', 'cpu', 'none'],
      default: 'auto',
      help: 'Bind each process to a GPU (gpu), to a share of the CPU cores (cpu), or neither (none). auto: gpu with --nproc-per-node gpu, cpu with cpu, else gpu when CUDA devices are visible and cpu otherwise.',
    },
    { name: 'nnodes', type: 'int', min: 1, default: 1, valueName: 'M', help: 'Nodes in the job.' },
    { name: 'node-rank', type: 'int', min: 0, default: 0, valueName: 'R', help: "This node's number, 0 to M - 1." },
    {
      name: 'master-addr',
      type: 'string',
      valueName: 'HOST',
      defaultText: '127.0.0.1; required with --nnodes above 1',
      help: 'Host of node 0, where rank 0 serves the store.',
    },
    {
      name: 'master-port',
      type: 'int',
      min: 1,
      max: 65535,
      valueName: 'PORT',
      defaultText: `a free port on one node, ${DEFAULT_MULTI_NODE_PORT} with several`,
      help: "The store's TCP port.",
    },
    {
      name: 'max-restarts',
      type: 'int',
      min: 0,
      default: 0,
      valueName: 'K',
      help: 'Restart the local group up to K times after a process fails.',
    },
    {
      name: 'monitor-interval',
      type: 'number',
      min: 0,
      exclusiveMin: true,
      default: 0.1,
      valueName: 'S',
      help: "Seconds between two looks at the processes' states.",
    },
    {
      name: 'grace-period',
      type: 'number',
      min: 0,
      default: 10,
      valueName: 'S',
      help: 'Seconds a process has to exit after SIGTERM before it gets SIGKILL.',
    },
  ],
  examples: [
    'resnet-cuda launch --nproc-per-node gpu -- resnet-cuda train data/imagenet --model resnet50 --device cuda',
    'resnet-cuda launch --nproc-per-node 2 --bind cpu -- node my-script.js',
    'RESNET_STORE_TOKEN=$(openssl rand -hex 16) resnet-cuda launch --nnodes 2 --node-rank 0 --master-addr node01 --nproc-per-node 8 -- resnet-cuda train ...',
  ],
  config: false,
};

/** The number of visible CUDA devices (loads the addon). */
async function visibleGpus(): Promise<{ count: number; reason?: string }> {
  const { listBackends } = await import('../device.js');
  const cuda = listBackends().find((b) => b.name === 'cuda');
  if (!cuda?.available) {
    return { count: 0, reason: cuda?.reason ?? 'this build has no CUDA backend' };
  }
  return { count: cuda.deviceCount };
}

/** A port that was free a moment ago on `host`; fails naming the host when it is not this machine's. */
async function freePort(host: string): Promise<number> {
  return await new Promise((done, fail) => {
    const server = createServer();
    server.once('error', (error: Error) =>
      fail(
        new CliError(
          `cannot listen on --master-addr ${host}: ${error.message}`,
          'On a single node, --master-addr must be an address of this machine (127.0.0.1 by default).',
        ),
      ),
    );
    server.listen(0, host, () => {
      const address = server.address();
      const port = typeof address === 'object' && address !== null ? address.port : 0;
      server.close(() => done(port));
    });
  });
}

/** `--nproc-per-node` and `--bind` resolved: the count and the binding. */
async function processesAndBinding(
  text: string,
  bind: string,
  cpus: readonly number[],
): Promise<{ nproc: number; binding: RankBinding }> {
  let nproc: number;
  if (text === 'cpu') nproc = cpus.length;
  else if (text === 'gpu') {
    const gpus = await visibleGpus();
    if (gpus.count === 0) {
      throw new CliError(
        `--nproc-per-node gpu: no CUDA device is visible (${gpus.reason ?? 'none found'})`,
        "Run 'resnet-cuda doctor', or give a number of processes and --bind cpu.",
      );
    }
    nproc = gpus.count;
  } else if (/^\d+$/.test(text) && Number(text) >= 1 && Number(text) <= 1024) nproc = Number(text);
  else throw new UsageError(`--nproc-per-node expects a number from 1 to 1024, gpu or cpu, got '${text}'`);

  if (bind !== 'auto') {
    if (bind === 'gpu' && text !== 'gpu') {
      const gpus = await visibleGpus();
      if (gpus.count < nproc) {
        throw new UsageError(
          `--bind gpu with --nproc-per-node ${nproc} needs ${nproc} CUDA devices; ${gpus.count} visible${gpus.reason ? ` (${gpus.reason})` : ''}`,
          'NCCL runs one process per GPU; use --bind cpu to run on the CPU.',
        );
      }
    }
    return { nproc, binding: bind as RankBinding };
  }
  if (text === 'gpu') return { nproc, binding: 'gpu' };
  if (text === 'cpu') return { nproc, binding: 'cpu' };
  let gpus: { count: number };
  try {
    gpus = await visibleGpus();
  } catch {
    gpus = { count: 0 };
  }
  return { nproc, binding: gpus.count > 0 ? 'gpu' : 'cpu' };
}

async function run(parsed: ParsedCommand, io: CliIO): Promise<number> {
  const v = parsed.values;
  const command = parsed.afterDoubleDash;
  if (parsed.positionals.length > command.length || command.length === 0) {
    throw new UsageError(
      command.length === 0 ? "missing the command to launch after '--'" : `put the command to launch after '--'`,
      'For example: resnet-cuda launch --nproc-per-node 2 -- node train.js --epochs 10',
    );
  }
  const nnodes = v.nnodes as number;
  const nodeRank = v.nodeRank as number;
  if (nodeRank >= nnodes) throw new UsageError(`--node-rank ${nodeRank} must be below --nnodes ${nnodes}`);
  const addrText = v.masterAddr as string | undefined;
  if (nnodes > 1 && addrText === undefined) {
    throw new UsageError(`--nnodes ${nnodes} needs --master-addr: the host of node 0, the same on every node`);
  }
  const masterAddr = normalizeHost(addrText ?? '127.0.0.1');
  if (masterAddr === undefined) {
    throw new UsageError(`--master-addr expects a host name or an IP address, got '${addrText ?? ''}'`);
  }
  const envToken = io.env.RESNET_STORE_TOKEN ?? '';
  if (nnodes > 1 && envToken === '') {
    throw new UsageError(
      `--nnodes ${nnodes} needs the environment variable RESNET_STORE_TOKEN: the store refuses clients without the job's token, and every node must present the same one`,
      'Export the same random secret on every node before launching, e.g. RESNET_STORE_TOKEN=$(openssl rand -hex 16) (with SLURM, once in the batch script).',
    );
  }
  const cpus = allowedCpus();
  const { nproc, binding } = await processesAndBinding(v.nprocPerNode as string, v.bind as string, cpus);
  const masterPort =
    (v.masterPort as number | undefined) ?? (nnodes > 1 ? DEFAULT_MULTI_NODE_PORT : await freePort(masterAddr));
  const [file, ...args] = command as [string, ...string[]];

  const result = await launchRanks({
    command: file,
    args,
    nprocPerNode: nproc,
    nnodes,
    nodeRank,
    masterAddr,
    masterPort,
    token: envToken !== '' ? envToken : randomBytes(16).toString('hex'),
    maxRestarts: v.maxRestarts as number,
    monitorIntervalSeconds: v.monitorInterval as number,
    gracePeriodSeconds: v.gracePeriod as number,
    binding,
    cpus,
    taskset: findExecutable('taskset', io.env.PATH),
    env: io.env,
    cwd: io.cwd,
    stdout: io.stdout,
    stderr: io.stderr,
  });
  if (result.status === 'succeeded') return 0;
  if (result.status === 'interrupted') {
    const signal = result.signal ?? 'SIGTERM';
    io.stderr.write(`resnet-cuda launch: stopped by ${signal}\n`);
    return signalExitCode(signal);
  }
  const failure = result.failure;
  const restarts = result.restarts > 0 ? ` after ${result.restarts} restart${result.restarts > 1 ? 's' : ''}` : '';
  throw new CliError(
    `${failure ? describeExit(failure) : 'a rank failed'}${restarts}`,
    "Its output above, prefixed '[rank N]', says why; --max-restarts K restarts the group from the latest checkpoint.",
  );
}

/** The `launch` command. */
export const launchCommand: Command = { spec: SPEC, run };
