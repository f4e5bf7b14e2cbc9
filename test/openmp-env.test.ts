import { describe, expect, it } from 'vitest';
import { DEFAULT_GOMP_SPINCOUNT, applyOpenMpDefaults } from '../lib/openmp-env.js';

describe('applyOpenMpDefaults', () => {
  it('sets a short spin when the environment chooses none', () => {
    const env: NodeJS.ProcessEnv = {};
    applyOpenMpDefaults(env);
    expect(env.GOMP_SPINCOUNT).toBe(DEFAULT_GOMP_SPINCOUNT);
  });

  it("keeps the environment's own choice", () => {
    const spin: NodeJS.ProcessEnv = { GOMP_SPINCOUNT: 'infinite' };
    applyOpenMpDefaults(spin);
    expect(spin.GOMP_SPINCOUNT).toBe('infinite');
    const policy: NodeJS.ProcessEnv = { OMP_WAIT_POLICY: 'active' };
    applyOpenMpDefaults(policy);
    expect(policy).toEqual({ OMP_WAIT_POLICY: 'active' });
  });

  it('is in effect in this process, whose addon is loaded', async () => {
    const { addon } = await import('../lib/binding.js');
    addon();
    if (process.env.OMP_WAIT_POLICY === undefined) expect(process.env.GOMP_SPINCOUNT).toBeDefined();
  });
});
