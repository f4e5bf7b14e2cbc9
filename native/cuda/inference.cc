// The inference plan on the CUDA backend (native/core/inference_plan.h). Each convolution node is
// one cudnnConvolutionBiasActivationForward: y = act(conv(x) + z + bias), with the residual value as
// z (alpha2 = 1, or alpha2 = 0 without one) and act ReLU or the identity. cuDNN runs the identity
// only with CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM (cudnnActivationMode_t, cuDNN 9 API:
// https://docs.nvidia.com/deeplearning/cudnn/backend/v9.6.0/api/cudnn-graph-library.html), so those
// nodes take it; the others take the fastest algorithm cudnnFind measures within the workspace
// limit. The bias has the activations' type, as the call's supported configurations require
// (FLOAT_CONFIG, PSEUDO_HALF_CONFIG, PSEUDO_BFLOAT16_CONFIG:
// https://docs.nvidia.com/deeplearning/cudnn/backend/v9.6.0/api/cudnn-cnn-library.html).
//
// Everything is decided when the plan is created: descriptors, algorithms, the weights uploaded in
// the compute type, the activation buffers (assigned by liveness: a buffer is reused once the last
// node reading its value has run) and one workspace. run() only enqueues on the context's stream:
// no allocation, no host wait, no descriptor work, so it can be captured in a CUDA graph. Max
// pooling and global average pooling use the project's NHWC kernels (pool.cu); the classifier is
// one cublasGemmEx writing the f32 logits, followed by the bias kernel.
#include <algorithm>
#include <map>
#include <sstream>

#include "../core/allocator.h"
#include "../core/error.h"
#include "../core/inference_plan.h"
#include "cuda_check.h"
#include "cuda_ops.h"
#include "handles.h"
#include "kernels.h"

namespace rc::cuda {

namespace {

using ActivationDescriptor = Handle<cudnnActivationDescriptor_t, cudnnDestroyActivationDescriptor>;

// The most workspace one convolution may use: a quarter of what is free, at most 256 MiB, so a
// small batch does not pay for training-sized workspaces.
size_t inferenceWorkspaceLimit() {
  size_t freeBytes = 0, totalBytes = 0;
  RC_CUDA_CHECK(cudaMemGetInfo(&freeBytes, &totalBytes));
  return std::min(freeBytes / 4, size_t{256} << 20);
}

int dim(int64_t v) { return static_cast<int>(v); }

const char* algorithmName(cudnnConvolutionFwdAlgo_t algo) {
  switch (algo) {
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM: return "implicit_gemm";
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM: return "implicit_precomp_gemm";
    case CUDNN_CONVOLUTION_FWD_ALGO_GEMM: return "gemm";
    case CUDNN_CONVOLUTION_FWD_ALGO_DIRECT: return "direct";
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT: return "fft";
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING: return "fft_tiling";
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD: return "winograd";
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED: return "winograd_nonfused";
    default: return "unknown";
  }
}

// A convolution node's cuDNN state.
struct ConvStep {
  TensorDescriptor x, y, bias;
  FilterDescriptor w;
  ConvolutionDescriptor conv;
  ActivationDescriptor act;
  cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
  size_t workspaceBytes = 0;
};

// One node as run() sees it.
struct Step {
  InferenceOp op;
  int64_t input, residual, output;
  Shape in, out;         // value shapes
  InferenceNode window;  // pooling windows (weights left empty)
  std::unique_ptr<ConvStep> conv;
  Tensor weight, bias;  // conv: compute dtype; linear: weight in the compute dtype, bias f32
};

class CudaInferencePlan final : public InferencePlan {
 public:
  CudaInferencePlan(CudaContext& ctx, const InferencePlanParams& p)
      : ctx_(ctx), dtype_(p.dtype), shapes_(inferenceValueShapes(p)) {
    RC_CHECK_ARG(!p.int8, "inference plan: INT8 plans run on the CPU backend; on " << ctx.rcDevice().str()
                                                                                   << " use dtype f32, bf16 or f16");
    DeviceGuard guard(ctx.device());
    const int64_t count = static_cast<int64_t>(p.nodes.size());
    outputToY_ = p.nodes.back().op == InferenceOp::Linear;
    planBuffers(p);
    for (int64_t i = 0; i < count; ++i) steps_.push_back(makeStep(p.nodes[static_cast<size_t>(i)], i + 1));
    if (workspaceBytes_ > 0) workspace_ = ctx.allocate({static_cast<int64_t>(workspaceBytes_)}, DType::U8);
    // The weights were copied from host vectors that belong to the caller: wait for the copies.
    RC_CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
    implementation_ = describe();
  }

