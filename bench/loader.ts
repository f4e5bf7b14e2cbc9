/**
 * `node dist/bench/loader.js`: DataLoader throughput on ImageNet-like JPEGs.
 *
 * Writes (once, cached in the OS temp folder) a few hundred JPEGs of about 500x375 pixels
 * (random shapes on a noisy background, quality 90, about ImageNet's average file size) as an
 * ImageFolder, then measures images/second of two pipelines:
 * - train: decode + RandomResizedCrop(224) + RandomHorizontalFlip (flip deferred, as in training),
 * - eval: decode + Resize(256) + CenterCrop(224),
 * with the batches filled in the main thread, by 1 worker, 2 workers and one per core. Each run
 * skips the batches that were in flight while the workers started (the warm-up) and times the
 * following ones; the consumer only touches each batch. Besides images/s it reports the process's
 * CPU time per image, which is the fair per-core figure when cores are shared, and how much faster
 * all cores spin than one (on shared or throttled machines, less than the core count).
 *
 * The reference is torchvision's DataLoader with PIL and `num_workers=1` on the same folder and
 * pipelines, run in a subprocess with the Python interpreter of `--python` (or the `PYTHON`
 * environment variable, or `python3`) when it imports torchvision; otherwise it is reported as
 * unavailable (no published per-core figure is quoted). Its CPU time per image counts the main
 * process and the worker process over the same timed batches, so the two per-core rates compare.
 *
 * On a real GPU two more sets of rows follow: `GpuJpegDecoder` alone (bench/gpu-decode.ts)
 * and the DataLoader with `decode: 'gpu'` (workers reading the files, batches decoded on the
 * device and handed over with `toTensors()`, timed to the end of the device's work).
 *
 * On a shared machine single runs vary by 10% or more: `--repeat N` runs everything N times,
 * alternating with the reference, and reports the median of each figure.
 *
 * Options: `--help` prints them (USAGE below).
 * Prints a table and one `RESULT {json}` line.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { availableParallelism, cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { Worker } from 'node:worker_threads';
import sharp from 'sharp';
import { addon } from '../lib/binding.js';
import { Random } from '../lib/random.js';
import { ImageFolder } from '../lib/data/image-folder.js';
import { DataLoader } from '../lib/data/loader.js';
import { permutation, type Sampler } from '../lib/data/sampler.js';
import { CenterCrop, Compose, RandomHorizontalFlip, RandomResizedCrop, Resize } from '../lib/data/transforms.js';
import { synchronize } from '../lib/device.js';
import { gpuDecodeUnavailable, measureGpuDecode } from './gpu-decode.js';
import { integerOption, parseOptions } from './options.js';

const cores = availableParallelism();

// JPEGs are decoded on the loader's own threads, but the main thread's file reads (workers: 0) and
// sharp (which writes the test images) use libuv's threadpool, which all threads of a process share
// (4 threads unless UV_THREADPOOL_SIZE says otherwise, read when the pool first starts). With more
// cores than that, rerun this script with a pool of one thread per core.
if (process.env.UV_THREADPOOL_SIZE === undefined && cores > 4) {
  const child = spawnSync(
    process.execPath,
    [...process.execArgv, fileURLToPath(import.meta.url), ...process.argv.slice(2)],
    {
      stdio: 'inherit',
      env: { ...process.env, UV_THREADPOOL_SIZE: String(cores + 1) },
    },
  );
  process.exit(child.status ?? 1);
}

const USAGE = `Usage: node dist/bench/loader.js [OPTIONS]

  --images N         JPEGs written for the test folder [200]
  --count N          images timed per run [400]
  --batch N          batch size [32]
  --prefetch N       batches in flight per worker [2]
  --workers LIST     worker counts to run, 'all' meaning one per core [0,1,2,all]
  --repeat N         runs of everything, alternated with the reference; medians reported [1]
  --python PATH      the Python whose torchvision is the reference [$PYTHON, else python3]
  -h, --help         print this help
`;

const values = parseOptions(
  () =>
    parseArgs({
      options: {
        images: { type: 'string', default: '200' },
        count: { type: 'string', default: '400' },
        batch: { type: 'string', default: '32' },
        prefetch: { type: 'string', default: '2' },
        workers: { type: 'string', default: '0,1,2,all' },
        repeat: { type: 'string', default: '1' },
        python: { type: 'string', default: process.env.PYTHON ?? 'python3' },
        help: { type: 'boolean', short: 'h' },
      },
    }),
  USAGE,
);
const imageCount = integerOption('images', values.images, 1);
const timedImages = integerOption('count', values.count, 1);
const batchSize = integerOption('batch', values.batch, 1);
const prefetch = integerOption('prefetch', values.prefetch, 1);
const workerCounts = [
  ...new Set(values.workers.split(',').map((w) => (w === 'all' ? cores : integerOption('workers', w, 0)))),
].sort((a, b) => a - b);
const repeats = integerOption('repeat', values.repeat, 1);
const python = values.python;

const CLASSES = 4;
const VERSION = 2;
/**
 * Fine noise amplitude, chosen so that the files average about 100 KiB at quality 90, near
 * ImageNet's training set (138 GB over 1.28 M files, about 108 KB each): entropy-decoding time
 * grows with the file size.
 */
