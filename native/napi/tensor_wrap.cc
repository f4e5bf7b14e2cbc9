#include "tensor_wrap.h"

#include "../core/error.h"
#include "addon_data.h"
#include "convert.h"
#include "registry.h"

namespace rc::napi {

Napi::Function TensorWrap::Init(Napi::Env env) {
  return DefineClass(env, "NativeTensor",
                     {
                         InstanceAccessor<&TensorWrap::Shape>("shape"),
                         InstanceAccessor<&TensorWrap::DTypeName>("dtype"),
                         InstanceAccessor<&TensorWrap::DeviceName>("device"),
                         InstanceAccessor<&TensorWrap::Nbytes>("nbytes"),
                         InstanceAccessor<&TensorWrap::Disposed>("disposed"),
                         InstanceMethod<&TensorWrap::View>("view"),
                         InstanceMethod<&TensorWrap::Reshape>("reshape"),
                         InstanceMethod<&TensorWrap::CopyFromHost>("copyFromHost"),
                         InstanceMethod<&TensorWrap::CopyToHost>("copyToHost"),
                         InstanceMethod<&TensorWrap::CopyFrom>("copyFrom"),
                         InstanceMethod<&TensorWrap::SharesStorage>("sharesStorage"),
                         InstanceMethod<&TensorWrap::Dispose>("dispose"),
                     });
}

Napi::Object TensorWrap::Wrap(Napi::Env env, Tensor tensor) {
  auto* holder = new Tensor(std::move(tensor));
  Napi::External<Tensor> ext = Napi::External<Tensor>::New(env, holder);
  Napi::Object obj = addonData(env).tensorConstructor.New({ext});
  delete holder;
  return obj;
}

bool TensorWrap::IsTensor(const Napi::Value& value) {
  if (!value.IsObject()) return false;
  return value.As<Napi::Object>().InstanceOf(addonData(value.Env()).tensorConstructor.Value());
}

// new NativeTensor({ shape, dtype, device }) allocates uninitialised memory on the device.
TensorWrap::TensorWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<TensorWrap>(info) {
  guarded(info.Env(), [&] {
    if (info.Length() == 1 && info[0].IsExternal()) {
      tensor_ = *info[0].As<Napi::External<Tensor>>().Data();
      return;
    }
    Napi::Object o = optionsArg(info, "NativeTensor");
    const rc::Shape shape = getShape(o, "shape");
    const DType dtype = getDType(o, "dtype");
    const Device device = getDevice(o, "device");
    tensor_ = backendFor(device).empty(shape, dtype);
  });
}

const Tensor& TensorWrap::tensor(const char* what) const {
  if (disposed_) RC_THROW(code::kDisposed, "tensor '" << what << "' was disposed and cannot be used");
  return tensor_;
}

Napi::Value TensorWrap::Shape(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] { return Napi::Value(shapeToJs(info.Env(), tensor("this").shape())); });
}

Napi::Value TensorWrap::DTypeName(const Napi::CallbackInfo& info) {
  return Napi::String::New(info.Env(), dtypeName(tensor_.dtype()));
}

Napi::Value TensorWrap::DeviceName(const Napi::CallbackInfo& info) {
  return Napi::String::New(info.Env(), disposed_ ? "disposed" : tensor_.device().str());
}

Napi::Value TensorWrap::Nbytes(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), disposed_ ? 0.0 : static_cast<double>(tensor_.nbytes()));
}

Napi::Value TensorWrap::Disposed(const Napi::CallbackInfo& info) { return Napi::Boolean::New(info.Env(), disposed_); }

// view({ offset, shape }): elements [offset, offset + numel(shape)) of this tensor, sharing storage.
Napi::Value TensorWrap::View(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "view");
    return Napi::Value(Wrap(info.Env(), tensor("this").view(getInt(o, "offset"), getShape(o, "shape"))));
  });
}

Napi::Value TensorWrap::Reshape(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "reshape");
    return Napi::Value(Wrap(info.Env(), tensor("this").reshape(getShape(o, "shape"))));
  });
}

namespace {
std::pair<void*, size_t> hostBytes(const Napi::Value& v, const char* fn) {
  RC_CHECK_ARG(v.IsTypedArray() || v.IsArrayBuffer() || v.IsBuffer(),
               fn << ": expected a typed array, Buffer or ArrayBuffer");
  if (v.IsArrayBuffer()) {
    auto ab = v.As<Napi::ArrayBuffer>();
    return {ab.Data(), ab.ByteLength()};
  }
  // napi_get_typedarray_info also works for views of a SharedArrayBuffer (the data loader's batch
  // slots), which Napi::TypedArray::ArrayBuffer() rejects; `data` already includes the offset.
  napi_typedarray_type type;
  size_t length = 0;
  void* data = nullptr;
  napi_value buffer;
  size_t offset = 0;
  const napi_status status = napi_get_typedarray_info(v.Env(), v, &type, &length, &data, &buffer, &offset);
  RC_CHECK_ARG(status == napi_ok, fn << ": could not read the typed array");
  return {data, v.As<Napi::TypedArray>().ByteLength()};
}

}  // namespace

Napi::Value TensorWrap::CopyFromHost(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    const Tensor& t = tensor("this");
    RC_CHECK_ARG(info.Length() == 1, "copyFromHost: expected one typed array");
    auto [data, bytes] = hostBytes(info[0], "copyFromHost");
    backendFor(t.device()).copyFromHost(data, bytes, t);
    return info.Env().Undefined();
  });
}

Napi::Value TensorWrap::CopyToHost(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    const Tensor& t = tensor("this");
    RC_CHECK_ARG(info.Length() == 1, "copyToHost: expected one typed array");
    auto [data, bytes] = hostBytes(info[0], "copyToHost");
    backendFor(t.device()).copyToHost(t, data, bytes);
    return info.Env().Undefined();
  });
}

// copyFrom(src): device copy between tensors of equal shape and dtype, across devices via the host.
Napi::Value TensorWrap::CopyFrom(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    const Tensor& dst = tensor("this");
    RC_CHECK_ARG(info.Length() == 1 && IsTensor(info[0]), "copyFrom: expected a native tensor");
    const Tensor& src = Unwrap(info[0].As<Napi::Object>())->tensor("src");
    if (src.device() == dst.device()) {
      backendFor(dst.device()).copy(src, dst);
    } else {
      RC_CHECK_ARG(
          src.shape() == dst.shape() && src.dtype() == dst.dtype(),
          "copyFrom: tensors must match in shape and dtype, got " << src.describe() << " and " << dst.describe());
      std::vector<char> staging(src.nbytes());
      backendFor(src.device()).copyToHost(src, staging.data(), staging.size());
      backendFor(dst.device()).copyFromHost(staging.data(), staging.size(), dst);
    }
    return info.Env().Undefined();
  });
}

Napi::Value TensorWrap::SharesStorage(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    RC_CHECK_ARG(info.Length() == 1 && IsTensor(info[0]), "sharesStorage: expected a native tensor");
    const Tensor& other = Unwrap(info[0].As<Napi::Object>())->tensor("other");
    return Napi::Value(Napi::Boolean::New(info.Env(), tensor("this").storage() == other.storage()));
  });
}

Napi::Value TensorWrap::Dispose(const Napi::CallbackInfo& info) {
  tensor_ = Tensor();
  disposed_ = true;
  return info.Env().Undefined();
}

}  // namespace rc::napi
