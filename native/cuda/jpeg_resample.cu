// The resampling of the device JPEG decoder: the separable passes of rc::image::runResample with
// the host's plan (planResample's source indices and 22-bit fixed-point weights), so that a decoded
// image gives the CPU decoder's pixels bit for bit.
#include "device_utils.cuh"
#include "jpeg_kernels.h"

namespace rc::cuda {
namespace {

constexpr int kPrecisionBits = 22;  // rc::image's fixed point (32 - 8 - 2)
constexpr int32_t kHalf = int32_t{1} << (kPrecisionBits - 1);

__device__ __forceinline__ uint8_t clip8(int32_t acc) {
  const int32_t v = acc >> kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

// blockIdx.y: the image; a grid-stride loop over its output pixels, 3 channels each.
__global__ void jpeg_resample_kernel(const JpegResamplePass* passes) {
  const JpegResamplePass p = passes[blockIdx.y];
  const int64_t pixels = static_cast<int64_t>(p.rows) * p.cols;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < pixels;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(k / p.cols);
    const int o = static_cast<int>(k % p.cols);
    const int j = p.horizontal ? o : r;  // the output index along the resampled axis
    const int32_t* w = p.weights + static_cast<int64_t>(j) * p.ksize;
    const int n = p.count[j];
    const int start = p.first[j] - p.origin;
    int32_t acc0 = kHalf, acc1 = kHalf, acc2 = kHalf;
    for (int i = 0; i < n; ++i) {
      const uint8_t* s = p.horizontal ? p.src + static_cast<int64_t>(r) * p.srcStride + (start + i) * 3
                                      : p.src + static_cast<int64_t>(start + i) * p.srcStride + o * 3;
      acc0 += s[0] * w[i];
      acc1 += s[1] * w[i];
      acc2 += s[2] * w[i];
    }
    uint8_t* d = p.dst + static_cast<int64_t>(r) * p.dstStride + (p.mirror ? p.cols - 1 - o : o) * 3;
    d[0] = clip8(acc0);
    d[1] = clip8(acc1);
    d[2] = clip8(acc2);
  }
}

}  // namespace

void jpegResamplePass(const JpegResamplePass* passes, int images, int64_t maxPixels, cudaStream_t stream) {
  if (images <= 0 || maxPixels <= 0) return;
  RC_CHECK_ARG(images <= 65535, "JPEG resampling: at most 65535 images per batch, got " << images);
  const dim3 grid(gridFor(maxPixels), static_cast<unsigned>(images));
  jpeg_resample_kernel<<<grid, kThreads, 0, stream>>>(passes);
  checkLaunch("jpeg_resample_kernel");
}

}  // namespace rc::cuda
