/**
 * What `import ... from 'resnet-cuda'` means in the README's examples when test/readme.test.ts runs
 * them: the package, unchanged, except for these scale-downs that let every example run in seconds
 * on a machine without a GPU. Each is the only change; nothing in the examples' text is edited
 * but the module name.
 *
 * - `Module.to('cuda:…')` stays on the CPU when no CUDA device is usable (the examples target GPUs).
 * - `Trainer.fit` trains at most {@link README_EPOCHS} epoch(s) of the `epochs` asked for.
 */
import { Module } from '../../lib/nn/module.js';
import {
  Trainer as PackageTrainer,
  cudaAvailable,
  type DataLoader,
  type FitOptions,
  type FitResult,
} from '../../lib/index.js';

export * from '../../lib/index.js';

/** The epochs `Trainer.fit` trains at most in the README test. */
export const README_EPOCHS = 1;

// The original method, called below with `to.call(this, ...)`, which the rule cannot see.
// eslint-disable-next-line @typescript-eslint/unbound-method
const to = Module.prototype.to;
if (!cudaAvailable()) {
  Module.prototype.to = function (this: Module, device: string) {
    return to.call(this, typeof device === 'string' && device.startsWith('cuda') ? 'cpu' : device);
  };
}

/** The package's Trainer, with `fit` capped at {@link README_EPOCHS} epochs. */
export class Trainer extends PackageTrainer {
  override fit(train: DataLoader, options: FitOptions): Promise<FitResult> {
    return super.fit(train, { ...options, epochs: Math.min(options.epochs, README_EPOCHS) });
  }
}