  void run(const Tensor& x, const Tensor& y) override {
    DeviceGuard guard(ctx_.device());
    cudaStream_t stream = ctx_.stream();
    if (dtype_ != DType::F32) cast(DType::F32, x.data(), dtype_, value(0, x, y), x.numel(), stream);
    for (const Step& s : steps_) {
      void* in = value(s.input, x, y);
      void* out = value(s.output, x, y);
      switch (s.op) {
        case InferenceOp::Conv: runConv(s, in, s.residual >= 0 ? value(s.residual, x, y) : nullptr, out); break;
        case InferenceOp::MaxPool:
          maxPoolForward(dtype_, in, out, nullptr, s.in[0], s.in[1], s.in[2], s.in[3], s.out[1], s.out[2],
                         dim(s.window.kernelH), dim(s.window.kernelW), dim(s.window.strideH), dim(s.window.strideW),
                         dim(s.window.padH), dim(s.window.padW), stream);
          break;
        case InferenceOp::GlobalAvgPool:
          // One window over the whole image: the mean of each channel.
          avgPoolForward(dtype_, in, out, s.in[0], s.in[1], s.in[2], s.in[3], 1, 1, dim(s.in[1]), dim(s.in[2]), 1, 1, 0,
                         0, stream);
          break;
        case InferenceOp::Linear: runLinear(s, in, out); break;
      }
    }
    const int64_t last = static_cast<int64_t>(shapes_.size()) - 1;
    if (!outputToY_) cast(dtype_, value(last, x, y), DType::F32, y.data(), y.numel(), stream);
  }

  std::string implementation() const override { return implementation_; }

 private:
  // The device memory of value v: the caller's x (f32 plans) and y (a final linear node), else the
  // plan's buffer.
  void* value(int64_t v, const Tensor& x, const Tensor& y) const {
    if (v == 0 && dtype_ == DType::F32) return x.data();
    if (v == static_cast<int64_t>(shapes_.size()) - 1 && outputToY_) return y.data();
    return buffers_[static_cast<size_t>(slotOf_[static_cast<size_t>(v)])].data();
  }

  // Assigns each value that needs one a buffer, reusing a buffer once every node reading its
  // previous value has run, and allocates the buffers.
  void planBuffers(const InferencePlanParams& p) {
    const int64_t values = static_cast<int64_t>(shapes_.size());
    std::vector<int64_t> lastUse(static_cast<size_t>(values), -1);
    for (int64_t i = 0; i < static_cast<int64_t>(p.nodes.size()); ++i) {
      const InferenceNode& node = p.nodes[static_cast<size_t>(i)];
      lastUse[static_cast<size_t>(node.input)] = i;
      if (node.residual >= 0) lastUse[static_cast<size_t>(node.residual)] = i;
    }
    lastUse.back() = values;  // the output is read after the last node (the final cast)
    struct Slot {
      size_t bytes;
      int64_t busyUntil;  // the last node that reads the value it holds
    };
    std::vector<Slot> slots;
    slotOf_.assign(static_cast<size_t>(values), -1);
    for (int64_t v = 0; v < values; ++v) {
      if (v == 0 && dtype_ == DType::F32) continue;
      if (v == values - 1 && outputToY_) continue;
      const size_t bytes = shapeBytes(shapes_[static_cast<size_t>(v)], dtype_);
      // Node v - 1 writes value v (the input is converted before node 0): a buffer is free for it
      // when every node reading the value it holds comes before that node.
      const int64_t writer = v - 1;
      int best = -1;
      for (int s = 0; s < static_cast<int>(slots.size()); ++s) {
        const Slot& a = slots[static_cast<size_t>(s)];
        if (a.busyUntil >= writer) continue;
        // The smallest free buffer that fits, else the largest free one (which then grows).
        if (best < 0) {
          best = s;
          continue;
        }
        const Slot& b = slots[static_cast<size_t>(best)];
        const bool aFits = a.bytes >= bytes, bFits = b.bytes >= bytes;
        if ((aFits && (!bFits || a.bytes < b.bytes)) || (!aFits && !bFits && a.bytes > b.bytes)) best = s;
      }
      if (best < 0) {
        slots.push_back({bytes, lastUse[static_cast<size_t>(v)]});
        best = static_cast<int>(slots.size()) - 1;
      } else {
        Slot& slot = slots[static_cast<size_t>(best)];
        slot.bytes = std::max(slot.bytes, bytes);
        slot.busyUntil = lastUse[static_cast<size_t>(v)];
      }
      slotOf_[static_cast<size_t>(v)] = best;
    }
    for (const Slot& slot : slots) {
      const int64_t elements = static_cast<int64_t>(slot.bytes / dtypeSize(dtype_));
      buffers_.push_back(ctx_.allocate({elements}, dtype_));
      activationBytes_ += slot.bytes;
    }
  }

