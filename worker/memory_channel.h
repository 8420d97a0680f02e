// The memory tier's own TCP group per mesh (docs/memory-tier.md), apart from the
// collectives' so that a checkpoint's transfers never queue behind the trainer's
// collectives or the reverse. Joined through the data port like them, and
// authenticated the same way; its id is "memory/<mesh>#<hash of the mesh's
// definition and workers>". The mesh's data-port addresses are kept from the last
// join, so a group lost while tesserad is away can be joined again without it.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "api/status.h"
#include "api/thread_annotations.h"
#include "collectives/group.h"
#include "collectives/transport/tcp/tcp_transport.h"
#include "worker/mesh_collectives.h"
#include "worker/mesh_placement.h"

namespace tessera::worker {

class MemoryChannel {
 public:
  // `acceptor` (the worker's data port) must outlive this object.
  MemoryChannel(collectives::TcpAcceptor* acceptor, PeerAddresses addresses);
  ~MemoryChannel();
  MemoryChannel(const MemoryChannel&) = delete;
  MemoryChannel& operator=(const MemoryChannel&) = delete;

  // Runs `fn` on `p`'s mesh group (joined, or joined again when absent, poisoned or
  // of another membership), with the members' addresses by rank; one call per mesh
  // at a time. A failure of `fn` aborts the group, so its peers stop waiting at
  // once, and the next call joins a fresh one. Errors say `context` and name workers.
  using Body = std::function<Status(collectives::Group& group, const std::vector<std::string>& addresses)>;
  Status With(const MeshPlacement& p, std::chrono::milliseconds timeout, const std::string& context,
              const Body& fn);
  // Calls of With in progress (joining included): the worker's /healthz counts them
  // with its collectives, since a restore's agreement is one.
  int64_t in_flight() const { return in_flight_.load(); }

 private:
  struct MeshState {
    Mutex mu;  // one use of the mesh's group at a time
    std::string id GUARDED_BY(mu);
    std::vector<std::string> addresses GUARDED_BY(mu);
    std::unique_ptr<collectives::Group> group GUARDED_BY(mu);
  };
  std::shared_ptr<MeshState> StateFor(const std::string& mesh);

  collectives::TcpAcceptor* acceptor_;
  PeerAddresses addresses_;
  std::atomic<int64_t> in_flight_{0};
  Mutex mu_;
  std::map<std::string, std::shared_ptr<MeshState>> meshes_ GUARDED_BY(mu_);
};

}  // namespace tessera::worker
