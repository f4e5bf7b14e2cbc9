// The data-parallel pieces of `resnet-cuda train` that need no second process: the world size
// from the launcher's variables, the command line a relaunch repeats, resuming after a restart,
// and rank 0's text shared with the other ranks.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { trainCommand } from '../lib/cli/train.js';
import { parseCommand } from '../lib/cli/options.js';
import {
  commandLine,
  isRestart,
  joinGroup,
  launchedWorldSize,
  restartResume,
  shareRunSettings,
  shareText,
} from '../lib/cli/train-distributed.js';
import { PeerGroup } from './helpers/peer-group.js';

const dir = mkdtempSync(join(tmpdir(), 'resnet-cuda-train-distributed-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('train, data-parallel', () => {
  it('reads the world size the launcher set, and joins no group alone', () => {
    expect(launchedWorldSize({})).toBe(1);
    expect(launchedWorldSize({ WORLD_SIZE: '4' })).toBe(4);
    expect(() => launchedWorldSize({ WORLD_SIZE: 'two' })).toThrow(/WORLD_SIZE must be a positive integer, got 'two'/);
    expect(joinGroup('cpu', { WORLD_SIZE: '1' })).toEqual({ group: null, device: 'cpu' });
    expect(() => joinGroup('cuda:1', { WORLD_SIZE: '2', RANK: '0', LOCAL_RANK: '0' })).toThrow(
      /--device cuda:1: with several processes each rank takes the GPU of its local rank; give --device cuda/,
    );
  });

  it('repeats the options given, without --nproc-per-node, for the relaunched ranks', () => {
    const parsed = parseCommand(
      trainCommand.spec,
      [
        'data/x',
        '--nproc-per-node',
        '2',
        '-b',
        '16',
        '--sync-bn',
        '--lr-milestones',
        '3,6',
        '--lr-scheduler',
        'multisteplr',
        '--lr',
        '0.2',
      ],
      dir,
    );
    if (parsed === 'help') throw new Error('help');
    const line = commandLine(parsed, ['nprocPerNode']);
    expect(line).toEqual(
      expect.arrayContaining([
        '--batch-size=16',
        '--sync-bn',
        '--lr-milestones=3,6',
        '--lr-scheduler=multisteplr',
        '--lr=0.2',
      ]),
    );
    expect(line.at(-1)).toBe(parsed.positionals[0]);
    expect(line.some((a) => a.startsWith('--nproc-per-node'))).toBe(false);
    // The line parses back to the same values.
    const again = parseCommand(trainCommand.spec, line, dir);
    if (again === 'help') throw new Error('help');
    for (const key of parsed.explicit) {
      if (key !== 'nprocPerNode') expect(again.values[key], key).toEqual(parsed.values[key]);
    }
  });

  it('resumes from the latest checkpoint of its output folder after a restart of the group', () => {
    const run = join(dir, 'run');
    expect(isRestart({ RESNET_RESTART_COUNT: '1' })).toBe(true);
    expect(isRestart({})).toBe(false);
    // Restarted before the first checkpoint: a fresh start.
    expect(restartResume({ outputDir: run }, dir, { RESNET_RESTART_COUNT: '1' })).toBeUndefined();
    mkdirSync(join(run, 'checkpoints'), { recursive: true });
    writeFileSync(join(run, 'checkpoints', 'latest.json'), '{}');
    expect(restartResume({ outputDir: run }, dir, { RESNET_RESTART_COUNT: '1' })).toBe(join(run, 'checkpoints'));
    // Not a restart, or a resume given: as given.
    expect(restartResume({ outputDir: run }, dir, {})).toBeUndefined();
    expect(restartResume({ outputDir: run, resume: 'x' }, dir, { RESNET_RESTART_COUNT: '2' })).toBe('x');
  });

  it('gives every rank rank 0’s seed and output folder', () => {
    const group = new PeerGroup({ rank: 0 });
    expect(shareText(group, 'runs/ünïcode')).toBe('runs/ünïcode');
    expect(group.calls).toEqual([`broadcast:0 4097`, 'synchronize']);
    expect(shareRunSettings(null, { seed: 3, outDir: 'a' })).toEqual({ seed: 3, outDir: 'a' });
    expect(shareRunSettings(group, { seed: 3, outDir: 'a' })).toEqual({ seed: 3, outDir: 'a' });
    expect(() => shareText(group, 'x'.repeat(5000))).toThrow(/longer than 4096 bytes/);
  });
});
