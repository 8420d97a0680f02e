// The training loop's routes of the worker's local API (/v1/save, /v1/saves/{step},
// /v1/restore, /v1/checkpoints, /v1/checkpoints/{step}, /v1/preemption), behind the
// worker's local credential like every other local route.
#pragma once

#include "http/router.h"
#include "worker/agent.h"

namespace tessera::worker {

void AddTrainerRoutes(http::Router* router, Agent* agent);

}  // namespace tessera::worker
