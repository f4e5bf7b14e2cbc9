// The emulated cuDNN (see cudnn.h for what it validates and which algorithms it provides).
//
// A convolution is computed on dense copies of its operands: the input (or output gradient) is
// gathered into an NHWC array of float (double for DOUBLE data), the filter into a KRSC array
// (spatially flipped for CUDNN_CONVOLUTION), products are summed in double precision, and the
// result is blended into the destination as alpha * result + beta * destination.
#include <cudnn.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "dnn_errors.h"
#include "parallel.h"
#include "rc_emu/numeric.h"

struct cudnnContext {
  cudaStream_t stream = nullptr;
};

struct cudnnTensorStruct {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int n = 0, c = 0, h = 0, w = 0;
  int64_t ns = 0, cs = 0, hs = 0, ws = 0;  // strides in elements
  bool vectorized = false;                 // CUDNN_TENSOR_NCHW_VECT_C
};

struct cudnnFilterStruct {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW;
  int k = 0, c = 0, h = 0, w = 0;
};

struct cudnnConvolutionStruct {
  bool set = false;
  int padH = 0, padW = 0, strideH = 1, strideW = 1, dilationH = 1, dilationW = 1;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  cudnnDataType_t computeType = CUDNN_DATA_FLOAT;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  int groups = 1;
};

namespace {

// ---- errors -----------------------------------------------------------------------------------

thread_local std::string tLastError;

cudnnStatus_t fail(cudnnStatus_t status, const std::string& message) {
  tLastError = message;
  return status;
}

cudnnStatus_t ok() { return CUDNN_STATUS_SUCCESS; }

// ---- data types -------------------------------------------------------------------------------

bool isDataTypeEnumerant(cudnnDataType_t t) {
  return static_cast<int>(t) >= CUDNN_DATA_FLOAT && static_cast<int>(t) <= CUDNN_DATA_UINT32;
}

size_t elementSize(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_DOUBLE:
    case CUDNN_DATA_INT64: return 8;
    case CUDNN_DATA_FLOAT:
    case CUDNN_DATA_INT32:
    case CUDNN_DATA_INT8x4:
    case CUDNN_DATA_UINT8x4:
    case CUDNN_DATA_UINT32: return 4;
    case CUDNN_DATA_HALF:
    case CUDNN_DATA_BFLOAT16: return 2;
    case CUDNN_DATA_INT8x32: return 32;
    default: return 1;
  }
}

const char* typeName(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_FLOAT: return "FLOAT";
    case CUDNN_DATA_DOUBLE: return "DOUBLE";
    case CUDNN_DATA_HALF: return "HALF";
    case CUDNN_DATA_BFLOAT16: return "BFLOAT16";
    case CUDNN_DATA_INT8: return "INT8";
    case CUDNN_DATA_INT32: return "INT32";
    default: return "an integer or 8-bit type";
  }
}

// TF32 keeps 10 of f32's 23 mantissa bits; the conversion rounds to nearest, ties away from zero.
float roundToTf32(float v) {
  if (!std::isfinite(v)) return v;
  uint32_t bits = rc_emu::floatBits(v);
  bits = (bits + 0x1000u) & ~0x1fffu;
  return rc_emu::bitsToFloat(bits);
}

template <typename T>
T loadElement(cudnnDataType_t type, const void* base, int64_t offset) {
  switch (type) {
    case CUDNN_DATA_FLOAT: return static_cast<T>(static_cast<const float*>(base)[offset]);
    case CUDNN_DATA_DOUBLE: return static_cast<T>(static_cast<const double*>(base)[offset]);
    case CUDNN_DATA_HALF: return static_cast<T>(rc_emu::halfBitsToFloat(static_cast<const uint16_t*>(base)[offset]));
    case CUDNN_DATA_BFLOAT16:
      return static_cast<T>(rc_emu::bf16BitsToFloat(static_cast<const uint16_t*>(base)[offset]));
    default: return T(0);
  }
}

void storeElement(cudnnDataType_t type, void* base, int64_t offset, double v) {
  switch (type) {
    case CUDNN_DATA_FLOAT: static_cast<float*>(base)[offset] = static_cast<float>(v); break;
    case CUDNN_DATA_DOUBLE: static_cast<double*>(base)[offset] = v; break;
    case CUDNN_DATA_HALF: static_cast<uint16_t*>(base)[offset] = rc_emu::floatToHalfBits(static_cast<float>(v)); break;
    case CUDNN_DATA_BFLOAT16:
      static_cast<uint16_t*>(base)[offset] = rc_emu::floatToBf16Bits(static_cast<float>(v));
      break;
    default: break;
  }
}

// ---- descriptors as the computation sees them --------------------------------------------------

struct Tensor4 {
  cudnnDataType_t type;
  int n, c, h, w;
  int64_t ns, cs, hs, ws;
  int64_t offset(int64_t in, int64_t ic, int64_t ih, int64_t iw) const { return in * ns + ic * cs + ih * hs + iw * ws; }
  // Bytes from the first to one past the last element.
  size_t extentBytes() const {
    const int64_t last = (n - 1) * ns + (c - 1) * cs + (h - 1) * hs + (w - 1) * ws;
    return static_cast<size_t>(last + 1) * elementSize(type);
  }
};

struct Filter4 {
  cudnnDataType_t type;
  cudnnTensorFormat_t format;
  int k, c, r, s;
  int64_t offset(int64_t ik, int64_t ic, int64_t ir, int64_t is) const {
    if (format == CUDNN_TENSOR_NHWC) return ((ik * r + ir) * s + is) * c + ic;  // KRSC
    return ((ik * c + ic) * r + ir) * s + is;                                   // KCRS
  }
  size_t bytes() const { return static_cast<size_t>(k) * c * r * s * elementSize(type); }
};

// One convolution problem, validated.
struct Problem {
  Tensor4 x, y;  // input and output (y is dy for the backward passes)
  Filter4 w;
  int N, C, H, W, K, R, S, P, Q, G, Cg, Kg;
  int padH, padW, strideH, strideW, dilationH, dilationW;
  bool flip;  // CUDNN_CONVOLUTION: the filter is applied mirrored
  cudnnDataType_t type;
  cudnnDataType_t computeType;
  cudnnMathType_t math;
  bool tf32;  // f32 inputs rounded to TF32
  bool doubleCompute;
  double flops;
  size_t accumulatorBytes() const { return doubleCompute ? 8 : 4; }
};

Tensor4 toTensor4(const cudnnTensorStruct& d) { return Tensor4{d.type, d.n, d.c, d.h, d.w, d.ns, d.cs, d.hs, d.ws}; }

Filter4 toFilter4(const cudnnFilterStruct& d) { return Filter4{d.type, d.format, d.k, d.c, d.h, d.w}; }

int outputSize(int input, int pad, int filter, int dilation, int stride) {
  return 1 + (input + 2 * pad - ((filter - 1) * dilation + 1)) / stride;
}

// Which statuses a mismatch produces: the documentation of each call differs.
struct MismatchStatuses {
  cudnnStatus_t outputSpatial;  // the output's spatial size is not the computed one
  cudnnStatus_t groupChannels;  // the output channels are not a multiple of the group count
};

