// The addon's entry point: classes (NativeTensor, plans) and the light ops, one options object
// per call.
#include <napi.h>

#include "../core/error.h"
#include "addon_data.h"
#include "convert.h"
#include "image.h"
#include "plans.h"
#include "registry.h"
#include "tensor_wrap.h"

#ifndef RC_VERSION
#define RC_VERSION "0.0.0"
#endif

namespace rc::napi {

namespace {

using Fn = Napi::Value (*)(const Napi::CallbackInfo&);

Backend& backendOf(const Tensor& t) { return backendFor(t.device()); }

Napi::Value BatchNormForward(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "batchNormForward");
    BatchNormForwardArgs a;
    a.x = getTensor(o, "x");
    a.gamma = getTensor(o, "gamma");
    a.beta = getTensor(o, "beta");
    a.residual = getTensor(o, "residual", false);
    a.y = getTensor(o, "y");
    a.runningMean = getTensor(o, "runningMean");
    a.runningVar = getTensor(o, "runningVar");
    a.training = getBool(o, "training", true);
    // Inference saves the running statistics only when asked, for a backward in evaluation mode.
    a.saveMean = getTensor(o, "saveMean", a.training);
    a.saveInvStd = getTensor(o, "saveInvStd", a.training);
    a.relu = getBool(o, "relu", false);
    a.momentum = static_cast<float>(getNumber(o, "momentum", 0.1));
    a.eps = static_cast<float>(getNumber(o, "eps", 1e-5));
    backendOf(a.x).batchNormForward(a);
    return info.Env().Undefined();
  });
}

Napi::Value BatchNormBackward(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "batchNormBackward");
    BatchNormBackwardArgs a;
    a.x = getTensor(o, "x");
    a.relu = getBool(o, "relu", false);
    a.y = getTensor(o, "y", a.relu);
    a.dy = getTensor(o, "dy");
    a.gamma = getTensor(o, "gamma");
    a.saveMean = getTensor(o, "saveMean");
    a.saveInvStd = getTensor(o, "saveInvStd");
    a.dx = getTensor(o, "dx");
    a.dGamma = getTensor(o, "dGamma");
    a.dBeta = getTensor(o, "dBeta");
    a.dResidual = getTensor(o, "dResidual", false);
    a.training = getBool(o, "training", true);
    backendOf(a.x).batchNormBackward(a);
    return info.Env().Undefined();
  });
}

Napi::Value Relu(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "relu");
    Tensor x = getTensor(o, "x");
    backendOf(x).relu(x, getTensor(o, "y"));
    return info.Env().Undefined();
  });
}

Napi::Value ReluBackward(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "reluBackward");
    Tensor y = getTensor(o, "y");
    backendOf(y).reluBackward(y, getTensor(o, "dy"), getTensor(o, "dx"));
    return info.Env().Undefined();
  });
}

Napi::Value Add(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "add");
    Tensor a = getTensor(o, "a");
    backendOf(a).add(a, getTensor(o, "b"), getTensor(o, "out"));
    return info.Env().Undefined();
  });
}

Napi::Value Cast(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "cast");
    Tensor src = getTensor(o, "src");
    Tensor dst = getTensor(o, "dst");
    checkSameDevice(src, dst, "cast");
    backendOf(src).cast(src, dst);
    return info.Env().Undefined();
  });
}

Napi::Value Fill(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "fill");
    Tensor t = getTensor(o, "tensor");
    backendOf(t).fill(t, getNumber(o, "value"));
    return info.Env().Undefined();
  });
}

Napi::Value CrossEntropy(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "crossEntropy");
    CrossEntropyArgs a;
    a.logits = getTensor(o, "logits");
    a.labels = getTensor(o, "labels");
    a.loss = getTensor(o, "loss");
    a.dLogits = getTensor(o, "dLogits", false);
    a.labelSmoothing = static_cast<float>(getNumber(o, "labelSmoothing", 0.0));
    a.gradScale = static_cast<float>(getNumber(o, "gradScale", 1.0));
    backendOf(a.logits).crossEntropy(a);
    return info.Env().Undefined();
  });
}

