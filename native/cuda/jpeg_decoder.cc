#include "jpeg_decoder.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "cuda_check.h"
#include "handles.h"
#include "jpeg_kernels.h"
#include "jpeg_nvjpeg.h"

namespace rc::cuda {
namespace {

using EventHandle = Handle<cudaEvent_t, cudaEventDestroy>;

constexpr size_t kAlign = 256;
size_t alignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// A device buffer that only grows, allocated and freed in the order of `stream` (the decoder's),
// so that neither waits on the host and a freed buffer is released after the work using it.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const cudaStream_t& stream) : stream_(stream) {}
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (data_ != nullptr) (void)cudaFreeAsync(data_, stream_);
  }
  uint8_t* reserve(size_t bytes) {
    if (bytes > capacity_) {
      if (data_ != nullptr) RC_CUDA_CHECK(cudaFreeAsync(data_, stream_));
      data_ = nullptr;
      capacity_ = 0;
      void* p = nullptr;
      RC_CUDA_CHECK(cudaMallocAsync(&p, bytes, stream_));
      data_ = static_cast<uint8_t*>(p);
      capacity_ = bytes;
    }
    return data_;
  }

 private:
  const cudaStream_t& stream_;
  uint8_t* data_ = nullptr;
  size_t capacity_ = 0;
};

// nvJPEG handles, destroyed through the bound API.
struct NvjpegHandles {
  nvjpegHandle_t handle = nullptr;
  nvjpegJpegState_t state = nullptr;
  ~NvjpegHandles() {
    if (state != nullptr) (void)nvjpeg().stateDestroy(state);
    if (handle != nullptr) (void)nvjpeg().destroy(handle);
  }
};

// Builds the (first, count, weights) tables of one axis of a plan, with identity axes as a filter
// of one tap of weight 1 (exact: (p << 22 + half) >> 22 == p), into `ints`; returns their offsets.
struct AxisTables {
  size_t first = 0, count = 0, weights = 0;
  int ksize = 1;
};

AxisTables appendAxis(const image::Axis& a, std::vector<int32_t>& ints) {
  AxisTables t;
  const int n = a.outputs;
  t.ksize = a.identity ? 1 : a.ksize;
  t.first = ints.size();
  for (int o = 0; o < n; ++o) ints.push_back(a.identity ? a.offset + o : a.first[o]);
  t.count = ints.size();
  for (int o = 0; o < n; ++o) ints.push_back(a.identity ? 1 : a.count[o]);
  t.weights = ints.size();
  if (a.identity) {
    ints.insert(ints.end(), static_cast<size_t>(n), int32_t{1} << 22);
  } else {
    ints.insert(ints.end(), a.weights.begin(), a.weights.end());
  }
  return t;
}

class CudaJpegDecoder final : public JpegDecoder {
 public:
  explicit CudaJpegDecoder(CudaContext& ctx) : ctx_(ctx) {
    const NvjpegApi& api = nvjpeg();
    DeviceGuard guard(ctx_.device());
    RC_CUDA_CHECK(cudaStreamCreateWithFlags(stream_.out(), cudaStreamNonBlocking));
    rawStream_ = stream_;
    RC_CUDA_CHECK(cudaEventCreateWithFlags(done_.out(), cudaEventDisableTiming));
    RC_CUDA_CHECK(cudaEventCreateWithFlags(consumer_.out(), cudaEventDisableTiming));
    // The hardware decoder (A100, H100, H200) where there is one; nvJPEG refuses the backend
    // elsewhere. The hybrid one (Huffman decoding on the host) decodes what the hardware cannot.
    if (api.createEx(NVJPEG_BACKEND_HARDWARE, nullptr, nullptr, 0, &hardware_.handle) == NVJPEG_STATUS_SUCCESS) {
      check(api.stateCreate(hardware_.handle, &hardware_.state), "nvjpegJpegStateCreate", -1);
    } else {
      hardware_.handle = nullptr;
    }
    check(api.createEx(NVJPEG_BACKEND_HYBRID, nullptr, nullptr, 0, &hybrid_.handle), "nvjpegCreateEx", -1);
    check(api.stateCreate(hybrid_.handle, &hybrid_.state), "nvjpegJpegStateCreate", -1);
  }

