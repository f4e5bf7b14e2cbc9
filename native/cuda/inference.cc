// The inference plan on this backend (native/core/inference_plan.h).
#include "../core/error.h"
#include "cuda_ops.h"

namespace rc::cuda {

std::unique_ptr<InferencePlan> buildInferencePlan(CudaContext&, const InferencePlanParams&) {
  RC_THROW(code::kBackendUnavailable, "the inference plan is not built for this backend yet");
}

}  // namespace rc::cuda
