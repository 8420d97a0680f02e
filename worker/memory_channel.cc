#include "worker/memory_channel.h"

#include <cstdio>

namespace tessera::worker {
namespace {

std::vector<int64_t> AllRanks(size_t n) {
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<int64_t>(i);
  return out;
}

}  // namespace

MemoryChannel::MemoryChannel(collectives::TcpAcceptor* acceptor, PeerAddresses addresses, size_t full_mesh_max)
    : acceptor_(acceptor), addresses_(std::move(addresses)), full_mesh_max_(full_mesh_max) {}

MemoryChannel::~MemoryChannel() = default;

MemoryChannel::Lease MemoryChannel::Take(const std::string& mesh) {
  MutexLock lock(mu_);
  while (meshes_[mesh].leased) given_back_.Wait(mu_);
  MeshState& state = meshes_[mesh];
  state.leased = true;
  return std::move(state.kept);
}

void MemoryChannel::Give(const std::string& mesh, Lease lease) {
  {
    MutexLock lock(mu_);
    MeshState& state = meshes_[mesh];
    state.kept = std::move(lease);
    state.leased = false;
  }
  given_back_.NotifyAll();
}

Status MemoryChannel::With(const MeshPlacement& p, std::chrono::milliseconds timeout,
                           const std::string& context, const Body& fn) {
  ++in_flight_;
  struct Leave {
    std::atomic<int64_t>* n;
    ~Leave() { --*n; }
  } leave{&in_flight_};
  Lease lease = Take(p.mesh.name);
  Status st = Run(p, timeout, context, fn, lease);
  Give(p.mesh.name, std::move(lease));
  return st;
}

Status MemoryChannel::Run(const MeshPlacement& p, std::chrono::milliseconds timeout, const std::string& context,
                          const Body& fn, Lease& lease) {
  const std::string id = GroupId("memory", p);
  // A group kept from an earlier call may have lost a peer that was replaced since
  // (a connection that broke while idle shows only once used): when such a group
  // fails, every survivor joins afresh and tries once more, while the replacement
  // waits in its first join.
  for (int attempt = 0;; ++attempt) {
    const bool reused = lease.group && lease.id == id && lease.group->Poll().ok();
    if (!reused) {
      lease.group.reset();  // says goodbye to the peers of a stale or poisoned group
      auto addresses = addresses_(p);
      if (addresses.ok()) {
        lease.addresses = *addresses;
      } else if (lease.id != id || lease.addresses.empty()) {
        return addresses.status().WithContext(context + ": the data-port addresses of mesh " + p.mesh.name);
      }  // else tesserad is away: the addresses of the last join still hold
      lease.id = id;
      collectives::TcpOptions o;
      o.rank = static_cast<int>(p.rank);
      o.size = static_cast<int>(lease.addresses.size());
      o.group_id = id;
      o.connect_timeout = timeout;
      o.connect_all = lease.addresses.size() <= full_mesh_max_;
      auto transport = collectives::TcpTransport::Connect(*acceptor_, lease.addresses, o);
      if (!transport.ok()) {
        return NameWorkers(transport.status(), p, AllRanks(p.workers.size()),
                           context + ": joining the memory tier's group of mesh " + p.mesh.name);
      }
      lease.group = std::make_unique<collectives::Group>(std::move(*transport), id);
      if (!o.connect_all) {
        std::fprintf(stderr,
                     "memory tier of mesh %s: %zu workers, more than --memory-full-mesh-max %zu: its group "
                     "connects the pairs its exchanges use\n",
                     p.mesh.name.c_str(), lease.addresses.size(), full_mesh_max_);
      }
    }
    Status st = fn(*lease.group, lease.addresses);
    if (st.ok()) return st;
    lease.group->transport().Abort(st);
    lease.group.reset();
    if (!(reused && attempt == 0 && st.code() == Code::kUnavailable)) {
      return NameWorkers(st, p, AllRanks(p.workers.size()), context);
    }
  }
}

}  // namespace tessera::worker
