// What a worker knows about a mesh it belongs to: the mesh, its rank in it and
// the global device ids it owns (rank * devices_per_worker + i).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "api/mesh.h"
#include "api/status.h"

namespace tessera::worker {

struct MeshPlacement {
  Mesh mesh;
  int64_t rank = 0;
  std::vector<int64_t> devices;  // ascending
  std::vector<std::string> workers;  // the mesh's worker ids by rank (may be empty in tests)
  // Which registration of the mesh this is (tesserad's created_at, ms): a mesh deleted
  // and registered again under its name is another mesh to the memory tier.
  int64_t registration = 0;

  bool Owns(int64_t device) const {
    return device >= rank * mesh.devices_per_worker &&
           device < (rank + 1) * mesh.devices_per_worker;
  }
};

// Looks a mesh up (from tesserad, cached). not_found for unknown meshes;
// failed_precondition-like conflict when this worker is not part of it.
using MeshResolver = std::function<Result<MeshPlacement>(const std::string& mesh)>;

}  // namespace tessera::worker
