/**
 * resnet-cuda: train the ResNet family from TypeScript on NVIDIA GPUs (cuDNN, cuBLAS, NCCL) or on
 * the CPU (oneDNN).
 *
 * ```ts
 * import { ResNet18, CrossEntropyLoss, SGD, Tensor } from 'resnet-cuda';
 * const model = ResNet18({ numClasses: 10, smallInput: true });
 * const loss = new CrossEntropyLoss({ labelSmoothing: 0.1 });
 * const opt = new SGD(model, { lr: 0.1, momentum: 0.9, weightDecay: 5e-4 });
 * const logits = model.forward(images);          // images: [N, H, W, 3] NHWC
 * console.log(loss.forward(logits, labels).item());
 * model.backward(loss.backward());
 * opt.step();
 * opt.zeroGrad();
 * ```
 * @packageDocumentation
 */
export { Tensor, isFloatDType, type DType, type TensorOptions } from './tensor.js';
export {
  cudaAvailable,
  emptyCache,
  listBackends,
  memoryStats,
  nativeVersion,
  parseDevice,
  resetPeakMemory,
  synchronize,
  type DeviceName,
  type MemoryStats,
} from './device.js';
export type { BackendStatus } from './binding.js';
export { ERROR_CODES, ResnetError, type ErrorCode } from './errors.js';
export { Random } from './random.js';
export { Module, type StateDict, type StateEntry } from './nn/module.js';
export { Parameter, ParameterArena, type ParameterKind, type ParameterLayout } from './nn/parameter.js';
export {
  AdaptiveAvgPool2d,
  BatchNorm2d,
  Conv2d,
  Flatten,
  Linear,
  MaxPool2d,
  ReLU,
  type BatchNorm2dOptions,
  type Conv2dOptions,
  type LinearOptions,
  type MaxPool2dOptions,
} from './nn/layers.js';
export { Chain, Residual, Sequential } from './nn/containers.js';
export {
  BasicBlock,
  Bottleneck,
  RESNET_DEPTHS,
  defaultBlockWidths,
  ResNet,
  ResNet18,
  ResNet34,
  ResNet50,
  ResNet101,
  ResNet152,
  type ResNetDepth,
  type ResNetOptions,
} from './nn/resnet.js';
// Gradient checkpointing (also `ResNet.checkpointing(options)`).
export {
  checkpointingOf,
  setCheckpointing,
  type CheckpointSegments,
  type CheckpointingOptions,
  type CheckpointingState,
} from './nn/checkpoint.js';
export {
  CrossEntropyLoss,
  LogitsLoss,
  type CrossEntropyLossOptions,
  type LossLabels,
  type LossOutputs,
} from './nn/loss.js';
export { IMAGENET_MEAN, IMAGENET_STD, InputNormalize, type InputNormalizeOptions } from './nn/input.js';
export { SGD, type SGDGroup, type SGDGroupInput, type SGDOptions } from './optim/sgd.js';
export {
  Optimizer,
  parameterGroups,
  type Group,
  type GroupInput,
  type OptimizerState,
  type OptimizerStepOptions,
  type ParameterGroupsOptions,
  type ParamsInput,
  type StepContext,
} from './optim/optimizer.js';
export {
  AdamW,
  LAMB,
  type AdamWGroup,
  type AdamWGroupInput,
  type AdamWOptions,
  type LAMBGroup,
  type LAMBGroupInput,
  type LAMBOptions,
} from './optim/adam.js';
export {
  GradScaler,
  type GradScalerOptions,
  type GradScalerState,
  type ScalableLoss,
  type ScalerOptimizer,
} from './optim/grad-scaler.js';
export { clipGradNorm, gradNorm, type GradTarget } from './optim/clip.js';
export { SHAPE_CLASSES, generateShapes, type GenerateShapesOptions, type GeneratedImages } from './data/generated.js';
export { CudaGraph } from './cuda.js';
// The rendezvous key-value store of data-parallel jobs (torch.distributed's TCPStore, PrefixStore).
export {
  DEFAULT_STORE_TIMEOUT_SECONDS,
  PrefixStore,
  TcpStore,
  TcpStoreServer,
  type KeyValueStore,
  type TcpStoreOptions,
  type TcpStoreServerOptions,
} from './distributed/store.js';
export { DataLoader, DataLoaderError, type Batch, type DataLoaderOptions } from './data/loader.js';
export {
  DistributedSampler,
  RandomSampler,
  SequentialSampler,
  type DistributedSamplerOptions,
  type RandomSamplerOptions,
  type Sampler,
  type SequentialSamplerOptions,
} from './data/sampler.js';
export type { Dataset, DatasetSpec, DecodedImage, RawSample, SampleRandom, TransformSpec } from './data/types.js';
export { IMG_EXTENSIONS, ImageFolder, type ImageFolderOptions, type SkippedFile } from './data/image-folder.js';
export { IdxDataset, type IdxOptions } from './data/idx.js';
export { CIFAR10_CLASSES, CifarDataset, type CifarOptions } from './data/cifar.js';
export { SyntheticDataset, type SyntheticDatasetOptions } from './data/synthetic.js';
export { ShapesDataset, type ShapesDatasetOptions, type WriteShapesOptions } from './data/shapes-dataset.js';
export { Subset, randomSplit, type RandomSplitOptions, type SplitSubsets } from './data/split.js';
export { sampleRandom } from './data/sample-random.js';
export {
  GpuJpegDecoder,
  type GpuDecodeSample,
  type GpuDecodedBatch,
  type GpuJpegDecoderOptions,
} from './data/gpu-decode.js';
export {
  CenterCrop,
  ColorJitter,
  Compose,
  Grayscale,
  Normalize,
  RandomHorizontalFlip,
  RandomResizedCrop,
  RandomRotation,
  Resize,
  ToRGB,
  Transform,
  transformFromSpec,
  type ColorJitterOptions,
  type ComposeOptions,
  type RandomResizedCropOptions,
  type ResizeOptions,
} from './data/transforms.js';
export {
  ConstantSchedule,
  ConstantWarmup,
  CosineAnnealingLR,
  ExponentialLR,
  LinearWarmup,
  MultiStepLR,
  OneCycleLR,
  ReduceLROnPlateau,
  Schedule,
  Scheduler,
  SequentialSchedule,
  StepLR,
  scaleLrForBatch,
} from './train/schedules.js';
export { ConfusionMatrix, RunningAverage, accuracy, argmax, topkCorrect } from './train/metrics.js';
export { SummaryWriter } from './train/outputs/tensorboard.js';
export { plotConfusionMatrix, plotCurves } from './train/outputs/plots.js';
export { AbortError } from './train/abort.js';
export { JsonLinesLogger, ProgressBar, formatDuration } from './train/outputs/logging.js';
export {
  decodeSafetensors,
  encodeSafetensors,
  loadCheckpoint,
  loadWeights,
  saveCheckpoint,
  saveWeights,
  type CheckpointParts,
  type CheckpointProgress,
  type Stateful,
} from './train/checkpoint.js';
export {
  Trainer,
  type Callback,
  type CheckpointInfo,
  type CheckpointPolicy,
  type CudaGraphOptions,
  type CudaGraphStats,
  type DistributedTrainingOptions,
  type EarlyStoppingOptions,
  type EpochRecord,
  type EvalResult,
  type FitOptions,
  type FitResult,
  type MetricMode,
  type Predictions,
  type RunState,
  type StepInfo,
  type TrainerEmaOptions,
  type TrainerOptions,
} from './train/trainer.js';
export { ModelEma, type ModelEmaOptions, type ModelEmaState } from './train/ema.js';
export { benchmarkTraining, type BenchmarkTrainingOptions, type TrainingBenchmark } from './train/benchmark.js';
// Model summary (torchinfo's role) and pruning (torch.nn.utils.prune's and channel pruning's).
export {
  ModelSummary,
  summary,
  type SummaryDType,
  type SummaryFormatOptions,
  type SummaryOptions,
  type SummaryRow,
} from './nn/summary.js';
export {
  MagnitudePruner,
  PruningCallback,
  gradualSparsity,
  isPruningStep,
  pruneChannels,
  resolveSparsitySchedule,
  weightSparsity,
  type ChannelCriterion,
  type ChannelPruningOptions,
  type MagnitudePrunerOptions,
  type PruningCallbackOptions,
  type ResolvedSparsitySchedule,
  type SparsitySchedule,
} from './nn/prune.js';
// Bottleneck report: per-step loader, host, device and synchronisation times, the driver's GPU
// utilisation (NVML), and the verdict of what limits a run.
export { deviceUtilization, hostSyncStats, type DeviceUtilization, type HostSyncStats } from './device.js';
export {
  BOTTLENECK_THRESHOLDS,
  combineMeasurements,
  diagnoseBottleneck,
  estimateDeviceMs,
  type BottleneckContext,
  type BottleneckKind,
  type BottleneckReport,
  type DeviceTimeSource,
  type StepMeasurements,
} from './train/bottleneck.js';
export { readRunBottleneck, type EpochBottleneck, type RunBottleneck } from './train/bottleneck-log.js';
// Learning-rate range test (Trainer.findLr) and MLflow tracking (the Trainer's mlflow option).
export {
  plotLrFinder,
  smoothLosses,
  suggestLr,
  sweepLr,
  writeLrFinder,
  type LrFinderOptions,
  type LrFinderResult,
  type LrFinderSettings,
  type LrSuggestion,
} from './train/lr-finder.js';
export { MlflowRun, type MlflowRunOptions, type MlflowRunStatus } from './train/outputs/mlflow.js';
// Profiler: per-op timing of training steps (CPU host times, CUDA events), tables and Chrome traces.
export {
  Profiler,
  type ProfileResult,
  type ProfiledOp,
  type ProfiledStep,
  type ProfilerOptions,
} from './profile/profiler.js';
export {
  formatProfileTable,
  summarizeProfile,
  type ProfileRow,
  type ProfileSummary,
  type ProfileTableOptions,
} from './profile/report.js';
export { chromeTrace, writeChromeTrace, type ChromeTrace, type ChromeTraceEvent } from './profile/chrome-trace.js';
export {
  ProfileStepsCallback,
  parseStepRange,
  type ProfileStepsOptions,
  type StepRange,
} from './profile/trainer-callback.js';
// Embeddings: a dataset's pooled features to .npy/safetensors files, Barnes-Hut t-SNE, its scatter plot.
export {
  extractFeatures,
  saveFeatures,
  type ExtractFeaturesOptions,
  type ExtractedFeatures,
  type SaveFeaturesOptions,
} from './analysis/features.js';
export { encodeNpy, type NpyArray } from './analysis/npy.js';
export { tsne, type TsneOptions, type TsneReport, type TsneResult } from './analysis/tsne.js';
export { plotScatter, type ScatterOptions } from './train/outputs/plots.js';
// The roofline model of a training step on a GPU (the default plan, the plan as built with fused paths on,
// the fused target), and the GPU peaks it uses.
export {
  ROOFLINE_PLANS,
  StepRoofline,
  stepRoofline,
  type BoundOp,
  type RooflinePlan,
  type RooflineTotals,
  type StepRooflineOptions,
} from './analysis/roofline.js';
export { CONV_BN_BUILT, type ConvBnBuilt } from './analysis/plan-built.js';
export { GPU_NAMES, GPU_PEAKS, gpuPeak, type GpuName, type GpuPeak } from './analysis/gpu-peaks.js';
export { OP_TYPES, type OpType, type StepOp } from './analysis/step-ops.js';
// Knowledge distillation: the loss, and the Trainer's teacher (its `distillation` option).
// Quantization-aware training: fake quantization in training, then the INT8 inference graph.
export { FakeQuantizer, type FakeQuantizerOptions } from './nn/fake-quant.js';
export {
  hasQatState,
  isQatPrepared,
  prepareQat,
  quantizedGraph,
  setQatObservers,
  type QatOptions,
} from './train/qat.js';
export { DistillationLoss, type DistillationLossOptions } from './nn/distillation-loss.js';
export { Distillation, type DistillationOptions } from './train/distillation.js';
// ONNX export: the inference graph (batch norm folded; INT8 as QDQ) as an .onnx file.
export {
  DEFAULT_ONNX_OPSET,
  ONNX_OPSETS,
  exportOnnx,
  exportOnnxBytes,
  type OnnxExport,
  type OnnxExportOptions,
} from './export/onnx.js';
// The fast inference path: a network lowered once (batch norm folded, ReLU and residual add fused
// into the convolutions) and run by a native plan per input shape.
export { PREDICTOR_DTYPES, Predictor, type PredictorDType, type PredictorOptions } from './inference/predictor.js';
// INT8 post-training quantization: calibration to a quantized inference graph, which a Predictor
// with `dtype: 'int8'` runs.
export {
  CALIBRATION_METHODS,
  Calibrator,
  calibrate,
  type CalibrateOptions,
  type CalibrationBatch,
  type CalibrationMethod,
  type CalibrationSamples,
  type CalibratorOptions,
} from './inference/calibrate.js';
export { WEIGHT_BITS, type WeightBits } from './inference/quant-math.js';
// The standalone inference artifact (model.safetensors + model.json; TorchScript's role), and a
// Predictor (the fused inference path) run over a DataLoader.
export {
  InferenceArtifact,
  artifactArchitecture,
  loadInferenceArtifact,
  saveInferenceArtifact,
  type ArtifactOnnxOptions,
  type LoadInferenceArtifactOptions,
  type SaveInferenceArtifactOptions,
} from './inference/artifact.js';
export {
  ARTIFACT_FILES,
  ARTIFACT_FORMAT,
  ARTIFACT_VERSION,
  parseArtifactManifest,
  type ArtifactArchitecture,
  type ArtifactFile,
  type ArtifactManifest,
  type ArtifactPreprocessing,
} from './inference/artifact-manifest.js';
export { evaluatePredictor, predictLoader, type EvaluatePredictorOptions } from './inference/predictor-runs.js';
// PyTorch checkpoints (.pth/.pt) read without Python, pretrained weights, and the fine-tuning groups.
export {
  loadTorchCheckpoint,
  readTorchCheckpoint,
  TORCH_ALLOWED_GLOBALS,
  TorchStorage,
  TorchTensor,
  type LoadTorchCheckpointOptions,
  type TorchDType,
  type TorchValue,
} from './nn/torch-checkpoint.js';
export type { PickleKey, PickleValue } from './nn/pickle.js';
export {
  classifierClasses,
  loadPretrained,
  readWeightsFile,
  weightsFormat,
  type WeightsFormat,
} from './nn/pretrained.js';
export { backboneGroups, freezeBackbone, type FineTuneGroup } from './optim/fine-tune.js';
// Data-parallel jobs: where this process sits (torchrun, SLURM or Open MPI variables) and the
// launcher behind `resnet-cuda launch`.
export { rendezvousFromEnv } from './distributed/env.js';
export {
  launchRanks,
  type LaunchOptions,
  type LaunchResult,
  type LaunchStream,
  type RankBinding,
  type RankExit,
} from './distributed/launcher.js';
// Process groups (torch.distributed): NCCL between GPUs, Gloo on the CPU, rendezvous through rank 0's store.
export {
  DEFAULT_PROCESS_GROUP_TIMEOUT_SECONDS,
  DistributedProcessGroup,
  initProcessGroup,
  type ProcessGroupOptions,
} from './distributed/process-group.js';
export type {
  CollectiveRecord,
  ProcessGroup,
  ProcessGroupBackend,
  ReduceOp,
  RendezvousInfo,
} from './distributed/types.js';
// Data-parallel training: gradients averaged over a process group in buckets during backward.
export {
  DistributedDataParallel,
  type DistributedDataParallelOptions,
  type GradientCompression,
} from './distributed/ddp.js';
export { planBuckets, type GradientBucket } from './distributed/buckets.js';
export type { PostBackwardHook, RemovableHook } from './nn/module.js';
// SyncBatchNorm: batch statistics shared by the processes of a group (torch.nn.SyncBatchNorm).
export { SyncBatchNorm, convertSyncBatchNorm, type SyncBatchNormOptions } from './distributed/sync-batchnorm.js';
export type { BatchNormSync } from './nn/layers.js';
// Fused CUDA paths (off by default; RESNET_CUDA_FUSED switches them on) and the optimizer side of the fused step.
export { FUSED_ENV, FUSED_PATH_NAMES, fusedPathOn, fusedPaths, type FusedPath } from './fused-paths.js';
export { CONV_BN_FALLBACK_WARNING } from './nn/conv-bn-support.js';
export type { FusedScaleUpdate, FusedStepOptions } from './optim/optimizer.js';
export type { FusableOptimizer } from './optim/grad-scaler.js';
