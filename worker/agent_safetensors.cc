// The agent's share of the jobs between checkpoints and safetensors files
// (service/safetensors_machines.h): an export task writes its files of a committed
// checkpoint; an import task writes the tensors of its safetensors files as this
// worker's shard and fragment of the new checkpoint.
#include "storage/index.h"
#include "storage/safetensors_export.h"
#include "storage/safetensors_import.h"
#include "worker/agent.h"
#include "worker/throttle.h"

namespace tessera::worker {

Result<Json> Agent::DoExport(const Task& task) {
  ASSIGN_OR_RETURN(auto index, storage::CheckpointIndex::Open(env_, task.dir));
  storage::ShardCache shards(env_, task.dir);
  RETURN_IF_ERROR(env_->CreateDirs(task.out_dir));
  const Json metadata = storage::ExportMetadata(index.meta());
  Throttle throttle;
  uint64_t total = 0, done = 0;
  for (const ExportFileTask& f : task.files) {
    for (const std::string& t : f.tensors) {
      if (const auto* e = index.Find(t)) total += e->meta.logical_bytes();
    }
  }
  ExportResult result;
  for (const ExportFileTask& f : task.files) {
    const storage::ExportFile file{f.name, f.tensors, 0};
    Status st = storage::WriteExportFile(env_, index, &shards, &io_pool_, file, task.out_dir, metadata,
                                         // One writer a file: the mesh's workers already write at once.
                                         task.block_bytes, /*writers=*/1,
                                         [&](const std::string&, uint64_t bytes) {
                                           done += bytes;
                                           if (throttle.Due()) {
                                             Report(task.id, ReportState::kRunning, done, total, nullptr, Status::Ok());
                                           }
                                         });
    if (!st.ok()) return st.WithContext("worker " + id_ + " writing " + f.name).WithDetail("file", f.name);
    result.files.push_back(f.name);
  }
  result.bytes = done;
  return ExportResultToJson(result);
}

Result<Json> Agent::DoImport(const Task& task) {
  const MeshPlacement p = PlacementFromTask(task);
  uint64_t total = 0;
  for (const TensorMeta& t : task.tensors) total += t.logical_bytes();
  Throttle throttle;
  storage::ShardOptions opt;
  opt.compress = task.compress;
  opt.level = static_cast<int>(task.level);
  opt.pool = &io_pool_;
  opt.on_progress = [&](uint64_t done) {
    if (throttle.Due()) Report(task.id, ReportState::kRunning, done, total, nullptr, Status::Ok());
  };
  auto w = storage::WriteImportRank(env_, task.sources, task.tensors, task.staging, p.rank, opt);
  if (!w.ok()) return w.status().WithContext("worker " + id_ + " (rank " + std::to_string(p.rank) + ")");
  WriteResult result;
  result.fragment = storage::FragmentFileName(p.rank);
  result.bytes = w->raw_bytes;
  result.stored_bytes = w->stored_bytes;
  return WriteResultToJson(result);
}

}  // namespace tessera::worker
