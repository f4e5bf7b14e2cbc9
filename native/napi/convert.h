// Conversions between JavaScript option objects and native structs, with messages that name the
// option, what was expected and what was received.
#pragma once

#include <napi.h>

#include <string>
#include <vector>

#include "../core/backend.h"

namespace rc::napi {

// Throws the JavaScript error for the exception in flight (rc::Error keeps its code).
[[noreturn]] void rethrow(Napi::Env env);

// Runs body, translating native exceptions to JavaScript errors.
template <typename F>
auto guarded(Napi::Env env, F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const Napi::Error&) {
    throw;
  } catch (...) {
    rethrow(env);
  }
}

Napi::Object optionsArg(const Napi::CallbackInfo& info, const char* fn);
bool has(const Napi::Object& o, const char* key);
int64_t getInt(const Napi::Object& o, const char* key);
int64_t getInt(const Napi::Object& o, const char* key, int64_t fallback);
double getNumber(const Napi::Object& o, const char* key);
double getNumber(const Napi::Object& o, const char* key, double fallback);
bool getBool(const Napi::Object& o, const char* key, bool fallback);
std::string getString(const Napi::Object& o, const char* key);
DType getDType(const Napi::Object& o, const char* key);
Device getDevice(const Napi::Object& o, const char* key);
Shape getShape(const Napi::Object& o, const char* key);
std::vector<float> getFloats(const Napi::Object& o, const char* key);
// A Float32Array option, copied; `required` false returns an empty vector when the key is absent/null.
std::vector<float> getFloat32Array(const Napi::Object& o, const char* key, bool required = true);
// A tensor argument; `required` false returns an undefined Tensor when the key is absent/null.
Tensor getTensor(const Napi::Object& o, const char* key, bool required = true);
Napi::Array shapeToJs(Napi::Env env, const Shape& shape);

}  // namespace rc::napi