const NOISE = 128;

/** One image: a two-colour gradient, smooth blotches, fine noise and a few shapes, like a photo's statistics more than pure noise. */
function drawImage(rng: Random, height: number, width: number): Uint8Array {
  const out = new Uint8Array(height * width * 3);
  const a = [rng.uniform(0, 255), rng.uniform(0, 255), rng.uniform(0, 255)];
  const b = [rng.uniform(0, 255), rng.uniform(0, 255), rng.uniform(0, 255)];
  // Coarse random field on an 8-pixel grid, bilinearly interpolated: texture JPEG cannot drop.
  const cell = 8;
  const gw = Math.ceil(width / cell) + 1;
  const gh = Math.ceil(height / cell) + 1;
  const grid = Float32Array.from({ length: gw * gh * 3 }, () => rng.uniform(-45, 45));
  for (let y = 0; y < height; y++) {
    const gy = y / cell;
    const y0 = Math.floor(gy);
    const fy = gy - y0;
    for (let x = 0; x < width; x++) {
      const gx = x / cell;
      const x0 = Math.floor(gx);
      const fx = gx - x0;
      const t = (x + y) / (width + height);
      const p = (y * width + x) * 3;
      for (let c = 0; c < 3; c++) {
        const g = (i: number, j: number) => grid[(j * gw + i) * 3 + c]!;
        const coarse =
          (1 - fy) * ((1 - fx) * g(x0, y0) + fx * g(x0 + 1, y0)) +
          fy * ((1 - fx) * g(x0, y0 + 1) + fx * g(x0 + 1, y0 + 1));
        const v = a[c]! * (1 - t) + b[c]! * t + coarse + (rng.next() - 0.5) * NOISE;
        out[p + c] = v < 0 ? 0 : v > 255 ? 255 : v;
      }
    }
  }
  const shapes = 3 + rng.int(5);
  for (let s = 0; s < shapes; s++) {
    const colour = [rng.uniform(0, 255), rng.uniform(0, 255), rng.uniform(0, 255)];
    const r = rng.uniform(0.05, 0.3) * Math.min(height, width);
    const cx = rng.uniform(0, width);
    const cy = rng.uniform(0, height);
    const round = rng.next() < 0.5;
    const y0 = Math.max(0, Math.floor(cy - r));
    const y1 = Math.min(height, Math.ceil(cy + r));
    const x0 = Math.max(0, Math.floor(cx - r));
    const x1 = Math.min(width, Math.ceil(cx + r));
    for (let y = y0; y < y1; y++) {
      for (let x = x0; x < x1; x++) {
        if (round && (x - cx) ** 2 + (y - cy) ** 2 > r * r) continue;
        const p = (y * width + x) * 3;
        for (let c = 0; c < 3; c++) out[p + c] = Math.min(255, Math.max(0, colour[c]! + (rng.next() - 0.5) * 30));
      }
    }
  }
  return out;
}

