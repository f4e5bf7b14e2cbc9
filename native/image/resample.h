// Image resampling with the semantics of PIL's Image.resize(size, resample, box), which
// torchvision's Resize and RandomResizedCrop use on PIL images: a separable convolution with the
// filter stretched by the reduction factor when shrinking (antialiasing), the kernel renormalised
// where it meets the image border, coefficients in 22-bit fixed point, a horizontal pass rounded
// to uint8 and then a vertical pass. On uint8 images of 1 to 4 interleaved channels.
//
// A plan is made for an output window (a crop of the resized image), so that only the kept pixels
// are computed and only the source region they read needs to exist (the JPEG decoder decodes just
// that region).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace rc::image {

enum class Filter { Nearest, Bilinear, Bicubic, Lanczos };

// One axis of a resampling: for each output index of the window, the source index range and the
// fixed-point weights.
struct Axis {
  int outputs = 0;  // output indices in the window
  // True when the output is a plain copy of source indices offset..offset + count.
  bool identity = false;
  int offset = 0;
  int ksize = 0;                 // weights per output index (stride of `weights`)
  std::vector<int> first;        // per output index: first source index read
  std::vector<int> count;        // per output index: number of source indices read
  std::vector<int32_t> weights;  // per output index: `ksize` weights, the first `count` used
  int sourceBegin = 0;           // the source range any output index reads: [sourceBegin, sourceEnd)
  int sourceEnd = 0;
};

// The source box (x0, y0, x1, y1) in pixels (fractional allowed, as PIL's box), the full output
// size, and the window of it to produce (rows windowTop.. + windowHeight, columns windowLeft.. +
// windowWidth).
struct ResampleSpec {
  double box[4] = {0, 0, 0, 0};
  int outHeight = 0;
  int outWidth = 0;
  int windowTop = 0;
  int windowLeft = 0;
  int windowHeight = 0;
  int windowWidth = 0;
  Filter filter = Filter::Bilinear;
};

struct ResamplePlan {
  Axis x;
  Axis y;
  // The pass order PIL picks when both are needed: vertical first when the height shrinks and
  // the width grows by more than half of the height's reduction, 2 (outW - boxW) > outH - boxH
  // (established on Pillow 13.0 over several hundred size combinations); horizontal first
  // otherwise. The first pass is rounded to uint8, so the order shows in the last bit.
  bool verticalFirst = false;
};

// A source image, or the decoded part of one: rows [rowBegin, rowBegin + rows) and columns
// [colBegin, colBegin + cols) of the whole image, `stride` bytes apart.
struct SourceRegion {
  const uint8_t* data = nullptr;
  size_t stride = 0;
  int rowBegin = 0;
  int colBegin = 0;
  int rows = 0;
  int cols = 0;
  int channels = 0;
};

// Plans the resampling of a source of sourceHeight x sourceWidth pixels. Throws rc::Error
// (ERR_RC_INVALID_ARGUMENT) for a box outside the source, an empty box, or a window outside the
// output.
ResamplePlan planResample(int sourceHeight, int sourceWidth, const ResampleSpec& spec);

// Runs the plan: writes windowHeight x windowWidth x channels bytes to `out`, mirrored left to
// right when `mirror`. The source region must cover the plan's source ranges.
void runResample(const ResamplePlan& plan, const SourceRegion& source, bool mirror, uint8_t* out);

}  // namespace rc::image