  // A host f32 array on the device in `dtype`.
  Tensor upload(const std::vector<float>& host, const Shape& shape, DType dtype) {
    Tensor f32 = ctx_.allocate(shape, DType::F32);
    RC_CUDA_CHECK(
        cudaMemcpyAsync(f32.data(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice, ctx_.stream()));
    if (dtype == DType::F32) return f32;
    Tensor out = ctx_.allocate(shape, dtype);
    cast(DType::F32, f32.data(), dtype, out.data(), out.numel(), ctx_.stream());
    return out;
  }

  Step makeStep(const InferenceNode& node, int64_t output) {
    Step s{node.op,
           node.input,
           node.residual,
           output,
           shapes_[static_cast<size_t>(node.input)],
           shapes_[static_cast<size_t>(output)],
           InferenceNode{},
           nullptr,
           Tensor{},
           Tensor{}};
    s.window.kernelH = node.kernelH;
    s.window.kernelW = node.kernelW;
    s.window.strideH = node.strideH;
    s.window.strideW = node.strideW;
    s.window.padH = node.padH;
    s.window.padW = node.padW;
    switch (node.op) {
      case InferenceOp::Conv:
        s.weight = upload(node.weight, {node.outChannels, node.kernelH, node.kernelW, node.inChannels}, dtype_);
        s.bias = upload(node.bias, {node.outChannels}, dtype_);
        s.conv = makeConv(node, s, output);
        break;
      case InferenceOp::MaxPool:
        RC_CHECK_ARG(node.dilationH == 1 && node.dilationW == 1,
                     "inference node " << output - 1 << " (maxpool): dilated max pooling is not supported on "
                                       << ctx_.rcDevice().str());
        break;
      case InferenceOp::GlobalAvgPool: break;
      case InferenceOp::Linear:
        s.weight = upload(node.weight, {node.outChannels, node.inChannels}, dtype_);
        s.bias = upload(node.bias, {node.outChannels}, DType::F32);
        break;
    }
    return s;
  }

  std::unique_ptr<ConvStep> makeConv(const InferenceNode& node, const Step& s, int64_t output) {
    std::ostringstream where;
    where << "inference node " << output - 1 << " (conv " << node.inChannels << "->" << node.outChannels << " "
          << node.kernelH << "x" << node.kernelW << ")";
    const std::string context = where.str();
    auto c = std::make_unique<ConvStep>();
    const cudnnDataType_t dt = toCudnn(dtype_);
    RC_CUDNN_CHECK(cudnnCreateTensorDescriptor(c->x.out()), context);
    RC_CUDNN_CHECK(cudnnCreateTensorDescriptor(c->y.out()), context);
    RC_CUDNN_CHECK(cudnnCreateTensorDescriptor(c->bias.out()), context);
    RC_CUDNN_CHECK(cudnnCreateFilterDescriptor(c->w.out()), context);
    RC_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(c->conv.out()), context);
    RC_CUDNN_CHECK(cudnnCreateActivationDescriptor(c->act.out()), context);
    RC_CUDNN_CHECK(
        cudnnSetTensor4dDescriptor(c->x, CUDNN_TENSOR_NHWC, dt, dim(s.in[0]), dim(s.in[3]), dim(s.in[1]), dim(s.in[2])),
        context);
    RC_CUDNN_CHECK(cudnnSetTensor4dDescriptor(c->y, CUDNN_TENSOR_NHWC, dt, dim(s.out[0]), dim(s.out[3]), dim(s.out[1]),
                                              dim(s.out[2])),
                   context);
    RC_CUDNN_CHECK(cudnnSetTensor4dDescriptor(c->bias, CUDNN_TENSOR_NCHW, dt, 1, dim(node.outChannels), 1, 1), context);
    RC_CUDNN_CHECK(cudnnSetFilter4dDescriptor(c->w, dt, CUDNN_TENSOR_NHWC, dim(node.outChannels), dim(node.inChannels),
                                              dim(node.kernelH), dim(node.kernelW)),
                   context);
    RC_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(c->conv, dim(node.padH), dim(node.padW), dim(node.strideH),
                                                   dim(node.strideW), dim(node.dilationH), dim(node.dilationW),
                                                   CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                   context);
    // f32 uses plain FMA unless TF32 is allowed; bf16/f16 use the tensor cores.
    const cudnnMathType_t math =
        dtype_ == DType::F32 ? (ctx_.allowTf32() ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH) : CUDNN_TENSOR_OP_MATH;
    RC_CUDNN_CHECK(cudnnSetConvolutionMathType(c->conv, math), context);
    RC_CUDNN_CHECK(cudnnSetActivationDescriptor(c->act, node.relu ? CUDNN_ACTIVATION_RELU : CUDNN_ACTIVATION_IDENTITY,
                                                CUDNN_NOT_PROPAGATE_NAN, 0.0),
                   context);
    if (node.relu) {
      chooseAlgorithm(*c, s, context);
    } else {
      c->algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
      RC_CUDNN_CHECK(
          cudnnGetConvolutionForwardWorkspaceSize(ctx_.cudnn(), c->x, c->w, c->conv, c->y, c->algo, &c->workspaceBytes),
          context);
    }
    workspaceBytes_ = std::max(workspaceBytes_, c->workspaceBytes);
    return c;
  }

