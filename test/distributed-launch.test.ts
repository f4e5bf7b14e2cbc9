import { describe, expect, it } from 'vitest';
import { main } from '../lib/cli/main.js';
import type { CliIO } from '../lib/cli/options.js';
import { allowedCpus, cpuShares, formatCpuList, parseCpuList } from '../lib/distributed/cpu-binding.js';
import { rendezvousFromEnv } from '../lib/distributed/env.js';
import { LinePrefixer } from '../lib/distributed/line-prefixer.js';

/** What one `resnet-cuda launch` run did. */
interface LaunchRun {
  code: number;
  stdout: string;
  stderr: string;
  /** Seconds it took. */
  seconds: number;
}

/** The variables a launched rank may inherit from the test runner's own environment. */
const CLEARED = ['RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'RESNET_STORE_TOKEN', 'OMP_NUM_THREADS'];

/**
 * Runs `resnet-cuda launch <options> -- node -e <script>` in this process with the test runner's
 * environment (less any launcher variables) plus `env`. `onStderr` sees the launcher's error
 * stream as it grows.
 */
async function launch(
  options: string[],
  script: string,
  env: Record<string, string> = {},
  onOutput?: (stdout: string) => void,
): Promise<LaunchRun> {
  const base = Object.fromEntries(Object.entries(process.env).filter(([key]) => !CLEARED.includes(key)));
  let stdout = '';
  let stderr = '';
  const io: CliIO = {
    stdout: {
      write: (s: string) => {
        stdout += s;
        onOutput?.(stdout);
      },
    },
    stderr: { write: (s: string) => (stderr += s) },
    env: { ...base, ...env },
    cwd: process.cwd(),
  };
  const start = performance.now();
  const code = await main(['launch', ...options, '--', process.execPath, '-e', script], io);
  return { code, stdout, stderr, seconds: (performance.now() - start) / 1000 };
}

/** The lines of `text` from rank `rank`, without the prefix. */
function linesOf(text: string, rank: number): string[] {
  const prefix = `[rank ${rank}] `;
  return text
    .split('\n')
    .filter((line) => line.startsWith(prefix))
    .map((line) => line.slice(prefix.length));
}

/** A rank script printing its launcher variables as one JSON line. */
const PRINT_ENV = `
const keys = ['RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'GROUP_RANK', 'GROUP_WORLD_SIZE', 'MASTER_ADDR',
  'MASTER_PORT', 'RESNET_STORE_TOKEN', 'RESNET_RESTART_COUNT', 'RESNET_MAX_RESTARTS', 'OMP_NUM_THREADS', 'OMP_PLACES',
  'OMP_PROC_BIND'];
const status = require('fs').readFileSync('/proc/self/status', 'utf8');
const cpus = /^Cpus_allowed_list:\\s*(\\S+)$/m.exec(status)[1];
console.log(JSON.stringify({ ...Object.fromEntries(keys.map((k) => [k, process.env[k]])), cpus }));
`;

/** The JSON line each rank printed, by rank. */
function envsOf(run: LaunchRun, ranks: number[]): Record<string, string | undefined>[] {
  return ranks.map((rank) => {
    const lines = linesOf(run.stdout, rank);
    expect(lines, `rank ${rank}'s output in ${run.stdout}\n${run.stderr}`).toHaveLength(1);
    return JSON.parse(lines[0] ?? '{}') as Record<string, string | undefined>;
  });
}

describe('resnet-cuda launch', () => {
  it("gives each rank torchrun's variables, one token and one free port", async () => {
    const run = await launch(['--nproc-per-node', '2', '--bind', 'none'], PRINT_ENV);
    expect(run.code, run.stderr).toBe(0);
    const envs = envsOf(run, [0, 1]);
    const [first, second] = envs;
    expect(first?.RESNET_STORE_TOKEN).toMatch(/^[0-9a-f]{32}$/);
    expect(second?.RESNET_STORE_TOKEN).toBe(first?.RESNET_STORE_TOKEN);
    expect(Number(first?.MASTER_PORT)).toBeGreaterThan(0);
    envs.forEach((env, rank) => {
      expect(env).toMatchObject({
        RANK: String(rank),
        WORLD_SIZE: '2',
        LOCAL_RANK: String(rank),
        LOCAL_WORLD_SIZE: '2',
        GROUP_RANK: '0',
        GROUP_WORLD_SIZE: '1',
        MASTER_ADDR: '127.0.0.1',
        MASTER_PORT: first?.MASTER_PORT,
        RESNET_RESTART_COUNT: '0',
        RESNET_MAX_RESTARTS: '0',
      });
      // --bind none leaves the threads and the affinity alone.
      expect(env.OMP_NUM_THREADS).toBeUndefined();
      expect(env.OMP_PLACES).toBeUndefined();
      // What the ranks read back through the rendezvous.
      expect(rendezvousFromEnv(env)).toEqual({
        rank,
        worldSize: 2,
        localRank: rank,
        localWorldSize: 2,
        masterAddr: '127.0.0.1',
        masterPort: Number(first?.MASTER_PORT),
        token: first?.RESNET_STORE_TOKEN,
        source: 'torchrun',
      });
    });
  });

  it("numbers a later node's ranks after the earlier nodes' and takes the token from the environment", async () => {
    const run = await launch(
      [
        '--nproc-per-node=2',
        '--bind=none',
        '--nnodes=3',
        '--node-rank=1',
        '--master-addr=10.1.2.3',
        '--master-port=1234',
      ],
      PRINT_ENV,
      { RESNET_STORE_TOKEN: 'shared-secret' },
    );
    expect(run.code, run.stderr).toBe(0);
    const envs = envsOf(run, [2, 3]);
    envs.forEach((env, localRank) =>
      expect(env).toMatchObject({
        RANK: String(2 + localRank),
        WORLD_SIZE: '6',
        LOCAL_RANK: String(localRank),
        LOCAL_WORLD_SIZE: '2',
        GROUP_RANK: '1',
        GROUP_WORLD_SIZE: '3',
        MASTER_ADDR: '10.1.2.3',
        MASTER_PORT: '1234',
        RESNET_STORE_TOKEN: 'shared-secret',
      }),
    );
    expect(run.stderr).toContain('ranks 2-3 of 6 on node 1, store 10.1.2.3:1234');
  });

  it('gives each rank a disjoint share of the cores, pinned with taskset when it is installed', async () => {
    const cpus = allowedCpus();
    const shares = cpuShares(cpus, 2);
    const withTaskset = await launch(['--nproc-per-node', '2', '--bind', 'cpu'], PRINT_ENV);
    expect(withTaskset.code, withTaskset.stderr).toBe(0);
    const hasTaskset = withTaskset.stderr.includes('(taskset)');
    envsOf(withTaskset, [0, 1]).forEach((env, rank) => {
      const share = shares[rank] ?? [];
      expect(env.OMP_NUM_THREADS).toBe(String(share.length));
      if (hasTaskset) expect(parseCpuList(env.cpus ?? '')).toEqual(share);
      else expect(env.OMP_PLACES).toBe(share.map((c) => `{${c}}`).join(','));
    });

    // Without taskset on the PATH: OpenMP places, the process's affinity untouched.
    const without = await launch(['--nproc-per-node', '2', '--bind', 'cpu'], PRINT_ENV, { PATH: '/nonexistent' });
    expect(without.code, without.stderr).toBe(0);
    expect(without.stderr).toContain('(OpenMP places)');
    envsOf(without, [0, 1]).forEach((env, rank) => {
      const share = shares[rank] ?? [];
      expect(env).toMatchObject({
        OMP_NUM_THREADS: String(share.length),
        OMP_PLACES: share.map((c) => `{${c}}`).join(','),
        OMP_PROC_BIND: 'close',
        cpus: formatCpuList(cpus),
      });
    });

    // A thread count the user set is kept.
    const kept = await launch(['--nproc-per-node', '2', '--bind', 'cpu'], PRINT_ENV, { OMP_NUM_THREADS: '3' });
    expect(envsOf(kept, [0, 1]).map((env) => env.OMP_NUM_THREADS)).toEqual(['3', '3']);
  });

  it('prefixes every line of both streams with the rank, keeping partial lines until their newline', async () => {
    const script = `
      const rank = process.env.RANK;
      process.stdout.write('par');
      setTimeout(() => {
        process.stdout.write('tial ' + rank + '\\nsecond ' + rank + '\\nno newline ' + rank);
        process.stderr.write('warning ' + rank + '\\n');
      }, 200);
    `;
    const run = await launch(['--nproc-per-node', '2', '--bind', 'none'], script);
    expect(run.code, run.stderr).toBe(0);
    for (const rank of [0, 1]) {
      expect(linesOf(run.stdout, rank)).toEqual([`partial ${rank}`, `second ${rank}`, `no newline ${rank}`]);
      expect(linesOf(run.stderr, rank)).toEqual([`warning ${rank}`]);
    }
    // Nothing unprefixed on stdout.
    expect(run.stdout.split('\n').filter((l) => l !== '' && !/^\[rank [01]\] /.test(l))).toEqual([]);
  });

  it('stops the other ranks when one exits with an error and names it', async () => {
    const script = `
      if (process.env.RANK === '1') setTimeout(() => process.exit(3), 300);
      else {
        process.on('SIGTERM', () => { console.log('got SIGTERM'); process.exit(0); });
        setInterval(() => {}, 1000);
      }
    `;
    const run = await launch(['--nproc-per-node', '2', '--bind', 'none'], script);
    expect(run.code).toBe(1);
    expect(run.stderr).toContain('resnet-cuda launch: rank 1 (local rank 1) exited with code 3');
    expect(linesOf(run.stdout, 0)).toEqual(['got SIGTERM']);
    expect(run.seconds).toBeLessThan(20);
  });

  it('kills a rank that ignores SIGTERM after the grace period', async () => {
    const script = `
      if (process.env.RANK === '1') setTimeout(() => process.exit(5), 300);
      else {
        process.on('SIGTERM', () => console.log('ignoring SIGTERM'));
        setInterval(() => {}, 1000);
      }
    `;
    const run = await launch(['--nproc-per-node', '2', '--bind', 'none', '--grace-period', '1'], script);
    expect(run.code).toBe(1);
    expect(run.stderr).toContain('rank 1 (local rank 1) exited with code 5');
    expect(run.stderr).toContain('SIGKILL after 1 s');
    expect(linesOf(run.stdout, 0)).toEqual(['ignoring SIGTERM']);
    expect(run.seconds).toBeGreaterThanOrEqual(1);
    expect(run.seconds).toBeLessThan(20);
  });

  it('names a rank killed by a signal', async () => {
    const script = `
      if (process.env.RANK === '0') setTimeout(() => process.kill(process.pid, 'SIGKILL'), 200);
      else setInterval(() => {}, 1000);
    `;
    const run = await launch(['--nproc-per-node', '2', '--bind', 'none'], script);
    expect(run.code).toBe(1);
    expect(run.stderr).toContain('resnet-cuda launch: rank 0 (local rank 0) was killed by SIGKILL');
  });

  it('restarts the whole group up to --max-restarts times, counting in RESNET_RESTART_COUNT', async () => {
    // Rank 1 fails in the first two attempts; rank 0 would run forever unless stopped.
    const script = `
      const restart = Number(process.env.RESNET_RESTART_COUNT);
      console.log('attempt ' + restart + ' of rank ' + process.env.RANK + ', token ' + process.env.RESNET_STORE_TOKEN);
      if (restart < 2) {
        if (process.env.RANK === '1') setTimeout(() => process.exit(7), 200);
        else setInterval(() => {}, 1000);
      }
    `;
    const run = await launch(['--nproc-per-node', '2', '--bind', 'none', '--max-restarts', '2'], script);
    expect(run.code, run.stderr).toBe(0);
    const token = /token ([0-9a-f]+)/.exec(run.stdout)?.[1];
    for (const rank of [0, 1]) {
      expect(linesOf(run.stdout, rank)).toEqual([0, 1, 2].map((n) => `attempt ${n} of rank ${rank}, token ${token}`));
    }
    expect(run.stderr).toContain(
      'rank 1 (local rank 1) exited with code 7; restarting the 2 local ranks (restart 1 of 2)',
    );
    expect(run.stderr).toContain('restarting the 2 local ranks (restart 2 of 2)');

    const short = await launch(['--nproc-per-node', '2', '--bind', 'none', '--max-restarts', '1'], script);
    expect(short.code).toBe(1);
    expect(short.stderr).toContain('resnet-cuda launch: rank 1 (local rank 1) exited with code 7 after 1 restart\n');
    expect(linesOf(short.stdout, 1)).toHaveLength(2);
  });

  it('forwards SIGINT to the ranks and exits with 130', async () => {
    const script = `
      process.on('SIGINT', () => { console.log('got SIGINT'); process.exit(130); });
      console.log('ready');
      setInterval(() => {}, 1000);
    `;
    let sent = false;
    const run = await launch(['--nproc-per-node', '2', '--bind', 'none'], script, {}, (stdout) => {
      if (!sent && linesOf(stdout, 0).includes('ready') && linesOf(stdout, 1).includes('ready')) {
        sent = true;
        process.kill(process.pid, 'SIGINT');
      }
    });
    expect(run.code).toBe(130);
    for (const rank of [0, 1]) expect(linesOf(run.stdout, rank)).toEqual(['ready', 'got SIGINT']);
    expect(run.stderr).toContain('resnet-cuda launch: stopped by SIGINT');
    // The launcher's handlers are gone.
    expect(process.listenerCount('SIGINT')).toBe(0);
  });

  it('says when the command cannot be started', async () => {
    let stderr = '';
    const io: CliIO = {
      stdout: { write: () => true },
      stderr: { write: (s: string) => (stderr += s) },
      env: { PATH: process.env.PATH },
      cwd: process.cwd(),
    };
    const code = await main(['launch', '--bind', 'none', '--', 'no-such-program-here'], io);
    expect(code).toBe(1);
    expect(stderr).toMatch(/rank 0 \(local rank 0\) could not start: .*ENOENT/);
  });

  it.each([
    [['--nproc-per-node', '0'], /--nproc-per-node expects a number from 1 to 1024, gpu or cpu, got '0'/],
    [['--nproc-per-node', 'two'], /--nproc-per-node .*got 'two'/],
    [['--nnodes', '2', '--node-rank', '2', '--master-addr', 'h'], /--node-rank 2 must be below --nnodes 2/],
    [['--nnodes', '2', '--node-rank', '1'], /--nnodes 2 needs --master-addr/],
    [['--nnodes', '2', '--master-addr', 'h'], /--nnodes 2 needs the environment variable RESNET_STORE_TOKEN/],
    [['--master-addr', 'bad host'], /--master-addr expects a host name or an IP address, got 'bad host'/],
    [['--master-addr', 'node:1234'], /--master-addr .*got 'node:1234'/],
    [['--master-port', '70000'], /--master-port/],
    [['--master-port', '0'], /--master-port/],
    [['--monitor-interval', '0'], /--monitor-interval/],
    [['--max-restarts', '-1'], /--max-restarts/],
    [['--bind', 'tpu'], /--bind/],
  ])('rejects %j', async (options, message) => {
    const run = await launch(options, 'process.exit(0)');
    expect(run.code).toBe(2);
    expect(run.stderr).toMatch(message);
    expect(run.stdout).toBe('');
  });

  it('wants the command after --', async () => {
    const io = (): CliIO & { err: () => string } => {
      let stderr = '';
      return {
        stdout: { write: () => true },
        stderr: { write: (s: string) => (stderr += s) },
        env: {},
        cwd: process.cwd(),
        err: () => stderr,
      };
    };
    const none = io();
    expect(await main(['launch', '--nproc-per-node', '2'], none)).toBe(2);
    expect(none.err()).toContain('missing');
    const before = io();
    expect(await main(['launch', 'node', '--', 'x.js'], before)).toBe(2);
    expect(before.err()).toContain("put the command to launch after '--'");
    const dashes = io();
    expect(await main(['launch', '--'], dashes)).toBe(2);
    expect(dashes.err()).toContain("missing the command to launch after '--'");
  });

  it('refuses a --master-addr that is not this machine on a single node', async () => {
    const run = await launch(['--bind', 'none', '--master-addr', '192.0.2.1'], 'process.exit(0)');
    expect(run.code).toBe(1);
    expect(run.stderr).toContain('cannot listen on --master-addr 192.0.2.1');
  });
});

describe('LinePrefixer', () => {
  it('keeps a multi-byte character split between chunks whole', () => {
    let out = '';
    const prefixer = new LinePrefixer('> ', (text) => (out += text));
    const bytes = Buffer.from('née\nço');
    prefixer.push(bytes.subarray(0, 2));
    prefixer.push(bytes.subarray(2, 7));
    expect(out).toBe('> née\n');
    prefixer.push(bytes.subarray(7));
    prefixer.end();
    expect(out).toBe('> née\n> ço\n');
  });

  it('writes an empty line as a prefixed empty line and nothing for an empty stream', () => {
    let out = '';
    const prefixer = new LinePrefixer('> ', (text) => (out += text));
    prefixer.push('a\n\nb\n');
    prefixer.end();
    expect(out).toBe('> a\n> \n> b\n');
    const silent = new LinePrefixer('> ', (text) => (out += text));
    silent.end();
    expect(out).toBe('> a\n> \n> b\n');
  });
});

describe('CPU shares', () => {
  it.each([
    [
      [0, 1, 2, 3, 4, 5, 6, 7],
      2,
      [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
      ],
    ],
    [
      [0, 1, 2, 3, 4],
      2,
      [
        [0, 1, 2],
        [3, 4],
      ],
    ],
    [[4, 5, 6, 10, 11], 3, [[4, 5], [6, 10], [11]]],
    [[0, 1], 3, [[0], [1], [0]]],
  ])('splits %j into %i shares', (cpus, parts, shares) => {
    expect(cpuShares(cpus, parts)).toEqual(shares);
    const flat = cpuShares(cpus, parts).flat();
    if (cpus.length >= parts) expect(flat).toEqual(cpus);
  });

  it('reads and writes CPU lists', () => {
    expect(parseCpuList('0-3,8,10-11')).toEqual([0, 1, 2, 3, 8, 10, 11]);
    expect(formatCpuList([0, 1, 2, 3, 8, 10, 11])).toBe('0-3,8,10-11');
    expect(() => parseCpuList('0-x')).toThrow(/CPU list .*'0-x'/);
  });
});
