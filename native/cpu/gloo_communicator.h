// The CPU backend's process group: Gloo over TCP, rendezvous through the job's TCP store.
#pragma once

#include <memory>

#include "../core/backend.h"

namespace rc::cpu {

// Joins the group described by `params` (backend "gloo"): connects to the store (world size > 1),
// exchanges addresses under params.storePrefix and connects to every other rank, all within
// params.timeoutSeconds; throws code::kDistributed naming what did not arrive.
std::unique_ptr<Communicator> createGlooCommunicator(const CommunicatorParams& params);

}  // namespace rc::cpu
