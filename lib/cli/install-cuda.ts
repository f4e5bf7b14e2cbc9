/**
 * `resnet-cuda install-cuda`: fetches the pinned CUDA runtime libraries the CUDA backend loads
 * (cuBLAS, cuDNN, NCCL) from their PyPI wheels into the cache, where the backend finds them.
 * @packageDocumentation
 */
import { DEFAULT_INDEX_URL, installCudaRuntime } from '../cuda-runtime/install.js';
import { defaultCudaCache, runtimePins } from '../cuda-runtime/pins.js';
import { ResnetError } from '../errors.js';
import { CliError, type CliIO, type Command, type CommandSpec, type ParsedCommand } from './options.js';

const SPEC: CommandSpec = {
  name: 'install-cuda',
  summary:
    'Download the pinned CUDA libraries (cuDNN, cuBLAS, NCCL) into the cache, where the CUDA backend finds them.',
  description:
    "Downloads NVIDIA's wheels of cuBLAS, cuDNN and NCCL at the versions the CUDA backend is built against, checks each against the sha256 the index publishes, and unpacks only their shared libraries into <cache>/cuda-runtime-<key>/lib (no compiler, no headers). " +
    'The CUDA backend looks there after an explicit path (RESNET_CUDA_LIBRARY_PATH, LD_LIBRARY_PATH) and the active Python environment, so nothing else needs setting with the default cache. ' +
    'Needed only where neither a Python environment with the nvidia-* wheels (as PyTorch installs) nor a CUDA toolkit with cuDNN and NCCL provides them; `resnet-cuda doctor` says which it found. ' +
    'The NVIDIA driver is not part of it.',
  positionals: [],
  options: [
    {
      name: 'cache-dir',
      type: 'path',
      valueName: 'DIR',
      defaultText: '$RESNET_CUDA_CACHE, else $XDG_CACHE_HOME/resnet-cuda, else ~/.cache/resnet-cuda',
      help: 'The cache folder. Elsewhere than the default, set RESNET_CUDA_CACHE to it (or RESNET_CUDA_LIBRARY_PATH to its lib folder) when running.',
    },
    {
      name: 'index-url',
      type: 'string',
      valueName: 'URL',
      default: DEFAULT_INDEX_URL,
      help: 'The base URL of a PyPI JSON API (<URL>/<project>/<version>/json), for a mirror.',
    },
    {
      name: 'reinstall',
      type: 'boolean',
      help: 'Download what is missing and unpack again even when the libraries are in place.',
    },
  ],
  examples: ['resnet-cuda install-cuda', 'resnet-cuda install-cuda --cache-dir /opt/resnet-cuda-cache'],
  config: false,
};

async function run(parsed: ParsedCommand, io: CliIO): Promise<number> {
  const explicitCache = parsed.values.cacheDir;
  const cacheDir = typeof explicitCache === 'string' ? explicitCache : defaultCudaCache(io.env);
  const indexUrl = String(parsed.values.indexUrl);
  if (!/^https?:\/\/[^\s/]+/.test(indexUrl)) {
    throw new CliError(`--index-url must be an http(s) URL, got '${indexUrl}'`, `The default is ${DEFAULT_INDEX_URL}.`);
  }
  const pins = runtimePins();
  io.stderr.write(`installing ${pins.map((p) => `${p.name}==${p.version}`).join(', ')} into ${cacheDir}\n`);
  let result;
  try {
    result = await installCudaRuntime({
      cacheDir,
      indexUrl,
      pins,
      reinstall: parsed.values.reinstall === true,
      log: (line) => io.stderr.write(`  ${line}\n`),
    });
  } catch (error) {
    if (error instanceof ResnetError && error.code === 'ERR_RC_DOWNLOAD') {
      throw new CliError(
        error.message,
        `Check that ${indexUrl} is reachable (a proxy or a mirror: --index-url), then run it again; what was fetched whole is kept.`,
      );
    }
    throw error;
  }
  io.stderr.write(
    result.present
      ? `the CUDA libraries are in place already (--reinstall unpacks them again)\n`
      : `unpacked ${result.libraries.length} libraries${result.downloaded.length ? ` from ${result.downloaded.length} downloaded wheels` : ''}\n`,
  );
  const isDefault = cacheDir === defaultCudaCache(io.env);
  io.stderr.write(
    isDefault
      ? 'The CUDA backend finds them there; `resnet-cuda doctor` shows what it loads.\n'
      : `This is not the default cache: run with RESNET_CUDA_CACHE=${cacheDir} (or RESNET_CUDA_LIBRARY_PATH=${result.libDir}) so that the CUDA backend finds them.\n`,
  );
  io.stdout.write(`${result.libDir}\n`);
  return 0;
}

/** The `install-cuda` command. */
export const installCudaCommand: Command = { spec: SPEC, run };
