/**
 * `train --teacher`: a short distillation from a teacher run folder, from a checkpoint file, and
 * the options it refuses (exit code 2, one line naming the option).
 */
import { mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli } from './helpers/cli.js';

const dir = mkdtempSync(join(tmpdir(), 'rc-kd-cli-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A two-step run on the built-in dataset at 16 px, quiet, without TensorBoard or charts. */
const SHORT = ['--max-steps', '2', '-b', '4', '--train-crop-size', '16', '-j', '0', '--no-tensorboard', '--no-plots'];

const teacherDir = join(dir, 'teacher');

beforeAll(async () => {
  const run = await runCli(['train', ...SHORT, '--seed', '1', '--output-dir', teacherDir, '--quiet'], dir);
  expect(run.code, run.stderr).toBe(0);
}, 600_000);

describe('train --teacher', () => {
  it('distils a teacher run folder into the student, and records the options', async () => {
    const out = join(dir, 'student');
    const run = await runCli(
      [
        'train',
        ...SHORT,
        '--seed',
        '2',
        '--output-dir',
        out,
        '--teacher',
        teacherDir,
        '--teacher-model',
        'resnet18',
        '--kd-temperature',
        '3',
        '--kd-alpha',
        '0.7',
      ],
      dir,
    );
    expect(run.code, run.stderr).toBe(0);
    expect(run.stderr).toMatch(
      /distilling a resnet18 teacher from weights teacher\/model\.safetensors.*: temperature 3, alpha 0\.7\n/,
    );
    expect(run.stdout).toMatch(/^stopped after 0 epochs \(2 steps\)/);
    const config = JSON.parse(readFileSync(join(out, 'config.json'), 'utf8')) as Record<string, unknown>;
    expect(config).toMatchObject({ teacher: teacherDir, teacherModel: 'resnet18', kdTemperature: 3, kdAlpha: 0.7 });
  });

  it('takes a training checkpoint as the teacher', async () => {
    const checkpoint = join(teacherDir, 'checkpoints', 'step-00000002.safetensors');
    expect(readdirSync(join(teacherDir, 'checkpoints'))).toContain('step-00000002.safetensors');
    const run = await runCli(
      ['train', ...SHORT, '--seed', '3', '--output-dir', join(dir, 'from-checkpoint'), '--teacher', checkpoint],
      dir,
    );
    expect(run.code, run.stderr).toBe(0);
    expect(run.stderr).toMatch(
      /distilling a resnet18 teacher from checkpoint teacher\/checkpoints\/step-00000002\.safetensors \(epoch 0, step 2\): temperature 4, alpha 0\.5\n/,
    );
  });

  it('refuses a teacher of other classes or another network, and distillation options out of range or without a teacher', async () => {
    const threeClasses = join(dir, 'teacher-3');
    const made = await runCli(
      ['train', ...SHORT, '--num-classes', '3', '--output-dir', threeClasses, '--quiet', '--seed', '1'],
      dir,
    );
    expect(made.code, made.stderr).toBe(0);
    const cases: [string[], RegExp][] = [
      [['--teacher', threeClasses], /--teacher has 3 classes but this run's data has 4/],
      [
        ['--teacher', teacherDir, '--teacher-model', 'resnet50'],
        /--teacher-model resnet50 does not match --teacher, which holds a resnet18/,
      ],
      [['--teacher', teacherDir, '--kd-temperature', '0'], /--kd-temperature/],
      [['--teacher', teacherDir, '--kd-temperature', '-1'], /--kd-temperature/],
      [['--teacher', teacherDir, '--kd-alpha', '1.5'], /--kd-alpha/],
      [['--kd-alpha', '0.3'], /--kd-alpha needs --teacher PATH/],
      [['--teacher', join(dir, 'missing')], /--teacher '.*missing' does not exist/],
    ];
    for (const [args, message] of cases) {
      const run = await runCli(['train', ...SHORT, '--output-dir', join(dir, 'refused'), ...args], dir);
      expect(run.code, `${args.join(' ')}: ${run.stderr}`).toBe(2);
      expect(run.stderr).toMatch(message);
    }
  });
});