// Validates descriptors shared by the three passes. `x` is the input (dx for backward data), `y`
// the output (dy for the backward passes).
cudnnStatus_t makeProblem(const char* call, const cudnnTensorStruct* x, const cudnnFilterStruct* w,
                          const cudnnConvolutionStruct* conv, const cudnnTensorStruct* y, MismatchStatuses statuses,
                          Problem* out) {
  const std::string where = std::string(call) + ": ";
  if (x == nullptr || w == nullptr || conv == nullptr || y == nullptr) {
    return fail(CUDNN_STATUS_BAD_PARAM, where + "a descriptor is null");
  }
  if (!x->set || !y->set) return fail(CUDNN_STATUS_BAD_PARAM, where + "a tensor descriptor was never set");
  if (!w->set) return fail(CUDNN_STATUS_BAD_PARAM, where + "the filter descriptor was never set");
  if (!conv->set) return fail(CUDNN_STATUS_BAD_PARAM, where + "the convolution descriptor was never set");
  if (x->type != y->type || x->type != w->type) {
    return fail(CUDNN_STATUS_BAD_PARAM, where + "the tensors and the filter have different data types (" +
                                            typeName(x->type) + ", " + typeName(y->type) + ", " + typeName(w->type) +
                                            ")");
  }
  const int G = conv->groups;
  if (x->c != w->c * G) {
    return fail(CUDNN_STATUS_BAD_PARAM, where + "the input has " + std::to_string(x->c) +
                                            " channels but the filter has " + std::to_string(w->c) +
                                            " per group with " + std::to_string(G) + " group(s)");
  }
  if (w->k % G != 0) {
    return fail(statuses.groupChannels, where + "the filter's " + std::to_string(w->k) +
                                            " output channels are not a multiple of the group count " +
                                            std::to_string(G));
  }
  if (y->n != x->n) {
    return fail(CUDNN_STATUS_BAD_PARAM,
                where + "batch sizes differ: " + std::to_string(x->n) + " and " + std::to_string(y->n));
  }
  if (y->c != w->k) {
    return fail(CUDNN_STATUS_BAD_PARAM, where + "the output has " + std::to_string(y->c) +
                                            " channels but the filter has " + std::to_string(w->k) + " outputs");
  }
  const int dilatedR = (w->h - 1) * conv->dilationH + 1, dilatedS = (w->w - 1) * conv->dilationW + 1;
  if (dilatedR > x->h + 2 * conv->padH || dilatedS > x->w + 2 * conv->padW) {
    return fail(CUDNN_STATUS_BAD_PARAM, where + "the (dilated) filter is larger than the padded input");
  }
  const int P = outputSize(x->h, conv->padH, w->h, conv->dilationH, conv->strideH);
  const int Q = outputSize(x->w, conv->padW, w->w, conv->dilationW, conv->strideW);
  if (y->h != P || y->w != Q) {
    return fail(statuses.outputSpatial, where + "the output is " + std::to_string(y->h) + "x" + std::to_string(y->w) +
                                            " but the convolution produces " + std::to_string(P) + "x" +
                                            std::to_string(Q));
  }
  if (x->vectorized || y->vectorized || w->format == CUDNN_TENSOR_NCHW_VECT_C) {
    return fail(CUDNN_STATUS_NOT_SUPPORTED, where + "CUDNN_TENSOR_NCHW_VECT_C layouts are not emulated");
  }
  for (const cudnnTensorStruct* t : {x, y}) {
    if (t->ns < 0 || t->cs < 0 || t->hs < 0 || t->ws < 0) {
      return fail(CUDNN_STATUS_NOT_SUPPORTED, where + "negative tensor strides are not supported");
    }
  }
  // The supported configurations: PSEUDO_HALF, TRUE_HALF, PSEUDO_BFLOAT16, FLOAT and DOUBLE.
  const cudnnDataType_t t = x->type, ct = conv->computeType;
  const bool supported = (t == CUDNN_DATA_FLOAT && ct == CUDNN_DATA_FLOAT) ||
                         (t == CUDNN_DATA_HALF && (ct == CUDNN_DATA_FLOAT || ct == CUDNN_DATA_HALF)) ||
                         (t == CUDNN_DATA_BFLOAT16 && ct == CUDNN_DATA_FLOAT) ||
                         (t == CUDNN_DATA_DOUBLE && ct == CUDNN_DATA_DOUBLE);
  if (!supported) {
    return fail(CUDNN_STATUS_NOT_SUPPORTED, where + std::string("data type ") + typeName(t) + " with compute type " +
                                                typeName(ct) + " is not a supported configuration (or not emulated)");
  }
  Problem p{};
  p.x = toTensor4(*x);
  p.y = toTensor4(*y);
  p.w = toFilter4(*w);
  p.N = x->n;
  p.C = x->c;
  p.H = x->h;
  p.W = x->w;
  p.K = w->k;
  p.R = w->h;
  p.S = w->w;
  p.P = P;
  p.Q = Q;
  p.G = G;
  p.Cg = w->c;
  p.Kg = w->k / G;
  p.padH = conv->padH;
  p.padW = conv->padW;
  p.strideH = conv->strideH;
  p.strideW = conv->strideW;
  p.dilationH = conv->dilationH;
  p.dilationW = conv->dilationW;
  p.flip = conv->mode == CUDNN_CONVOLUTION;
  p.type = t;
  p.computeType = ct;
  p.math = conv->math;
  p.tf32 = t == CUDNN_DATA_FLOAT && conv->math != CUDNN_FMA_MATH;
  p.doubleCompute = ct == CUDNN_DATA_DOUBLE;
  p.flops = 2.0 * p.N * p.K * p.P * p.Q * static_cast<double>(p.Cg) * p.R * p.S;
  *out = p;
  return ok();
}

// ---- algorithms -------------------------------------------------------------------------------

enum class Pass { Forward, BackwardData, BackwardFilter };

const char* passName(Pass pass) {
  switch (pass) {
    case Pass::Forward: return "forward";
    case Pass::BackwardData: return "backward data";
    default: return "backward filter";
  }
}

int algorithmCount(Pass pass) {
  switch (pass) {
    case Pass::Forward: return CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
    case Pass::BackwardData: return CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
    default: return CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  }
}

// Algorithms 0 and 1 of each pass are emulated (see cudnn.h).
bool emulated(int algo) { return algo == 0 || algo == 1; }

// Backward filter algorithm 1 splits the batch into groups of kImagesPerSplit images, keeps each
// group's partial filter gradient in the workspace and adds them up: its workspace grows with the
// batch, as it does for several of cuDNN's algorithms.
constexpr int kImagesPerSplit = 8;
int filterSplits(const Problem& p) { return (p.N + kImagesPerSplit - 1) / kImagesPerSplit; }

size_t workspaceBytes(const Problem& p, Pass pass, int algo) {
  if (algo != 1) return 0;
  switch (pass) {
    case Pass::Forward: return sizeof(int32_t) * static_cast<size_t>(p.P) * p.Q * p.R * p.S;
    case Pass::BackwardData: return p.accumulatorBytes() * static_cast<size_t>(p.H) * p.W * p.C;
    default: return p.accumulatorBytes() * static_cast<size_t>(filterSplits(p)) * p.K * p.R * p.S * p.Cg;
  }
}

cudnnDeterminism_t determinism(Pass pass, int algo) {
  // Algorithm 0 of the backward passes accumulates with atomics on the device.
  return pass != Pass::Forward && algo == 0 ? CUDNN_NON_DETERMINISTIC : CUDNN_DETERMINISTIC;
}

// The time an algorithm is claimed to take: a nominal throughput, higher for the algorithm that
// uses a workspace, so that the search prefers it when it fits.
float claimedMilliseconds(const Problem& p, int algo) {
  const double teraflops = algo == 1 ? 80.0 : 50.0;
  return static_cast<float>(0.005 + p.flops / (teraflops * 1e12) * 1e3);
}

// Checks the algorithm and the workspace of a compute call.
cudnnStatus_t checkAlgorithm(const char* call, const Problem& p, Pass pass, int algo, const void* workspace,
                             size_t workspaceSize, size_t* required) {
  const std::string where = std::string(call) + ": ";
  if (algo < 0 || algo >= algorithmCount(pass)) {
    return fail(CUDNN_STATUS_BAD_PARAM,
                where + "algorithm " + std::to_string(algo) + " is not a " + passName(pass) + " algorithm");
  }
  if (!emulated(algo)) {
    return fail(CUDNN_STATUS_NOT_SUPPORTED,
                where + "algorithm " + std::to_string(algo) + " is not emulated (only algorithms 0 and 1 are)");
  }
  *required = workspaceBytes(p, pass, algo);
  if (workspaceSize < *required) {
    return fail(CUDNN_STATUS_BAD_PARAM, where + "algorithm " + std::to_string(algo) + " needs " +
                                            std::to_string(*required) + " bytes of workspace, " +
                                            std::to_string(workspaceSize) + " were given");
  }
  if (workspaceSize > 0 && (workspace == nullptr || !rc_emu::isDeviceRange(workspace, workspaceSize))) {
    return fail(CUDNN_STATUS_BAD_PARAM,
                where + "the workspace is not " + std::to_string(workspaceSize) + " bytes of device memory");
  }
  return ok();
}

cudnnStatus_t checkDeviceData(const char* call, const char* what, const void* p, size_t bytes) {
  if (p == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": " + what + " is null");
  if (!rc_emu::isDeviceRange(p, bytes)) {
    return fail(CUDNN_STATUS_BAD_PARAM,
                std::string(call) + ": " + what + " is not " + std::to_string(bytes) + " bytes of device memory");
  }
  return ok();
}

// alpha and beta: double for DOUBLE data, float otherwise, read from host memory now.
cudnnStatus_t readScaling(const char* call, const Problem& p, const void* alpha, const void* beta, double* a,
                          double* b) {
  if (alpha == nullptr || beta == nullptr) {
    return fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": alpha or beta is null");
  }
  if (p.type == CUDNN_DATA_DOUBLE) {
    *a = *static_cast<const double*>(alpha);
    *b = *static_cast<const double*>(beta);
  } else {
    *a = *static_cast<const float*>(alpha);
    *b = *static_cast<const float*>(beta);
  }
  return ok();
}

cudnnStatus_t queue(cudaStream_t stream, std::function<void()> op, const char* call) {
  // cuDNN's kernels run on the current device, which must be the handle's stream's.
  cudaError_t e = rc_emu::checkLaunchDevice(stream);
  if (e == cudaSuccess) e = rc_emu::enqueue(stream, std::move(op), call);
  if (e != cudaSuccess) {
    return fail(CUDNN_STATUS_EXECUTION_FAILED,
                std::string(call) + ": the work could not be queued (CUDA error " + std::to_string(e) + ")");
  }
  return ok();
}

// ---- the computations (run when the stream runs) ----------------------------------------------

// Input [N][H][W][C] (or the output gradient [N][P][Q][K]) gathered from a tensor.
template <typename T>
std::vector<T> gatherTensor(const Tensor4& t, const void* base, bool tf32) {
  std::vector<T> out(static_cast<size_t>(t.n) * t.h * t.w * t.c);
  size_t i = 0;
  for (int n = 0; n < t.n; ++n) {
    for (int h = 0; h < t.h; ++h) {
      for (int w = 0; w < t.w; ++w) {
        for (int c = 0; c < t.c; ++c) {
          T v = loadElement<T>(t.type, base, t.offset(n, c, h, w));
          if (tf32) v = static_cast<T>(roundToTf32(static_cast<float>(v)));
          out[i++] = v;
        }
      }
    }
  }
  return out;
}

// The filter as [K][R][S][Cg], mirrored for CUDNN_CONVOLUTION.
template <typename T>
std::vector<T> gatherFilter(const Problem& p, const void* base) {
  std::vector<T> out(static_cast<size_t>(p.K) * p.R * p.S * p.Cg);
  size_t i = 0;
  for (int k = 0; k < p.K; ++k) {
    for (int r = 0; r < p.R; ++r) {
      for (int s = 0; s < p.S; ++s) {
        for (int c = 0; c < p.Cg; ++c) {
          const int fr = p.flip ? p.R - 1 - r : r, fs = p.flip ? p.S - 1 - s : s;
          T v = loadElement<T>(p.w.type, base, p.w.offset(k, c, fr, fs));
          if (p.tf32) v = static_cast<T>(roundToTf32(static_cast<float>(v)));
          out[i++] = v;
        }
      }
    }
  }
  return out;
}

