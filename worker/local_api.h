// The tensor routes of a worker's local API (docs/openapi-worker.json, "Tensors"): how the
// trainer on this host pushes, maps, reads, lists and drops its tensors.
// The local API binds loopback only, and every route but /healthz needs the
// worker's local credential as a bearer token (http/local_credential.h).
#pragma once

#include "http/router.h"
#include "worker/tensor_store.h"

namespace tessera::worker {

// Registers on `router`:
//   POST   /v1/tensors/{name+}/mapping?mesh=&device=&dtype=&shape=&layout=
//          → {"path", "bytes", "local_shape"}
//   PUT    /v1/tensors/{name+}?mesh=&device=&dtype=&shape=&layout=  (raw shard) → 204
//   GET    /v1/tensors/{name+}?mesh=&device=  → raw shard with headers X-Tessera-Dtype,
//          X-Tessera-Shape (global), X-Tessera-Layout, X-Tessera-Local-Shape
//   GET    /v1/tensors  → [{name, mesh, dtype, shape, layout, devices, mapped}]
//   DELETE /v1/tensors/{name+}?mesh=  → 204
// `shape` is the global shape ("8,4"; empty for a scalar), `layout` one entry per
// dimension ("data,unsharded"). A missing or malformed parameter is 400 naming it.
// `store` must outlive the router.
void AddTensorRoutes(http::Router* router, TensorStore* store);

}  // namespace tessera::worker
