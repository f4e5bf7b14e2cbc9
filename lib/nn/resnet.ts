/**
 * The ResNet family as in torchvision (v1.5: stride on the 3x3 convolution), built from
 * containers so that no backward is written by hand. Parameter names match torchvision's.
 * @packageDocumentation
 */
import { ResnetError, expectBool, expectInt, expectOneOf, expectOptions, invalid, isArray } from '../errors.js';
import { Random } from '../random.js';
import { setCheckpointing, type CheckpointingOptions } from './checkpoint.js';
import { Chain, Residual, Sequential } from './containers.js';
import { AdaptiveAvgPool2d, BatchNorm2d, Conv2d, Flatten, Linear, MaxPool2d } from './layers.js';
import type { Module, StateDict } from './module.js';
import { classifierClasses, loadPretrained, readWeightsFile } from './pretrained.js';
import { summary, type ModelSummary, type SummaryOptions } from './summary.js';
import type { Tensor } from '../tensor.js';

/** Options shared by the ResNet constructors. */
export interface ResNetOptions {
  /** Output classes; default 1000. */
  numClasses?: number;
  /**
   * A stem for 28-32 px images: a 3x3 stride-1 convolution and no max pooling (instead of the
   * 7x7 stride-2 convolution and 3x3 max pooling for 224 px images).
   */
  smallInput?: boolean;
  /** Start the last BN of each block at zero, so each block begins as the identity. */
  zeroInitResidual?: boolean;
  /** Input channels; default 3. */
  inChannels?: number;
  /** Device to place the model on; default `'cpu'`. */
  device?: string;
  /** Seed of the initialisation; random when omitted. */
  seed?: number;
  /**
   * The inner widths of every block, in order (`layer1.0`, `layer1.1`, …, the last block of
   * `layer4`): `[conv1, conv2]` output channels for a Bottleneck, `[conv1]` for a BasicBlock.
   * Default: torchvision's (the stage's `planes`). Channel pruning ({@link pruneChannels}) makes
   * models with fewer; the blocks' outputs (and so the shortcuts) keep their widths.
   */
  blockWidths?: readonly (readonly number[])[];
  /**
   * Pretrained weights with torchvision's names: the path of a PyTorch checkpoint (`.pth`/`.pt`
   * as `torch.save` writes it, e.g. torchvision's `resnet50-11ad3fa6.pth`, or a training
   * checkpoint holding the state dict under `model`), of a safetensors file, or a state dict.
   * `numClasses` defaults to the weights' classes; with another number, the classifier `fc` is
   * new (initialised as usual) and everything else is loaded strictly: torchvision's
   * fine-tuning recipe. See `lib/nn/pretrained.ts`.
   */
  weights?: string | StateDict;
}

/** A block type: BasicBlock (expansion 1) or Bottleneck (expansion 4). */
interface BlockType {
  expansion: number;
  /** Inner convolutions whose widths {@link ResNetOptions.blockWidths} sets. */
  inner: number;
  create(
    inplanes: number,
    planes: number,
    stride: number,
    downsample: Module | null,
    rng: Random,
    widths: readonly number[],
  ): Residual;
}

function conv(inC: number, outC: number, kernel: number, stride: number, rng: Random): Conv2d {
  return new Conv2d({
    inChannels: inC,
    outChannels: outC,
    kernelSize: kernel,
    stride,
    padding: Math.floor(kernel / 2),
    seed: Math.floor(rng.next() * 2 ** 31),
  });
}

/**
 * torchvision's BasicBlock: 3x3 → BN → ReLU → 3x3 → BN, plus the shortcut, then ReLU. `widths`
 * (`[conv1 outputs]`, default `[planes]`) narrows the inner convolution.
 */
export class BasicBlock extends Residual {
  static readonly expansion = 1;
  constructor(
    inplanes: number,
    planes: number,
    stride = 1,
    downsample: Module | null = null,
    rng: Random = new Random(),
    widths: readonly number[] = [planes],
  ) {
    const [w1] = widths as [number];
    super(
      [
        ['conv1', conv(inplanes, w1, 3, stride, rng)],
        ['bn1', new BatchNorm2d({ numFeatures: w1, relu: true })],
        ['conv2', conv(w1, planes, 3, 1, rng)],
        ['bn2', new BatchNorm2d({ numFeatures: planes, relu: true })],
      ],
      downsample ? ['downsample', downsample] : null,
    );
  }
}

