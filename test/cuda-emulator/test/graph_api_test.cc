// Unit test of the emulated cuDNN backend (graph) API (src/dnn_graph.cc) over the emulated runtime:
// a scale-bias-ReLU-convolution-statistics graph, the dgrad-drelu-dbn graph (convolution backward
// data, RELU_BWD, BN_BWD_WEIGHTS) and a scale-bias-ReLU-wgrad graph (convolution backward filter)
// against direct computations, and the documented refusals (a finalized descriptor, wrong attribute
// types and counts, unfinalized arguments, inconsistent shapes, a missing variant-pack entry or
// workspace, the backward nodes' operands), and the engines' refusal of the patterns that
// RESNET_CUDA_EMU_GRAPH_REFUSE names. test/fused-conv-bn.test.ts runs it; it prints
// "graph api: N passed, M failed".
#include <cudnn.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "dnn_check.h"

namespace {

using rc_emu_test::dnn::check;

using Desc = cudnnBackendDescriptor_t;

Desc create(cudnnBackendDescriptorType_t type) {
  Desc d = nullptr;
  check(cudnnBackendCreateDescriptor(type, &d) == CUDNN_STATUS_SUCCESS, "create descriptor");
  return d;
}

cudnnStatus_t setInts(Desc d, cudnnBackendAttributeName_t name, const std::vector<int64_t>& v) {
  return cudnnBackendSetAttribute(d, name, CUDNN_TYPE_INT64, static_cast<int64_t>(v.size()), v.data());
}

cudnnStatus_t setDesc(Desc d, cudnnBackendAttributeName_t name, Desc v) {
  return cudnnBackendSetAttribute(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

// A tensor with dims [n, c, h, w] laid out NHWC.
Desc tensor(int64_t uid, std::vector<int64_t> dims, bool isVirtual, bool finalize = true) {
  Desc d = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t n = dims[0], c = dims[1], h = dims[2], w = dims[3];
  (void)n;
  const std::vector<int64_t> strides = {h * w * c, 1, w * c, c};
  const cudnnDataType_t type = CUDNN_DATA_FLOAT;
  const int64_t alignment = 4;
  setInts(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, {uid});
  cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  setInts(d, CUDNN_ATTR_TENSOR_DIMENSIONS, dims);
  setInts(d, CUDNN_ATTR_TENSOR_STRIDES, strides);
  setInts(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, {alignment});
  cudnnBackendSetAttribute(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &isVirtual);
  if (finalize) check(cudnnBackendFinalize(d) == CUDNN_STATUS_SUCCESS, "finalize tensor " + std::to_string(uid));
  return d;
}

Desc pointwise(cudnnPointwiseMode_t mode, Desc x, Desc b, Desc y, float alpha2 = 1.0f) {
  Desc pw = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
  check(cudnnBackendFinalize(pw) == CUDNN_STATUS_SUCCESS, "finalize pointwise descriptor");
  Desc op = create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  setDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
  setDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
  if (b != nullptr) setDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
  if (alpha2 != 1.0f) cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &alpha2);
  setDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
  check(cudnnBackendFinalize(op) == CUDNN_STATUS_SUCCESS, "finalize pointwise operation");
  cudnnBackendDestroyDescriptor(pw);
  return op;
}

Desc convolution(int64_t pad) {
  Desc c = create(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  cudnnBackendSetAttribute(c, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
  cudnnBackendSetAttribute(c, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  setInts(c, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, {2});
  setInts(c, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, {pad, pad});
  setInts(c, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, {pad, pad});
  setInts(c, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, {1, 1});
  setInts(c, CUDNN_ATTR_CONVOLUTION_DILATIONS, {1, 1});
  check(cudnnBackendFinalize(c) == CUDNN_STATUS_SUCCESS, "finalize convolution");
  return c;
}

Desc convForward(Desc conv, Desc x, Desc w, Desc y) {
  Desc op = create(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
  const float alpha = 1.0f, beta = 0.0f;
  setDesc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv);
  setDesc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x);
  setDesc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w);
  setDesc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, y);
  cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
  cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
  return op;
}

Desc graphOf(cudnnHandle_t handle, const std::vector<Desc>& ops, cudnnStatus_t* status) {
  Desc g = create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  cudnnBackendSetAttribute(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  cudnnBackendSetAttribute(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                           static_cast<int64_t>(ops.size()), ops.data());
  *status = cudnnBackendFinalize(g);
  return g;
}

// x [N, C, H, W] NHWC, 3x3 filters, pad 1: y = conv(relu(x * scale + bias)), with y's channel sums.
struct Problem {
  static constexpr int64_t N = 2, C = 3, H = 4, W = 3, K = 2, R = 3, S = 3;
  std::vector<float> x, w, scale, bias;

  Problem() {
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    x.resize(N * H * W * C);
    w.resize(K * R * S * C);
    scale.resize(C);
    bias.resize(C);
    for (auto* v : {&x, &w, &scale, &bias}) {
      for (float& e : *v) e = u(rng);
    }
  }

  // y (NHWC) and the per-channel sum and sum of squares, every intermediate rounded to f32.
  void expected(std::vector<double>& y, std::vector<double>& sum, std::vector<double>& sq) const {
    std::vector<float> a(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const size_t c = i % C;
      const float scaled = static_cast<float>(double(x[i]) * scale[c]);
      const float shifted = static_cast<float>(double(scaled) + bias[c]);
      a[i] = shifted > 0.0f ? shifted : 0.0f;
    }
    y.assign(N * H * W * K, 0.0);
    sum.assign(K, 0.0);
    sq.assign(K, 0.0);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t p = 0; p < H; ++p) {
        for (int64_t q = 0; q < W; ++q) {
          for (int64_t k = 0; k < K; ++k) {
            double acc = 0.0;
            for (int64_t r = 0; r < R; ++r) {
              for (int64_t s = 0; s < S; ++s) {
                const int64_t h = p - 1 + r, ww = q - 1 + s;
                if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
                for (int64_t c = 0; c < C; ++c) {
                  acc += double(a[((n * H + h) * W + ww) * C + c]) * w[((k * R + r) * S + s) * C + c];
                }
              }
            }
            const double v = static_cast<float>(acc);
            y[((n * H + p) * W + q) * K + k] = v;
            sum[k] += v;
            sq[k] += v * v;
          }
        }
      }
    }
  }
};

template <typename T>
T* upload(const std::vector<T>& host) {
  T* d = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&d), host.size() * sizeof(T));
  cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}