// dst = alpha * dense + beta * dst over a tensor; dst is not read when beta == 0.
void blendTensor(const Tensor4& t, void* base, const double* dense, double alpha, double beta) {
  size_t i = 0;
  for (int n = 0; n < t.n; ++n) {
    for (int h = 0; h < t.h; ++h) {
      for (int w = 0; w < t.w; ++w) {
        for (int c = 0; c < t.c; ++c) {
          const int64_t off = t.offset(n, c, h, w);
          double v = alpha * dense[i++];
          if (beta != 0.0) v += beta * loadElement<double>(t.type, base, off);
          storeElement(t.type, base, off, v);
        }
      }
    }
  }
}

// The input pixel (ih * W + iw) that filter tap (r, s) of output (oh, ow) reads, or -1 in padding.
int64_t inputPixel(const Problem& p, int oh, int ow, int r, int s) {
  const int ih = oh * p.strideH - p.padH + r * p.dilationH;
  const int iw = ow * p.strideW - p.padW + s * p.dilationW;
  if (ih < 0 || ih >= p.H || iw < 0 || iw >= p.W) return -1;
  return static_cast<int64_t>(ih) * p.W + iw;
}

// y[n][p][q][k] (dense) = sum over taps and input channels of the group.
template <typename T>
void forwardSums(const Problem& p, const T* X, const T* Wd, const int32_t* table, double* out) {
  const int64_t rows = static_cast<int64_t>(p.N) * p.P;
  rc_emu::parallelFor(rows, p.flops / std::max<int64_t>(rows, 1), [&](int64_t row) {
    const int n = static_cast<int>(row / p.P), oh = static_cast<int>(row % p.P);
    std::vector<double> acc(p.K);
    for (int ow = 0; ow < p.Q; ++ow) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int r = 0; r < p.R; ++r) {
        for (int s = 0; s < p.S; ++s) {
          const int64_t pixel = table != nullptr ? table[((static_cast<int64_t>(oh) * p.Q + ow) * p.R + r) * p.S + s]
                                                 : inputPixel(p, oh, ow, r, s);
          if (pixel < 0) continue;
          const T* xp = X + (static_cast<int64_t>(n) * p.H * p.W + pixel) * p.C;
          for (int k = 0; k < p.K; ++k) {
            const T* xg = xp + static_cast<int64_t>(k / p.Kg) * p.Cg;
            const T* wp = Wd + ((static_cast<int64_t>(k) * p.R + r) * p.S + s) * p.Cg;
            double sum = 0.0;
            for (int c = 0; c < p.Cg; ++c) sum += static_cast<double>(xg[c]) * static_cast<double>(wp[c]);
            acc[k] += sum;
          }
        }
      }
      std::copy(acc.begin(), acc.end(), out + (row * p.Q + ow) * p.K);
    }
  });
}

// dx[n][ih][iw][c] (dense) for images [n0, n1): every output position that read the pixel.
template <typename T>
void backwardDataSums(const Problem& p, const T* DY, const T* Wt, int n0, int n1, double* out) {
  const int64_t rows = static_cast<int64_t>(n1 - n0) * p.H;
  rc_emu::parallelFor(rows, p.flops / std::max<int64_t>(static_cast<int64_t>(p.N) * p.H, 1), [&](int64_t row) {
    const int n = n0 + static_cast<int>(row / p.H), ih = static_cast<int>(row % p.H);
    std::vector<double> acc(p.C);
    for (int iw = 0; iw < p.W; ++iw) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int r = 0; r < p.R; ++r) {
        const int th = ih + p.padH - r * p.dilationH;
        if (th < 0 || th % p.strideH != 0) continue;
        const int oh = th / p.strideH;
        if (oh >= p.P) continue;
        for (int s = 0; s < p.S; ++s) {
          const int tw = iw + p.padW - s * p.dilationW;
          if (tw < 0 || tw % p.strideW != 0) continue;
          const int ow = tw / p.strideW;
          if (ow >= p.Q) continue;
          const T* dyp = DY + ((static_cast<int64_t>(n) * p.P + oh) * p.Q + ow) * p.K;
          for (int ci = 0; ci < p.C; ++ci) {
            const int g = ci / p.Cg, cg = ci % p.Cg;
            const T* dg = dyp + static_cast<int64_t>(g) * p.Kg;
            const T* wp = Wt + ((((static_cast<int64_t>(g) * p.R + r) * p.S + s) * p.Cg) + cg) * p.Kg;
            double sum = 0.0;
            for (int kg = 0; kg < p.Kg; ++kg) sum += static_cast<double>(dg[kg]) * static_cast<double>(wp[kg]);
            acc[ci] += sum;
          }
        }
      }
      std::copy(acc.begin(), acc.end(), out + ((row * p.W) + iw) * p.C);
    }
  });
}

// dw[k][r][s][c] (dense, unmirrored taps) = sum over images and output positions.
template <typename T>
void backwardFilterSums(const Problem& p, const T* X, const T* DY, double* out, int n0, int n1) {
  rc_emu::parallelFor(p.K, p.flops / std::max(p.K, 1), [&](int64_t k) {
    const int64_t g = k / p.Kg;
    std::vector<double> acc(p.Cg);
    for (int r = 0; r < p.R; ++r) {
      for (int s = 0; s < p.S; ++s) {
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int n = n0; n < n1; ++n) {
          for (int oh = 0; oh < p.P; ++oh) {
            const int ih = oh * p.strideH - p.padH + r * p.dilationH;
            if (ih < 0 || ih >= p.H) continue;
            for (int ow = 0; ow < p.Q; ++ow) {
              const int iw = ow * p.strideW - p.padW + s * p.dilationW;
              if (iw < 0 || iw >= p.W) continue;
              const double d = static_cast<double>(DY[((static_cast<int64_t>(n) * p.P + oh) * p.Q + ow) * p.K + k]);
              const T* xp = X + ((static_cast<int64_t>(n) * p.H + ih) * p.W + iw) * p.C + g * p.Cg;
              for (int c = 0; c < p.Cg; ++c) acc[c] += d * static_cast<double>(xp[c]);
            }
          }
        }
        std::copy(acc.begin(), acc.end(), out + ((k * p.R + r) * p.S + s) * p.Cg);
      }
    }
  });
}

// Passes `count` accumulators through the workspace in its accumulator precision, as the
// workspace algorithms keep their partial results there.
void stageThroughWorkspace(const Problem& p, void* workspace, double* values, size_t count) {
  if (p.doubleCompute) {
    auto* ws = static_cast<double*>(workspace);
    std::copy(values, values + count, ws);
    std::copy(ws, ws + count, values);
  } else {
    auto* ws = static_cast<float*>(workspace);
    for (size_t i = 0; i < count; ++i) ws[i] = static_cast<float>(values[i]);
    for (size_t i = 0; i < count; ++i) values[i] = ws[i];
  }
}

// The forward sums y[n][p][q][k] (dense, before scaling) of algorithm `algo`.
template <typename T>
std::vector<double> forwardDense(const Problem& p, int algo, const void* x, const void* w, void* workspace) {
  const std::vector<T> X = gatherTensor<T>(p.x, x, p.tf32);
  const std::vector<T> Wd = gatherFilter<T>(p, w);
  const int32_t* table = nullptr;
  if (algo == 1) {
    // Precompute the input offset of every (output position, tap) in the workspace.
    auto* t = static_cast<int32_t*>(workspace);
    size_t i = 0;
    for (int oh = 0; oh < p.P; ++oh) {
      for (int ow = 0; ow < p.Q; ++ow) {
        for (int r = 0; r < p.R; ++r) {
          for (int s = 0; s < p.S; ++s) t[i++] = static_cast<int32_t>(inputPixel(p, oh, ow, r, s));
        }
      }
    }
    table = t;
  }
  std::vector<double> sums(static_cast<size_t>(p.N) * p.P * p.Q * p.K);
  forwardSums<T>(p, X.data(), Wd.data(), table, sums.data());
  return sums;
}

template <typename T>
void runForward(const Problem& p, int algo, const void* x, const void* w, void* workspace, double alpha, double beta,
                void* y) {
  const std::vector<double> sums = forwardDense<T>(p, algo, x, w, workspace);
  blendTensor(p.y, y, sums.data(), alpha, beta);
}

template <typename T>
void runBackwardData(const Problem& p, int algo, const void* w, const void* dy, void* workspace, double alpha,
                     double beta, void* dx) {
  const std::vector<T> DY = gatherTensor<T>(p.y, dy, p.tf32);
  const std::vector<T> Wd = gatherFilter<T>(p, w);
  // Transposed per group: [G][R][S][Cg][Kg].
  std::vector<T> Wt(Wd.size());
  for (int k = 0; k < p.K; ++k) {
    const int g = k / p.Kg, kg = k % p.Kg;
    for (int r = 0; r < p.R; ++r) {
      for (int s = 0; s < p.S; ++s) {
        for (int c = 0; c < p.Cg; ++c) {
          Wt[((((static_cast<size_t>(g) * p.R + r) * p.S + s) * p.Cg) + c) * p.Kg + kg] =
              Wd[((static_cast<size_t>(k) * p.R + r) * p.S + s) * p.Cg + c];
        }
      }
    }
  }
  const size_t image = static_cast<size_t>(p.H) * p.W * p.C;
  std::vector<double> sums(image * p.N);
  if (algo == 1) {
    // One image at a time through the workspace.
    for (int n = 0; n < p.N; ++n) {
      backwardDataSums<T>(p, DY.data(), Wt.data(), n, n + 1, sums.data() + image * n);
      stageThroughWorkspace(p, workspace, sums.data() + image * n, image);
    }
  } else {
    backwardDataSums<T>(p, DY.data(), Wt.data(), 0, p.N, sums.data());
  }
  blendTensor(p.x, dx, sums.data(), alpha, beta);
}

