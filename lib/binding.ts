/**
 * The raw native addon, typed, and its loader. Everything here mirrors `native/napi/` one to one;
 * the public API in the rest of `lib/` validates arguments before they reach these calls.
 * @packageDocumentation
 */
import { createRequire } from 'node:module';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { addonLoadHint } from './addon-load-hint.js';
import { ResnetError } from './errors.js';
import { applyOpenMpDefaults } from './openmp-env.js';

export { addonLoadHint, type AddonLoadContext } from './addon-load-hint.js';

/** Element types known to the native layer. */
export type DTypeName = 'f32' | 'bf16' | 'f16' | 'i32' | 'i64' | 'u8';

/** A tensor in native memory (host memory for `cpu`, device memory for `cuda:N`). */
export interface RawTensor {
  readonly shape: number[];
  readonly dtype: DTypeName;
  readonly device: string;
  readonly nbytes: number;
  readonly disposed: boolean;
  view(options: { offset: number; shape: number[] }): RawTensor;
  reshape(options: { shape: number[] }): RawTensor;
  copyFromHost(data: ArrayBufferView | ArrayBuffer): void;
  copyToHost(data: ArrayBufferView | ArrayBuffer): void;
  copyFrom(src: RawTensor): void;
  sharesStorage(other: RawTensor): boolean;
  dispose(): void;
}

export interface RawConv2dOptions {
  device: string;
  dtype: DTypeName;
  n: number;
  h: number;
  w: number;
  c: number;
  k: number;
  kernelH: number;
  kernelW: number;
  strideH?: number;
  strideW?: number;
  padH?: number;
  padW?: number;
  dilationH?: number;
  dilationW?: number;
  bias?: boolean;
}

export interface RawConv2dPlan {
  forward(args: { x: RawTensor; weight: RawTensor; bias?: RawTensor; y: RawTensor }): void;
  /** dx = the input gradient, or dx += it with `accumulate`. */
  backwardData(args: { dy: RawTensor; weight: RawTensor; dx: RawTensor; accumulate?: boolean }): void;
  backwardWeights(args: { x: RawTensor; dy: RawTensor; dWeight: RawTensor; dBias?: RawTensor }): void;
  implementation(): string;
  dispose(): void;
}

export interface RawLinearOptions {
  device: string;
  dtype: DTypeName;
  n: number;
  in: number;
  out: number;
  bias?: boolean;
}

export interface RawLinearPlan {
  forward(args: { x: RawTensor; weight: RawTensor; bias?: RawTensor; y: RawTensor }): void;
  backwardData(args: { dy: RawTensor; weight: RawTensor; dx: RawTensor }): void;
  backwardWeights(args: { x: RawTensor; dy: RawTensor; dWeight: RawTensor; dBias?: RawTensor }): void;
  dispose(): void;
}

export interface RawPool2dOptions {
  device: string;
  dtype: DTypeName;
  kind: 'max' | 'avg';
  n: number;
  h: number;
  w: number;
  c: number;
  kernelH: number;
  kernelW: number;
  strideH?: number;
  strideW?: number;
  padH?: number;
  padW?: number;
}

export interface RawPool2dPlan {
  workspaceBytes(): number;
  forward(args: { x: RawTensor; y: RawTensor; workspace?: RawTensor }): void;
  backward(args: { dy: RawTensor; dx: RawTensor; workspace?: RawTensor }): void;
  dispose(): void;
}

/** One node of an inference plan: lib/inference/graph.ts's nodes, flattened (see native/core/inference_plan.h). */
export interface RawInferenceNode {
  op: 'conv' | 'maxpool' | 'globalavgpool' | 'linear';
  input: number;
  residual?: number;
  relu?: boolean;
  inChannels?: number;
  outChannels?: number;
  kernelH?: number;
  kernelW?: number;
  strideH?: number;
  strideW?: number;
  padH?: number;
  padW?: number;
  dilationH?: number;
  dilationW?: number;
  weight?: Float32Array;
  bias?: Float32Array;
  inputScale?: number;
  inputUnsigned?: boolean;
  weightScales?: Float32Array;
}

