// Unit test of the emulated cudnnConvolutionBiasActivationForward (src/dnn.cc) over the emulated
// runtime: its result against a direct sum, and the refusals cuDNN 9 documents for it (the
// activation modes, IDENTITY only with IMPLICIT_PRECOMP_GEMM, reluNanOpt, the bias and z
// descriptors). test/inference-cuda.test.ts runs it; it prints "fused conv: N passed, M failed".
#include <cudnn.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dnn_check.h"

namespace {

using rc_emu_test::dnn::check;
using rc_emu_test::dnn::lastError;

// One problem: x [1, 3, 3, 2] NHWC, w [3, 3, 3, 2] KRSC, pad 1, y and z [1, 3, 3, 3], f32.
struct Fixture {
  static constexpr int N = 1, C = 2, H = 3, W = 3, K = 3, R = 3, S = 3;
  cudnnHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, z = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnActivationDescriptor_t act = nullptr;
  std::vector<float> hx, hw, hz, hb;
  float *dx = nullptr, *dw = nullptr, *dy = nullptr, *dz = nullptr, *db = nullptr;
  void* ws = nullptr;
  size_t wsBytes = 0;

  Fixture() {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    hx.resize(N * H * W * C);
    hw.resize(K * R * S * C);
    hz.resize(N * H * W * K);
    hb.resize(K);
    for (auto* v : {&hx, &hw, &hz, &hb}) {
      for (float& e : *v) e = u(rng);
    }
    cudaStreamCreate(&stream);
    cudnnCreate(&handle);
    cudnnSetStream(handle, stream);
    for (auto* d : {&x, &y, &z, &bias}) cudnnCreateTensorDescriptor(d);
    cudnnCreateFilterDescriptor(&w);
    cudnnCreateConvolutionDescriptor(&conv);
    cudnnCreateActivationDescriptor(&act);
    cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, N, C, H, W);
    cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, N, K, H, W);
    cudnnSetTensor4dDescriptor(z, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, N, K, H, W);
    cudnnSetTensor4dDescriptor(bias, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, K, 1, 1);
    cudnnSetFilter4dDescriptor(w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, K, C, R, S);
    cudnnSetConvolution2dDescriptor(conv, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT);
    cudnnSetConvolutionMathType(conv, CUDNN_FMA_MATH);
    cudnnSetActivationDescriptor(act, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0);
    dx = upload(hx);
    dw = upload(hw);
    dz = upload(hz);
    db = upload(hb);
    cudaMalloc(reinterpret_cast<void**>(&dy), hz.size() * sizeof(float));
    cudnnGetConvolutionForwardWorkspaceSize(handle, x, w, conv, y, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
                                            &wsBytes);
    if (wsBytes > 0) cudaMalloc(&ws, wsBytes);
  }

  ~Fixture() {
    for (void* p : {static_cast<void*>(dx), static_cast<void*>(dw), static_cast<void*>(dy), static_cast<void*>(dz),
                    static_cast<void*>(db), ws}) {
      if (p != nullptr) cudaFree(p);
    }
    for (auto d : {x, y, z, bias}) cudnnDestroyTensorDescriptor(d);
    cudnnDestroyFilterDescriptor(w);
    cudnnDestroyConvolutionDescriptor(conv);
    cudnnDestroyActivationDescriptor(act);
    cudnnDestroy(handle);
    cudaStreamDestroy(stream);
  }

  static float* upload(const std::vector<float>& host) {
    float* d = nullptr;
    cudaMalloc(reinterpret_cast<void**>(&d), host.size() * sizeof(float));
    cudaMemcpy(d, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice);
    return d;
  }

  cudnnStatus_t run(cudnnConvolutionFwdAlgo_t algo, float alpha2, const void* zData,
                    cudnnTensorDescriptor_t zDesc = nullptr, cudnnTensorDescriptor_t biasDesc = nullptr,
                    cudnnActivationDescriptor_t actDesc = nullptr) {
    const float alpha1 = 1.0f;
    return cudnnConvolutionBiasActivationForward(handle, &alpha1, x, dx, w, dw, conv, algo, ws, wsBytes, &alpha2,
                                                 zDesc ? zDesc : z, zData, biasDesc ? biasDesc : bias, db,
                                                 actDesc ? actDesc : act, y, dy);
  }

  std::vector<float> result() {
    std::vector<float> out(hz.size());
    cudaMemcpy(out.data(), dy, out.size() * sizeof(float), cudaMemcpyDeviceToHost);
    return out;
  }

  // relu?(conv(x) + alpha2 * z + bias), summed directly.
  std::vector<double> expected(double alpha2, bool relu) const {
    std::vector<double> out(hz.size());
    for (int oh = 0; oh < H; ++oh) {
      for (int ow = 0; ow < W; ++ow) {
        for (int k = 0; k < K; ++k) {
          double sum = hb[k];
          for (int r = 0; r < R; ++r) {
            for (int s = 0; s < S; ++s) {
              const int ih = oh - 1 + r, iw = ow - 1 + s;
              if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
              for (int c = 0; c < C; ++c) sum += double(hx[(ih * W + iw) * C + c]) * hw[((k * R + r) * S + s) * C + c];
            }
          }
          const size_t i = (oh * W + ow) * K + k;
          sum += alpha2 * hz[i];
          out[i] = relu ? std::max(sum, 0.0) : sum;
        }
      }
    }
    return out;
  }
};