/**
 * torchvision's Bottleneck (v1.5): 1x1 → 3x3 (stride) → 1x1 (x4), each with BN, plus the shortcut.
 * `widths` (`[conv1 outputs, conv2 outputs]`, default `[planes, planes]`) narrows the inner convolutions.
 */
export class Bottleneck extends Residual {
  static readonly expansion = 4;
  constructor(
    inplanes: number,
    planes: number,
    stride = 1,
    downsample: Module | null = null,
    rng: Random = new Random(),
    widths: readonly number[] = [planes, planes],
  ) {
    const [w1, w2] = widths as [number, number];
    super(
      [
        ['conv1', conv(inplanes, w1, 1, 1, rng)],
        ['bn1', new BatchNorm2d({ numFeatures: w1, relu: true })],
        ['conv2', conv(w1, w2, 3, stride, rng)],
        ['bn2', new BatchNorm2d({ numFeatures: w2, relu: true })],
        ['conv3', conv(w2, planes * 4, 1, 1, rng)],
        ['bn3', new BatchNorm2d({ numFeatures: planes * 4, relu: true })],
      ],
      downsample ? ['downsample', downsample] : null,
    );
  }
}

const BLOCKS: Record<'basic' | 'bottleneck', BlockType> = {
  basic: { expansion: 1, inner: 1, create: (i, p, s, d, r, w) => new BasicBlock(i, p, s, d, r, w) },
  bottleneck: { expansion: 4, inner: 2, create: (i, p, s, d, r, w) => new Bottleneck(i, p, s, d, r, w) },
};

/** Blocks per stage for each depth, as in torchvision. */
export const RESNET_DEPTHS = {
  18: { block: 'basic', layers: [2, 2, 2, 2] },
  34: { block: 'basic', layers: [3, 4, 6, 3] },
  50: { block: 'bottleneck', layers: [3, 4, 6, 3] },
  101: { block: 'bottleneck', layers: [3, 4, 23, 3] },
  152: { block: 'bottleneck', layers: [3, 8, 36, 3] },
} as const;

/** A supported depth. */
export type ResNetDepth = keyof typeof RESNET_DEPTHS;

/** torchvision's inner widths of every block of a depth (each stage's `planes`), as {@link ResNetOptions.blockWidths} lists them. */
export function defaultBlockWidths(depth: ResNetDepth): number[][] {
  const spec = RESNET_DEPTHS[depth];
  const inner = BLOCKS[spec.block].inner;
  return spec.layers.flatMap((blocks, stage) =>
    Array.from({ length: blocks }, () => new Array<number>(inner).fill(64 * 2 ** stage)),
  );
}

/** Checks {@link ResNetOptions.blockWidths} against a depth's blocks. */
function expectBlockWidths(depth: ResNetDepth, value: unknown): number[][] {
  const standard = defaultBlockWidths(depth);
  if (value === undefined) return standard;
  const inner = standard[0]!.length;
  const what = `${standard.length} arrays of ${inner} positive integer${inner > 1 ? 's' : ''} (one per block of ResNet-${depth})`;
  if (!isArray(value) || value.length !== standard.length) invalid('blockWidths', what, value);
  return value.map((w, b) => {
    if (!isArray(w) || w.length !== inner) {
      invalid(`blockWidths[${b}]`, `${inner} positive integer${inner > 1 ? 's' : ''}`, w);
    }
    return w.map((v, i) => expectInt(`blockWidths[${b}][${i}]`, v, 1, 2 ** 16));
  });
}

/**
 * A ResNet: stem, four stages, global average pooling and a linear classifier. Input is NHWC
 * `[N, H, W, 3]`; output logits `[N, numClasses]`. Its `backward` returns null: the input image
 * needs no gradient (set `requiresInputGrad = true` to get one).
 */
