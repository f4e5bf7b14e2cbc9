/**
 * The OpenMP settings the CPU backend starts with. They are read once, when the native addon (and
 * with it GNU libgomp) is loaded, so they are applied to the environment just before that.
 *
 * libgomp lets a thread that waits at a barrier spin 300,000 times before it sleeps when neither
 * `GOMP_SPINCOUNT` nor `OMP_WAIT_POLICY` is set (https://gcc.gnu.org/onlinedocs/libgomp/GOMP_005fSPINCOUNT.html).
 * With a `pause` in each spin that is milliseconds on recent Xeons, and when the cores are shared
 * with other processes a spinning thread holds a core that the thread it waits for needs: a
 * batch-1 ResNet-50 inference, a few hundred short parallel regions, measured 4.7x slower on a
 * shared 2-core machine than with 10,000 spins (bench/RESULTS.md). 10,000 spins (well under a
 * millisecond) still cover the gaps between the parallel regions of one call.
 * @packageDocumentation
 */

/** The spin count set when the environment chooses none. */
export const DEFAULT_GOMP_SPINCOUNT = '10000';

/** Sets `GOMP_SPINCOUNT` in `env` unless it, or `OMP_WAIT_POLICY`, is already set. */
export function applyOpenMpDefaults(env: NodeJS.ProcessEnv = process.env): void {
  if (env.GOMP_SPINCOUNT === undefined && env.OMP_WAIT_POLICY === undefined) {
    env.GOMP_SPINCOUNT = DEFAULT_GOMP_SPINCOUNT;
  }
}
