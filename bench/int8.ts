/**
 * INT8 rows of the inference table: {@link int8Quantizer} is the `quantize` hook of
 * {@link benchInference} (calibrates the benchmark's model on a few generated images; the
 * throughput does not depend on the scales chosen). Run alone,
 * `node dist/bench/int8.js [--size 224] [--batches 1,16] [--rounds 3] [--seconds 1] [--method entropy]
 * [--weight-bits 8]`
 * prints ResNet-50's f32 and INT8 rows beside ONNX Runtime.
 * @packageDocumentation
 */
import { realpathSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { Tensor, type ResNet } from '../lib/index.js';
import { Calibrator, type CalibrationMethod } from '../lib/inference/calibrate.js';
import type { InferenceGraph } from '../lib/inference/graph.js';
import type { WeightBits } from '../lib/inference/quant-math.js';
import { benchInference } from './inference.js';

/** Options of {@link int8Quantizer}. */
export interface Int8QuantizerOptions {
  /** Image size of the calibration images (square); default 224. */
  size?: number;
  /** Calibration images; default 4. */
  images?: number;
  method?: CalibrationMethod;
  /** Width of the quantized weights; default 8. */
  weightBits?: WeightBits;
}

/** A `quantize` hook for {@link benchInference}: the model's INT8 graph calibrated on normal-noise images. */
export function int8Quantizer(o: Int8QuantizerOptions = {}): (model: ResNet) => InferenceGraph {
  const size = o.size ?? 224;
  const images = o.images ?? 4;
  return (model) => {
    const calibrator = new Calibrator(model, { method: o.method ?? 'entropy', weightBits: o.weightBits ?? 8 });
    const x = Tensor.randn([images, size, size, 3], { seed: 11 });
    calibrator.observe(x);
    x.dispose();
    return calibrator.finish();
  };
}

if (process.argv[1] && realpathSync(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const { values } = parseArgs({
    options: {
      size: { type: 'string', default: '224' },
      batches: { type: 'string', default: '1,16' },
      rounds: { type: 'string', default: '3' },
      seconds: { type: 'string', default: '1' },
      method: { type: 'string', default: 'entropy' },
      'weight-bits': { type: 'string', default: '8' },
    },
  });
  const size = Number(values.size);
  await benchInference({
    depth: 50,
    size,
    batches: values.batches.split(',').map(Number),
    dtypes: ['f32', 'int8'],
    rounds: Number(values.rounds),
    seconds: Number(values.seconds),
    quantize: int8Quantizer({
      size,
      method: values.method as CalibrationMethod,
      weightBits: Number(values['weight-bits']) as WeightBits,
    }),
  });
}
