// The agent's executor of restore tasks (this worker's devices of any mesh and layout),
// and what a snapshot task and a join share: a snapshot's description.
#include <algorithm>
#include <deque>
#include <map>

#include "api/clock.h"
#include "storage/index.h"
#include "storage/read_planner.h"
#include "worker/agent.h"
#include "worker/throttle.h"

namespace tessera::worker {
SnapshotResult DescribeSnapshot(const Snapshot& snap,
                                const std::optional<std::vector<std::string>>& names) {
  SnapshotResult result;
  for (const auto& t : snap.tensors) {
    if (names && std::find(names->begin(), names->end(), t.name) == names->end()) continue;
    SnapshotTensor& out = result.tensors.emplace_back();
    out.meta = TensorMeta(t.name, t.desc);
    for (const auto& s : t.shards) out.devices.push_back(s.device);
  }
  result.snapshot_bytes = snap.bytes();
  return result;
}

MeshPlacement Agent::PlacementFromTask(const Task& task) {
  MeshPlacement p;
  p.mesh = task.mesh;
  p.rank = task.rank;
  p.workers = task.workers;
  p.devices = task.mesh.DevicesOfWorker(p.rank);
  return p;
}

Result<Json> Agent::DoRestore(const Task& task) {
  const MeshPlacement p = PlacementFromTask(task);
  const std::string& dir = task.dir;
  ASSIGN_OR_RETURN(auto index, storage::CheckpointIndex::Open(env_, dir));
  storage::ShardCache shards(env_, dir);
  Throttle throttle;
  const std::string& tid = task.id;
  uint64_t total = 0, done = 0, read = 0;
  struct Item {
    const storage::TensorEntry* entry;
    TensorDesc desc;
  };
  std::vector<Item> items;
  for (const TensorMeta& want : task.tensors) {
    const std::string& name = want.name;
    const storage::TensorEntry* e = index.Find(name);
    if (!e) return NotFound("checkpoint has no tensor '" + name + "'", {{"tensor", name}});
    TensorDesc desc = e->meta.desc();
    desc.layout = want.layout;
    RETURN_IF_ERROR(ValidateLayout(p.mesh, desc.layout, desc.shape));
    items.push_back({e, desc});
    total += NumElements(LocalShape(p.mesh, desc.layout, desc.shape)) * DTypeSize(desc.dtype) *
             p.devices.size();
  }
  // Buffers reused from tensor to tensor (a fresh one would fault every page in);
  // devices of this worker that hold the same slice (replicas) share one read.
  std::deque<std::string> scratch;  // a deque: the pointers in read_once stay valid
  for (const auto& it : items) {
    const auto& name = it.entry->meta.name;
    std::map<std::vector<int64_t>, const std::string*> read_once;
    for (int64_t device : p.devices) {
      SliceSpec slice = DeviceSlice(p.mesh, it.desc.layout, it.desc.shape, device);
      auto cached = read_once.find(slice.offsets);
      if (cached == read_once.end()) {
        ASSIGN_OR_RETURN(auto plan, storage::PlanRead(*it.entry, slice));
        if (scratch.size() == read_once.size()) scratch.emplace_back();
        std::string& buf = scratch[read_once.size()];
        buf.resize(slice.NumElements() * DTypeSize(it.desc.dtype));  // no fill when it shrinks
        RETURN_IF_ERROR(storage::ExecuteRead(plan, &shards, buf.data(), buf.size(), &io_pool_));
        read += plan.stored_bytes;
        cached = read_once.emplace(slice.offsets, &buf).first;
      }
      const std::string& bytes = *cached->second;
      RETURN_IF_ERROR(store_->Install(p.mesh.name, name, it.desc, device, bytes.data(), bytes.size()));
      done += bytes.size();
      if (throttle.Due()) Report(tid, ReportState::kRunning, done, total, nullptr, Status::Ok());
    }
  }
  return RestoreResultToJson({done, read, static_cast<int64_t>(items.size())});
}

}  // namespace tessera::worker
