// The emulated nvJPEG (see include/nvjpeg.h): libjpeg decodes on the host, the emulated stream
// writes the pixels into device memory.
#include <nvjpeg.h>
#include <rc_emu/runtime.h>

#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

// libjpeg's headers need FILE and size_t declared first.
#include <jpeglib.h>
// After jpeglib.h, which it needs.
#include <jerror.h>

struct nvjpegHandle {
  nvjpegBackend_t backend = NVJPEG_BACKEND_DEFAULT;
};

struct nvjpegJpegState {
  nvjpegHandle_t handle = nullptr;
  int batchSize = 0;  // 0 until nvjpegDecodeBatchedInitialize
  nvjpegOutputFormat_t batchFormat = NVJPEG_OUTPUT_RGBI;
};

namespace {

struct ErrorManager {
  jpeg_error_mgr pub;
  jmp_buf jump;
};

[[noreturn]] void onError(j_common_ptr info) { longjmp(reinterpret_cast<ErrorManager*>(info->err)->jump, 1); }

// Corrupt data that libjpeg would decode into a plausible but wrong image (a file that ends early,
// a bad entropy code, a lost restart marker, extraneous bytes) is an error, as nvJPEG's decoders
// stop at it; warnings about metadata are ignored.
void onMessage(j_common_ptr info, int level) {
  if (level >= 0) return;
  switch (info->err->msg_code) {
    case JWRN_JPEG_EOF:
    case JWRN_HIT_MARKER:
    case JWRN_HUFF_BAD_CODE:
    case JWRN_MUST_RESYNC:
    case JWRN_EXTRANEOUS_DATA:
    case JWRN_BOGUS_PROGRESSION:
    case JWRN_NOT_SEQUENTIAL: onError(info);
    default: break;
  }
}

struct Decoded {
  nvjpegStatus_t status = NVJPEG_STATUS_SUCCESS;
  int height = 0, width = 0, components = 0;
  bool progressive = false;
  int hSamp[NVJPEG_MAX_COMPONENT] = {}, vSamp[NVJPEG_MAX_COMPONENT] = {};
  std::vector<unsigned char> rgb;  // height x width x 3, with `pixels`
};

// Reads the header, and with `pixels` decodes to interleaved RGB. libjpeg's state lives in a
// separate frame from the setjmp so that nothing with a destructor is skipped by the longjmp.
bool run(jpeg_decompress_struct& ci, ErrorManager& err, const unsigned char* data, size_t length, bool pixels,
         Decoded& out) {
  if (setjmp(err.jump)) return false;
  jpeg_create_decompress(&ci);
  jpeg_mem_src(&ci, data, static_cast<unsigned long>(length));
  jpeg_read_header(&ci, TRUE);
  out.height = static_cast<int>(ci.image_height);
  out.width = static_cast<int>(ci.image_width);
  out.components = ci.num_components;
  out.progressive = ci.progressive_mode != 0;
  for (int c = 0; c < ci.num_components && c < NVJPEG_MAX_COMPONENT; ++c) {
    out.hSamp[c] = ci.comp_info[c].h_samp_factor;
    out.vSamp[c] = ci.comp_info[c].v_samp_factor;
  }
  if (!pixels) return true;
  if (ci.jpeg_color_space == JCS_CMYK || ci.jpeg_color_space == JCS_YCCK) {
    out.status = NVJPEG_STATUS_JPEG_NOT_SUPPORTED;
    return true;
  }
  ci.out_color_space = JCS_RGB;
  ci.dct_method = JDCT_ISLOW;
  jpeg_start_decompress(&ci);
  out.rgb.resize(static_cast<size_t>(out.height) * out.width * 3);
  while (ci.output_scanline < ci.output_height) {
    JSAMPROW row = out.rgb.data() + static_cast<size_t>(ci.output_scanline) * out.width * 3;
    jpeg_read_scanlines(&ci, &row, 1);
  }
  jpeg_finish_decompress(&ci);
  return true;
}

Decoded decodeHost(const unsigned char* data, size_t length, bool pixels) {
  Decoded out;
  jpeg_decompress_struct ci;
  ErrorManager err;
  ci.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = onError;
  err.pub.emit_message = onMessage;
  if (!run(ci, err, data, length, pixels, out)) out.status = NVJPEG_STATUS_BAD_JPEG;
  jpeg_destroy_decompress(&ci);
  return out;
}

bool knownBackend(nvjpegBackend_t b) { return b >= NVJPEG_BACKEND_DEFAULT && b <= NVJPEG_BACKEND_LOSSLESS_JPEG; }

bool hardwareEmulated() {
  const char* v = std::getenv("RESNET_CUDA_EMU_NVJPEG_HARDWARE");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

bool isHardware(nvjpegHandle_t h) {
  return h->backend == NVJPEG_BACKEND_HARDWARE || h->backend == NVJPEG_BACKEND_HARDWARE_DEVICE;
}

// Checks a destination of `format` for a width x height image.
nvjpegStatus_t checkDestination(const nvjpegImage_t* d, nvjpegOutputFormat_t format, int width, int height) {
  const int planes = format == NVJPEG_OUTPUT_RGB ? 3 : 1;
  const size_t rowBytes = static_cast<size_t>(width) * (format == NVJPEG_OUTPUT_RGB ? 1 : 3);
  for (int p = 0; p < planes; ++p) {
    if (d->channel[p] == nullptr || d->pitch[p] < rowBytes) return NVJPEG_STATUS_INVALID_PARAMETER;
    if (!rc_emu::isDeviceRange(d->channel[p], d->pitch[p] * (height - 1) + rowBytes)) {
      return NVJPEG_STATUS_INVALID_PARAMETER;
    }
  }
  return NVJPEG_STATUS_SUCCESS;
}

// Decodes now and queues the write of the pixels into `d` on `stream`.
nvjpegStatus_t decodeInto(const unsigned char* data, size_t length, nvjpegOutputFormat_t format, const nvjpegImage_t* d,
                          cudaStream_t stream) {
  auto image = std::make_shared<Decoded>(decodeHost(data, length, true));
  if (image->status != NVJPEG_STATUS_SUCCESS) return image->status;
  const nvjpegStatus_t status = checkDestination(d, format, image->width, image->height);
  if (status != NVJPEG_STATUS_SUCCESS) return status;
  const nvjpegImage_t dest = *d;
  const cudaError_t queued = rc_emu::enqueue(
      stream,
      [image, dest, format] {
        const int w = image->width, h = image->height;
        const size_t rowBytes = static_cast<size_t>(w) * (format == NVJPEG_OUTPUT_RGB ? 1 : 3);
        const int planes = format == NVJPEG_OUTPUT_RGB ? 3 : 1;
        for (int p = 0; p < planes; ++p) {
          if (!rc_emu::isDeviceRange(dest.channel[p], dest.pitch[p] * (h - 1) + rowBytes)) {
            rc_emu::deviceFault("nvjpegDecode: the destination is no longer allocated device memory when it runs");
            return;
          }
        }
        for (int y = 0; y < h; ++y) {
          const unsigned char* src = image->rgb.data() + static_cast<size_t>(y) * w * 3;
          if (format == NVJPEG_OUTPUT_RGBI) {
            std::memcpy(dest.channel[0] + static_cast<size_t>(y) * dest.pitch[0], src, rowBytes);
          } else {
            for (int p = 0; p < 3; ++p) {
              unsigned char* row = dest.channel[p] + static_cast<size_t>(y) * dest.pitch[p];
              for (int x = 0; x < w; ++x) row[x] = src[x * 3 + p];
            }
          }
        }
      },
      "nvjpegDecode");
  return queued == cudaSuccess ? NVJPEG_STATUS_SUCCESS : NVJPEG_STATUS_EXECUTION_FAILED;
}

bool emulatedFormat(nvjpegOutputFormat_t f) { return f == NVJPEG_OUTPUT_RGBI || f == NVJPEG_OUTPUT_RGB; }
bool knownFormat(nvjpegOutputFormat_t f) { return f >= NVJPEG_OUTPUT_UNCHANGED && f <= NVJPEG_OUTPUT_FORMAT_MAX; }

}  // namespace

nvjpegStatus_t nvjpegCreateEx(nvjpegBackend_t backend, nvjpegDevAllocator_t* dev_allocator,
                              nvjpegPinnedAllocator_t* pinned_allocator, unsigned int flags, nvjpegHandle_t* handle) {
  if (handle == nullptr || flags != 0 || !knownBackend(backend)) return NVJPEG_STATUS_INVALID_PARAMETER;
  if (dev_allocator != nullptr || pinned_allocator != nullptr) return NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED;
  if ((backend == NVJPEG_BACKEND_HARDWARE || backend == NVJPEG_BACKEND_HARDWARE_DEVICE) && !hardwareEmulated()) {
    return NVJPEG_STATUS_ARCH_MISMATCH;
  }
  if (backend == NVJPEG_BACKEND_LOSSLESS_JPEG) return NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED;
  *handle = new nvjpegHandle{backend};
  return NVJPEG_STATUS_SUCCESS;
}

nvjpegStatus_t nvjpegDestroy(nvjpegHandle_t handle) {
  if (handle == nullptr) return NVJPEG_STATUS_INVALID_PARAMETER;
  delete handle;
  return NVJPEG_STATUS_SUCCESS;
}

nvjpegStatus_t nvjpegJpegStateCreate(nvjpegHandle_t handle, nvjpegJpegState_t* jpeg_handle) {
  if (handle == nullptr || jpeg_handle == nullptr) return NVJPEG_STATUS_INVALID_PARAMETER;
  *jpeg_handle = new nvjpegJpegState{handle, 0, NVJPEG_OUTPUT_RGBI};
  return NVJPEG_STATUS_SUCCESS;
}

nvjpegStatus_t nvjpegJpegStateDestroy(nvjpegJpegState_t jpeg_handle) {
  if (jpeg_handle == nullptr) return NVJPEG_STATUS_INVALID_PARAMETER;
  delete jpeg_handle;
  return NVJPEG_STATUS_SUCCESS;
}

nvjpegStatus_t nvjpegGetImageInfo(nvjpegHandle_t handle, const unsigned char* data, size_t length, int* nComponents,
                                  nvjpegChromaSubsampling_t* subsampling, int* widths, int* heights) {
  if (handle == nullptr || data == nullptr || length == 0 || nComponents == nullptr || subsampling == nullptr ||
      widths == nullptr || heights == nullptr) {
    return NVJPEG_STATUS_INVALID_PARAMETER;
  }
  const Decoded info = decodeHost(data, length, false);
  if (info.status != NVJPEG_STATUS_SUCCESS) return info.status;
  *nComponents = info.components;
  int hMax = 1, vMax = 1;
  for (int c = 0; c < info.components && c < NVJPEG_MAX_COMPONENT; ++c) {
    hMax = info.hSamp[c] > hMax ? info.hSamp[c] : hMax;
    vMax = info.vSamp[c] > vMax ? info.vSamp[c] : vMax;
  }
  for (int c = 0; c < NVJPEG_MAX_COMPONENT; ++c) {
    const bool present = c < info.components;
    widths[c] = present ? (info.width * info.hSamp[c] + hMax - 1) / hMax : 0;
    heights[c] = present ? (info.height * info.vSamp[c] + vMax - 1) / vMax : 0;
  }
  if (info.components == 1) {
    *subsampling = NVJPEG_CSS_GRAY;
  } else if (info.components == 3 && info.hSamp[1] == info.hSamp[2] && info.vSamp[1] == info.vSamp[2] &&
             info.hSamp[1] == 1 && info.vSamp[1] == 1) {
    const int h = info.hSamp[0], v = info.vSamp[0];
    *subsampling = h == 1 && v == 1   ? NVJPEG_CSS_444
                   : h == 2 && v == 1 ? NVJPEG_CSS_422
                   : h == 2 && v == 2 ? NVJPEG_CSS_420
                   : h == 1 && v == 2 ? NVJPEG_CSS_440
                   : h == 4 && v == 1 ? NVJPEG_CSS_411
                   : h == 4 && v == 2 ? NVJPEG_CSS_410
                                      : NVJPEG_CSS_UNKNOWN;
  } else {
    *subsampling = NVJPEG_CSS_UNKNOWN;
  }
  return NVJPEG_STATUS_SUCCESS;
}

nvjpegStatus_t nvjpegDecode(nvjpegHandle_t handle, nvjpegJpegState_t jpeg_handle, const unsigned char* data,
                            size_t length, nvjpegOutputFormat_t output_format, nvjpegImage_t* destination,
                            cudaStream_t stream) {
  if (handle == nullptr || jpeg_handle == nullptr || data == nullptr || length == 0 || destination == nullptr ||
      !knownFormat(output_format)) {
    return NVJPEG_STATUS_INVALID_PARAMETER;
  }
  if (!emulatedFormat(output_format) || isHardware(handle)) return NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED;
  return decodeInto(data, length, output_format, destination, stream);
}

nvjpegStatus_t nvjpegDecodeBatchedInitialize(nvjpegHandle_t handle, nvjpegJpegState_t jpeg_handle, int batch_size,
                                             int max_cpu_threads, nvjpegOutputFormat_t output_format) {
  if (handle == nullptr || jpeg_handle == nullptr || batch_size < 1 || max_cpu_threads < 1 ||
      !knownFormat(output_format)) {
    return NVJPEG_STATUS_INVALID_PARAMETER;
  }
  if (!emulatedFormat(output_format)) return NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED;
  jpeg_handle->handle = handle;
  jpeg_handle->batchSize = batch_size;
  jpeg_handle->batchFormat = output_format;
  return NVJPEG_STATUS_SUCCESS;
}

nvjpegStatus_t nvjpegDecodeBatched(nvjpegHandle_t handle, nvjpegJpegState_t jpeg_handle,
                                   const unsigned char* const* data, const size_t* lengths, nvjpegImage_t* destinations,
                                   cudaStream_t stream) {
  if (handle == nullptr || jpeg_handle == nullptr || data == nullptr || lengths == nullptr || destinations == nullptr) {
    return NVJPEG_STATUS_INVALID_PARAMETER;
  }
  if (jpeg_handle->batchSize == 0 || jpeg_handle->handle != handle) return NVJPEG_STATUS_NOT_INITIALIZED;
  const int n = jpeg_handle->batchSize;
  for (int i = 0; i < n; ++i) {
    if (data[i] == nullptr || lengths[i] == 0) return NVJPEG_STATUS_INVALID_PARAMETER;
    if (isHardware(handle)) {
      // The hardware decoder takes baseline (sequential) JPEGs only.
      const Decoded info = decodeHost(data[i], lengths[i], false);
      if (info.status != NVJPEG_STATUS_SUCCESS) return info.status;
      if (info.progressive) return NVJPEG_STATUS_JPEG_NOT_SUPPORTED;
    }
  }
  for (int i = 0; i < n; ++i) {
    const nvjpegStatus_t status = decodeInto(data[i], lengths[i], jpeg_handle->batchFormat, &destinations[i], stream);
    if (status != NVJPEG_STATUS_SUCCESS) return status;
  }
  return NVJPEG_STATUS_SUCCESS;
}
