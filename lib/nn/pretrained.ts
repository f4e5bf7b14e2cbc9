/**
 * Pretrained weights for a ResNet: read from a PyTorch checkpoint (`.pth`/`.pt`, see
 * `torch-checkpoint.ts`) or a safetensors file, told apart by their content, and loaded as
 * torchvision's fine-tuning recipe does: everything strictly, except a classifier (`fc`) whose
 * number of classes differs from the model's, which is left as the model initialised it.
 * @packageDocumentation
 */
import { closeSync, openSync, readFileSync, readSync } from 'node:fs';
import { ResnetError, invalid } from '../errors.js';
import { decodeSafetensors } from '../train/checkpoint.js';
import type { Module, StateDict } from './module.js';
import { loadTorchCheckpoint } from './torch-checkpoint.js';
import { looksLikeZip } from './zip.js';

/** The two kinds of weights file read here. */
export type WeightsFormat = 'torch' | 'safetensors';

/**
 * The format of a weights file from its first bytes: `torch` for `torch.save`'s zip archive or
 * legacy pickle, `safetensors` for anything else (its decoder then says what is wrong).
 */
export function weightsFormat(bytes: Uint8Array): WeightsFormat {
  if (looksLikeZip(bytes)) return 'torch';
  // The legacy torch.save format starts with a protocol-2 pickle of a 10-byte integer.
  if (bytes[0] === 0x80 && bytes[1] === 0x02 && bytes[2] === 0x8a) return 'torch';
  return 'safetensors';
}

/** Whether the file at `path` is a `torch.save` file, from its first bytes (false when it cannot be read). */
export function isTorchFile(path: string): boolean {
  const head = new Uint8Array(4);
  try {
    const fd = openSync(path, 'r');
    try {
      readSync(fd, head, 0, 4, 0);
    } finally {
      closeSync(fd);
    }
  } catch {
    return false;
  }
  return weightsFormat(head) === 'torch';
}

/**
 * The state dict of a weights file, whichever the format: a `torch.save` file (a state dict, or a
 * training checkpoint holding one under `model` / `state_dict` / `model_state_dict`; see
 * {@link loadTorchCheckpoint}) or a safetensors file. Floating tensors come as f32.
 * @throws ResnetError `ERR_RC_CHECKPOINT` naming the file when it cannot be read.
 */
export function readWeightsFile(path: string): StateDict {
  if (typeof path !== 'string' || path.length === 0) invalid('path', 'the path of a weights file', path);
  let bytes: Uint8Array;
  try {
    bytes = readFileSync(path);
  } catch (error) {
    throw new ResnetError('ERR_RC_CHECKPOINT', `${path}: cannot be read (${(error as Error).message})`);
  }
  return weightsFormat(bytes) === 'torch'
    ? loadTorchCheckpoint(bytes, { name: path })
    : decodeSafetensors(bytes, path).tensors;
}

/** The number of classes of a state dict's classifier (`fc.weight`'s rows), or undefined without one. */
export function classifierClasses(state: StateDict): number | undefined {
  const fc = state.get('fc.weight');
  return fc?.shape.length === 2 ? fc.shape[0] : undefined;
}

/**
 * Loads pretrained weights into a ResNet-like model whose classifier is `fc`. When the file's
 * classifier has as many classes as the model's, every tensor is loaded strictly; otherwise the
 * classifier is replaced (the model's own `fc` is kept as initialised) and everything else is
 * loaded strictly: no tensor may be missing, unexpected or of another shape. This is torchvision's
 * recipe `model.fc = nn.Linear(model.fc.in_features, num_classes)` after loading the weights.
 *
 * @param source - names the weights in errors.
 * @returns whether the classifier was replaced.
 * @throws ResnetError `ERR_RC_STATE_DICT` naming `source` when the weights do not fit the model.
 */
export function loadPretrained(model: Module, state: StateDict, source: string): { replacedHead: boolean } {
  if (!(state instanceof Map)) invalid('state', 'a state dict (a Map of name -> tensor)', state);
  const own = model.stateDict();
  const ownClasses = classifierClasses(own);
  const fileClasses = classifierClasses(state);
  const replacedHead = ownClasses !== undefined && fileClasses !== undefined && ownClasses !== fileClasses;
  try {
    if (!replacedHead) {
      model.loadStateDict(state);
      return { replacedHead };
    }
    const isHead = (name: string) => name.startsWith('fc.');
    const body: StateDict = new Map([...state].filter(([name]) => !isHead(name)));
    const missing = [...own.keys()].filter((name) => !isHead(name) && !body.has(name));
    const unexpected = [...body.keys()].filter((name) => !own.has(name));
    const problems = [
      ...missing.slice(0, 5).map((k) => `missing key '${k}'`),
      ...unexpected.slice(0, 5).map((k) => `unexpected key '${k}'`),
    ];
    if (problems.length > 0) {
      const more = missing.length + unexpected.length - problems.length;
      throw new ResnetError(
        'ERR_RC_STATE_DICT',
        `${problems.join('; ')}${more > 0 ? `; and ${more} more` : ''} (the classifier aside)`,
      );
    }
    // Shapes are checked here; the keys were checked above.
    model.loadStateDict(body, { strict: false });
    return { replacedHead };
  } catch (error) {
    if (error instanceof ResnetError && error.code === 'ERR_RC_STATE_DICT') {
      throw new ResnetError(
        'ERR_RC_STATE_DICT',
        `The weights of ${source} do not fit this ${model.constructor.name}: ${error.message.replace(/^Cannot load the state dict into \w+: /, '')}`,
      );
    }
    throw error;
  }
}
