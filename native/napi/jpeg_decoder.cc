#include "jpeg_decoder.h"

#include <string>
#include <vector>

#include "../core/error.h"
#include "convert.h"
#include "registry.h"

namespace rc::napi {
namespace {

image::Filter filterOf(const std::string& name, const std::string& where) {
  if (name == "nearest") return image::Filter::Nearest;
  if (name == "bilinear") return image::Filter::Bilinear;
  if (name == "bicubic") return image::Filter::Bicubic;
  if (name == "lanczos") return image::Filter::Lanczos;
  RC_THROW(code::kInvalidArgument,
           where << ".filter must be 'nearest', 'bilinear', 'bicubic' or 'lanczos', got '" << name << "'");
}

// `n` non-negative integers of o[key] into out; false when absent.
bool ints(const Napi::Object& o, const char* key, size_t n, int* out, const std::string& where) {
  if (!has(o, key)) return false;
  const Shape values = getShape(o, key);
  RC_CHECK_ARG(values.size() == n, where << "." << key << " must have " << n << " values, got " << values.size());
  for (size_t i = 0; i < n; ++i) {
    RC_CHECK_ARG(values[i] <= 1 << 30, where << "." << key << "[" << i << "] is too large: " << values[i]);
    out[i] = static_cast<int>(values[i]);
  }
  return true;
}

// One request, with the fields of the CPU decoder's (native/napi/image.cc jpegDecode): the crop
// [top, left, height, width] of the image, the size it is resized to, the window of the result,
// the filter and the mirroring; the image's size from its header.
JpegDecodeJob parseJob(const Napi::Object& o, const std::string& where) {
  JpegDecodeJob job;
  RC_CHECK_ARG(has(o, "bytes"), where << ".bytes is required");
  const Napi::Value v = o.Get("bytes");
  RC_CHECK_ARG(v.IsTypedArray() && v.As<Napi::TypedArray>().TypedArrayType() == napi_uint8_array,
               where << ".bytes must be a Uint8Array");
  const Napi::Uint8Array bytes = v.As<Napi::Uint8Array>();
  job.bytes = bytes.Data();
  job.size = bytes.ByteLength();
  job.height = static_cast<int>(getInt(o, "height"));
  job.width = static_cast<int>(getInt(o, "width"));
  RC_CHECK_ARG(job.height > 0 && job.width > 0,
               where << ": the image size must be positive, got " << job.height << "x" << job.width);
  int crop[4] = {0, 0, job.height, job.width}, size[2], window[4];
  ints(o, "crop", 4, crop, where);
  RC_CHECK_ARG(crop[0] >= 0 && crop[1] >= 0 && crop[2] > 0 && crop[3] > 0 && crop[0] + crop[2] <= job.height &&
                   crop[1] + crop[3] <= job.width,
               where << ": the crop " << crop[2] << "x" << crop[3] << " at (" << crop[0] << ", " << crop[1]
                     << ") is not inside the " << job.height << "x" << job.width << " image");
  image::ResampleSpec& s = job.spec;
  s.box[0] = crop[1];
  s.box[1] = crop[0];
  s.box[2] = crop[1] + crop[3];
  s.box[3] = crop[0] + crop[2];
  const bool resize = ints(o, "size", 2, size, where);
  s.outHeight = resize ? size[0] : crop[2];
  s.outWidth = resize ? size[1] : crop[3];
  if (ints(o, "window", 4, window, where)) {
    s.windowTop = window[0];
    s.windowLeft = window[1];
    s.windowHeight = window[2];
    s.windowWidth = window[3];
  } else {
    s.windowHeight = s.outHeight;
    s.windowWidth = s.outWidth;
  }
  s.filter = filterOf(has(o, "filter") ? getString(o, "filter") : std::string("bilinear"), where);
  job.mirror = getBool(o, "mirror", false);
  return job;
}

}  // namespace

Napi::Function JpegDecoderWrap::Init(Napi::Env env) {
  return DefineClass(
      env, "JpegDecoder",
      {InstanceMethod<&JpegDecoderWrap::Decode>("decode"), InstanceMethod<&JpegDecoderWrap::Join>("join"),
       InstanceMethod<&JpegDecoderWrap::Synchronize>("synchronize"),
       InstanceMethod<&JpegDecoderWrap::Implementation>("implementation"),
       InstanceMethod<&JpegDecoderWrap::Dispose>("dispose")});
}

// new JpegDecoder({ device })
JpegDecoderWrap::JpegDecoderWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<JpegDecoderWrap>(info) {
  guarded(info.Env(), [&] {
    const Napi::Object o = optionsArg(info, "JpegDecoder");
    decoder_ = backendFor(getDevice(o, "device")).createJpegDecoder();
  });
}

JpegDecoder& JpegDecoderWrap::live() {
  if (!decoder_) RC_THROW(code::kDisposed, "JpegDecoder was disposed and cannot be used");
  return *decoder_;
}

// decode({ images: [{ bytes, height, width, crop?, size?, window?, filter?, mirror? }], dst })
Napi::Value JpegDecoderWrap::Decode(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    const Napi::Object o = optionsArg(info, "JpegDecoder.decode");
    RC_CHECK_ARG(has(o, "images") && o.Get("images").IsArray(), "option 'images' must be an array");
    const Napi::Array images = o.Get("images").As<Napi::Array>();
    std::vector<JpegDecodeJob> jobs;
    jobs.reserve(images.Length());
    for (uint32_t i = 0; i < images.Length(); ++i) {
      const std::string where = "images[" + std::to_string(i) + "]";
      const Napi::Value item = images.Get(i);
      RC_CHECK_ARG(item.IsObject(), where << " must be an object");
      jobs.push_back(parseJob(item.As<Napi::Object>(), where));
    }
    live().decode(jobs, getTensor(o, "dst"));
    return info.Env().Undefined();
  });
}

Napi::Value JpegDecoderWrap::Join(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    live().join();
    return info.Env().Undefined();
  });
}

// synchronize({ timeoutSeconds })
Napi::Value JpegDecoderWrap::Synchronize(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    const Napi::Object o = optionsArg(info, "JpegDecoder.synchronize");
    const double timeout = getNumber(o, "timeoutSeconds");
    RC_CHECK_ARG(timeout > 0, "option 'timeoutSeconds' must be positive, got " << timeout);
    live().synchronize(timeout);
    return info.Env().Undefined();
  });
}

Napi::Value JpegDecoderWrap::Implementation(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] { return Napi::Value(Napi::String::New(info.Env(), live().implementation())); });
}

Napi::Value JpegDecoderWrap::Dispose(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    decoder_.reset();
    return info.Env().Undefined();
  });
}

}  // namespace rc::napi
