/**
 * Inference throughput: the {@link Predictor} (the fused inference plan) beside ONNX Runtime
 * (onnxruntime-node, CPU execution provider) running the same network exported by
 * {@link exportOnnxBytes}, in the same process, alternating round by round so that both see the
 * same machine load. Rows per compute dtype and batch, with the ratio to ONNX Runtime's f32 time.
 *
 * `node dist/bench/inference.js [OPTIONS]` (`--help` lists them); `npm run bench` runs it at its
 * defaults.
 *
 * INT8 rows: {@link benchInference} takes a `quantize` hook (a model to its calibrated graph); the
 * `int8` dtype is benchmarked only when one is given, and reported as skipped otherwise.
 * @packageDocumentation
 */
import { cpus, loadavg } from 'node:os';
import { realpathSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import * as ort from 'onnxruntime-node';
import { ResNet, Tensor, listBackends, type ResNetDepth } from '../lib/index.js';
import { exportOnnxBytes } from '../lib/export/onnx.js';
import type { InferenceGraph } from '../lib/inference/graph.js';
import { Predictor, type PredictorDType } from '../lib/inference/predictor.js';
import { integerListOption, integerOption, numberOption, parseOptions } from './options.js';

/** What {@link benchInference} measures. */
export interface InferenceBenchOptions {
  depth: ResNetDepth;
  /** Image size (square). */
  size: number;
  batches: readonly number[];
  dtypes: readonly PredictorDType[];
  /** Alternating rounds; each timed value is the median over them. */
  rounds: number;
  /** Seconds each side runs per round (at least one call). */
  seconds: number;
  /** Makes the INT8 graph (calibrated) of a model; without it the `int8` rows are skipped. */
  quantize?: (model: ResNet) => InferenceGraph;
}

/** One row of the table. */
export interface InferenceBenchRow {
  dtype: PredictorDType;
  batch: number;
  /** Median over the rounds of the mean ms per call: ours, and ONNX Runtime (f32) on the same batch. */
  oursMs: number;
  ortMs: number;
  /** The fastest single call of all rounds (ms): ours, and ONNX Runtime's. */
  oursMinMs: number;
  ortMinMs: number;
  oursImagesPerSecond: number;
  ortImagesPerSecond: number;
  /** ONNX Runtime's time over ours (medians): above 1, ours is faster. */
  speedup: number;
  /** The 1-minute load average before and after the row's rounds (the machine may be shared). */
  loadAverage: [number, number];
  implementation: string;
}

/** The machine line of the table: CPU model, oneDNN's ISA and version, and the thread count. */
export function machineLine(): string {
  const cpu = listBackends().find((b) => b.name === 'cpu');
  const props = cpu?.properties ?? {};
  return `${cpus()[0]?.model ?? 'unknown CPU'}, ${cpus().length} CPUs; oneDNN ${props.onednn ?? '?'} ISA ${props.isa ?? '?'}, ${props.threads ?? '?'} threads; onnxruntime-node ${ort.env.versions.common}`;
}

function median(values: readonly number[]): number {
  const s = [...values].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

/** The mean and the fastest ms per call of `call`, repeated for about `seconds` (at least once). */
async function timeCalls(call: () => unknown, seconds: number): Promise<{ mean: number; min: number }> {
  let calls = 0;
  let min = Infinity;
  const start = performance.now();
  let end = start;
  do {
    await call();
    const now = performance.now();
    min = Math.min(min, now - end);
    end = now;
    calls++;
  } while (end - start < seconds * 1000);
  return { mean: (end - start) / calls, min };
}

/** NHWC values as NCHW. */
function toNchw(x: Float32Array, n: number, h: number, w: number, c: number): Float32Array {
  const out = new Float32Array(x.length);
  for (let b = 0; b < n; b++) {
    for (let i = 0; i < h * w; i++) {
      for (let k = 0; k < c; k++) out[(b * c + k) * h * w + i] = x[(b * h * w + i) * c + k]!;
    }
  }
  return out;
}

/** Runs the table and prints it; returns its rows. */
export async function benchInference(o: InferenceBenchOptions): Promise<InferenceBenchRow[]> {
  const model = new ResNet(o.depth, { numClasses: 1000, seed: 1, smallInput: o.size <= 64 });
  model.eval();
  // ONNX Runtime gets its native NCHW input (the layout conversion is not timed on either side).
  const onnx = exportOnnxBytes(model, { batch: 'dynamic', layout: 'nchw' });
  const session = await ort.InferenceSession.create(onnx.bytes, { graphOptimizationLevel: 'all' });
  const quantized = o.quantize ? o.quantize(model) : null;
  console.log(
    `\ninference: ResNet-${o.depth}, ${o.size} px, ours (NHWC input) beside ONNX Runtime f32 (NCHW input), ${o.rounds} alternating rounds of ${o.seconds} s each`,
  );
  console.log(`  ${machineLine()}`);
  console.log(
    '  dtype  batch   ours ms   ORT ms   ours min   ORT min   ours img/s   ORT img/s   ORT/ours   load   implementation',
  );
  const rows: InferenceBenchRow[] = [];
  for (const batch of o.batches) {
    const host = Tensor.randn([batch, o.size, o.size, 3], { seed: 3 }).toFloat32Array();
    const x = Tensor.from(host, [batch, o.size, o.size, 3]);
    const feeds = {
      [onnx.input.name]: new ort.Tensor('float32', toNchw(host, batch, o.size, o.size, 3), [batch, 3, o.size, o.size]),
    };
    for (const dtype of o.dtypes) {
      const source = dtype === 'int8' ? quantized : model;
      if (!source) {
        console.log(
          `  ${dtype.padEnd(5)}  ${String(batch).padStart(5)}   skipped: no calibrated graph (quantize hook)`,
        );
        continue;
      }
      const predictor = new Predictor(source, { dtype });
      const ours = (): void => predictor.predict(x).dispose();
      const theirs = (): Promise<unknown> => session.run(feeds);
      ours();
      await theirs();
      const oursTimes: { mean: number; min: number }[] = [];
      const ortTimes: { mean: number; min: number }[] = [];
      const loadBefore = loadavg()[0]!;
      for (let r = 0; r < o.rounds; r++) {
        oursTimes.push(await timeCalls(ours, o.seconds));
        ortTimes.push(await timeCalls(theirs, o.seconds));
      }
      const oursMs = median(oursTimes.map((t) => t.mean));
      const ortMs = median(ortTimes.map((t) => t.mean));
      const row: InferenceBenchRow = {
        dtype,
        batch,
        oursMs,
        ortMs,
        oursMinMs: Math.min(...oursTimes.map((t) => t.min)),
        ortMinMs: Math.min(...ortTimes.map((t) => t.min)),
        oursImagesPerSecond: (batch * 1000) / oursMs,
        ortImagesPerSecond: (batch * 1000) / ortMs,
        speedup: ortMs / oursMs,
        loadAverage: [loadBefore, loadavg()[0]!],
        implementation: predictor.implementation([batch, o.size, o.size, 3]),
      };
      predictor.dispose();
      rows.push(row);
      console.log(
        `  ${dtype.padEnd(5)}  ${String(batch).padStart(5)} ${oursMs.toFixed(1).padStart(9)} ${ortMs.toFixed(1).padStart(8)} ${row.oursMinMs.toFixed(1).padStart(10)} ${row.ortMinMs.toFixed(1).padStart(9)} ${row.oursImagesPerSecond.toFixed(1).padStart(12)} ${row.ortImagesPerSecond.toFixed(1).padStart(11)} ${row.speedup.toFixed(2).padStart(9)}x ${row.loadAverage
          .map((l) => l.toFixed(1))
          .join('-')
          .padStart(9)}   ${row.implementation}`,
      );
    }
    x.dispose();
  }
  await session.release();
  model.dispose();
  return rows;
}

const USAGE = `Usage: node dist/bench/inference.js [OPTIONS]

  --depth D          ResNet depth [50]
  --size PX          image size [224]
  --batches LIST     batch sizes [1,16]
  --dtypes LIST      compute types; int8 needs a quantize hook (bench/int8.js) [f32,bf16,int8]
  --rounds N         alternated rounds beside ONNX Runtime [5]
  --seconds S        time per row and round [1]
  -h, --help         print this help
`;

/** The command-line options as {@link InferenceBenchOptions}. */
function optionsFromArgs(): InferenceBenchOptions {
  const values = parseOptions(
    () =>
      parseArgs({
        options: {
          depth: { type: 'string', default: '50' },
          size: { type: 'string', default: '224' },
          batches: { type: 'string', default: '1,16' },
          dtypes: { type: 'string', default: 'f32,bf16,int8' },
          rounds: { type: 'string', default: '5' },
          seconds: { type: 'string', default: '1' },
          help: { type: 'boolean', short: 'h' },
        },
      }),
    USAGE,
  );
  return {
    depth: integerOption('depth', values.depth, 1) as ResNetDepth,
    size: integerOption('size', values.size, 1),
    batches: integerListOption('batches', values.batches, 1),
    dtypes: values.dtypes.split(',') as PredictorDType[],
    rounds: integerOption('rounds', values.rounds, 1),
    seconds: numberOption('seconds', values.seconds, 0.01),
  };
}

if (process.argv[1] && realpathSync(process.argv[1]) === fileURLToPath(import.meta.url)) {
  await benchInference(optionsFromArgs());
}
