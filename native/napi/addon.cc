// The addon's entry point: classes (NativeTensor, plans) and the light ops, one options object
// per call.
#include <napi.h>

#include <map>

#include "../core/error.h"
#include "../cpu/fma_peak.h"
#include "addon_data.h"
#include "convert.h"
#include "image.h"
#include "inference_plan.h"
#include "jpeg_decoder.h"
#include "plans.h"
#include "registry.h"
#include "tcp_store.h"
#include "tensor_wrap.h"

#ifndef RC_VERSION
#define RC_VERSION "0.0.0"
#endif

namespace rc::napi {

namespace {

using Fn = Napi::Value (*)(const Napi::CallbackInfo&);

Backend& backendOf(const Tensor& t) { return backendFor(t.device()); }

// The name an op was registered under (the function's data), for the options check's message.
const char* opName(const Napi::CallbackInfo& info) { return static_cast<const char*>(info.Data()); }

// An op that takes one argument struct: parses the options object into it and runs the op on the
// backend of its `On` tensor (the backend checks the rest).
template <typename Args, void (*Parse)(const Napi::Object&, Args&), auto On, void (Backend::*Op)(const Args&)>
Napi::Value StructOp(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Args a;
    Parse(optionsArg(info, opName(info)), a);
    (backendOf(a.*On).*Op)(a);
    return info.Env().Undefined();
  });
}

// The elements of option 'groups', an array of objects, each parsed by `parse`.
template <typename Group>
std::vector<Group> getGroups(const Napi::Object& o, Group (*parse)(const Napi::Object&)) {
  Napi::Value groups = o.Get("groups");
  RC_CHECK_ARG(groups.IsArray(), "option 'groups' must be an array of parameter groups");
  Napi::Array array = groups.As<Napi::Array>();
  std::vector<Group> out;
  for (uint32_t i = 0; i < array.Length(); ++i) {
    RC_CHECK_ARG(array.Get(i).IsObject(), "option 'groups'[" << i << "] must be an object");
    out.push_back(parse(array.Get(i).As<Napi::Object>()));
  }
  return out;
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
  const int32_t* s =
      reinterpret_cast<const int32_t*>(static_cast<const char*>(ta.ArrayBuffer().Data()) + ta.ByteOffset());
  for (size_t i = 0; i < ta.ElementLength(); i += 3) out.push_back(ArenaSegment{s[i], s[i + 1], s[i + 2]});
  return out;
}

float getFloat(const Napi::Object& o, const char* key) { return static_cast<float>(getNumber(o, key)); }
float getFloat(const Napi::Object& o, const char* key, double fallback) {
  return static_cast<float>(getNumber(o, key, fallback));
}

void parseBatchNormForward(const Napi::Object& o, BatchNormForwardArgs& a) {
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
  a.momentum = getFloat(o, "momentum", 0.1);
  a.eps = getFloat(o, "eps", 1e-5);
}

void parseBatchNormBackward(const Napi::Object& o, BatchNormBackwardArgs& a) {
  a.x = getTensor(o, "x");
  a.relu = getBool(o, "relu", false);
  a.y = getTensor(o, "y", a.relu);
  a.dy = getTensor(o, "dy");
  a.gamma = getTensor(o, "gamma");
  a.beta = getTensor(o, "beta", false);
  a.saveMean = getTensor(o, "saveMean");
  a.saveInvStd = getTensor(o, "saveInvStd");
  a.dx = getTensor(o, "dx");
  a.dGamma = getTensor(o, "dGamma");
  a.dBeta = getTensor(o, "dBeta");
  a.dResidual = getTensor(o, "dResidual", false);
  a.training = getBool(o, "training", true);
}

// Option `key` of a dual batch norm: an object (one side's tensors and settings).
Napi::Object getSide(const Napi::Object& o, const char* key) {
  RC_CHECK_ARG(has(o, key) && o.Get(key).IsObject(), "option '" << key << "' must be an object (one batch norm)");
  return o.Get(key).As<Napi::Object>();
}

// dualBatchNormForward({ a: side, b: side, y, training?, relu? }), side = { x, gamma, beta,
// runningMean, runningVar, saveMean?, saveInvStd?, momentum?, eps? }.
void parseDualBatchNormForward(const Napi::Object& o, DualBatchNormForwardArgs& a) {
  a.training = getBool(o, "training", true);
  a.relu = getBool(o, "relu", false);
  a.y = getTensor(o, "y");
  for (auto [key, side] : {std::pair{"a", &a.a}, std::pair{"b", &a.b}}) {
    const Napi::Object s = getSide(o, key);
    side->x = getTensor(s, "x");
    side->gamma = getTensor(s, "gamma");
    side->beta = getTensor(s, "beta");
    side->runningMean = getTensor(s, "runningMean");
    side->runningVar = getTensor(s, "runningVar");
    side->saveMean = getTensor(s, "saveMean", a.training);
    side->saveInvStd = getTensor(s, "saveInvStd", a.training);
    side->momentum = getFloat(s, "momentum", 0.1);
    side->eps = getFloat(s, "eps", 1e-5);
  }
}

