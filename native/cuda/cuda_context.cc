#include "cuda_context.h"

#include <cstdlib>
#include <cstring>
#include <limits>

#include "cuda_check.h"

namespace rc::cuda {

namespace {
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;  // cuBLAS's recommendation for Hopper
}

StreamAllocator::StreamAllocator(int device, cudaStream_t stream) : device_(device), stream_(stream) {
  RC_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool_, device));
  uint64_t keepEverything = std::numeric_limits<uint64_t>::max();
  RC_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keepEverything));
}

void* StreamAllocator::allocate(size_t bytes) {
  void* ptr = nullptr;
  const size_t size = bytes == 0 ? 256 : bytes;
  cudaError_t status = cudaMallocAsync(&ptr, size, stream_);
  if (status == cudaErrorMemoryAllocation && !capturing_) {
    (void)cudaGetLastError();
    // Return cached blocks to the driver and try once more (not while capturing: a synchronisation
    // would end the capture).
    if (cudaStreamSynchronize(stream_) == cudaSuccess) (void)cudaMemPoolTrimTo(pool_, 0);
    status = cudaMallocAsync(&ptr, size, stream_);
  }
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    size_t freeBytes = 0, totalBytes = 0;
    (void)cudaMemGetInfo(&freeBytes, &totalBytes);
    RC_THROW(code::kOutOfMemory,
             "out of memory on cuda:" << device_ << ": tried to allocate " << formatBytes(size) << "; "
                                      << formatBytes(stats().allocatedBytes) << " is held by tensors, "
                                      << formatBytes(freeBytes) << " of " << formatBytes(totalBytes)
                                      << " is free. Try a smaller batch size, gradient accumulation, or mixed "
                                         "precision (amp: 'bf16' or 'fp16')");
  }
  RC_CUDA_CHECK(status);
  std::lock_guard<std::mutex> lock(mutex_);
  if (capturing_) allocatedInCapture_.insert(ptr);
  live_[ptr] = size;
  stats_.allocatedBytes += size;
  stats_.allocationCount++;
  if (stats_.allocatedBytes > stats_.peakAllocatedBytes) stats_.peakAllocatedBytes = stats_.allocatedBytes;
  return ptr;
}

void StreamAllocator::release(void* ptr) {
  if (ptr == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    if (it == live_.end()) return;
    stats_.allocatedBytes -= it->second;
    live_.erase(it);
    if ((capturing_ && allocatedInCapture_.erase(ptr) == 0) || graphVisible_.erase(ptr) > 0) {
      // Memory from before the capture: the graph may use it, and a captured free cannot take it.
      held_.push_back(ptr);
      return;
    }
  }
  // A destructor must not throw: a failure here means the context is already broken, and the next
  // checked call reports it. The error is taken off the thread's last-error slot so that it is not
  // blamed on the next kernel launch.
  if (cudaFreeAsync(ptr, stream_) != cudaSuccess) (void)cudaGetLastError();
}

void StreamAllocator::beginCapture() {
  std::lock_guard<std::mutex> lock(mutex_);
  capturing_ = true;
  allocatedInCapture_.clear();
}

void StreamAllocator::endCapture(bool graphCreated) {
  std::lock_guard<std::mutex> lock(mutex_);
  capturing_ = false;
  if (graphCreated) {
    // What the graph allocated itself (freed and allocated again by each launch) stays ordinary.
    for (const auto& [ptr, bytes] : live_)
      if (allocatedInCapture_.count(ptr) == 0) graphVisible_.insert(ptr);
  }
  allocatedInCapture_.clear();
}

void StreamAllocator::releaseHeld() {
  std::vector<void*> held;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    held.swap(held_);
    graphVisible_.clear();
  }
  for (void* ptr : held) {
    if (cudaFreeAsync(ptr, stream_) != cudaSuccess) (void)cudaGetLastError();
  }
}

MemoryStats StreamAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  MemoryStats out = stats_;
  uint64_t reserved = 0;
  if (cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &reserved) == cudaSuccess) {
    out.reservedBytes = static_cast<size_t>(reserved);
  }
  return out;
}

void StreamAllocator::resetPeak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peakAllocatedBytes = stats_.allocatedBytes;
}

void StreamAllocator::emptyCache() {
  RC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  RC_CUDA_CHECK(cudaMemPoolTrimTo(pool_, 0));
}

DeviceGuard::DeviceGuard(int device) {
  if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) {
    RC_CUDA_CHECK(cudaSetDevice(device));
    changed_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (changed_) (void)cudaSetDevice(previous_);
}

CudaContext::CudaContext(int device) : device_(device) {
  DeviceGuard guard(device);
  RC_CUDA_CHECK(cudaStreamCreateWithFlags(stream_.out(), cudaStreamNonBlocking));
  allocator_ = std::make_unique<StreamAllocator>(device, stream_);
  RC_CUDNN_CHECK(cudnnCreate(cudnn_.out()), "cuda:" << device);
  RC_CUDNN_CHECK(cudnnSetStream(cudnn_, stream_), "cuda:" << device);
  RC_CUBLAS_CHECK(cublasCreate(cublas_.out()), "cuda:" << device);
  RC_CUBLAS_CHECK(cublasSetStream(cublas_, stream_), "cuda:" << device);
  const char* tf32 = std::getenv("RESNET_CUDA_ALLOW_TF32");
  allowTf32_ = tf32 != nullptr && std::strcmp(tf32, "1") == 0;
  const char* deterministic = std::getenv("RESNET_CUDA_DETERMINISTIC");
  deterministic_ = deterministic != nullptr && std::strcmp(deterministic, "1") == 0;
  RC_CUBLAS_CHECK(cublasSetMathMode(cublas_, allowTf32_ ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
                  "cuda:" << device);
  // A user workspace keeps cuBLAS from allocating inside graph capture.
  cublasWorkspace_ = allocate({static_cast<int64_t>(kCublasWorkspaceBytes)}, DType::U8);
  RC_CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublasWorkspace_.data(), kCublasWorkspaceBytes), "cuda:" << device);
  invalidLabel_ = allocate({1}, DType::I32);
  RC_CUDA_CHECK(cudaMemsetAsync(invalidLabel_.data(), 0, sizeof(int32_t), stream_));
}

