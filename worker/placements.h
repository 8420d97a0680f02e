// The placements of the meshes this worker belongs to, as tesserad pushes them (its
// registration answer and long-poll answers carry the worker's meshes whenever they
// change) or as a lookup of a mesh not heard of yet fetched one. They have no age: a
// mesh's placement changes only when it is registered again, which tesserad pushes, so a
// trainer's save never waits on tesserad for one. One lock of its own.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "api/json_codec.h"
#include "api/status.h"
#include "api/thread_annotations.h"
#include "worker/mesh_placement.h"

namespace tessera::worker {

// Worker `worker`'s placement in `mesh`, the mesh as GET /api/v1/meshes/{m} gives it
// (with `workers`); conflict when the worker is not part of it.
Result<MeshPlacement> PlacementOf(const Json& mesh, const std::string& worker);

class Placements {
 public:
  std::optional<MeshPlacement> Find(const std::string& mesh) const;
  void Put(const std::string& mesh, MeshPlacement p);
  void Forget(const std::string& mesh);
  // Every placement becomes those of `meshes` (pushed: a JSON array of meshes), the rest
  // go (deleted meshes). A mesh that cannot be read, or lacks `worker`, is skipped and
  // named in the error; the others are taken.
  Status ReplaceAll(const Json& meshes, const std::string& worker);
  std::vector<std::string> Names() const;  // by name

 private:
  mutable Mutex mu_;
  std::map<std::string, MeshPlacement> by_mesh_ GUARDED_BY(mu_);
};

}  // namespace tessera::worker
