// The CPU's measured multiply-add peak (native/cpu/fma_peak.cc), which `npm run bench` divides the
// training step's GFLOP/s by.
import { describe, expect, it } from 'vitest';
import { addon } from '../lib/binding.js';
import { listBackends } from '../lib/index.js';

describe('cpuFmaPeak', () => {
  it('measures a positive rate on every OpenMP thread for about the time asked', () => {
    const start = performance.now();
    const peak = addon().cpuFmaPeak({ milliseconds: 50 });
    const elapsed = performance.now() - start;
    expect(Number.isFinite(peak.gflops)).toBe(true);
    expect(peak.gflops).toBeGreaterThan(0);
    expect(['avx512', 'avx2', 'sse']).toContain(peak.isa);
    const cpu = listBackends().find((b) => b.name === 'cpu');
    expect(String(peak.threads)).toBe(cpu?.properties?.threads);
    expect(elapsed).toBeGreaterThanOrEqual(50);
  });

  it.each([
    [{ milliseconds: 0 }, 'fma peak: milliseconds must be between 1 and 60000, got 0'],
    [{ milliseconds: Number.NaN }, 'fma peak: milliseconds must be between 1 and 60000, got nan'],
    [{ milliseconds: 1e6 }, 'fma peak: milliseconds must be between 1 and 60000, got 1e+06'],
    [{}, "option 'milliseconds' is required"],
  ])('refuses %j', (args, message) => {
    expect(() => addon().cpuFmaPeak(args as { milliseconds: number })).toThrow(message);
  });
});