// dualBatchNormBackward({ a: side, b: side, y?, dy, relu?, training? }), side = { x, gamma,
// saveMean, saveInvStd, dx, dGamma, dBeta }.
void parseDualBatchNormBackward(const Napi::Object& o, DualBatchNormBackwardArgs& a) {
  a.relu = getBool(o, "relu", false);
  a.training = getBool(o, "training", true);
  a.y = getTensor(o, "y", a.relu);
  a.dy = getTensor(o, "dy");
  for (auto [key, side] : {std::pair{"a", &a.a}, std::pair{"b", &a.b}}) {
    const Napi::Object s = getSide(o, key);
    side->x = getTensor(s, "x");
    side->gamma = getTensor(s, "gamma");
    side->saveMean = getTensor(s, "saveMean");
    side->saveInvStd = getTensor(s, "saveInvStd");
    side->dx = getTensor(s, "dx");
    side->dGamma = getTensor(s, "dGamma");
    side->dBeta = getTensor(s, "dBeta");
  }
}

void parseSyncBatchNormStats(const Napi::Object& o, SyncBatchNormStatsArgs& a) {
  a.x = getTensor(o, "x");
  a.stats = getTensor(o, "stats");
}

void parseSyncBatchNormForward(const Napi::Object& o, SyncBatchNormForwardArgs& a) {
  a.x = getTensor(o, "x");
  a.gamma = getTensor(o, "gamma");
  a.beta = getTensor(o, "beta");
  a.residual = getTensor(o, "residual", false);
  a.y = getTensor(o, "y");
  a.stats = getTensor(o, "stats");
  a.runningMean = getTensor(o, "runningMean");
  a.runningVar = getTensor(o, "runningVar");
  a.saveMean = getTensor(o, "saveMean");
  a.saveInvStd = getTensor(o, "saveInvStd");
  a.relu = getBool(o, "relu", false);
  a.momentum = getFloat(o, "momentum", 0.1);
  a.eps = getFloat(o, "eps", 1e-5);
}

void parseSyncBatchNormBackwardReduce(const Napi::Object& o, SyncBatchNormBackwardReduceArgs& a) {
  a.x = getTensor(o, "x");
  a.relu = getBool(o, "relu", false);
  a.y = getTensor(o, "y", a.relu);
  a.dy = getTensor(o, "dy");
  a.saveMean = getTensor(o, "saveMean");
  a.saveInvStd = getTensor(o, "saveInvStd");
  a.sums = getTensor(o, "sums");
  a.dGamma = getTensor(o, "dGamma");
  a.dBeta = getTensor(o, "dBeta");
}

void parseSyncBatchNormBackwardElementwise(const Napi::Object& o, SyncBatchNormBackwardElementwiseArgs& a) {
  a.x = getTensor(o, "x");
  a.relu = getBool(o, "relu", false);
  a.y = getTensor(o, "y", a.relu);
  a.dy = getTensor(o, "dy");
  a.gamma = getTensor(o, "gamma");
  a.saveMean = getTensor(o, "saveMean");
  a.saveInvStd = getTensor(o, "saveInvStd");
  a.sums = getTensor(o, "sums");
  a.dx = getTensor(o, "dx");
  a.dResidual = getTensor(o, "dResidual", false);
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

Napi::Value Mul(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "mul");
    Tensor a = getTensor(o, "a");
    backendOf(a).mul(a, getTensor(o, "b"), getTensor(o, "out"));
    return info.Env().Undefined();
  });
}

Napi::Value Cast(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "cast");
    Tensor src = getTensor(o, "src");
    backendOf(src).cast(src, getTensor(o, "dst"));
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

void parseCrossEntropy(const Napi::Object& o, CrossEntropyArgs& a) {
  a.logits = getTensor(o, "logits");
  a.labels = getTensor(o, "labels");
  a.loss = getTensor(o, "loss");
  a.dLogits = getTensor(o, "dLogits", false);
  a.labelSmoothing = getFloat(o, "labelSmoothing", 0.0);
  a.gradScale = getFloat(o, "gradScale", 1.0);
  a.gradScaleFrom = getTensor(o, "gradScaleFrom", false);
}

