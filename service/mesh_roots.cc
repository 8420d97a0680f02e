#include "service/mesh_roots.h"

namespace tessera::service {

std::shared_ptr<WriteTurns> MeshRoots::TurnsOf(const std::string& mesh) {
  MutexLock lock(mu_);
  std::shared_ptr<WriteTurns>& turns = meshes_[mesh];
  if (!turns) turns = std::make_shared<WriteTurns>();
  return turns;
}

MeshRoots::Turn MeshRoots::Take(const std::string& mesh) { return Turn(mesh, TurnsOf(mesh)); }

uint64_t MeshRoots::Queued(const std::string& mesh) { return TurnsOf(mesh)->queued(); }

}  // namespace tessera::service
