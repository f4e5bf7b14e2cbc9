// The JavaScript-visible native tensor: owns a reference to device storage until dispose().
#pragma once

#include <napi.h>

#include "../core/tensor.h"

namespace rc::napi {

class TensorWrap : public Napi::ObjectWrap<TensorWrap> {
 public:
  static Napi::Function Init(Napi::Env env);
  static Napi::Object Wrap(Napi::Env env, Tensor tensor);
  static bool IsTensor(const Napi::Value& value);

  explicit TensorWrap(const Napi::CallbackInfo& info);
  // The live tensor; throws ERR_RC_DISPOSED after dispose().
  const Tensor& tensor(const char* what) const;

 private:
  Napi::Value Shape(const Napi::CallbackInfo& info);
  Napi::Value DTypeName(const Napi::CallbackInfo& info);
  Napi::Value DeviceName(const Napi::CallbackInfo& info);
  Napi::Value Nbytes(const Napi::CallbackInfo& info);
  Napi::Value Disposed(const Napi::CallbackInfo& info);
  Napi::Value View(const Napi::CallbackInfo& info);
  Napi::Value Reshape(const Napi::CallbackInfo& info);
  Napi::Value CopyFromHost(const Napi::CallbackInfo& info);
  Napi::Value CopyToHost(const Napi::CallbackInfo& info);
  Napi::Value CopyFrom(const Napi::CallbackInfo& info);
  Napi::Value SharesStorage(const Napi::CallbackInfo& info);
  Napi::Value Dispose(const Napi::CallbackInfo& info);

  Tensor tensor_;
  bool disposed_ = false;
};

}  // namespace rc::napi
