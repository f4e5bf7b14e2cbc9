/**
 * The GPU check of the `optim` fused path (lib/fused-paths.ts): over a model's parameter arena,
 * the fused op (check, unscaled SGD update, scale update, zeroing) against the unfused ops
 * (unscaleAndCheck, sgdStep, scalerUpdate, the arena zeroed) on the same device, on clean
 * gradients and on gradients with an inf, and the device time of each, the figure that decides
 * whether the path can become the default.
 */
import { ResNet18, ResNet50, SGD, Tensor, synchronize } from '../../lib/index.js';
import { addon } from '../../lib/binding.js';
import type { GpuCheck } from './cases.js';

const SCALER = { growthFactor: 2, backoffFactor: 0.5, growthInterval: 2000 };

interface Buffers {
  params: Tensor;
  grads: Tensor;
  momentum: Tensor;
  flags: Tensor; // [scale, foundInf]
  tracker: Tensor;
}

function fail(message: string): never {
  throw new Error(message);
}

/** Runs the fused path's check on `device`; `scale` 'small' uses a ResNet-18 arena, 'full' ResNet-50's. */
export const fusedOptimCheck: GpuCheck = {
  name: 'the fused optimizer end of a step (RESNET_CUDA_FUSED=optim) equals the unfused ops, and its device time',
  run: ({ device, scale, log }) => {
    const model =
      scale === 'full'
        ? ResNet50({ seed: 3, device: 'cpu' })
        : ResNet18({ numClasses: 10, smallInput: true, seed: 3, device: 'cpu' });
    const optimizer = new SGD(model, { lr: 0.1, momentum: 0.9, nesterov: true, weightDecay: 5e-5 });
    const table = optimizer.segmentTable();
    const groups = [{ lr: 0.1, momentum: 0.9, dampening: 0, weightDecay: 5e-5, nesterov: true }];
    // 'small': the parameters in the arena's first 300,000 elements (the emulated device is slow).
    const limit = scale === 'full' ? model.arena().size : Math.min(model.arena().size, 300_000);
    const kept: number[] = [];
    for (let k = 0; k < table.length; k += 3) {
      if (table[k]! + table[k + 1]! <= limit) kept.push(table[k]!, table[k + 1]!, table[k + 2]!);
    }
    const segments = Int32Array.from(kept);
    const n = limit;
    const lossScale = 1024;
    const params = model.arena().params.toFloat32Array().slice(0, n);
    const grads = Tensor.randn([n], { seed: 4, std: 1e-2 * lossScale }).toFloat32Array();
    const momentum = Tensor.randn([n], { seed: 5, std: 1e-3 }).toFloat32Array();
    model.dispose();

    const make = (badAt: number | null): Buffers => {
      const g = grads.slice();
      if (badAt !== null) g[badAt] = Infinity;
      return {
        params: Tensor.from(params, [n], { device }),
        grads: Tensor.from(g, [n], { device }),
        momentum: Tensor.from(momentum, [n], { device }),
        flags: Tensor.from([lossScale, 0], [2], { device }),
        tracker: Tensor.from([0], [1], { dtype: 'i32', device }),
      };
    };
    const free = (b: Buffers) => [b.params, b.grads, b.momentum, b.flags, b.tracker].forEach((t) => t.dispose());
    const unfused = (b: Buffers) => {
      const foundInf = b.flags.view(1, [1]).raw;
      addon().fill({ tensor: foundInf, value: 0 });
      addon().unscaleAndCheck({ grads: b.grads.raw, invScale: 1 / lossScale, foundInf, segments });
      addon().sgdStep({
        params: b.params.raw,
        grads: b.grads.raw,
        momentumBuffer: b.momentum.raw,
        groups,
        segments,
        foundInf,
      });
      addon().scalerUpdate({ scale: b.flags.view(0, [1]).raw, growthTracker: b.tracker.raw, foundInf, ...SCALER });
      addon().fill({ tensor: b.grads.raw, value: 0 });
    };
    const fused = (b: Buffers) => {
      const foundInf = b.flags.view(1, [1]).raw;
      addon().fill({ tensor: foundInf, value: 0 });
      addon().fusedSgdStep({
        params: b.params.raw,
        grads: b.grads.raw,
        momentumBuffer: b.momentum.raw,
        groups,
        segments,
        foundInf,
        gradScaleInv: 1 / lossScale,
        checkFinite: true,
        zeroGrads: true,
        scale: b.flags.view(0, [1]).raw,
        growthTracker: b.tracker.raw,
        ...SCALER,
      });
    };

    // The inf lands inside the first parameter, so that the check must see it.
    for (const badAt of [null, segments[0]! + Math.floor(segments[1]! / 2)]) {
      const a = make(badAt);
      const b = make(badAt);
      unfused(a);
      fused(b);
      const pa = a.params.toFloat32Array();
      const pb = b.params.toFloat32Array();
      const ma = a.momentum.toFloat32Array();
      const mb = b.momentum.toFloat32Array();
      // The update may differ by the rounding of one fused multiply-add: compare the steps taken.
      let worst = 0;
      for (let i = 0; i < n; i++) {
        const step = Math.abs(pa[i]! - params[i]!);
        worst = Math.max(
          worst,
          Math.abs(pa[i]! - pb[i]!) / Math.max(step, 1e-30),
          Math.abs(ma[i]! - mb[i]!) / Math.max(Math.abs(ma[i]!), 1e-30),
        );
      }
      const fa = a.flags.toFloat32Array();
      const fb = b.flags.toFloat32Array();
      if (fa[0] !== fb[0] || fa[1] !== fb[1]) fail(`scale/foundInf ${fb.join(', ')} fused, ${fa.join(', ')} unfused`);
      if (a.tracker.item() !== b.tracker.item()) fail('the growth trackers differ');
      const zeroed = b.grads.toFloat32Array();
      for (let k = 0; k < segments.length; k += 3) {
        const from = segments[k]!;
        if (zeroed.subarray(from, from + segments[k + 1]!).some((v) => v !== 0)) fail('fused: gradients not zeroed');
      }
      if (badAt !== null && pb.some((v, i) => v !== params[i])) fail('fused: the step with an inf moved a parameter');
      log(`${badAt === null ? 'clean' : 'inf'}: worst relative difference of the step ${worst.toExponential(2)}`);
      if (!(worst <= 1e-5)) fail(`fused and unfused updates differ by ${worst} relative to the step`);
      free(a);
      free(b);
    }

    // Device time, steps back to back (the flag cleared each time, so no step is skipped).
    const reps = scale === 'full' ? 50 : 2;
    const time = (run: (b: Buffers) => void): number => {
      const b = make(null);
      run(b);
      synchronize(device);
      const started = performance.now();
      for (let r = 0; r < reps; r++) run(b);
      synchronize(device);
      const ms = (performance.now() - started) / reps;
      free(b);
      return ms;
    };
    const unfusedMs = time(unfused);
    const fusedMs = time(fused);
    log(
      `${segments.length / 3} parameters (${n} arena elements): unfused ${unfusedMs.toFixed(3)} ms, fused ${fusedMs.toFixed(3)} ms per step ` +
        `(${(unfusedMs / fusedMs).toFixed(2)}x)`,
    );
  },
};