bool close(const std::vector<float>& a, const std::vector<double>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (!(std::fabs(a[i] - b[i]) <= 1e-5 * (1.0 + std::fabs(b[i])))) return false;
  }
  return true;
}

void testResults() {
  Fixture f;
  check(f.run(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, 1.0f, f.dz) == CUDNN_STATUS_SUCCESS,
        "ReLU with a residual runs");
  check(close(f.result(), f.expected(1.0, true)), "ReLU with a residual equals relu(conv + z + bias)");
  check(f.run(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, 1.0f, f.dz) == CUDNN_STATUS_SUCCESS,
        "ReLU runs with IMPLICIT_GEMM");
  check(close(f.result(), f.expected(1.0, true)), "IMPLICIT_GEMM gives the same result");
  // alpha2 = 0 with z = y: y is not read (it holds the emulator's NaN bytes before the first write).
  Fixture g;
  check(g.run(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, 0.0f, g.dy) == CUDNN_STATUS_SUCCESS,
        "alpha2 = 0 with z aliasing y runs");
  check(close(g.result(), g.expected(0.0, true)), "alpha2 = 0 does not read z");
  cudnnSetActivationDescriptor(f.act, CUDNN_ACTIVATION_IDENTITY, CUDNN_NOT_PROPAGATE_NAN, 0.0);
  check(f.run(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, 1.0f, f.dz) == CUDNN_STATUS_SUCCESS,
        "IDENTITY runs with IMPLICIT_PRECOMP_GEMM");
  check(close(f.result(), f.expected(1.0, false)), "IDENTITY keeps negative sums");
}

