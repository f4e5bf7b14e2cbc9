/**
 * Misuse of the command line: for each class of bad value (negative, zero, non-integer, huge,
 * not a number, unknown option, missing value), every command that takes such an option answers
 * with exit code 2, nothing on stdout, and one line naming the option (plus one hint line), before
 * any work starts. Runs in this process through `main(argv, io)`.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { runCli, type CliRun } from '../helpers/cli.js';

const dir = mkdtempSync(join(tmpdir(), 'rc-cli-misuse-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function cli(args: string[]): Promise<CliRun> {
  return runCli(args, dir);
}

/** [arguments, the option the message must name, what else the message must say]. */
const CASES: [string[], string, RegExp][] = [
  // negative
  [['train', '--batch-size=-3'], '--batch-size', /expects an integer of at least 1, got -3/],
  [['train', '-b=-3'], '--batch-size', /expects an integer of at least 1, got -3/],
  [['train', '--lr=-0.1'], '--lr', /expects a number above 0, got -0.1/],
  [['train', '--epochs=-1'], '--epochs', /expects an integer of at least 1, got -1/],
  [['eval', '-j=-1'], '--workers', /expects an integer of at least 0, got -1/],
  [['predict', '--topk=-2', 'x.png'], '--topk', /expects an integer of at least 1, got -2/],
  [['bench', '--size=-16'], '--size', /expects an integer of at least 8, got -16/],
  // a value that starts with '-' after a space: the hint says how to pass it, for long and short forms alike
  [['train', '--lr', '-0.1'], '--lr', /needs a value; to pass one that starts with '-', write --lr=VALUE/],
  [['train', '-b', '-3'], '-b', /needs a value; to pass one that starts with '-', write -b=VALUE/],
  // zero
  [['train', '-b', '0'], '--batch-size', /expects an integer of at least 1, got 0/],
  [['train', '--lr', '0'], '--lr', /expects a number above 0, got 0/],
  [['train', '--accumulate', '0'], '--accumulate', /expects an integer of at least 1, got 0/],
  [['eval', '-b', '0'], '--batch-size', /expects an integer of at least 1, got 0/],
  [['predict', '--topk', '0', 'x.png'], '--topk', /expects an integer of at least 1, got 0/],
  [['bench', '--steps', '0'], '--steps', /expects an integer of at least 1, got 0/],
  // non-integer, not a number
  [['train', '-b', '2.5'], '--batch-size', /expects an integer of at least 1, got 2.5/],
  [['train', '--epochs', '1.5'], '--epochs', /expects an integer of at least 1, got 1.5/],
  [['train', '--lr', 'NaN'], '--lr', /expects a number above 0, got 'NaN'/],
  [['train', '--lr', 'Infinity'], '--lr', /expects a number above 0, got 'Infinity'/],
  [['train', '--seed', '0x10'], '--seed', /expects an integer from 0 to 2147483647, got '0x10'/],
  [['eval', '--val-crop-size', '16px'], '--val-crop-size', /expects an integer from 8 to \d+, got '16px'/],
  // huge
  [['train', '--train-crop-size', '100000'], '--train-crop-size', /expects an integer from 8 to 4096, got 100000/],
  [['train', '--val-resize-size', '100000'], '--val-resize-size', /expects an integer from 8 to 4096, got 100000/],
  [['train', '--epochs', '1e20'], '--epochs', /expects an integer from 1 to \d+, got 100000000000000000000/],
  [['train', '--lr', '1e400'], '--lr', /expects a number above 0, got '1e400'/],
  [['train', '--seed', '2147483648'], '--seed', /expects an integer from 0 to 2147483647, got 2147483648/],
  [['eval', '--val-resize-size', '99999'], '--val-resize-size', /expects an integer from 8 to 4096, got 99999/],
  [['predict', '--crop', '99999', 'x.png'], '--crop', /expects an integer from 8 to 4096, got 99999/],
  [['train', '--print-freq', '9007199254740993'], '--print-freq', /expects an integer from 1 to \d+, got/],
  // unknown option
  [['train', '--batchsize', '8'], '--batchsize', /unknown option '--batchsize' \(did you mean '--batch-size'\?\)/],
  [['train', '-Z'], '-Z', /unknown option '-Z'/],
  [['eval', '--weight', 'x'], '--weight', /unknown option '--weight' \(did you mean '--weights'\?\)/],
  [['predict', '--top-k', '3', 'x.png'], '--top-k', /unknown option '--top-k' \(did you mean '--topk'\?\)/],
  // missing value
  [['train', '--lr'], '--lr', /needs a value$/],
  [['train', '-b'], '-b', /needs a value$/],
  [['eval', '--checkpoint'], '--checkpoint', /needs a value$/],
  [['predict', '--weights'], '--weights', /needs a value$/],
  // a value given to a flag
  [['train', '--quiet=yes'], '--quiet', /takes no value$/],
  [['train', '-q=yes'], '--quiet', /takes no value$/],
];

describe('command-line misuse: exit code 2 and one line naming the option', () => {
  for (const [args, option, message] of CASES) {
    it(
      args.join(' '),
      async () => {
        const run = await cli(args);
        expect(run.code, run.stderr).toBe(2);
        expect(run.stdout).toBe('');
        const lines = run.stderr.trimEnd().split('\n');
        expect(lines, run.stderr).toHaveLength(2);
        expect(lines[0]).toMatch(new RegExp(`^resnet-cuda ${args[0]}: `));
        expect(lines[0]).toContain(option);
        expect(lines[0]).toMatch(message);
        // A case accepted by mistake starts a run: fail it instead of waiting for the run.
      },
      20_000,
    );
  }

  it('follows its own hint: -b=VALUE and --batch-size=VALUE pass the value on', async () => {
    for (const args of [
      ['train', '-b=-3'],
      ['train', '--batch-size=-3'],
    ]) {
      const run = await cli(args);
      expect(run.stderr.split('\n')[0]).toBe(
        'resnet-cuda train: --batch-size expects an integer of at least 1, got -3',
      );
    }
  });
});
