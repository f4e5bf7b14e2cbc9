/**
 * The inference artifact a finished `train` run leaves in `artifact/` of its folder: the best
 * model (`model-best.safetensors`, else the final one) with the run's evaluation transform and
 * class names, ready for `predict --model DIR` and `loadInferenceArtifact`.
 * @packageDocumentation
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { saveInferenceArtifact } from '../inference/artifact.js';
import type { ResNet } from '../nn/resnet.js';
import { architectureOf, buildModel, readSafetensors, type RunConfig } from './common.js';

/** The artifact folder's name in a run folder. */
export const RUN_ARTIFACT = 'artifact';

/**
 * Writes the run's artifact into `outDir/artifact`: from `model-best.safetensors` when the run
 * kept a best model, else from `model`.
 */
export async function writeRunArtifact(outDir: string, model: ResNet, config: RunConfig): Promise<void> {
  const bestFile = join(outDir, 'model-best.safetensors');
  let best: ResNet | null = null;
  if (existsSync(bestFile)) {
    const { tensors } = await readSafetensors(bestFile);
    const arch = architectureOf(tensors);
    if (arch) {
      best = buildModel(arch, { device: 'cpu' });
      best.loadStateDict(tensors);
    }
  }
  try {
    await saveInferenceArtifact(best ?? model, join(outDir, RUN_ARTIFACT), {
      classes: config.classes.length === config.numClasses ? config.classes : null,
      preprocessing: {
        resize: config.valResizeSize,
        crop: config.valCropSize,
        interpolation: config.interpolation,
        mean: config.mean,
        std: config.std,
      },
    });
  } finally {
    best?.dispose();
  }
}
