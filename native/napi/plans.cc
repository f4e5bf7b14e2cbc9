// JavaScript classes for the op plans: created once per shape, executed every step.
#include "plans.h"

#include "../core/error.h"
#include "convert.h"
#include "registry.h"

namespace rc::napi {

namespace {

template <typename PlanT>
PlanT& live(const std::unique_ptr<PlanT>& plan, const char* name) {
  if (!plan) RC_THROW(code::kDisposed, name << " was disposed and cannot be used");
  return *plan;
}

}  // namespace

// ---- Conv2dPlan ----------------------------------------------------------------------------

Napi::Function Conv2dPlanWrap::Init(Napi::Env env) {
  return DefineClass(env, "Conv2dPlan",
                     {InstanceMethod<&Conv2dPlanWrap::Forward>("forward"),
                      InstanceMethod<&Conv2dPlanWrap::BackwardData>("backwardData"),
                      InstanceMethod<&Conv2dPlanWrap::BackwardWeights>("backwardWeights"),
                      InstanceMethod<&Conv2dPlanWrap::Implementation>("implementation"),
                      InstanceMethod<&Conv2dPlanWrap::Dispose>("dispose")});
}

// new Conv2dPlan({ device, dtype, n, h, w, c, k, kernelH, kernelW, strideH, strideW, padH, padW,
//                  dilationH, dilationW, bias })
Conv2dPlanWrap::Conv2dPlanWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<Conv2dPlanWrap>(info) {
  guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "Conv2dPlan");
    Conv2dParams p;
    p.n = getInt(o, "n");
    p.h = getInt(o, "h");
    p.w = getInt(o, "w");
    p.c = getInt(o, "c");
    p.k = getInt(o, "k");
    p.kernelH = getInt(o, "kernelH");
    p.kernelW = getInt(o, "kernelW");
    p.strideH = getInt(o, "strideH", 1);
    p.strideW = getInt(o, "strideW", 1);
    p.padH = getInt(o, "padH", 0);
    p.padW = getInt(o, "padW", 0);
    p.dilationH = getInt(o, "dilationH", 1);
    p.dilationW = getInt(o, "dilationW", 1);
    p.dtype = getDType(o, "dtype");
    p.bias = getBool(o, "bias", false);
    plan_ = backendFor(getDevice(o, "device")).createConv2d(p);
  });
}

Napi::Value Conv2dPlanWrap::Forward(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "Conv2dPlan.forward");
    live(plan_, "Conv2dPlan")
        .forward(getTensor(o, "x"), getTensor(o, "weight"), getTensor(o, "bias", false), getTensor(o, "y"));
    return info.Env().Undefined();
  });
}

Napi::Value Conv2dPlanWrap::BackwardData(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "Conv2dPlan.backwardData");
    Conv2dPlan& plan = live(plan_, "Conv2dPlan");
    if (getBool(o, "accumulate", false)) {
      plan.backwardDataAccumulate(getTensor(o, "dy"), getTensor(o, "weight"), getTensor(o, "dx"));
    } else {
      plan.backwardData(getTensor(o, "dy"), getTensor(o, "weight"), getTensor(o, "dx"));
    }
    return info.Env().Undefined();
  });
}

Napi::Value Conv2dPlanWrap::BackwardWeights(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "Conv2dPlan.backwardWeights");
    live(plan_, "Conv2dPlan")
        .backwardWeights(getTensor(o, "x"), getTensor(o, "dy"), getTensor(o, "dWeight"), getTensor(o, "dBias", false));
    return info.Env().Undefined();
  });
}

Napi::Value Conv2dPlanWrap::Implementation(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    return Napi::Value(Napi::String::New(info.Env(), live(plan_, "Conv2dPlan").implementation()));
  });
}

Napi::Value Conv2dPlanWrap::Dispose(const Napi::CallbackInfo& info) {
  plan_.reset();
  return info.Env().Undefined();
}

// ---- LinearPlan ----------------------------------------------------------------------------

Napi::Function LinearPlanWrap::Init(Napi::Env env) {
  return DefineClass(env, "LinearPlan",
                     {InstanceMethod<&LinearPlanWrap::Forward>("forward"),
                      InstanceMethod<&LinearPlanWrap::BackwardData>("backwardData"),
                      InstanceMethod<&LinearPlanWrap::BackwardWeights>("backwardWeights"),
                      InstanceMethod<&LinearPlanWrap::Dispose>("dispose")});
}

// new LinearPlan({ device, dtype, n, in, out, bias })
LinearPlanWrap::LinearPlanWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<LinearPlanWrap>(info) {
  guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "LinearPlan");
    LinearParams p;
    p.n = getInt(o, "n");
    p.in = getInt(o, "in");
    p.out = getInt(o, "out");
    p.dtype = getDType(o, "dtype");
    p.bias = getBool(o, "bias", true);
    plan_ = backendFor(getDevice(o, "device")).createLinear(p);
  });
}

