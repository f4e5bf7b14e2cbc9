/**
 * What every op case needs: typed uploads and downloads of native tensors, NaN-poisoned outputs,
 * comparisons that throw self-explaining errors, and cleanup. No test framework here, so the
 * vitest suite and the plain Node runner share it.
 * @packageDocumentation
 */
import { addon, type DTypeName, type RawAddon, type RawTensor } from '../../lib/binding.js';
import {
  bf16BitsToF32,
  f16BitsToF32,
  f32ToBf16Bits,
  f32ToF16Bits,
  freshSeed,
  quantize,
  relError,
  Rng,
  worstElement,
  type FloatFormat,
} from '../reference/index.js';

/** Where and how one case runs. */
export interface CaseContext {
  /** A device string the addon accepts: `cpu`, `cuda`, `cuda:N`. */
  device: string;
  dtype: DTypeName;
  /** Seeds every random input of the case; failures print it. */
  seed: number;
}

/** One row of the op table: `run` throws an Error explaining the failure, or returns. */
export interface OpCase {
  name: string;
  dtypes: DTypeName[];
  run(ctx: CaseContext): void;
}

/** A device-independent check of the float64 reference itself. */
export interface GradientCheck {
  name: string;
  run(ctx: { seed: number }): void;
}

/**
 * Largest accepted ‖out − ref‖/‖ref‖ per output dtype. bf16 keeps 8 significant bits (half an
 * ulp is 2^-9 ≈ 2e-3 relative), so 1e-2 leaves room for a few roundings of intermediates;
 * f16 keeps 11 (2^-12 ≈ 2.4e-4).
 */
export const TOLERANCE: Readonly<Record<FloatFormat, number>> = { f32: 1e-5, bf16: 1e-2, f16: 2e-3 };

/** The tolerance for outputs of a floating dtype. */
export function tolerance(dtype: DTypeName): number {
  if (dtype === 'f32' || dtype === 'bf16' || dtype === 'f16') return TOLERANCE[dtype];
  throw new Error(`no tolerance for dtype ${dtype}`);
}

/** The dtype as a float format the reference can round to. */
export function floatFormat(dtype: DTypeName): FloatFormat {
  if (dtype === 'f32' || dtype === 'bf16' || dtype === 'f16') return dtype;
  throw new Error(`${dtype} is not a floating dtype`);
}

/**
 * The seed of this run: `RESNET_TEST_SEED` from the environment when set (to replay a failure), else a
 * fresh one, so every run tries new inputs.
 */
export function suiteSeed(): number {
  const fixed = process.env.RESNET_TEST_SEED;
  if (fixed !== undefined && fixed !== '') {
    const seed = Number(fixed);
    if (!Number.isInteger(seed) || seed < 0 || seed > 0xffffffff) {
      throw new Error(`RESNET_TEST_SEED must be a 32-bit unsigned integer, got '${fixed}'`);
    }
    return seed;
  }
  return freshSeed();
}

/** The error a failing case throws: its message names op, shapes, dtype, device and seed. */
export class OpCheckError extends Error {
  override name = 'OpCheckError';
}

/** Host memory for a tensor's elements, in its stored representation. */
export type HostArray = Float32Array | Uint16Array | Int32Array | Uint8Array | BigInt64Array;

function hostArray(dtype: DTypeName, count: number): HostArray {
  switch (dtype) {
    case 'f32':
      return new Float32Array(count);
    case 'bf16':
    case 'f16':
      return new Uint16Array(count);
    case 'i32':
      return new Int32Array(count);
    case 'i64':
      return new BigInt64Array(count);
    case 'u8':
      return new Uint8Array(count);
  }
}

