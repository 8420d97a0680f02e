// A save from this worker's side (docs/architecture.md, "The save"): at its snapshot
// the worker plans its share from the snapshot alone, writes it into the step's staging
// dir, and joins the save with what it wrote. The join is its only request to tesserad
// for the save; the end comes back on its long-poll (save_ended).
#include <cstdio>
#include <random>
#include <set>

#include "api/clock.h"
#include "storage/checkpoint_dir.h"
#include "storage/rank_writer.h"
#include "storage/save_plan.h"
#include "worker/agent.h"

namespace tessera::worker {
namespace {

// How long a REST save's worker retries its join while tesserad is unreachable.
constexpr int64_t kSaveJoinMs = 30 * 60 * 1000;

// A fresh tag for a shard file: a late writer of an abandoned attempt at the same step
// never writes over a newer attempt's file.
std::string NewTag() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(rng()));
  return buf;
}

}  // namespace

Result<std::string> Agent::SaveStaging(const std::string& mesh, int64_t step) {
  std::string root;
  {
    MutexLock lock(mu_);
    root = checkpoint_root_;
  }
  if (root.empty()) {
    return Unavailable("worker " + id_ + " has no checkpoint root: tesserad gave none at registration");
  }
  return storage::StagingDir(root, mesh, step, storage::kSaveStagingId);
}

Result<SaveWritten> Agent::WriteAtSnapshot(const Snapshot& snap, int64_t step,
                                           const SaveRequest& request, const std::string& job,
                                           const std::string& staging) {
  const MeshPlacement& p = snap.placement;
  std::vector<TensorMeta> metas;
  for (const auto& t : snap.tensors) {
    if (request.tensors &&
        std::find(request.tensors->begin(), request.tensors->end(), t.name) == request.tensors->end()) {
      continue;
    }
    RETURN_IF_ERROR(ValidateLayout(p.mesh, t.desc.layout, t.desc.shape));
    metas.emplace_back(t.name, t.desc);
  }
  std::vector<storage::SliceToWrite> todo;
  for (const storage::PlannedSlice& planned : storage::PlanSave(p.mesh, metas)) {
    if (planned.rank != p.rank) continue;
    const TensorMeta& meta = metas[planned.tensor];
    const Snapshot::Tensor* t = snap.Find(meta.name);
    const Snapshot::Shard* shard = nullptr;
    for (const auto& s : t->shards) {
      if (s.device == planned.device) shard = &s;
    }
    if (shard == nullptr || shard->size() != planned.bytes) {
      return InvalidArgument("worker " + id_ + " holds no " + std::to_string(planned.bytes) +
                                 "-byte shard of tensor '" + meta.name + "' on device " +
                                 std::to_string(planned.device) + "; push every local shard before saving",
                             {{"tensor", meta.name}, {"device", planned.device}, {"worker", id_}});
    }
    if (shard->borrowed) {
      // Read from the trainer's memory as it is written (borrowed_memory.h).
      storage::SliceReader read = [m = shard->borrowed](uint64_t off, size_t n, void* dst) {
        return m->Read(off, n, dst);
      };
      todo.push_back({meta, planned.slice, nullptr, shard->size(), std::move(read)});
    } else {
      todo.push_back({meta, planned.slice, shard->buffer->data(), shard->size()});
    }
  }
  // An incremental save: each slice's chunks in this worker's last committed save.
  std::shared_ptr<const SaveBase> base = save_bases_.For(p.mesh.name, request);
  if (base) {
    for (storage::SliceToWrite& s : todo) s.base = base->Find(s.tensor, s.slice);
  }
  SaveWritten out;
  Task write;  // what the task seam (AgentOptions::around_task) is shown of the write
  write.kind = TaskKind::kWrite;
  write.job = job;
  write.mesh = p.mesh;
  write.rank = p.rank;
  write.step = step;
  write.staging = staging;
  Result<storage::ShardWritten> w = Internal("the write did not run");
  auto run = [&]() -> Result<Json> {
    if (todo.empty()) return Json::object();  // every slice it holds is another holder's
    RETURN_IF_ERROR(env_->CreateDirs(staging));
    storage::ShardOptions opt;
    opt.compress = request.compress;
    opt.level = static_cast<int>(request.level);
    opt.pool = &io_pool_;
    w = storage::WriteShard(env_, staging, storage::ShardFileName(p.rank, NewTag()), todo, opt);
    if (!w.ok()) return w.status();
    return Json::object();
  };
  Result<Json> ran = options_.around_task ? options_.around_task(write, run) : run();
  if (!ran.ok()) return ran.status();
  if (todo.empty()) return out;
  out.bytes = w->raw_bytes;
  out.stored_bytes = w->stored_bytes;
  if (w->reused_bytes > 0) {
    out.base = base->step;
    out.reused_bytes = w->reused_bytes;
  }
  out.fragment = storage::FragmentToJson(w->fragment);
  std::string root;
  {
    MutexLock lock(mu_);
    root = checkpoint_root_;
  }
  save_bases_.Wrote(p.mesh.name, step, storage::SaveDirName(env_, root, step), w->fragment,
                    base.get());
  return out;
}

