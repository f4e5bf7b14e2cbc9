/**
 * DistributedDataParallel on a one-rank NCCL group (the GPU check table, test/gpu/cases.ts): the
 * bucket all-reduces run on the group's stream during backward, `finishGradientSync` joins them to
 * the compute stream without a host synchronisation, the f32 gradients come back unchanged (the
 * average over one rank) and the bf16-compressed ones within one bf16 rounding.
 * @packageDocumentation
 */
import { CrossEntropyLoss, DistributedDataParallel, ResNet, Tensor, hostSyncStats } from '../../lib/index.js';
import type { GpuCheck } from './cases.js';
import { soloGroup } from './solo-group.js';

function check(condition: boolean, message: string): asserts condition {
  if (!condition) throw new Error(message);
}

/** The largest |a - b| over b's rounding unit (`unit` |b|). */
function worstRoundings(a: Float32Array, b: Float32Array, unit: number): number {
  let worst = 0;
  for (let i = 0; i < b.length; i++) {
    worst = Math.max(worst, Math.abs(a[i]! - b[i]!) / (unit * Math.abs(b[i]!) + 1e-30));
  }
  return worst;
}

/** The check. */
export const ddpNcclCheck: GpuCheck = {
  name: 'DistributedDataParallel on a one-rank NCCL group: no host synchronisation, f32 exact, bf16 within rounding',
  run: ({ device, scale, log }) => {
    const [batch, size] = scale === 'full' ? [32, 32] : [2, 8];
    const blockWidths = scale === 'full' ? undefined : Array.from({ length: 8 }, () => [4]);
    const make = (): ResNet => new ResNet(18, { numClasses: 10, smallInput: true, seed: 2, device, blockWidths });
    const x = Tensor.randn([batch, size, size, 3], { seed: 3, device });
    const labels = Array.from({ length: batch }, (_, i) => i % 10);
    const gradsOf = (wrap: ((m: ResNet) => DistributedDataParallel) | null): Float32Array => {
      const model = make();
      const ddp = wrap ? wrap(model) : null;
      const loss = new CrossEntropyLoss();
      loss.forward(ddp ? ddp.forward(x) : model.forward(x), labels);
      if (ddp) {
        const before = hostSyncStats().count;
        ddp.backward(loss.backward());
        ddp.finishGradientSync();
        check(hostSyncStats().count === before, 'backward and finishGradientSync synchronised with the host');
      } else {
        model.backward(loss.backward());
      }
      const grads = model.arena().grads.toFloat32Array();
      ddp?.dispose();
      model.dispose();
      loss.dispose();
      return grads;
    };
    const group = soloGroup('nccl', device);
    try {
      const plain = gradsOf(null);
      const f32 = gradsOf((m) => new DistributedDataParallel(m, group, { bucketCapMb: 0.1 }));
      const differing = f32.reduce((n, v, i) => (v === plain[i] ? n : n + 1), 0);
      check(
        differing === 0,
        `f32 gradients averaged over one rank differ from the plain backward in ${differing} of ${plain.length} values ` +
          `(worst ${worstRoundings(f32, plain, 2 ** -23).toExponential(2)} f32 roundings)`,
      );
      const bf16 = gradsOf(
        (m) => new DistributedDataParallel(m, group, { bucketCapMb: 0.1, gradientCompression: 'bf16' }),
      );
      const worst = worstRoundings(bf16, plain, 2 ** -8);
      log(`bf16 error / (2^-8 |g|): ${worst.toFixed(3)}`);
      check(worst <= 1, `bf16-compressed gradients off by ${worst} roundings`);
    } finally {
      group.destroy();
      x.dispose();
    }
  },
};
