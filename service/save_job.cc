// A save, the protocol of docs/architecture.md driven from tesserad: its start (REST, or
// an in-loop save's create-or-join), the check of the workers' snapshots, and what the
// loop does for its machine (service/save_machine.*) at the commit and on a failure.
#include "service/save_job.h"

#include <algorithm>
#include <set>

#include "api/names.h"
#include "service/safetensors_machines.h"
#include "service/save_machine.h"
#include "service/service.h"
#include "storage/checkpoint_dir.h"
#include "storage/index.h"
#include "storage/save_plan.h"
#include "storage/save_transaction.h"

namespace tessera::service {

Result<Json> Service::StartSave(const std::string& mesh, const SaveRequest& request) {
  const std::string job_id = NewJobId();
  ASSIGN_OR_RETURN(MeshRecord m, meshes_.Hold(mesh, job_id));
  ASSIGN_OR_RETURN(CheckpointRecord c, CreateSaveJob(job_id, m, request, /*joined=*/false));
  return Json{{"job", c.job}, {"checkpoint", c.Summary()}};
}

Result<CheckpointRecord> Service::CreateSaveJob(const std::string& job_id, const MeshRecord& m,
                                                const SaveRequest& request, bool joined,
                                                const ImportRequest* import) {
  const std::string& mesh = m.mesh.name;
  const int64_t step = request.step;
  JobSpec spec = JobSpec::Of(job_id, m, step, options_.job_timeout_ms);
  spec.holds_mesh = true;
  for (size_t rank = 0; rank < m.workers.size(); ++rank) {
    const std::string& wid = m.workers[rank];
    auto w = workers_.Get(wid);
    if (!w || w->state == WorkerState::kDead) {
      ReleaseHolds(spec);
      // Unknown here: a tesserad that just took over, before the worker registered again.
      return Unavailable("worker " + wid + " (rank " + std::to_string(rank) + ") of mesh " + mesh +
                             (w ? " is dead" : " has not registered with this tesserad"),
                         {{"worker", wid}, {"rank", rank}});
    }
  }
  // The job exists before its step is reserved: a join that finds the step finds the job.
  Json recorded = import ? import->ToJson() : request.ToJson();
  if (joined) recorded["joined"] = true;
  const JobRecord job = jobs_.Create(job_id, import ? "import" : "save", mesh, step, recorded,
                                     import ? std::nullopt : std::optional<SaveRequest>(request));
  CheckpointRecord c;
  c.mesh = mesh;
  c.step = step;
  c.job = job_id;
  c.created_ms = clock_->WallMs();
  c.metadata = request.metadata;
  // Both records are in the catalog before anyone acts on them (docs/semantics.md S9);
  // the reservation comes first, so that a refused step leaves no job behind.
  Status st = checkpoints_.Reserve(c);
  if (st.ok()) {
    spec.held_checkpoint = c.key();
    st = PersistJob(job);
    if (st.ok()) {
      st = PersistCheckpoint(c);
      if (!st.ok()) (void)catalog_->Delete("jobs", job_id);  // best effort: the job never ran
    }
    if (!st.ok()) st = st.WithContext("the save of step " + std::to_string(step) + " was not started");
  }
  if (!st.ok()) {
    ReleaseHolds(spec);
    if (!spec.held_checkpoint.empty()) checkpoints_.Erase(c.key());
    jobs_.Forget(job_id);
    return st;
  }
  events_.Publish("checkpoint", c.Summary());
  jobs_.Announce(job_id);
  // A save's workers write at their snapshots, before any job exists: into the
  // staging dir of the step that they all know (storage::kSaveStagingId).
  if (!import) spec.staging_id = storage::kSaveStagingId;
  spec.staging = storage::StagingDir(options_.checkpoint_root, mesh, step,
                                     import ? job_id : spec.staging_id);
  if (import) {
    Launch(std::make_unique<ImportMachine>(std::move(spec), request, import->source));
  } else {
    Launch(std::make_unique<SaveMachine>(std::move(spec), request, joined, options_.join_wait_ms));
  }
  return c;
}

Result<std::vector<TensorMeta>> CollectSnapshotTensors(
    const Mesh& mesh, const std::vector<std::string>& workers,
    const std::map<int64_t, SnapshotResult>& snapshots) {
  std::vector<TensorMeta> metas;
  std::map<std::string, size_t> seen;
  for (const auto& [rank, res] : snapshots) {
    if (rank < 0 || rank >= static_cast<int64_t>(workers.size())) {
      return Internal("a snapshot of rank " + std::to_string(rank) + ", which mesh " + mesh.name +
                          " does not have", {{"rank", rank}});
    }
    const std::string& wid = workers[rank];
    const std::vector<SnapshotTensor>& list = res.tensors;
    for (const SnapshotTensor& st : list) {
      const TensorMeta* t = &st.meta;
      const std::vector<int64_t>& devices = st.devices;
      const std::vector<int64_t> owned = mesh.DevicesOfWorker(rank);
      if (devices != owned) {
        return InvalidArgument("worker " + wid + " (rank " + std::to_string(rank) +
                                   ") holds tensor '" + t->name + "' on devices " +
                                   Json(devices).dump() + " but owns " + Json(owned).dump() +
                                   "; push every local shard before saving",
                               {{"tensor", t->name}, {"worker", wid}, {"rank", rank}});
      }
      auto [it, inserted] = seen.emplace(t->name, metas.size());
      if (inserted) {
        Status valid = ValidateName(t->name, "tensor");
        if (valid.ok()) valid = ValidateLayout(mesh, t->layout, t->shape);
        if (!valid.ok()) {
          return valid.WithContext("tensor '" + t->name + "' of worker " + wid)
              .WithDetail("tensor", t->name)
              .WithDetail("worker", wid)
              .WithDetail("rank", rank);
        }
        if (rank != 0) {
          return InvalidArgument("tensor '" + t->name + "' is missing on worker " + workers[0] +
                                     " (rank 0)",
                                 {{"tensor", t->name}, {"worker", workers[0]}, {"rank", 0}});
        }
        metas.push_back(*t);
      } else if (!(metas[it->second] == *t)) {
        return InvalidArgument("tensor '" + t->name + "' is " + metas[it->second].ToString() +
                                   " on rank 0 but " + t->ToString() + " on worker " + wid +
                                   " (rank " + std::to_string(rank) + ")",
                               {{"tensor", t->name}, {"worker", wid}, {"rank", rank}});
      }
    }
    if (list.size() != metas.size()) {
      std::set<std::string> here;
      for (const SnapshotTensor& st : list) here.insert(st.meta.name);
      for (const auto& m : metas) {
        if (!here.count(m.name)) {
          return InvalidArgument("tensor '" + m.name + "' is missing on worker " + wid +
                                     " (rank " + std::to_string(rank) + ")",
                                 {{"tensor", m.name}, {"worker", wid}, {"rank", rank}});
        }
      }
    }
  }
  if (metas.empty()) {
    return InvalidArgument("mesh " + mesh.name + " holds no tensors to save; push some first",
                           {{"mesh", mesh.name}});
  }
  return metas;
}

Result<std::vector<std::vector<storage::FragmentSlice>>> CheckFragments(
    const MeshRecord& mesh, const std::vector<TensorMeta>& metas,
    const std::vector<storage::PlannedSlice>& plan,
    const std::map<int64_t, SaveJoinRequest>& joins) {
  using Key = std::pair<std::string, std::vector<int64_t>>;  // tensor, slice offsets
  std::vector<std::map<Key, const storage::PlannedSlice*>> planned(mesh.workers.size());
  for (const auto& p : plan) planned[p.rank][{metas[p.tensor].name, p.slice.offsets}] = &p;
  std::vector<std::vector<storage::FragmentSlice>> out;
  for (const auto& entry : joins) {
    const int64_t rank = entry.first;  // a plain variable: lambdas below capture it
    const SaveJoinRequest& join = entry.second;
    const std::string& wid = mesh.workers.at(rank);
    const std::string who = "worker " + wid + " (rank " + std::to_string(rank) + ")";
    auto fail = [&](const std::string& what, const std::string& tensor) {
      Json details = {{"worker", wid}, {"rank", rank}, {"field", "written.fragment"}};
      if (!tensor.empty()) details["tensor"] = tensor;
      return InvalidArgument("the fragment of " + who + " " + what, std::move(details));
    };
    if (!join.written) return fail("is missing", "");
    auto fragment = storage::FragmentFromJson(join.written->fragment);
    if (!fragment.ok()) return fragment.status().WithContext("the fragment of " + who).WithDetail("worker", wid).WithDetail("rank", rank);
    const std::string own = "shard-" + std::to_string(rank) + "-";
    std::set<Key> seen;
    for (const storage::FragmentSlice& s : *fragment) {
      const std::string& name = s.tensor.name;
      auto it = planned[rank].find({name, s.slice.offsets});
      if (it == planned[rank].end() || !(it->second->slice == s.slice)) {
        return fail("holds slice " + s.slice.ToString() + " of tensor '" + name +
                        "', which the plan does not give it",
                    name);
      }
      if (!(metas[it->second->tensor] == s.tensor)) {
        return fail("records tensor '" + name + "' as " + s.tensor.ToString() + ", its snapshot as " +
                        metas[it->second->tensor].ToString(),
                    name);
      }
      if (!s.file.starts_with(own) || !s.file.ends_with(".tsr")) {
        return fail("names shard file '" + s.file + "', not one of its own (" + own + "….tsr)", name);
      }
      if (!seen.insert(it->first).second) {
        return fail("holds slice " + s.slice.ToString() + " of tensor '" + name + "' twice", name);
      }
    }
    if (seen.size() != planned[rank].size()) {
      for (const auto& [key, p] : planned[rank]) {
        if (seen.count(key)) continue;
        return fail("lacks slice " + p->slice.ToString() + " of tensor '" + key.first +
                        "', which the plan gives it",
                    key.first);
      }
    }
    out.push_back(std::move(*fragment));
  }
  return out;
}

void Service::SetCheckpointState(const std::string& key, CheckpointState state) {
  auto c = checkpoints_.Update(key, [&](CheckpointRecord& r) { r.state = state; });
  if (!c) return;
  (void)PersistCheckpoint(*c);
  events_.Publish("checkpoint", c->Summary());
}

// The committed checkpoint's record: its tensors and sizes, from its summary.
Json Service::RecordCommitted(const JobSpec& spec, const Json& summary,
                              const std::vector<storage::PlannedSlice>& plan) {
  const int64_t duration_ms = clock_->WallMs() - jobs_.StartedMs(spec.id);
  auto change = [&](CheckpointRecord& r) {
    r.TakeSummary(summary);
    r.duration_ms = duration_ms;
    r.state = CheckpointState::kCommitted;
  };
  // The catalog, then memory (state_write.h): the root committed it, so memory follows
  // even when the catalog refuses; that failure is noted (/healthz) and in the result.
  const std::string key = CheckpointRecord::Key(spec.mesh.mesh.name, spec.step);
  std::optional<CheckpointRecord> c = checkpoints_.Get(key);
  if (!c) return Json::object();
  change(*c);
  const Status stored = PersistCheckpoint(*c);
  c = checkpoints_.Update(key, change);
  if (!c) return Json::object();
  events_.Publish("checkpoint", c->Summary());
  metrics_.ObserveSave(c->duration_ms / 1000.0, c->logical_bytes);
  Json out = {{"checkpoint", c->Summary()},
              {"bytes_per_rank", storage::BytesPerRank(spec.mesh.mesh, plan)}};
  if (!stored.ok()) out["catalog_error"] = ErrorBody(stored)["error"];
  return out;
}

// A failed save: the checkpoint is marked failed, the staging dir goes, and the GC
// runs once late writers must have stopped. (A late writer's join is refused, and it
// removes its own file; see JoinSave.)
void Service::AbandonSave(const JobSpec& spec, const Status& st) {
  const std::string key = CheckpointRecord::Key(spec.mesh.mesh.name, spec.step);
  auto mine = [&](const CheckpointRecord& r) {
    return r.state != CheckpointState::kCommitted && r.job == spec.id;
  };
  auto fail = [&](CheckpointRecord& r) {
    if (!mine(r)) return;
    r.state = CheckpointState::kFailed;
    r.error = ErrorBody(st)["error"];
  };
  // The catalog, then memory, as every record (its failure is noted: /healthz).
  if (std::optional<CheckpointRecord> c = checkpoints_.Get(key); c && mine(*c)) {
    fail(*c);
    (void)PersistCheckpoint(*c);
    if ((c = checkpoints_.Update(key, fail))) events_.Publish("checkpoint", c->Summary());
  }
  if (spec.staging_id.empty()) AbortOnWorkers(spec.mesh, spec.id, /*collective=*/false, st);
  SaveTransactionOf(spec).Abandon();
  // Workers still writing when the job failed may leave files behind it.
  CollectGarbageSoon();
}

void Service::CollectGarbageSoon() {
  MutexLock lock(loop_mu_);
  const int64_t due = clock_->MonoMs() + options_.lease_ms;
  if (gc_due_ms_ == 0 || due < gc_due_ms_) gc_due_ms_ = due;
  loop_cv_.NotifyAll();
}

}  // namespace tessera::service
