// The CUDA backend's plan constructors and the NCCL communicator.
#pragma once

#include "cuda_context.h"

namespace rc::cuda {

std::unique_ptr<Conv2dPlan> createConv2dPlan(CudaContext& ctx, const Conv2dParams& params);
std::unique_ptr<LinearPlan> createLinearPlan(CudaContext& ctx, const LinearParams& params);
std::unique_ptr<Pool2dPlan> createPool2dPlan(CudaContext& ctx, const Pool2dParams& params);
std::unique_ptr<InferencePlan> buildInferencePlan(CudaContext& ctx, const InferencePlanParams& params);
std::string createNcclUniqueId();
std::unique_ptr<Communicator> createNcclCommunicator(CudaContext& ctx, const CommunicatorParams& params);

}  // namespace rc::cuda