// sgdStep({ params, grads, momentumBuffer?, groups: [{lr, momentum, dampening, weightDecay,
//           nesterov}], segments: Int32Array/number[] of (offset, count, group) triples,
//           firstStep, foundInf?, gradScaleInv })
Napi::Value SgdStep(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "sgdStep");
    SgdArgs a;
    a.params = getTensor(o, "params");
    a.grads = getTensor(o, "grads");
    a.momentumBuffer = getTensor(o, "momentumBuffer", false);
    a.foundInf = getTensor(o, "foundInf", false);
    a.firstStep = getBool(o, "firstStep", false);
    a.gradScaleInv = static_cast<float>(getNumber(o, "gradScaleInv", 1.0));
    Napi::Value groups = o.Get("groups");
    RC_CHECK_ARG(groups.IsArray(), "option 'groups' must be an array of parameter groups");
    Napi::Array ga = groups.As<Napi::Array>();
    for (uint32_t i = 0; i < ga.Length(); ++i) {
      RC_CHECK_ARG(ga.Get(i).IsObject(), "option 'groups'[" << i << "] must be an object");
      Napi::Object g = ga.Get(i).As<Napi::Object>();
      SgdGroup group;
      group.lr = static_cast<float>(getNumber(g, "lr"));
      group.momentum = static_cast<float>(getNumber(g, "momentum", 0.0));
      group.dampening = static_cast<float>(getNumber(g, "dampening", 0.0));
      group.weightDecay = static_cast<float>(getNumber(g, "weightDecay", 0.0));
      group.nesterov = getBool(g, "nesterov", false);
      a.groups.push_back(group);
    }
    Napi::Value segments = o.Get("segments");
    RC_CHECK_ARG(segments.IsTypedArray(), "option 'segments' must be an Int32Array of (offset, count, group) triples");
    Napi::TypedArray ta = segments.As<Napi::TypedArray>();
    RC_CHECK_ARG(ta.TypedArrayType() == napi_int32_array && ta.ElementLength() % 3 == 0,
                 "option 'segments' must be an Int32Array whose length is a multiple of 3");
    const int32_t* s = reinterpret_cast<const int32_t*>(static_cast<const char*>(ta.ArrayBuffer().Data()) + ta.ByteOffset());
    for (size_t i = 0; i < ta.ElementLength(); i += 3) a.segments.push_back(ArenaSegment{s[i], s[i + 1], s[i + 2]});
    backendOf(a.params).sgdStep(a);
    return info.Env().Undefined();
  });
}

// Option 'segments': an Int32Array of (offset, count, group) triples; absent (when allowed) is
// an empty list, which the ops without groups read as "the whole arena".
std::vector<ArenaSegment> getSegments(const Napi::Object& o, bool required) {
  std::vector<ArenaSegment> out;
  if (!required && !has(o, "segments")) return out;
  Napi::Value segments = o.Get("segments");
  RC_CHECK_ARG(segments.IsTypedArray(), "option 'segments' must be an Int32Array of (offset, count, group) triples");
  Napi::TypedArray ta = segments.As<Napi::TypedArray>();
  RC_CHECK_ARG(ta.TypedArrayType() == napi_int32_array && ta.ElementLength() % 3 == 0,
               "option 'segments' must be an Int32Array whose length is a multiple of 3");
  const int32_t* s = reinterpret_cast<const int32_t*>(static_cast<const char*>(ta.ArrayBuffer().Data()) + ta.ByteOffset());
  for (size_t i = 0; i < ta.ElementLength(); i += 3) out.push_back(ArenaSegment{s[i], s[i + 1], s[i + 2]});
  return out;
}

// The fields AdamW and LAMB share: { params, grads, expAvg, expAvgSq, groups: [{lr, beta1, beta2,
// eps, weightDecay, alwaysAdapt}], segments, step, foundInf?, gradScaleInv? }.
void getAdamArgs(const Napi::Object& o, AdamWArgs& a) {
  a.params = getTensor(o, "params");
  a.grads = getTensor(o, "grads");
  a.expAvg = getTensor(o, "expAvg");
  a.expAvgSq = getTensor(o, "expAvgSq");
  a.foundInf = getTensor(o, "foundInf", false);
  a.step = getInt(o, "step");
  a.gradScaleInv = static_cast<float>(getNumber(o, "gradScaleInv", 1.0));
  Napi::Value groups = o.Get("groups");
  RC_CHECK_ARG(groups.IsArray(), "option 'groups' must be an array of parameter groups");
  Napi::Array ga = groups.As<Napi::Array>();
  for (uint32_t i = 0; i < ga.Length(); ++i) {
    RC_CHECK_ARG(ga.Get(i).IsObject(), "option 'groups'[" << i << "] must be an object");
    Napi::Object g = ga.Get(i).As<Napi::Object>();
    AdamGroup group;
    group.lr = static_cast<float>(getNumber(g, "lr"));
    group.beta1 = static_cast<float>(getNumber(g, "beta1", 0.9));
    group.beta2 = static_cast<float>(getNumber(g, "beta2", 0.999));
    group.eps = static_cast<float>(getNumber(g, "eps", 1e-8));
    group.weightDecay = static_cast<float>(getNumber(g, "weightDecay", 0.0));
    group.alwaysAdapt = getBool(g, "alwaysAdapt", false);
    a.groups.push_back(group);
  }
  a.segments = getSegments(o, true);
}