// distillationLoss({ logits, teacherLogits, labels, loss, dLogits?, temperature, alpha,
//                    labelSmoothing?, gradScale? })
void parseDistillation(const Napi::Object& o, DistillationArgs& a) {
  a.logits = getTensor(o, "logits");
  a.teacherLogits = getTensor(o, "teacherLogits");
  a.labels = getTensor(o, "labels");
  a.loss = getTensor(o, "loss");
  a.dLogits = getTensor(o, "dLogits", false);
  a.temperature = getFloat(o, "temperature");
  a.alpha = getFloat(o, "alpha");
  a.labelSmoothing = getFloat(o, "labelSmoothing", 0.0);
  a.gradScale = getFloat(o, "gradScale", 1.0);
}

SgdGroup parseSgdGroup(const Napi::Object& g) {
  SgdGroup group;
  group.lr = getFloat(g, "lr");
  group.momentum = getFloat(g, "momentum", 0.0);
  group.dampening = getFloat(g, "dampening", 0.0);
  group.weightDecay = getFloat(g, "weightDecay", 0.0);
  group.nesterov = getBool(g, "nesterov", false);
  return group;
}

// sgdStep({ params, grads, momentumBuffer?, groups: [{lr, momentum, dampening, weightDecay,
//           nesterov}], segments, firstStep, foundInf?, gradScaleInv, tablesOnly? })
void parseSgd(const Napi::Object& o, SgdArgs& a) {
  a.tablesOnly = getBool(o, "tablesOnly", false);
  a.params = getTensor(o, "params");
  a.grads = getTensor(o, "grads");
  a.momentumBuffer = getTensor(o, "momentumBuffer", false);
  a.foundInf = getTensor(o, "foundInf", false);
  a.firstStep = getBool(o, "firstStep", false);
  a.gradScaleInv = getFloat(o, "gradScaleInv", 1.0);
  a.groups = getGroups(o, parseSgdGroup);
  a.segments = getSegments(o, true);
}

// convBnForward({ x, weight, y, scale?, shift?, sum?, sqSum?, strideH?, strideW?, padH?, padW?,
//                 dilationH?, dilationW? })
void parseConvBnForward(const Napi::Object& o, ConvBnForwardArgs& a) {
  a.x = getTensor(o, "x");
  a.weight = getTensor(o, "weight");
  a.y = getTensor(o, "y");
  a.scale = getTensor(o, "scale", false);
  a.shift = getTensor(o, "shift", false);
  a.sum = getTensor(o, "sum", false);
  a.sqSum = getTensor(o, "sqSum", false);
  a.strideH = getInt(o, "strideH", 1);
  a.strideW = getInt(o, "strideW", 1);
  a.padH = getInt(o, "padH", 0);
  a.padW = getInt(o, "padW", 0);
  a.dilationH = getInt(o, "dilationH", 1);
  a.dilationW = getInt(o, "dilationW", 1);
}

// batchNormFinalize({ sum, sqSum, gamma, beta, runningMean?, runningVar?, saveMean, saveInvStd,
//                     scale, shift, variance?, count, momentum?, eps? })
void parseBatchNormFinalize(const Napi::Object& o, BatchNormFinalizeArgs& a) {
  a.sum = getTensor(o, "sum");
  a.sqSum = getTensor(o, "sqSum");
  a.gamma = getTensor(o, "gamma");
  a.beta = getTensor(o, "beta");
  a.runningMean = getTensor(o, "runningMean", false);
  a.runningVar = getTensor(o, "runningVar", false);
  a.saveMean = getTensor(o, "saveMean");
  a.saveInvStd = getTensor(o, "saveInvStd");
  a.scale = getTensor(o, "scale");
  a.shift = getTensor(o, "shift");
  a.variance = getTensor(o, "variance", false);
  a.count = getInt(o, "count");
  a.momentum = getFloat(o, "momentum", 0.1);
  a.eps = getFloat(o, "eps", 1e-5);
}

// convDgradDbn({ dy, weight, x, scale, shift, gamma, saveMean, saveInvStd, dz, dGamma, dBeta, eqDz,
//                eqX, eqBias, strideH?, strideW?, padH?, padW?, dilationH?, dilationW? })
void parseConvDgradDbn(const Napi::Object& o, ConvDgradDbnArgs& a) {
  a.dy = getTensor(o, "dy");
  a.weight = getTensor(o, "weight");
  a.x = getTensor(o, "x");
  a.scale = getTensor(o, "scale");
  a.shift = getTensor(o, "shift");
  a.gamma = getTensor(o, "gamma");
  a.saveMean = getTensor(o, "saveMean");
  a.saveInvStd = getTensor(o, "saveInvStd");
  a.dz = getTensor(o, "dz");
  a.dGamma = getTensor(o, "dGamma");
  a.dBeta = getTensor(o, "dBeta");
  a.eqDz = getTensor(o, "eqDz");
  a.eqX = getTensor(o, "eqX");
  a.eqBias = getTensor(o, "eqBias");
  a.strideH = getInt(o, "strideH", 1);
  a.strideW = getInt(o, "strideW", 1);
  a.padH = getInt(o, "padH", 0);
  a.padW = getInt(o, "padW", 0);
  a.dilationH = getInt(o, "dilationH", 1);
  a.dilationW = getInt(o, "dilationW", 1);
}

