// The nvJPEG entry points the device JPEG decoder uses, bound at run time: nvJPEG is optional (the
// backend loads without it, and only decoding on the device needs it), so the backend does not
// link it but looks its functions up in libnvjpeg.so.13, which the addon preloads when it finds it.
#pragma once

#include <nvjpeg.h>

#include <string>

namespace rc::cuda {

struct NvjpegApi {
  decltype(&nvjpegCreateEx) createEx = nullptr;
  decltype(&nvjpegDestroy) destroy = nullptr;
  decltype(&nvjpegJpegStateCreate) stateCreate = nullptr;
  decltype(&nvjpegJpegStateDestroy) stateDestroy = nullptr;
  decltype(&nvjpegGetImageInfo) getImageInfo = nullptr;
  decltype(&nvjpegDecode) decode = nullptr;
  decltype(&nvjpegDecodeBatchedInitialize) batchedInitialize = nullptr;
  decltype(&nvjpegDecodeBatched) decodeBatched = nullptr;
};

// The bound functions; throws rc::Error ERR_RC_BACKEND_UNAVAILABLE saying what is missing and how
// to install it when libnvjpeg.so.13 cannot be opened or lacks one of them.
const NvjpegApi& nvjpeg();

// nvJPEG's name for a status ("NVJPEG_STATUS_BAD_JPEG").
std::string nvjpegStatusName(nvjpegStatus_t status);

}  // namespace rc::cuda
