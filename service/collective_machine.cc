#include "service/collective_machine.h"

namespace tessera::service {

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
  const std::string phase = kind_ == TaskKind::kMeshInit     ? "self_test"
                            : kind_ == TaskKind::kMemorySave ? "memory_save"
                                                             : request_.value("op", "collective");
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
  if (kind_ == TaskKind::kMemorySave) {
    uint64_t bytes = 0;
    for (const auto& [rank, r] : results) bytes += r.value("bytes", uint64_t{0});
    return JobActions{Finish({{"checkpoint", results.at(0).value("checkpoint", Json::object())},
                              {"tier", "memory"},
                              {"bytes", bytes}})};
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