// convWgradSbr({ x, dy, scale, shift, dWeight, strideH?, strideW?, padH?, padW?, dilationH?,
//                dilationW? })
void parseConvWgradSbr(const Napi::Object& o, ConvWgradSbrArgs& a) {
  a.x = getTensor(o, "x");
  a.dy = getTensor(o, "dy");
  a.scale = getTensor(o, "scale");
  a.shift = getTensor(o, "shift");
  a.dWeight = getTensor(o, "dWeight");
  a.strideH = getInt(o, "strideH", 1);
  a.strideW = getInt(o, "strideW", 1);
  a.padH = getInt(o, "padH", 0);
  a.padW = getInt(o, "padW", 0);
  a.dilationH = getInt(o, "dilationH", 1);
  a.dilationW = getInt(o, "dilationW", 1);
}

// batchNormBackwardApply({ dz, x, eqDz, eqX, eqBias, dx })
void parseBatchNormBackwardApply(const Napi::Object& o, BatchNormBackwardApplyArgs& a) {
  a.dz = getTensor(o, "dz");
  a.x = getTensor(o, "x");
  a.eqDz = getTensor(o, "eqDz");
  a.eqX = getTensor(o, "eqX");
  a.eqBias = getTensor(o, "eqBias");
  a.dx = getTensor(o, "dx");
}

// The fused optimizer ops' fields besides their step's: { checkFinite?, zeroGrads?,
// scaleFromDevice?, scale?, growthTracker?, growthFactor?, backoffFactor?, growthInterval? }.
void parseFusedEnd(const Napi::Object& o, FusedStepEnd& a) {
  a.checkFinite = getBool(o, "checkFinite", false);
  a.zeroGrads = getBool(o, "zeroGrads", false);
  a.scaleFromDevice = getBool(o, "scaleFromDevice", false);
  a.scale = getTensor(o, "scale", false);
  a.growthTracker = getTensor(o, "growthTracker", false);
  a.growthFactor = getFloat(o, "growthFactor", 2.0);
  a.backoffFactor = getFloat(o, "backoffFactor", 0.5);
  a.growthInterval = getInt(o, "growthInterval", 2000);
}

// fusedSgdStep({ ...sgdStep's fields, ...parseFusedEnd's })
void parseFusedSgd(const Napi::Object& o, FusedSgdArgs& a) {
  parseSgd(o, a);
  parseFusedEnd(o, a);
}

AdamGroup parseAdamGroup(const Napi::Object& g) {
  AdamGroup group;
  group.lr = getFloat(g, "lr");
  group.beta1 = getFloat(g, "beta1", 0.9);
  group.beta2 = getFloat(g, "beta2", 0.999);
  group.eps = getFloat(g, "eps", 1e-8);
  group.weightDecay = getFloat(g, "weightDecay", 0.0);
  group.alwaysAdapt = getBool(g, "alwaysAdapt", false);
  return group;
}

// The fields AdamW and LAMB share: { params, grads, expAvg, expAvgSq, groups: [{lr, beta1, beta2,
// eps, weightDecay, alwaysAdapt}], segments, step, foundInf?, gradScaleInv?, stepCount?, tablesOnly? }.
template <typename Args>
void parseAdam(const Napi::Object& o, Args& a) {
  a.params = getTensor(o, "params");
  a.grads = getTensor(o, "grads");
  a.expAvg = getTensor(o, "expAvg");
  a.expAvgSq = getTensor(o, "expAvgSq");
  a.foundInf = getTensor(o, "foundInf", false);
  a.step = getInt(o, "step");
  a.stepCount = getTensor(o, "stepCount", false);
  a.tablesOnly = getBool(o, "tablesOnly", false);
  a.gradScaleInv = getFloat(o, "gradScaleInv", 1.0);
  a.groups = getGroups(o, parseAdamGroup);
  a.segments = getSegments(o, true);
}

// fusedAdamwStep and fusedLambStep({ ...parseAdam's fields, ...parseFusedEnd's })
template <typename Args>
void parseFusedAdam(const Napi::Object& o, Args& a) {
  parseAdam(o, a);
  parseFusedEnd(o, a);
}

// gradNorm({ grads, out, foundInf?, segments? })
void parseGradNorm(const Napi::Object& o, GradNormArgs& a) {
  a.grads = getTensor(o, "grads");
  a.out = getTensor(o, "out");
  a.foundInf = getTensor(o, "foundInf", false);
  a.segments = getSegments(o, false);
}