Napi::Value AdamwStep(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    AdamWArgs a;
    getAdamArgs(optionsArg(info, "adamwStep"), a);
    backendOf(a.params).adamwStep(a);
    return info.Env().Undefined();
  });
}

Napi::Value LambStep(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    LambArgs a;
    getAdamArgs(optionsArg(info, "lambStep"), a);
    backendOf(a.params).lambStep(a);
    return info.Env().Undefined();
  });
}

// gradNorm({ grads, out, foundInf?, segments? })
Napi::Value GradNorm(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "gradNorm");
    GradNormArgs a;
    a.grads = getTensor(o, "grads");
    a.out = getTensor(o, "out");
    a.foundInf = getTensor(o, "foundInf", false);
    a.segments = getSegments(o, false);
    backendOf(a.grads).gradNorm(a);
    return info.Env().Undefined();
  });
}

// unscaleAndCheck({ grads, invScale, foundInf, segments? })
Napi::Value UnscaleAndCheck(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "unscaleAndCheck");
    UnscaleArgs a;
    a.grads = getTensor(o, "grads");
    a.foundInf = getTensor(o, "foundInf");
    a.invScale = static_cast<float>(getNumber(o, "invScale"));
    a.segments = getSegments(o, false);
    backendOf(a.grads).unscaleAndCheck(a);
    return info.Env().Undefined();
  });
}

// clipGradNorm({ grads, norm, maxNorm, segments? })
Napi::Value ClipGradNorm(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "clipGradNorm");
    ClipGradNormArgs a;
    a.grads = getTensor(o, "grads");
    a.norm = getTensor(o, "norm");
    a.maxNorm = static_cast<float>(getNumber(o, "maxNorm"));
    a.segments = getSegments(o, false);
    backendOf(a.grads).clipGradNorm(a);
    return info.Env().Undefined();
  });
}

// scalerUpdate({ scale, growthTracker, foundInf, growthFactor, backoffFactor, growthInterval })
Napi::Value ScalerUpdate(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "scalerUpdate");
    ScalerUpdateArgs a;
    a.scale = getTensor(o, "scale");
    a.growthTracker = getTensor(o, "growthTracker");
    a.foundInf = getTensor(o, "foundInf");
    a.growthFactor = static_cast<float>(getNumber(o, "growthFactor"));
    a.backoffFactor = static_cast<float>(getNumber(o, "backoffFactor"));
    a.growthInterval = getInt(o, "growthInterval");
    backendOf(a.scale).scalerUpdate(a);
    return info.Env().Undefined();
  });
}

// lerp({ a, b, weight }): a += weight * (b - a), in place.
Napi::Value Lerp(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "lerp");
    LerpArgs a;
    a.a = getTensor(o, "a");
    a.b = getTensor(o, "b");
    a.weight = static_cast<float>(getNumber(o, "weight"));
    backendOf(a.a).lerp(a);
    return info.Env().Undefined();
  });
}

Napi::Value ConvertInput(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "convertInput");
    ConvertInputArgs a;
    a.src = getTensor(o, "src");
    a.dst = getTensor(o, "dst");
    a.flip = getTensor(o, "flip", false);
    a.mean = getFloats(o, "mean");
    a.std = getFloats(o, "std");
    checkSameDevice(a.src, a.dst, "convertInput");
    backendOf(a.src).convertInput(a);
    return info.Env().Undefined();
  });
}

Napi::Value Synchronize(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    backendFor(getDevice(optionsArg(info, "synchronize"), "device")).synchronize();
    return info.Env().Undefined();
  });
}

Napi::Value MemoryStatsFn(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    const MemoryStats s = backendFor(getDevice(optionsArg(info, "memoryStats"), "device")).allocator().stats();
    Napi::Object out = Napi::Object::New(info.Env());
    out.Set("allocatedBytes", static_cast<double>(s.allocatedBytes));
    out.Set("reservedBytes", static_cast<double>(s.reservedBytes));
    out.Set("peakAllocatedBytes", static_cast<double>(s.peakAllocatedBytes));
    out.Set("allocationCount", static_cast<double>(s.allocationCount));
    out.Set("systemAllocationCount", static_cast<double>(s.systemAllocationCount));
    return Napi::Value(out);
  });
}

