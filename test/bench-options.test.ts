// The benchmark scripts' command lines (bench/options.ts): --help prints the options, and a bad
// option or value stops the run at once with one line and exit status 2, before any timing.
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const script = (name: string) => fileURLToPath(new URL(`../dist/bench/${name}.js`, import.meta.url));
const run = (name: string, args: string[]) =>
  spawnSync(process.execPath, [script(name), ...args], { encoding: 'utf8', timeout: 60_000 });

describe('benchmark command lines', () => {
  it.each(['run', 'loader', 'gpu', 'inference', 'int8', 'prune'])(
    '%s.js --help lists its options and exits 0',
    (name) => {
      const r = run(name, ['--help']);
      expect(r.status).toBe(0);
      expect(r.stdout).toMatch(new RegExp(`^Usage: node dist/bench/${name}\\.js `));
      expect(r.stdout.split('\n').filter((line) => /^ {2}--[a-z]/.test(line)).length).toBeGreaterThanOrEqual(4);
      expect(r.stdout).toContain('-h, --help');
    },
  );

  it.each([
    ['run', ['--bogus'], "Unknown option '--bogus'"],
    ['run', ['--batch', 'x'], "--batch expects an integer >= 1, got 'x'"],
    ['run', ['--peer-rounds=-1'], "--peer-rounds expects an integer >= 0, got '-1'"],
    ['run', ['--iterations', '2.5'], "--iterations expects an integer >= 1, got '2.5'"],
    [
      'run',
      ['--only', 'everything'],
      "--only expects one of 'checkpointing', 'profiler', 'training', got 'everything'",
    ],
    ['run', ['--peers', 'jit'], "--peers expects eager and/or compile, got 'jit'"],
    ['loader', ['--repeat', '0'], "--repeat expects an integer >= 1, got '0'"],
    ['loader', ['--workers', '1,two'], "--workers expects an integer >= 0, got 'two'"],
    ['gpu', ['--dtype', 'f64'], "--dtype expects bf16, f16 or f32, got 'f64'"],
    ['gpu', ['--modes', 'eager,jit'], "--modes expects eager and/or graph, got 'jit'"],
    ['inference', ['--batches', '1,x'], "--batches expects an integer >= 1, got 'x'"],
    ['inference', ['--seconds', '0'], "--seconds expects a number >= 0.01, got '0'"],
    ['int8', ['--method', 'mean'], "--method expects one of minmax, percentile, entropy, got 'mean'"],
    ['int8', ['--weight-bits', '6'], "--weight-bits expects 8 or 7, got '6'"],
    ['prune', ['--iterations', '0'], "--iterations expects an integer >= 1, got '0'"],
  ])('%s.js %j is refused with one line', (name, args, message) => {
    const r = run(name, args);
    expect(r.status).toBe(2);
    expect(r.stderr).toBe(`${message}\nRun with --help for the options.\n`);
    expect(r.stdout).toBe('');
  });
});