// unscaleAndCheck({ grads, invScale, foundInf, segments?, scale? }): invScale may be left out with scale.
void parseUnscale(const Napi::Object& o, UnscaleArgs& a) {
  a.grads = getTensor(o, "grads");
  a.foundInf = getTensor(o, "foundInf");
  a.scale = getTensor(o, "scale", false);
  a.invScale = a.scale.defined() ? getFloat(o, "invScale", 1.0) : getFloat(o, "invScale");
  a.segments = getSegments(o, false);
}

// clipGradNorm({ grads, norm, maxNorm, segments? })
void parseClipGradNorm(const Napi::Object& o, ClipGradNormArgs& a) {
  a.grads = getTensor(o, "grads");
  a.norm = getTensor(o, "norm");
  a.maxNorm = getFloat(o, "maxNorm");
  a.segments = getSegments(o, false);
}

// scalerUpdate({ scale, growthTracker, foundInf, growthFactor, backoffFactor, growthInterval })
void parseScalerUpdate(const Napi::Object& o, ScalerUpdateArgs& a) {
  a.scale = getTensor(o, "scale");
  a.growthTracker = getTensor(o, "growthTracker");
  a.foundInf = getTensor(o, "foundInf");
  a.growthFactor = getFloat(o, "growthFactor");
  a.backoffFactor = getFloat(o, "backoffFactor");
  a.growthInterval = getInt(o, "growthInterval");
}

// lerp({ a, b, weight }): a += weight * (b - a), in place.
void parseLerp(const Napi::Object& o, LerpArgs& a) {
  a.a = getTensor(o, "a");
  a.b = getTensor(o, "b");
  a.weight = getFloat(o, "weight");
}

// fakeQuantize({ x, scale, y, qmin, qmax })
void parseFakeQuantize(const Napi::Object& o, FakeQuantizeArgs& a) {
  a.x = getTensor(o, "x");
  a.scale = getTensor(o, "scale");
  a.y = getTensor(o, "y");
  a.qmin = getInt(o, "qmin");
  a.qmax = getInt(o, "qmax");
}

// fakeQuantizeBackward({ x, scale, dy, dx, qmin, qmax })
void parseFakeQuantizeBackward(const Napi::Object& o, FakeQuantizeBackwardArgs& a) {
  a.x = getTensor(o, "x");
  a.scale = getTensor(o, "scale");
  a.dy = getTensor(o, "dy");
  a.dx = getTensor(o, "dx");
  a.qmin = getInt(o, "qmin");
  a.qmax = getInt(o, "qmax");
}

// absMaxScale({ x, scale, qmax })
void parseAbsMaxScale(const Napi::Object& o, AbsMaxScaleArgs& a) {
  a.x = getTensor(o, "x");
  a.scale = getTensor(o, "scale");
  a.qmax = getFloat(o, "qmax");
}

// observeMinMax({ x, minMax, scale, averagingConstant, qmax })
void parseObserveMinMax(const Napi::Object& o, ObserveMinMaxArgs& a) {
  a.x = getTensor(o, "x");
  a.minMax = getTensor(o, "minMax");
  a.scale = getTensor(o, "scale");
  a.averagingConstant = getFloat(o, "averagingConstant");
  a.qmax = getFloat(o, "qmax");
}

void parseConvertInput(const Napi::Object& o, ConvertInputArgs& a) {
  a.src = getTensor(o, "src");
  a.dst = getTensor(o, "dst");
  a.flip = getTensor(o, "flip", false);
  a.mean = getFloats(o, "mean");
  a.std = getFloats(o, "std");
}

Napi::Value WindowOutputSize(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "windowOutputSize");
    const int64_t stride = getInt(o, "stride"), dilation = getInt(o, "dilation");
    RC_CHECK_ARG(stride > 0 && dilation > 0, "windowOutputSize: stride and dilation must be positive");
    const int64_t size = windowOutputSize(getInt(o, "size"), getInt(o, "kernel"), stride, getInt(o, "pad"), dilation);
    return Napi::Number::New(info.Env(), static_cast<double>(size));
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

// deviceUtilization({ device }) -> { available, reason?, gpuPercent, memoryPercent, memoryUsedBytes,
// memoryTotalBytes }: the driver's reading (NVML) on CUDA; on the CPU, and wherever NVML is missing,
// available is false with the reason.
Napi::Value DeviceUtilizationFn(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    const DeviceUtilization u = backendFor(getDevice(optionsArg(info, "deviceUtilization"), "device")).utilization();
    Napi::Object out = Napi::Object::New(info.Env());
    out.Set("available", u.available);
    if (!u.available) out.Set("reason", u.reason);
    out.Set("gpuPercent", static_cast<double>(u.gpuPercent));
    out.Set("memoryPercent", static_cast<double>(u.memoryPercent));
    out.Set("memoryUsedBytes", static_cast<double>(u.memoryUsedBytes));
    out.Set("memoryTotalBytes", static_cast<double>(u.memoryTotalBytes));
    return Napi::Value(out);
  });
}

