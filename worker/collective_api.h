// The collectives routes of a worker's local API (docs/openapi-worker.json): SPMD calls a trainer
// makes on every worker of a mesh at once.
//   POST /v1/collectives/{op}?mesh=&axes=&dtype=&shape=&reduce=&tiled=&root=&...
//        body = this worker's local-device inputs of `shape`, concatenated in
//        device order (process-level ops broadcast_one_to_all / process_allgather:
//        one value; SplitInputs); answers the outputs the same way, with headers
//        X-Tessera-Dtype, X-Tessera-Shape (one output's) and X-Tessera-Outputs.
//        sparse_all_reduce answers each device's values then indices, with
//        X-Tessera-Rows, -Sparse-Path, -Index-Dtype and -Dense-Shape.
//   POST /v1/barriers/{name+}?mesh=&timeout_ms=  sync_global_devices(name)
#pragma once

#include "http/router.h"
#include "worker/mesh_collectives.h"
#include "worker/mesh_placement.h"

namespace tessera::worker {

void AddCollectiveRoutes(http::Router* router, MeshResolver resolver,
                         MeshCollectives* collectives);

}  // namespace tessera::worker