bool near(double got, double want, double tol) { return std::fabs(got - want) <= tol * (1.0 + std::fabs(want)); }

void fullGraph() {
  using P = Problem;
  P prob;
  cudaStream_t stream = nullptr;
  cudnnHandle_t handle = nullptr;
  cudaStreamCreate(&stream);
  cudnnCreate(&handle);
  cudnnSetStream(handle, stream);

  Desc x = tensor(1, {P::N, P::C, P::H, P::W}, false);
  Desc scale = tensor(2, {1, P::C, 1, 1}, false);
  Desc bias = tensor(3, {1, P::C, 1, 1}, false);
  Desc w = tensor(4, {P::K, P::C, P::R, P::S}, false);
  Desc y = tensor(5, {P::N, P::K, P::H, P::W}, false);
  Desc sum = tensor(6, {1, P::K, 1, 1}, false);
  Desc sq = tensor(7, {1, P::K, 1, 1}, false);
  Desc t1 = tensor(101, {P::N, P::C, P::H, P::W}, true);
  Desc t2 = tensor(102, {P::N, P::C, P::H, P::W}, true);
  Desc t3 = tensor(103, {P::N, P::C, P::H, P::W}, true);

  Desc mul = pointwise(CUDNN_POINTWISE_MUL, x, scale, t1);
  Desc add = pointwise(CUDNN_POINTWISE_ADD, t1, bias, t2);
  Desc relu = pointwise(CUDNN_POINTWISE_RELU_FWD, t2, nullptr, t3);
  Desc conv = convolution(1);
  Desc fwd = convForward(conv, t3, w, y);
  check(cudnnBackendFinalize(fwd) == CUDNN_STATUS_SUCCESS, "finalize convolution forward");
  Desc stats = create(CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR);
  const cudnnGenStatsMode_t mode = CUDNN_GENSTATS_SUM_SQSUM;
  const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  cudnnBackendSetAttribute(stats, CUDNN_ATTR_OPERATION_GENSTATS_MODE, CUDNN_TYPE_GENSTATS_MODE, 1, &mode);
  cudnnBackendSetAttribute(stats, CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
  setDesc(stats, CUDNN_ATTR_OPERATION_GENSTATS_XDESC, y);
  setDesc(stats, CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, sum);
  setDesc(stats, CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC, sq);
  check(cudnnBackendFinalize(stats) == CUDNN_STATUS_SUCCESS, "finalize gen stats");

  // Operations in an order other than their dependencies: the graph orders them.
  cudnnStatus_t status;
  Desc graph = graphOf(handle, {stats, fwd, relu, add, mul}, &status);
  check(status == CUDNN_STATUS_SUCCESS, "finalize the operation graph");

  // The same unique id for two different tensors is refused.
  Desc other = tensor(1, {P::N, P::K, P::H, P::W}, false);
  Desc clash = pointwise(CUDNN_POINTWISE_RELU_FWD, y, nullptr, other);
  Desc bad = graphOf(handle, {fwd, clash, relu, add, mul}, &status);
  check(status == CUDNN_STATUS_BAD_PARAM, "a unique id naming two tensors: BAD_PARAM");
  cudnnBackendDestroyDescriptor(bad);

  Desc heur = create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  const cudnnBackendHeurMode_t heurMode = CUDNN_HEUR_MODE_A;
  setDesc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &heurMode);
  check(cudnnBackendFinalize(heur) == CUDNN_STATUS_SUCCESS, "finalize heuristics");
  Desc cfg = create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  int64_t count = 0;
  check(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, &cfg) ==
                CUDNN_STATUS_SUCCESS &&
            count == 1,
        "heuristics return one engine configuration");

  Desc plan = create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  check(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &count, &count) ==
            CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED,
        "reading an unfinalized plan: BAD_PARAM_NOT_FINALIZED");
  cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  setDesc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
  check(cudnnBackendFinalize(plan) == CUDNN_STATUS_SUCCESS, "finalize the plan");
  int64_t workspaceBytes = -1;
  check(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &count,
                                 &workspaceBytes) == CUDNN_STATUS_SUCCESS &&
            workspaceBytes == 3 * P::N * P::C * P::H * P::W * 4,
        "the plan's workspace holds the three virtual tensors");

  // Every descriptor but the plan may go now: the plan holds what it needs.
  for (Desc d :
       {x, scale, bias, w, y, sum, sq, t1, t2, t3, other, mul, add, relu, conv, fwd, stats, clash, graph, heur, cfg}) {
    cudnnBackendDestroyDescriptor(d);
  }

  float* dx = upload(prob.x);
  float* dscale = upload(prob.scale);
  float* dbias = upload(prob.bias);
  float* dw = upload(prob.w);
  float *dy = nullptr, *dsum = nullptr, *dsq = nullptr;
  void* ws = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&dy), P::N * P::H * P::W * P::K * sizeof(float));
  cudaMalloc(reinterpret_cast<void**>(&dsum), P::K * sizeof(float));
  cudaMalloc(reinterpret_cast<void**>(&dsq), P::K * sizeof(float));
  cudaMalloc(&ws, static_cast<size_t>(workspaceBytes));

  auto pack = [&](std::vector<int64_t> uids, std::vector<void*> ptrs, void* workspace) {
    Desc vp = create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    setInts(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids);
    cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                             static_cast<int64_t>(ptrs.size()), ptrs.data());
    cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    check(cudnnBackendFinalize(vp) == CUDNN_STATUS_SUCCESS, "finalize a variant pack");
    return vp;
  };
  Desc missing = pack({1, 2, 3, 4, 5, 6}, {dx, dscale, dbias, dw, dy, dsum}, ws);
  check(cudnnBackendExecute(handle, plan, missing) == CUDNN_STATUS_BAD_PARAM,
        "a variant pack without tensor 7: BAD_PARAM");
  Desc noWorkspace = pack({1, 2, 3, 4, 5, 6, 7}, {dx, dscale, dbias, dw, dy, dsum, dsq}, nullptr);
  check(cudnnBackendExecute(handle, plan, noWorkspace) == CUDNN_STATUS_BAD_PARAM, "no workspace: BAD_PARAM");
  Desc good = pack({1, 2, 3, 4, 5, 6, 7}, {dx, dscale, dbias, dw, dy, dsum, dsq}, ws);
  check(cudnnBackendExecute(handle, plan, good) == CUDNN_STATUS_SUCCESS, "execute");
  cudaStreamSynchronize(stream);

  std::vector<float> gy(P::N * P::H * P::W * P::K), gsum(P::K), gsq(P::K);
  cudaMemcpy(gy.data(), dy, gy.size() * sizeof(float), cudaMemcpyDeviceToHost);
  cudaMemcpy(gsum.data(), dsum, gsum.size() * sizeof(float), cudaMemcpyDeviceToHost);
  cudaMemcpy(gsq.data(), dsq, gsq.size() * sizeof(float), cudaMemcpyDeviceToHost);
  std::vector<double> ey, esum, esq;
  prob.expected(ey, esum, esq);
  bool ok = true;
  for (size_t i = 0; i < ey.size(); ++i) ok = ok && near(gy[i], ey[i], 1e-6);
  check(ok, "y = conv(relu(x * scale + bias)) against a direct sum");
  ok = true;
  for (int64_t k = 0; k < P::K; ++k) ok = ok && near(gsum[k], esum[k], 1e-5) && near(gsq[k], esq[k], 1e-5);
  check(ok, "the channel sums and sums of squares of y");

  for (Desc d : {missing, noWorkspace, good, plan}) cudnnBackendDestroyDescriptor(d);
  for (void* p : {static_cast<void*>(dx), static_cast<void*>(dscale), static_cast<void*>(dbias), static_cast<void*>(dw),
                  static_cast<void*>(dy), static_cast<void*>(dsum), static_cast<void*>(dsq), ws}) {
    cudaFree(p);
  }
  cudnnDestroy(handle);
  cudaStreamDestroy(stream);
}

