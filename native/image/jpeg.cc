#include "jpeg.h"

#include <algorithm>
#include <csetjmp>
#include <cstdio>  // jpeglib.h needs FILE and size_t declared first

#include <jpeglib.h>
// After jpeglib.h: which warning codes jerror.h defines depends on the library's configuration.
#include <jerror.h>

#include "../core/error.h"

#if !defined(LIBJPEG_TURBO_VERSION_NUMBER) || LIBJPEG_TURBO_VERSION_NUMBER < 1005000
#error "libjpeg-turbo 1.5 or newer is required (jpeg_crop_scanline, jpeg_skip_scanlines)"
#endif

namespace rc::image {
namespace {

// libjpeg reports errors through callbacks; these jump back to the decoding function, whose
// state lives in a Session outside the jumped-over frames.
struct ErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void onError(j_common_ptr c) {
  auto* e = reinterpret_cast<ErrorManager*>(c->err);
  (*c->err->format_message)(c, e->message);
  std::longjmp(e->jump, 1);
}

// The warnings after which libjpeg goes on with data it lost or guessed: a file that ends early or
// an entropy-coded segment cut by a marker (the rest of the image becomes grey), a bad Huffman or
// arithmetic code, a lost restart marker, bytes left over before a marker (the scan's data did not
// decode as it was written), an inconsistent progression or invalid scan parameters. Decoding them
// would give a plausible but wrong image, so they are errors. The others (an unknown JFIF revision
// or Adobe transform code) describe metadata and stay warnings.
bool lostData(int messageCode) {
  switch (messageCode) {
    case JWRN_JPEG_EOF:
    case JWRN_HIT_MARKER:
    case JWRN_HUFF_BAD_CODE:
    case JWRN_ARITH_BAD_CODE:
    case JWRN_MUST_RESYNC:
    case JWRN_EXTRANEOUS_DATA:
    case JWRN_BOGUS_PROGRESSION:
    case JWRN_NOT_SEQUENTIAL: return true;
    default: return false;
  }
}

void onMessage(j_common_ptr c, int level) {
  if (level >= 0) return;
  if (lostData(c->err->msg_code)) onError(c);
  c->err->num_warnings++;
}

// The largest image decoded, in pixels: sharp's default `limitInputPixels` (0x3FFF squared), which
// applies to the formats it decodes. A header that claims more (often a corrupt one) is refused
// before any pixel memory is allocated.
constexpr uint64_t kMaxPixels = 0x3FFFull * 0x3FFF;

// Everything the decoding touches, owned by the caller's frame so that a longjmp skips no
// destructor.
struct Session {
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  bool created = false;
  ResamplePlan plan;
  std::vector<uint8_t> region;
  SourceRegion source;
  int channels = 0;

