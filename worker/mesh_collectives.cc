#include "worker/mesh_collectives.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <utility>

#include "collectives/batch_all_reduce.h"
#include "collectives/collectives.h"
#include "collectives/hash.h"
#include "collectives/hierarchical_all_reduce.h"
#include "collectives/sparse_all_reduce.h"
#include "collectives/transport/subset_transport.h"
#include "worker/device_groups.h"
#include "worker/device_ops.h"

namespace tessera::worker {

using collectives::Group;
using collectives::Tensor;

struct MeshCollectives::MeshState {
  Mutex mu;  // one collective of this mesh at a time
  std::string group_id;
  std::unique_ptr<Group> group;
  std::map<std::vector<int64_t>, std::unique_ptr<Group>> subgroups;  // by member ranks
  // For Abort, which must not wait for mu: the running call's job and transport.
  Mutex abort_mu;
  std::string running_job GUARDED_BY(abort_mu);
  collectives::Transport* transport GUARDED_BY(abort_mu) = nullptr;
  // Jobs aborted lately: the abort can overtake the task, or find its call joining
  // a new group with no transport to stop; the call checks before it runs.
  std::deque<std::pair<std::string, Status>> aborted GUARDED_BY(abort_mu);  // newest last
};

std::string GroupId(const std::string& prefix, const MeshPlacement& p) {
  std::string def = p.mesh.ToString() + "/" + std::to_string(p.mesh.devices_per_worker);
  for (const std::string& w : p.workers) def += "/" + w;
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx",
                static_cast<unsigned long long>(collectives::HashString(def)));
  return prefix + "/" + p.mesh.name + "#" + hex;
}

MeshCollectives::MeshCollectives(collectives::TcpAcceptor* acceptor, PeerAddresses addresses)
    : acceptor_(acceptor), addresses_(std::move(addresses)) {}

MeshCollectives::~MeshCollectives() = default;

void MeshCollectives::Abort(const std::string& mesh, const std::string& job, const Status& reason) {
  if (job.empty()) return;
  std::shared_ptr<MeshState> state = StateFor(mesh);
  MutexLock lock(state->abort_mu);
  if (state->running_job == job && state->transport != nullptr) state->transport->Abort(reason);
  // Also remembered: the call may not have begun here yet, or be joining a new
  // group (no transport to abort, or a stale one); it checks before it runs.
  state->aborted.emplace_back(job, reason);
  if (state->aborted.size() > 64) state->aborted.pop_front();
}

std::string MeshCollectives::WorkerName(const MeshPlacement& p, int64_t rank) {
  if (rank >= 0 && rank < static_cast<int64_t>(p.workers.size())) return p.workers[rank];
  return "rank " + std::to_string(rank);
}

std::shared_ptr<MeshCollectives::MeshState> MeshCollectives::StateFor(const std::string& mesh) {
  MutexLock lock(mu_);
  auto& state = meshes_[mesh];
  if (!state) state = std::make_shared<MeshState>();
  return state;
}

Result<Group*> MeshCollectives::MeshGroup(MeshState& state, const MeshPlacement& p,
                                          std::chrono::milliseconds timeout) {
  const std::string id = GroupId("mesh", p);
  if (state.group && state.group_id == id && state.group->Poll().ok()) return state.group.get();
  state.subgroups.clear();
  {
    MutexLock lock(state.abort_mu);
    state.transport = nullptr;
  }
  state.group.reset();  // says goodbye to the peers of a stale or poisoned group
  ASSIGN_OR_RETURN(std::vector<std::string> addresses, addresses_(p));
  collectives::TcpOptions o;
  o.rank = static_cast<int>(p.rank);
  o.size = static_cast<int>(addresses.size());
  o.group_id = id;
  o.connect_timeout = timeout;
  ASSIGN_OR_RETURN(auto transport, collectives::TcpTransport::Connect(*acceptor_, addresses, o));
  state.group = std::make_unique<Group>(std::move(transport), id);
  state.group_id = id;
  MutexLock lock(state.abort_mu);
  state.transport = &state.group->transport();
  return state.group.get();
}

Result<Group*> MeshCollectives::Subgroup(MeshState& state, const std::vector<int64_t>& ranks) {
  if (static_cast<int>(ranks.size()) == state.group->size()) return state.group.get();
  auto& sub = state.subgroups[ranks];
  if (!sub) {
    std::vector<int> members(ranks.begin(), ranks.end());
    std::string id = state.group_id + "[";
    for (int64_t r : ranks) id += (id.back() == '[' ? "" : ",") + std::to_string(r);
    ASSIGN_OR_RETURN(auto view,
                     collectives::SubsetTransport::Create(&state.group->transport(), members));
    sub = std::make_unique<Group>(std::move(view), id + "]");
  }
  return sub.get();
}