export interface RawInferenceOptions {
  device: string;
  /** The floating-point compute dtype. */
  dtype: 'f32' | 'bf16' | 'f16';
  /** Nodes with `weightScales` run in INT8. */
  int8?: boolean;
  n: number;
  h: number;
  w: number;
  c: number;
  nodes: RawInferenceNode[];
}

export interface RawInferencePlan {
  /** `y` `[n, classes]` f32 from `x` `[n, h, w, c]` f32, both on the plan's device. */
  run(args: { x: RawTensor; y: RawTensor }): void;
  implementation(): string;
  dispose(): void;
}

/** One batch norm of the dual forward (semantics in native/core/backend.h, DualBatchNormSide). */
export interface RawDualBatchNormSide {
  x: RawTensor;
  gamma: RawTensor;
  beta: RawTensor;
  runningMean: RawTensor;
  runningVar: RawTensor;
  saveMean?: RawTensor;
  saveInvStd?: RawTensor;
  momentum?: number;
  eps?: number;
}

/** One batch norm of the dual backward (DualBatchNormGradSide). */
export interface RawDualBatchNormGradSide {
  x: RawTensor;
  gamma: RawTensor;
  saveMean: RawTensor;
  saveInvStd: RawTensor;
  dx: RawTensor;
  dGamma: RawTensor;
  dBeta: RawTensor;
}

export interface RawSgdGroup {
  lr: number;
  momentum?: number;
  dampening?: number;
  weightDecay?: number;
  nesterov?: boolean;
}

/** The arguments of the raw SGD step (semantics in native/core/backend.h, SgdArgs). */
export interface RawSgdStepArgs {
  params: RawTensor;
  grads: RawTensor;
  momentumBuffer?: RawTensor;
  groups: RawSgdGroup[];
  segments: Int32Array;
  firstStep?: boolean;
  foundInf?: RawTensor;
  gradScaleInv?: number;
  /** Send the group and segment tables only (a captured step reads them when replayed). */
  tablesOnly?: boolean;
}

/** Hyperparameters of one AdamW or LAMB group, as the native op takes them (f32). */
export interface RawAdamGroup {
  lr: number;
  beta1?: number;
  beta2?: number;
  eps?: number;
  weightDecay?: number;
  /** LAMB only: apply the trust ratio even without weight decay (timm's `always_adapt`). */
  alwaysAdapt?: boolean;
}

/** The arguments AdamW and LAMB share (see `AdamWArgs` in native/core/backend.h). */
export interface RawAdamArgs {
  params: RawTensor;
  grads: RawTensor;
  expAvg: RawTensor;
  expAvgSq: RawTensor;
  groups: RawAdamGroup[];
  /** (offset, count, group) triples. */
  segments: Int32Array;
  /** t, 1 on the first step (bias corrections 1 - beta^t). */
  step: number;
  foundInf?: RawTensor;
  gradScaleInv?: number;
  /** i32[1] device counter of the steps taken: the op adds one (unless foundInf is set) and uses it as t. */
  stepCount?: RawTensor;
  /** Send the group and segment tables only (a captured step reads them when replayed). */
  tablesOnly?: boolean;
}

/**
 * What a fused optimizer op does besides its update (`FusedStepEnd` in native/core/backend.h):
 * gradients are read times the op's `gradScaleInv` without being written back.
 */
export interface RawFusedStepEnd {
  /** Raise `foundInf` on an inf/NaN gradient before any parameter moves (then skip the step). */
  checkFinite?: boolean;
  /** Leave the segments' gradients at zero, the skipped step included. */
  zeroGrads?: boolean;
  /** Unscale by 1 / `scale` read on the device as the op starts, not `gradScaleInv` (needs `scale`, `checkFinite`). */
  scaleFromDevice?: boolean;
  /** f32[1]: the scale; with `growthTracker`, the GradScaler's scale update follows the step. */
  scale?: RawTensor;
  /** i32[1]: clean steps since the scale last changed. */
  growthTracker?: RawTensor;
  growthFactor?: number;
  backoffFactor?: number;
  growthInterval?: number;
}

export interface RawMemoryStats {
  allocatedBytes: number;
  reservedBytes: number;
  peakAllocatedBytes: number;
  allocationCount: number;
  systemAllocationCount: number;
}

