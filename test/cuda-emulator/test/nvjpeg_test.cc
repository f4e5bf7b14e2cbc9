// Unit test of the emulated nvJPEG (src/nvjpeg.cc) over the emulated runtime: decoded pixels
// against libjpeg's own decode of the same file (RGBI and planar RGB), the image information, the
// stream ordering of the writes, and the argument checks and status codes nvJPEG documents (and
// the emulator's additions). test/data-gpu-decode.test.ts runs it; it prints
// "nvjpeg: N passed, M failed". The JPEG is written here with libjpeg (no files needed).
#include <cuda_runtime.h>
#include <nvjpeg.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// After <cstdio>: libjpeg's header needs FILE.
#include <jpeglib.h>

#include "check.h"

namespace {

using rc_emu_test::check;

// A w x h RGB image of gradients, encoded (4:2:0 unless `progressive` picks progressive mode).
std::vector<unsigned char> encode(int w, int h, bool progressive, std::vector<unsigned char>* pixels) {
  pixels->resize(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      unsigned char* p = pixels->data() + (static_cast<size_t>(y) * w + x) * 3;
      p[0] = static_cast<unsigned char>(255 * x / w);
      p[1] = static_cast<unsigned char>(255 * y / h);
      p[2] = static_cast<unsigned char>((x * 7 + y * 13) % 256);
    }
  }
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* out = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &out, &size);
  c.image_width = static_cast<JDIMENSION>(w);
  c.image_height = static_cast<JDIMENSION>(h);
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, 90, TRUE);
  if (progressive) jpeg_simple_progression(&c);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = pixels->data() + static_cast<size_t>(c.next_scanline) * w * 3;
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  std::vector<unsigned char> bytes(out, out + size);
  jpeg_destroy_compress(&c);
  std::free(out);
  return bytes;
}

// libjpeg's decode to RGB (islow IDCT), the reference of the emulated nvJPEG.
std::vector<unsigned char> reference(const std::vector<unsigned char>& bytes) {
  jpeg_decompress_struct d;
  jpeg_error_mgr err;
  d.err = jpeg_std_error(&err);
  jpeg_create_decompress(&d);
  jpeg_mem_src(&d, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&d, TRUE);
  d.out_color_space = JCS_RGB;
  d.dct_method = JDCT_ISLOW;
  jpeg_start_decompress(&d);
  std::vector<unsigned char> rgb(static_cast<size_t>(d.output_width) * d.output_height * 3);
  while (d.output_scanline < d.output_height) {
    JSAMPROW row = rgb.data() + static_cast<size_t>(d.output_scanline) * d.output_width * 3;
    jpeg_read_scanlines(&d, &row, 1);
  }
  jpeg_finish_decompress(&d);
  jpeg_destroy_decompress(&d);
  return rgb;
}

}  // namespace

