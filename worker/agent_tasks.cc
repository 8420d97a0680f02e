// The agent's executors of the tasks tesserad hands out: snapshot, write (shards and
// fragment of a save) and restore (this worker's devices of any mesh and layout).
#include <algorithm>
#include <map>

#include "api/clock.h"
#include "storage/index.h"
#include "storage/rank_writer.h"
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

Result<Json> Agent::DoSnapshot(const Task& task) {
  const std::string& job = task.job;
  const MeshPlacement p = PlacementFromTask(task);
  const int64_t step = task.step;
  const std::optional<std::vector<std::string>>& names = task.tensor_names;
  std::shared_ptr<const Snapshot> snap;
  {
    // A trainer-driven save: use the copy its /v1/save took at the right moment.
    MutexLock lock(mu_);
    auto key = std::make_pair(p.mesh.name, step);
    if (task.wait_for_trainer) {
      const auto deadline =
          std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.trainer_wait_ms);
      while (!stopping_ && !trainer_snapshots_.count(key)) {
        if (!cv_.WaitUntil(mu_, deadline)) break;
      }
      if (!trainer_snapshots_.count(key)) {
        return DeadlineExceeded("the trainer on worker " + id_ + " did not call /v1/save for step " +
                                std::to_string(step));
      }
    }
    auto it = trainer_snapshots_.find(key);
    if (it != trainer_snapshots_.end()) {
      snap = it->second;
      trainer_snapshots_.erase(it);
    }
  }
  if (!snap) {
    // The task says where this worker stands: no lookup of the mesh (with N workers
    // that lookup is N answers of N devices each per save).
    ASSIGN_OR_RETURN(snap, store_->TakeSnapshot(p, names));
  }
  const SnapshotResult result = DescribeSnapshot(*snap, names);
  if (names) {
    for (const auto& n : *names) {
      if (!snap->Find(n)) {
        return NotFound("worker " + id_ + " holds no tensor '" + n + "' in mesh " + p.mesh.name,
                        {{"tensor", n}});
      }
    }
  }
  MutexLock lock(mu_);
  snapshots_[job] = snap;
  return SnapshotResultToJson(result);
}

Result<Json> Agent::DoWrite(const Task& task) {
  const std::string& job = task.job;
  const MeshPlacement p = PlacementFromTask(task);
  std::shared_ptr<const Snapshot> snap;
  {
    MutexLock lock(mu_);
    auto it = snapshots_.find(job);
    if (it == snapshots_.end()) {
      // An in-loop save: the snapshot this worker brought to the job's create-or-join.
      auto taken = trainer_snapshots_.find({p.mesh.name, task.step});
      if (taken == trainer_snapshots_.end()) {
        return Internal("worker " + id_ + " has no snapshot for job " + job,
                        {{"job", job}, {"worker", id_}});
      }
      it = snapshots_.emplace(job, taken->second).first;
      trainer_snapshots_.erase(taken);
    }
    snap = it->second;
  }
  std::vector<storage::SliceToWrite> todo;
  uint64_t total = 0;
  for (const WriteSlice& ws : task.slices) {
    const std::string& name = ws.tensor;
    const Snapshot::Tensor* t = snap->Find(name);
    if (!t) return Internal("snapshot of job " + job + " lacks tensor '" + name + "'");
    const int64_t device = ws.device;
    const ShardBuffer* buf = nullptr;
    for (const auto& s : t->shards) {
      if (s.device == device) buf = s.buffer.get();
    }
    if (!buf) {
      return Internal("snapshot of tensor '" + name + "' lacks device " + std::to_string(device),
                      {{"tensor", name}});
    }
    storage::TensorMeta meta{name, t->desc.dtype, t->desc.shape, t->desc.layout};
    // The slice as tesserad planned it; it must be the shard this worker holds.
    const SliceSpec& slice = ws.slice;
    if (slice.offsets.size() != meta.shape.size() || slice.lengths.size() != meta.shape.size() ||
        !Contains(FullSlice(meta.shape), slice) ||
        slice.NumElements() * DTypeSize(meta.dtype) != buf->size()) {
      return InvalidArgument("the write task's slice of tensor '" + name + "' on device " +
                                 std::to_string(device) + " does not match the " +
                                 std::to_string(buf->size()) + "-byte shard this worker holds",
                             {{"tensor", name}, {"device", device}, {"field", "slices"}});
    }
    todo.push_back({meta, slice, buf->data(), buf->size()});
    total += buf->size();
  }
  WriteResult result;
  if (!todo.empty()) {
    Throttle throttle;
    const std::string& tid = task.id;
    storage::ShardOptions opt;
    opt.compress = task.compress;
    opt.level = static_cast<int>(task.level);
    opt.pool = &io_pool_;
    opt.on_progress = [&](uint64_t done) {
      if (throttle.Due()) Report(tid, ReportState::kRunning, done, total, nullptr, Status::Ok());
    };
    ASSIGN_OR_RETURN(auto w, storage::WriteRank(env_, task.staging, p.rank, todo, opt));
    result.fragment = storage::FragmentFileName(p.rank);
    result.bytes = w.raw_bytes;
    result.stored_bytes = w.stored_bytes;
  }
  MutexLock lock(mu_);
  snapshots_.erase(job);  // written: the buffers go back to the pool
  return WriteResultToJson(result);
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
  for (const auto& it : items) {
    const auto& name = it.entry->meta.name;
    // Devices of this worker that hold the same slice (replicas) share one read.
    std::map<std::vector<int64_t>, std::string> read_once;
    for (int64_t device : p.devices) {
      SliceSpec slice = DeviceSlice(p.mesh, it.desc.layout, it.desc.shape, device);
      auto cached = read_once.find(slice.offsets);
      if (cached == read_once.end()) {
        ASSIGN_OR_RETURN(auto plan, storage::PlanRead(*it.entry, slice));
        std::string buf(slice.NumElements() * DTypeSize(it.desc.dtype), '\0');
        RETURN_IF_ERROR(storage::ExecuteRead(plan, &shards, buf.data(), buf.size(), &io_pool_));
        read += plan.stored_bytes;
        cached = read_once.emplace(slice.offsets, std::move(buf)).first;
      }
      RETURN_IF_ERROR(store_->Install(p.mesh.name, name, it.desc, device, cached->second.data(),
                                      cached->second.size()));
      done += cached->second.size();
      if (throttle.Due()) Report(tid, ReportState::kRunning, done, total, nullptr, Status::Ok());
    }
  }
  return RestoreResultToJson({done, read, static_cast<int64_t>(items.size())});
}

}  // namespace tessera::worker
