// nvJPEG as the emulator provides it: handles, decode states, image information, single-image and
// batched decoding, with the types, enumerators and numeric values of the nvJPEG 13 header.
//
// The emulator's behaviour (src/nvjpeg.cc):
// - The JPEG is decoded on the host with libjpeg (JDCT_ISLOW, fancy upsampling; grey replicated to
//   RGB) when the decode is called, as nvJPEG's hybrid backend does its Huffman decoding on the host:
//   a broken or truncated JPEG returns NVJPEG_STATUS_BAD_JPEG (libjpeg's error) at the call, a CMYK or
//   YCCK one NVJPEG_STATUS_JPEG_NOT_SUPPORTED. The pixels are written into the destination when the
//   stream runs (rc_emu::enqueue), which must then still be device memory.
// - Arguments are checked as documented: NVJPEG_STATUS_INVALID_PARAMETER for null handles, states,
//   data, outputs or destinations, a zero length, flags other than 0, an unknown backend or output
//   format, a batch size below 1, a pitch below the row's bytes; beyond nvJPEG, also for a
//   destination that is not device memory covering pitch x height bytes (the device would fault).
//   nvjpegDecodeBatched before nvjpegDecodeBatchedInitialize (or with a state of another handle)
//   returns NVJPEG_STATUS_NOT_INITIALIZED.
// - Output formats: NVJPEG_OUTPUT_RGBI and NVJPEG_OUTPUT_RGB (planar); the others return
//   NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED. Custom allocators are not emulated (the same).
// - NVJPEG_BACKEND_HARDWARE returns NVJPEG_STATUS_ARCH_MISMATCH (no hardware decoder), unless
//   RESNET_CUDA_EMU_NVJPEG_HARDWARE=1 emulates one; it then decodes only batches (nvjpegDecode
//   returns NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED) of baseline JPEGs (a progressive one makes
//   the batch return NVJPEG_STATUS_JPEG_NOT_SUPPORTED), as the A100/H100 decoder.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

// The backend binds these functions directly instead of looking them up in libnvjpeg.so.13.
#define RC_EMULATED_NVJPEG 1

#define NVJPEG_MAX_COMPONENT 4
#define NVJPEG_VER_MAJOR 13
#define NVJPEG_VER_MINOR 0

typedef enum {
  NVJPEG_STATUS_SUCCESS = 0,
  NVJPEG_STATUS_NOT_INITIALIZED = 1,
  NVJPEG_STATUS_INVALID_PARAMETER = 2,
  NVJPEG_STATUS_BAD_JPEG = 3,
  NVJPEG_STATUS_JPEG_NOT_SUPPORTED = 4,
  NVJPEG_STATUS_ALLOCATOR_FAILURE = 5,
  NVJPEG_STATUS_EXECUTION_FAILED = 6,
  NVJPEG_STATUS_ARCH_MISMATCH = 7,
  NVJPEG_STATUS_INTERNAL_ERROR = 8,
  NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED = 9,
  NVJPEG_STATUS_INCOMPLETE_BITSTREAM = 10
} nvjpegStatus_t;

typedef enum {
  NVJPEG_CSS_444 = 0,
  NVJPEG_CSS_422 = 1,
  NVJPEG_CSS_420 = 2,
  NVJPEG_CSS_440 = 3,
  NVJPEG_CSS_411 = 4,
  NVJPEG_CSS_410 = 5,
  NVJPEG_CSS_GRAY = 6,
  NVJPEG_CSS_410V = 7,
  NVJPEG_CSS_UNKNOWN = -1
} nvjpegChromaSubsampling_t;

typedef enum {
  NVJPEG_OUTPUT_UNCHANGED = 0,
  NVJPEG_OUTPUT_YUV = 1,
  NVJPEG_OUTPUT_Y = 2,
  NVJPEG_OUTPUT_RGB = 3,
  NVJPEG_OUTPUT_BGR = 4,
  NVJPEG_OUTPUT_RGBI = 5,
  NVJPEG_OUTPUT_BGRI = 6,
  NVJPEG_OUTPUT_UNCHANGEDI_U16 = 7,
  NVJPEG_OUTPUT_NV12 = 8,
  NVJPEG_OUTPUT_YUY2 = 9,
  NVJPEG_OUTPUT_FORMAT_MAX = 9
} nvjpegOutputFormat_t;

typedef enum {
  NVJPEG_BACKEND_DEFAULT = 0,
  NVJPEG_BACKEND_HYBRID = 1,
  NVJPEG_BACKEND_GPU_HYBRID = 2,
  NVJPEG_BACKEND_HARDWARE = 3,
  NVJPEG_BACKEND_GPU_HYBRID_DEVICE = 4,
  NVJPEG_BACKEND_HARDWARE_DEVICE = 5,
  NVJPEG_BACKEND_LOSSLESS_JPEG = 6
} nvjpegBackend_t;

typedef struct {
  unsigned char* channel[NVJPEG_MAX_COMPONENT];
  size_t pitch[NVJPEG_MAX_COMPONENT];
} nvjpegImage_t;

typedef int (*tDevMalloc)(void**, size_t);
typedef int (*tDevFree)(void*);
typedef int (*tPinnedMalloc)(void**, size_t, unsigned int flags);
typedef int (*tPinnedFree)(void*);
typedef struct {
  tDevMalloc dev_malloc;
  tDevFree dev_free;
} nvjpegDevAllocator_t;
typedef struct {
  tPinnedMalloc pinned_malloc;
  tPinnedFree pinned_free;
} nvjpegPinnedAllocator_t;

typedef struct nvjpegHandle* nvjpegHandle_t;
typedef struct nvjpegJpegState* nvjpegJpegState_t;

nvjpegStatus_t nvjpegCreateEx(nvjpegBackend_t backend, nvjpegDevAllocator_t* dev_allocator,
                              nvjpegPinnedAllocator_t* pinned_allocator, unsigned int flags, nvjpegHandle_t* handle);
nvjpegStatus_t nvjpegDestroy(nvjpegHandle_t handle);
nvjpegStatus_t nvjpegJpegStateCreate(nvjpegHandle_t handle, nvjpegJpegState_t* jpeg_handle);
nvjpegStatus_t nvjpegJpegStateDestroy(nvjpegJpegState_t jpeg_handle);
nvjpegStatus_t nvjpegGetImageInfo(nvjpegHandle_t handle, const unsigned char* data, size_t length, int* nComponents,
                                  nvjpegChromaSubsampling_t* subsampling, int* widths, int* heights);
nvjpegStatus_t nvjpegDecode(nvjpegHandle_t handle, nvjpegJpegState_t jpeg_handle, const unsigned char* data,
                            size_t length, nvjpegOutputFormat_t output_format, nvjpegImage_t* destination,
                            cudaStream_t stream);
nvjpegStatus_t nvjpegDecodeBatchedInitialize(nvjpegHandle_t handle, nvjpegJpegState_t jpeg_handle, int batch_size,
                                             int max_cpu_threads, nvjpegOutputFormat_t output_format);
nvjpegStatus_t nvjpegDecodeBatched(nvjpegHandle_t handle, nvjpegJpegState_t jpeg_handle,
                                   const unsigned char* const* data, const size_t* lengths, nvjpegImage_t* destinations,
                                   cudaStream_t stream);
