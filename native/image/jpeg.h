// JPEG decoding with libjpeg-turbo on the calling thread, fused with the crop and resize of the
// transforms: only the rows and columns the output reads are decoded (whole MCU columns, skipped
// rows entropy-decoded only), large reductions start with libjpeg's DCT-domain scaling, and the
// rest is rc::image::runResample (PIL's resampling).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "resample.h"

namespace rc::image {

struct JpegRequest {
  // The crop of the image to resize (torchvision's crop before resize), in pixels; the whole
  // image when `crop` is false.
  bool crop = false;
  int top = 0, left = 0, height = 0, width = 0;
  // The size the crop is resized to; the crop's own size when `resize` is false.
  bool resize = false;
  int outHeight = 0, outWidth = 0;
  // The part of the resized image to produce (a CenterCrop after a Resize); all of it when
  // `window` is false.
  bool window = false;
  int windowTop = 0, windowLeft = 0, windowHeight = 0, windowWidth = 0;
  Filter filter = Filter::Bilinear;
  bool mirror = false;
  // Whether a reduction of 4x or more may start with libjpeg's 1/2, 1/4 or 1/8 scaled decoding
  // (keeping at least a 2x reduction for the filter), as PIL's draft mode or libvips'
  // shrink-on-load; the result then differs slightly from a full-size decode.
  bool dctScaling = true;
};

struct JpegImage {
  uint8_t* data = nullptr;  // height x width x channels, from the caller's allocate()
  int height = 0;
  int width = 0;
  int channels = 0;  // 1 (grayscale JPEG) or 3 (RGB)
};

// Gives the memory for a decoded image of `bytes` bytes (e.g. a JavaScript buffer, so that the
// result needs no copy and its memory is the garbage collector's to account for).
using ImageAllocator = std::function<uint8_t*(size_t bytes)>;

// Header facts: the size and whether decodeJpeg handles the colour space.
struct JpegHeader {
  int height = 0;
  int width = 0;
  int channels = 0;
  bool supported = false;  // false for CMYK and YCCK JPEGs
};

// The libjpeg-turbo version the code was built against, e.g. "2.1.5".
std::string libjpegTurboVersion();

// Reads the header. Throws rc::Error ERR_RC_CORRUPT_FILE when it is not a readable JPEG.
JpegHeader readJpegHeader(const uint8_t* bytes, size_t size);

// Decodes, crops and resizes into memory from `allocate`. Returns false (without allocating) when
// the colour space is neither grayscale, YCbCr nor RGB. Throws rc::Error: ERR_RC_CORRUPT_FILE with libjpeg's message
// when the data is broken or ends early, ERR_RC_INVALID_ARGUMENT for a crop outside the image or
// a window outside the output.
bool decodeJpeg(const uint8_t* bytes, size_t size, const JpegRequest& request, const ImageAllocator& allocate,
                JpegImage& out);

}  // namespace rc::image