// Finalizes `ops` as a graph and returns its plan (and the plan's workspace size); every
// descriptor besides the plan is destroyed.
Desc planOf(cudnnHandle_t handle, const std::vector<Desc>& ops, int64_t* workspaceBytes) {
  cudnnStatus_t status;
  Desc graph = graphOf(handle, ops, &status);
  check(status == CUDNN_STATUS_SUCCESS, "finalize the operation graph");
  Desc heur = create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  const cudnnBackendHeurMode_t heurMode = CUDNN_HEUR_MODE_A;
  setDesc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &heurMode);
  check(cudnnBackendFinalize(heur) == CUDNN_STATUS_SUCCESS, "finalize heuristics");
  Desc cfg = create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  int64_t count = 0;
  cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, &cfg);
  Desc plan = create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  setDesc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
  check(cudnnBackendFinalize(plan) == CUDNN_STATUS_SUCCESS, "finalize the plan");
  cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &count, workspaceBytes);
  for (Desc d : {graph, heur, cfg}) cudnnBackendDestroyDescriptor(d);
  for (Desc d : ops) cudnnBackendDestroyDescriptor(d);
  return plan;
}

// Runs `plan` with the (uid, device pointer) pairs and a workspace of `workspaceBytes`.
void execute(cudnnHandle_t handle, cudaStream_t stream, Desc plan, const std::vector<int64_t>& uids,
             const std::vector<void*>& ptrs, int64_t workspaceBytes) {
  void* ws = nullptr;
  if (workspaceBytes > 0) cudaMalloc(&ws, static_cast<size_t>(workspaceBytes));
  Desc vp = create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  setInts(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids);
  cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                           static_cast<int64_t>(ptrs.size()), ptrs.data());
  cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
  check(cudnnBackendFinalize(vp) == CUDNN_STATUS_SUCCESS, "finalize a variant pack");
  check(cudnnBackendExecute(handle, plan, vp) == CUDNN_STATUS_SUCCESS, "execute");
  cudaStreamSynchronize(stream);
  cudnnBackendDestroyDescriptor(vp);
  if (ws != nullptr) cudaFree(ws);
}

