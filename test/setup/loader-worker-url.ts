/**
 * The data loader's worker module when the library runs from its TypeScript sources (vitest):
 * Node cannot start a worker thread from a `.ts` file, so the workers run the package's compiled
 * `dist/lib/data/loader-worker.js` (build it with `npm run build:ts`), with a warning when sources
 * are newer than their compiled files. vitest.config.ts puts this module in place of
 * lib/data/loader-worker-url.ts.
 */
import { existsSync, readdirSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = fileURLToPath(new URL('../..', import.meta.url));
let checked: URL | undefined;

/** Warns (once) when library sources are newer than the compiled files the workers will run. */
function warnIfStale(sources: string, compiled: string): void {
  const stale: string[] = [];
  const walk = (dir: string): void => {
    for (const entry of readdirSync(dir, { withFileTypes: true })) {
      const path = join(dir, entry.name);
      if (entry.isDirectory()) walk(path);
      else if (entry.name.endsWith('.ts') && !entry.name.endsWith('.d.ts')) {
        const js = join(compiled, relative(sources, path)).replace(/\.ts$/, '.js');
        if (!existsSync(js) || statSync(js).mtimeMs < statSync(path).mtimeMs) stale.push(relative(sources, path));
      }
    }
  };
  walk(sources);
  if (stale.length > 0) {
    process.emitWarning(
      `DataLoader workers run the compiled library in dist/, which is older than lib/${stale.slice(0, 5).join(', lib/')}${stale.length > 5 ? ', …' : ''}; run 'npm run build:ts'`,
    );
  }
}

/** The compiled worker module of this checkout. */
export function loaderWorkerUrl(): URL {
  if (checked) return checked;
  const compiled = join(root, 'dist', 'lib', 'data', 'loader-worker.js');
  if (!existsSync(compiled)) {
    throw new Error(
      `DataLoader workers in the tests need the compiled ${relative(root, compiled)} (worker threads cannot load TypeScript sources): run 'npm run build:ts'`,
    );
  }
  warnIfStale(join(root, 'lib'), join(root, 'dist', 'lib'));
  return (checked = pathToFileURL(compiled));
}