void testRefusals() {
  Fixture f;
  cudnnActivationDescriptor_t identity = nullptr;
  cudnnCreateActivationDescriptor(&identity);
  cudnnSetActivationDescriptor(identity, CUDNN_ACTIVATION_IDENTITY, CUDNN_NOT_PROPAGATE_NAN, 0.0);
  check(f.run(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, 1.0f, f.dz, nullptr, nullptr, identity) ==
            CUDNN_STATUS_NOT_SUPPORTED,
        "IDENTITY with IMPLICIT_GEMM is not supported");
  check(lastError().find("IMPLICIT_PRECOMP_GEMM") != std::string::npos, "the refusal names IMPLICIT_PRECOMP_GEMM");

  cudnnActivationDescriptor_t other = nullptr;
  cudnnCreateActivationDescriptor(&other);
  cudnnSetActivationDescriptor(other, CUDNN_ACTIVATION_SIGMOID, CUDNN_NOT_PROPAGATE_NAN, 0.0);
  check(f.run(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, 1.0f, f.dz, nullptr, nullptr, other) ==
            CUDNN_STATUS_NOT_SUPPORTED,
        "SIGMOID is not supported");
  cudnnSetActivationDescriptor(other, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0);
  check(f.run(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, 1.0f, f.dz, nullptr, nullptr, other) ==
            CUDNN_STATUS_NOT_SUPPORTED,
        "CUDNN_PROPAGATE_NAN is not supported");
  cudnnActivationDescriptor_t unset = nullptr;
  cudnnCreateActivationDescriptor(&unset);
  check(f.run(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, 1.0f, f.dz, nullptr, nullptr, unset) ==
            CUDNN_STATUS_BAD_PARAM,
        "an activation descriptor never set is a bad parameter");

  cudnnTensorDescriptor_t d = nullptr;
  cudnnCreateTensorDescriptor(&d);
  cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_HALF, 1, Fixture::K, 1, 1);
  check(f.run(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, 1.0f, f.dz, nullptr, d) == CUDNN_STATUS_NOT_SUPPORTED,
        "a HALF bias with FLOAT data is not supported");
  cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, Fixture::K + 1, 1, 1);
  check(f.run(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, 1.0f, f.dz, nullptr, d) == CUDNN_STATUS_NOT_SUPPORTED,
        "a bias of K + 1 channels is not supported");
  cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, Fixture::N, Fixture::K, Fixture::H,
                             Fixture::W - 1);
  check(f.run(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, 1.0f, f.dz, d) == CUDNN_STATUS_NOT_SUPPORTED,
        "z of another shape than y is not supported");
  cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, Fixture::N, Fixture::K, Fixture::H, Fixture::W);
  check(f.run(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, 1.0f, f.dz, d) == CUDNN_STATUS_NOT_SUPPORTED,
        "z in another layout than y is not supported");
  const float one = 1.0f;
  check(cudnnConvolutionBiasActivationForward(f.handle, &one, f.x, f.dx, f.w, f.dw, f.conv,
                                              CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, f.ws, f.wsBytes, &one,
                                              f.z, f.dz, f.bias, f.db, nullptr, f.y, f.dy) == CUDNN_STATUS_BAD_PARAM,
        "a null activation descriptor is a bad parameter");
  check(cudnnConvolutionBiasActivationForward(
            f.handle, &one, f.x, f.dx, f.w, f.dw, f.conv, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, f.ws,
            f.wsBytes, nullptr, f.z, f.dz, f.bias, f.db, f.act, f.y, f.dy) == CUDNN_STATUS_BAD_PARAM,
        "a null alpha2 is a bad parameter");
  check(f.run(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, 1.0f, nullptr) == CUDNN_STATUS_BAD_PARAM,
        "a null z is a bad parameter");
  if (f.wsBytes > 0) {
    const float alpha = 1.0f;
    check(cudnnConvolutionBiasActivationForward(
              f.handle, &alpha, f.x, f.dx, f.w, f.dw, f.conv, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, f.ws,
              f.wsBytes - 1, &alpha, f.z, f.dz, f.bias, f.db, f.act, f.y, f.dy) == CUDNN_STATUS_BAD_PARAM,
          "a workspace smaller than the algorithm needs is a bad parameter");
  }
  check(f.run(CUDNN_CONVOLUTION_FWD_ALGO_FFT, 1.0f, f.dz) == CUDNN_STATUS_NOT_SUPPORTED,
        "an algorithm the emulator does not implement is not supported");
  cudnnDestroyTensorDescriptor(d);
  for (auto a : {identity, other, unset}) cudnnDestroyActivationDescriptor(a);
  // Nothing above was queued: the stream still runs.
  check(cudaStreamSynchronize(f.stream) == cudaSuccess, "the stream is healthy after the refusals");
}

}  // namespace

int main() {
  testResults();
  testRefusals();
  return rc_emu_test::finish("fused conv");
}
