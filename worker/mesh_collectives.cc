#include "worker/mesh_collectives.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <utility>

#include "worker/collectives/batch_all_reduce.h"
#include "worker/collectives/collectives.h"
#include "worker/collectives/hash.h"
#include "worker/collectives/hierarchical_all_reduce.h"
#include "worker/collectives/sparse_all_reduce.h"
#include "worker/collectives/subset_transport.h"
#include "worker/device_groups.h"

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

namespace {

// Names the mesh's definition and membership, so that workers disagreeing about
// either never join one group.
std::string GroupId(const MeshPlacement& p) {
  std::string def = p.mesh.ToString() + "/" + std::to_string(p.mesh.devices_per_worker);
  for (const std::string& w : p.workers) def += "/" + w;
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx",
                static_cast<unsigned long long>(collectives::HashString(def)));
  return "mesh/" + p.mesh.name + "#" + hex;
}

std::string Join(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& s : parts) out += (out.empty() ? "" : ",") + s;
  return out;
}

// The inputs of local devices `first`.. `first + count` concatenated into one
// tensor with a leading dimension: [count·d0, ...] when `merge_first`, else
// [count, ...].
Tensor Concat(const std::vector<Tensor>& inputs, size_t first, size_t count, bool merge_first) {
  Tensor t;
  t.dtype = inputs[first].dtype;
  t.shape = inputs[first].shape;
  if (merge_first) {
    t.shape[0] *= static_cast<int64_t>(count);
  } else {
    t.shape.insert(t.shape.begin(), static_cast<int64_t>(count));
  }
  for (size_t i = first; i < first + count; ++i) {
    t.data.insert(t.data.end(), inputs[i].data.begin(), inputs[i].data.end());
  }
  return t;
}

// Rows [row, row + rows) of `t` along axis 0.
Tensor Rows(const Tensor& t, int64_t row, int64_t rows) {
  Tensor out;
  out.dtype = t.dtype;
  out.shape = t.shape;
  out.shape[0] = rows;
  const size_t row_bytes = t.num_bytes() / static_cast<size_t>(t.shape[0]);
  out.data.assign(t.data.begin() + static_cast<ptrdiff_t>(row * row_bytes),
                  t.data.begin() + static_cast<ptrdiff_t>((row + rows) * row_bytes));
  return out;
}

// Argument errors of device-level ops, found before any communication so that
// the caller hears at once and the mesh's group stays usable.
Status CheckDeviceOp(const Mesh& mesh, const CollectiveRequest& r) {
  ASSIGN_OR_RETURN(std::vector<std::string> axes, NormalizeAxes(mesh, r.axes));
  const int64_t n = static_cast<int64_t>(DeviceGroups(mesh, axes).at(0).devices.size());
  const std::string context = std::string(CollectiveOpName(r.op)) + " on mesh '" + mesh.name +
                              "' along [" + Join(axes) + "]";
  if (r.op == CollectiveOp::kReduceScatter && (r.shape.empty() || r.shape[0] % n != 0)) {
    return InvalidArgument(context + ": the first dimension of " +
                               collectives::DescribeType(r.dtype, r.shape) +
                               " is not divisible by the group size " + std::to_string(n),
                           {{"field", "shape"}, {"group_size", n}});
  }
  if (r.op == CollectiveOp::kBroadcast && r.root >= n) {
    return InvalidArgument(context + ": root " + std::to_string(r.root) +
                               " is not a position in a group of " + std::to_string(n),
                           {{"field", "root"}, {"group_size", n}});
  }
  return Status::Ok();
}

// One device group's share of a device-level collective, on this worker.
struct OnGroup {
  const CollectiveRequest& r;
  const MeshPlacement& p;
  const DeviceGroup& g;
  collectives::Group& sub;  // the group's workers
  int64_t n;                // devices in the group
  int64_t count;            // of them on this worker
  int64_t position;         // of this worker's first device in the group
  std::chrono::milliseconds timeout;
};

// Each op takes this worker's devices' inputs of the group and gives their outputs.
using DeviceOp = Result<std::vector<Tensor>> (*)(const OnGroup& on, std::vector<Tensor>& local);

Result<std::vector<Tensor>> AllReduceOnGroup(const OnGroup& on, std::vector<Tensor>& local) {
  collectives::HierarchicalAllReduceOptions o;
  o.timeout = on.timeout;
  o.op = on.r.reduce;
  o.check_inf_nan = on.r.check_inf_nan;
  o.total_devices = on.n;
  RETURN_IF_ERROR(collectives::HierarchicalAllReduce(on.sub, local, o));
  return std::move(local);
}

Result<std::vector<Tensor>> AllGatherOnGroup(const OnGroup& on, std::vector<Tensor>& local) {
  collectives::AllGatherOptions o;
  o.timeout = on.timeout;
  o.tiled = true;  // each worker's share is a run of devices: concatenate the runs
  const bool merge = on.r.tiled && !on.r.shape.empty();
  ASSIGN_OR_RETURN(Tensor gathered,
                   collectives::AllGather(on.sub, Concat(local, 0, local.size(), merge), o));
  return std::vector<Tensor>(local.size(), gathered);
}

Result<std::vector<Tensor>> ReduceScatterOnGroup(const OnGroup& on, std::vector<Tensor>& local) {
  const int64_t rows = on.r.shape[0] / on.n;
  if (static_cast<int64_t>(on.g.workers.size()) == on.n) {  // one device per worker
    collectives::ReduceScatterOptions o;
    o.timeout = on.timeout;
    o.op = on.r.reduce;
    ASSIGN_OR_RETURN(Tensor part, collectives::ReduceScatter(on.sub, local[0], o));
    return std::vector<Tensor>{std::move(part)};
  }
  // Several devices here: reduce everything, keep each device's rows.
  collectives::HierarchicalAllReduceOptions o;
  o.timeout = on.timeout;
  o.op = on.r.reduce;
  o.total_devices = on.n;
  RETURN_IF_ERROR(collectives::HierarchicalAllReduce(on.sub, local, o));
  std::vector<Tensor> results;
  for (int64_t i = 0; i < on.count; ++i) {
    results.push_back(Rows(local[0], (on.position + i) * rows, rows));
  }
  return results;
}