template <typename T>
void runBackwardFilter(const Problem& p, int algo, const void* x, const void* dy, void* workspace, double alpha,
                       double beta, void* dw) {
  const std::vector<T> X = gatherTensor<T>(p.x, x, p.tf32);
  const std::vector<T> DY = gatherTensor<T>(p.y, dy, p.tf32);
  const size_t filter = static_cast<size_t>(p.K) * p.R * p.S * p.Cg;
  std::vector<double> sums(filter);
  if (algo == 1) {
    // Each split's partial sums pass through its own slice of the workspace, then add up in order.
    std::vector<double> partial(filter);
    const size_t sliceBytes = p.accumulatorBytes() * filter;
    for (int split = 0; split < filterSplits(p); ++split) {
      const int n0 = split * kImagesPerSplit, n1 = std::min(p.N, n0 + kImagesPerSplit);
      backwardFilterSums<T>(p, X.data(), DY.data(), partial.data(), n0, n1);
      stageThroughWorkspace(p, static_cast<unsigned char*>(workspace) + split * sliceBytes, partial.data(), filter);
      for (size_t i = 0; i < filter; ++i) sums[i] += partial[i];
    }
  } else {
    backwardFilterSums<T>(p, X.data(), DY.data(), sums.data(), 0, p.N);
  }
  size_t i = 0;
  for (int k = 0; k < p.K; ++k) {
    for (int r = 0; r < p.R; ++r) {
      for (int s = 0; s < p.S; ++s) {
        for (int c = 0; c < p.Cg; ++c) {
          const int fr = p.flip ? p.R - 1 - r : r, fs = p.flip ? p.S - 1 - s : s;
          const int64_t off = p.w.offset(k, c, fr, fs);
          double v = alpha * sums[i++];
          if (beta != 0.0) v += beta * loadElement<double>(p.w.type, dw, off);
          storeElement(p.w.type, dw, off, v);
        }
      }
    }
  }
}

// Wraps a computation for the stream: re-checks that its buffers are still allocated, and turns a
// host allocation failure into a device fault (an operation must not throw).
struct Buffer {
  const void* p;
  size_t bytes;
  const char* what;
};

template <typename Body>
std::function<void()> deviceOp(const char* call, std::vector<Buffer> buffers, Body body) {
  return [call, buffers = std::move(buffers), body = std::move(body)]() {
    for (const Buffer& b : buffers) {
      if (b.bytes > 0 && !rc_emu::isDeviceRange(b.p, b.bytes)) {
        rc_emu::deviceFault(std::string(call) + ": " + b.what + " is no longer allocated device memory when it runs");
        return;
      }
    }
    try {
      body();
    } catch (const std::bad_alloc&) {
      rc_emu::deviceFault(std::string(call) + ": the emulator ran out of host memory");
    }
  };
}

// Fills the perf results of a Find call: the emulated algorithms that fit the workspace fastest
// first, then those that need more workspace (CUDNN_STATUS_ALLOC_FAILED), then the others
// (CUDNN_STATUS_NOT_SUPPORTED). Returns the workspace bytes the algorithms that ran use.
template <typename Perf, typename Algo>
size_t fillPerf(const Problem& p, Pass pass, size_t workspaceSize, int requested, int* returned, Perf* perf) {
  std::vector<Perf> all;
  for (int a = 0; a < algorithmCount(pass); ++a) {
    Perf r{};
    r.algo = static_cast<Algo>(a);
    r.determinism = determinism(pass, a);
    r.mathType = p.math;
    if (!emulated(a)) {
      r.status = CUDNN_STATUS_NOT_SUPPORTED;
      r.time = -1.0f;
      r.memory = 0;
    } else {
      r.memory = workspaceBytes(p, pass, a);
      if (r.memory > workspaceSize) {
        r.status = CUDNN_STATUS_ALLOC_FAILED;
        r.time = -1.0f;
      } else {
        r.status = CUDNN_STATUS_SUCCESS;
        r.time = claimedMilliseconds(p, a);
      }
    }
    all.push_back(r);
  }
  auto rank = [](const Perf& r) {
    return r.status == CUDNN_STATUS_SUCCESS ? 0 : r.status == CUDNN_STATUS_ALLOC_FAILED ? 1 : 2;
  };
  std::stable_sort(all.begin(), all.end(), [&](const Perf& a, const Perf& b) {
    if (rank(a) != rank(b)) return rank(a) < rank(b);
    return rank(a) == 0 && a.time < b.time;
  });
  size_t used = 0;
  for (const Perf& r : all) {
    if (r.status == CUDNN_STATUS_SUCCESS) used = std::max(used, r.memory);
  }
  const int count = std::min(requested, static_cast<int>(all.size()));
  for (int i = 0; i < count; ++i) perf[i] = all[i];
  *returned = count;
  return used;
}

// The common part of the Find calls: blocking, so not while capturing; the earlier work on the
// stream runs first; the output (and the workspace the timed algorithms use) is overwritten.
template <typename Perf, typename Algo>
cudnnStatus_t searchAlgorithms(const char* call, cudnnHandle_t handle, const Problem& p, Pass pass, void* output,
                               size_t outputBytes, const int requested, int* returned, Perf* perf, void* workspace,
                               size_t workspaceSize) {
  const std::string where = std::string(call) + ": ";
  if (rc_emu::isCapturing(handle->stream)) {
    return fail(CUDNN_STATUS_EXECUTION_FAILED_CUDART,
                where +
                    "the handle's stream is capturing a CUDA graph; an algorithm search synchronises the stream "
                    "and cannot be captured");
  }
  if (requested < 1) return fail(CUDNN_STATUS_BAD_PARAM, where + "requestedAlgoCount is " + std::to_string(requested));
  if (returned == nullptr || perf == nullptr) {
    return fail(CUDNN_STATUS_BAD_PARAM, where + "returnedAlgoCount or perfResults is null");
  }
  if (workspaceSize > 0 && (workspace == nullptr || !rc_emu::isDeviceRange(workspace, workspaceSize))) {
    return fail(CUDNN_STATUS_BAD_PARAM,
                where + "the workspace is not " + std::to_string(workspaceSize) + " bytes of device memory");
  }
  if (cudaStreamSynchronize(handle->stream) != cudaSuccess) {
    return fail(CUDNN_STATUS_EXECUTION_FAILED, where + "waiting for the stream failed");
  }
  const size_t used = fillPerf<Perf, Algo>(p, pass, workspaceSize, requested, returned, perf);
  const size_t scribble = std::min(used, workspaceSize);
  cudnnStatus_t status =
      queue(handle->stream,
            deviceOp(call, {{output, outputBytes, "the output"}, {workspace, scribble, "the workspace"}},
                     [output, outputBytes, workspace, scribble] {
                       std::memset(output, rc_emu::kUninitializedByte, outputBytes);
                       if (scribble > 0) std::memset(workspace, rc_emu::kUninitializedByte, scribble);
                     }),
            call);
  if (status != CUDNN_STATUS_SUCCESS) return status;
  if (cudaStreamSynchronize(handle->stream) != cudaSuccess) {
    return fail(CUDNN_STATUS_EXECUTION_FAILED, where + "the timed runs failed");
  }
  return ok();
}

cudnnStatus_t checkHandle(const char* call, cudnnHandle_t handle) {
  if (handle == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": the handle is null");
  return ok();
}

#define RC_DNN_TRY(expr)                                           \
  do {                                                             \
    const cudnnStatus_t rcDnnStatus_ = (expr);                     \
    if (rcDnnStatus_ != CUDNN_STATUS_SUCCESS) return rcDnnStatus_; \
  } while (0)

constexpr MismatchStatuses kForwardStatuses{CUDNN_STATUS_NOT_SUPPORTED, CUDNN_STATUS_BAD_PARAM};
constexpr MismatchStatuses kBackwardDataStatuses{CUDNN_STATUS_BAD_PARAM, CUDNN_STATUS_NOT_SUPPORTED};
constexpr MismatchStatuses kBackwardFilterStatuses{CUDNN_STATUS_BAD_PARAM, CUDNN_STATUS_BAD_PARAM};

}  // namespace

void rc_emu::setDnnLastError(const std::string& message) { tLastError = message; }

// ---- versions and errors ----------------------------------------------------------------------

extern "C" size_t cudnnGetVersion(void) { return CUDNN_VERSION; }

extern "C" size_t cudnnGetCudartVersion(void) { return CUDART_VERSION; }

