// Registers the image functions (jpegHeader, jpegDecode, imageResample) and libjpegTurboVersion on
// the addon's exports.
#pragma once

#include <napi.h>

namespace rc::napi {

void RegisterImage(Napi::Env env, Napi::Object exports);

}  // namespace rc::napi
