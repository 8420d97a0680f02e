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

MemoryChannel::MemoryChannel(collectives::TcpAcceptor* acceptor, PeerAddresses addresses)
    : acceptor_(acceptor), addresses_(std::move(addresses)) {}

MemoryChannel::~MemoryChannel() = default;

std::shared_ptr<MemoryChannel::MeshState> MemoryChannel::StateFor(const std::string& mesh) {
  MutexLock lock(mu_);
  auto& s = meshes_[mesh];
  if (!s) s = std::make_shared<MeshState>();
  return s;
}

Status MemoryChannel::With(const MeshPlacement& p, std::chrono::milliseconds timeout,
                           const std::string& context, const Body& fn) {
  ++in_flight_;
  struct Leave {
    std::atomic<int64_t>* n;
    ~Leave() { --*n; }
  } leave{&in_flight_};
  std::shared_ptr<MeshState> state = StateFor(p.mesh.name);
  MutexLock lock(state->mu);
  const std::string id = GroupId("memory", p);
  // A group kept from an earlier call may have lost a peer that was replaced since
  // (a connection that broke while idle shows only once used): when such a group
  // fails, every survivor joins afresh and tries once more, while the replacement
  // waits in its first join.
  for (int attempt = 0;; ++attempt) {
    const bool reused = state->group && state->id == id && state->group->Poll().ok();
    if (!reused) {
      state->group.reset();  // says goodbye to the peers of a stale or poisoned group
      auto addresses = addresses_(p);
      if (addresses.ok()) {
        state->addresses = *addresses;
      } else if (state->id != id || state->addresses.empty()) {
        return addresses.status().WithContext(context + ": the data-port addresses of mesh " + p.mesh.name);
      }  // else tesserad is away: the addresses of the last join still hold
      state->id = id;
      collectives::TcpOptions o;
      o.rank = static_cast<int>(p.rank);
      o.size = static_cast<int>(state->addresses.size());
      o.group_id = id;
      o.connect_timeout = timeout;
      auto transport = collectives::TcpTransport::Connect(*acceptor_, state->addresses, o);
      if (!transport.ok()) {
        return NameWorkers(transport.status(), p, AllRanks(p.workers.size()),
                           context + ": joining the memory tier's group of mesh " + p.mesh.name);
      }
      state->group = std::make_unique<collectives::Group>(std::move(*transport), id);
    }
    Status st = fn(*state->group, state->addresses);
    if (st.ok()) return st;
    state->group->transport().Abort(st);
    state->group.reset();
    if (!(reused && attempt == 0 && st.code() == Code::kUnavailable)) {
      return NameWorkers(st, p, AllRanks(p.workers.size()), context);
    }
  }
}

}  // namespace tessera::worker