  // The buffers are freed in the stream's order and the stream is released once its work is done:
  // nothing waits on the host.
  ~CudaJpegDecoder() override = default;

  std::string implementation() const override {
    return hardware_.handle != nullptr ? "nvjpeg:hardware" : "nvjpeg:hybrid";
  }

  void decode(const std::vector<JpegDecodeJob>& jobs, const Tensor& dst) override {
    const int n = static_cast<int>(jobs.size());
    RC_CHECK_ARG(dst.defined() && dst.dtype() == DType::U8 && dst.rank() == 4 && dst.dim(0) == n && dst.dim(3) == 3,
                 "JPEG decode: dst must be u8 ["
                     << n << ", H, W, 3], got "
                     << (dst.defined() ? std::string(dtypeName(dst.dtype())) + " " + shapeStr(dst.shape())
                                       : std::string("nothing")));
    RC_CHECK_ARG(dst.device() == ctx_.rcDevice(),
                 "JPEG decode: dst is on " << dst.device().str() << ", not on " << ctx_.rcDevice().str());
    if (n == 0) return;
    const NvjpegApi& api = nvjpeg();
    DeviceGuard guard(ctx_.device());
    RC_CHECK_ARG(!ctx_.capturing(), "JPEG decode: not while a CUDA graph is being captured on "
                                        << ctx_.rcDevice().str() << " (decode the next batch outside the graph)");
    const int outH = static_cast<int>(dst.dim(1)), outW = static_cast<int>(dst.dim(2));
    // Host side: sizes, plans and the pass tables.
    std::vector<image::ResamplePlan> plans(n);
    std::vector<size_t> imageAt(n), tmpAt(n);
    size_t imageBytes = 0, tmpBytes = 0;
    for (int i = 0; i < n; ++i) {
      const JpegDecodeJob& job = jobs[i];
      RC_CHECK_ARG(job.bytes != nullptr && job.size > 0, "JPEG decode: image " << i << " has no bytes");
      int components = 0;
      nvjpegChromaSubsampling_t subsampling{};
      int widths[NVJPEG_MAX_COMPONENT] = {}, heights[NVJPEG_MAX_COMPONENT] = {};
      check(api.getImageInfo(hybrid_.handle, job.bytes, job.size, &components, &subsampling, widths, heights),
            "nvjpegGetImageInfo", i);
      if (components != 1 && components != 3) {
        RC_THROW(code::kCorruptFile, "JPEG decode: image " << i << " has " << components
                                                           << " components; the device decoder takes grey and "
                                                              "YCbCr/RGB JPEGs (1 or 3 components)");
      }
      RC_CHECK_ARG(heights[0] == job.height && widths[0] == job.width,
                   "JPEG decode: image " << i << " is " << heights[0] << "x" << widths[0] << ", not the " << job.height
                                         << "x" << job.width << " of its request");
      RC_CHECK_ARG(job.spec.windowHeight == outH && job.spec.windowWidth == outW,
                   "JPEG decode: image " << i << " makes a " << job.spec.windowHeight << "x" << job.spec.windowWidth
                                         << " output, dst holds " << outH << "x" << outW);
      plans[i] = image::planResample(job.height, job.width, job.spec);
      imageAt[i] = imageBytes;
      imageBytes += alignUp(static_cast<size_t>(job.height) * job.width * 3);
      const image::ResamplePlan& p = plans[i];
      const size_t tmpRows = p.verticalFirst ? p.y.outputs : p.y.sourceEnd - p.y.sourceBegin;
      const size_t tmpCols = p.verticalFirst ? p.x.sourceEnd - p.x.sourceBegin : p.x.outputs;
      tmpAt[i] = tmpBytes;
      tmpBytes += alignUp(tmpRows * tmpCols * 3);
    }
    std::vector<int32_t> ints;
    std::vector<AxisTables> xs(n), ys(n);
    for (int i = 0; i < n; ++i) {
      xs[i] = appendAxis(plans[i].x, ints);
      ys[i] = appendAxis(plans[i].y, ints);
    }
    const size_t passBytes = alignUp(sizeof(JpegResamplePass) * 2 * n);
    const size_t intBytes = ints.size() * sizeof(int32_t);
    uint8_t* images = images_.reserve(imageBytes);
    uint8_t* tmp = tmp_.reserve(tmpBytes);
    uint8_t* tables = tables_.reserve(passBytes + intBytes);
    const auto* deviceInts = reinterpret_cast<const int32_t*>(tables + passBytes);
    std::vector<JpegResamplePass> passes(2 * n);
    int64_t maxFirst = 0, maxSecond = 0;
    for (int i = 0; i < n; ++i) {
      const JpegDecodeJob& job = jobs[i];
      const image::ResamplePlan& p = plans[i];
      const int64_t stride = static_cast<int64_t>(job.width) * 3;
      const uint8_t* img = images + imageAt[i];
      JpegResamplePass& a = passes[i];
      JpegResamplePass& b = passes[n + i];
      // One pass over `rows` x `cols` output pixels, its weights from `t` (device copies).
      auto pass = [&](const uint8_t* src, uint8_t* out, int64_t srcStride, int64_t dstStride, int rows, int cols,
                      int origin, bool horizontal, bool mirror, const AxisTables& t) {
        return JpegResamplePass{src,
                                out,
                                deviceInts + t.first,
                                deviceInts + t.count,
                                deviceInts + t.weights,
                                srcStride,
                                dstStride,
                                rows,
                                cols,
                                origin,
                                t.ksize,
                                horizontal ? 1 : 0,
                                mirror ? 1 : 0};
      };
      uint8_t* between = tmp + tmpAt[i];
      const int64_t outStride = static_cast<int64_t>(outW) * 3;
      if (p.verticalFirst) {
        // Vertical over the columns the horizontal pass reads, then horizontal.
        const int cols = p.x.sourceEnd - p.x.sourceBegin;
        const int64_t colsStride = static_cast<int64_t>(cols) * 3;
        a = pass(img + static_cast<int64_t>(p.x.sourceBegin) * 3, between, stride, colsStride, p.y.outputs, cols, 0,
                 false, false, ys[i]);
        b = pass(between, nullptr, colsStride, outStride, outH, outW, p.x.sourceBegin, true, job.mirror, xs[i]);
      } else {
        // Horizontal over the rows the vertical pass reads, then vertical.
        const int rows = p.y.sourceEnd - p.y.sourceBegin;
        a = pass(img + static_cast<int64_t>(p.y.sourceBegin) * stride, between, stride, outStride, rows, outW, 0, true,
                 false, xs[i]);
        b = pass(between, nullptr, outStride, outStride, outH, outW, p.y.sourceBegin, false, job.mirror, ys[i]);
      }
      b.dst = dst.ptr<uint8_t>() + static_cast<int64_t>(i) * outH * outW * 3;
      maxFirst = std::max(maxFirst, static_cast<int64_t>(a.rows) * a.cols);
      maxSecond = std::max(maxSecond, static_cast<int64_t>(b.rows) * b.cols);
    }
    // From pageable memory: the calls return once the bytes are staged.
    RC_CUDA_CHECK(cudaMemcpyAsync(tables, passes.data(), passes.size() * sizeof(JpegResamplePass),
                                  cudaMemcpyHostToDevice, stream_));
    RC_CUDA_CHECK(cudaMemcpyAsync(tables + passBytes, ints.data(), intBytes, cudaMemcpyHostToDevice, stream_));
    decodeAll(jobs, images, imageAt);
    const auto* devicePasses = reinterpret_cast<const JpegResamplePass*>(tables);
    jpegResamplePass(devicePasses, n, maxFirst, stream_);
    // dst may still be read by work enqueued on the backend's stream (the previous batch in it).
    RC_CUDA_CHECK(cudaEventRecord(consumer_, ctx_.stream()));
    RC_CUDA_CHECK(cudaStreamWaitEvent(stream_, consumer_, 0));
    jpegResamplePass(devicePasses + n, n, maxSecond, stream_);
    RC_CUDA_CHECK(cudaEventRecord(done_, stream_));
  }

