// The memory tier's own TCP group per mesh (docs/memory-tier.md), apart from the
// collectives' so that a checkpoint's transfers never queue behind the trainer's
// collectives or the reverse. Joined through the data port like them, and
// authenticated the same way; its id is "memory/<mesh>#<hash of the mesh's
// definition and workers>". The mesh's data-port addresses are kept from the last
// join, so a group lost while tesserad is away can be joined again without it.
// A mesh's group has one owner at a time, the call of With that leased it; no lock is
// held while it joins, looks addresses up or exchanges.
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
  // A mesh of more workers than this joins its group without the full mesh: each
  // exchange connects the pairs it uses (TcpTransport::Reach), so a worker holds
  // connections to its layout's peers and its neighbours in the agreement's tree.
  static constexpr size_t kDefaultFullMeshMax = 64;

  // `acceptor` (the worker's data port) must outlive this object.
  MemoryChannel(collectives::TcpAcceptor* acceptor, PeerAddresses addresses,
                size_t full_mesh_max = kDefaultFullMeshMax);
  ~MemoryChannel();
  MemoryChannel(const MemoryChannel&) = delete;
  MemoryChannel& operator=(const MemoryChannel&) = delete;

  // Runs `fn` on `p`'s mesh group (joined, or joined again when absent, poisoned or
  // of another membership), with the members' addresses by rank; one call per mesh
  // at a time (another waits for the group's lease). A failure of `fn` aborts the group, so its peers stop waiting at
  // once, and the next call joins a fresh one. Errors say `context` and name workers.
  using Body = std::function<Status(collectives::Group& group, const std::vector<std::string>& addresses)>;
  Status With(const MeshPlacement& p, std::chrono::milliseconds timeout, const std::string& context,
              const Body& fn);
  // Calls of With in progress (joining included): the worker's /healthz counts them
  // with its collectives, since a restore's agreement is one.
  int64_t in_flight() const { return in_flight_.load(); }

 private:
  // What a call of With owns while it runs: the mesh's group and its join's addresses.
  struct Lease {
    std::string id;
    std::vector<std::string> addresses;
    std::unique_ptr<collectives::Group> group;
  };
  struct MeshState {
    bool leased = false;  // a call of With holds `kept`'s contents
    Lease kept;           // between calls
  };
  // Waits until no other call holds `mesh`'s group, then hands it over.
  Lease Take(const std::string& mesh) EXCLUDES(mu_);
  // Hands the group back for the next call.
  void Give(const std::string& mesh, Lease lease) EXCLUDES(mu_);
  // The body of With on a leased group.
  Status Run(const MeshPlacement& p, std::chrono::milliseconds timeout, const std::string& context,
             const Body& fn, Lease& lease);

  collectives::TcpAcceptor* acceptor_;
  PeerAddresses addresses_;
  const size_t full_mesh_max_;
  std::atomic<int64_t> in_flight_{0};
  Mutex mu_;
  CondVar given_back_;
  std::map<std::string, MeshState> meshes_ GUARDED_BY(mu_);
};

}  // namespace tessera::worker