Napi::Value ResetPeakMemory(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    backendFor(getDevice(optionsArg(info, "resetPeakMemory"), "device")).allocator().resetPeak();
    return info.Env().Undefined();
  });
}

// cpuFmaPeak({ milliseconds }) -> { gflops, threads, isa }: the CPU's multiply-add peak, measured.
Napi::Value CpuFmaPeak(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    const auto peak = cpu::measureFmaPeak(getNumber(optionsArg(info, "cpuFmaPeak"), "milliseconds"));
    Napi::Object out = Napi::Object::New(info.Env());
    out.Set("gflops", peak.gflops);
    out.Set("threads", peak.threads);
    out.Set("isa", peak.isa);
    return Napi::Value(out);
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

// convBnSupport({ device, dtype, n, h, w, c, k, kernelH, kernelW, strideH?, strideW?, padH?, padW?,
//                 dilationH?, dilationW?, prologue? }) -> { ok, reason? }
Napi::Value ConvBnSupportFn(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "convBnSupport");
    ConvBnSupportArgs a;
    a.dtype = getDType(o, "dtype");
    a.n = getInt(o, "n");
    a.h = getInt(o, "h");
    a.w = getInt(o, "w");
    a.c = getInt(o, "c");
    a.k = getInt(o, "k");
    a.r = getInt(o, "kernelH");
    a.s = getInt(o, "kernelW");
    a.strideH = getInt(o, "strideH", 1);
    a.strideW = getInt(o, "strideW", 1);
    a.padH = getInt(o, "padH", 0);
    a.padW = getInt(o, "padW", 0);
    a.dilationH = getInt(o, "dilationH", 1);
    a.dilationW = getInt(o, "dilationW", 1);
    a.prologue = getBool(o, "prologue", false);
    const ConvBnSupport s = backendFor(getDevice(o, "device")).convBnSupport(a);
    Napi::Object out = Napi::Object::New(info.Env());
    out.Set("ok", s.ok);
    if (!s.ok) out.Set("reason", s.reason);
    return Napi::Value(out);
  });
}

// profileMark({ device, push?: name, pop?: boolean }) -> the mark's index in the window.
Napi::Value ProfileMark(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "profileMark");
    ProfileMarkArgs a;
    if (has(o, "push")) a.push = getString(o, "push");
    a.pop = getBool(o, "pop", false);
    const int64_t index = backendFor(getDevice(o, "device")).profileMark(a);
    return Napi::Value(Napi::Number::New(info.Env(), static_cast<double>(index)));
  });
}