Napi::Value LinearPlanWrap::Forward(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "LinearPlan.forward");
    live(plan_, "LinearPlan")
        .forward(getTensor(o, "x"), getTensor(o, "weight"), getTensor(o, "bias", false), getTensor(o, "y"));
    return info.Env().Undefined();
  });
}

Napi::Value LinearPlanWrap::BackwardData(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "LinearPlan.backwardData");
    live(plan_, "LinearPlan").backwardData(getTensor(o, "dy"), getTensor(o, "weight"), getTensor(o, "dx"));
    return info.Env().Undefined();
  });
}

Napi::Value LinearPlanWrap::BackwardWeights(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "LinearPlan.backwardWeights");
    live(plan_, "LinearPlan")
        .backwardWeights(getTensor(o, "x"), getTensor(o, "dy"), getTensor(o, "dWeight"), getTensor(o, "dBias", false));
    return info.Env().Undefined();
  });
}

Napi::Value LinearPlanWrap::Dispose(const Napi::CallbackInfo& info) {
  plan_.reset();
  return info.Env().Undefined();
}

// ---- Pool2dPlan ----------------------------------------------------------------------------

Napi::Function Pool2dPlanWrap::Init(Napi::Env env) {
  return DefineClass(
      env, "Pool2dPlan",
      {InstanceMethod<&Pool2dPlanWrap::Forward>("forward"), InstanceMethod<&Pool2dPlanWrap::Backward>("backward"),
       InstanceMethod<&Pool2dPlanWrap::WorkspaceBytes>("workspaceBytes"),
       InstanceMethod<&Pool2dPlanWrap::Dispose>("dispose")});
}

// new Pool2dPlan({ device, dtype, kind: 'max'|'avg', n, h, w, c, kernelH, kernelW, strideH,
//                  strideW, padH, padW })
Pool2dPlanWrap::Pool2dPlanWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<Pool2dPlanWrap>(info) {
  guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "Pool2dPlan");
    Pool2dParams p;
    const std::string kind = getString(o, "kind");
    RC_CHECK_ARG(kind == "max" || kind == "avg", "option 'kind' must be 'max' or 'avg', got '" << kind << "'");
    p.kind = kind == "max" ? PoolKind::Max : PoolKind::Avg;
    p.n = getInt(o, "n");
    p.h = getInt(o, "h");
    p.w = getInt(o, "w");
    p.c = getInt(o, "c");
    p.kernelH = getInt(o, "kernelH");
    p.kernelW = getInt(o, "kernelW");
    p.strideH = getInt(o, "strideH", p.kernelH);
    p.strideW = getInt(o, "strideW", p.kernelW);
    p.padH = getInt(o, "padH", 0);
    p.padW = getInt(o, "padW", 0);
    p.dtype = getDType(o, "dtype");
    plan_ = backendFor(getDevice(o, "device")).createPool2d(p);
  });
}

Napi::Value Pool2dPlanWrap::Forward(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "Pool2dPlan.forward");
    live(plan_, "Pool2dPlan").forward(getTensor(o, "x"), getTensor(o, "y"), getTensor(o, "workspace", false));
    return info.Env().Undefined();
  });
}

Napi::Value Pool2dPlanWrap::Backward(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "Pool2dPlan.backward");
    live(plan_, "Pool2dPlan").backward(getTensor(o, "dy"), getTensor(o, "dx"), getTensor(o, "workspace", false));
    return info.Env().Undefined();
  });
}

Napi::Value Pool2dPlanWrap::WorkspaceBytes(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    return Napi::Value(Napi::Number::New(info.Env(), static_cast<double>(live(plan_, "Pool2dPlan").workspaceBytes())));
  });
}

Napi::Value Pool2dPlanWrap::Dispose(const Napi::CallbackInfo& info) {
  plan_.reset();
  return info.Env().Undefined();
}

// ---- Communicator --------------------------------------------------------------------------

Napi::Function CommunicatorWrap::Init(Napi::Env env) {
  return DefineClass(
      env, "Communicator",
      {InstanceMethod<&CommunicatorWrap::AllReduce>("allReduce"),
       InstanceMethod<&CommunicatorWrap::Broadcast>("broadcast"),
       InstanceMethod<&CommunicatorWrap::AllGather>("allGather"), InstanceMethod<&CommunicatorWrap::Barrier>("barrier"),
       InstanceMethod<&CommunicatorWrap::WaitOnDevice>("waitOnDevice"),
       InstanceMethod<&CommunicatorWrap::Synchronize>("synchronize"),
       InstanceMethod<&CommunicatorWrap::TakeRecords>("takeRecords"), InstanceAccessor<&CommunicatorWrap::Rank>("rank"),
       InstanceAccessor<&CommunicatorWrap::Size>("size"), InstanceMethod<&CommunicatorWrap::Dispose>("dispose")});
}

