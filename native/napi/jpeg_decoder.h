// The JavaScript class of the device JPEG decoder (core/backend.h JpegDecoder).
#pragma once

#include <napi.h>

#include <memory>

#include "../core/backend.h"

namespace rc::napi {

class JpegDecoderWrap : public Napi::ObjectWrap<JpegDecoderWrap> {
 public:
  static Napi::Function Init(Napi::Env env);
  explicit JpegDecoderWrap(const Napi::CallbackInfo& info);

 private:
  Napi::Value Decode(const Napi::CallbackInfo& info);
  Napi::Value Join(const Napi::CallbackInfo& info);
  Napi::Value Synchronize(const Napi::CallbackInfo& info);
  Napi::Value Implementation(const Napi::CallbackInfo& info);
  Napi::Value Dispose(const Napi::CallbackInfo& info);
  JpegDecoder& live();
  std::unique_ptr<JpegDecoder> decoder_;
};

}  // namespace rc::napi
