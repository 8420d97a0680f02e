// The task protocol between tesserad and its workers, one codec per message for both
// sides: what a long-poll hands out (GET /api/v1/workers/{id}/tasks), what a worker
// reports (POST /api/v1/workers/{id}/tasks/{task}/report), and the result of each kind.
//   snapshot    a REST save: copy this worker's shards of a mesh, write its share into
//               staging, and join the save (its answer is the join, not a report)
//   write       (never sent) a save's write at the snapshot, as the task seam sees it
//   restore     read its devices' slices of a committed checkpoint, in a target layout
//   collective  run a REST collectives job's request on tensors the worker holds
//   mesh_init   the self-test of a new mesh (the device table merged over it)
//   abort       the job failed: drop its snapshot, leave its collective
//   save_ended  an in-loop save ended (committed, or failed with `error`): tell the trainer
//   export      write its share of a checkpoint's safetensors files into a folder
//   import      write the tensors of its safetensors files as its shard + fragment in staging
// Decoders take what the other side sent: a malformed message is invalid_argument naming
// the field, never an exception.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/json_codec.h"
#include "api/mesh.h"
#include "api/status.h"
#include "api/tensor_desc.h"

namespace tessera {

enum class TaskKind {
  kSnapshot, kWrite, kRestore, kCollective, kMeshInit, kAbort, kSaveEnded, kExport, kImport,
  kMemorySave
};

std::string_view TaskKindName(TaskKind kind);
Result<TaskKind> ParseTaskKind(std::string_view name);

// One safetensors file of an export: its name and its tensors, in order.
struct ExportFileTask {
  std::string name;
  std::vector<std::string> tensors;
};

// A task. Besides the envelope (id, job, kind), each field belongs to the kinds named.
struct Task {
  std::string id;
  std::string job;
  TaskKind kind = TaskKind::kAbort;
  Mesh mesh;                        // all but abort and save_ended
  int64_t rank = 0;                 // all but abort and save_ended: this worker's rank in `mesh`
  std::vector<std::string> workers; // collective, mesh_init: the mesh's workers by rank
  int64_t step = 0;                 // snapshot, save_ended (and the seam's write)
  std::optional<std::vector<std::string>> tensor_names;  // snapshot: only these
  std::string staging;              // snapshot, import: the staging dir (and the seam's write)
  bool compress = true;             // snapshot, import: zstd, else raw chunks
  int64_t level = 1;                // snapshot, import: zstd level
  bool full = false;                // snapshot: write every chunk (SaveRequest::full)
  int64_t full_every = 10;          // snapshot: SaveRequest::full_every
  bool from_memory = false;         // snapshot: the memory checkpoint of `step` (SaveRequest::from_memory)
  std::string dir;                  // restore, export: the committed checkpoint's dir
  std::vector<TensorMeta> tensors;  // restore: what to read, in the target layout;
                                    // import: the tensors planned from `sources`
  std::string out_dir;              // export: where the files go
  std::vector<ExportFileTask> files;  // export: the files this worker writes
  uint64_t block_bytes = 64 << 20;  // export: bytes of a tensor in memory at a time
  std::vector<std::string> sources;  // import: the safetensors files this worker writes
  Json request;                     // collective: the job's request
  int64_t timeout_ms = 10000;       // collective, mesh_init
  std::string mesh_name;            // abort of a collective: the mesh whose group stops;
                                    // save_ended: the checkpoint's mesh
  Status error;                     // abort: why the job failed; save_ended: ok = committed
};

// A task of `kind` for the worker of `rank` in `mesh` (id and job are the engine's).
Task MeshTask(TaskKind kind, const Mesh& mesh, int64_t rank);

Json TaskToJson(const Task& task);
Result<Task> TaskFromJson(const Json& j);

// snapshot: every tensor this worker holds of the mesh, with the devices it holds.
struct SnapshotTensor {
  TensorMeta meta;
  std::vector<int64_t> devices;
};
struct SnapshotResult {
  std::vector<SnapshotTensor> tensors;
  uint64_t snapshot_bytes = 0;
};
Json SnapshotResultToJson(const SnapshotResult& r);
Result<SnapshotResult> SnapshotResultFromJson(const Json& j);

// write: the fragment it wrote (none when it had no slices to write).
struct WriteResult {
  std::optional<std::string> fragment;
  uint64_t bytes = 0;
  uint64_t stored_bytes = 0;
};
Json WriteResultToJson(const WriteResult& r);
Result<WriteResult> WriteResultFromJson(const Json& j);

struct RestoreResult {
  uint64_t bytes = 0;              // restored into its devices
  uint64_t stored_bytes_read = 0;  // read from storage
  int64_t tensors = 0;
};
Json RestoreResultToJson(const RestoreResult& r);
Result<RestoreResult> RestoreResultFromJson(const Json& j);

// export: what the worker wrote.
struct ExportResult {
  std::vector<std::string> files;
  uint64_t bytes = 0;
};
Json ExportResultToJson(const ExportResult& r);
Result<ExportResult> ExportResultFromJson(const Json& j);

// A worker's report on a task: progress while it runs, then its outcome.
enum class ReportState { kRunning, kSucceeded, kFailed };
std::string_view ReportStateName(ReportState state);

struct TaskReport {
  ReportState state = ReportState::kRunning;
  uint64_t done_bytes = 0;
  uint64_t total_bytes = 0;
  Json result;   // succeeded: the kind's result
  Status error;  // failed
};
Json TaskReportToJson(const TaskReport& r);
Result<TaskReport> TaskReportFromJson(const Json& j);

}  // namespace tessera