Result<std::string> Agent::WriteAndJoin(const std::string& mesh, int64_t step,
                                        const SaveRequest& request,
                                        const std::optional<std::string>& job,
                                        std::shared_ptr<const Snapshot> snap,
                                        const std::optional<std::vector<std::string>>& names,
                                        const std::string& staging,
                                        std::chrono::steady_clock::time_point snapped,
                                        std::chrono::steady_clock::time_point deadline,
                                        Json* sent) {
  SaveJoinRequest join;
  join.save = request;
  join.worker = id_;
  join.job = job;
  Result<SaveWritten> written = Internal("no snapshot");
  if (snap) {
    join.snapshot = DescribeSnapshot(*snap, names);
    written = WriteAtSnapshot(*snap, step, request, job.value_or(""), staging);
  }
  snap.reset();  // written: its buffers go back to the pool
  {
    MutexLock lock(mu_);
    auto it = trainer_snapshots_.find({mesh, step});
    if (it != trainer_snapshots_.end()) it->second.reset();
  }
  if (written.ok()) {
    join.written = std::move(*written);
  } else {
    std::fprintf(stderr, "worker %s: the write of step %lld of mesh %s failed: %s\n", id_.c_str(),
                 static_cast<long long>(step), mesh.c_str(), written.status().ToString().c_str());
    join.error = written.status();
  }
  if (sent) *sent = join.ToJson();
  auto joined = CreateOrJoinSave(mesh, step, join.ToJson(), snapped, deadline);
  if (!joined.ok() && join.written) RemoveWritten(staging, join.written->fragment);
  return joined;
}

void Agent::RemoveWritten(const std::string& staging, const Json& fragment) {
  // The dir stays: a new attempt at the step may be writing into it; tesserad's
  // collector removes it.
  if (!fragment.is_array()) return;
  std::set<std::string> files;
  for (const auto& s : fragment) {
    if (s.is_object()) files.insert(s.value("file", ""));
  }
  files.erase("");
  for (const auto& f : files) (void)env_->DeleteFile(storage::JoinPath(staging, f));
}

Result<std::shared_ptr<const Snapshot>> Agent::MemoryShareSnapshot(const Task& task, Json* metadata) {
  for (const auto& ck : memory_.Committed(task.mesh.name)) {
    if (ck->step != task.step) continue;
    *metadata = ck->own_header.metadata;
    return ShareSnapshot(ck->own_header, ck->own, PlacementFromTask(task));
  }
  return NotFound("worker " + id_ + " holds no memory checkpoint of step " + std::to_string(task.step) +
                      " of mesh " + task.mesh.name + " (it keeps the newest `keep`)",
                  {{"worker", id_}, {"mesh", task.mesh.name}, {"step", task.step}});
}

void Agent::SaveForJob(const Task& task) {
  trainer_saves_.ServedByTask(task.job);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kSaveJoinMs);
  SaveRequest request;
  request.step = task.step;
  request.tensors = task.tensor_names;
  request.compress = task.compress;
  request.level = task.level;
  request.full = task.full;
  request.full_every = task.full_every;
  request.from_memory = task.from_memory;
  const auto snapped = std::chrono::steady_clock::now();
  Result<std::shared_ptr<const Snapshot>> snap = Internal("the snapshot did not run");
  auto take = [&]() -> Result<Json> {
    snap = task.from_memory ? MemoryShareSnapshot(task, &request.metadata)
                            : store_->TakeSnapshot(PlacementFromTask(task), task.tensor_names);
    if (!snap.ok()) return snap.status();
    return Json::object();
  };
  // The task seam (AgentOptions::around_task) sees the snapshot as the task it is.
  (void)(options_.around_task ? options_.around_task(task, take) : take());
  std::shared_ptr<const Snapshot> taken;
  if (snap.ok()) {
    taken = *snap;
    for (const auto& n : task.tensor_names.value_or(std::vector<std::string>{})) {
      if (!taken->Find(n)) {
        snap = NotFound("worker " + id_ + " holds no tensor '" + n + "' in mesh " + task.mesh.name,
                        {{"tensor", n}});
        taken.reset();
        break;
      }
    }
  }
  if (!snap.ok()) {
    // The join carries the error: the save fails at once, naming this worker.
    SaveJoinRequest join;
    join.save = request;
    join.worker = id_;
    join.job = task.job;
    join.error = snap.status();
    (void)CreateOrJoinSave(task.mesh.name, task.step, join.ToJson(), snapped, deadline);
    return;
  }
  auto joined = WriteAndJoin(task.mesh.name, task.step, request, task.job, std::move(taken),
                             task.tensor_names, task.staging, snapped, deadline);
  if (!joined.ok()) {
    std::fprintf(stderr, "worker %s: the join of job %s was refused: %s\n", id_.c_str(),
                 task.job.c_str(), joined.status().ToString().c_str());
  }
}

}  // namespace tessera::worker
