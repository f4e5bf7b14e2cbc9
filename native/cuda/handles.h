// Owners of CUDA, cuDNN and cuBLAS handles: each destroys its handle once, so an object that creates
// several of them frees the ones already made when a later step of its constructor throws.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <utility>

namespace rc::cuda {

template <typename T, auto Destroy>
class Handle {
 public:
  Handle() = default;
  ~Handle() { reset(); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }

  operator T() const { return handle_; }  // NOLINT(google-explicit-constructor): passed to the C APIs as is
  // Where a create call writes the new handle (the old one, if any, is destroyed first).
  T* out() {
    reset();
    return &handle_;
  }
  void reset() {
    if (handle_ != nullptr) (void)Destroy(handle_);
    handle_ = nullptr;
  }

 private:
  T handle_ = nullptr;
};

using StreamHandle = Handle<cudaStream_t, cudaStreamDestroy>;
using CudnnHandle = Handle<cudnnHandle_t, cudnnDestroy>;
using CublasHandle = Handle<cublasHandle_t, cublasDestroy>;
using TensorDescriptor = Handle<cudnnTensorDescriptor_t, cudnnDestroyTensorDescriptor>;
using FilterDescriptor = Handle<cudnnFilterDescriptor_t, cudnnDestroyFilterDescriptor>;
using ConvolutionDescriptor = Handle<cudnnConvolutionDescriptor_t, cudnnDestroyConvolutionDescriptor>;

}  // namespace rc::cuda