Result<CollectiveResult> MeshCollectives::Run(const MeshPlacement& p, const CollectiveRequest& r,
                                              std::vector<Tensor> inputs) {
  ++in_flight_;
  struct Leave {
    std::atomic<int64_t>* n;
    ~Leave() { --*n; }
  } leave{&in_flight_};
  const std::string op(CollectiveOpName(r.op));
  const size_t expected = (r.process_level() ? 1 : p.devices.size()) * r.inputs_per_device();
  if (inputs.size() != expected) {
    return InvalidArgument(op + " takes " + std::to_string(expected) + " input(s) on this worker, " +
                           "got " + std::to_string(inputs.size()));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    RETURN_IF_ERROR(inputs[i].Validate("input " + std::to_string(i)));
  }
  if (!r.process_level() && r.op != CollectiveOp::kBarrier) {
    RETURN_IF_ERROR(CheckDeviceOp(p.mesh, r));
  }
  std::shared_ptr<MeshState> state = StateFor(p.mesh.name);
  MutexLock lock(state->mu);
  struct Running {  // marks the call abortable for its job
    MeshState& s;
    const std::string job;
    Running(MeshState& state, const std::string& j) : s(state), job(j) {
      MutexLock l(s.abort_mu);
      s.running_job = job;
    }
    ~Running() {
      MutexLock l(s.abort_mu);
      s.running_job.clear();
    }
    // Why the job was aborted, if it was (before this call began, or since).
    Status Aborted() {
      MutexLock l(s.abort_mu);
      for (const auto& [j, reason] : s.aborted) {
        if (!job.empty() && j == job) return reason;
      }
      return Status::Ok();
    }
  } running(*state, r.job);
  RETURN_IF_ERROR(running.Aborted());
  const std::string context = op + " on mesh '" + p.mesh.name + "'";
  std::vector<int64_t> all_ranks(static_cast<size_t>(p.mesh.num_workers()));
  for (size_t i = 0; i < all_ranks.size(); ++i) all_ranks[i] = static_cast<int64_t>(i);
  auto group = MeshGroup(*state, p, std::chrono::milliseconds(r.timeout_ms));
  if (!group.ok()) return NameWorkers(group.status(), p, all_ranks, context + ": joining the mesh");
  // An abort that came while this worker joined a new group found no transport
  // to stop: the call ends here, and the group it joined stays usable.
  RETURN_IF_ERROR(running.Aborted());

  if (!r.process_level() && r.op != CollectiveOp::kBarrier) {
    return RunDeviceOp(*state, p, r, inputs);
  }
  Result<CollectiveResult> out = RunProcessOp(**group, p, r, inputs);
  if (!out.ok()) return NameWorkers(out.status(), p, all_ranks, context);
  return out;
}

Result<CollectiveResult> MeshCollectives::RunProcessOp(Group& group, const MeshPlacement& p,
                                                       const CollectiveRequest& r,
                                                       std::vector<Tensor>& inputs) {
  CollectiveResult out;
  const std::chrono::milliseconds timeout(r.timeout_ms);
  switch (r.op) {
    case CollectiveOp::kBarrier: {
      collectives::BarrierOptions o;
      o.timeout = timeout;
      o.name = r.name;
      o.local_devices = r.local_devices >= 0 ? r.local_devices : p.mesh.devices_per_worker;
      o.mesh_size = p.mesh.num_devices();
      RETURN_IF_ERROR(collectives::Barrier(group, o));
      return out;
    }
    case CollectiveOp::kBroadcastOneToAll: {
      // multihost_utils: non-sources contribute zeros to a sum (bool: an or).
      Tensor x = std::move(inputs[0]);
      if (!r.is_source.value_or(p.rank == 0)) std::fill(x.data.begin(), x.data.end(), 0);
      collectives::AllReduceOptions o;
      o.timeout = timeout;
      o.op = x.dtype == DType::kBool ? collectives::ReduceOp::kMax : collectives::ReduceOp::kSum;
      RETURN_IF_ERROR(collectives::AllReduce(group, x, o));
      out.outputs.push_back(std::move(x));
      return out;
    }
    case CollectiveOp::kProcessAllGather: {
      collectives::AllGatherOptions o;
      o.timeout = timeout;
      o.tiled = r.tiled;
      ASSIGN_OR_RETURN(Tensor gathered, collectives::AllGather(group, inputs[0], o));
      out.outputs.push_back(std::move(gathered));
      return out;
    }
    default:
      return Internal("not a process-level collective");
  }
}