export class ResNet extends Chain {
  /** The depth (18, 34, 50, 101 or 152). */
  readonly depth: ResNetDepth;
  /** The number of output classes. */
  readonly numClasses: number;
  /** The inner widths of every block ({@link ResNetOptions.blockWidths}; torchvision's unless pruned). */
  readonly blockWidths: readonly (readonly number[])[];
  /** Whether {@link blockWidths} differ from torchvision's (a channel-pruned model). */
  readonly pruned: boolean;
  /** The width of the pooled features that `fc` reads: 512 (ResNet-18/34) or 2048 (ResNet-50/101/152). */
  readonly featureDim: number;
  /** Whether the last forward pass stopped at the pooled features (which has no backward). */
  #featuresOnly = false;

  constructor(depth: ResNetDepth, options: ResNetOptions = {}) {
    const o = expectOptions<ResNetOptions>('ResNet options', options, [
      'numClasses',
      'smallInput',
      'zeroInitResidual',
      'inChannels',
      'device',
      'seed',
      'blockWidths',
      'weights',
    ]);
    expectOneOf('depth', depth, [18, 34, 50, 101, 152] as const);
    const widths = expectBlockWidths(depth, o.blockWidths);
    const pretrained = o.weights === undefined ? undefined : readPretrained(o.weights);
    const numClasses = expectInt(
      'numClasses',
      o.numClasses ?? (pretrained ? classifierClasses(pretrained.state) : undefined) ?? 1000,
      1,
    );
    const smallInput = expectBool('smallInput', o.smallInput ?? false);
    const zeroInit = expectBool('zeroInitResidual', o.zeroInitResidual ?? false);
    const inChannels = expectInt('inChannels', o.inChannels ?? 3, 1);
    const rng = new Random(o.seed === undefined ? undefined : expectInt('seed', o.seed));
    const spec = RESNET_DEPTHS[depth];
    const block = BLOCKS[spec.block];

    const entries: [string, Module][] = [];
    entries.push([
      'conv1',
      smallInput
        ? conv(inChannels, 64, 3, 1, rng)
        : new Conv2d({ inChannels, outChannels: 64, kernelSize: 7, stride: 2, padding: 3 }),
    ]);
    entries.push(['bn1', new BatchNorm2d({ numFeatures: 64, relu: true })]);
    if (!smallInput) entries.push(['maxpool', new MaxPool2d({ kernelSize: 3, stride: 2, padding: 1 })]);
    let inplanes = 64;
    let index = 0;
    spec.layers.forEach((blocks, stage) => {
      const planes = 64 * 2 ** stage;
      const stride = stage === 0 ? 1 : 2;
      const layer: Module[] = [];
      for (let b = 0; b < blocks; b++) {
        const s = b === 0 ? stride : 1;
        let downsample: Module | null = null;
        if (b === 0 && (stride !== 1 || inplanes !== planes * block.expansion)) {
          downsample = new Sequential(
            conv(inplanes, planes * block.expansion, 1, stride, rng),
            new BatchNorm2d({ numFeatures: planes * block.expansion }),
          );
        }
        layer.push(block.create(inplanes, planes, s, downsample, rng, widths[index++]!));
        inplanes = planes * block.expansion;
      }
      entries.push([`layer${stage + 1}`, new Sequential(...layer)]);
    });
    entries.push(['avgpool', new AdaptiveAvgPool2d(1)]);
    entries.push(['flatten', new Flatten()]);
    entries.push([
      'fc',
      new Linear({
        inFeatures: 512 * block.expansion,
        outFeatures: numClasses,
        seed: Math.floor(rng.next() * 2 ** 31),
      }),
    ]);
    super(entries);
    this.depth = depth;
    this.numClasses = numClasses;
    this.blockWidths = Object.freeze(widths.map((w) => Object.freeze(w)));
    this.pruned = widths.flat().join(',') !== defaultBlockWidths(depth).flat().join(',');
    this.featureDim = 512 * block.expansion;
    this.requiresInputGrad = false;
    this.#initialise(rng, zeroInit);
    if (pretrained) loadPretrained(this, pretrained.state, pretrained.source);
    this.to(o.device ?? 'cpu');
  }

  /**
   * A torchinfo-style summary for `inputSize` images: per layer the output shape, parameters
   * (trainable and frozen), multiply-accumulates and activation bytes, and the totals; see {@link summary}.
   */
  summary(options: SummaryOptions): ModelSummary {
    return summary(this, options);
  }