Napi::Value ResetPeakMemory(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    backendFor(getDevice(optionsArg(info, "resetPeakMemory"), "device")).allocator().resetPeak();
    return info.Env().Undefined();
  });
}

Napi::Value EmptyCache(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    backendFor(getDevice(optionsArg(info, "emptyCache"), "device")).allocator().emptyCache();
    return info.Env().Undefined();
  });
}

Napi::Value BeginCapture(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    backendFor(getDevice(optionsArg(info, "beginCapture"), "device")).beginCapture();
    return info.Env().Undefined();
  });
}

Napi::Value EndCapture(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    const int64_t id = backendFor(getDevice(optionsArg(info, "endCapture"), "device")).endCapture();
    return Napi::Value(Napi::Number::New(info.Env(), static_cast<double>(id)));
  });
}

Napi::Value ReplayGraph(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "replayGraph");
    backendFor(getDevice(o, "device")).replay(getInt(o, "graph"));
    return info.Env().Undefined();
  });
}

Napi::Value DestroyGraph(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "destroyGraph");
    backendFor(getDevice(o, "device")).destroyGraph(getInt(o, "graph"));
    return info.Env().Undefined();
  });
}

Napi::Value CreateUniqueId(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    const std::string id = backendFor(getDevice(optionsArg(info, "createUniqueId"), "device")).createUniqueId();
    return Napi::Value(Napi::String::New(info.Env(), id));
  });
}

Napi::Value ListBackends(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Env env = info.Env();
    const auto statuses = listBackends();
    Napi::Array out = Napi::Array::New(env, statuses.size());
    for (size_t i = 0; i < statuses.size(); ++i) {
      const BackendStatus& s = statuses[i];
      Napi::Object o = Napi::Object::New(env);
      o.Set("name", s.name);
      o.Set("built", s.built);
      o.Set("available", s.available);
      o.Set("deviceCount", s.deviceCount);
      if (!s.reason.empty()) o.Set("reason", s.reason);
      if (s.available) {
        o.Set("device", s.info.device);
        Napi::Object props = Napi::Object::New(env);
        for (const auto& [key, value] : s.info.properties) props.Set(key, value);
        o.Set("properties", props);
      }
      out.Set(static_cast<uint32_t>(i), o);
    }
    return Napi::Value(out);
  });
}

}  // namespace

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  auto* data = new AddonData();
  env.SetInstanceData<AddonData>(data);
  Napi::Function tensor = TensorWrap::Init(env);
  data->tensorConstructor = Napi::Persistent(tensor);
  exports.Set("NativeTensor", tensor);
  exports.Set("Conv2dPlan", Conv2dPlanWrap::Init(env));
  exports.Set("LinearPlan", LinearPlanWrap::Init(env));
  exports.Set("Pool2dPlan", Pool2dPlanWrap::Init(env));
  exports.Set("Communicator", CommunicatorWrap::Init(env));
  const std::pair<const char*, Fn> functions[] = {
      {"batchNormForward", BatchNormForward}, {"batchNormBackward", BatchNormBackward},
      {"relu", Relu},                         {"reluBackward", ReluBackward},
      {"add", Add},                           {"cast", Cast},
      {"fill", Fill},                         {"crossEntropy", CrossEntropy},
      {"sgdStep", SgdStep},                   {"convertInput", ConvertInput},
      {"synchronize", Synchronize},           {"memoryStats", MemoryStatsFn},
      {"resetPeakMemory", ResetPeakMemory},   {"emptyCache", EmptyCache},
      {"listBackends", ListBackends},         {"beginCapture", BeginCapture},
      {"endCapture", EndCapture},             {"replayGraph", ReplayGraph},
      {"destroyGraph", DestroyGraph},         {"createUniqueId", CreateUniqueId},
      {"adamwStep", AdamwStep},               {"lambStep", LambStep},
      {"gradNorm", GradNorm},                 {"unscaleAndCheck", UnscaleAndCheck},
      {"clipGradNorm", ClipGradNorm},         {"scalerUpdate", ScalerUpdate},
      {"lerp", Lerp},
  };
  for (const auto& [name, fn] : functions) exports.Set(name, Napi::Function::New(env, fn, name));
  RegisterImage(env, exports);
  exports.Set("version", Napi::String::New(env, RC_VERSION));
  return exports;
}

}  // namespace rc::napi

static Napi::Object InitAddon(Napi::Env env, Napi::Object exports) { return rc::napi::Init(env, exports); }

NODE_API_MODULE(resnet_cuda, InitAddon)
