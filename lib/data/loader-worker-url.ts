/**
 * Where the data loader's worker threads start.
 * @packageDocumentation
 */

/** The compiled worker module, `loader-worker.js`, beside this one. */
export function loaderWorkerUrl(): URL {
  return new URL('./loader-worker.js', import.meta.url);
}