// profileRead({ device }) -> Float64Array: each mark's time in ms after the window's first mark.
Napi::Value ProfileRead(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    const std::vector<double> times = backendFor(getDevice(optionsArg(info, "profileRead"), "device")).profileRead();
    Napi::Float64Array out = Napi::Float64Array::New(info.Env(), times.size());
    for (size_t i = 0; i < times.size(); ++i) out[i] = times[i];
    return Napi::Value(out);
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

// cudaLibraries({ env?, load?, pythonTimeoutMs? }) -> { places, notes, libraries, complete }: where
// the CUDA libraries were found (cuda_libraries.h). Without `env`, this process's search (done and
// loaded once, shared with the CUDA backend); with `env` (variable -> value, the only variables
// seen), a fresh search in that made-up environment, loading only when `load` is true.
Napi::Value CudaLibraries(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Env env = info.Env();
    const bool given = info.Length() > 0 && !info[0].IsUndefined();
    const Napi::Object o = given ? optionsArg(info, "cudaLibraries") : Napi::Object::New(env);
    CudaLibrarySearch fresh;
    const CudaLibrarySearch* search = nullptr;
    if (has(o, "env")) {
      RC_CHECK_ARG(o.Get("env").IsObject(), "option 'env' must be an object of environment variables");
      const Napi::Object vars = o.Get("env").As<Napi::Object>();
      std::map<std::string, std::string> values;
      const Napi::Array names = vars.GetPropertyNames();
      for (uint32_t i = 0; i < names.Length(); ++i) {
        const std::string name = names.Get(i).As<Napi::String>().Utf8Value();
        RC_CHECK_ARG(vars.Get(name).IsString(), "option 'env'." << name << " must be a string");
        values[name] = vars.Get(name).As<Napi::String>().Utf8Value();
      }
      const int64_t timeoutMs = getInt(o, "pythonTimeoutMs", 5000);
      RC_CHECK_ARG(timeoutMs > 0 && timeoutMs <= 600000,
                   "option 'pythonTimeoutMs' must be in 1..600000, got " << timeoutMs);
      fresh = findCudaLibraries(
          [&](const std::string& name) {
            const auto it = values.find(name);
            return it == values.end() ? std::string() : it->second;
          },
          getBool(o, "load", false), static_cast<int>(timeoutMs));
      search = &fresh;
    } else {
      search = &cudaRuntimeLibraries();
    }
    Napi::Array places = Napi::Array::New(env, search->places.size());
    for (size_t i = 0; i < search->places.size(); ++i) {
      const CudaLibraryPlace& p = search->places[i];
      Napi::Object po = Napi::Object::New(env);
      po.Set("kind", p.kind);
      po.Set("label", p.label);
      Napi::Array dirs = Napi::Array::New(env, p.dirs.size());
      for (size_t j = 0; j < p.dirs.size(); ++j) dirs.Set(static_cast<uint32_t>(j), p.dirs[j]);
      po.Set("dirs", dirs);
      places.Set(static_cast<uint32_t>(i), po);
    }
    Napi::Array notes = Napi::Array::New(env, search->notes.size());
    for (size_t i = 0; i < search->notes.size(); ++i) notes.Set(static_cast<uint32_t>(i), search->notes[i]);
    Napi::Array libraries = Napi::Array::New(env, search->libraries.size());
    for (size_t i = 0; i < search->libraries.size(); ++i) {
      const CudaLibraryRecord& r = search->libraries[i];
      Napi::Object lo = Napi::Object::New(env);
      lo.Set("name", r.name);
      lo.Set("soname", r.soname);
      lo.Set("package", r.package);
      lo.Set("required", r.required);
      lo.Set("found", r.found);
      lo.Set("loaded", r.loaded);
      if (!r.path.empty()) lo.Set("path", r.path);
      if (!r.place.empty()) lo.Set("place", r.place);
      if (!r.version.empty()) lo.Set("version", r.version);
      if (!r.error.empty()) lo.Set("error", r.error);
      libraries.Set(static_cast<uint32_t>(i), lo);
    }
    Napi::Object out = Napi::Object::New(env);
    out.Set("places", places);
    out.Set("notes", notes);
    out.Set("libraries", libraries);
    out.Set("loaded", search->load);
    out.Set("complete", search->complete());
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
  exports.Set("InferencePlan", InferencePlanWrap::Init(env));
  exports.Set("Communicator", CommunicatorWrap::Init(env));
  exports.Set("JpegDecoder", JpegDecoderWrap::Init(env));
  const std::pair<const char*, Fn> functions[] = {
      {"batchNormForward",
       StructOp<BatchNormForwardArgs, parseBatchNormForward, &BatchNormForwardArgs::x, &Backend::batchNormForward>},
      {"batchNormBackward",
       StructOp<BatchNormBackwardArgs, parseBatchNormBackward, &BatchNormBackwardArgs::x, &Backend::batchNormBackward>},
      {"dualBatchNormForward", StructOp<DualBatchNormForwardArgs, parseDualBatchNormForward,
                                        &DualBatchNormForwardArgs::y, &Backend::dualBatchNormForward>},
      {"dualBatchNormBackward", StructOp<DualBatchNormBackwardArgs, parseDualBatchNormBackward,
                                         &DualBatchNormBackwardArgs::dy, &Backend::dualBatchNormBackward>},
      {"syncBatchNormStats", StructOp<SyncBatchNormStatsArgs, parseSyncBatchNormStats, &SyncBatchNormStatsArgs::x,
                                      &Backend::syncBatchNormStats>},
      {"syncBatchNormForward", StructOp<SyncBatchNormForwardArgs, parseSyncBatchNormForward,
                                        &SyncBatchNormForwardArgs::x, &Backend::syncBatchNormForward>},
      {"syncBatchNormBackwardReduce",
       StructOp<SyncBatchNormBackwardReduceArgs, parseSyncBatchNormBackwardReduce, &SyncBatchNormBackwardReduceArgs::x,
                &Backend::syncBatchNormBackwardReduce>},
      {"syncBatchNormBackwardElementwise",
       StructOp<SyncBatchNormBackwardElementwiseArgs, parseSyncBatchNormBackwardElementwise,
                &SyncBatchNormBackwardElementwiseArgs::x, &Backend::syncBatchNormBackwardElementwise>},
      {"crossEntropy",
       StructOp<CrossEntropyArgs, parseCrossEntropy, &CrossEntropyArgs::logits, &Backend::crossEntropy>},
      {"distillationLoss",
       StructOp<DistillationArgs, parseDistillation, &DistillationArgs::logits, &Backend::distillationLoss>},
      {"sgdStep", StructOp<SgdArgs, parseSgd, &SgdArgs::params, &Backend::sgdStep>},
      {"fusedSgdStep", StructOp<FusedSgdArgs, parseFusedSgd, &FusedSgdArgs::params, &Backend::fusedSgdStep>},
      {"convBnForward",
       StructOp<ConvBnForwardArgs, parseConvBnForward, &ConvBnForwardArgs::x, &Backend::convBnForward>},
      {"batchNormFinalize", StructOp<BatchNormFinalizeArgs, parseBatchNormFinalize, &BatchNormFinalizeArgs::sum,
                                     &Backend::batchNormFinalize>},
      {"convDgradDbn", StructOp<ConvDgradDbnArgs, parseConvDgradDbn, &ConvDgradDbnArgs::x, &Backend::convDgradDbn>},
      {"batchNormBackwardApply", StructOp<BatchNormBackwardApplyArgs, parseBatchNormBackwardApply,
                                          &BatchNormBackwardApplyArgs::dz, &Backend::batchNormBackwardApply>},
      {"convWgradSbr", StructOp<ConvWgradSbrArgs, parseConvWgradSbr, &ConvWgradSbrArgs::x, &Backend::convWgradSbr>},
      {"adamwStep", StructOp<AdamWArgs, parseAdam<AdamWArgs>, &AdamWArgs::params, &Backend::adamwStep>},
      {"lambStep", StructOp<LambArgs, parseAdam<LambArgs>, &LambArgs::params, &Backend::lambStep>},
      {"fusedAdamwStep",
       StructOp<FusedAdamWArgs, parseFusedAdam<FusedAdamWArgs>, &FusedAdamWArgs::params, &Backend::fusedAdamwStep>},
      {"fusedLambStep",
       StructOp<FusedLambArgs, parseFusedAdam<FusedLambArgs>, &FusedLambArgs::params, &Backend::fusedLambStep>},
      {"gradNorm", StructOp<GradNormArgs, parseGradNorm, &GradNormArgs::grads, &Backend::gradNorm>},
      {"unscaleAndCheck", StructOp<UnscaleArgs, parseUnscale, &UnscaleArgs::grads, &Backend::unscaleAndCheck>},
      {"clipGradNorm", StructOp<ClipGradNormArgs, parseClipGradNorm, &ClipGradNormArgs::grads, &Backend::clipGradNorm>},
      {"scalerUpdate", StructOp<ScalerUpdateArgs, parseScalerUpdate, &ScalerUpdateArgs::scale, &Backend::scalerUpdate>},
      {"lerp", StructOp<LerpArgs, parseLerp, &LerpArgs::a, &Backend::lerp>},
      {"fakeQuantize", StructOp<FakeQuantizeArgs, parseFakeQuantize, &FakeQuantizeArgs::x, &Backend::fakeQuantize>},
      {"fakeQuantizeBackward", StructOp<FakeQuantizeBackwardArgs, parseFakeQuantizeBackward,
                                        &FakeQuantizeBackwardArgs::x, &Backend::fakeQuantizeBackward>},
      {"absMaxScale", StructOp<AbsMaxScaleArgs, parseAbsMaxScale, &AbsMaxScaleArgs::x, &Backend::absMaxScale>},
      {"observeMinMax",
       StructOp<ObserveMinMaxArgs, parseObserveMinMax, &ObserveMinMaxArgs::x, &Backend::observeMinMax>},
      {"convertInput", StructOp<ConvertInputArgs, parseConvertInput, &ConvertInputArgs::src, &Backend::convertInput>},
      {"relu", Relu},
      {"reluBackward", ReluBackward},
      {"add", Add},
      {"mul", Mul},
      {"cast", Cast},
      {"fill", Fill},
      {"windowOutputSize", WindowOutputSize},
      {"synchronize", Synchronize},
      {"memoryStats", MemoryStatsFn},
      {"deviceUtilization", DeviceUtilizationFn},
      {"resetPeakMemory", ResetPeakMemory},
      {"emptyCache", EmptyCache},
      {"cpuFmaPeak", CpuFmaPeak},
      {"listBackends", ListBackends},
      {"cudaLibraries", CudaLibraries},
      {"beginCapture", BeginCapture},
      {"endCapture", EndCapture},
      {"replayGraph", ReplayGraph},
      {"destroyGraph", DestroyGraph},
      {"createUniqueId", CreateUniqueId},
      {"profileMark", ProfileMark},
      {"convBnSupport", ConvBnSupportFn},
      {"profileRead", ProfileRead},
  };
  for (const auto& [name, fn] : functions) {
    exports.Set(name, Napi::Function::New(env, fn, name, const_cast<char*>(name)));
  }
  RegisterImage(env, exports);
  RegisterTcpStore(env, exports);
  exports.Set("version", Napi::String::New(env, RC_VERSION));
  return exports;
}

}  // namespace rc::napi

static Napi::Object InitAddon(Napi::Env env, Napi::Object exports) { return rc::napi::Init(env, exports); }

NODE_API_MODULE(resnet_cuda, InitAddon)
