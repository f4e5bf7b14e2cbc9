// The CUDA backend's JpegDecoder (core/backend.h): nvJPEG decodes each JPEG whole into device memory
// as interleaved RGB, then jpeg_resample.cu crops, resizes and mirrors with the CPU decoder's plan.
#pragma once

#include <memory>

#include "cuda_context.h"

namespace rc::cuda {

std::unique_ptr<JpegDecoder> createCudaJpegDecoder(CudaContext& ctx);

}  // namespace rc::cuda