  // The fastest algorithm cudnnFind measures within the workspace limit, and its math type. The
  // workspace offered is the largest that an algorithm within the limit asks for.
  void chooseAlgorithm(ConvStep& c, const Step& s, const std::string& context) {
    const size_t limit = inferenceWorkspaceLimit();
    size_t offered = 0;
    for (int a = 0; a < CUDNN_CONVOLUTION_FWD_ALGO_COUNT; ++a) {
      size_t bytes = 0;
      const cudnnStatus_t st = cudnnGetConvolutionForwardWorkspaceSize(
          ctx_.cudnn(), c.x, c.w, c.conv, c.y, static_cast<cudnnConvolutionFwdAlgo_t>(a), &bytes);
      if (st == CUDNN_STATUS_SUCCESS && bytes <= limit) offered = std::max(offered, bytes);
    }
    // Measured on non-zero data (zeros can run faster than real values).
    Tensor x = ctx_.allocate(s.in, dtype_), y = ctx_.allocate(s.out, dtype_);
    RC_CUDA_CHECK(cudaMemsetAsync(x.data(), 0x3c, x.nbytes(), ctx_.stream()));
    Tensor ws = offered > 0 ? ctx_.allocate({static_cast<int64_t>(offered)}, DType::U8) : Tensor{};
    constexpr int kMax = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
    cudnnConvolutionFwdAlgoPerf_t perf[kMax];
    int returned = 0;
    RC_CUDNN_CHECK(
        cudnnFindConvolutionForwardAlgorithmEx(ctx_.cudnn(), c.x, x.data(), c.w, s.weight.data(), c.conv, c.y, y.data(),
                                               kMax, &returned, perf, offered > 0 ? ws.data() : nullptr, offered),
        context);
    for (int i = 0; i < returned; ++i) {
      if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= offered) {
        c.algo = perf[i].algo;
        c.workspaceBytes = perf[i].memory;
        RC_CUDNN_CHECK(cudnnSetConvolutionMathType(c.conv, perf[i].mathType), context);
        return;
      }
    }
    RC_THROW(code::kCudnn,
             "cuDNN found no forward algorithm for " << context << " within " << formatBytes(limit) << " of workspace");
  }

