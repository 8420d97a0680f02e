#include "api/task_protocol.h"

#include <algorithm>

namespace tessera {
namespace {

struct KindName {
  TaskKind kind;
  std::string_view name;
};
constexpr KindName kKinds[] = {
    {TaskKind::kSnapshot, "snapshot"},     {TaskKind::kWrite, "write"},
    {TaskKind::kRestore, "restore"},       {TaskKind::kCollective, "collective"},
    {TaskKind::kMeshInit, "mesh_init"},    {TaskKind::kAbort, "abort"},
    {TaskKind::kSaveEnded, "save_ended"}, {TaskKind::kExport, "export"},
    {TaskKind::kImport, "import"},         {TaskKind::kMemorySave, "memory_save"},
};

Result<std::vector<std::string>> StringList(const Json& j, const std::string& field) {
  const Json list = j.value(field, Json::array());
  if (!list.is_array()) return InvalidArgument(field + " must be a list", {{"field", field}});
  std::vector<std::string> out;
  for (const Json& s : list) {
    if (!s.is_string()) return InvalidArgument(field + " must be strings", {{"field", field}});
    out.push_back(s.get<std::string>());
  }
  return out;
}

Json MetasToJson(const std::vector<TensorMeta>& metas) {
  Json tensors = Json::array();
  for (const TensorMeta& m : metas) tensors.push_back(TensorMetaToJson(m));
  return tensors;
}

Result<std::vector<TensorMeta>> MetasFromJson(const Json& j) {
  const Json tensors = j.value("tensors", Json::array());
  if (!tensors.is_array()) return InvalidArgument("tensors must be a list", {{"field", "tensors"}});
  std::vector<TensorMeta> out;
  for (const Json& m : tensors) {
    ASSIGN_OR_RETURN(TensorMeta meta, TensorMetaFromJson(m));
    out.push_back(std::move(meta));
  }
  return out;
}

Result<uint64_t> OptionalBytes(const Json& j, const std::string& field) {
  ASSIGN_OR_RETURN(std::optional<int64_t> v, OptionalInt(j, field));
  if (v && *v < 0) return InvalidArgument(field + " must be ≥ 0", {{"field", field}});
  return static_cast<uint64_t>(v.value_or(0));
}

}  // namespace

std::string_view TaskKindName(TaskKind kind) {
  for (const KindName& k : kKinds) {
    if (k.kind == kind) return k.name;
  }
  return "?";
}

Result<TaskKind> ParseTaskKind(std::string_view name) {
  for (const KindName& k : kKinds) {
    if (k.name == name) return k.kind;
  }
  return InvalidArgument("unknown task kind '" + std::string(name) + "'", {{"field", "kind"}});
}

Task MeshTask(TaskKind kind, const Mesh& mesh, int64_t rank) {
  Task t;
  t.kind = kind;
  t.mesh = mesh;
  t.rank = rank;
  return t;
}

Json TaskToJson(const Task& t) {
  Json j = {{"id", t.id}, {"job", t.job}, {"kind", TaskKindName(t.kind)}};
  if (t.kind == TaskKind::kAbort) {
    if (!t.mesh_name.empty()) j["mesh_name"] = t.mesh_name;
    if (!t.error.ok()) j["error"] = ErrorBody(t.error)["error"];
    return j;
  }
  if (t.kind == TaskKind::kSaveEnded) {
    j["mesh_name"] = t.mesh_name;
    j["step"] = t.step;
    if (!t.error.ok()) j["error"] = ErrorBody(t.error)["error"];
    return j;
  }
  j["mesh"] = MeshToJson(t.mesh);
  j["rank"] = t.rank;
  switch (t.kind) {
    case TaskKind::kSnapshot:
      j["step"] = t.step;
      j["tensors"] = t.tensor_names ? Json(*t.tensor_names) : Json();
      j["staging"] = t.staging;
      j["compression"] = t.compress ? "zstd" : "none";
      j["level"] = t.level;
      j["full"] = t.full;
      j["full_every"] = t.full_every;
      if (t.from_memory) j["from_memory"] = true;
      break;
    case TaskKind::kRestore:
      j["dir"] = t.dir;
      j["tensors"] = MetasToJson(t.tensors);
      break;
    case TaskKind::kExport: {
      j["dir"] = t.dir;
      j["out_dir"] = t.out_dir;
      Json files = Json::array();
      for (const ExportFileTask& f : t.files) files.push_back({{"name", f.name}, {"tensors", f.tensors}});
      j["files"] = std::move(files);
      j["block_bytes"] = t.block_bytes;
      break;
    }
    case TaskKind::kImport:
      j["step"] = t.step;
      j["staging"] = t.staging;
      j["sources"] = t.sources;
      j["tensors"] = MetasToJson(t.tensors);
      j["compression"] = t.compress ? "zstd" : "none";
      j["level"] = t.level;
      break;
    case TaskKind::kCollective:
    case TaskKind::kMeshInit:
    case TaskKind::kMemorySave:
      j["workers"] = t.workers;
      j["request"] = t.request;
      j["timeout_ms"] = t.timeout_ms;
      break;
    case TaskKind::kWrite:  // never sent: the task seam's name for a save's write
    case TaskKind::kAbort:
    case TaskKind::kSaveEnded:
      break;
  }
  return j;
}

Result<Task> TaskFromJson(const Json& j) {
  RETURN_IF_ERROR(RequireObject(j, "task"));
  Task t;
  ASSIGN_OR_RETURN(t.id, RequiredString(j, "id"));
  ASSIGN_OR_RETURN(t.job, RequiredString(j, "job"));
  ASSIGN_OR_RETURN(std::string kind, RequiredString(j, "kind"));
  ASSIGN_OR_RETURN(t.kind, ParseTaskKind(kind));
  if (t.kind == TaskKind::kWrite) {
    return InvalidArgument("'write' is a save's phase on a worker, never a task tesserad sends",
                           {{"field", "kind"}});
  }
  if (t.kind == TaskKind::kAbort) {
    ASSIGN_OR_RETURN(std::optional<std::string> mesh, OptionalString(j, "mesh_name"));
    t.mesh_name = mesh.value_or("");
    if (j.contains("error") && !j["error"].is_null()) {
      t.error = StatusFromErrorJson(j["error"], "").WithContext("job " + t.job + " failed");
    }
    return t;
  }
  if (t.kind == TaskKind::kSaveEnded) {
    ASSIGN_OR_RETURN(t.mesh_name, RequiredString(j, "mesh_name"));
    ASSIGN_OR_RETURN(t.step, RequiredInt(j, "step"));
    if (j.contains("error") && !j["error"].is_null()) {
      t.error = StatusFromErrorJson(j["error"], "the save failed without an error");
    }
    return t;
  }
  ASSIGN_OR_RETURN(t.mesh, MeshFromJson(j.value("mesh", Json())));
  ASSIGN_OR_RETURN(t.rank, RequiredInt(j, "rank"));
  if (t.rank < 0 || t.rank >= t.mesh.num_workers()) {
    return InvalidArgument("rank " + std::to_string(t.rank) + " is not a rank of mesh " +
                               t.mesh.ToString(),
                           {{"field", "rank"}});
  }
  switch (t.kind) {
    case TaskKind::kSnapshot: {
      ASSIGN_OR_RETURN(t.step, RequiredInt(j, "step"));
      ASSIGN_OR_RETURN(t.tensor_names, OptionalNameList(j, "tensors"));
      ASSIGN_OR_RETURN(t.staging, RequiredString(j, "staging"));
      ASSIGN_OR_RETURN(std::optional<std::string> compression, OptionalString(j, "compression"));
      t.compress = compression.value_or("zstd") == "zstd";
      ASSIGN_OR_RETURN(std::optional<int64_t> level, OptionalInt(j, "level"));
      t.level = level.value_or(1);
      ASSIGN_OR_RETURN(std::optional<bool> full, OptionalBool(j, "full"));
      t.full = full.value_or(false);
      ASSIGN_OR_RETURN(std::optional<int64_t> full_every, OptionalInt(j, "full_every"));
      t.full_every = std::max<int64_t>(1, full_every.value_or(10));
      ASSIGN_OR_RETURN(std::optional<bool> from_memory, OptionalBool(j, "from_memory"));
      t.from_memory = from_memory.value_or(false);
      break;
    }
    case TaskKind::kRestore: {
      ASSIGN_OR_RETURN(t.dir, RequiredString(j, "dir"));
      ASSIGN_OR_RETURN(t.tensors, MetasFromJson(j));
      break;
    }
    case TaskKind::kExport: {
      ASSIGN_OR_RETURN(t.dir, RequiredString(j, "dir"));
      ASSIGN_OR_RETURN(t.out_dir, RequiredString(j, "out_dir"));
      const Json files = j.value("files", Json::array());
      if (!files.is_array()) return InvalidArgument("files must be a list", {{"field", "files"}});
      for (const Json& f : files) {
        RETURN_IF_ERROR(RequireObject(f, "files[]"));
        ExportFileTask file;
        ASSIGN_OR_RETURN(file.name, RequiredString(f, "name"));
        ASSIGN_OR_RETURN(file.tensors, StringList(f, "tensors"));
        t.files.push_back(std::move(file));
      }
      ASSIGN_OR_RETURN(std::optional<int64_t> block, OptionalInt(j, "block_bytes"));
      if (block && *block < 1) return InvalidArgument("block_bytes must be ≥ 1", {{"field", "block_bytes"}});
      t.block_bytes = block ? static_cast<uint64_t>(*block) : t.block_bytes;
      break;
    }
    case TaskKind::kImport: {
      ASSIGN_OR_RETURN(t.step, RequiredInt(j, "step"));
      ASSIGN_OR_RETURN(t.staging, RequiredString(j, "staging"));
      ASSIGN_OR_RETURN(t.sources, StringList(j, "sources"));
      ASSIGN_OR_RETURN(t.tensors, MetasFromJson(j));
      ASSIGN_OR_RETURN(std::optional<std::string> compression, OptionalString(j, "compression"));
      t.compress = compression.value_or("zstd") == "zstd";
      ASSIGN_OR_RETURN(std::optional<int64_t> level, OptionalInt(j, "level"));
      t.level = level.value_or(1);
      break;
    }
    case TaskKind::kCollective:
    case TaskKind::kMeshInit:
    case TaskKind::kMemorySave: {
      const Json workers = j.value("workers", Json::array());
      if (!workers.is_array()) return InvalidArgument("workers must be a list", {{"field", "workers"}});
      for (const Json& w : workers) {
        if (!w.is_string()) return InvalidArgument("workers must be ids", {{"field", "workers"}});
        t.workers.push_back(w.get<std::string>());
      }
      t.request = j.value("request", Json::object());
      ASSIGN_OR_RETURN(std::optional<int64_t> timeout, OptionalInt(j, "timeout_ms"));
      t.timeout_ms = timeout.value_or(10000);
      break;
    }
    case TaskKind::kWrite:
    case TaskKind::kAbort:
    case TaskKind::kSaveEnded:
      break;
  }
  return t;
}

Json SnapshotResultToJson(const SnapshotResult& r) {
  Json tensors = Json::array();
  for (const SnapshotTensor& t : r.tensors) {
    Json tj = TensorMetaToJson(t.meta);
    tj["devices"] = t.devices;
    tensors.push_back(std::move(tj));
  }
  return {{"tensors", std::move(tensors)}, {"snapshot_bytes", r.snapshot_bytes}};
}

Result<SnapshotResult> SnapshotResultFromJson(const Json& j) {
  RETURN_IF_ERROR(RequireObject(j, "snapshot result"));
  SnapshotResult r;
  const Json tensors = j.value("tensors", Json::array());
  if (!tensors.is_array()) return InvalidArgument("tensors must be a list", {{"field", "tensors"}});
  for (const Json& tj : tensors) {
    SnapshotTensor t;
    ASSIGN_OR_RETURN(t.meta, TensorMetaFromJson(tj));
    const Json devices = tj.value("devices", Json::array());
    if (!devices.is_array()) return InvalidArgument("devices must be a list", {{"field", "devices"}});
    for (const Json& d : devices) {
      if (!d.is_number_integer()) {
        return InvalidArgument("devices must be integers", {{"field", "devices"}});
      }
      t.devices.push_back(d.get<int64_t>());
    }
    r.tensors.push_back(std::move(t));
  }
  ASSIGN_OR_RETURN(r.snapshot_bytes, OptionalBytes(j, "snapshot_bytes"));
  return r;
}

Json ExportResultToJson(const ExportResult& r) { return {{"files", r.files}, {"bytes", r.bytes}}; }

Result<ExportResult> ExportResultFromJson(const Json& j) {
  RETURN_IF_ERROR(RequireObject(j, "export result"));
  ExportResult r;
  ASSIGN_OR_RETURN(r.files, StringList(j, "files"));
  ASSIGN_OR_RETURN(r.bytes, OptionalBytes(j, "bytes"));
  return r;
}

Json WriteResultToJson(const WriteResult& r) {
  return {{"fragment", r.fragment ? Json(*r.fragment) : Json()},
          {"bytes", r.bytes},
          {"stored_bytes", r.stored_bytes}};
}

Result<WriteResult> WriteResultFromJson(const Json& j) {
  RETURN_IF_ERROR(RequireObject(j, "write result"));
  WriteResult r;
  ASSIGN_OR_RETURN(r.fragment, OptionalString(j, "fragment"));
  ASSIGN_OR_RETURN(r.bytes, OptionalBytes(j, "bytes"));
  ASSIGN_OR_RETURN(r.stored_bytes, OptionalBytes(j, "stored_bytes"));
  return r;
}

Json RestoreResultToJson(const RestoreResult& r) {
  return {{"bytes", r.bytes}, {"stored_bytes_read", r.stored_bytes_read}, {"tensors", r.tensors}};
}

Result<RestoreResult> RestoreResultFromJson(const Json& j) {
  RETURN_IF_ERROR(RequireObject(j, "restore result"));
  RestoreResult r;
  ASSIGN_OR_RETURN(r.bytes, OptionalBytes(j, "bytes"));
  ASSIGN_OR_RETURN(r.stored_bytes_read, OptionalBytes(j, "stored_bytes_read"));
  ASSIGN_OR_RETURN(std::optional<int64_t> tensors, OptionalInt(j, "tensors"));
  r.tensors = tensors.value_or(0);
  return r;
}

std::string_view ReportStateName(ReportState state) {
  switch (state) {
    case ReportState::kRunning:
      return "running";
    case ReportState::kSucceeded:
      return "succeeded";
    case ReportState::kFailed:
      return "failed";
  }
  return "?";
}

Json TaskReportToJson(const TaskReport& r) {
  Json j = {{"state", ReportStateName(r.state)},
            {"progress", {{"done_bytes", r.done_bytes}, {"total_bytes", r.total_bytes}}}};
  if (!r.result.is_null()) j["result"] = r.result;
  if (!r.error.ok()) j["error"] = ErrorBody(r.error)["error"];
  return j;
}

Result<TaskReport> TaskReportFromJson(const Json& j) {
  RETURN_IF_ERROR(RequireObject(j));
  TaskReport r;
  ASSIGN_OR_RETURN(std::string state, RequiredString(j, "state"));
  if (state == "running") {
    r.state = ReportState::kRunning;
  } else if (state == "succeeded") {
    r.state = ReportState::kSucceeded;
  } else if (state == "failed") {
    r.state = ReportState::kFailed;
  } else {
    return InvalidArgument("state must be running, succeeded or failed", {{"field", "state"}});
  }
  if (j.contains("progress") && j["progress"].is_object()) {
    ASSIGN_OR_RETURN(r.done_bytes, OptionalBytes(j["progress"], "done_bytes"));
    ASSIGN_OR_RETURN(r.total_bytes, OptionalBytes(j["progress"], "total_bytes"));
  }
  if (j.contains("result")) r.result = j["result"];
  if (r.state == ReportState::kFailed) {
    r.error = StatusFromErrorJson(j.value("error", Json()), "task failed without an error");
  }
  return r;
}

}  // namespace tessera