std::vector<float> download(const float* d, size_t n) {
  std::vector<float> host(n);
  cudaMemcpy(host.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
  return host;
}

Desc convBackwardData(Desc conv, Desc dy, Desc w, Desc dx) {
  Desc op = create(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR);
  setDesc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, conv);
  setDesc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, dy);
  setDesc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, w);
  setDesc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, dx);
  return op;
}

Desc convBackwardFilter(Desc conv, Desc x, Desc dy, Desc dw) {
  Desc op = create(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR);
  setDesc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, conv);
  setDesc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, x);
  setDesc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, dy);
  setDesc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, dw);
  return op;
}

// A RELU_BWD operation: dx = dy where x > 0 (not finalized).
Desc reluBackward(Desc x, Desc dy, Desc dx) {
  Desc pw = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  const cudnnPointwiseMode_t mode = CUDNN_POINTWISE_RELU_BWD;
  const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
  check(cudnnBackendFinalize(pw) == CUDNN_STATUS_SUCCESS, "finalize the RELU_BWD descriptor");
  Desc op = create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  setDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
  setDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
  setDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_DYDESC, dy);
  setDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_DXDESC, dx);
  cudnnBackendDestroyDescriptor(pw);
  return op;
}

// The batch norm's backward weights (not finalized): per[] = mean, invStd, scale, dScale, dBias,
// eqDy, eqX, eqBias.
Desc bnBackwardWeights(Desc x, Desc dy, const std::vector<Desc>& per) {
  Desc op = create(CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR);
  const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
  setDesc(op, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_X_DESC, x);
  setDesc(op, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DY_DESC, dy);
  const cudnnBackendAttributeName_t names[] = {
      CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MEAN_DESC,       CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_INVSTD_DESC,
      CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_BN_SCALE_DESC,   CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_SCALE_DESC,
      CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_BIAS_DESC,   CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_DY_SCALE_DESC,
      CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_X_SCALE_DESC, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_BIAS};
  for (size_t i = 0; i < per.size() && i < 8; ++i) setDesc(op, names[i], per[i]);
  return op;
}

// The backward of y = conv(relu(x * scale + shift), w) on x [N, C, H, W] NHWC, 3x3 filters, stride
// 2, pad 1 (y [N, K, P, Q]), f32 throughout, with the batch norm's mean, invStd and gamma.
struct BackwardProblem {
  static constexpr int64_t N = 2, C = 3, H = 4, W = 3, K = 2, R = 3, S = 3, P = 2, Q = 2, M = N * H * W;
  std::vector<float> x, w, dy, scale, shift, mean, invStd, gamma;

  BackwardProblem() {
    std::mt19937 rng(23);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    x.resize(N * H * W * C);
    w.resize(K * R * S * C);
    dy.resize(N * P * Q * K);
    for (auto* v : {&x, &w, &dy}) {
      for (float& e : *v) e = u(rng);
    }
    for (int64_t c = 0; c < C; ++c) {
      scale.push_back(1.0f + 0.5f * u(rng));
      shift.push_back(0.3f * u(rng));
      mean.push_back(0.2f * u(rng));
      invStd.push_back(1.0f + 0.5f * u(rng));
      gamma.push_back(1.0f + 0.5f * u(rng));
    }
  }

  // Calls f(xIndex, wIndex, dyIndex) for every product term of the forward convolution.
  template <typename F>
  void terms(F&& f) const {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t p = 0; p < P; ++p)
        for (int64_t q = 0; q < Q; ++q)
          for (int64_t k = 0; k < K; ++k)
            for (int64_t r = 0; r < R; ++r)
              for (int64_t s = 0; s < S; ++s) {
                const int64_t h = p * 2 - 1 + r, ww = q * 2 - 1 + s;
                if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
                for (int64_t c = 0; c < C; ++c) {
                  f(((n * H + h) * W + ww) * C + c, ((k * R + r) * S + s) * C + c, ((n * P + p) * Q + q) * K + k);
                }
              }
  }

  // The batch norm's output (x - mean) * invStd * gamma + beta (beta: the shift values), rounded as
  // the graph's f32 virtual tensors are.
  float bnOut(size_t i) const {
    const size_t c = i % C;
    const auto centered = static_cast<float>(double(x[i]) - mean[c]);
    const auto scaled = static_cast<float>(double(static_cast<float>(double(centered) * invStd[c])) * gamma[c]);
    return static_cast<float>(double(scaled) + shift[c]);
  }

  // x * scale + shift, rounded as the graph's f32 virtual tensors are.
  float pre(size_t i) const {
    const size_t c = i % C;
    return static_cast<float>(double(static_cast<float>(double(x[i]) * scale[c])) + shift[c]);
  }

  // dz, and the per-channel dScale, dBias, eqDy, eqX, eqBias (out[5][C]).
  std::vector<double> dz(std::vector<std::vector<double>>& out) const {
    std::vector<double> dA(x.size(), 0.0);
    terms([&](int64_t xi, int64_t wi, int64_t yi) { dA[xi] += double(dy[yi]) * w[wi]; });
    std::vector<double> g(x.size());
    for (size_t i = 0; i < x.size(); ++i) g[i] = bnOut(i) > 0.0f ? static_cast<float>(dA[i]) : 0.0;
    out.assign(5, std::vector<double>(C, 0.0));
    std::vector<double> sumG(C, 0.0), sumGXc(C, 0.0);
    for (size_t i = 0; i < x.size(); ++i) {
      sumG[i % C] += g[i];
      sumGXc[i % C] += g[i] * (double(x[i]) - mean[i % C]);
    }
    for (int64_t c = 0; c < C; ++c) {
      const double is = invStd[c], eqDy = double(gamma[c]) * is, eqX = -double(gamma[c]) * is * is * is * sumGXc[c] / M;
      out[0][c] = sumGXc[c] * is;
      out[1][c] = sumG[c];
      out[2][c] = eqDy;
      out[3][c] = eqX;
      out[4][c] = -eqX * mean[c] - eqDy * sumG[c] / M;
    }
    return g;
  }

  // dw = wgrad(relu(x * scale + shift), dy).
  std::vector<double> dw() const {
    std::vector<double> out(w.size(), 0.0);
    terms([&](int64_t xi, int64_t wi, int64_t yi) {
      const float a = pre(static_cast<size_t>(xi));
      out[wi] += double(a > 0.0f ? a : 0.0f) * dy[yi];
    });
    return out;
  }
};

