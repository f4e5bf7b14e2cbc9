// The JavaScript class of the inference plan (native/core/inference_plan.h).
#pragma once

#include <napi.h>

#include <memory>

#include "../core/backend.h"

namespace rc::napi {

class InferencePlanWrap : public Napi::ObjectWrap<InferencePlanWrap> {
 public:
  static Napi::Function Init(Napi::Env env);
  explicit InferencePlanWrap(const Napi::CallbackInfo& info);

 private:
  Napi::Value Run(const Napi::CallbackInfo& info);
  Napi::Value Implementation(const Napi::CallbackInfo& info);
  Napi::Value Dispose(const Napi::CallbackInfo& info);
  std::unique_ptr<InferencePlan> plan_;
};

}  // namespace rc::napi
