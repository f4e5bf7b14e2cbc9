/**
 * Transforms rebuilt from their specs (in the data loader's worker threads).
 * @packageDocumentation
 */
import { invalid } from '../../errors.js';
import type { TransformSpec } from '../types.js';
import { CenterCrop, type CenterCropOptions } from './center-crop.js';
import { Grayscale, ToRGB } from './channels.js';
import { ColorJitter } from './color-jitter.js';
import { RandomHorizontalFlip } from './flip.js';
import { Normalize, type NormalizeOptions } from './normalize.js';
import { RandomResizedCrop, type RandomResizedCropOptions } from './random-resized-crop.js';
import { Resize, type ResizeOptions } from './resize.js';
import { RandomRotation, type RandomRotationOptions } from './rotation.js';
import { Transform } from './transform.js';

type TransformFactory = (options: Record<string, unknown>) => Transform;

const FACTORIES: Record<string, TransformFactory> = {
  RandomResizedCrop: (o) => new RandomResizedCrop(o as unknown as RandomResizedCropOptions),
  RandomHorizontalFlip: (o) => new RandomHorizontalFlip(o),
  ColorJitter: (o) => new ColorJitter(o),
  RandomRotation: (o) => new RandomRotation(o as unknown as RandomRotationOptions),
  Resize: (o) => new Resize(o as unknown as ResizeOptions),
  CenterCrop: (o) => new CenterCrop(o as unknown as CenterCropOptions),
  Normalize: (o) => new Normalize(o as unknown as NormalizeOptions),
  ToRGB: (o) => new ToRGB(o as Record<string, never>),
  Grayscale: (o) => new Grayscale(o),
};

/** The transform kinds {@link transformFromSpec} knows. */
export const TRANSFORM_KINDS: readonly string[] = Object.keys(FACTORIES);

/** Rebuilds a transform from its {@link Transform.spec}. */
export function transformFromSpec(spec: TransformSpec): Transform {
  if (spec === null || typeof spec !== 'object' || Array.isArray(spec)) {
    invalid('transform spec', 'an object { kind, ...options }', spec);
  }
  const { kind, ...options } = spec;
  const factory = typeof kind === 'string' && Object.hasOwn(FACTORIES, kind) ? FACTORIES[kind] : undefined;
  if (factory === undefined) {
    invalid('transform spec kind', `one of ${TRANSFORM_KINDS.map((k) => `'${k}'`).join(', ')}`, kind);
  }
  return factory(options);
}