  /**
   * Gradient checkpointing (`torch.utils.checkpoint.checkpoint_sequential`'s role): per stage
   * (`{ segments: 'stage' }`) or every k blocks (`{ segments: { every: k } }`), the activations
   * inside a segment are not kept after forward but recomputed in backward from the segment's
   * input, for less memory at the cost of a second forward of those blocks. Same gradients, loss
   * and running statistics as without. `false` turns it off. See `lib/nn/checkpoint.ts`.
   */
  checkpointing(options: CheckpointingOptions | false): this {
    setCheckpointing(this, options);
    return this;
  }

  override forward(x: Tensor): Tensor {
    const logits = super.forward(x);
    this.#featuresOnly = false;
    return logits;
  }

  /**
   * The pooled features of `x`: the output of the global average pooling, flattened, that `fc`
   * reads (`[N, featureDim]`, in `x`'s dtype), as torchvision's `forward` computes them before its
   * last line. Owned by the model and reused by the next forward, like any output (copy it to keep
   * it). A forward that stops here has no backward: `backward` after it is refused.
   */
  forwardFeatures(x: Tensor): Tensor {
    this.prepare(x, 'ResNet.forwardFeatures');
    const fc = this.getSubmodule('fc');
    let h = x;
    for (const m of this.modules) if (m !== fc) h = m.forward(h);
    this.#featuresOnly = true;
    return h;
  }

  override backward(gradOutput: Tensor): Tensor | null {
    if (this.#featuresOnly) {
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        'ResNet.backward() follows forwardFeatures(), which stops before fc and has no backward; run forward() for a training step',
      );
    }
    return super.backward(gradOutput);
  }

  /** torchvision's initialisation: He-normal (fan_out) convolutions, BN weight 1 and bias 0. */
  #initialise(rng: Random, zeroInitResidual: boolean): void {
    for (const [, m] of this.namedModules()) {
      if (m instanceof Conv2d) {
        const [kh, kw] = m.kernelSize;
        const std = Math.sqrt(2 / (m.outChannels * kh * kw));
        const values = new Float32Array(m.weight.numel);
        for (let i = 0; i < values.length; i++) values[i] = std * rng.normal();
        m.weight.setValues(values);
      }
    }
    if (zeroInitResidual) {
      for (const [, m] of this.namedModules()) {
        if (m instanceof Residual) {
          const bns = m.children().filter(([name, c]) => name.startsWith('bn') && c instanceof BatchNorm2d);
          const last = bns[bns.length - 1]?.[1] as BatchNorm2d | undefined;
          last?.weight.setValues(new Float32Array(last.numFeatures));
        }
      }
    }
  }
}

/** {@link ResNetOptions.weights}, read: the state dict and the words that name it in errors. */
function readPretrained(weights: unknown): { state: StateDict; source: string } {
  if (typeof weights === 'string' && weights.length > 0) {
    return { state: readWeightsFile(weights), source: `'${weights}'` };
  }
  if (weights instanceof Map) return { state: weights as StateDict, source: 'the state dict given' };
  return invalid('weights', 'the path of a .pth, .pt or .safetensors file, or a state dict', weights);
}

/** ResNet-18 (11,689,512 parameters with 1000 classes). */
export function ResNet18(options: ResNetOptions = {}): ResNet {
  return new ResNet(18, options);
}
/** ResNet-34 (21,797,672 parameters with 1000 classes). */
export function ResNet34(options: ResNetOptions = {}): ResNet {
  return new ResNet(34, options);
}
/** ResNet-50 (25,557,032 parameters with 1000 classes). */
export function ResNet50(options: ResNetOptions = {}): ResNet {
  return new ResNet(50, options);
}
/** ResNet-101 (44,549,160 parameters with 1000 classes). */
export function ResNet101(options: ResNetOptions = {}): ResNet {
  return new ResNet(101, options);
}
/** ResNet-152 (60,192,808 parameters with 1000 classes). */
export function ResNet152(options: ResNetOptions = {}): ResNet {
  return new ResNet(152, options);
}