  void runConv(const Step& s, const void* in, const void* residual, void* out) const {
    const ConvStep& c = *s.conv;
    const float one = 1.0f, zero = 0.0f;
    // Without a residual, z is y itself with alpha2 = 0 (not read).
    RC_CUDNN_CHECK(cudnnConvolutionBiasActivationForward(ctx_.cudnn(), &one, c.x, in, c.w, s.weight.data(), c.conv,
                                                         c.algo, c.workspaceBytes > 0 ? workspace_.data() : nullptr,
                                                         c.workspaceBytes, residual != nullptr ? &one : &zero, c.y,
                                                         residual != nullptr ? residual : out, c.bias, s.bias.data(),
                                                         c.act, c.y, out),
                   "inference node " << s.output - 1);
  }

  void runLinear(const Step& s, const void* in, void* out) const {
    const bool toLogits = s.output == static_cast<int64_t>(shapes_.size()) - 1 && outputToY_;
    const DType outType = toLogits ? DType::F32 : dtype_;
    const int64_t n = s.in[0], features = s.in[1], classes = s.out[1];
    const float one = 1.0f, zero = 0.0f;
    const cudaDataType_t t = toCudaDataType(dtype_);
    const cublasComputeType_t compute =
        dtype_ == DType::F32 && ctx_.allowTf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    // Row-major y[n, classes] = x[n, features] W[classes, features]^T as a column-major product.
    RC_CUBLAS_CHECK(cublasGemmEx(ctx_.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, dim(classes), dim(n), dim(features), &one,
                                 s.weight.data(), t, dim(features), in, t, dim(features), &zero, out,
                                 toCudaDataType(outType), dim(classes), compute, CUBLAS_GEMM_DEFAULT),
                    "inference node " << s.output - 1 << " (linear)");
    addBias(outType, out, s.bias.ptr<float>(), n, classes, ctx_.stream());
  }

  std::string describe() const {
    std::map<std::string, int> algos;
    for (const Step& s : steps_) {
      if (s.conv) ++algos[algorithmName(s.conv->algo)];
    }
    std::ostringstream out;
    out << "cudnn:conv_bias_act[";
    bool first = true;
    for (const auto& [name, n] : algos) {
      out << (first ? "" : ",") << name << "x" << n;
      first = false;
    }
    out << "]+cublas " << dtypeName(dtype_) << (dtype_ == DType::F32 ? (ctx_.allowTf32() ? " tf32" : "") : " tensor-op")
        << " activations " << formatBytes(activationBytes_) << " workspace " << formatBytes(workspaceBytes_);
    return out.str();
  }

  CudaContext& ctx_;
  DType dtype_;
  std::vector<Shape> shapes_;
  bool outputToY_ = false;
  std::vector<int> slotOf_;  // value -> buffer, -1 where the caller's tensor is used
  std::vector<Tensor> buffers_;
  size_t activationBytes_ = 0;
  std::vector<Step> steps_;
  size_t workspaceBytes_ = 0;
  Tensor workspace_;
  std::string implementation_;
};

}  // namespace

std::unique_ptr<InferencePlan> buildInferencePlan(CudaContext& ctx, const InferencePlanParams& params) {
  return std::make_unique<CudaInferencePlan>(ctx, params);
}

}  // namespace rc::cuda
