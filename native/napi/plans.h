#pragma once

#include <napi.h>

#include <memory>

#include "../core/backend.h"

namespace rc::napi {

class Conv2dPlanWrap : public Napi::ObjectWrap<Conv2dPlanWrap> {
 public:
  static Napi::Function Init(Napi::Env env);
  explicit Conv2dPlanWrap(const Napi::CallbackInfo& info);

 private:
  Napi::Value Forward(const Napi::CallbackInfo& info);
  Napi::Value BackwardData(const Napi::CallbackInfo& info);
  Napi::Value BackwardWeights(const Napi::CallbackInfo& info);
  Napi::Value Implementation(const Napi::CallbackInfo& info);
  Napi::Value Dispose(const Napi::CallbackInfo& info);
  std::unique_ptr<Conv2dPlan> plan_;
};

class LinearPlanWrap : public Napi::ObjectWrap<LinearPlanWrap> {
 public:
  static Napi::Function Init(Napi::Env env);
  explicit LinearPlanWrap(const Napi::CallbackInfo& info);

 private:
  Napi::Value Forward(const Napi::CallbackInfo& info);
  Napi::Value BackwardData(const Napi::CallbackInfo& info);
  Napi::Value BackwardWeights(const Napi::CallbackInfo& info);
  Napi::Value Dispose(const Napi::CallbackInfo& info);
  std::unique_ptr<LinearPlan> plan_;
};

class Pool2dPlanWrap : public Napi::ObjectWrap<Pool2dPlanWrap> {
 public:
  static Napi::Function Init(Napi::Env env);
  explicit Pool2dPlanWrap(const Napi::CallbackInfo& info);

 private:
  Napi::Value Forward(const Napi::CallbackInfo& info);
  Napi::Value Backward(const Napi::CallbackInfo& info);
  Napi::Value WorkspaceBytes(const Napi::CallbackInfo& info);
  Napi::Value Dispose(const Napi::CallbackInfo& info);
  std::unique_ptr<Pool2dPlan> plan_;
};

// A collective-communication group (NCCL on CUDA devices, Gloo on the CPU).
class CommunicatorWrap : public Napi::ObjectWrap<CommunicatorWrap> {
 public:
  static Napi::Function Init(Napi::Env env);
  explicit CommunicatorWrap(const Napi::CallbackInfo& info);

 private:
  Napi::Value AllReduce(const Napi::CallbackInfo& info);
  Napi::Value Broadcast(const Napi::CallbackInfo& info);
  Napi::Value AllGather(const Napi::CallbackInfo& info);
  Napi::Value Barrier(const Napi::CallbackInfo& info);
  Napi::Value WaitOnDevice(const Napi::CallbackInfo& info);
  Napi::Value Synchronize(const Napi::CallbackInfo& info);
  Napi::Value TakeRecords(const Napi::CallbackInfo& info);
  Napi::Value Rank(const Napi::CallbackInfo& info);
  Napi::Value Size(const Napi::CallbackInfo& info);
  Napi::Value Dispose(const Napi::CallbackInfo& info);
  std::unique_ptr<Communicator> comm_;
};

}  // namespace rc::napi
