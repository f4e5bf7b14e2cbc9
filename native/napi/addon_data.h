#pragma once

#include <napi.h>

namespace rc::napi {

struct AddonData {
  Napi::FunctionReference tensorConstructor;
  Napi::FunctionReference tcpStoreConstructor;
};

inline AddonData& addonData(Napi::Env env) { return *env.GetInstanceData<AddonData>(); }

}  // namespace rc::napi
