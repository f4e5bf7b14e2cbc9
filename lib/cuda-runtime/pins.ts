/**
 * The pinned NVIDIA wheels of the CUDA backend (native/cuda/pins.txt, the one list that
 * scripts/setup-cuda-sdk reads too), and where their runtime libraries go in the cache.
 * @packageDocumentation
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { packageRoot } from '../binding.js';
import { ResnetError } from '../errors.js';

/** One pinned wheel. */
export interface WheelPin {
  /** The PyPI project (`nvidia-cudnn-cu13`). */
  name: string;
  /** The exact version (`9.13.1.26`). */
  version: string;
  /** `sdk`: needed to build only; `runtime`: loaded at run time too, so `install-cuda` fetches it. */
  role: 'sdk' | 'runtime';
}

/** The CUDA major version the backend is built for. */
export const CUDA_MAJOR = 13;

/**
 * The layout of a `cuda-runtime-<key>` folder (RUNTIME_LAYOUT in scripts/setup-cuda-sdk): bumped
 * when it changes, so that an old folder is not taken for a new one.
 */
export const RUNTIME_LAYOUT = 1;

/** The file a complete `cuda-runtime-<key>` folder holds (written last). */
export const RUNTIME_MARKER = 'resnet-cuda-runtime.txt';

/** Parses the pin list's text: `name==version role` a line, `#` comments. */
export function parsePins(text: string, source: string): WheelPin[] {
  const pins: WheelPin[] = [];
  for (const [i, raw] of text.split('\n').entries()) {
    const line = raw.replace(/#.*/, '').trim();
    if (line === '') continue;
    const match = /^([A-Za-z0-9._-]+)==([A-Za-z0-9.+-]+)\s+(sdk|runtime)$/.exec(line);
    if (!match) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `${source}:${i + 1}: expected 'name==version sdk|runtime', got '${line}'`,
      );
    }
    pins.push({ name: match[1]!, version: match[2]!, role: match[3] as WheelPin['role'] });
  }
  return pins;
}

/** The pins of the installed package. */
export function readPins(): WheelPin[] {
  const file = join(packageRoot(), 'native', 'cuda', 'pins.txt');
  return parsePins(readFileSync(file, 'utf8'), file);
}

/** The pins of the libraries loaded at run time. */
export function runtimePins(pins: readonly WheelPin[] = readPins()): WheelPin[] {
  return pins.filter((p) => p.role === 'runtime');
}

/** `13.0-<12 hex digits>` from the runtime pins and the layout (the same as scripts/setup-cuda-sdk's). */
export function runtimeKey(pins: readonly WheelPin[]): string {
  const text = `layout ${RUNTIME_LAYOUT}\n${pins.map((p) => `${p.name}==${p.version}\n`).join('')}`;
  return `${CUDA_MAJOR}.0-${createHash('sha256').update(text).digest('hex').slice(0, 12)}`;
}

/**
 * The cache folder of the CUDA libraries: $RESNET_CUDA_CACHE, else $XDG_CACHE_HOME/resnet-cuda,
 * else ~/.cache/resnet-cuda (where the CUDA backend looks for them).
 */
export function defaultCudaCache(env: Readonly<Record<string, string | undefined>> = process.env): string {
  if (env.RESNET_CUDA_CACHE) return env.RESNET_CUDA_CACHE;
  if (env.XDG_CACHE_HOME) return join(env.XDG_CACHE_HOME, 'resnet-cuda');
  const home = env.HOME !== undefined && env.HOME !== '' ? env.HOME : homedir();
  return join(home, '.cache', 'resnet-cuda');
}
