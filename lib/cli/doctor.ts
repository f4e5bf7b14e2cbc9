/**
 * `resnet-cuda doctor`: what this installation can do and what to fix. It loads the addon, lists
 * every backend with what it was built with, runs a small convolution on each available one, and
 * checks sharp (the image decoder). Exit code 0 when the CPU backend works, 1 otherwise. With
 * `--run DIR` it reads a training run's log instead and says what limits that run (the bottleneck
 * report) and what to change.
 * @packageDocumentation
 */
import { availableParallelism } from 'node:os';
import { addon as rawAddon, type BackendStatus, type CudaLibrarySearch } from '../binding.js';
import { deviceUtilization, listBackends, nativeVersion } from '../device.js';
import { Conv2d } from '../nn/layers.js';
import { Tensor } from '../tensor.js';
import { readRunBottleneck, type RunBottleneck } from '../train/bottleneck-log.js';
import { CliError, packageVersion, type CliIO, type Command, type CommandSpec, type ParsedCommand } from './options.js';

const SPEC: CommandSpec = {
  name: 'doctor',
  summary: 'Check the installation.',
  description:
    'Checks the installation: Node.js, the native addon (and the libjpeg-turbo it decodes JPEGs with), every backend (CPU with oneDNN, CUDA with cuDNN, cuBLAS and NCCL) with the versions it was built with and a test convolution on each available device, and sharp with libvips. ' +
    'For CUDA it lists the places the CUDA libraries are looked for, in order, and which library it loaded from where, with its version. ' +
    'Each problem comes with what to do about it. The exit code is 0 when the CPU backend works, 1 otherwise.\n\n' +
    'With --run DIR, reads the log of the training run in DIR instead and says what limits it (data loading, host overhead, device compute or host-device synchronisations), with the time per step of each and what to change.',
  positionals: [],
  // Nothing here may import sharp before the check: doctor has to run when sharp is broken.
  options: [
    { name: 'json', type: 'boolean', help: 'Print the report as JSON on stdout instead of text.' },
    {
      name: 'run',
      type: 'path',
      valueName: 'DIR',
      help: "A training run's output folder: report what limits that run (from its log.jsonl) instead of checking the installation.",
    },
  ],
  config: false,
};

/** One thing to fix. */
export interface DoctorProblem {
  /** `node`, `addon`, `cpu`, `cuda` or `sharp`. */
  component: string;
  /** `error` stops something from working; `warning` leaves an optional part unavailable (CUDA on a machine without a GPU). */
  severity: 'error' | 'warning';
  message: string;
  fix: string;
}

/** A backend as `listBackends()` reports it, plus the test convolution's outcome. */
export interface DoctorBackend extends BackendStatus {
  /** Whether the test convolution ran and gave finite numbers (absent when the backend is not available). */
  works?: boolean;
  /** Why it did not. */
  error?: string;
  /** CUDA: whether the driver's utilisation reading (NVML) works, and why not when it does not. */
  utilization?: { available: boolean; reason?: string };
}

/** What `doctor --json` prints. */
export interface DoctorReport {
  ok: boolean;
  version: string;
  node: { version: string; platform: string; arch: string; cpus: number };
  addon: { loaded: boolean; nativeVersion?: string; libjpegTurbo?: string; error?: string };
  backends: DoctorBackend[];
  /** Where the CUDA backend's libraries were found (absent when the addon does not load or has no CUDA backend). */
  cudaLibraries?: CudaLibrarySearch;
  sharp: { loaded: boolean; version?: string; libvips?: string; error?: string };
  problems: DoctorProblem[];
}

/** Runs a 3x3 convolution on `device` and checks that its output is finite. */
function testConvolution(device: string): void {
  const conv = new Conv2d({ inChannels: 3, outChannels: 4, kernelSize: 3, padding: 1, seed: 1 });
  conv.to(device);
  const x = Tensor.randn([2, 8, 8, 3], { seed: 2, device });
  try {
    const y = conv.forward(x).toFloat32Array();
    if (y.length !== 2 * 8 * 8 * 4 || !y.every(Number.isFinite)) {
      throw new Error(`the test convolution gave ${y.length} values, not all finite`);
    }
  } finally {
    x.dispose();
    conv.releaseBuffers();
  }
}

