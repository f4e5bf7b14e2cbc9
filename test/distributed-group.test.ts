/**
 * Process groups: the collectives table (test/helpers/collectives.ts) on Gloo with one rank in
 * this process and with two processes, and the failures a user meets: a bad MASTER_ADDR, a port in
 * use, a peer that never arrives, a peer killed or stalled mid-all-reduce. The same table runs on
 * NCCL with one rank on the emulated GPU (test/gpu/cases.ts). Multi-process cases spawn the
 * compiled rank scripts of test/distributed (`npm run build:ts` first).
 */
import { createServer, type Server } from 'node:net';
import { existsSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { DEFAULT_PROCESS_GROUP_TIMEOUT_SECONDS, initProcessGroup, ResnetError, Tensor } from '../lib/index.js';
import { COLLECTIVE_CASES } from './helpers/collectives.js';
import { freePort, rankScript, runRanks } from './helpers/ranks.js';

const explicit = { rank: 0, localRank: 0, localWorldSize: 1, masterAddr: '127.0.0.1', token: 'secret' };

describe('a Gloo process group of one rank (in this process)', () => {
  it.each(COLLECTIVE_CASES.map((c) => [c.name, c] as const))('%s', (_, c) => {
    const group = initProcessGroup({ ...explicit, worldSize: 1, masterPort: 0, timeoutSeconds: 30 });
    try {
      expect(group.backend).toBe('gloo');
      expect(group.device).toBe('cpu');
      c.run(group);
    } finally {
      group.destroy();
    }
  });

  it('records each collective with its times on the clock of process.hrtime, and its bytes', () => {
    const group = initProcessGroup({ ...explicit, worldSize: 1, masterPort: 0 });
    expect(group.timeoutSeconds).toBe(DEFAULT_PROCESS_GROUP_TIMEOUT_SECONDS);
    const before = Number(process.hrtime.bigint()) / 1e6;
    const t = Tensor.zeros([1000]);
    group.allReduce(t);
    group.broadcast(t, 0);
    group.synchronize();
    const after = Number(process.hrtime.bigint()) / 1e6;
    const records = group.takeCollectiveRecords();
    expect(records.map((r) => [r.op, r.bytes])).toEqual([
      ['allReduce', 4000],
      ['broadcast', 4000],
    ]);
    for (const r of records) {
      expect(r.enqueuedMs).toBeGreaterThanOrEqual(before);
      expect(r.startMs).toBeGreaterThanOrEqual(r.enqueuedMs);
      expect(r.endMs).toBeGreaterThanOrEqual(r.startMs);
      expect(r.endMs).toBeLessThanOrEqual(after);
    }
    expect(group.takeCollectiveRecords()).toEqual([]);
    group.destroy();
  });

  it('checks its arguments and refuses use after destroy', () => {
    const group = initProcessGroup({ ...explicit, worldSize: 1, masterPort: 0 });
    const t = Tensor.zeros([4]);
    expect(() => group.allReduce(t, { op: 'min' as never })).toThrow(/op/);
    expect(() => group.broadcast(t, 1)).toThrow(/root/);
    expect(() => group.allGather(t, Tensor.zeros([3]))).toThrow(/4 elements .*for output/);
    expect(() => group.allReduce({} as never)).toThrow(/tensor/);
    const gone = Tensor.zeros([2]);
    gone.dispose();
    expect(() => group.allReduce(gone)).toThrow(expect.objectContaining({ code: 'ERR_RC_DISPOSED' }));
    group.destroy();
    group.destroy();
    expect(() => group.allReduce(t)).toThrow(expect.objectContaining({ code: 'ERR_RC_DISPOSED' }));
    expect(() => initProcessGroup({ ...explicit, worldSize: 1, masterPort: 0, backend: 'mpi' as never })).toThrow(
      /backend/,
    );
    expect(() =>
      initProcessGroup({ ...explicit, worldSize: 1, masterPort: 0, backend: 'nccl', device: 'cpu' }),
    ).toThrow(/CUDA device .*for device/);
    expect(() => initProcessGroup({ ...explicit, worldSize: 2, rank: 2, masterPort: 0 })).toThrow(/rank/);
    expect(() => initProcessGroup({ ...explicit, worldSize: 1, masterPort: 0, timeoutSeconds: 0 })).toThrow(
      /timeoutSeconds/,
    );
    expect(() => initProcessGroup({ ...explicit, worldSize: 1, nodes: 2 } as never)).toThrow(/nodes/);
  });
});

const built = existsSync(rankScript('group-collectives'));
const needsBuild = built ? '' : ' (skipped: run `npm run build:ts` for the rank scripts)';

describe.skipIf(!built)(`Gloo process groups of two processes${needsBuild}`, () => {
  it('pass the collectives table on both ranks, and record every collective', async () => {
    const runs = await runRanks(rankScript('group-collectives'), { worldSize: 2, timeoutMs: 120_000 });
    for (const run of runs) {
      expect(run.stderr, `rank ${run.rank}`).toBe('');
      expect(run.code, `rank ${run.rank}: ${run.stdout}`).toBe(0);
      const oks = run.stdout.split('\n').filter((l) => l.startsWith('ok '));
      expect(oks).toEqual(COLLECTIVE_CASES.map((c) => `ok ${c.name}`));
      const recordsLine = run.stdout.split('\n').find((l) => l.startsWith('records ')) ?? 'records []';
      const records = JSON.parse(recordsLine.slice(8)) as { op: string }[];
      // One record per collective of the table: 8 single all-reduces, 3 chained, a broadcast, an all-gather, two barriers.
      expect(records.map((r) => r.op)).toEqual([
        ...Array<string>(8).fill('allReduce'),
        'allReduce',
        'allReduce',
        'allReduce',
        'broadcast',
        'allGather',
        'barrier',
        'barrier',
      ]);
    }
  });

  const faultRun = async (mode: string, timeoutSeconds: number) => {
    const runs = await runRanks(rankScript('group-fault'), {
      worldSize: 2,
      args: [mode, String(timeoutSeconds)],
      timeoutMs: (timeoutSeconds + 30) * 1000,
    });
    const line = runs[0]!.stdout.split('\n').find((l) => l.startsWith('error ')) ?? '';
    const [, ms, ...words] = line.split(' ');
    return { runs, ms: Number(ms), message: words.join(' ') };
  };

  it('SIGKILL of rank 1 mid-all-reduce: rank 0 fails well within the timeout, naming rank 1', async () => {
    const { runs, ms, message } = await faultRun('kill', 20);
    expect(runs[1]!.signal).toBe('SIGKILL');
    expect(runs[0]!.code, runs[0]!.stdout + runs[0]!.stderr).toBe(3);
    expect(message).toMatch(/Gloo allReduce failed on rank 0 of 2: rank 1 is gone \(its process exited\)/);
    expect(ms).toBeLessThan(20_000);
  });

  it('a peer that stalls: rank 0 fails after the timeout, saying that no rank exited', async () => {
    const { runs, ms, message } = await faultRun('stall', 3);
    expect(runs[0]!.code, runs[0]!.stdout + runs[0]!.stderr).toBe(3);
    expect(message).toMatch(/no rank exited; a peer stalled for more than 3 s/);
    expect(ms).toBeGreaterThanOrEqual(2_900);
    expect(ms).toBeLessThan(13_000);
  });

  it('a peer that never arrives: rank 0 fails joining within the timeout, asking whether every rank runs', async () => {
    const { runs, ms, message } = await faultRun('absent', 3);
    expect(runs[0]!.code, runs[0]!.stdout + runs[0]!.stderr).toBe(3);
    expect(message).toMatch(/rank 0 of 2 could not join the group within 3 s \(are all 2 ranks running/);
    expect(ms).toBeLessThan(13_000);
  });
});

describe('rendezvous errors', () => {
  it('a port in use: rank 0 names the address and asks whether another job uses the port', async () => {
    const port = await freePort();
    const server: Server = createServer();
    await new Promise<void>((done) => server.listen(port, '127.0.0.1', done));
    try {
      const error = (() => {
        try {
          initProcessGroup({ ...explicit, worldSize: 2, masterPort: port, timeoutSeconds: 5 });
        } catch (e) {
          return e;
        }
        return null;
      })();
      expect(error).toBeInstanceOf(ResnetError);
      expect((error as Error).message).toContain(`127.0.0.1:${port}`);
      expect((error as Error).message).toContain(`Is another job using port ${port}?`);
    } finally {
      server.close();
    }
  });

  it('a MASTER_ADDR that is not this machine: rank 0 cannot serve it; another rank times out naming it', async () => {
    // 192.0.2.1 is reserved for documentation (RFC 5737): no machine has it.
    const port = await freePort();
    expect(() => initProcessGroup({ ...explicit, masterAddr: '192.0.2.1', worldSize: 2, masterPort: port })).toThrow(
      /cannot serve the process group's store on 192\.0\.2\.1/,
    );
    const start = performance.now();
    expect(() =>
      initProcessGroup({
        ...explicit,
        rank: 1,
        masterAddr: '192.0.2.1',
        worldSize: 2,
        masterPort: port,
        timeoutSeconds: 2,
      }),
    ).toThrow(/192\.0\.2\.1/);
    expect(performance.now() - start).toBeLessThan(12_000);
  });
});
