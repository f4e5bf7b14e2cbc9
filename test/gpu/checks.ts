/**
 * Checks that need a GPU beyond the op tables, runnable with Node alone:
 *   node dist/test/gpu/checks.js [cuda:0]
 * - the backend reports the device and library versions;
 * - a ResNet-50 bf16 training step runs, and the same steps replayed from a captured CUDA graph give
 *   the same losses and parameters as eager execution;
 * - an NCCL communicator with one rank all-reduces and broadcasts in place;
 * - an impossible allocation fails with ERR_RC_OUT_OF_MEMORY naming the sizes.
 * Ends with "N passed, N failed".
 */
import { Communicator, CrossEntropyLoss, CudaGraph, ResNet50, SGD, Tensor, createUniqueId, listBackends, synchronize } from '../../lib/index.js';

const device = process.argv[2] ?? 'cuda:0';
let passed = 0;
let failed = 0;

function check(name: string, body: () => void): void {
  const started = performance.now();
  try {
    body();
    passed++;
    console.log(`ok    ${name} (${(performance.now() - started).toFixed(0)} ms)`);
  } catch (error) {
    failed++;
    console.log(`FAIL  ${name}: ${error instanceof Error ? error.stack ?? error.message : String(error)}`);
  }
}

function assert(condition: boolean, message: string): void {
  if (!condition) throw new Error(message);
}

function relativeError(a: Float32Array, b: Float32Array): number {
  let num = 0;
  let den = 0;
  for (let i = 0; i < a.length; i++) {
    num += (a[i]! - b[i]!) ** 2;
    den += b[i]! ** 2;
  }
  return Math.sqrt(num / Math.max(den, 1e-30));
}

check('the CUDA backend is available and reports its device', () => {
  const cuda = listBackends().find((b) => b.name === 'cuda');
  assert(!!cuda?.available, `cuda is not available: ${cuda?.reason}`);
  console.log(`      ${cuda!.device} ${JSON.stringify(cuda!.properties)}`);
});

check('ResNet-50 bf16 steps replayed from a CUDA graph match eager steps', () => {
  const batch = 32;
  const x = Tensor.randn([batch, 224, 224, 3], { seed: 3, device, dtype: 'bf16' });
  const labels = Tensor.from(Array.from({ length: batch }, (_, i) => i * 13 % 1000), [batch], { dtype: 'i32', device });
  const make = () => {
    const model = ResNet50({ seed: 7, device });
    const loss = new CrossEntropyLoss({ labelSmoothing: 0.1 });
    const optimizer = new SGD(model, { lr: 0.05, momentum: 0.9, weightDecay: 1e-4 });
    const step = () => {
      const value = loss.forward(model.forward(x), labels);
      model.backward(loss.backward());
      optimizer.step();
      optimizer.zeroGrad();
      return value;
    };
    return { model, step };
  };
  const eager = make();
  const eagerLosses = [0, 1, 2].map(() => eager.step().item());
  const captured = make();
  const graphLosses = [captured.step().item()];
  let lossTensor: Tensor | null = null;
  const graph = CudaGraph.capture(device, () => {
    lossTensor = captured.step();
  });
  for (let i = 0; i < 2; i++) {
    graph.replay();
    graphLosses.push((lossTensor as Tensor | null)!.item());
  }
  synchronize(device);
  console.log(`      eager ${eagerLosses.map((v) => v.toFixed(5)).join(' ')} | graph ${graphLosses.map((v) => v.toFixed(5)).join(' ')}`);
  eagerLosses.forEach((v, i) => assert(Number.isFinite(v) && Math.abs(v - graphLosses[i]!) <= 1e-3 * Math.abs(v), `step ${i}: eager loss ${v} vs graph ${graphLosses[i]}`));
  const err = relativeError(captured.model.arena().params.toFloat32Array(), eager.model.arena().params.toFloat32Array());
  assert(err < 1e-3, `parameters after three steps differ by ${err}`);
  graph.dispose();
});

check('an NCCL communicator of one rank all-reduces and broadcasts in place', () => {
  const comm = new Communicator({ device, uniqueId: createUniqueId(device), rank: 0, worldSize: 1, timeoutSeconds: 60 });
  const t = Tensor.from([1, 2, 3, 4], [4], { device });
  comm.allReduce(t);
  comm.allReduce(t, { average: true });
  comm.broadcast(t, 0);
  comm.synchronize();
  const values = [...t.toFloat32Array()];
  assert(values.join(',') === '1,2,3,4', `expected 1,2,3,4, got ${values.join(',')}`);
  comm.dispose();
});

check('an impossible allocation fails with ERR_RC_OUT_OF_MEMORY naming the sizes', () => {
  try {
    Tensor.empty([1 << 30, 1 << 12], { dtype: 'u8', device });
    throw new Error('a 4 TiB allocation succeeded');
  } catch (error) {
    const e = error as Error & { code?: string };
    assert(e.code === 'ERR_RC_OUT_OF_MEMORY', `expected ERR_RC_OUT_OF_MEMORY, got ${e.code}: ${e.message}`);
    assert(/tried to allocate/.test(e.message) && /free/.test(e.message), `message lacks sizes: ${e.message}`);
  }
});

console.log(`${passed} passed, ${failed} failed`);
process.exitCode = failed ? 1 : 0;