  void join() override {
    DeviceGuard guard(ctx_.device());
    RC_CUDA_CHECK(cudaStreamWaitEvent(ctx_.stream(), done_, 0));
  }

  void synchronize(double timeoutSeconds) override {
    DeviceGuard guard(ctx_.device());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutSeconds);
    for (;;) {
      const cudaError_t status = cudaEventQuery(done_);
      if (status == cudaSuccess) return;
      if (status != cudaErrorNotReady) RC_CUDA_CHECK(status);
      if (std::chrono::steady_clock::now() > deadline) {
        RC_THROW(code::kDevice, "JPEG decode: the device did not finish decoding within " << timeoutSeconds << " s");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

 private:
  // Throws for a failed nvJPEG call: a JPEG that does not decode is a corrupt file (naming image
  // `index`), anything else a device error.
  static void check(nvjpegStatus_t status, const char* call, int index) {
    if (status == NVJPEG_STATUS_SUCCESS) return;
    const bool corrupt = status == NVJPEG_STATUS_BAD_JPEG || status == NVJPEG_STATUS_JPEG_NOT_SUPPORTED ||
                         status == NVJPEG_STATUS_INCOMPLETE_BITSTREAM;
    if (index >= 0 && corrupt) {
      RC_THROW(code::kCorruptFile, "JPEG decode: image " << index << " does not decode: " << call << " returned "
                                                         << nvjpegStatusName(status));
    }
    RC_THROW(code::kDevice, "nvJPEG error " << nvjpegStatusName(status) << " in " << call
                                            << (index >= 0 ? " for image " + std::to_string(index) : std::string()));
  }

  // nvJPEG into images + imageAt[i], interleaved RGB: the whole batch at once on the hardware
  // decoder, one at a time on the hybrid one (also when the hardware refuses the batch, so that
  // an image it cannot decode is decoded there, or named).
  void decodeAll(const std::vector<JpegDecodeJob>& jobs, uint8_t* images, const std::vector<size_t>& imageAt) {
    const NvjpegApi& api = nvjpeg();
    const int n = static_cast<int>(jobs.size());
    std::vector<nvjpegImage_t> out(n);
    for (int i = 0; i < n; ++i) {
      std::memset(&out[i], 0, sizeof(nvjpegImage_t));
      out[i].channel[0] = images + imageAt[i];
      out[i].pitch[0] = static_cast<size_t>(jobs[i].width) * 3;
    }
    if (hardware_.handle != nullptr) {
      std::vector<const unsigned char*> data(n);
      std::vector<size_t> lengths(n);
      for (int i = 0; i < n; ++i) {
        data[i] = jobs[i].bytes;
        lengths[i] = jobs[i].size;
      }
      nvjpegStatus_t status = NVJPEG_STATUS_SUCCESS;
      if (batch_ != n) {
        status = api.batchedInitialize(hardware_.handle, hardware_.state, n, 1, NVJPEG_OUTPUT_RGBI);
        batch_ = status == NVJPEG_STATUS_SUCCESS ? n : 0;
      }
      if (status == NVJPEG_STATUS_SUCCESS) {
        status = api.decodeBatched(hardware_.handle, hardware_.state, data.data(), lengths.data(), out.data(), stream_);
      }
      if (status == NVJPEG_STATUS_SUCCESS) return;
      batch_ = 0;  // a failed batch needs the state initialised again
    }
    for (int i = 0; i < n; ++i) {
      check(
          api.decode(hybrid_.handle, hybrid_.state, jobs[i].bytes, jobs[i].size, NVJPEG_OUTPUT_RGBI, &out[i], stream_),
          "nvjpegDecode", i);
    }
  }

  CudaContext& ctx_;
  // Declared before the buffers, which are freed on it.
  StreamHandle stream_;
  EventHandle done_;
  EventHandle consumer_;
  NvjpegHandles hardware_;
  NvjpegHandles hybrid_;
  int batch_ = 0;
  cudaStream_t rawStream_ = nullptr;
  DeviceBuffer images_{rawStream_};
  DeviceBuffer tmp_{rawStream_};
  DeviceBuffer tables_{rawStream_};
};

}  // namespace

std::unique_ptr<JpegDecoder> createCudaJpegDecoder(CudaContext& ctx) { return std::make_unique<CudaJpegDecoder>(ctx); }

}  // namespace rc::cuda
