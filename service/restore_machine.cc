#include "service/restore_machine.h"

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

}  // namespace tessera::service