/** The first sentence of a reason (the native reasons go on with advice, which `fix` gives here). */
function firstSentence(text: string): string {
  return text.split(/\.\s+(?=[A-Z])/)[0]!.replace(/\.$/, '');
}

function message(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** The one command that installs the CUDA libraries where the backend finds them. */
const INSTALL_CUDA_FIX =
  '`npx resnet-cuda install-cuda` (downloads the pinned cuDNN, cuBLAS and NCCL into the cache, where they are found), or set RESNET_CUDA_LIBRARY_PATH to the folders that hold them.';

/** What to do about a CUDA backend that is not available, from its reason. */
function cudaFix(status: BackendStatus): string {
  const reason = status.reason ?? '';
  if (!status.built) {
    return 'This installation has no CUDA backend (libresnet_cuda_backend.so). To train on NVIDIA GPUs, install a build that includes it: a prebuilt package with the CUDA backend, or a build from source on a machine with a CUDA 13 toolkit, cuDNN 9 and NCCL (CUDA_HOME set to the toolkit).';
  }
  if (reason.includes('libraries it needs are missing')) return INSTALL_CUDA_FIX;
  if (/libcuda\.so|driver/i.test(reason) && !reason.includes('could not be loaded')) {
    return 'Install the NVIDIA driver (R580 or newer for CUDA 13) on a machine with an NVIDIA GPU; in a container, expose the GPU (docker run --gpus all).';
  }
  if (/could not be loaded|libcudnn|libcublas|libnccl/.test(reason)) return INSTALL_CUDA_FIX;
  return 'Check `nvidia-smi`: the driver must see a GPU, and CUDA_VISIBLE_DEVICES must not hide them all.';
}

/** Reads the CUDA device's utilisation through NVML once; a missing reading is a note (training works without it). */
function checkUtilization(backend: DoctorBackend, problems: DoctorProblem[]): void {
  const reading = deviceUtilization('cuda:0');
  backend.utilization = reading.available
    ? { available: true }
    : { available: false, reason: reading.reason ?? 'no reading' };
  if (!reading.available) {
    problems.push({
      component: 'cuda',
      severity: 'warning',
      message: `GPU utilisation cannot be read (the bottleneck report infers the device time instead): ${reading.reason ?? 'no reading'}`,
      fix: 'NVML (libnvidia-ml.so.1) comes with the NVIDIA driver; in a container, expose the driver libraries (--gpus all, NVIDIA_DRIVER_CAPABILITIES including utility).',
    });
  }
}

/**
 * The problem of an addon that does not load, from the loader's error (lib/binding.ts): its first
 * line says that it failed, then comes the system's reason (the error's `cause`), then the loader's
 * hints, which are the fix.
 */
export function addonLoadProblem(error: unknown): DoctorProblem {
  const text = message(error);
  const cause = error instanceof Error && error.cause instanceof Error ? error.cause.message : undefined;
  const body = text.replace(/^[^\n]*failed to load\.?\n?/, '');
  const reason = cause ?? body.split('\n')[0] ?? '';
  const hints = (
    cause !== undefined && body.startsWith(cause) ? body.slice(cause.length) : body.split('\n').slice(1).join('\n')
  )
    .split('\n')
    .map((l) => l.trim())
    .filter(Boolean);
  const oneLine = (t: string) =>
    t
      .split('\n')
      .map((l) => l.trim())
      .filter(Boolean)
      .join(' ');
  return {
    component: 'addon',
    severity: 'error',
    message: `the native addon does not load: ${oneLine(reason).replace(/^resnet-cuda: /, '') || 'unknown reason'}`,
    fix:
      hints.length > 0
        ? hints.join(' ')
        : `Reinstall the package so that its prebuilt binary for ${process.platform}-${process.arch} is used (\`npm install resnet-cuda\`), or build it from source: \`npm rebuild resnet-cuda\`.`,
  };
}

/** Looks for the CUDA libraries (loading them, for their versions); a problem when a required one is missing. */
function checkCudaLibraries(cuda: DoctorBackend, problems: DoctorProblem[]): CudaLibrarySearch | undefined {
  let search: CudaLibrarySearch;
  try {
    search = rawAddon().cudaLibraries();
  } catch (error) {
    problems.push({
      component: 'cuda',
      severity: 'warning',
      message: `the CUDA libraries could not be looked for: ${message(error)}`,
      fix: 'Rebuild or reinstall the package: its addon is older than its JavaScript.',
    });
    return undefined;
  }
  // The backend's own reason already names what is missing (and the same fix); an emulated backend
  // (RESNET_CUDA_BACKEND_LIBRARY) needs none of them.
  const reported = (cuda.reason ?? '').includes('libraries it needs are missing');
  if (!search.complete && !reported && !process.env.RESNET_CUDA_BACKEND_LIBRARY) {
    const missing = search.libraries.filter((l) => l.required && !(l.found && l.loaded));
    problems.push({
      component: 'cuda',
      severity: 'warning',
      message: `CUDA libraries the backend needs are missing: ${missing
        .map(
          (l) =>
            `${l.name} (${l.soname}) ${l.found ? `does not load: ${l.error ?? 'unknown reason'}` : 'was not found'}`,
        )
        .join('; ')}`,
      fix: INSTALL_CUDA_FIX,
    });
  }
  return search;
}

/** Gathers the report; never throws. */
export async function diagnose(): Promise<DoctorReport> {
  const problems: DoctorProblem[] = [];
  const version = packageVersion();
  const node = {
    version: process.version,
    platform: process.platform,
    arch: process.arch,
    cpus: availableParallelism(),
  };
  if (Number(process.versions.node.split('.')[0]) < 20) {
    problems.push({
      component: 'node',
      severity: 'error',
      message: `Node.js ${process.version} is older than the 20 this package needs`,
      fix: 'Install Node.js 20 or newer.',
    });
  }

  const addon: DoctorReport['addon'] = { loaded: false };
  let backends: DoctorBackend[] = [];
  try {
    backends = listBackends().map((b) => ({ ...b }));
    addon.loaded = true;
    addon.nativeVersion = nativeVersion();
    addon.libjpegTurbo = rawAddon().libjpegTurboVersion;
    if (addon.nativeVersion !== version) {
      problems.push({
        component: 'addon',
        severity: 'error',
        message: `the native addon was built from version ${addon.nativeVersion}, the package is ${version}`,
        fix: 'Rebuild it: `npm run build:native` (or reinstall the package).',
      });
    }
  } catch (error) {
    addon.error = message(error);
    problems.push(addonLoadProblem(error));
  }

  for (const backend of backends) {
    if (!backend.available) {
      if (backend.name === 'cuda') {
        problems.push({
          component: 'cuda',
          severity: 'warning',
          message: `CUDA is not available: ${firstSentence(backend.reason ?? 'unknown reason')}`,
          fix: cudaFix(backend),
        });
      } else {
        problems.push({
          component: backend.name,
          severity: 'error',
          message: `the ${backend.name} backend is not available: ${backend.reason ?? 'unknown reason'}`,
          fix: 'Rebuild the addon: `npm run build:native`.',
        });
      }
      continue;
    }
    try {
      testConvolution(backend.name === 'cpu' ? 'cpu' : 'cuda:0');
      backend.works = true;
      if (backend.name === 'cuda') checkUtilization(backend, problems);
    } catch (error) {
      backend.works = false;
      backend.error = message(error);
      problems.push({
        component: backend.name,
        severity: backend.name === 'cpu' ? 'error' : 'warning',
        message: `a test convolution failed on ${backend.name}: ${backend.error}`,
        fix:
          backend.name === 'cpu'
            ? 'oneDNN is linked into the addon: reinstall the package (`npm rebuild resnet-cuda`, else `npm uninstall resnet-cuda && npm install resnet-cuda`); in a source checkout, rebuild with `npm run build:native`.'
            : cudaFix(backend),
      });
    }
  }
  if (addon.loaded && !backends.some((b) => b.name === 'cpu')) {
    problems.push({
      component: 'cpu',
      severity: 'error',
      message: 'the addon reports no CPU backend',
      fix: 'Reinstall the package (`npm rebuild resnet-cuda`); in a source checkout, rebuild the addon: `npm run build:native`.',
    });
  }

  const cuda = backends.find((b) => b.name === 'cuda');
  const cudaLibraries = cuda?.built ? checkCudaLibraries(cuda, problems) : undefined;

  const sharp: DoctorReport['sharp'] = { loaded: false };
  try {
    const module = (await import('sharp')).default;
    const versions = module.versions as { sharp?: string; vips?: string };
    sharp.loaded = true;
    if (versions.sharp !== undefined) sharp.version = versions.sharp;
    if (versions.vips !== undefined) sharp.libvips = versions.vips;
  } catch (error) {
    sharp.error = message(error);
    problems.push({
      component: 'sharp',
      severity: 'error',
      message: `sharp (the image decoder) does not load: ${sharp.error.split('\n')[0]}`,
      fix: 'Reinstall it for this platform: `npm install sharp` (or `npm rebuild sharp`). Training, evaluation and prediction need it: the transforms decode and resize with it.',
    });
  }

  const ok = backends.some((b) => b.name === 'cpu' && b.works === true);
  const report: DoctorReport = { ok, version, node, addon, backends, sharp, problems };
  if (cudaLibraries !== undefined) report.cudaLibraries = cudaLibraries;
  return report;
}

function describeBackend(b: DoctorBackend): string {
  if (!b.built) return 'not built (see below)';
  if (!b.available) return 'built, not available (see below)';
  const p = b.properties ?? {};
  const details =
    b.name === 'cpu'
      ? [
          p.onednn && `oneDNN ${p.onednn}`,
          p.isa,
          p.bf16 === 'native' ? undefined : p.bf16 && `bf16 ${p.bf16}${p.bf16Reason ? ` (${p.bf16Reason})` : ''}`,
          p.int8 === 'no vnni' ? 'int8 without VNNI (exact with 7-bit weights)' : undefined,
          p.threads && `${p.threads} threads`,
        ]
      : [
          b.deviceCount > 1 ? `${b.deviceCount} devices` : undefined,
          p.computeCapability && `sm ${p.computeCapability}`,
          p.memory,
          p.driver && `driver ${p.driver}`,
          p.runtime && `CUDA ${p.runtime}`,
          p.cudnn && `cuDNN ${p.cudnn}`,
          p.cublas && `cuBLAS ${p.cublas}`,
          p.nccl && `NCCL ${p.nccl}`,
        ];
  const state = b.works === true ? 'ok' : b.works === false ? 'FAILED' : 'available';
  const nvml = b.utilization ? `; GPU utilisation ${b.utilization.available ? 'readable (NVML)' : 'not readable'}` : '';
  return `${state}: ${[b.device, ...details].filter(Boolean).join(', ')}${b.works ? '; a test convolution ran' : ''}${nvml}`;
}

/** The CUDA libraries under the `cuda` row: where each came from, then the places searched. */
function writeCudaLibraries(search: CudaLibrarySearch, io: CliIO): void {
  const pad = ' '.repeat(9);
  const width = Math.max(...search.libraries.map((l) => l.name.length)) + 2;
  for (const l of search.libraries) {
    const what = l.loaded
      ? `${l.version ?? 'version unknown'} from ${l.path} (${l.place})`
      : l.found
        ? `FAILED to load ${l.path}: ${l.error ?? 'unknown reason'}`
        : `not found (${l.soname}${l.required ? '' : ', optional'})`;
    io.stdout.write(`${pad}${l.name.padEnd(width)}${what}\n`);
  }
  io.stdout.write(`${pad}searched in order: ${search.places.map((p) => p.label).join('; ')}\n`);
  for (const note of search.notes) io.stdout.write(`${pad}not searched: ${note}\n`);
}

/** Reads the run's bottleneck report; a missing folder, log or record is a CLI error naming `--run`. */
function runBottleneck(dir: string): RunBottleneck {
  try {
    return readRunBottleneck(dir);
  } catch (error) {
    throw new CliError(
      `--run: ${message(error)}`,
      'Give the output folder of a `resnet-cuda train` run that finished at least one epoch.',
    );
  }
}

/** `doctor --run DIR`: each epoch's verdict, then the run's, with what to change. */
function printRunBottleneck(dir: string, json: boolean, io: CliIO): number {
  const report = runBottleneck(dir);
  if (json) {
    io.stdout.write(`${JSON.stringify(report, null, 2)}\n`);
    return 0;
  }
  io.stdout.write(`run ${report.dir}\n`);
  for (const e of report.epochs) io.stdout.write(`  epoch ${e.epoch + 1}: ${e.kind}\n`);
  io.stdout.write(`\n${report.overall.summary}\n`);
  if (report.gpuMonitor !== undefined) io.stdout.write(`GPU utilisation: not available (${report.gpuMonitor})\n`);
  io.stdout.write('\nwhat to change:\n');
  for (const line of report.overall.advice) io.stdout.write(`  - ${line}\n`);
  return 0;
}

async function run(parsed: ParsedCommand, io: CliIO): Promise<number> {
  const runDir = parsed.values.run;
  if (typeof runDir === 'string') return printRunBottleneck(runDir, parsed.values.json === true, io);
  const report = await diagnose();
  if (parsed.values.json === true) {
    io.stdout.write(`${JSON.stringify(report, null, 2)}\n`);
    return report.ok ? 0 : 1;
  }
  const row = (name: string, text: string) => io.stdout.write(`  ${name.padEnd(7)}${text}\n`);
  io.stdout.write(`resnet-cuda ${report.version}\n`);
  row(
    'node',
    `${report.node.version} (${report.node.platform} ${report.node.arch}, ${report.node.cpus} CPU${report.node.cpus === 1 ? '' : 's'})`,
  );
  row(
    'addon',
    report.addon.loaded
      ? `loaded (native version ${report.addon.nativeVersion}; JPEG decoding with libjpeg-turbo ${report.addon.libjpegTurbo})`
      : `FAILED to load (see below)`,
  );
  for (const b of report.backends) {
    row(b.name, describeBackend(b));
    if (b.name === 'cuda' && report.cudaLibraries) writeCudaLibraries(report.cudaLibraries, io);
  }
  row(
    'sharp',
    report.sharp.loaded
      ? `${report.sharp.version ?? '?'} (libvips ${report.sharp.libvips ?? '?'})`
      : `FAILED to load: ${report.sharp.error?.split('\n')[0]}`,
  );
  if (report.problems.length > 0) {
    io.stdout.write('\n');
    for (const p of report.problems) {
      io.stdout.write(
        `${p.severity === 'error' ? 'problem' : 'note'} (${p.component}): ${p.message}\n  fix: ${p.fix}\n`,
      );
    }
  }
  io.stdout.write(
    report.ok
      ? `\nThe CPU backend works${report.backends.some((b) => b.name === 'cuda' && b.works) ? ', and so does CUDA' : ''}: \`resnet-cuda train\` runs the demo.\n`
      : '\nThe CPU backend does not work: fix the problems above.\n',
  );
  return report.ok ? 0 : 1;
}

/** The `doctor` command. */
export const doctorCommand: Command = { spec: SPEC, run };
