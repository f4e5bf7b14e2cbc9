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
export { Tensor, expectTensor, isFloatDType, type DType, type TensorOptions } from './tensor.js';
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
export { ResnetError, type ErrorCode } from './errors.js';
export { Random } from './random.js';
export { Module, ShapeCache, ohwiToOihw, oihwToOhwi, type StateDict, type StateEntry } from './nn/module.js';
export { Parameter, ParameterArena, type ParameterKind, type ParameterLayout } from './nn/parameter.js';
export {
  AdaptiveAvgPool2d,
  BatchNorm2d,
  Conv2d,
  Flatten,
  Linear,
  MaxPool2d,
  Pool2d,
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
  ResNet,
  ResNet18,
  ResNet34,
  ResNet50,
  ResNet101,
  ResNet152,
  type ResNetDepth,
  type ResNetOptions,
} from './nn/resnet.js';
export { CrossEntropyLoss, type CrossEntropyLossOptions } from './nn/loss.js';
export { IMAGENET_MEAN, IMAGENET_STD, InputNormalize, type InputNormalizeOptions } from './nn/input.js';
export { SGD, type SGDGroup, type SGDGroupInput, type SGDOptions } from './optim/sgd.js';
export { SHAPE_CLASSES, generateShapes, type GenerateShapesOptions, type GeneratedImages } from './data/generated.js';
export { Communicator, CudaGraph, createUniqueId, type CommunicatorOptions } from './cuda.js';
