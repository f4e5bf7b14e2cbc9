/**
 * INT8 rows of the inference table: {@link int8Quantizer} is the `quantize` hook of
 * {@link benchInference} (calibrates the benchmark's model on a few generated images; the
 * throughput does not depend on the scales chosen). Run alone,
 * `node dist/bench/int8.js [OPTIONS]` (`--help` lists them) prints ResNet-50's f32 and INT8 rows
 * beside ONNX Runtime.
 * @packageDocumentation
 */
import { realpathSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { Tensor, type ResNet } from '../lib/index.js';
import { CALIBRATION_METHODS, Calibrator, type CalibrationMethod } from '../lib/inference/calibrate.js';
import type { InferenceGraph } from '../lib/inference/graph.js';
import { WEIGHT_BITS, type WeightBits } from '../lib/inference/quant-math.js';
import { benchInference } from './inference.js';
import { integerListOption, integerOption, numberOption, parseOptions, usageError } from './options.js';

const USAGE = `Usage: node dist/bench/int8.js [OPTIONS]

  --size PX          image size [224]
  --batches LIST     batch sizes [1,16]
  --rounds N         alternated rounds beside ONNX Runtime [3]
  --seconds S        time per row and round [1]
  --method M         calibration: ${CALIBRATION_METHODS.join(', ')} [entropy]
  --weight-bits B    ${WEIGHT_BITS.join(' or ')} [8]
  -h, --help         print this help
`;

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
  const values = parseOptions(
    () =>
      parseArgs({
        options: {
          size: { type: 'string', default: '224' },
          batches: { type: 'string', default: '1,16' },
          rounds: { type: 'string', default: '3' },
          seconds: { type: 'string', default: '1' },
          method: { type: 'string', default: 'entropy' },
          'weight-bits': { type: 'string', default: '8' },
          help: { type: 'boolean', short: 'h' },
        },
      }),
    USAGE,
  );
  const size = integerOption('size', values.size, 1);
  const method = values.method as CalibrationMethod;
  if (!CALIBRATION_METHODS.includes(method)) {
    usageError(`--method expects one of ${CALIBRATION_METHODS.join(', ')}, got '${values.method}'`);
  }
  const weightBits = integerOption('weight-bits', values['weight-bits'], 1) as WeightBits;
  if (!WEIGHT_BITS.includes(weightBits)) {
    usageError(`--weight-bits expects ${WEIGHT_BITS.join(' or ')}, got '${values['weight-bits']}'`);
  }
  await benchInference({
    depth: 50,
    size,
    batches: integerListOption('batches', values.batches, 1),
    dtypes: ['f32', 'int8'],
    rounds: integerOption('rounds', values.rounds, 1),
    seconds: numberOption('seconds', values.seconds, 0.01),
    quantize: int8Quantizer({
      size,
      method,
      weightBits,
    }),
  });
}