/** What `listBackends()` reports for each backend. */
export interface BackendStatus {
  /** `cpu` or `cuda`. */
  name: string;
  /** Whether this binary includes the backend. */
  built: boolean;
  /** Whether it can be used now. */
  available: boolean;
  /** Number of usable devices. */
  deviceCount: number;
  /** Why it is not available, when it is not. */
  reason?: string;
  /** The device's name, when available. */
  device?: string;
  /**
   * Library versions and capabilities, when available (e.g. `onednn`, `isa`, `threads`). The CPU
   * backend's `bf16` is `native` or `computed in f32`, and `bf16Reason` says why (no bf16 kernels,
   * AMX, the timing that chose, or `RESNET_CPU_BF16`).
   */
  properties?: Record<string, string>;
}

/** A place the CUDA libraries are looked for in (native/napi/cuda_libraries.h), in search order. */
export interface CudaLibraryPlace {
  /** `explicit` (RESNET_CUDA_LIBRARY_PATH), `python` (nvidia-* wheels), `cache` or `system`. */
  kind: 'explicit' | 'python' | 'cache' | 'system';
  /** What it is: `Python environment /venv/lib/python3.12/site-packages`. */
  label: string;
  /** The folders searched (none for the dynamic loader's own search). */
  dirs: string[];
}

/** One CUDA library the backend loads, and where it was found. */
export interface CudaLibraryRecord {
  /** `cuBLASLt`, `cuBLAS`, `cuDNN`, `NCCL` or `NVRTC`. */
  name: string;
  /** The file name looked for (`libcudnn.so.9`). */
  soname: string;
  /** The pip package that provides it. */
  package: string;
  /** Whether the backend needs it (NVRTC is optional). */
  required: boolean;
  found: boolean;
  loaded: boolean;
  path?: string;
  /** The label of the place it came from. */
  place?: string;
  /** The version the library reports (when loaded). */
  version?: string;
  /** Why it was found but did not load. */
  error?: string;
}

/** What `cudaLibraries()` reports. */
export interface CudaLibrarySearch {
  places: CudaLibraryPlace[];
  /** Places that could not be searched, and why (a `python3` that did not answer). */
  notes: string[];
  libraries: CudaLibraryRecord[];
  /** Whether the libraries were loaded (versions known), not only looked for. */
  loaded: boolean;
  /** Whether every required library was found (and loaded, when loading). */
  complete: boolean;
}

export interface RawCommunicator {
  readonly rank: number;
  readonly size: number;
  allReduce(args: { tensor: RawTensor; op?: 'sum' | 'avg' | 'max' }): void;
  broadcast(args: { tensor: RawTensor; root?: number }): void;
  allGather(args: { input: RawTensor; output: RawTensor }): void;
  barrier(): void;
  waitOnDevice(): void;
  synchronize(args: { timeoutSeconds?: number }): void;
  takeRecords(): { op: string; bytes: number; enqueuedMs: number; startMs: number; endMs: number }[];
  dispose(): void;
}

/** Rank 0's rendezvous key-value server, serving on a native thread of its own. @internal */
export interface RawTcpStoreServer {
  /** The port it listens on (the one chosen when 0 was asked). */
  readonly port: number;
  close(): void;
}

/** A client of the rendezvous store; every call blocks up to its deadline. @internal */
export interface RawTcpStore {
  set(args: { key: string; value: Uint8Array }): void;
  get(args: { key: string }): Uint8Array;
  add(args: { key: string; delta: number }): number;
  wait(args: { keys: string[]; timeoutSeconds?: number }): void;
  check(args: { keys: string[] }): boolean;
  lostRanks(): number[];
  close(): void;
}

/** A JPEG decode with a fused crop, resize, window and mirror (all optional). @internal */
export interface RawJpegRequest {
  bytes: Uint8Array;
  /** `[top, left, height, width]` of the image, resized as a whole (torchvision's crop first). */
  crop?: [number, number, number, number];
  /** `[height, width]` the crop is resized to; omitted: no resize. */
  size?: [number, number];
  /** `[top, left, height, width]` of the resized image to produce; omitted: all of it. */
  window?: [number, number, number, number];
  filter?: 'nearest' | 'bilinear' | 'bicubic' | 'lanczos';
  mirror?: boolean;
  /** Whether a 4x or larger reduction may start with DCT-domain scaling; default true. */
  dctScaling?: boolean;
}