/** The cached ImageFolder of benchmark JPEGs, written on first use. */
async function benchFolder(): Promise<{ root: string; meanBytes: number }> {
  const root = join(tmpdir(), `resnet-cuda-loader-bench-v${VERSION}-${imageCount}`);
  const marker = join(root, '.complete');
  if (!existsSync(marker)) {
    rmSync(root, { recursive: true, force: true });
    process.stdout.write(`writing ${imageCount} JPEGs to ${root} … `);
    const started = performance.now();
    const rng = new Random(1234);
    for (let i = 0; i < imageCount; i++) {
      const dir = join(root, `class${i % CLASSES}`);
      mkdirSync(dir, { recursive: true });
      // Mostly 500x375 landscape, some portrait and some 500x333, as ImageNet's common sizes.
      const kind = rng.next();
      const [width, height] = kind < 0.7 ? [500, 375] : kind < 0.85 ? [375, 500] : [500, 333];
      const pixels = drawImage(rng, height, width);
      await sharp(pixels, { raw: { width, height, channels: 3 } })
        .jpeg({ quality: 90 })
        .toFile(join(dir, `${String(i).padStart(5, '0')}.jpg`));
    }
    writeFileSync(marker, JSON.stringify({ images: imageCount, version: VERSION }));
    console.log(`${((performance.now() - started) / 1000).toFixed(1)} s`);
  }
  let bytes = 0;
  let files = 0;
  for (const c of readdirSync(root)) {
    if (!c.startsWith('class')) continue;
    for (const f of readdirSync(join(root, c))) {
      bytes += statSync(join(root, c, f)).size;
      files++;
    }
  }
  return { root, meanBytes: bytes / files };
}

/** `length` indices cycling through shuffled passes over `n` samples, so one epoch is long enough to time. */
function cyclingSampler(n: number, length: number): Sampler {
  return {
    length,
    *[Symbol.iterator]() {
      for (let i = 0, pass = 0; i < length; pass++) {
        for (const index of permutation(n, 7, pass)) {
          if (i++ >= length) return;
          yield index;
        }
      }
    },
  };
}

interface Row {
  pipeline: string;
  workers: number;
  imagesPerSecond: number;
  perWorker: number;
  cpuMsPerImage: number;
  imagesPerCpuSecond: number;
  timedImages: number;
  seconds: number;
}

/**
 * One pipeline's run. With `decode: 'gpu'` the workers only read the files, each batch is handed
 * over on the device (`toTensors()`, as a training step takes it), and the timing ends with the
 * device's work.
 */
async function measure(
  dataset: ImageFolder,
  pipeline: string,
  transform: Compose,
  workers: number,
  decode: 'cpu' | 'gpu' = 'cpu',
): Promise<Row> {
  // The batches dispatched before the first one arrives include the workers' start-up: skip them.
  const warmBatches = workers === 0 ? 2 : workers * prefetch + 1;
  const timedBatches = Math.ceil(timedImages / batchSize);
  const loader = new DataLoader(dataset, {
    batchSize,
    transform,
    workers,
    prefetch,
    sampler: cyclingSampler(dataset.length, (warmBatches + timedBatches) * batchSize),
    seed: 0,
    ...(decode === 'gpu' ? { decode, device: 'cuda:0' } : {}),
  });
  let seen = 0;
  let images = 0;
  let started = 0;
  let cpuStart = process.cpuUsage();
  for await (const batch of loader) {
    if (decode === 'gpu') batch.toTensors();
    if (++seen === warmBatches) {
      if (decode === 'gpu') synchronize('cuda:0');
      started = performance.now();
      cpuStart = process.cpuUsage();
    } else if (seen > warmBatches) {
      images += batch.size;
    }
  }
  if (decode === 'gpu') synchronize('cuda:0');
  const seconds = (performance.now() - started) / 1000;
  const cpu = process.cpuUsage(cpuStart);
  await loader.close();
  const cpuSeconds = (cpu.user + cpu.system) / 1e6;
  return {
    pipeline,
    workers,
    imagesPerSecond: images / seconds,
    perWorker: images / seconds / Math.max(1, workers),
    cpuMsPerImage: (cpuSeconds * 1000) / images,
    imagesPerCpuSecond: images / cpuSeconds,
    timedImages: images,
    seconds,
  };
}

/**
 * How much work `cores` busy threads get done relative to one (ideally `cores`): on shared or
 * throttled machines it is lower, and worker scaling can be no better than this.
 */
