import { describe, expect, it } from 'vitest';
import * as api from '../lib/index.js';

describe('the package entry point', () => {
  it('exports the public API, not the helpers the modules share among themselves', () => {
    for (const internal of [
      'ShapeCache',
      'expectTensor',
      'ohwiToOihw',
      'oihwToOhwi',
      'Pool2d',
      'permutation',
      'defaultWorkers',
      'datasetFromSpec',
      'DATASET_KINDS',
      'writeFileAtomic',
      'crc32c',
      'writePng',
      'countHostSync',
      'copyToDevice',
      'StepTiming',
      'opRecorder',
      'setOpRecorder',
    ]) {
      expect(Object.keys(api)).not.toContain(internal);
    }
    for (const name of [
      'Tensor',
      'ResNet50',
      'SGD',
      'DataLoader',
      'DataLoaderError',
      'ImageFolder',
      'GpuJpegDecoder',
      'Compose',
      'RandomResizedCrop',
      'randomSplit',
      'Trainer',
      'ResnetError',
      'ERROR_CODES',
      'AbortError',
      'CosineAnnealingLR',
      'diagnoseBottleneck',
      'deviceUtilization',
      'hostSyncStats',
      'writeLrFinder',
      'MlflowRun',
      'Profiler',
      'extractFeatures',
      'saveFeatures',
      'encodeNpy',
      'tsne',
      'plotScatter',
      'prepareQat',
      'quantizedGraph',
      'exportOnnx',
      'saveInferenceArtifact',
      'loadInferenceArtifact',
      'loadTorchCheckpoint',
      'readTorchCheckpoint',
      'backboneGroups',
      'rendezvousFromEnv',
      'launchRanks',
      'DistributedDataParallel',
      'TcpStore',
      'TcpStoreServer',
      'PrefixStore',
      'stepRoofline',
      'GPU_PEAKS',
    ]) {
      expect(Object.keys(api)).toContain(name);
    }
  });
});