Desc strided(int64_t stride) {
  Desc c = create(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  cudnnBackendSetAttribute(c, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
  cudnnBackendSetAttribute(c, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  setInts(c, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, {2});
  setInts(c, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, {1, 1});
  setInts(c, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, {1, 1});
  setInts(c, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, {stride, stride});
  setInts(c, CUDNN_ATTR_CONVOLUTION_DILATIONS, {1, 1});
  check(cudnnBackendFinalize(c) == CUDNN_STATUS_SUCCESS, "finalize convolution");
  return c;
}

// dgrad -> (x - mean) * invStd * gamma + beta -> RELU_BWD -> BN_BWD_WEIGHTS, and scale-shift-ReLU -> wgrad.
void backwardGraphs() {
  using B = BackwardProblem;
  B prob;
  cudaStream_t stream = nullptr;
  cudnnHandle_t handle = nullptr;
  cudaStreamCreate(&stream);
  cudnnCreate(&handle);
  cudnnSetStream(handle, stream);
  const std::vector<int64_t> act = {B::N, B::C, B::H, B::W}, vec = {1, B::C, 1, 1};

  Desc dy = tensor(1, {B::N, B::K, B::P, B::Q}, false);
  Desc w = tensor(2, {B::K, B::C, B::R, B::S}, false);
  Desc x = tensor(3, act, false);
  Desc dz = tensor(4, act, false);
  std::vector<Desc> per;
  for (int64_t uid = 10; uid < 20; ++uid) per.push_back(tensor(uid, vec, false));  // scale, shift, then bn's 8
  Desc dA = tensor(101, act, true), t1 = tensor(102, act, true), t2 = tensor(103, act, true);
  Desc t3 = tensor(104, act, true), t4 = tensor(105, act, true);
  Desc conv = strided(2);
  Desc dgrad = convBackwardData(conv, dy, w, dA);
  check(cudnnBackendFinalize(dgrad) == CUDNN_STATUS_SUCCESS, "finalize convolution backward data");
  // The batch norm's output as the DgradDreluBNBwdWeight pattern recomputes it: ADD with alpha2 = -1
  // subtracts the mean; then invStd, gamma and beta (the shift tensor).
  Desc sub = pointwise(CUDNN_POINTWISE_ADD, x, per[2], t1, -1.0f);
  Desc mulInvStd = pointwise(CUDNN_POINTWISE_MUL, t1, per[3], t2);
  Desc mulGamma = pointwise(CUDNN_POINTWISE_MUL, t2, per[4], t3);
  Desc addBeta = pointwise(CUDNN_POINTWISE_ADD, t3, per[1], t4);
  Desc drelu = reluBackward(t4, dA, dz);
  check(cudnnBackendFinalize(drelu) == CUDNN_STATUS_SUCCESS, "finalize RELU_BWD");
  Desc dbn = bnBackwardWeights(x, dz, std::vector<Desc>(per.begin() + 2, per.end()));
  check(cudnnBackendFinalize(dbn) == CUDNN_STATUS_SUCCESS, "finalize BN_BWD_WEIGHTS");
  int64_t workspaceBytes = -1;
  Desc plan = planOf(handle, {dbn, drelu, addBeta, mulGamma, mulInvStd, sub, dgrad}, &workspaceBytes);
  check(workspaceBytes == 5 * B::M * B::C * 4, "the dgrad plan's workspace holds its five virtual tensors");

  float* ddy = upload(prob.dy);
  float* dw = upload(prob.w);
  float* dxv = upload(prob.x);
  std::vector<float*> dper;
  for (const auto* v : {&prob.scale, &prob.shift, &prob.mean, &prob.invStd, &prob.gamma}) dper.push_back(upload(*v));
  float* ddz = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&ddz), prob.x.size() * sizeof(float));
  for (int i = 0; i < 5; ++i) {
    float* out = nullptr;
    cudaMalloc(reinterpret_cast<void**>(&out), B::C * sizeof(float));
    dper.push_back(out);
  }
  std::vector<int64_t> uids = {1, 2, 3, 4};
  std::vector<void*> ptrs = {ddy, dw, dxv, ddz};
  for (int64_t i = 0; i < 10; ++i) {
    uids.push_back(10 + i);
    ptrs.push_back(dper[static_cast<size_t>(i)]);
  }
  execute(handle, stream, plan, uids, ptrs, workspaceBytes);
  std::vector<std::vector<double>> want;
  const std::vector<double> wantDz = prob.dz(want);
  const std::vector<float> gotDz = download(ddz, prob.x.size());
  bool ok = true, masked = false;
  for (size_t i = 0; i < wantDz.size(); ++i) {
    ok = ok && near(gotDz[i], wantDz[i], 1e-6);
    masked = masked || (prob.bnOut(i) <= 0.0f && gotDz[i] == 0.0f);
  }
  check(ok && masked,
        "dz = conv_backward_data(dy, w) masked where (x - mean) * invStd * gamma + beta <= 0, against a direct sum");
  const char* names[] = {"dScale", "dBias", "eqDy", "eqX", "eqBias"};
  for (int o = 0; o < 5; ++o) {
    const std::vector<float> got = download(dper[5 + static_cast<size_t>(o)], B::C);
    ok = true;
    for (int64_t c = 0; c < B::C; ++c) ok = ok && near(got[c], want[o][c], 1e-5);
    check(ok, std::string("BN_BWD_WEIGHTS's ") + names[o] + " against the batch norm's backward algebra");
  }
  cudnnBackendDestroyDescriptor(plan);

  // wgrad with the scale-bias-ReLU prologue: dw = wgrad(relu(x * scale + shift), dy).
  Desc dwT = tensor(5, {B::K, B::C, B::R, B::S}, false);
  Desc a1 = tensor(111, act, true), a2 = tensor(112, act, true), a3 = tensor(113, act, true);
  Desc mul2 = pointwise(CUDNN_POINTWISE_MUL, x, per[0], a1);
  Desc add2 = pointwise(CUDNN_POINTWISE_ADD, a1, per[1], a2);
  Desc relu2 = pointwise(CUDNN_POINTWISE_RELU_FWD, a2, nullptr, a3);
  Desc wgrad = convBackwardFilter(conv, a3, dy, dwT);
  check(cudnnBackendFinalize(wgrad) == CUDNN_STATUS_SUCCESS, "finalize convolution backward filter");
  Desc plan2 = planOf(handle, {wgrad, relu2, add2, mul2}, &workspaceBytes);
  float* ddw = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&ddw), prob.w.size() * sizeof(float));
  execute(handle, stream, plan2, {1, 3, 5, 10, 11}, {ddy, dxv, ddw, dper[0], dper[1]}, workspaceBytes);
  const std::vector<double> wantDw = prob.dw();
  const std::vector<float> gotDw = download(ddw, prob.w.size());
  ok = true;
  for (size_t i = 0; i < wantDw.size(); ++i) ok = ok && near(gotDw[i], wantDw[i], 1e-5);
  check(ok, "dw = wgrad(relu(x * scale + shift), dy) against a direct sum");
  cudnnBackendDestroyDescriptor(plan2);

  for (Desc d : {dy, w, x, dz, dA, t1, t2, t3, t4, conv, dwT, a1, a2, a3}) cudnnBackendDestroyDescriptor(d);
  for (Desc d : per) cudnnBackendDestroyDescriptor(d);
  for (float* p : dper) cudaFree(p);
  for (float* p : {ddy, dw, dxv, ddz, ddw}) cudaFree(p);
  cudnnDestroy(handle);
  cudaStreamDestroy(stream);
}

