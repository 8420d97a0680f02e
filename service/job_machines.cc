#include "service/job_machines.h"

namespace tessera::service {

RestoreMachine::RestoreMachine(JobSpec spec, std::vector<TensorMeta> tensors,
                               std::vector<int64_t> ranks)
    : JobMachine(std::move(spec)), tensors_(std::move(tensors)), ranks_(std::move(ranks)) {}

Result<JobActions> RestoreMachine::OnStart(int64_t) {
  return JobActions{SetPhase("plan"), RunIo(IoKind::kFindCommitted)};
}

Result<JobActions> RestoreMachine::OnIoDone(int64_t now, Json result) {
  const Mesh& target = spec_.mesh.mesh;
  std::map<int64_t, Task> tasks;
  total_ = 0;
  for (const auto& m : tensors_) {
    total_ += NumElements(LocalShape(target, m.layout, m.shape)) * DTypeSize(m.dtype) *
              target.devices_per_worker * ranks_.size();
  }
  for (int64_t r : ranks_) {
    Task& task = tasks[r] = MeshTask(TaskKind::kRestore, target, r);
    task.dir = result.value("dir", "");
    task.tensors = tensors_;
  }
  return JobActions{SetPhase("read"),
                    QueueTasks(std::move(tasks), total_, now, spec_.task_timeout_ms)};
}

Result<JobActions> RestoreMachine::OnTasksDone(int64_t, std::map<int64_t, Json> results) {
  uint64_t read = 0;
  for (const auto& [rank, res] : results) {
    auto restored = RestoreResultFromJson(res);
    if (!restored.ok()) {
      return restored.status().WithContext("the restore of worker " + spec_.mesh.workers.at(rank));
    }
    read += restored->stored_bytes_read;
  }
  Json names = Json::array();
  Json layouts = Json::array();
  for (const auto& m : tensors_) {
    names.push_back(m.name);
    layouts.push_back(TensorMetaToJson(m));
  }
  return JobActions{Finish({{"target_mesh", spec_.mesh.mesh.name},
                            {"tensors", names},
                            {"bytes", total_},
                            {"stored_bytes_read", read},
                            {"layouts", layouts}})};
}

Result<JobActions> VerifyMachine::OnStart(int64_t) {
  return JobActions{SetPhase("verify"), RunIo(IoKind::kVerify)};
}

Result<JobActions> VerifyMachine::OnIoDone(int64_t, Json result) {
  Json report = result.value("report", Json());
  if (result.contains("error") && !result["error"].is_null()) {
    return Fail(StatusFromErrorJson(result["error"]), std::move(report));
  }
  return JobActions{Finish(std::move(report))};
}

CollectiveMachine::CollectiveMachine(JobSpec spec, TaskKind kind, Json request, int64_t timeout_ms)
    : JobMachine(std::move(spec)),
      kind_(kind),
      request_(std::move(request)),
      timeout_ms_(timeout_ms) {}

Result<JobActions> CollectiveMachine::OnStart(int64_t now) {
  const MeshRecord& mesh = spec_.mesh;
  std::map<int64_t, Task> tasks;
  for (int64_t r = 0; r < mesh.mesh.num_workers(); ++r) {
    Task& t = tasks[r] = MeshTask(kind_, mesh.mesh, r);
    t.workers = mesh.workers;
    t.request = request_;
    t.timeout_ms = timeout_ms_;
  }
  const std::string phase =
      kind_ == TaskKind::kMeshInit ? "self_test" : request_.value("op", "collective");
  // The workers' own timeout fires first and names the ranks that did not join;
  // this one only covers a worker that never picks its task up.
  return JobActions{SetPhase(phase), QueueTasks(std::move(tasks), 0, now, timeout_ms_ + 5000)};
}

Result<JobActions> CollectiveMachine::OnTasksDone(int64_t, std::map<int64_t, Json> results) {
  if (kind_ == TaskKind::kMeshInit) {
    // The merged table must be the same on every worker.
    const std::string digest = results.at(0).value("digest", "");
    for (const auto& [rank, r] : results) {
      if (r.value("digest", "") != digest) {
        const std::string& w = spec_.mesh.workers.at(rank);
        return Internal("self-test: worker " + w + " (rank " + std::to_string(rank) +
                            ") merged a different device table than rank 0",
                        {{"worker", w}, {"rank", rank}});
      }
    }
    return JobActions{
        Finish({{"digest", digest}, {"devices", results.at(0).value("devices", Json::array())}})};
  }
  Json result = results.at(0);
  result.erase("bytes");
  uint64_t bytes = 0;
  for (const auto& [rank, r] : results) bytes += r.value("bytes", uint64_t{0});
  result["output_bytes"] = bytes;
  return JobActions{Finish(std::move(result))};
}

JobActions CollectiveMachine::OnFailure(const Status& st) {
  // Workers still inside the collective stop now, with the reason.
  return {Cleanup(JobAction::Kind::kAbortCollective, st)};
}

}  // namespace tessera::service
