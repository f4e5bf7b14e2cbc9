// JavaScript entry points of the image code (native/image): JPEG decoding fused with crop and
// resize, and resampling of decoded images. Both run synchronously on the calling thread: the data
// loader calls them from its worker threads, where a hand-off to another thread would only add
// cost.
#include "image.h"

#include <string>

#include "../core/error.h"
#include "../image/jpeg.h"
#include "../image/resample.h"
#include "convert.h"

namespace rc::napi {
namespace {

using image::Filter;

Filter getFilter(const Napi::Object& o) {
  const std::string name = has(o, "filter") ? getString(o, "filter") : std::string("bilinear");
  if (name == "nearest") return Filter::Nearest;
  if (name == "bilinear") return Filter::Bilinear;
  if (name == "bicubic") return Filter::Bicubic;
  if (name == "lanczos") return Filter::Lanczos;
  RC_THROW(code::kInvalidArgument,
           "option 'filter' must be 'nearest', 'bilinear', 'bicubic' or 'lanczos', got '" << name << "'");
}

// An optional array of `n` non-negative integers; false when absent.
bool getInts(const Napi::Object& o, const char* key, size_t n, int* out) {
  if (!has(o, key)) return false;
  const Shape values = getShape(o, key);
  RC_CHECK_ARG(values.size() == n, "option '" << key << "' must have " << n << " values, got " << values.size());
  for (size_t i = 0; i < n; ++i) {
    RC_CHECK_ARG(values[i] <= 1 << 30, "option '" << key << "'[" << i << "] is too large: " << values[i]);
    out[i] = static_cast<int>(values[i]);
  }
  return true;
}

// A required array of `n` finite numbers.
void getDoubles(const Napi::Object& o, const char* key, size_t n, double* out) {
  RC_CHECK_ARG(has(o, key), "option '" << key << "' is required");
  Napi::Value v = o.Get(key);
  RC_CHECK_ARG(v.IsArray() && v.As<Napi::Array>().Length() == n,
               "option '" << key << "' must be an array of " << n << " numbers");
  Napi::Array arr = v.As<Napi::Array>();
  for (uint32_t i = 0; i < n; ++i) {
    Napi::Value d = arr.Get(i);
    RC_CHECK_ARG(d.IsNumber(), "option '" << key << "'[" << i << "] must be a number");
    out[i] = d.As<Napi::Number>().DoubleValue();
  }
}

Napi::Uint8Array getBytes(const Napi::Object& o, const char* key) {
  RC_CHECK_ARG(has(o, key), "option '" << key << "' is required");
  Napi::Value v = o.Get(key);
  RC_CHECK_ARG(v.IsTypedArray() && v.As<Napi::TypedArray>().TypedArrayType() == napi_uint8_array,
               "option '" << key << "' must be a Uint8Array");
  return v.As<Napi::Uint8Array>();
}

Napi::Value JpegHeaderFn(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    const Napi::Object o = optionsArg(info, "jpegHeader");
    const Napi::Uint8Array bytes = getBytes(o, "bytes");
    const image::JpegHeader h = image::readJpegHeader(bytes.Data(), bytes.ByteLength());
    Napi::Object result = Napi::Object::New(info.Env());
    result.Set("height", h.height);
    result.Set("width", h.width);
    result.Set("channels", h.channels);
    result.Set("supported", h.supported);
    return Napi::Value(result);
  });
}

Napi::Value JpegDecodeFn(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    const Napi::Object o = optionsArg(info, "jpegDecode");
    const Napi::Uint8Array bytes = getBytes(o, "bytes");
    image::JpegRequest r;
    int crop[4], size[2], window[4];
    if ((r.crop = getInts(o, "crop", 4, crop))) {
      r.top = crop[0];
      r.left = crop[1];
      r.height = crop[2];
      r.width = crop[3];
    }
    if ((r.resize = getInts(o, "size", 2, size))) {
      r.outHeight = size[0];
      r.outWidth = size[1];
    }
    if ((r.window = getInts(o, "window", 4, window))) {
      r.windowTop = window[0];
      r.windowLeft = window[1];
      r.windowHeight = window[2];
      r.windowWidth = window[3];
    }
    r.filter = getFilter(o);
    r.mirror = getBool(o, "mirror", false);
    r.dctScaling = getBool(o, "dctScaling", true);
    // The pixels go straight into a JavaScript-owned array, whose size the garbage collector sees.
    Napi::Uint8Array pixels;
    const image::ImageAllocator allocate = [&](size_t n) {
      pixels = Napi::Uint8Array::New(info.Env(), n);
      return pixels.Data();
    };
    image::JpegImage img;
    if (!image::decodeJpeg(bytes.Data(), bytes.ByteLength(), r, allocate, img)) return info.Env().Null();
    Napi::Object result = Napi::Object::New(info.Env());
    result.Set("height", img.height);
    result.Set("width", img.width);
    result.Set("channels", img.channels);
    result.Set("data", pixels);
    return Napi::Value(result);
  });
}

Napi::Value ImageResampleFn(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    const Napi::Object o = optionsArg(info, "imageResample");
    const Napi::Uint8Array data = getBytes(o, "data");
    const int64_t height = getInt(o, "height"), width = getInt(o, "width"), channels = getInt(o, "channels");
    RC_CHECK_ARG(height > 0 && width > 0 && height <= 1 << 20 && width <= 1 << 20,
                 "imageResample: expected a non-empty image, got " << height << "x" << width);
    RC_CHECK_ARG(channels >= 1 && channels <= 4, "imageResample: expected 1 to 4 channels, got " << channels);
    RC_CHECK_ARG(static_cast<int64_t>(data.ByteLength()) >= height * width * channels,
                 "imageResample: the data holds " << data.ByteLength() << " bytes, fewer than " << height << "x"
                                                  << width << "x" << channels);
    image::ResampleSpec spec;
    getDoubles(o, "box", 4, spec.box);
    int size[2], window[4];
    RC_CHECK_ARG(getInts(o, "size", 2, size), "option 'size' ([height, width]) is required");
    spec.outHeight = size[0];
    spec.outWidth = size[1];
    if (getInts(o, "window", 4, window)) {
      spec.windowTop = window[0];
      spec.windowLeft = window[1];
      spec.windowHeight = window[2];
      spec.windowWidth = window[3];
    } else {
      spec.windowHeight = spec.outHeight;
      spec.windowWidth = spec.outWidth;
    }
    spec.filter = getFilter(o);
    const image::ResamplePlan plan = image::planResample(static_cast<int>(height), static_cast<int>(width), spec);
    image::SourceRegion src;
    src.data = data.Data();
    src.stride = static_cast<size_t>(width * channels);
    src.rows = static_cast<int>(height);
    src.cols = static_cast<int>(width);
    src.channels = static_cast<int>(channels);
    Napi::Uint8Array out =
        Napi::Uint8Array::New(info.Env(), static_cast<size_t>(spec.windowHeight) * spec.windowWidth * channels);
    image::runResample(plan, src, getBool(o, "mirror", false), out.Data());
    return Napi::Value(out);
  });
}

}  // namespace

void RegisterImage(Napi::Env env, Napi::Object exports) {
  exports.Set("jpegHeader", Napi::Function::New(env, JpegHeaderFn, "jpegHeader"));
  exports.Set("jpegDecode", Napi::Function::New(env, JpegDecodeFn, "jpegDecode"));
  exports.Set("imageResample", Napi::Function::New(env, ImageResampleFn, "imageResample"));
  exports.Set("libjpegTurboVersion", Napi::String::New(env, image::libjpegTurboVersion()));
}

}  // namespace rc::napi