Result<std::vector<Tensor>> BroadcastOnGroup(const OnGroup& on, std::vector<Tensor>& local) {
  const int64_t root_rank = on.p.mesh.WorkerOfDevice(on.g.devices[on.r.root]);
  collectives::BroadcastOptions o;
  o.timeout = on.timeout;
  o.root = static_cast<int>(std::find(on.g.workers.begin(), on.g.workers.end(), root_rank) -
                            on.g.workers.begin());
  Tensor value = root_rank == on.p.rank ? local[on.r.root - on.position] : local[0];
  RETURN_IF_ERROR(collectives::Broadcast(on.sub, value, o));
  return std::vector<Tensor>(local.size(), value);
}

Result<std::vector<Tensor>> AssertEqualOnGroup(const OnGroup& on, std::vector<Tensor>& local) {
  collectives::Options o;
  o.timeout = on.timeout;
  RETURN_IF_ERROR(collectives::AssertEqual(on.sub, local[0], on.r.message, o));
  return std::vector<Tensor>();
}

// sparse_all_reduce within one group: the shares of this worker's devices of the
// group (values and indices, concatenated) are its rank's slices, and each of
// those devices gets the sum. A malformed share still joins the call, so that
// every worker fails at once naming it.
Status SparseOnGroup(Group& sub, const DeviceGroup& g, int64_t position, int64_t count,
                     size_t first, const CollectiveRequest& r, std::vector<Tensor>& inputs,
                     CollectiveResult& out) {
  collectives::SparseAllReduceOptions o;
  o.timeout = std::chrono::milliseconds(r.timeout_ms);
  o.path = r.path;
  collectives::IndexedSlices mine;
  mine.dense_shape = r.dense_shape;
  mine.values.dtype = r.dtype;
  mine.values.shape = r.dense_shape;
  mine.values.shape[0] = 0;
  for (int64_t d = 0; d < count && o.input_error.ok(); ++d) {
    const Tensor& values = inputs[(first + d) * 2];
    const Tensor& indices = inputs[(first + d) * 2 + 1];
    collectives::IndexedSlices share{values, {}, r.dense_shape};
    Status st = indices.dtype == DType::kInt64 && indices.shape.size() == 1
                    ? Status::Ok()
                    : InvalidArgument("indices must be int64[rows], not " +
                                          collectives::DescribeType(indices.dtype, indices.shape),
                                      {{"field", "indices"}});
    if (st.ok()) {
      auto idx = indices.values<int64_t>();
      share.indices.assign(idx.begin(), idx.end());
      st = collectives::CheckSlices(share);
    }
    if (!st.ok()) {
      const int64_t device = g.devices[position + d];
      o.input_error = st.WithContext("device " + std::to_string(device)).WithDetail("device", device);
      break;
    }
    mine.values.shape[0] += values.shape[0];
    mine.values.data.insert(mine.values.data.end(), values.data.begin(), values.data.end());
    mine.indices.insert(mine.indices.end(), share.indices.begin(), share.indices.end());
  }
  collectives::SparsePath path = collectives::SparsePath::kAuto;
  ASSIGN_OR_RETURN(collectives::IndexedSlices sum, collectives::SparseAllReduce(sub, mine, o, &path));
  Tensor indices{DType::kInt64, {static_cast<int64_t>(sum.indices.size())}, {}};
  indices.data.resize(sum.indices.size() * sizeof(int64_t));
  if (!sum.indices.empty()) std::memcpy(indices.data.data(), sum.indices.data(), indices.data.size());
  for (int64_t d = 0; d < count; ++d) {
    out.outputs[(first + d) * 2] = sum.values;
    out.outputs[(first + d) * 2 + 1] = indices;
    out.paths[first + d] = collectives::SparsePathName(path);
  }
  return Status::Ok();
}

Result<std::vector<Tensor>> NotADeviceOp(const OnGroup&, std::vector<Tensor>&) {
  return Internal("not a device-level collective");
}

DeviceOp DeviceOpOf(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllReduce:
      return AllReduceOnGroup;
    case CollectiveOp::kAllGather:
      return AllGatherOnGroup;
    case CollectiveOp::kReduceScatter:
      return ReduceScatterOnGroup;
    case CollectiveOp::kBroadcast:
      return BroadcastOnGroup;
    case CollectiveOp::kAssertEqual:
      return AssertEqualOnGroup;
    default:
      return NotADeviceOp;
  }
}

// assert_equal among this worker's own devices of the group, before the group's check.
Status LocalDevicesAgree(const OnGroup& on, const std::vector<Tensor>& local,
                         const std::string& context) {
  std::vector<int64_t> differing;
  for (int64_t i = 1; i < on.count; ++i) {
    if (local[i].data != local[0].data) differing.push_back(on.g.devices[on.position + i]);
  }
  if (differing.empty()) return Status::Ok();
  const std::string self = MeshCollectives::WorkerName(on.p, on.p.rank);
  return Conflict(context + ": " + (on.r.message.empty() ? "values differ" : on.r.message) +
                      ": devices " + Json(differing).dump() + " of " + self +
                      " differ from device " + std::to_string(on.g.devices[on.position]),
                  {{"differing_devices", differing}, {"worker", self}});
}

}  // namespace

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
  const std::string id = GroupId(p);
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