// The backward nodes' documented refusals.
void backwardRefusals() {
  const std::vector<int64_t> act = {1, 8, 2, 2}, vec = {1, 8, 1, 1};
  Desc x = tensor(1, act, false), dy = tensor(2, act, false), dx = tensor(3, act, false);
  Desc y = tensor(4, act, false);

  Desc withY = reluBackward(x, dy, dx);
  setDesc(withY, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
  check(cudnnBackendFinalize(withY) == CUDNN_STATUS_BAD_PARAM, "RELU_BWD with a YDESC: BAD_PARAM");
  Desc noDy = create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  {
    Desc pw = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    const cudnnPointwiseMode_t mode = CUDNN_POINTWISE_RELU_BWD;
    const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    cudnnBackendFinalize(pw);
    setDesc(noDy, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    setDesc(noDy, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    setDesc(noDy, CUDNN_ATTR_OPERATION_POINTWISE_DXDESC, dx);
    cudnnBackendDestroyDescriptor(pw);
  }
  check(cudnnBackendFinalize(noDy) == CUDNN_STATUS_BAD_PARAM, "RELU_BWD without DYDESC: BAD_PARAM");
  Desc small = tensor(5, {1, 8, 1, 2}, false);
  Desc mismatch = reluBackward(x, small, dx);
  check(cudnnBackendFinalize(mismatch) == CUDNN_STATUS_BAD_PARAM, "RELU_BWD with dy of other dims: BAD_PARAM");

  // Backward data: dx [1, 8, 2, 2] and w [4, 8, 1, 1] make dy [1, 4, 2, 2], not [1, 8, 2, 2].
  Desc conv = convolution(0);
  Desc w = tensor(6, {4, 8, 1, 1}, false);
  Desc dgrad = convBackwardData(conv, dy, w, dx);
  check(cudnnBackendFinalize(dgrad) == CUDNN_STATUS_BAD_PARAM, "backward data with dy of the wrong size: BAD_PARAM");
  Desc dgradNoW = create(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR);
  setDesc(dgradNoW, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, conv);
  setDesc(dgradNoW, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, dy);
  setDesc(dgradNoW, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, dx);
  check(cudnnBackendFinalize(dgradNoW) == CUDNN_STATUS_BAD_PARAM, "backward data without w: BAD_PARAM");
  Desc wgrad = convBackwardFilter(conv, x, dy, w);
  check(cudnnBackendFinalize(wgrad) == CUDNN_STATUS_BAD_PARAM, "backward filter with dy of the wrong size: BAD_PARAM");

  std::vector<Desc> per;
  for (int64_t uid = 10; uid < 18; ++uid) per.push_back(tensor(uid, vec, false));
  Desc wide = tensor(20, {1, 8, 2, 1}, false);
  std::vector<Desc> badPer = per;
  badPer[6] = wide;
  Desc dbnShape = bnBackwardWeights(x, dy, badPer);
  check(cudnnBackendFinalize(dbnShape) == CUDNN_STATUS_BAD_PARAM,
        "BN_BWD_WEIGHTS with an eqX that is not per channel: BAD_PARAM");
  Desc dbnMissing = bnBackwardWeights(x, dy, std::vector<Desc>(per.begin(), per.begin() + 7));
  check(cudnnBackendFinalize(dbnMissing) == CUDNN_STATUS_BAD_PARAM, "BN_BWD_WEIGHTS without EQ_BIAS: BAD_PARAM");
  Desc dbnOtherDy = bnBackwardWeights(x, small, per);
  check(cudnnBackendFinalize(dbnOtherDy) == CUDNN_STATUS_BAD_PARAM, "BN_BWD_WEIGHTS with dy unlike x: BAD_PARAM");
  std::vector<Desc> sameOut = per;
  sameOut[4] = per[3];
  Desc dbnSame = bnBackwardWeights(x, dy, sameOut);
  check(cudnnBackendFinalize(dbnSame) == CUDNN_STATUS_BAD_PARAM,
        "BN_BWD_WEIGHTS with dScale and dBias one tensor: BAD_PARAM");
  Desc dbnHalf = bnBackwardWeights(x, dy, per);
  const cudnnDataType_t half = CUDNN_DATA_HALF;
  cudnnBackendSetAttribute(dbnHalf, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &half);
  check(cudnnBackendFinalize(dbnHalf) == CUDNN_STATUS_NOT_SUPPORTED,
        "BN_BWD_WEIGHTS in HALF math precision: NOT_SUPPORTED");

  for (Desc d : {x, dy, dx, y, withY, noDy, small, mismatch, conv, w, dgrad, dgradNoW, wgrad, wide, dbnShape,
                 dbnMissing, dbnOtherDy, dbnSame, dbnHalf}) {
    cudnnBackendDestroyDescriptor(d);
  }
  for (Desc d : per) cudnnBackendDestroyDescriptor(d);
}

void refusals() {
  Desc d = nullptr;
  check(cudnnBackendCreateDescriptor(static_cast<cudnnBackendDescriptorType_t>(18), &d) == CUDNN_STATUS_NOT_SUPPORTED,
        "a descriptor type the emulator does not have: NOT_SUPPORTED");

  Desc t = tensor(1, {1, 8, 2, 2}, false);
  check(setInts(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, {2}) == CUDNN_STATUS_NOT_INITIALIZED,
        "setting an attribute of a finalized descriptor: NOT_INITIALIZED");
  check(cudnnBackendFinalize(t) == CUDNN_STATUS_BAD_PARAM, "finalizing twice: BAD_PARAM");

  Desc u = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const float f = 1.0f;
  check(cudnnBackendSetAttribute(u, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_FLOAT, 1, &f) == CUDNN_STATUS_BAD_PARAM,
        "a unique id given as FLOAT: BAD_PARAM");
  check(setInts(u, CUDNN_ATTR_CONVOLUTION_DILATIONS, {1, 1}) == CUDNN_STATUS_BAD_PARAM,
        "a convolution attribute on a tensor: BAD_PARAM");
  check(setInts(u, CUDNN_ATTR_TENSOR_UNIQUE_ID, {1, 2}) == CUDNN_STATUS_BAD_PARAM, "two unique ids: BAD_PARAM");
  check(setInts(u, CUDNN_ATTR_TENSOR_DIMENSIONS, std::vector<int64_t>(9, 1)) == CUDNN_STATUS_BAD_PARAM,
        "nine dimensions: BAD_PARAM");
  const cudnnDataType_t type = CUDNN_DATA_FLOAT;
  cudnnBackendSetAttribute(u, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  setInts(u, CUDNN_ATTR_TENSOR_DIMENSIONS, {1, 8, 2, 2});
  setInts(u, CUDNN_ATTR_TENSOR_STRIDES, {32, 1, 16});
  setInts(u, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, {4});
  check(cudnnBackendFinalize(u) == CUDNN_STATUS_BAD_PARAM, "finalizing without a unique id: BAD_PARAM");
  setInts(u, CUDNN_ATTR_TENSOR_UNIQUE_ID, {3});
  check(cudnnBackendFinalize(u) == CUDNN_STATUS_BAD_PARAM, "four dimensions and three strides: BAD_PARAM");

  Desc unfinalized = tensor(4, {1, 8, 2, 2}, false, false);
  Desc op = create(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
  check(setDesc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, unfinalized) == CUDNN_STATUS_BAD_PARAM,
        "an unfinalized tensor as an operand: BAD_PARAM");
  Desc conv = convolution(0);
  check(setDesc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, conv) == CUDNN_STATUS_BAD_PARAM,
        "a convolution descriptor as x: BAD_PARAM");

  // A 1x1 convolution of [1, 8, 2, 2] by [4, 8, 1, 1] makes [1, 4, 2, 2], not [1, 4, 3, 3].
  Desc w = tensor(5, {4, 8, 1, 1}, false);
  Desc y = tensor(6, {1, 4, 3, 3}, false);
  Desc fwd = convForward(conv, t, w, y);
  check(cudnnBackendFinalize(fwd) == CUDNN_STATUS_BAD_PARAM, "an output of the wrong size: BAD_PARAM");
  Desc fwdMissing = create(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
  setDesc(fwdMissing, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, t);
  check(cudnnBackendFinalize(fwdMissing) == CUDNN_STATUS_BAD_PARAM, "a convolution without w and y: BAD_PARAM");

  Desc pw = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  const auto sqrtMode = static_cast<cudnnPointwiseMode_t>(4);
  const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &sqrtMode);
  cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
  check(cudnnBackendFinalize(pw) == CUDNN_STATUS_NOT_SUPPORTED, "a pointwise mode not emulated: NOT_SUPPORTED");

  Desc y2 = tensor(7, {1, 8, 2, 2}, false);
  Desc relu1 = pointwise(CUDNN_POINTWISE_RELU_FWD, t, nullptr, y2);
  Desc relu2 = pointwise(CUDNN_POINTWISE_RELU_FWD, t, nullptr, y2);
  cudnnHandle_t handle = nullptr;
  cudnnCreate(&handle);
  cudnnStatus_t status;
  Desc twice = graphOf(handle, {relu1, relu2}, &status);
  check(status == CUDNN_STATUS_BAD_PARAM, "a tensor written by two operations: BAD_PARAM");

  for (Desc e : {t, u, unfinalized, op, conv, w, y, fwd, fwdMissing, pw, y2, relu1, relu2, twice}) {
    cudnnBackendDestroyDescriptor(e);
  }
  check(cudnnBackendDestroyDescriptor(t) == CUDNN_STATUS_BAD_PARAM, "destroying twice: BAD_PARAM");
  cudnnDestroy(handle);
}

// The status of finalizing an execution plan of `graph` (a finalized operation graph), with
// RESNET_CUDA_EMU_GRAPH_REFUSE set to `refuse` (unset when null) while the plan is finalized.
cudnnStatus_t planStatus(cudnnHandle_t handle, Desc graph, const char* refuse) {
  Desc heur = create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  const cudnnBackendHeurMode_t heurMode = CUDNN_HEUR_MODE_A;
  setDesc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &heurMode);
  check(cudnnBackendFinalize(heur) == CUDNN_STATUS_SUCCESS, "finalize heuristics");
  Desc cfg = create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  int64_t count = 0;
  cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, &cfg);
  Desc plan = create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  setDesc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
  if (refuse != nullptr) setenv("RESNET_CUDA_EMU_GRAPH_REFUSE", refuse, 1);
  const cudnnStatus_t status = cudnnBackendFinalize(plan);
  unsetenv("RESNET_CUDA_EMU_GRAPH_REFUSE");
  for (Desc d : {heur, cfg, plan}) cudnnBackendDestroyDescriptor(d);
  return status;
}

// RESNET_CUDA_EMU_GRAPH_REFUSE: a relu -> convolution graph (the conv-sbr pattern, f32 I/O) is
// refused where the variable names its pattern, alone or with its I/O type, and only there.
void refusalSwitch() {
  cudnnHandle_t handle = nullptr;
  cudnnCreate(&handle);
  Desc x = tensor(1, {1, 8, 2, 2}, false);
  Desc activated = tensor(2, {1, 8, 2, 2}, true);
  Desc w = tensor(3, {4, 8, 1, 1}, false);
  Desc y = tensor(4, {1, 4, 2, 2}, false);
  Desc relu = pointwise(CUDNN_POINTWISE_RELU_FWD, x, nullptr, activated);
  Desc conv = convolution(0);
  Desc fwd = convForward(conv, activated, w, y);
  check(cudnnBackendFinalize(fwd) == CUDNN_STATUS_SUCCESS, "finalize convolution forward");
  cudnnStatus_t status;
  Desc graph = graphOf(handle, {relu, fwd}, &status);
  check(status == CUDNN_STATUS_SUCCESS, "finalize the operation graph");
  check(planStatus(handle, graph, nullptr) == CUDNN_STATUS_SUCCESS, "no refusal set: the plan finalizes");
  check(planStatus(handle, graph, "conv-sbr:bf16,dgrad-dbn") == CUDNN_STATUS_SUCCESS,
        "other patterns or another I/O type refused: the plan finalizes");
  check(planStatus(handle, graph, "dgrad-dbn,conv-sbr:f32") == CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN,
        "conv-sbr:f32 refused: NOT_SUPPORTED_GRAPH_PATTERN");
  check(planStatus(handle, graph, "conv-sbr") == CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN,
        "conv-sbr refused: NOT_SUPPORTED_GRAPH_PATTERN");
  check(planStatus(handle, graph, "conv-sb") == CUDNN_STATUS_SUCCESS, "a name is matched whole");
  for (Desc d : {x, activated, w, y, relu, conv, fwd, graph}) cudnnBackendDestroyDescriptor(d);
  cudnnDestroy(handle);
}

}  // namespace

int main() {
  fullGraph();
  refusals();
  backwardGraphs();
  backwardRefusals();
  refusalSwitch();
  return rc_emu_test::finish("graph api");
}