namespace {

ReduceOp reduceOpArg(const Napi::Object& o) {
  if (!o.Has("op") || o.Get("op").IsUndefined()) return ReduceOp::Sum;
  const std::string op = getString(o, "op");
  if (op == "sum") return ReduceOp::Sum;
  if (op == "avg") return ReduceOp::Avg;
  if (op == "max") return ReduceOp::Max;
  RC_THROW(code::kInvalidArgument, "Communicator.allReduce: op must be 'sum', 'avg' or 'max', got '" << op << "'");
}

}  // namespace

// new Communicator({ device, backend, rank, worldSize, timeoutSeconds, uniqueId? (nccl),
//                    storeHost?, storePort?, storeToken?, storePrefix? (gloo) })
CommunicatorWrap::CommunicatorWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<CommunicatorWrap>(info) {
  guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "Communicator");
    CommunicatorParams p;
    p.backend = getString(o, "backend");
    const int64_t rank = getInt(o, "rank");
    const int64_t worldSize = getInt(o, "worldSize");
    RC_CHECK_ARG(worldSize >= 1 && worldSize <= 65536 && rank >= 0 && rank < worldSize,
                 "Communicator: rank " << rank << " is outside a world of " << worldSize);
    p.rank = static_cast<int>(rank);
    p.worldSize = static_cast<int>(worldSize);
    p.timeoutSeconds = getNumber(o, "timeoutSeconds", 1800.0);
    RC_CHECK_ARG(p.timeoutSeconds > 0, "Communicator: timeoutSeconds must be positive, got " << p.timeoutSeconds);
    if (p.backend == "nccl") p.uniqueId = getString(o, "uniqueId");
    if (p.backend == "gloo" && p.worldSize > 1) {
      p.store.host = getString(o, "storeHost");
      p.store.port = static_cast<int>(getInt(o, "storePort"));
      p.store.token = getString(o, "storeToken");
    }
    if (p.backend == "gloo") p.storePrefix = getString(o, "storePrefix");
    comm_ = backendFor(getDevice(o, "device")).createCommunicator(p);
  });
}

Napi::Value CommunicatorWrap::AllReduce(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "Communicator.allReduce");
    live(comm_, "Communicator").allReduce(getTensor(o, "tensor"), reduceOpArg(o));
    return info.Env().Undefined();
  });
}

Napi::Value CommunicatorWrap::Broadcast(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "Communicator.broadcast");
    live(comm_, "Communicator").broadcast(getTensor(o, "tensor"), static_cast<int>(getInt(o, "root", 0)));
    return info.Env().Undefined();
  });
}

Napi::Value CommunicatorWrap::AllGather(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "Communicator.allGather");
    live(comm_, "Communicator").allGather(getTensor(o, "input"), getTensor(o, "output"));
    return info.Env().Undefined();
  });
}

Napi::Value CommunicatorWrap::Barrier(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    live(comm_, "Communicator").barrier();
    return info.Env().Undefined();
  });
}

Napi::Value CommunicatorWrap::WaitOnDevice(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    live(comm_, "Communicator").waitOnDevice();
    return info.Env().Undefined();
  });
}

Napi::Value CommunicatorWrap::Synchronize(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "Communicator.synchronize");
    const double timeout = getNumber(o, "timeoutSeconds", 1800.0);
    RC_CHECK_ARG(timeout > 0, "Communicator.synchronize: timeoutSeconds must be positive, got " << timeout);
    live(comm_, "Communicator").synchronize(timeout);
    return info.Env().Undefined();
  });
}

// [{ op, bytes, enqueuedMs, startMs, endMs }] of the collectives finished since the last call.
Napi::Value CommunicatorWrap::TakeRecords(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    const std::vector<CollectiveRecord> records = live(comm_, "Communicator").takeRecords();
    Napi::Env env = info.Env();
    Napi::Array out = Napi::Array::New(env, records.size());
    for (size_t i = 0; i < records.size(); ++i) {
      Napi::Object r = Napi::Object::New(env);
      r.Set("op", records[i].op);
      r.Set("bytes", static_cast<double>(records[i].bytes));
      r.Set("enqueuedMs", records[i].enqueuedMs);
      r.Set("startMs", records[i].startMs);
      r.Set("endMs", records[i].endMs);
      out.Set(static_cast<uint32_t>(i), r);
    }
    return Napi::Value(out);
  });
}

Napi::Value CommunicatorWrap::Rank(const Napi::CallbackInfo& info) {
  return guarded(info.Env(),
                 [&] { return Napi::Value(Napi::Number::New(info.Env(), live(comm_, "Communicator").rank())); });
}

Napi::Value CommunicatorWrap::Size(const Napi::CallbackInfo& info) {
  return guarded(info.Env(),
                 [&] { return Napi::Value(Napi::Number::New(info.Env(), live(comm_, "Communicator").size())); });
}

Napi::Value CommunicatorWrap::Dispose(const Napi::CallbackInfo& info) {
  comm_.reset();
  return info.Env().Undefined();
}

}  // namespace rc::napi