/** Host bytes holding `values` as `dtype` (floats rounded to nearest even, as native rounds). */
export function encode(dtype: DTypeName, values: ArrayLike<number>): HostArray {
  const out = hostArray(dtype, values.length);
  for (let i = 0; i < values.length; ++i) {
    const v = values[i]!;
    if (out instanceof BigInt64Array) out[i] = BigInt(v);
    else if (dtype === 'bf16') out[i] = f32ToBf16Bits(v);
    else if (dtype === 'f16') out[i] = f32ToF16Bits(v);
    else out[i] = v;
  }
  return out;
}

/** Stored elements of `dtype` as numbers. */
export function decode(dtype: DTypeName, raw: HostArray): Float64Array {
  const out = new Float64Array(raw.length);
  for (let i = 0; i < raw.length; ++i) {
    if (raw instanceof BigInt64Array) out[i] = Number(raw[i]!);
    else if (dtype === 'bf16') out[i] = bf16BitsToF32(raw[i]!);
    else if (dtype === 'f16') out[i] = f16BitsToF32(raw[i]!);
    else out[i] = raw[i]!;
  }
  return out;
}

function numel(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

/** `[2,3,4]`. */
export function fmtShape(shape: readonly number[]): string {
  return `[${shape.join(',')}]`;
}

/**
 * One run of one case: owns the random generator and every native object it creates, and turns
 * mismatches into {@link OpCheckError}s that carry the case's identity.
 */
export class Session {
  readonly rng: Rng;
  readonly native: RawAddon;
  private readonly owned: { dispose(): void }[] = [];

  constructor(
    readonly ctx: CaseContext,
    readonly op: string,
    readonly shapes: string,
  ) {
    this.rng = new Rng(ctx.seed);
    this.native = addon();
  }

  /** The values a `dtype` tensor would store for `values`, rounded as the upload rounds them. */
  q(values: ArrayLike<number>, dtype: DTypeName = this.ctx.dtype): Float64Array {
    return quantize(values, floatFormat(dtype));
  }

  /** "op shapes dtype=… device=… seed=…", the prefix of every failure message. */
  describe(): string {
    const { device, dtype, seed } = this.ctx;
    return `${this.op} ${this.shapes} dtype=${dtype} device=${device} seed=${seed}`;
  }

  /** A new tensor on the case's device, holding `values` if given (else uninitialised). */
  tensor(shape: readonly number[], dtype: DTypeName = this.ctx.dtype, values?: ArrayLike<number>): RawTensor {
    const t = this.own(new this.native.NativeTensor({ shape: [...shape], dtype, device: this.ctx.device }));
    if (values !== undefined) {
      if (values.length !== numel(shape)) throw new Error(`tensor ${fmtShape(shape)}: ${values.length} values`);
      t.copyFromHost(encode(dtype, values));
    }
    return t;
  }

  /** A float tensor filled with NaN, so that an op that skips an element it must write is caught. */
  poisoned(shape: readonly number[], dtype: DTypeName = this.ctx.dtype): RawTensor {
    return this.tensor(shape, dtype, new Float64Array(numel(shape)).fill(NaN));
  }

  /** Registers a plan or tensor for disposal at the end of the case. */
  own<T extends { dispose(): void }>(thing: T): T {
    this.owned.push(thing);
    return thing;
  }

  /** The tensor's contents as numbers, after the device has finished. */
  read(t: RawTensor): Float64Array {
    return decode(t.dtype, this.readRaw(t));
  }

  /** The tensor's contents as stored: Float32Array, Uint16Array (bf16/f16 bits), Int32Array, … */
  readRaw(t: RawTensor): HostArray {
    this.native.synchronize({ device: this.ctx.device });
    const raw = hostArray(t.dtype, numel(t.shape));
    t.copyToHost(raw);
    return raw;
  }

  /** Throws unless ‖out − ref‖/‖ref‖ ≤ tol. */
  check(what: string, out: ArrayLike<number>, ref: ArrayLike<number>, tol: number): void {
    if (out.length !== ref.length) this.fail(`${what}: ${out.length} elements, expected ${ref.length}`);
    const err = relError(out, ref);
    // OPS_VERBOSE=1 prints every measured error, to see how close each case runs to its tolerance.
    if (process.env.OPS_VERBOSE) {
      console.log(`  ${this.describe()} ${what}: ${err.toExponential(2)} (tol ${tol.toExponential(0)})`);
    }
    if (!(err <= tol)) {
      const w = worstElement(out, ref);
      this.fail(
        `${what}: relative error ${err.toExponential(3)} exceeds tolerance ${tol.toExponential(1)} ` +
          `(worst element [${w.index}]: got ${w.out}, expected ${w.ref})`,
      );
    }
  }

  /**
   * For inputs holding NaN and ±inf: every element the reference makes NaN or infinite must be
   * exactly that (a NaN must not turn into a number, nor a number into NaN), and the finite rest
   * must agree within `tol` as in {@link check}.
   */
  checkSpecials(what: string, out: ArrayLike<number>, ref: ArrayLike<number>, tol: number): void {
    if (out.length !== ref.length) this.fail(`${what}: ${out.length} elements, expected ${ref.length}`);
    const finiteOut: number[] = [];
    const finiteRef: number[] = [];
    for (let i = 0; i < ref.length; ++i) {
      const o = out[i]!;
      const r = ref[i]!;
      if (Number.isFinite(r) !== Number.isFinite(o) || (!Number.isFinite(r) && !Object.is(o, r))) {
        this.fail(`${what}: element [${i}] is ${o}, expected ${r}`);
      }
      if (Number.isFinite(r)) {
        finiteOut.push(o);
        finiteRef.push(r);
      }
    }
    this.check(`${what} (finite elements)`, finiteOut, finiteRef, tol);
  }

  /** Throws unless out and ref are identical element by element (NaN equals NaN). */
  checkExact(what: string, out: ArrayLike<number>, ref: ArrayLike<number>): void {
    if (out.length !== ref.length) this.fail(`${what}: ${out.length} elements, expected ${ref.length}`);
    for (let i = 0; i < ref.length; ++i) {
      if (!Object.is(out[i], ref[i]) && !(out[i] === 0 && ref[i] === 0)) {
        this.fail(`${what}: element [${i}] is ${out[i]}, expected exactly ${ref[i]}`);
      }
    }
  }

  /** Throws unless `fn` throws an Error whose `.code` is `code`. */
  expectThrow(what: string, code: string, fn: () => void): void {
    try {
      fn();
    } catch (error) {
      const got = (error as { code?: unknown }).code;
      if (got === code) return;
      this.fail(
        `${what}: expected an error with code ${code}, got ${String(got)}: ${(error as Error).message ?? String(error)}`,
      );
    }
    this.fail(`${what}: expected an error with code ${code}, but the call succeeded`);
  }

  /** Throws an {@link OpCheckError} prefixed with this case's identity. */
  fail(message: string): never {
    throw new OpCheckError(`${this.describe()}: ${message} [replay: RESNET_TEST_SEED=${this.ctx.seed}]`);
  }

  /** Disposes everything the case created, newest first. */
  dispose(): void {
    for (let i = this.owned.length - 1; i >= 0; --i) this.owned[i]!.dispose();
    this.owned.length = 0;
  }
}

/**
 * Runs `body` in a fresh session; errors that are not already {@link OpCheckError}s (a native
 * op throwing, say) are rethrown with the case's identity in front.
 */
export function session(ctx: CaseContext, op: string, shapes: string, body: (s: Session) => void): void {
  const s = new Session(ctx, op, shapes);
  try {
    body(s);
  } catch (error) {
    if (error instanceof OpCheckError) throw error;
    const e = error as Error & { code?: string };
    const wrapped = new OpCheckError(
      `${s.describe()}: unexpected error${e.code ? ` ${e.code}` : ''}: ${e.message ?? String(error)} [replay: RESNET_TEST_SEED=${ctx.seed}]`,
      { cause: error },
    );
    throw wrapped;
  } finally {
    s.dispose();
  }
}
