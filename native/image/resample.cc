#include "resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "../core/error.h"

namespace rc::image {
namespace {

// PIL's fixed point: weights carry 22 fractional bits, leaving 8 bits for the pixel value and 2
// for the sum of a kernel's negative lobes.
constexpr int kPrecisionBits = 32 - 8 - 2;
constexpr int32_t kHalf = int32_t{1} << (kPrecisionBits - 1);

constexpr double kPi = 3.14159265358979323846;

double support(Filter f) {
  switch (f) {
    case Filter::Bilinear: return 1.0;
    case Filter::Bicubic: return 2.0;
    case Filter::Lanczos: return 3.0;
    case Filter::Nearest: break;
  }
  return 0.0;
}

// The triangle filter.
double triangle(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

// Keys' cubic convolution with a = -0.5 (Catmull-Rom), PIL's BICUBIC.
double cubic(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

double sinc(double x) {
  if (x == 0.0) return 1.0;
  x *= kPi;
  return std::sin(x) / x;
}

// Lanczos with three lobes.
double lanczos3(double x) {
  if (-3.0 <= x && x < 3.0) return sinc(x) * sinc(x / 3);
  return 0.0;
}

double evaluate(Filter f, double x) {
  switch (f) {
    case Filter::Bilinear: return triangle(x);
    case Filter::Bicubic: return cubic(x);
    case Filter::Lanczos: return lanczos3(x);
    case Filter::Nearest: break;
  }
  return 0.0;
}

uint8_t clip8(int32_t acc) {
  const int32_t v = acc >> kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

// One axis: `in0..in1` of a source of `inSize` pixels onto `outSize` pixels, for output indices
// windowStart .. windowStart + windowCount. As torchvision crops before it resizes, the kernels
// read only the pixels of the box (widened to whole pixels) and are renormalised at its edges;
// the arithmetic runs in the box's coordinates, as PIL's on the cropped image.
Axis planAxis(int inSize, double in0, double in1, int outSize, int windowStart, int windowCount, Filter filter) {
  Axis a;
  a.outputs = windowCount;
  const double scale = (in1 - in0) / outSize;
  const int base = static_cast<int>(std::floor(in0));
  const double start = in0 - base;
  const int size = std::min(static_cast<int>(std::ceil(in1)), inSize) - base;
  if (scale == 1.0 && start == 0.0) {
    // Every filter is 1 at 0 and 0 at the other integers, and nearest picks the same pixel.
    a.identity = true;
    a.offset = base + windowStart;
    a.sourceBegin = a.offset;
    a.sourceEnd = a.offset + windowCount;
    return a;
  }
  a.first.resize(windowCount);
  a.count.resize(windowCount);
  if (filter == Filter::Nearest) {
    // PIL resizes with NEAREST as an affine transform sampling at the output pixel's centre.
    a.ksize = 1;
    a.weights.assign(windowCount, int32_t{1} << kPrecisionBits);
    for (int o = 0; o < windowCount; ++o) {
      const int s = static_cast<int>(std::floor(start + (windowStart + o + 0.5) * scale));
      a.first[o] = base + std::clamp(s, 0, size - 1);
      a.count[o] = 1;
    }
  } else {
    const double filterScale = std::max(scale, 1.0);
    const double reach = support(filter) * filterScale;
    a.ksize = static_cast<int>(std::ceil(reach)) * 2 + 1;
    a.weights.assign(static_cast<size_t>(windowCount) * a.ksize, 0);
    std::vector<double> w(a.ksize);
    const double inverse = 1.0 / filterScale;
    for (int o = 0; o < windowCount; ++o) {
      const double center = start + (windowStart + o + 0.5) * scale;
      // Truncation toward zero, then clamping, as PIL's (int) casts.
      const int lo = std::max(static_cast<int>(center - reach + 0.5), 0);
      const int hi = std::min(static_cast<int>(center + reach + 0.5), size);
      const int n = std::min(std::max(hi - lo, 1), a.ksize);
      double sum = 0.0;
      for (int i = 0; i < n; ++i) {
        w[i] = evaluate(filter, (i + lo - center + 0.5) * inverse);
        sum += w[i];
      }
      int32_t* k = &a.weights[static_cast<size_t>(o) * a.ksize];
      for (int i = 0; i < n; ++i) {
        const double v = sum != 0.0 ? w[i] / sum : w[i];
        const double fixed = v * (1 << kPrecisionBits);
        k[i] = static_cast<int32_t>(v < 0 ? -0.5 + fixed : 0.5 + fixed);
      }
      a.first[o] = base + std::min(lo, size - 1);
      a.count[o] = n;
    }
  }
  a.sourceBegin = inSize;
  a.sourceEnd = 0;
  for (int o = 0; o < windowCount; ++o) {
    a.sourceBegin = std::min(a.sourceBegin, a.first[o]);
    a.sourceEnd = std::max(a.sourceEnd, a.first[o] + a.count[o]);
  }
  return a;
}

// Horizontal pass over source rows [rowBegin, rowEnd): out has windowWidth x C bytes per row.
template <int C>
void horizontal(const Axis& x, const SourceRegion& src, int rowBegin, int rowEnd, uint8_t* out) {
  const int width = x.outputs;
  const size_t outStride = static_cast<size_t>(width) * C;
  for (int r = rowBegin; r < rowEnd; ++r) {
    const uint8_t* row = src.data + static_cast<size_t>(r - src.rowBegin) * src.stride;
    uint8_t* dst = out + static_cast<size_t>(r - rowBegin) * outStride;
    for (int o = 0; o < width; ++o) {
      const int32_t* k = &x.weights[static_cast<size_t>(o) * x.ksize];
      const uint8_t* p = row + static_cast<size_t>(x.first[o] - src.colBegin) * C;
      const int n = x.count[o];
      int32_t acc[C];
      for (int c = 0; c < C; ++c) acc[c] = kHalf;
      for (int i = 0; i < n; ++i) {
        for (int c = 0; c < C; ++c) acc[c] += p[i * C + c] * k[i];
      }
      for (int c = 0; c < C; ++c) dst[o * C + c] = clip8(acc[c]);
    }
  }
}

void horizontalAny(const Axis& x, const SourceRegion& src, int rowBegin, int rowEnd, uint8_t* out) {
  switch (src.channels) {
    case 1: return horizontal<1>(x, src, rowBegin, rowEnd, out);
    case 2: return horizontal<2>(x, src, rowBegin, rowEnd, out);
    case 3: return horizontal<3>(x, src, rowBegin, rowEnd, out);
    default: return horizontal<4>(x, src, rowBegin, rowEnd, out);
  }
}

// Vertical pass: `rowAt(r)` gives source row r (already restricted to the window's columns),
// `bytes` per row.
template <typename RowAt>
void vertical(const Axis& y, RowAt rowAt, size_t bytes, uint8_t* out) {
  std::vector<int32_t> acc(bytes);
  const int height = y.outputs;
  for (int o = 0; o < height; ++o) {
    std::fill(acc.begin(), acc.end(), kHalf);
    const int32_t* k = &y.weights[static_cast<size_t>(o) * y.ksize];
    for (int i = 0; i < y.count[o]; ++i) {
      const uint8_t* p = rowAt(y.first[o] + i);
      const int32_t w = k[i];
      for (size_t j = 0; j < bytes; ++j) acc[j] += p[j] * w;
    }
    uint8_t* dst = out + static_cast<size_t>(o) * bytes;
    for (size_t j = 0; j < bytes; ++j) dst[j] = clip8(acc[j]);
  }
}

void mirrorRows(uint8_t* data, int rows, int cols, int channels) {
  for (int r = 0; r < rows; ++r) {
    uint8_t* row = data + static_cast<size_t>(r) * cols * channels;
    for (int a = 0, b = cols - 1; a < b; ++a, --b) {
      for (int c = 0; c < channels; ++c) std::swap(row[a * channels + c], row[b * channels + c]);
    }
  }
}

}  // namespace

ResamplePlan planResample(int sourceHeight, int sourceWidth, const ResampleSpec& s) {
  RC_CHECK_ARG(sourceHeight > 0 && sourceWidth > 0,
               "resample: expected a non-empty source, got " << sourceHeight << "x" << sourceWidth);
  const double x0 = s.box[0], y0 = s.box[1], x1 = s.box[2], y1 = s.box[3];
  RC_CHECK_ARG(std::isfinite(x0) && std::isfinite(y0) && std::isfinite(x1) && std::isfinite(y1) && x0 >= 0 && y0 >= 0 &&
                   x1 <= sourceWidth && y1 <= sourceHeight && x1 > x0 && y1 > y0,
               "resample: expected a box (x0, y0, x1, y1) inside the "
                   << sourceHeight << "x" << sourceWidth << " source with x0 < x1 and y0 < y1, got (" << x0 << ", "
                   << y0 << ", " << x1 << ", " << y1 << ")");
  RC_CHECK_ARG(s.outHeight > 0 && s.outWidth > 0 && s.outHeight <= 65535 && s.outWidth <= 65535,
               "resample: expected an output size of 1 to 65535 per side, got " << s.outHeight << "x" << s.outWidth);
  RC_CHECK_ARG(s.windowTop >= 0 && s.windowLeft >= 0 && s.windowHeight > 0 && s.windowWidth > 0 &&
                   s.windowTop + s.windowHeight <= s.outHeight && s.windowLeft + s.windowWidth <= s.outWidth,
               "resample: expected a window inside the " << s.outHeight << "x" << s.outWidth << " output, got "
                                                         << s.windowHeight << "x" << s.windowWidth << " at ("
                                                         << s.windowTop << ", " << s.windowLeft << ")");
  ResamplePlan plan;
  plan.x = planAxis(sourceWidth, x0, x1, s.outWidth, s.windowLeft, s.windowWidth, s.filter);
  plan.y = planAxis(sourceHeight, y0, y1, s.outHeight, s.windowTop, s.windowHeight, s.filter);
  const double boxWidth = x1 - x0, boxHeight = y1 - y0;
  plan.verticalFirst = s.outHeight < boxHeight && 2 * (s.outWidth - boxWidth) > s.outHeight - boxHeight;
  return plan;
}

void runResample(const ResamplePlan& plan, const SourceRegion& src, bool mirror, uint8_t* out) {
  const Axis& x = plan.x;
  const Axis& y = plan.y;
  const int C = src.channels;
  RC_CHECK_ARG(C >= 1 && C <= 4, "resample: expected 1 to 4 channels, got " << C);
  RC_CHECK_ARG(src.rowBegin <= y.sourceBegin && y.sourceEnd <= src.rowBegin + src.rows &&
                   src.colBegin <= x.sourceBegin && x.sourceEnd <= src.colBegin + src.cols,
               "resample: the source region does not cover the rows and columns the plan reads");
  const int outRows = y.outputs;
  const int outCols = x.outputs;
  const size_t rowBytes = static_cast<size_t>(outCols) * C;
  auto sourceRow = [&](int r) {
    return src.data + static_cast<size_t>(r - src.rowBegin) * src.stride +
           static_cast<size_t>(x.sourceBegin - src.colBegin) * C;
  };
  if (x.identity && y.identity) {
    for (int r = 0; r < outRows; ++r) std::memcpy(out + r * rowBytes, sourceRow(y.offset + r), rowBytes);
  } else if (x.identity) {
    vertical(y, sourceRow, rowBytes, out);
  } else if (y.identity) {
    horizontalAny(x, src, y.sourceBegin, y.sourceEnd, out);
  } else if (plan.verticalFirst) {
    // The vertical pass covers only the columns the horizontal pass reads.
    const int cols = x.sourceEnd - x.sourceBegin;
    const size_t tmpRowBytes = static_cast<size_t>(cols) * C;
    std::vector<uint8_t> tmp(static_cast<size_t>(outRows) * tmpRowBytes);
    vertical(y, sourceRow, tmpRowBytes, tmp.data());
    SourceRegion mid;
    mid.data = tmp.data();
    mid.stride = tmpRowBytes;
    mid.rowBegin = 0;
    mid.colBegin = x.sourceBegin;
    mid.rows = outRows;
    mid.cols = cols;
    mid.channels = C;
    horizontalAny(x, mid, 0, outRows, out);
  } else {
    // The horizontal pass covers only the rows the vertical pass reads, rounded to uint8 as PIL's
    // intermediate image.
    std::vector<uint8_t> tmp(static_cast<size_t>(y.sourceEnd - y.sourceBegin) * rowBytes);
    horizontalAny(x, src, y.sourceBegin, y.sourceEnd, tmp.data());
    const uint8_t* base = tmp.data();
    const int begin = y.sourceBegin;
    vertical(
        y, [&](int r) { return base + static_cast<size_t>(r - begin) * rowBytes; }, rowBytes, out);
  }
  if (mirror) mirrorRows(out, outRows, outCols, C);
}

}  // namespace rc::image