async function parallelSpeedup(threads: number, ms = 600): Promise<number> {
  const code = `const { parentPort, workerData } = require('node:worker_threads');
let n = 0; const end = Date.now() + workerData; while (Date.now() < end) for (let i = 0; i < 1000; i++) n++;
parentPort.postMessage(n);`;
  const spin = (count: number) =>
    Promise.all(
      Array.from(
        { length: count },
        () =>
          new Promise<number>((resolve, reject) => {
            const w = new Worker(code, { eval: true, workerData: ms });
            w.once('message', (n: number) => resolve(n));
            w.once('error', reject);
          }),
      ),
    ).then((counts) => counts.reduce((a, b) => a + b, 0));
  const one = await spin(1);
  return threads === 1 ? 1 : (await spin(threads)) / one;
}

interface ReferenceRow {
  pipeline: string;
  imagesPerSecond: number;
  /** CPU time of the main and the worker process per image; null when the worker could not be read. */
  cpuMsPerImage: number | null;
  imagesPerCpuSecond: number | null;
}

interface AvailableReference {
  available: true;
  rows: ReferenceRow[];
  versions: { torch: string; torchvision: string; pillow: string };
  python: string;
}

type Reference = AvailableReference | { available: false; reason: string };

/** torchvision's DataLoader (PIL) with one worker on the same folder and pipelines, if installed. */
function torchvisionReference(root: string): Reference {
  const probe = spawnSync(
    python,
    ['-c', 'import torch, torchvision, PIL; print(torch.__version__, torchvision.__version__, PIL.__version__)'],
    { encoding: 'utf8' },
  );
  if (probe.status !== 0) {
    const why = probe.error ? probe.error.message : (probe.stderr.trim().split('\n').pop() ?? 'import failed');
    return {
      available: false,
      reason: `${python} cannot import torchvision here (${why}); give an interpreter that can with --python or PYTHON`,
    };
  }
  const [torch, torchvision, pil] = probe.stdout.trim().split(' ');
  if (torch === undefined || torchvision === undefined || pil === undefined) {
    return {
      available: false,
      reason: `${python} printed no torch, torchvision and PIL versions: ${probe.stdout.trim()}`,
    };
  }
  // The worker's CPU time comes from /proc (Linux) at the start and the end of the timed batches,
  // read while it is alive; the main process's from process_time (all its threads).
  const script = `
import json, os, sys, time, torch
from torch.utils.data import DataLoader, Sampler
from torchvision import datasets, transforms as T
root, batch, warm, timed, prefetch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
tick = os.sysconf('SC_CLK_TCK')
def cpu(pids):
    total = time.process_time()
    for pid in pids:
        with open(f'/proc/{pid}/stat') as f: fields = f.read().rsplit(')', 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total
class Cycle(Sampler):
    def __init__(self, n, length): self.n, self.length = n, length
    def __len__(self): return self.length
    def __iter__(self):
        g = torch.Generator().manual_seed(7); i = 0
        while True:
            for j in torch.randperm(self.n, generator=g).tolist():
                if i >= self.length: return
                i += 1; yield j
pipelines = {
  'train': T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.PILToTensor()]),
  'eval': T.Compose([T.Resize(256), T.CenterCrop(224), T.PILToTensor()]),
}
rows = []
for name, tf in pipelines.items():
    ds = datasets.ImageFolder(root, transform=tf)
    loader = DataLoader(ds, batch_size=batch, num_workers=1, prefetch_factor=prefetch, sampler=Cycle(len(ds), (warm + timed) * batch))
    it = iter(loader)
    try: pids = [w.pid for w in it._workers]
    except Exception: pids = None
    seen = images = 0; start = cpu0 = cpu1 = None
    for x, y in it:
        seen += 1
        if seen == warm:
            start = time.perf_counter(); cpu0 = cpu(pids) if pids else None
        elif seen > warm:
            images += x.shape[0]
            if seen == warm + timed:
                seconds = time.perf_counter() - start; cpu1 = cpu(pids) if pids else None
    used = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
    rows.append({'pipeline': name, 'imagesPerSecond': images / seconds,
                 'cpuMsPerImage': used * 1000 / images if used else None, 'imagesPerCpuSecond': images / used if used else None})
print('RESULT ' + json.dumps(rows))
`;
  const run = spawnSync(
    python,
    [
      '-c',
      script,
      root,
      String(batchSize),
      String(prefetch + 1),
      String(Math.ceil(timedImages / batchSize)),
      String(prefetch),
    ],
    {
      encoding: 'utf8',
      env: { ...process.env, OMP_NUM_THREADS: '1' },
    },
  );
  const line = run.stdout.split('\n').find((l) => l.startsWith('RESULT '));
  if (run.status !== 0 || !line) {
    return {
      available: false,
      reason: `the torchvision run failed: ${run.stderr.trim().split('\n').slice(-3).join(' ')}`,
    };
  }
  return {
    available: true,
    rows: JSON.parse(line.slice(7)) as ReferenceRow[],
    versions: { torch, torchvision, pillow: pil },
    python,
  };
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

/** The median of each figure over repeated rows of one configuration. */
function medianRow(runs: Row[]): Row {
  const m = (f: (r: Row) => number) => median(runs.map(f));
  return {
    pipeline: runs[0]!.pipeline,
    workers: runs[0]!.workers,
    imagesPerSecond: m((r) => r.imagesPerSecond),
    perWorker: m((r) => r.perWorker),
    cpuMsPerImage: m((r) => r.cpuMsPerImage),
    imagesPerCpuSecond: m((r) => r.imagesPerCpuSecond),
    timedImages: runs[0]!.timedImages,
    seconds: m((r) => r.seconds),
  };
}

/** The medians of the reference's repeated runs (unavailable when any run was). */
function medianReference(runs: Reference[]): Reference {
  const failed = runs.find((r) => !r.available);
  if (failed) return failed;
  const done = runs.filter((r) => r.available);
  const first = done[0];
  if (first === undefined) return { available: false, reason: 'not run' };
  const known = (v: number | null): v is number => v !== null;
  const rows = first.rows.map((row, i) => {
    const cpuMs = done.map((r) => r.rows[i]!.cpuMsPerImage);
    const perCpuSecond = done.map((r) => r.rows[i]!.imagesPerCpuSecond);
    return {
      pipeline: row.pipeline,
      imagesPerSecond: median(done.map((r) => r.rows[i]!.imagesPerSecond)),
      cpuMsPerImage: cpuMs.every(known) ? median(cpuMs) : null,
      imagesPerCpuSecond: perCpuSecond.every(known) ? median(perCpuSecond) : null,
    };
  });
  return { ...first, rows };
}

const { root, meanBytes } = await benchFolder();
const dataset = await ImageFolder.open(root);
const pipelines: [string, () => Compose][] = [
  ['train', () => new Compose([new RandomResizedCrop({ size: 224 }), new RandomHorizontalFlip()])],
  ['eval', () => new Compose([new Resize({ size: 256 }), new CenterCrop({ size: 224 })])],
];
console.log(
  `DataLoader benchmark: ${dataset.length} JPEGs (mean ${(meanBytes / 1024).toFixed(0)} KiB) in ${root}; batch ${batchSize}, prefetch ${prefetch}; ` +
    `${cores} cores (${cpus()[0]?.model.trim() ?? 'unknown CPU'}); JPEG decoding with libjpeg-turbo ${addon().libjpegTurboVersion} (built against); ` +
    `UV_THREADPOOL_SIZE ${process.env.UV_THREADPOOL_SIZE ?? '4 (default)'}`,
);
const speedup = await parallelSpeedup(cores);
console.log(
  `parallel speedup of ${cores} busy threads over one: ${speedup.toFixed(2)}x (worker scaling cannot exceed it)`,
);
const runs = new Map<string, Row[]>();
const referenceRuns: Reference[] = [];
for (let r = 0; r < repeats; r++) {
  for (const [name, make] of pipelines) {
    for (const workers of workerCounts) {
      const key = `${name}/${workers}`;
      runs.set(key, [...(runs.get(key) ?? []), await measure(dataset, name, make(), workers)]);
    }
  }
  const reference = torchvisionReference(root);
  referenceRuns.push(reference);
  if (!reference.available) break; // the same failure each time
}
const rows = [...runs.values()].map(medianRow);
const reference = medianReference(referenceRuns);

const pad = (s: string, n: number) => s.padStart(n);
console.log('');
if (repeats > 1) console.log(`medians of ${repeats} runs:`);
console.log(
  `${'pipeline'.padEnd(10)}${pad('workers', 9)}${pad('images/s', 11)}${pad('per worker', 12)}${pad('CPU ms/img', 12)}${pad('img/CPU-s', 11)}`,
);
for (const r of rows) {
  console.log(
    `${r.pipeline.padEnd(10)}${pad(r.workers === 0 ? 'main' : String(r.workers), 9)}${pad(r.imagesPerSecond.toFixed(1), 11)}` +
      `${pad(r.workers === 0 ? '-' : r.perWorker.toFixed(1), 12)}${pad(r.cpuMsPerImage.toFixed(2), 12)}${pad(r.imagesPerCpuSecond.toFixed(1), 11)}`,
  );
}
console.log('');
if (reference.available) {
  console.log(
    `torchvision ${reference.versions.torchvision} (PIL ${reference.versions.pillow}) DataLoader, num_workers=1, same folder and pipelines` +
      `${repeats > 1 ? `, medians of ${repeats} runs` : ''}:`,
  );
  for (const r of reference.rows) {
    const cpu =
      r.cpuMsPerImage === null || r.imagesPerCpuSecond === null
        ? 'CPU time unknown'
        : `${r.cpuMsPerImage.toFixed(2)} CPU ms/img, ${r.imagesPerCpuSecond.toFixed(1)} img/CPU-s`;
    console.log(`  ${r.pipeline.padEnd(8)}${r.imagesPerSecond.toFixed(1)} images/s, ${cpu}`);
  }
} else {
  console.log(
    `torchvision reference: unavailable: ${reference.reason}. No published per-core figure for this pipeline is quoted.`,
  );
}
// JPEG decoding on the GPU (real GPUs only), the same pipelines and batch size.
const gpuDecode = measureGpuDecode(dataset, pipelines, batchSize, Math.max(4, Math.ceil(timedImages / batchSize)));
if (gpuDecode.available) {
  console.log('GPU decode (nvJPEG + resampling kernels, file bytes in memory):');
  for (const r of gpuDecode.rows) {
    console.log(`  ${r.pipeline.padEnd(8)}${r.imagesPerSecond.toFixed(1)} images/s (${r.implementation})`);
  }
} else {
  console.log(`GPU decode: skipped: ${gpuDecode.reason}`);
}
// The DataLoader with decode: 'gpu' (real GPUs only): the workers read, the device decodes.
const gpuLoaderRows: Row[] = [];
const gpuLoaderSkipped = gpuDecodeUnavailable();
if (gpuLoaderSkipped !== null) {
  console.log(`DataLoader decode: 'gpu': skipped: ${gpuLoaderSkipped}`);
} else {
  console.log("DataLoader decode: 'gpu' (workers read the files; images/s to the end of the device work):");
  for (const [pipeline, make] of pipelines) {
    for (const workers of workerCounts.filter((w) => w > 0)) {
      const r = await measure(dataset, pipeline, make(), workers, 'gpu');
      gpuLoaderRows.push(r);
      console.log(
        `  ${r.pipeline.padEnd(8)}${String(workers).padStart(2)} workers: ${r.imagesPerSecond.toFixed(1)} images/s, ` +
          `${r.cpuMsPerImage.toFixed(2)} CPU ms/img`,
      );
    }
  }
}
const packageVersion = (
  JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }
).version;
console.log(
  `RESULT ${JSON.stringify({
    bench: 'loader',
    version: packageVersion,
    libjpegTurbo: addon().libjpegTurboVersion,
    cores,
    cpu: cpus()[0]?.model.trim(),
    images: dataset.length,
    meanFileBytes: Math.round(meanBytes),
    batchSize,
    prefetch,
    uvThreadpoolSize: process.env.UV_THREADPOOL_SIZE ?? null,
    repeats,
    parallelSpeedup: speedup,
    rows,
    torchvision: reference,
    gpuDecode,
    gpuLoader: gpuLoaderRows,
  })}`,
);