Result<CollectiveResult> MeshCollectives::RunDeviceOp(MeshState& state, const MeshPlacement& p,
                                                      const CollectiveRequest& r,
                                                      std::vector<Tensor>& inputs) {
  const Mesh& mesh = p.mesh;
  ASSIGN_OR_RETURN(std::vector<std::string> axes, NormalizeAxes(mesh, r.axes));
  const std::string op(CollectiveOpName(r.op));
  const std::chrono::milliseconds timeout(r.timeout_ms);
  CollectiveResult out;
  const bool has_outputs = r.op != CollectiveOp::kAssertEqual;
  if (has_outputs) out.outputs.resize(inputs.size());
  const int64_t base = p.rank * mesh.devices_per_worker;

  for (const DeviceGroup& g : DeviceGroups(mesh, axes)) {
    const int64_t count = g.CountOn(mesh, p.rank);
    if (count == 0) continue;
    const int64_t n = static_cast<int64_t>(g.devices.size());
    const int64_t position = g.FirstPositionOn(mesh, p.rank);
    const size_t first = static_cast<size_t>(g.devices[position] - base);
    const std::string context = op + " on mesh '" + mesh.name + "' along [" + Join(axes) +
                                "], devices " + std::to_string(g.devices.front()) + ".." +
                                std::to_string(g.devices.back());
    ASSIGN_OR_RETURN(Group * sub, Subgroup(state, g.workers));
    if (r.op == CollectiveOp::kBatchAllReduce) {
      Status st = BatchOnGroup(*sub, g, n, count, first, r, inputs, out.outputs);
      if (!st.ok()) return NameWorkers(st, p, g.workers, context);
      continue;
    }
    if (r.op == CollectiveOp::kSparseAllReduce) {
      out.paths.resize(p.devices.size());
      Status st = SparseOnGroup(*sub, g, position, count, first, r, inputs, out);
      if (!st.ok()) return NameWorkers(st, p, g.workers, context);
      continue;
    }
    std::vector<Tensor> local(inputs.begin() + static_cast<ptrdiff_t>(first),
                              inputs.begin() + static_cast<ptrdiff_t>(first + count));
    const OnGroup on{r, p, g, *sub, n, count, position, timeout};
    if (r.op == CollectiveOp::kAssertEqual) RETURN_IF_ERROR(LocalDevicesAgree(on, local, context));
    auto results = DeviceOpOf(r.op)(on, local);
    Status st = results.status();
    if (!st.ok()) return NameWorkers(st, p, g.workers, context);
    for (size_t i = 0; i < results->size(); ++i) out.outputs[first + i] = std::move((*results)[i]);
  }
  return out;
}

Status MeshCollectives::BatchOnGroup(Group& sub, const DeviceGroup& g, int64_t n, int64_t count,
                                     size_t first, const CollectiveRequest& r,
                                     std::vector<Tensor>& inputs, std::vector<Tensor>& outputs) {
  const size_t k = r.shapes.size();
  if (static_cast<int64_t>(g.workers.size()) == n) {  // one device per worker: pack
    collectives::BatchAllReduceOptions o;
    o.timeout = std::chrono::milliseconds(r.timeout_ms);
    o.op = r.reduce;
    o.check_inf_nan = r.check_inf_nan;
    o.bytes_per_pack = r.bytes_per_pack;
    std::span<Tensor> mine(inputs.data() + first * k, k);
    RETURN_IF_ERROR(collectives::BatchAllReduce(sub, mine, o));
    for (size_t i = 0; i < k; ++i) outputs[first * k + i] = std::move(mine[i]);
    return Status::Ok();
  }
  for (size_t i = 0; i < k; ++i) {  // several local devices: tensor by tensor, hierarchically
    std::vector<Tensor> local;
    for (int64_t d = 0; d < count; ++d) local.push_back(std::move(inputs[(first + d) * k + i]));
    collectives::HierarchicalAllReduceOptions o;
    o.timeout = std::chrono::milliseconds(r.timeout_ms);
    o.op = r.reduce;
    o.check_inf_nan = r.check_inf_nan;
    o.total_devices = n;
    RETURN_IF_ERROR(collectives::HierarchicalAllReduce(sub, local, o));
    for (int64_t d = 0; d < count; ++d) outputs[(first + d) * k + i] = std::move(local[d]);
  }
  return Status::Ok();
}

Status NameWorkers(const Status& status, const MeshPlacement& p, const std::vector<int64_t>& ranks,
                   const std::string& context) {
  auto worker_of = [&](const Json& rank) -> Json {
    if (!rank.is_number_integer()) return nullptr;
    int64_t r = rank.get<int64_t>();
    if (r < 0 || r >= static_cast<int64_t>(ranks.size())) return nullptr;
    return MeshCollectives::WorkerName(p, ranks[r]);
  };
  Json details = status.details().is_object() ? status.details() : Json::object();
  for (const char* key : {"missing_ranks", "differing_ranks", "mismatched_ranks", "invalid_ranks"}) {
    if (!details.contains(key) || !details[key].is_array()) continue;
    Json workers = Json::array();
    for (const Json& r : details[key]) workers.push_back(worker_of(r));
    details[std::string(key).replace(std::strlen(key) - 5, 5, "workers")] = workers;
  }
  for (const char* key : {"peer_rank", "aborted_by"}) {
    if (details.contains(key)) {
      details[std::string(key) == "peer_rank" ? "peer_worker" : "aborted_by_worker"] =
          worker_of(details[key]);
    }
  }
  std::string legend;
  for (size_t i = 0; i < ranks.size(); ++i) {
    legend += (i == 0 ? "" : ", ") + std::to_string(i) + "=" + MeshCollectives::WorkerName(p, ranks[i]);
  }
  details["mesh"] = p.mesh.name;
  return Status(status.code(),
                context + ": " + status.message() + " [group ranks: " + legend + "]",
                std::move(details));
}

}  // namespace tessera::worker
