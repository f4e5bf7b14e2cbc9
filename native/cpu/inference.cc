// The inference plan on this backend (native/core/inference_plan.h).
#include "../core/error.h"
#include "cpu_ops.h"

namespace rc::cpu {

std::unique_ptr<InferencePlan> buildInferencePlan(CpuContext&, const InferencePlanParams&) {
  RC_THROW(code::kBackendUnavailable, "the inference plan is not built for this backend yet");
}

}  // namespace rc::cpu