extern "C" const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
#define RC_DNN_NAME(s) \
  case s: return #s;
    RC_DNN_NAME(CUDNN_STATUS_SUCCESS)
    RC_DNN_NAME(CUDNN_STATUS_NOT_INITIALIZED)
    RC_DNN_NAME(CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH)
    RC_DNN_NAME(CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH)
    RC_DNN_NAME(CUDNN_STATUS_DEPRECATED)
    RC_DNN_NAME(CUDNN_STATUS_LICENSE_ERROR)
    RC_DNN_NAME(CUDNN_STATUS_RUNTIME_IN_PROGRESS)
    RC_DNN_NAME(CUDNN_STATUS_RUNTIME_FP_OVERFLOW)
    RC_DNN_NAME(CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED)
    RC_DNN_NAME(CUDNN_STATUS_BAD_PARAM)
    RC_DNN_NAME(CUDNN_STATUS_INVALID_VALUE)
    RC_DNN_NAME(CUDNN_STATUS_BAD_PARAM_NULL_POINTER)
    RC_DNN_NAME(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER)
    RC_DNN_NAME(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED)
    RC_DNN_NAME(CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND)
    RC_DNN_NAME(CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT)
    RC_DNN_NAME(CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH)
    RC_DNN_NAME(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH)
    RC_DNN_NAME(CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES)
    RC_DNN_NAME(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE)
    RC_DNN_NAME(CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH)
    RC_DNN_NAME(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE)
    RC_DNN_NAME(CUDNN_STATUS_NOT_SUPPORTED)
    RC_DNN_NAME(CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN)
    RC_DNN_NAME(CUDNN_STATUS_NOT_SUPPORTED_SHAPE)
    RC_DNN_NAME(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE)
    RC_DNN_NAME(CUDNN_STATUS_NOT_SUPPORTED_LAYOUT)
    RC_DNN_NAME(CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER)
    RC_DNN_NAME(CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART)
    RC_DNN_NAME(CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH)
    RC_DNN_NAME(CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING)
    RC_DNN_NAME(CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE)
    RC_DNN_NAME(CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT)
    RC_DNN_NAME(CUDNN_STATUS_NOT_SUPPORTED_PADDING)
    RC_DNN_NAME(CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM)
    RC_DNN_NAME(CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API)
    RC_DNN_NAME(CUDNN_STATUS_INTERNAL_ERROR)
    RC_DNN_NAME(CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED)
    RC_DNN_NAME(CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE)
    RC_DNN_NAME(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED)
    RC_DNN_NAME(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
    RC_DNN_NAME(CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM)
    RC_DNN_NAME(CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED)
    RC_DNN_NAME(CUDNN_STATUS_EXECUTION_FAILED)
    RC_DNN_NAME(CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER)
    RC_DNN_NAME(CUDNN_STATUS_EXECUTION_FAILED_CUBLAS)
    RC_DNN_NAME(CUDNN_STATUS_EXECUTION_FAILED_CUDART)
    RC_DNN_NAME(CUDNN_STATUS_EXECUTION_FAILED_CURAND)
#undef RC_DNN_NAME
  }
  return "CUDNN_STATUS_UNKNOWN (not a cuDNN status)";
}

extern "C" void cudnnGetLastErrorString(char* message, size_t max_size) {
  if (message == nullptr || max_size == 0) return;
  const size_t n = std::min(tLastError.size(), max_size - 1);
  std::memcpy(message, tLastError.data(), n);
  message[n] = '\0';
}

// ---- handles ----------------------------------------------------------------------------------

extern "C" cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  if (handle == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnCreate: handle is null");
  *handle = new (std::nothrow) cudnnContext();
  if (*handle == nullptr) return fail(CUDNN_STATUS_ALLOC_FAILED, "cudnnCreate: out of host memory");
  return ok();
}

extern "C" cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  RC_DNN_TRY(checkHandle("cudnnDestroy", handle));
  delete handle;
  return ok();
}

extern "C" cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId) {
  RC_DNN_TRY(checkHandle("cudnnSetStream", handle));
  handle->stream = streamId;
  return ok();
}

extern "C" cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t* streamId) {
  RC_DNN_TRY(checkHandle("cudnnGetStream", handle));
  if (streamId == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnGetStream: streamId is null");
  *streamId = handle->stream;
  return ok();
}

// ---- tensor and filter descriptors ------------------------------------------------------------

extern "C" cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* tensorDesc) {
  if (tensorDesc == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnCreateTensorDescriptor: tensorDesc is null");
  *tensorDesc = new (std::nothrow) cudnnTensorStruct();
  if (*tensorDesc == nullptr) return fail(CUDNN_STATUS_ALLOC_FAILED, "cudnnCreateTensorDescriptor: out of host memory");
  return ok();
}

extern "C" cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t tensorDesc) {
  delete tensorDesc;
  return ok();
}

namespace {

cudnnStatus_t setTensor(const char* call, cudnnTensorDescriptor_t d, cudnnDataType_t type, int n, int c, int h, int w,
                        int64_t ns, int64_t cs, int64_t hs, int64_t ws, bool vectorized) {
  const std::string where = std::string(call) + ": ";
  if (d == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, where + "the descriptor is null");
  if (!isDataTypeEnumerant(type)) {
    return fail(CUDNN_STATUS_BAD_PARAM, where + "data type " + std::to_string(type) + " is not an enumerant");
  }
  if (n <= 0 || c <= 0 || h <= 0 || w <= 0) {
    return fail(CUDNN_STATUS_BAD_PARAM, where + "dimensions must be positive, got " + std::to_string(n) + "x" +
                                            std::to_string(c) + "x" + std::to_string(h) + "x" + std::to_string(w));
  }
  if (static_cast<int64_t>(n) * c * h * w > std::numeric_limits<int32_t>::max()) {
    return fail(CUDNN_STATUS_NOT_SUPPORTED, where + "the tensor has more than 2^31 - 1 elements");
  }
  d->set = true;
  d->type = type;
  d->n = n;
  d->c = c;
  d->h = h;
  d->w = w;
  d->ns = ns;
  d->cs = cs;
  d->hs = hs;
  d->ws = ws;
  d->vectorized = vectorized;
  return ok();
}

}  // namespace

extern "C" cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t tensorDesc, cudnnTensorFormat_t format,
                                                    cudnnDataType_t dataType, int n, int c, int h, int w) {
  const int64_t C = c, H = h, W = w;
  switch (format) {
    case CUDNN_TENSOR_NCHW:
      return setTensor("cudnnSetTensor4dDescriptor", tensorDesc, dataType, n, c, h, w, C * H * W, H * W, W, 1, false);
    case CUDNN_TENSOR_NHWC:
      return setTensor("cudnnSetTensor4dDescriptor", tensorDesc, dataType, n, c, h, w, H * W * C, 1, W * C, C, false);
    case CUDNN_TENSOR_NCHW_VECT_C:
      return setTensor("cudnnSetTensor4dDescriptor", tensorDesc, dataType, n, c, h, w, C * H * W, H * W, W, 1, true);
  }
  return fail(CUDNN_STATUS_BAD_PARAM,
              "cudnnSetTensor4dDescriptor: format " + std::to_string(format) + " is not an enumerant");
}

extern "C" cudnnStatus_t cudnnSetTensor4dDescriptorEx(cudnnTensorDescriptor_t tensorDesc, cudnnDataType_t dataType,
                                                      int n, int c, int h, int w, int nStride, int cStride, int hStride,
                                                      int wStride) {
  return setTensor("cudnnSetTensor4dDescriptorEx", tensorDesc, dataType, n, c, h, w, nStride, cStride, hStride, wStride,
                   false);
}

extern "C" cudnnStatus_t cudnnGetTensor4dDescriptor(const cudnnTensorDescriptor_t tensorDesc, cudnnDataType_t* dataType,
                                                    int* n, int* c, int* h, int* w, int* nStride, int* cStride,
                                                    int* hStride, int* wStride) {
  if (tensorDesc == nullptr || !tensorDesc->set) {
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnGetTensor4dDescriptor: the descriptor is null or not set");
  }
  if (!dataType || !n || !c || !h || !w || !nStride || !cStride || !hStride || !wStride) {
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnGetTensor4dDescriptor: an output pointer is null");
  }
  *dataType = tensorDesc->type;
  *n = tensorDesc->n;
  *c = tensorDesc->c;
  *h = tensorDesc->h;
  *w = tensorDesc->w;
  *nStride = static_cast<int>(tensorDesc->ns);
  *cStride = static_cast<int>(tensorDesc->cs);
  *hStride = static_cast<int>(tensorDesc->hs);
  *wStride = static_cast<int>(tensorDesc->ws);
  return ok();
}

extern "C" cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* filterDesc) {
  if (filterDesc == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnCreateFilterDescriptor: filterDesc is null");
  *filterDesc = new (std::nothrow) cudnnFilterStruct();
  if (*filterDesc == nullptr) return fail(CUDNN_STATUS_ALLOC_FAILED, "cudnnCreateFilterDescriptor: out of host memory");
  return ok();
}

extern "C" cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t filterDesc) {
  delete filterDesc;
  return ok();
}

extern "C" cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t filterDesc, cudnnDataType_t dataType,
                                                    cudnnTensorFormat_t format, int k, int c, int h, int w) {
  const char* where = "cudnnSetFilter4dDescriptor: ";
  if (filterDesc == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, std::string(where) + "the descriptor is null");
  if (!isDataTypeEnumerant(dataType)) {
    return fail(CUDNN_STATUS_BAD_PARAM,
                std::string(where) + "data type " + std::to_string(dataType) + " is not an enumerant");
  }
  if (format != CUDNN_TENSOR_NCHW && format != CUDNN_TENSOR_NHWC && format != CUDNN_TENSOR_NCHW_VECT_C) {
    return fail(CUDNN_STATUS_BAD_PARAM,
                std::string(where) + "format " + std::to_string(format) + " is not an enumerant");
  }
  if (k <= 0 || c <= 0 || h <= 0 || w <= 0) {
    return fail(CUDNN_STATUS_BAD_PARAM, std::string(where) + "dimensions must be positive, got " + std::to_string(k) +
                                            "x" + std::to_string(c) + "x" + std::to_string(h) + "x" +
                                            std::to_string(w));
  }
  filterDesc->set = true;
  filterDesc->type = dataType;
  filterDesc->format = format;
  filterDesc->k = k;
  filterDesc->c = c;
  filterDesc->h = h;
  filterDesc->w = w;
  return ok();
}

