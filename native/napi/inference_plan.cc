#include "inference_plan.h"

#include <string>

#include "../core/error.h"
#include "convert.h"
#include "registry.h"

namespace rc::napi {

namespace {

InferenceOp getOp(const Napi::Object& o) {
  const std::string op = getString(o, "op");
  if (op == "conv") return InferenceOp::Conv;
  if (op == "maxpool") return InferenceOp::MaxPool;
  if (op == "globalavgpool") return InferenceOp::GlobalAvgPool;
  if (op == "linear") return InferenceOp::Linear;
  RC_THROW(code::kInvalidArgument,
           "option 'op' must be 'conv', 'maxpool', 'globalavgpool' or 'linear', got '" << op << "'");
}

// One node: { op, input, residual?, relu?, inChannels?, outChannels?, kernelH?, ..., weight?, bias?,
//             inputScale?, inputUnsigned?, weightScales? } (the windows default to 1x1, stride 1, no padding).
InferenceNode getNode(const Napi::Object& o) {
  InferenceNode n;
  n.op = getOp(o);
  n.input = getInt(o, "input");
  n.residual = getInt(o, "residual", -1);
  n.relu = getBool(o, "relu", false);
  n.inChannels = getInt(o, "inChannels", 0);
  n.outChannels = getInt(o, "outChannels", 0);
  n.kernelH = getInt(o, "kernelH", 1);
  n.kernelW = getInt(o, "kernelW", 1);
  n.strideH = getInt(o, "strideH", 1);
  n.strideW = getInt(o, "strideW", 1);
  n.padH = getInt(o, "padH", 0);
  n.padW = getInt(o, "padW", 0);
  n.dilationH = getInt(o, "dilationH", 1);
  n.dilationW = getInt(o, "dilationW", 1);
  n.weight = getFloat32Array(o, "weight", false);
  n.bias = getFloat32Array(o, "bias", false);
  n.inputScale = static_cast<float>(getNumber(o, "inputScale", 0));
  n.inputUnsigned = getBool(o, "inputUnsigned", false);
  n.weightScales = getFloat32Array(o, "weightScales", false);
  return n;
}

}  // namespace

Napi::Function InferencePlanWrap::Init(Napi::Env env) {
  return DefineClass(env, "InferencePlan",
                     {InstanceMethod<&InferencePlanWrap::Run>("run"),
                      InstanceMethod<&InferencePlanWrap::Implementation>("implementation"),
                      InstanceMethod<&InferencePlanWrap::Dispose>("dispose")});
}

// new InferencePlan({ device, dtype, int8?, n, h, w, c, nodes: [...] })
InferencePlanWrap::InferencePlanWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<InferencePlanWrap>(info) {
  guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "InferencePlan");
    InferencePlanParams p;
    p.n = getInt(o, "n");
    p.h = getInt(o, "h");
    p.w = getInt(o, "w");
    p.c = getInt(o, "c");
    p.dtype = getDType(o, "dtype");
    p.int8 = getBool(o, "int8", false);
    Napi::Value nodes = o.Get("nodes");
    RC_CHECK_ARG(nodes.IsArray(), "option 'nodes' must be an array of nodes");
    Napi::Array list = nodes.As<Napi::Array>();
    for (uint32_t i = 0; i < list.Length(); ++i) {
      Napi::Value node = list.Get(i);
      RC_CHECK_ARG(node.IsObject(), "option 'nodes'[" << i << "] must be an object");
      p.nodes.push_back(getNode(node.As<Napi::Object>()));
    }
    plan_ = backendFor(getDevice(o, "device")).createInferencePlan(p);
  });
}

Napi::Value InferencePlanWrap::Run(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "InferencePlan.run");
    if (!plan_) RC_THROW(code::kDisposed, "InferencePlan was disposed and cannot be used");
    plan_->run(getTensor(o, "x"), getTensor(o, "y"));
    return info.Env().Undefined();
  });
}

Napi::Value InferencePlanWrap::Implementation(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    if (!plan_) RC_THROW(code::kDisposed, "InferencePlan was disposed and cannot be used");
    return Napi::Value(Napi::String::New(info.Env(), plan_->implementation()));
  });
}

Napi::Value InferencePlanWrap::Dispose(const Napi::CallbackInfo& info) {
  plan_.reset();
  return info.Env().Undefined();
}

}  // namespace rc::napi
