#include "convert.h"

#include "../core/error.h"
#include "tensor_wrap.h"

namespace rc::napi {

namespace {
std::string typeName(const Napi::Value& v) {
  if (v.IsUndefined()) return "undefined";
  if (v.IsNull()) return "null";
  if (v.IsNumber()) return "number " + std::to_string(v.As<Napi::Number>().DoubleValue());
  if (v.IsString()) return "string '" + v.As<Napi::String>().Utf8Value() + "'";
  if (v.IsBoolean()) return "boolean";
  if (v.IsArray()) return "array";
  if (v.IsTypedArray()) return "typed array";
  if (v.IsFunction()) return "function";
  return "object";
}

Napi::Value required(const Napi::Object& o, const char* key) {
  Napi::Value v = o.Get(key);
  RC_CHECK_ARG(!v.IsUndefined() && !v.IsNull(), "option '" << key << "' is required");
  return v;
}
}  // namespace

[[noreturn]] void rethrow(Napi::Env env) {
  try {
    throw;
  } catch (const Error& e) {
    Napi::Error err = Napi::Error::New(env, e.what());
    err.Set("code", Napi::String::New(env, e.code()));
    throw err;
  } catch (const std::bad_alloc&) {
    Napi::Error err = Napi::Error::New(env, "out of host memory");
    err.Set("code", Napi::String::New(env, code::kOutOfMemory));
    throw err;
  } catch (const std::exception& e) {
    Napi::Error err = Napi::Error::New(env, e.what());
    err.Set("code", Napi::String::New(env, code::kInternal));
    throw err;
  }
}

Napi::Object optionsArg(const Napi::CallbackInfo& info, const char* fn) {
  RC_CHECK_ARG(info.Length() >= 1 && info[0].IsObject() && !info[0].IsArray(),
               fn << ": expected one options object, got " << (info.Length() ? typeName(info[0]) : "nothing"));
  return info[0].As<Napi::Object>();
}

bool has(const Napi::Object& o, const char* key) {
  Napi::Value v = o.Get(key);
  return !v.IsUndefined() && !v.IsNull();
}

int64_t getInt(const Napi::Object& o, const char* key) {
  Napi::Value v = required(o, key);
  RC_CHECK_ARG(v.IsNumber(), "option '" << key << "' must be an integer, got " << typeName(v));
  const double d = v.As<Napi::Number>().DoubleValue();
  RC_CHECK_ARG(d == static_cast<double>(static_cast<int64_t>(d)),
               "option '" << key << "' must be an integer, got " << d);
  return static_cast<int64_t>(d);
}

int64_t getInt(const Napi::Object& o, const char* key, int64_t fallback) {
  return has(o, key) ? getInt(o, key) : fallback;
}

double getNumber(const Napi::Object& o, const char* key) {
  Napi::Value v = required(o, key);
  RC_CHECK_ARG(v.IsNumber(), "option '" << key << "' must be a number, got " << typeName(v));
  return v.As<Napi::Number>().DoubleValue();
}

double getNumber(const Napi::Object& o, const char* key, double fallback) {
  return has(o, key) ? getNumber(o, key) : fallback;
}

bool getBool(const Napi::Object& o, const char* key, bool fallback) {
  if (!has(o, key)) return fallback;
  Napi::Value v = o.Get(key);
  RC_CHECK_ARG(v.IsBoolean(), "option '" << key << "' must be a boolean, got " << typeName(v));
  return v.As<Napi::Boolean>().Value();
}

std::string getString(const Napi::Object& o, const char* key) {
  Napi::Value v = required(o, key);
  RC_CHECK_ARG(v.IsString(), "option '" << key << "' must be a string, got " << typeName(v));
  return v.As<Napi::String>().Utf8Value();
}

DType getDType(const Napi::Object& o, const char* key) {
  const std::string name = getString(o, key);
  DType t;
  RC_CHECK_ARG(parseDType(name, &t),
               "option '" << key << "' must be one of f32, bf16, f16, i32, i64, u8; got '" << name << "'");
  return t;
}

Device getDevice(const Napi::Object& o, const char* key) { return parseDevice(getString(o, key)); }

Shape getShape(const Napi::Object& o, const char* key) {
  Napi::Value v = required(o, key);
  RC_CHECK_ARG(v.IsArray(), "option '" << key << "' must be an array of dimensions, got " << typeName(v));
  Napi::Array arr = v.As<Napi::Array>();
  Shape shape;
  for (uint32_t i = 0; i < arr.Length(); ++i) {
    Napi::Value d = arr.Get(i);
    RC_CHECK_ARG(d.IsNumber(), "option '" << key << "'[" << i << "] must be a number, got " << typeName(d));
    const double value = d.As<Napi::Number>().DoubleValue();
    RC_CHECK_ARG(value >= 0 && value == static_cast<double>(static_cast<int64_t>(value)),
                 "option '" << key << "'[" << i << "] must be a non-negative integer, got " << value);
    shape.push_back(static_cast<int64_t>(value));
  }
  return shape;
}

std::vector<float> getFloats(const Napi::Object& o, const char* key) {
  Napi::Value v = required(o, key);
  RC_CHECK_ARG(v.IsArray(), "option '" << key << "' must be an array of numbers, got " << typeName(v));
  Napi::Array arr = v.As<Napi::Array>();
  std::vector<float> out;
  for (uint32_t i = 0; i < arr.Length(); ++i) {
    Napi::Value d = arr.Get(i);
    RC_CHECK_ARG(d.IsNumber(), "option '" << key << "'[" << i << "] must be a number, got " << typeName(d));
    out.push_back(static_cast<float>(d.As<Napi::Number>().DoubleValue()));
  }
  return out;
}

std::vector<float> getFloat32Array(const Napi::Object& o, const char* key, bool isRequired) {
  if (!isRequired && !has(o, key)) return {};
  Napi::Value v = required(o, key);
  RC_CHECK_ARG(v.IsTypedArray() && v.As<Napi::TypedArray>().TypedArrayType() == napi_float32_array,
               "option '" << key << "' must be a Float32Array, got " << typeName(v));
  Napi::Float32Array a = v.As<Napi::Float32Array>();
  return std::vector<float>(a.Data(), a.Data() + a.ElementLength());
}

Tensor getTensor(const Napi::Object& o, const char* key, bool isRequired) {
  if (!isRequired && !has(o, key)) return Tensor();
  Napi::Value v = required(o, key);
  RC_CHECK_ARG(TensorWrap::IsTensor(v), "option '" << key << "' must be a native tensor, got " << typeName(v));
  return TensorWrap::Unwrap(v.As<Napi::Object>())->tensor(key);
}

Napi::Array shapeToJs(Napi::Env env, const Shape& shape) {
  Napi::Array arr = Napi::Array::New(env, shape.size());
  for (size_t i = 0; i < shape.size(); ++i)
    arr.Set(static_cast<uint32_t>(i), Napi::Number::New(env, static_cast<double>(shape[i])));
  return arr;
}

}  // namespace rc::napi