int main() {
  constexpr int W = 37, H = 29;
  std::vector<unsigned char> pixels;
  const std::vector<unsigned char> jpeg = encode(W, H, false, &pixels);
  const std::vector<unsigned char> progressive = encode(W, H, true, &pixels);
  const std::vector<unsigned char> expected = reference(jpeg);

  // Handles.
  nvjpegHandle_t handle = nullptr;
  check(nvjpegCreateEx(NVJPEG_BACKEND_DEFAULT, nullptr, nullptr, 0, nullptr) == NVJPEG_STATUS_INVALID_PARAMETER,
        "create: a null handle pointer is an invalid parameter");
  check(nvjpegCreateEx(NVJPEG_BACKEND_DEFAULT, nullptr, nullptr, 1, &handle) == NVJPEG_STATUS_INVALID_PARAMETER,
        "create: flags must be 0");
  check(
      nvjpegCreateEx(static_cast<nvjpegBackend_t>(42), nullptr, nullptr, 0, &handle) == NVJPEG_STATUS_INVALID_PARAMETER,
      "create: an unknown backend is an invalid parameter");
  if (std::getenv("RESNET_CUDA_EMU_NVJPEG_HARDWARE") == nullptr) {
    nvjpegHandle_t hw = nullptr;
    check(nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE, nullptr, nullptr, 0, &hw) == NVJPEG_STATUS_ARCH_MISMATCH,
          "create: no hardware decoder on the emulated device");
  }
  check(nvjpegCreateEx(NVJPEG_BACKEND_HYBRID, nullptr, nullptr, 0, &handle) == NVJPEG_STATUS_SUCCESS, "create hybrid");
  nvjpegJpegState_t state = nullptr;
  check(nvjpegJpegStateCreate(nullptr, &state) == NVJPEG_STATUS_INVALID_PARAMETER, "state: a null handle");
  check(nvjpegJpegStateCreate(handle, &state) == NVJPEG_STATUS_SUCCESS, "state create");

  // Image information.
  int components = 0, widths[NVJPEG_MAX_COMPONENT], heights[NVJPEG_MAX_COMPONENT];
  nvjpegChromaSubsampling_t css{};
  check(nvjpegGetImageInfo(handle, jpeg.data(), jpeg.size(), &components, &css, widths, heights) ==
                NVJPEG_STATUS_SUCCESS &&
            components == 3 && css == NVJPEG_CSS_420 && widths[0] == W && heights[0] == H && widths[1] == (W + 1) / 2 &&
            heights[1] == (H + 1) / 2 && widths[3] == 0,
        "image info: 3 components, 4:2:0, the luma and chroma sizes");
  check(
      nvjpegGetImageInfo(handle, jpeg.data(), 0, &components, &css, widths, heights) == NVJPEG_STATUS_INVALID_PARAMETER,
      "image info: a zero length");
  check(nvjpegGetImageInfo(handle, jpeg.data(), jpeg.size(), nullptr, &css, widths, heights) ==
            NVJPEG_STATUS_INVALID_PARAMETER,
        "image info: a null output");
  const unsigned char garbage[] = {0xff, 0xd8, 0x00, 0x01, 0x02, 0x03};
  check(
      nvjpegGetImageInfo(handle, garbage, sizeof garbage, &components, &css, widths, heights) == NVJPEG_STATUS_BAD_JPEG,
      "image info: not a JPEG is a bad JPEG");

  // Decoding to interleaved RGB: written when the stream runs, equal to libjpeg's decode.
  cudaStream_t stream = nullptr;
  cudaStreamCreate(&stream);
  unsigned char* device = nullptr;
  const size_t pitch = W * 3 + 5;
  cudaMalloc(reinterpret_cast<void**>(&device), pitch * H);
  nvjpegImage_t out{};
  out.channel[0] = device;
  out.pitch[0] = pitch;
  check(
      nvjpegDecode(handle, state, jpeg.data(), jpeg.size(), NVJPEG_OUTPUT_RGBI, &out, stream) == NVJPEG_STATUS_SUCCESS,
      "decode RGBI");
  cudaStreamSynchronize(stream);
  std::vector<unsigned char> host(pitch * H);
  cudaMemcpy(host.data(), device, host.size(), cudaMemcpyDeviceToHost);
  bool same = true;
  for (int y = 0; y < H; ++y) same = same && std::memcmp(&host[y * pitch], &expected[y * W * 3], W * 3) == 0;
  check(same, "decode RGBI: libjpeg's pixels, rows `pitch` apart");

  // Planar RGB.
  unsigned char* planes = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&planes), 3 * W * H);
  nvjpegImage_t planar{};
  for (int p = 0; p < 3; ++p) {
    planar.channel[p] = planes + p * W * H;
    planar.pitch[p] = W;
  }
  check(nvjpegDecode(handle, state, jpeg.data(), jpeg.size(), NVJPEG_OUTPUT_RGB, &planar, stream) ==
            NVJPEG_STATUS_SUCCESS,
        "decode planar RGB");
  std::vector<unsigned char> hostPlanes(3 * W * H);
  cudaMemcpy(hostPlanes.data(), planes, hostPlanes.size(), cudaMemcpyDeviceToHost);
  bool planarSame = true;
  for (int i = 0; i < W * H; ++i) {
    for (int p = 0; p < 3; ++p) planarSame = planarSame && hostPlanes[p * W * H + i] == expected[i * 3 + p];
  }
  check(planarSame, "decode planar RGB: libjpeg's pixels, one plane per channel");

  // Argument checks of the decode.
  nvjpegImage_t small = out;
  small.pitch[0] = W * 3 - 1;
  check(nvjpegDecode(handle, state, jpeg.data(), jpeg.size(), NVJPEG_OUTPUT_RGBI, &small, stream) ==
            NVJPEG_STATUS_INVALID_PARAMETER,
        "decode: a pitch below the row's bytes");
  nvjpegImage_t hostOut{};
  hostOut.channel[0] = host.data();
  hostOut.pitch[0] = pitch;
  check(nvjpegDecode(handle, state, jpeg.data(), jpeg.size(), NVJPEG_OUTPUT_RGBI, &hostOut, stream) ==
            NVJPEG_STATUS_INVALID_PARAMETER,
        "decode: a destination that is not device memory");
  check(nvjpegDecode(handle, state, jpeg.data(), jpeg.size(), NVJPEG_OUTPUT_NV12, &out, stream) ==
            NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED,
        "decode: an output format the emulator does not implement");
  check(nvjpegDecode(handle, state, jpeg.data(), jpeg.size(), static_cast<nvjpegOutputFormat_t>(99), &out, stream) ==
            NVJPEG_STATUS_INVALID_PARAMETER,
        "decode: an unknown output format");
  check(nvjpegDecode(handle, nullptr, jpeg.data(), jpeg.size(), NVJPEG_OUTPUT_RGBI, &out, stream) ==
            NVJPEG_STATUS_INVALID_PARAMETER,
        "decode: a null state");
  std::vector<unsigned char> truncated(jpeg.begin(), jpeg.begin() + static_cast<long>(jpeg.size() / 2));
  check(nvjpegDecode(handle, state, truncated.data(), truncated.size(), NVJPEG_OUTPUT_RGBI, &out, stream) ==
            NVJPEG_STATUS_BAD_JPEG,
        "decode: a truncated JPEG is a bad JPEG");

  // Batched decoding.
  const unsigned char* data[2] = {jpeg.data(), progressive.data()};
  const size_t lengths[2] = {jpeg.size(), progressive.size()};
  unsigned char* two = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&two), 2 * W * H * 3);
  nvjpegImage_t outs[2] = {};
  for (int i = 0; i < 2; ++i) {
    outs[i].channel[0] = two + i * W * H * 3;
    outs[i].pitch[0] = W * 3;
  }
  nvjpegJpegState_t batchState = nullptr;
  nvjpegJpegStateCreate(handle, &batchState);
  check(nvjpegDecodeBatched(handle, batchState, data, lengths, outs, stream) == NVJPEG_STATUS_NOT_INITIALIZED,
        "batched: before nvjpegDecodeBatchedInitialize");
  check(nvjpegDecodeBatchedInitialize(handle, batchState, 0, 1, NVJPEG_OUTPUT_RGBI) == NVJPEG_STATUS_INVALID_PARAMETER,
        "batched: a batch size below 1");
  check(nvjpegDecodeBatchedInitialize(handle, batchState, 2, 1, NVJPEG_OUTPUT_RGBI) == NVJPEG_STATUS_SUCCESS,
        "batched: initialise");
  check(nvjpegDecodeBatched(handle, batchState, data, lengths, outs, stream) == NVJPEG_STATUS_SUCCESS,
        "batched: decode a baseline and a progressive JPEG on the hybrid decoder");
  std::vector<unsigned char> both(2 * W * H * 3);
  cudaMemcpy(both.data(), two, both.size(), cudaMemcpyDeviceToHost);
  check(std::memcmp(both.data(), expected.data(), W * H * 3) == 0 &&
            std::memcmp(both.data() + W * H * 3, reference(progressive).data(), W * H * 3) == 0,
        "batched: each image is libjpeg's decode");

  // The hardware decoder, when emulated: batches of baseline JPEGs only.
  setenv("RESNET_CUDA_EMU_NVJPEG_HARDWARE", "1", 1);
  nvjpegHandle_t hw = nullptr;
  check(nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE, nullptr, nullptr, 0, &hw) == NVJPEG_STATUS_SUCCESS,
        "hardware: created when emulated");
  nvjpegJpegState_t hwState = nullptr;
  nvjpegJpegStateCreate(hw, &hwState);
  check(nvjpegDecode(hw, hwState, jpeg.data(), jpeg.size(), NVJPEG_OUTPUT_RGBI, &out, stream) ==
            NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED,
        "hardware: no single-image decode");
  nvjpegDecodeBatchedInitialize(hw, hwState, 2, 1, NVJPEG_OUTPUT_RGBI);
  check(nvjpegDecodeBatched(hw, hwState, data, lengths, outs, stream) == NVJPEG_STATUS_JPEG_NOT_SUPPORTED,
        "hardware: a progressive JPEG in the batch is not supported");
  check(nvjpegDecodeBatched(handle, hwState, data, lengths, outs, stream) == NVJPEG_STATUS_NOT_INITIALIZED,
        "batched: a state initialised for another handle");

  cudaStreamSynchronize(stream);
  check(nvjpegJpegStateDestroy(hwState) == NVJPEG_STATUS_SUCCESS && nvjpegDestroy(hw) == NVJPEG_STATUS_SUCCESS,
        "hardware: destroy");
  check(nvjpegJpegStateDestroy(batchState) == NVJPEG_STATUS_SUCCESS &&
            nvjpegJpegStateDestroy(state) == NVJPEG_STATUS_SUCCESS && nvjpegDestroy(handle) == NVJPEG_STATUS_SUCCESS,
        "destroy");
  check(nvjpegDestroy(nullptr) == NVJPEG_STATUS_INVALID_PARAMETER, "destroy: a null handle");
  cudaFree(device);
  cudaFree(planes);
  cudaFree(two);
  cudaStreamDestroy(stream);
  return rc_emu_test::finish("nvjpeg");
}