  Session() = default;
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  ~Session() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
};

void open(Session& s, const uint8_t* bytes, size_t size) {
  s.cinfo.err = jpeg_std_error(&s.err.pub);
  s.err.pub.error_exit = onError;
  s.err.pub.emit_message = onMessage;
  s.err.message[0] = '\0';
  jpeg_create_decompress(&s.cinfo);
  s.created = true;
  jpeg_mem_src(&s.cinfo, bytes, static_cast<unsigned long>(size));
  jpeg_read_header(&s.cinfo, TRUE);
}

// Colour spaces decoded here: grayscale stays one channel, YCbCr and RGB become RGB.
int outputChannels(J_COLOR_SPACE space) {
  if (space == JCS_GRAYSCALE) return 1;
  if (space == JCS_YCbCr || space == JCS_RGB) return 3;
  return 0;
}

// The libjpeg part. Returns 1 when decoded into s.region, 0 for an unsupported colour space, -1
// after a libjpeg error (message in s.err). Locals are not read after a jump.
int decodeRegion(Session& s, const uint8_t* bytes, size_t size, const JpegRequest& r) {
  if (setjmp(s.err.jump)) return -1;
  open(s, bytes, size);
  jpeg_decompress_struct& ci = s.cinfo;
  s.channels = outputChannels(ci.jpeg_color_space);
  if (s.channels == 0) return 0;
  ci.out_color_space = s.channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  const int imageHeight = static_cast<int>(ci.image_height);
  const int imageWidth = static_cast<int>(ci.image_width);
  if (static_cast<uint64_t>(imageHeight) * static_cast<uint64_t>(imageWidth) > kMaxPixels) {
    std::snprintf(s.err.message, sizeof s.err.message, "the header claims %dx%d pixels, over the limit of %llu",
                  imageHeight, imageWidth, static_cast<unsigned long long>(kMaxPixels));
    return -1;
  }
  const int top = r.crop ? r.top : 0, left = r.crop ? r.left : 0;
  const int height = r.crop ? r.height : imageHeight, width = r.crop ? r.width : imageWidth;
  RC_CHECK_ARG(
      top >= 0 && left >= 0 && height > 0 && width > 0 && top + height <= imageHeight && left + width <= imageWidth,
      "decodeJpeg: the crop " << height << "x" << width << " at (" << top << ", " << left << ") is not inside the "
                              << imageHeight << "x" << imageWidth << " image");
  ResampleSpec spec;
  spec.outHeight = r.resize ? r.outHeight : height;
  spec.outWidth = r.resize ? r.outWidth : width;
  spec.windowTop = r.window ? r.windowTop : 0;
  spec.windowLeft = r.window ? r.windowLeft : 0;
  spec.windowHeight = r.window ? r.windowHeight : spec.outHeight;
  spec.windowWidth = r.window ? r.windowWidth : spec.outWidth;
  spec.filter = r.filter;
  int denom = 1;
  if (r.dctScaling && r.filter != Filter::Nearest && spec.outHeight > 0 && spec.outWidth > 0) {
    const double reduction =
        std::min(static_cast<double>(height) / spec.outHeight, static_cast<double>(width) / spec.outWidth);
    for (int d : {8, 4, 2}) {
      if (reduction / d >= 2.0) {
        denom = d;
        break;
      }
    }
  }
  ci.scale_num = 1;
  ci.scale_denom = static_cast<unsigned int>(denom);
  jpeg_calc_output_dimensions(&ci);
  const int scaledHeight = static_cast<int>(ci.output_height);
  const int scaledWidth = static_cast<int>(ci.output_width);
  spec.box[0] = static_cast<double>(left) / denom;
  spec.box[1] = static_cast<double>(top) / denom;
  spec.box[2] = std::min(static_cast<double>(left + width) / denom, static_cast<double>(scaledWidth));
  spec.box[3] = std::min(static_cast<double>(top + height) / denom, static_cast<double>(scaledHeight));
  s.plan = planResample(scaledHeight, scaledWidth, spec);

  jpeg_start_decompress(&ci);
  // One more row and column on each side than the plan reads: libjpeg's fancy upsampling of
  // subsampled chroma gets the first row after jpeg_skip_scanlines and the outer columns of
  // jpeg_crop_scanline slightly wrong when they fall on an iMCU boundary (it lacks the neighbour
  // there), and the margin keeps those rows and columns out of the output.
  const int colBegin = std::max(s.plan.x.sourceBegin - 1, 0);
  const int colEnd = std::min(s.plan.x.sourceEnd + 1, scaledWidth);
  const int rowBegin = std::max(s.plan.y.sourceBegin - 1, 0);
  const int rowEnd = std::min(s.plan.y.sourceEnd + 1, scaledHeight);
  JDIMENSION xOffset = static_cast<JDIMENSION>(colBegin);
  JDIMENSION xWidth = static_cast<JDIMENSION>(colEnd - colBegin);
  // Decodes whole iMCU columns: the offset moves left to a boundary and the width grows.
  if (xWidth < ci.output_width) jpeg_crop_scanline(&ci, &xOffset, &xWidth);
  const size_t stride = static_cast<size_t>(xWidth) * s.channels;
  s.region.resize(static_cast<size_t>(rowEnd - rowBegin) * stride);
  if (rowBegin > 0) jpeg_skip_scanlines(&ci, static_cast<JDIMENSION>(rowBegin));
  JSAMPROW rows[16];
  while (static_cast<int>(ci.output_scanline) < rowEnd) {
    const int at = static_cast<int>(ci.output_scanline);
    const int n = std::min(rowEnd - at, 16);
    for (int i = 0; i < n; ++i) rows[i] = s.region.data() + static_cast<size_t>(at - rowBegin + i) * stride;
    jpeg_read_scanlines(&ci, rows, static_cast<JDIMENSION>(n));
  }
  // The rows below are not needed; a truncated file is caught by decoding it whole (see the
  // caller), as the fused pipelines did with libvips.
  jpeg_abort_decompress(&ci);
  s.source.data = s.region.data();
  s.source.stride = stride;
  s.source.rowBegin = rowBegin;
  s.source.colBegin = static_cast<int>(xOffset);
  s.source.rows = rowEnd - rowBegin;
  s.source.cols = static_cast<int>(xWidth);
  s.source.channels = s.channels;
  return 1;
}

int readHeader(Session& s, const uint8_t* bytes, size_t size) {
  if (setjmp(s.err.jump)) return -1;
  open(s, bytes, size);
  return 1;
}

}  // namespace

std::string libjpegTurboVersion() {
  constexpr int v = LIBJPEG_TURBO_VERSION_NUMBER;  // e.g. 2001005
  return std::to_string(v / 1000000) + "." + std::to_string(v / 1000 % 1000) + "." + std::to_string(v % 1000);
}

JpegHeader readJpegHeader(const uint8_t* bytes, size_t size) {
  Session s;
  if (readHeader(s, bytes, size) < 0) RC_THROW(code::kCorruptFile, s.err.message);
  JpegHeader h;
  h.height = static_cast<int>(s.cinfo.image_height);
  h.width = static_cast<int>(s.cinfo.image_width);
  h.channels = outputChannels(s.cinfo.jpeg_color_space);
  h.supported = h.channels != 0;
  return h;
}

bool decodeJpeg(const uint8_t* bytes, size_t size, const JpegRequest& request, const ImageAllocator& allocate,
                JpegImage& out) {
  Session s;
  const int status = decodeRegion(s, bytes, size, request);
  if (status < 0) RC_THROW(code::kCorruptFile, s.err.message);
  if (status == 0) return false;
  const int height = s.plan.y.outputs;
  const int width = s.plan.x.outputs;
  out.data = allocate(static_cast<size_t>(height) * width * s.channels);
  out.height = height;
  out.width = width;
  out.channels = s.channels;
  runResample(s.plan, s.source, request.mirror, out.data);
  return true;
}

}  // namespace rc::image