CudaContext::~CudaContext() {
  DeviceGuard guard(device_);
  for (auto& [key, entry] : uploads_) {
    for (Staging& slot : entry.staging) {
      if (slot.copied) cudaEventDestroy(slot.copied);
      if (slot.pinned) cudaFreeHost(slot.pinned);
    }
  }
  uploads_.clear();
  retired_.clear();
  allocator_->releaseHeld();
  scratch_ = Tensor();
  cublasWorkspace_ = Tensor();
  invalidLabel_ = Tensor();
  (void)cudaStreamSynchronize(stream_);
}

bool CudaContext::capturing() const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  RC_CUDA_CHECK(cudaStreamIsCapturing(stream_, &status));
  return status != cudaStreamCaptureStatusNone;
}

Tensor CudaContext::allocate(const Shape& shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(shapeNumel(shape)) * dtypeSize(dtype);
  return Tensor(std::make_shared<Storage>(allocator_.get(), rcDevice(), bytes), 0, shape, dtype);
}

void* CudaContext::scratch(size_t bytes) {
  if (!scratch_.defined() || scratch_.nbytes() < bytes) {
    RC_CHECK_ARG(!capturing(), "a CUDA graph capture needs " << formatBytes(bytes)
                                                             << " of scratch that was not reserved before "
                                                                "capture; run the step once before capturing it");
    retire(scratch_);
    scratch_ = allocate({static_cast<int64_t>(bytes)}, DType::U8);
  }
  return scratch_.data();
}

void CudaContext::retire(Tensor& t) {
  if (graphs_ > 0 && t.defined()) retired_.push_back(t);
  t = Tensor();
}

void CudaContext::beginCapture() { allocator_->beginCapture(); }

void CudaContext::endCapture(bool graphCreated) {
  allocator_->endCapture(graphCreated);
  if (graphCreated) {
    ++graphs_;
  } else if (graphs_ == 0) {
    allocator_->releaseHeld();
  }
}

void CudaContext::graphDestroyed() {
  if (graphs_ > 0 && --graphs_ == 0) {
    retired_.clear();
    allocator_->releaseHeld();
  }
}

void CudaContext::checkDeferredErrors() {
  int32_t flag = 0;
  RC_CUDA_CHECK(cudaMemcpyAsync(&flag, invalidLabel_.data(), sizeof(flag), cudaMemcpyDeviceToHost, stream_));
  RC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (flag != 0) {
    RC_CUDA_CHECK(cudaMemsetAsync(invalidLabel_.data(), 0, sizeof(int32_t), stream_));
    RC_THROW(code::kInvalidArgument, "cross entropy: a label outside [0, classes) was given on cuda:"
                                         << device_ << " since the last synchronisation");
  }
}

const void* CudaContext::upload(const std::string& key, const void* host, size_t bytes) {
  Uploaded& entry = uploads_[key];
  const std::string content(static_cast<const char*>(host), bytes);
  if (entry.device.defined() && entry.bytes == content) return entry.device.data();
  RC_CHECK_ARG(!capturing(), "the " << key
                                    << " table changed during a CUDA graph capture; capture after the "
                                       "settings are final");
  Staging& slot = entry.staging[entry.next];
  entry.next = (entry.next + 1) % kStagingBuffers;
  if (slot.copied == nullptr) RC_CUDA_CHECK(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
  RC_CUDA_CHECK(cudaEventSynchronize(slot.copied));  // this buffer's previous copy has run
  if (slot.capacity < bytes) {
    if (slot.pinned) RC_CUDA_CHECK(cudaFreeHost(slot.pinned));
    slot.pinned = nullptr;
    RC_CUDA_CHECK(cudaMallocHost(&slot.pinned, bytes));
    slot.capacity = bytes;
  }
  if (!entry.device.defined() || entry.device.nbytes() < bytes) {
    retire(entry.device);
    entry.device = allocate({static_cast<int64_t>(bytes)}, DType::U8);
  }
  std::memcpy(slot.pinned, host, bytes);
  RC_CUDA_CHECK(cudaMemcpyAsync(entry.device.data(), slot.pinned, bytes, cudaMemcpyHostToDevice, stream_));
  RC_CUDA_CHECK(cudaEventRecord(slot.copied, stream_));
  entry.bytes = content;
  return entry.device.data();
}

cudnnDataType_t toCudnn(DType t) {
  switch (t) {
    case DType::F32: return CUDNN_DATA_FLOAT;
    case DType::BF16: return CUDNN_DATA_BFLOAT16;
    case DType::F16: return CUDNN_DATA_HALF;
    default: RC_THROW(code::kInvalidArgument, "cuDNN has no data type for " << dtypeName(t));
  }
}

cudaDataType_t toCudaDataType(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: RC_THROW(code::kInvalidArgument, "cuBLAS has no data type for " << dtypeName(t));
  }
}

}  // namespace rc::cuda