/** Decoded pixels, `height x width x channels` uint8. @internal */
export interface RawImage {
  data: Uint8Array;
  height: number;
  width: number;
  channels: number;
}

/** One image of {@link RawJpegDecoder.decode}: the CPU decoder's request and the header's size. @internal */
export interface RawJpegDecodeImage extends Omit<RawJpegRequest, 'bytes' | 'dctScaling'> {
  bytes: Uint8Array;
  height: number;
  width: number;
}

/** The device JPEG decoder (nvJPEG and the backend's resampling). @internal */
export interface RawJpegDecoder {
  /** Decodes into `dst` (u8 `[n, H, W, 3]` on the decoder's device) on the decoder's stream. */
  decode(args: { images: RawJpegDecodeImage[]; dst: RawTensor }): void;
  /** Orders the device's stream after the last decode. */
  join(): void;
  synchronize(args: { timeoutSeconds: number }): void;
  implementation(): string;
  dispose(): void;
}

export interface RawAddon {
  version: string;
  /** The libjpeg-turbo version the addon was built against. */
  libjpegTurboVersion: string;
  jpegHeader(args: { bytes: Uint8Array }): { height: number; width: number; channels: number; supported: boolean };
  /** null for a colour space other than grey, YCbCr and RGB. */
  jpegDecode(args: RawJpegRequest): RawImage | null;
  imageResample(args: {
    data: Uint8Array;
    height: number;
    width: number;
    channels: number;
    /** `[x0, y0, x1, y1]` of the source (PIL's box order); the kernels read only these pixels. */
    box: [number, number, number, number];
    size: [number, number];
    window?: [number, number, number, number];
    filter?: 'nearest' | 'bilinear' | 'bicubic' | 'lanczos';
    mirror?: boolean;
  }): Uint8Array;
  NativeTensor: new (options: { shape: number[]; dtype: DTypeName; device: string }) => RawTensor;
  Conv2dPlan: new (options: RawConv2dOptions) => RawConv2dPlan;
  LinearPlan: new (options: RawLinearOptions) => RawLinearPlan;
  Pool2dPlan: new (options: RawPool2dOptions) => RawPool2dPlan;
  InferencePlan: new (options: RawInferenceOptions) => RawInferencePlan;
  JpegDecoder: new (options: { device: string }) => RawJpegDecoder;
  TcpStoreServer: new (options: { host: string; port: number; token?: string }) => RawTcpStoreServer;
  TcpStore: new (options: {
    host: string;
    port: number;
    token?: string;
    rank: number;
    timeoutSeconds: number;
  }) => RawTcpStore;
  Communicator: new (options: {
    device: string;
    backend: 'nccl' | 'gloo';
    rank: number;
    worldSize: number;
    timeoutSeconds?: number;
    /** nccl: the hex id of createUniqueId on rank 0. */
    uniqueId?: string;
    /** gloo with more than one rank: the store served by rank 0, and the group's key prefix. */
    storeHost?: string;
    storePort?: number;
    storeToken?: string;
    storePrefix?: string;
  }) => RawCommunicator;
  beginCapture(args: { device: string }): void;
  endCapture(args: { device: string }): number;
  replayGraph(args: { device: string; graph: number }): void;
  destroyGraph(args: { device: string; graph: number }): void;
  createUniqueId(args: { device: string }): string;
  batchNormForward(args: {
    x: RawTensor;
    gamma: RawTensor;
    beta: RawTensor;
    residual?: RawTensor;
    y: RawTensor;
    runningMean: RawTensor;
    runningVar: RawTensor;
    saveMean?: RawTensor;
    saveInvStd?: RawTensor;
    training: boolean;
    relu?: boolean;
    momentum?: number;
    eps?: number;
  }): void;
  batchNormBackward(args: {
    x: RawTensor;
    y?: RawTensor;
    dy: RawTensor;
    gamma: RawTensor;
    /**
     * The forward's beta. With `relu` and no `dResidual`, the CPU then recomputes the ReLU's output
     * from x as the forward did instead of reading `y` (which must be that forward's output).
     */
    beta?: RawTensor;
    saveMean: RawTensor;
    saveInvStd: RawTensor;
    dx: RawTensor;
    dGamma: RawTensor;
    dBeta: RawTensor;
    dResidual?: RawTensor;
    relu?: boolean;
    /** false: saveMean/saveInvStd are the running statistics an inference forward saved (default true). */
    training?: boolean;
  }): void;
  /**
   * The dual batch norm of a downsample block (CUDA only): `y = relu?(bn_a(a.x) + bn_b(b.x))`, each
   * side with its own parameters and statistics, in one pass that reads both inputs and writes `y`.
   */
  dualBatchNormForward(args: {
    a: RawDualBatchNormSide;
    b: RawDualBatchNormSide;
    y: RawTensor;
    training: boolean;
    relu?: boolean;
  }): void;
  /**
   * Its backward: `dy` masked by the ReLU (`y` the forward's output) is the gradient of both batch
   * norms; each side's dGamma/dBeta accumulate and its dx is overwritten.
   */
  dualBatchNormBackward(args: {
    a: RawDualBatchNormGradSide;
    b: RawDualBatchNormGradSide;
    y?: RawTensor;
    dy: RawTensor;
    relu?: boolean;
    /** false: the saved statistics are the running ones an inference forward saved (default true). */
    training?: boolean;
  }): void;
  /** SyncBatchNorm step 1: this rank's per-channel count, mean and M2 into `stats` (f32[3, C]). */
  syncBatchNormStats(args: { x: RawTensor; stats: RawTensor }): void;
  /**
   * SyncBatchNorm step 2: merges every rank's statistics (`stats`, f32[worldSize, 3, C]), normalises
   * `x` with the global mean and variance, saves them and updates the running statistics.
   */
  syncBatchNormForward(args: {
    x: RawTensor;
    gamma: RawTensor;
    beta: RawTensor;
    residual?: RawTensor;
    y: RawTensor;
    stats: RawTensor;
    runningMean: RawTensor;
    runningVar: RawTensor;
    saveMean: RawTensor;
    saveInvStd: RawTensor;
    relu?: boolean;
    momentum?: number;
    eps?: number;
  }): void;
  /**
   * SyncBatchNorm step 3: this rank's sum(g), sum(g·x̂) and row count into `sums` (f32[3, C]), and
   * its dGamma/dBeta accumulated.
   */
  syncBatchNormBackwardReduce(args: {
    x: RawTensor;
    y?: RawTensor;
    dy: RawTensor;
    saveMean: RawTensor;
    saveInvStd: RawTensor;
    sums: RawTensor;
    dGamma: RawTensor;
    dBeta: RawTensor;
    relu?: boolean;
  }): void;
  /** SyncBatchNorm step 4: dx (and dResidual) from the sums of step 3 summed over the ranks. */
  syncBatchNormBackwardElementwise(args: {
    x: RawTensor;
    y?: RawTensor;
    dy: RawTensor;
    gamma: RawTensor;
    saveMean: RawTensor;
    saveInvStd: RawTensor;
    sums: RawTensor;
    dx: RawTensor;
    dResidual?: RawTensor;
    relu?: boolean;
  }): void;
  relu(args: { x: RawTensor; y: RawTensor }): void;
  reluBackward(args: { y: RawTensor; dy: RawTensor; dx: RawTensor }): void;
  add(args: { a: RawTensor; b: RawTensor; out: RawTensor }): void;
  /** `out = a * b` element-wise (same element count and dtype); `out` may be `a` or `b`. */
  mul(args: { a: RawTensor; b: RawTensor; out: RawTensor }): void;
  cast(args: { src: RawTensor; dst: RawTensor }): void;
  fill(args: { tensor: RawTensor; value: number }): void;
  crossEntropy(args: {
    logits: RawTensor;
    labels: RawTensor;
    loss: RawTensor;
    dLogits?: RawTensor;
    labelSmoothing?: number;
    gradScale?: number;
    /** f32[1] on the device whose value replaces gradScale when the op runs (a captured step). */
    gradScaleFrom?: RawTensor;
  }): void;
  /**
   * Knowledge distillation's loss, `alpha * T² * KL(softmax(t/T) ‖ softmax(s/T)) + (1 - alpha) * CE`,
   * averaged over the batch, and its gradient with respect to the student's logits (times `gradScale`).
   */
  distillationLoss(args: {
    logits: RawTensor;
    teacherLogits: RawTensor;
    labels: RawTensor;
    loss: RawTensor;
    dLogits?: RawTensor;
    temperature: number;
    alpha: number;
    labelSmoothing?: number;
    gradScale?: number;
  }): void;
  sgdStep(args: RawSgdStepArgs): void;
  /**
   * sgdStep's update with the fused end of a step ({@link RawFusedStepEnd}) in one op: the `optim`
   * fused path. `tablesOnly` sends the tables sgdStep sends, which the fused op reads too.
   */
  fusedSgdStep(args: RawSgdStepArgs & RawFusedStepEnd): void;
  /**
   * The `conv-bn` fused convolution (CUDA only): y = conv(relu(x * scale + shift) when scale and
   * shift are given, else x; weight), writing the channel sums and sums of squares of y into `sum`
   * and `sqSum` when given. x and y NHWC bf16/f16, weight the f32 master [K,R,S,C].
   */
  convBnForward(args: {
    x: RawTensor;
    weight: RawTensor;
    y: RawTensor;
    scale?: RawTensor;
    shift?: RawTensor;
    sum?: RawTensor;
    sqSum?: RawTensor;
    strideH?: number;
    strideW?: number;
    padH?: number;
    padW?: number;
    dilationH?: number;
    dilationW?: number;
  }): void;
  /**
   * Batch norm's training statistics from convBnForward's sums over `count` rows (CUDA only):
   * saveMean, saveInvStd, the running statistics' update (when given) and the next prologue's
   * scale = gamma * invStd and shift = beta - mean * scale.
   */
  batchNormFinalize(args: {
    sum: RawTensor;
    sqSum: RawTensor;
    gamma: RawTensor;
    beta: RawTensor;
    runningMean?: RawTensor;
    runningVar?: RawTensor;
    saveMean: RawTensor;
    saveInvStd: RawTensor;
    scale: RawTensor;
    shift: RawTensor;
    /** Receives the biased batch variance (f32[C]) when given. */
    variance?: RawTensor;
    count: number;
    momentum?: number;
    eps?: number;
  }): void;
  /**
   * The backward of the `conv-bn` prologue (CUDA only), one cuDNN graph: with the forward
   * y = conv(relu(x * scale + shift), weight), dz = conv_backward_data(dy, weight) masked where
   * x * scale + shift <= 0 (written, x's dtype); dGamma += sum(dz * (x - saveMean) * saveInvStd) and
   * dBeta += sum(dz) (accumulated); eqDz, eqX and eqBias (overwritten) the coefficients of the batch
   * norm's input gradient that batchNormBackwardApply applies. dy, x and dz NHWC bf16/f16 with
   * channel counts that are multiples of 8; weight the f32 master [K,R,S,C]; the rest f32[C].
   */
  convDgradDbn(args: {
    dy: RawTensor;
    weight: RawTensor;
    x: RawTensor;
    scale: RawTensor;
    shift: RawTensor;
    gamma: RawTensor;
    saveMean: RawTensor;
    saveInvStd: RawTensor;
    dz: RawTensor;
    dGamma: RawTensor;
    dBeta: RawTensor;
    eqDz: RawTensor;
    eqX: RawTensor;
    eqBias: RawTensor;
    strideH?: number;
    strideW?: number;
    padH?: number;
    padW?: number;
    dilationH?: number;
    dilationW?: number;
  }): void;
  /**
   * The batch norm's input gradient from convDgradDbn's coefficients (CUDA only), per channel:
   * dx = eqDz * dz + eqX * x + eqBias. dx may be dz.
   */
  batchNormBackwardApply(args: {
    dz: RawTensor;
    x: RawTensor;
    eqDz: RawTensor;
    eqX: RawTensor;
    eqBias: RawTensor;
    dx: RawTensor;
  }): void;
  /**
   * The filter gradient of the `conv-bn` prologue's convolution (CUDA only), one cuDNN graph:
   * dWeight += conv_backward_filter(relu(x * scale + shift), dy), the activation recomputed as the
   * convolution loads x. x and dy NHWC bf16/f16 with channel counts that are multiples of 8; scale
   * and shift f32[C]; dWeight the f32 master gradient [K,R,S,C] (accumulated).
   */
  convWgradSbr(args: {
    x: RawTensor;
    dy: RawTensor;
    scale: RawTensor;
    shift: RawTensor;
    dWeight: RawTensor;
    strideH?: number;
    strideW?: number;
    padH?: number;
    padW?: number;
    dilationH?: number;
    dilationW?: number;
  }): void;
  /**
   * Whether cuDNN accepts every graph the `conv-bn` path needs for one convolution shape (CUDA
   * only): the forward with the statistics epilogue and, with `prologue`, the forward with the
   * scale-bias-ReLU prologue, convDgradDbn's and convWgradSbr's graphs. Builds and keeps their
   * execution plans (nothing is built twice); a refusal is returned with cuDNN's reason, not thrown.
   */
  convBnSupport(args: {
    device: string;
    dtype: string;
    n: number;
    h: number;
    w: number;
    c: number;
    k: number;
    kernelH: number;
    kernelW: number;
    strideH?: number;
    strideW?: number;
    padH?: number;
    padW?: number;
    dilationH?: number;
    dilationW?: number;
    prologue?: boolean;
  }): { ok: boolean; reason?: string };
  convertInput(args: { src: RawTensor; dst: RawTensor; flip?: RawTensor; mean: number[]; std: number[] }): void;
  adamwStep(args: RawAdamArgs): void;
  lambStep(args: RawAdamArgs): void;
  /**
   * adamwStep's update with the fused end of a step ({@link RawFusedStepEnd}) in one op: the `optim`
   * fused path. A skipped step leaves `stepCount` as it was.
   */
  fusedAdamwStep(args: RawAdamArgs & RawFusedStepEnd): void;
  /** lambStep's update with the fused end of a step, as {@link RawAddon.fusedAdamwStep}. */
  fusedLambStep(args: RawAdamArgs & RawFusedStepEnd): void;
  /** `segments` (triples, groups ignored) absent: the whole tensor. */
  gradNorm(args: { grads: RawTensor; out: RawTensor; foundInf?: RawTensor; segments?: Int32Array }): void;
  /** With `scale` (f32[1] on the device), `invScale` is 1 / its value when the op runs (a captured step). */
  unscaleAndCheck(args: {
    grads: RawTensor;
    invScale?: number;
    scale?: RawTensor;
    foundInf: RawTensor;
    segments?: Int32Array;
  }): void;
  clipGradNorm(args: { grads: RawTensor; norm: RawTensor; maxNorm: number; segments?: Int32Array }): void;
  scalerUpdate(args: {
    scale: RawTensor;
    growthTracker: RawTensor;
    foundInf: RawTensor;
    growthFactor: number;
    backoffFactor: number;
    growthInterval: number;
  }): void;
  /**
   * `a += weight * (b - a)` in place (torch.lerp_ with a scalar weight: weight 1 copies `b`
   * exactly). f32 tensors of equal element count on one device; `weight` in [0, 1].
   */
  lerp(args: { a: RawTensor; b: RawTensor; weight: number }): void;
  /**
   * Fake quantization with zero point 0 (torch.fake_quantize_per_tensor_affine, or
   * _per_channel_affine along dim 0): `y = clamp(rint(x / s), qmin, qmax) * s`, rounding half to
   * even. `scale` is f32 `[1]` or `[x.shape[0]]`, on the device; `y` may be `x`.
   */
  fakeQuantize(args: { x: RawTensor; scale: RawTensor; y: RawTensor; qmin: number; qmax: number }): void;
  /** The straight-through gradient: `dx = dy` where `qmin <= rint(x / s) <= qmax`, else 0. */
  fakeQuantizeBackward(args: {
    x: RawTensor;
    scale: RawTensor;
    dy: RawTensor;
    dx: RawTensor;
    qmin: number;
    qmax: number;
  }): void;
  /** `scale[k] = max(max |x[k, ...]| / qmax, eps)` per slice of dim 0 (`scale` f32 `[x.shape[0]]`) or over all of `x` (`[1]`). */
  absMaxScale(args: { x: RawTensor; scale: RawTensor; qmax: number }): void;
  /**
   * PyTorch's MovingAverageMinMaxObserver on the device: `minMax` (f32 `[2]`, starting as
   * `[+inf, -inf]`) takes the first batch's min and max, then moves by `averagingConstant` towards
   * each batch's; `scale` (f32 `[1]`) = `max(max(-min, max, 0) / qmax, eps)`.
   */
  observeMinMax(args: {
    x: RawTensor;
    minMax: RawTensor;
    scale: RawTensor;
    averagingConstant: number;
    qmax: number;
  }): void;
  /**
   * The output size of a convolution or pooling window along one axis (PyTorch's formula, floored;
   * 0 or less when the window does not fit the padded input), as the plans compute it.
   */
  windowOutputSize(args: { size: number; kernel: number; stride: number; pad: number; dilation: number }): number;
  synchronize(args: { device: string }): void;
  /**
   * Records a profiler mark (a timing event) on a CUDA device's stream without waiting, first
   * opening an NVTX range named `push`, or afterwards closing the innermost one (`pop`); returns
   * the mark's index in the current window. Throws on the CPU, whose ops are timed on the host.
   */
  profileMark(args: { device: string; push?: string; pop?: boolean }): number;
  /** Waits once for the window's last mark; each mark's time in ms after the first. Starts a new window. */
  profileRead(args: { device: string }): Float64Array;
  memoryStats(args: { device: string }): RawMemoryStats;
  /** The driver's utilisation reading (NVML); `reason` when `available` is false. */
  deviceUtilization(args: { device: string }): {
    available: boolean;
    reason?: string;
    gpuPercent: number;
    memoryPercent: number;
    memoryUsedBytes: number;
    memoryTotalBytes: number;
  };
  resetPeakMemory(args: { device: string }): void;
  emptyCache(args: { device: string }): void;
  listBackends(): BackendStatus[];
  /**
   * The CPU's multiply-add peak in GFLOP/s over all OpenMP threads: independent FMA chains in
   * registers on the widest vectors the CPU has (`isa`), best trial over about `milliseconds`.
   */
  cpuFmaPeak(args: { milliseconds: number }): { gflops: number; threads: number; isa: 'avx512' | 'avx2' | 'sse' };
  /**
   * Where the CUDA libraries are (searched and loaded once per process); with `env`, a fresh search
   * in that environment only (tests), loading only when `load` is true.
   */
  cudaLibraries(args?: { env?: Record<string, string>; load?: boolean; pythonTimeoutMs?: number }): CudaLibrarySearch;
}

