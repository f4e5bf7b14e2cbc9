// Host launcher of the device JPEG decoder's resampling kernel (jpeg_resample.cu): one separable
// pass of rc::image::runResample (PIL's fixed-point filter) over a batch of 3-channel uint8 images.
// Enqueues on `stream`, never synchronises, never allocates; throws rc::Error ERR_RC_CUDA for a
// failed launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace rc::cuda {

// One image's pass, in device memory. Output pixel (r, o) of a horizontal pass is
// sum_i src[r][first[o] - origin + i] * weights[o * ksize + i], of a vertical one
// sum_i src[first[r] - origin + i][o] * weights[r * ksize + i] (per channel), rounded and clipped
// to uint8 as runResample does; `mirror` writes column o at cols - 1 - o.
struct JpegResamplePass {
  const uint8_t* src;
  uint8_t* dst;
  const int32_t* first;
  const int32_t* count;
  const int32_t* weights;
  int64_t srcStride;  // bytes between source rows
  int64_t dstStride;  // bytes between output rows
  int32_t rows;       // output rows
  int32_t cols;       // output columns
  int32_t origin;     // the index (along the pass's axis) of the source's first row or column
  int32_t ksize;
  int32_t horizontal;
  int32_t mirror;
};

// Runs passes[0 .. images) (device memory); `maxPixels` bounds rows * cols over them.
void jpegResamplePass(const JpegResamplePass* passes, int images, int64_t maxPixels, cudaStream_t stream);

}  // namespace rc::cuda