extern "C" cudnnStatus_t cudnnGetFilter4dDescriptor(const cudnnFilterDescriptor_t filterDesc, cudnnDataType_t* dataType,
                                                    cudnnTensorFormat_t* format, int* k, int* c, int* h, int* w) {
  if (filterDesc == nullptr || !filterDesc->set) {
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnGetFilter4dDescriptor: the descriptor is null or not set");
  }
  if (!dataType || !format || !k || !c || !h || !w) {
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnGetFilter4dDescriptor: an output pointer is null");
  }
  *dataType = filterDesc->type;
  *format = filterDesc->format;
  *k = filterDesc->k;
  *c = filterDesc->c;
  *h = filterDesc->h;
  *w = filterDesc->w;
  return ok();
}

// ---- convolution descriptors ------------------------------------------------------------------

extern "C" cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* convDesc) {
  if (convDesc == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnCreateConvolutionDescriptor: convDesc is null");
  *convDesc = new (std::nothrow) cudnnConvolutionStruct();
  if (*convDesc == nullptr) {
    return fail(CUDNN_STATUS_ALLOC_FAILED, "cudnnCreateConvolutionDescriptor: out of host memory");
  }
  return ok();
}

extern "C" cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t convDesc) {
  delete convDesc;
  return ok();
}

extern "C" cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t convDesc, int pad_h, int pad_w,
                                                         int u, int v, int dilation_h, int dilation_w,
                                                         cudnnConvolutionMode_t mode, cudnnDataType_t computeType) {
  const std::string where = "cudnnSetConvolution2dDescriptor: ";
  if (convDesc == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, where + "the descriptor is null");
  if (pad_h < 0 || pad_w < 0) return fail(CUDNN_STATUS_BAD_PARAM, where + "padding must not be negative");
  if (u <= 0 || v <= 0) return fail(CUDNN_STATUS_BAD_PARAM, where + "strides must be positive");
  if (dilation_h <= 0 || dilation_w <= 0) return fail(CUDNN_STATUS_BAD_PARAM, where + "dilations must be positive");
  if (mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION) {
    return fail(CUDNN_STATUS_BAD_PARAM, where + "mode " + std::to_string(mode) + " is not an enumerant");
  }
  if (!isDataTypeEnumerant(computeType)) {
    return fail(CUDNN_STATUS_BAD_PARAM, where + "compute type " + std::to_string(computeType) + " is not an enumerant");
  }
  convDesc->set = true;
  convDesc->padH = pad_h;
  convDesc->padW = pad_w;
  convDesc->strideH = u;
  convDesc->strideW = v;
  convDesc->dilationH = dilation_h;
  convDesc->dilationW = dilation_w;
  convDesc->mode = mode;
  convDesc->computeType = computeType;
  return ok();
}

extern "C" cudnnStatus_t cudnnGetConvolution2dDescriptor(const cudnnConvolutionDescriptor_t convDesc, int* pad_h,
                                                         int* pad_w, int* u, int* v, int* dilation_h, int* dilation_w,
                                                         cudnnConvolutionMode_t* mode, cudnnDataType_t* computeType) {
  if (convDesc == nullptr || !convDesc->set) {
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnGetConvolution2dDescriptor: the descriptor is null or not set");
  }
  if (!pad_h || !pad_w || !u || !v || !dilation_h || !dilation_w || !mode || !computeType) {
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnGetConvolution2dDescriptor: an output pointer is null");
  }
  *pad_h = convDesc->padH;
  *pad_w = convDesc->padW;
  *u = convDesc->strideH;
  *v = convDesc->strideW;
  *dilation_h = convDesc->dilationH;
  *dilation_w = convDesc->dilationW;
  *mode = convDesc->mode;
  *computeType = convDesc->computeType;
  return ok();
}

extern "C" cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t convDesc, cudnnMathType_t mathType) {
  if (convDesc == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolutionMathType: the descriptor is null");
  if (mathType != CUDNN_DEFAULT_MATH && mathType != CUDNN_TENSOR_OP_MATH &&
      mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION && mathType != CUDNN_FMA_MATH) {
    return fail(CUDNN_STATUS_BAD_PARAM,
                "cudnnSetConvolutionMathType: math type " + std::to_string(mathType) + " is not an enumerant");
  }
  convDesc->math = mathType;
  return ok();
}

extern "C" cudnnStatus_t cudnnGetConvolutionMathType(cudnnConvolutionDescriptor_t convDesc, cudnnMathType_t* mathType) {
  if (convDesc == nullptr || mathType == nullptr) {
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnGetConvolutionMathType: a pointer is null");
  }
  *mathType = convDesc->math;
  return ok();
}

extern "C" cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t convDesc, int groupCount) {
  if (convDesc == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolutionGroupCount: the descriptor is null");
  if (groupCount < 1) {
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolutionGroupCount: the group count must be positive");
  }
  convDesc->groups = groupCount;
  return ok();
}

extern "C" cudnnStatus_t cudnnGetConvolutionGroupCount(cudnnConvolutionDescriptor_t convDesc, int* groupCount) {
  if (convDesc == nullptr || groupCount == nullptr) {
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnGetConvolutionGroupCount: a pointer is null");
  }
  *groupCount = convDesc->groups;
  return ok();
}

extern "C" cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t convDesc,
                                                               const cudnnTensorDescriptor_t inputTensorDesc,
                                                               const cudnnFilterDescriptor_t filterDesc, int* n, int* c,
                                                               int* h, int* w) {
  const std::string where = "cudnnGetConvolution2dForwardOutputDim: ";
  if (convDesc == nullptr || inputTensorDesc == nullptr || filterDesc == nullptr) {
    return fail(CUDNN_STATUS_BAD_PARAM, where + "a descriptor is null");
  }
  if (!convDesc->set || !inputTensorDesc->set || !filterDesc->set) {
    return fail(CUDNN_STATUS_BAD_PARAM, where + "a descriptor was never set");
  }
  if (n == nullptr || c == nullptr || h == nullptr || w == nullptr) {
    return fail(CUDNN_STATUS_BAD_PARAM, where + "an output pointer is null");
  }
  if (inputTensorDesc->c != filterDesc->c * convDesc->groups) {
    return fail(CUDNN_STATUS_BAD_PARAM, where + "the input has " + std::to_string(inputTensorDesc->c) +
                                            " channels, the filter " + std::to_string(filterDesc->c) +
                                            " per group with " + std::to_string(convDesc->groups) + " group(s)");
  }
  const int dilatedR = (filterDesc->h - 1) * convDesc->dilationH + 1;
  const int dilatedS = (filterDesc->w - 1) * convDesc->dilationW + 1;
  if (dilatedR > inputTensorDesc->h + 2 * convDesc->padH || dilatedS > inputTensorDesc->w + 2 * convDesc->padW) {
    return fail(CUDNN_STATUS_BAD_PARAM, where + "the (dilated) filter is larger than the padded input");
  }
  *n = inputTensorDesc->n;
  *c = filterDesc->k;
  *h = outputSize(inputTensorDesc->h, convDesc->padH, filterDesc->h, convDesc->dilationH, convDesc->strideH);
  *w = outputSize(inputTensorDesc->w, convDesc->padW, filterDesc->w, convDesc->dilationW, convDesc->strideW);
  return ok();
}

// ---- workspace sizes --------------------------------------------------------------------------

namespace {

cudnnStatus_t workspaceSize(const char* call, cudnnHandle_t handle, const cudnnTensorStruct* x,
                            const cudnnFilterStruct* w, const cudnnConvolutionStruct* conv, const cudnnTensorStruct* y,
                            MismatchStatuses statuses, Pass pass, int algo, size_t* sizeInBytes) {
  RC_DNN_TRY(checkHandle(call, handle));
  if (sizeInBytes == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": sizeInBytes is null");
  Problem p{};
  RC_DNN_TRY(makeProblem(call, x, w, conv, y, statuses, &p));
  if (algo < 0 || algo >= algorithmCount(pass)) {
    return fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": algorithm " + std::to_string(algo) + " is not a " +
                                            passName(pass) + " algorithm");
  }
  if (!emulated(algo)) {
    return fail(CUDNN_STATUS_NOT_SUPPORTED, std::string(call) + ": algorithm " + std::to_string(algo) +
                                                " is not emulated (only algorithms 0 and 1 are)");
  }
  *sizeInBytes = workspaceBytes(p, pass, algo);
  return ok();
}

}  // namespace

extern "C" cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle,
                                                                 const cudnnTensorDescriptor_t xDesc,
                                                                 const cudnnFilterDescriptor_t wDesc,
                                                                 const cudnnConvolutionDescriptor_t convDesc,
                                                                 const cudnnTensorDescriptor_t yDesc,
                                                                 cudnnConvolutionFwdAlgo_t algo, size_t* sizeInBytes) {
  return workspaceSize("cudnnGetConvolutionForwardWorkspaceSize", handle, xDesc, wDesc, convDesc, yDesc,
                       kForwardStatuses, Pass::Forward, algo, sizeInBytes);
}

extern "C" cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc,
    cudnnConvolutionBwdDataAlgo_t algo, size_t* sizeInBytes) {
  return workspaceSize("cudnnGetConvolutionBackwardDataWorkspaceSize", handle, dxDesc, wDesc, convDesc, dyDesc,
                       kBackwardDataStatuses, Pass::BackwardData, algo, sizeInBytes);
}

