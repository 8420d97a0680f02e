// The worker's whole local API, in the order its server matches routes: tensors
// (local_api.h), /healthz (Agent), the training loop (trainer_api.h) and the
// collectives (collective_api.h). Reference: docs/openapi-worker.json.
#pragma once

#include "http/router.h"
#include "worker/agent.h"
#include "worker/mesh_collectives.h"
#include "worker/tensor_store.h"

namespace tessera::worker {

void AddLocalRoutes(http::Router* router, TensorStore* store, Agent* agent,
                    MeshCollectives* collectives);

}  // namespace tessera::worker