/** The package root: the nearest folder above this file that holds `package.json`. */
export function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    if (existsSync(join(dir, 'package.json')) && existsSync(join(dir, 'CMakeLists.txt'))) return dir;
    if (existsSync(join(dir, 'package.json')) && existsSync(join(dir, 'prebuilds'))) return dir;
    const parent = dirname(dir);
    if (parent === dir) {
      throw new ResnetError(
        'ERR_RC_ADDON_LOAD',
        'resnet-cuda: cannot find the package root above ' + fileURLToPath(import.meta.url),
      );
    }
    dir = parent;
  }
}

/** The package version in `root`'s package.json, or undefined when it cannot be read. */
function packageVersion(root: string): string | undefined {
  try {
    const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { version?: unknown };
    return typeof pkg.version === 'string' ? pkg.version : undefined;
  } catch {
    return undefined;
  }
}

/** The `ERR_RC_ADDON_LOAD` error for a failed load: the loader's message and {@link addonLoadHint}'s. */
function explainLoadFailure(error: unknown, root: string): ResnetError {
  const message = error instanceof Error ? error.message : String(error);
  const hint = addonLoadHint(error, { root, version: packageVersion(root) });
  const err = new ResnetError(
    'ERR_RC_ADDON_LOAD',
    `resnet-cuda: the native addon failed to load.\n${message}\n${hint}`,
  );
  Object.assign(err, { cause: error });
  return err;
}

let cached: RawAddon | undefined;

/** Loads the native addon once (a local build wins over a prebuilt binary) and returns it. */
export function addon(): RawAddon {
  if (cached) return cached;
  const require = createRequire(import.meta.url);
  const root = packageRoot();
  applyOpenMpDefaults();
  try {
    const load = require('node-gyp-build') as (dir: string) => unknown;
    cached = load(root) as RawAddon;
  } catch (error) {
    throw explainLoadFailure(error, root);
  }
  return cached;
}