extern "C" cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t gradDesc,
    cudnnConvolutionBwdFilterAlgo_t algo, size_t* sizeInBytes) {
  return workspaceSize("cudnnGetConvolutionBackwardFilterWorkspaceSize", handle, xDesc, gradDesc, convDesc, dyDesc,
                       kBackwardFilterStatuses, Pass::BackwardFilter, algo, sizeInBytes);
}

// ---- algorithm search -------------------------------------------------------------------------

extern "C" cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const void* x, const cudnnFilterDescriptor_t wDesc,
    const void* w, const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc, void* y,
    const int requestedAlgoCount, int* returnedAlgoCount, cudnnConvolutionFwdAlgoPerf_t* perfResults, void* workSpace,
    size_t workSpaceSizeInBytes) {
  const char* call = "cudnnFindConvolutionForwardAlgorithmEx";
  RC_DNN_TRY(checkHandle(call, handle));
  Problem p{};
  RC_DNN_TRY(makeProblem(call, xDesc, wDesc, convDesc, yDesc, kForwardStatuses, &p));
  RC_DNN_TRY(checkDeviceData(call, "x", x, p.x.extentBytes()));
  RC_DNN_TRY(checkDeviceData(call, "w", w, p.w.bytes()));
  RC_DNN_TRY(checkDeviceData(call, "y", y, p.y.extentBytes()));
  return searchAlgorithms<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(
      call, handle, p, Pass::Forward, y, p.y.extentBytes(), requestedAlgoCount, returnedAlgoCount, perfResults,
      workSpace, workSpaceSizeInBytes);
}

extern "C" cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc, const void* w, const cudnnTensorDescriptor_t dyDesc,
    const void* dy, const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc, void* dx,
    const int requestedAlgoCount, int* returnedAlgoCount, cudnnConvolutionBwdDataAlgoPerf_t* perfResults,
    void* workSpace, size_t workSpaceSizeInBytes) {
  const char* call = "cudnnFindConvolutionBackwardDataAlgorithmEx";
  RC_DNN_TRY(checkHandle(call, handle));
  Problem p{};
  RC_DNN_TRY(makeProblem(call, dxDesc, wDesc, convDesc, dyDesc, kBackwardDataStatuses, &p));
  RC_DNN_TRY(checkDeviceData(call, "w", w, p.w.bytes()));
  RC_DNN_TRY(checkDeviceData(call, "dy", dy, p.y.extentBytes()));
  RC_DNN_TRY(checkDeviceData(call, "dx", dx, p.x.extentBytes()));
  return searchAlgorithms<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(
      call, handle, p, Pass::BackwardData, dx, p.x.extentBytes(), requestedAlgoCount, returnedAlgoCount, perfResults,
      workSpace, workSpaceSizeInBytes);
}

extern "C" cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const void* x, const cudnnTensorDescriptor_t dyDesc,
    const void* y, const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t dwDesc, void* dw,
    const int requestedAlgoCount, int* returnedAlgoCount, cudnnConvolutionBwdFilterAlgoPerf_t* perfResults,
    void* workSpace, size_t workSpaceSizeInBytes) {
  const char* call = "cudnnFindConvolutionBackwardFilterAlgorithmEx";
  RC_DNN_TRY(checkHandle(call, handle));
  Problem p{};
  RC_DNN_TRY(makeProblem(call, xDesc, dwDesc, convDesc, dyDesc, kBackwardFilterStatuses, &p));
  RC_DNN_TRY(checkDeviceData(call, "x", x, p.x.extentBytes()));
  RC_DNN_TRY(checkDeviceData(call, "dy", y, p.y.extentBytes()));
  RC_DNN_TRY(checkDeviceData(call, "dw", dw, p.w.bytes()));
  return searchAlgorithms<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(
      call, handle, p, Pass::BackwardFilter, dw, p.w.bytes(), requestedAlgoCount, returnedAlgoCount, perfResults,
      workSpace, workSpaceSizeInBytes);
}

// ---- convolutions -----------------------------------------------------------------------------

namespace {

// What the three compute calls share once the problem is known: the scaling factors, the operands
// (two read, `out` written) as device memory of their descriptors' extent, the algorithm and its
// workspace; then the computation, queued on the handle's stream. `run(tag, p, algo, in0, in1,
// workspace, alpha, beta, out)` computes the pass with element type decltype(tag).
template <typename Run>
cudnnStatus_t convolve(const char* call, cudnnHandle_t handle, const Problem& p, Pass pass, int algo, const void* alpha,
                       const void* beta, Buffer in0, Buffer in1, Buffer out, void* workSpace,
                       size_t workSpaceSizeInBytes, Run run) {
  double a = 0, b = 0;
  RC_DNN_TRY(readScaling(call, p, alpha, beta, &a, &b));
  for (const Buffer& operand : {in0, in1, out})
    RC_DNN_TRY(checkDeviceData(call, operand.what, operand.p, operand.bytes));
  size_t required = 0;
  RC_DNN_TRY(checkAlgorithm(call, p, pass, algo, workSpace, workSpaceSizeInBytes, &required));
  const void* x0 = in0.p;
  const void* x1 = in1.p;
  void* y = const_cast<void*>(out.p);
  return queue(handle->stream,
               deviceOp(call, {in0, in1, out, {workSpace, required, "the workspace"}},
                        [p, algo, x0, x1, workSpace, a, b, y, run] {
                          if (p.doubleCompute) {
                            run(double{}, p, algo, x0, x1, workSpace, a, b, y);
                          } else {
                            run(float{}, p, algo, x0, x1, workSpace, a, b, y);
                          }
                        }),
               call);
}

}  // namespace

extern "C" cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha,
                                                 const cudnnTensorDescriptor_t xDesc, const void* x,
                                                 const cudnnFilterDescriptor_t wDesc, const void* w,
                                                 const cudnnConvolutionDescriptor_t convDesc,
                                                 cudnnConvolutionFwdAlgo_t algo, void* workSpace,
                                                 size_t workSpaceSizeInBytes, const void* beta,
                                                 const cudnnTensorDescriptor_t yDesc, void* y) {
  const char* call = "cudnnConvolutionForward";
  RC_DNN_TRY(checkHandle(call, handle));
  Problem p{};
  RC_DNN_TRY(makeProblem(call, xDesc, wDesc, convDesc, yDesc, kForwardStatuses, &p));
  return convolve(call, handle, p, Pass::Forward, static_cast<int>(algo), alpha, beta, {x, p.x.extentBytes(), "x"},
                  {w, p.w.bytes(), "w"}, {y, p.y.extentBytes(), "y"}, workSpace, workSpaceSizeInBytes,
                  [](auto tag, const Problem& q, int al, const void* in0, const void* in1, void* ws, double a, double b,
                     void* out) { runForward<decltype(tag)>(q, al, in0, in1, ws, a, b, out); });
}

extern "C" cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void* alpha,
                                                      const cudnnFilterDescriptor_t wDesc, const void* w,
                                                      const cudnnTensorDescriptor_t dyDesc, const void* dy,
                                                      const cudnnConvolutionDescriptor_t convDesc,
                                                      cudnnConvolutionBwdDataAlgo_t algo, void* workSpace,
                                                      size_t workSpaceSizeInBytes, const void* beta,
                                                      const cudnnTensorDescriptor_t dxDesc, void* dx) {
  const char* call = "cudnnConvolutionBackwardData";
  RC_DNN_TRY(checkHandle(call, handle));
  Problem p{};
  RC_DNN_TRY(makeProblem(call, dxDesc, wDesc, convDesc, dyDesc, kBackwardDataStatuses, &p));
  return convolve(call, handle, p, Pass::BackwardData, static_cast<int>(algo), alpha, beta, {w, p.w.bytes(), "w"},
                  {dy, p.y.extentBytes(), "dy"}, {dx, p.x.extentBytes(), "dx"}, workSpace, workSpaceSizeInBytes,
                  [](auto tag, const Problem& q, int al, const void* in0, const void* in1, void* ws, double a, double b,
                     void* out) { runBackwardData<decltype(tag)>(q, al, in0, in1, ws, a, b, out); });
}

extern "C" cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void* alpha,
                                                        const cudnnTensorDescriptor_t xDesc, const void* x,
                                                        const cudnnTensorDescriptor_t dyDesc, const void* dy,
                                                        const cudnnConvolutionDescriptor_t convDesc,
                                                        cudnnConvolutionBwdFilterAlgo_t algo, void* workSpace,
                                                        size_t workSpaceSizeInBytes, const void* beta,
                                                        const cudnnFilterDescriptor_t dwDesc, void* dw) {
  const char* call = "cudnnConvolutionBackwardFilter";
  RC_DNN_TRY(checkHandle(call, handle));
  Problem p{};
  RC_DNN_TRY(makeProblem(call, xDesc, dwDesc, convDesc, dyDesc, kBackwardFilterStatuses, &p));
  return convolve(call, handle, p, Pass::BackwardFilter, static_cast<int>(algo), alpha, beta,
                  {x, p.x.extentBytes(), "x"}, {dy, p.y.extentBytes(), "dy"}, {dw, p.w.bytes(), "dw"}, workSpace,
                  workSpaceSizeInBytes,
                  [](auto tag, const Problem& q, int al, const void* in0, const void* in1, void* ws, double a, double b,
                     void* out) { runBackwardFilter<decltype(tag)>(q, al, in0, in1, ws, a, b, out); });
}

// ---- activations and the fused convolution ----------------------------------------------------

struct cudnnActivationStruct {
  bool set = false;
  cudnnActivationMode_t mode = CUDNN_ACTIVATION_RELU;
  cudnnNanPropagation_t nan = CUDNN_NOT_PROPAGATE_NAN;
  double coef = 0.0;
};

extern "C" cudnnStatus_t cudnnCreateActivationDescriptor(cudnnActivationDescriptor_t* activationDesc) {
  if (activationDesc == nullptr) {
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnCreateActivationDescriptor: activationDesc is null");
  }
  *activationDesc = new (std::nothrow) cudnnActivationStruct();
  if (*activationDesc == nullptr) {
    return fail(CUDNN_STATUS_ALLOC_FAILED, "cudnnCreateActivationDescriptor: out of host memory");
  }
  return ok();
}

extern "C" cudnnStatus_t cudnnDestroyActivationDescriptor(cudnnActivationDescriptor_t activationDesc) {
  delete activationDesc;
  return ok();
}

extern "C" cudnnStatus_t cudnnSetActivationDescriptor(cudnnActivationDescriptor_t activationDesc,
                                                      cudnnActivationMode_t mode, cudnnNanPropagation_t reluNanOpt,
                                                      double coef) {
  const std::string where = "cudnnSetActivationDescriptor: ";
  if (activationDesc == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, where + "the descriptor is null");
  if (mode < CUDNN_ACTIVATION_SIGMOID || mode > CUDNN_ACTIVATION_SWISH) {
    return fail(CUDNN_STATUS_BAD_PARAM, where + "mode " + std::to_string(mode) + " is not an enumerant");
  }
  if (reluNanOpt != CUDNN_NOT_PROPAGATE_NAN && reluNanOpt != CUDNN_PROPAGATE_NAN) {
    return fail(CUDNN_STATUS_BAD_PARAM, where + "reluNanOpt " + std::to_string(reluNanOpt) + " is not an enumerant");
  }
  activationDesc->set = true;
  activationDesc->mode = mode;
  activationDesc->nan = reluNanOpt;
  activationDesc->coef = coef;
  return ok();
}

extern "C" cudnnStatus_t cudnnGetActivationDescriptor(const cudnnActivationDescriptor_t activationDesc,
                                                      cudnnActivationMode_t* mode, cudnnNanPropagation_t* reluNanOpt,
                                                      double* coef) {
  if (activationDesc == nullptr || !activationDesc->set) {
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnGetActivationDescriptor: the descriptor is null or not set");
  }
  if (mode == nullptr || reluNanOpt == nullptr || coef == nullptr) {
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnGetActivationDescriptor: an output pointer is null");
  }
  *mode = activationDesc->mode;
  *reluNanOpt = activationDesc->nan;
  *coef = activationDesc->coef;
  return ok();
}

namespace {

// The checks cudnnConvolutionBiasActivationForward adds to those of the forward convolution: the
// activation, its algorithm, the bias and z (cuDNN 9's documentation of the call).
cudnnStatus_t checkFusedOperands(const std::string& where, const Problem& p, int algo, const cudnnTensorStruct* z,
                                 const cudnnTensorStruct* bias, const cudnnActivationStruct* act) {
  if (z == nullptr || bias == nullptr || act == nullptr) {
    return fail(CUDNN_STATUS_BAD_PARAM, where + "zDesc, biasDesc or activationDesc is null");
  }
  if (!z->set || !bias->set) return fail(CUDNN_STATUS_BAD_PARAM, where + "zDesc or biasDesc was never set");
  if (!act->set) return fail(CUDNN_STATUS_BAD_PARAM, where + "the activation descriptor was never set");
  if (act->mode != CUDNN_ACTIVATION_RELU && act->mode != CUDNN_ACTIVATION_IDENTITY) {
    return fail(CUDNN_STATUS_NOT_SUPPORTED, where + "activation mode " + std::to_string(act->mode) +
                                                " is not supported (only CUDNN_ACTIVATION_RELU and "
                                                "CUDNN_ACTIVATION_IDENTITY are)");
  }
  if (act->nan != CUDNN_NOT_PROPAGATE_NAN) {
    return fail(CUDNN_STATUS_NOT_SUPPORTED, where + "the activation's reluNanOpt must be CUDNN_NOT_PROPAGATE_NAN");
  }
  if (act->mode == CUDNN_ACTIVATION_IDENTITY && algo != CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM) {
    return fail(CUDNN_STATUS_NOT_SUPPORTED, where +
                                                "CUDNN_ACTIVATION_IDENTITY is supported only with "
                                                "CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, algorithm " +
                                                std::to_string(algo) + " was given");
  }
  if (bias->n != 1 || bias->c != p.K || bias->h != 1 || bias->w != 1 || bias->cs != 1) {
    return fail(CUDNN_STATUS_NOT_SUPPORTED,
                where + "the bias must be 1x" + std::to_string(p.K) + "x1x1 with a channel stride of 1, got " +
                    std::to_string(bias->n) + "x" + std::to_string(bias->c) + "x" + std::to_string(bias->h) + "x" +
                    std::to_string(bias->w) + " (channel stride " + std::to_string(bias->cs) + ")");
  }
  // FLOAT, DOUBLE, PSEUDO_HALF, TRUE_HALF and PSEUDO_BFLOAT16: the bias has y's type.
  if (bias->type != p.type) {
    return fail(CUDNN_STATUS_NOT_SUPPORTED, where + "the bias is " + typeName(bias->type) +
                                                " but this configuration (" + typeName(p.type) + " data) needs " +
                                                typeName(p.type));
  }
  if (z->type != p.y.type || z->n != p.y.n || z->c != p.y.c || z->h != p.y.h || z->w != p.y.w || z->ns != p.y.ns ||
      z->cs != p.y.cs || z->hs != p.y.hs || z->ws != p.y.ws || z->vectorized) {
    return fail(CUDNN_STATUS_NOT_SUPPORTED, where + "zDesc does not match yDesc (type, dimensions and strides)");
  }
  return ok();
}

// y = act(alpha1 * sums + alpha2 * z + bias) over y's elements; z is read only when alpha2 != 0.
void blendFused(const Problem& p, const double* sums, double alpha1, double alpha2, const void* z, const void* bias,
                bool relu, void* y) {
  const Tensor4& t = p.y;
  size_t i = 0;
  for (int n = 0; n < t.n; ++n) {
    for (int h = 0; h < t.h; ++h) {
      for (int w = 0; w < t.w; ++w) {
        for (int c = 0; c < t.c; ++c) {
          const int64_t off = t.offset(n, c, h, w);
          double v = alpha1 * sums[i++] + loadElement<double>(p.type, bias, c);
          if (alpha2 != 0.0) v += alpha2 * loadElement<double>(t.type, z, off);
          if (relu) v = v > 0.0 ? v : 0.0;
          storeElement(t.type, y, off, v);
        }
      }
    }
  }
}

}  // namespace

extern "C" cudnnStatus_t cudnnConvolutionBiasActivationForward(
    cudnnHandle_t handle, const void* alpha1, const cudnnTensorDescriptor_t xDesc, const void* x,
    const cudnnFilterDescriptor_t wDesc, const void* w, const cudnnConvolutionDescriptor_t convDesc,
    cudnnConvolutionFwdAlgo_t algo, void* workSpace, size_t workSpaceSizeInBytes, const void* alpha2,
    const cudnnTensorDescriptor_t zDesc, const void* z, const cudnnTensorDescriptor_t biasDesc, const void* bias,
    const cudnnActivationDescriptor_t activationDesc, const cudnnTensorDescriptor_t yDesc, void* y) {
  const char* call = "cudnnConvolutionBiasActivationForward";
  const std::string where = std::string(call) + ": ";
  RC_DNN_TRY(checkHandle(call, handle));
  Problem p{};
  RC_DNN_TRY(makeProblem(call, xDesc, wDesc, convDesc, yDesc, kForwardStatuses, &p));
  const int al = static_cast<int>(algo);
  if (al < 0 || al >= CUDNN_CONVOLUTION_FWD_ALGO_COUNT) {
    return fail(CUDNN_STATUS_BAD_PARAM, where + "algorithm " + std::to_string(al) + " is not a forward algorithm");
  }
  RC_DNN_TRY(checkFusedOperands(where, p, al, zDesc, biasDesc, activationDesc));
  double a1 = 0, a2 = 0;
  RC_DNN_TRY(readScaling(call, p, alpha1, alpha2, &a1, &a2));
  const Buffer xb{x, p.x.extentBytes(), "x"}, wb{w, p.w.bytes(), "w"}, yb{y, p.y.extentBytes(), "y"};
  const Buffer zb{z, p.y.extentBytes(), "z"};
  const Buffer bb{bias, static_cast<size_t>(p.K) * elementSize(p.type), "bias"};
  for (const Buffer& operand : {xb, wb, yb, zb, bb})
    RC_DNN_TRY(checkDeviceData(call, operand.what, operand.p, operand.bytes));
  size_t required = 0;
  RC_DNN_TRY(checkAlgorithm(call, p, Pass::Forward, al, workSpace, workSpaceSizeInBytes, &required));
  const bool relu = activationDesc->mode == CUDNN_ACTIVATION_RELU;
  return queue(handle->stream,
               deviceOp(call, {xb, wb, yb, zb, bb, {workSpace, required, "the workspace"}},
                        [p, al, x, w, workSpace, a1, a2, z, bias, relu, y] {
                          const std::vector<double> sums = p.doubleCompute
                                                               ? forwardDense<double>(p, al, x, w, workSpace)
                                                               : forwardDense<float>(p, al, x, w, workSpace);
                          blendFused(p, sums.data(), a1, a2, z, bias, relu, y);
                        }),
               call);
}
