// Export and import jobs (service/safetensors_machines.h), checked at the door: an
// export plans its files from the checkpoint's record; an import is a save whose
// tensors come from safetensors files (CreateSaveJob), so it reserves its step, and
// commits or abandons it, as a save does.
#include "service/safetensors_machines.h"
#include "service/service.h"
#include "storage/safetensors_import.h"

namespace tessera::service {

Result<Json> Service::StartExport(const std::string& mesh, const std::string& step,
                                  const ExportRequest& request) {
  const std::string job_id = NewJobId();
  ASSIGN_OR_RETURN(CheckpointRecord c, checkpoints_.Hold(mesh, step, job_id));
  auto m = meshes_.Hold(mesh, job_id);
  if (!m.ok()) {
    checkpoints_.Release(c.key(), job_id);
    return m.status().WithContext("an export is written by the workers of the checkpoint's mesh; without them, "
                                  "`tessera export` writes it from this machine");
  }
  JobSpec spec = JobSpec::Of(job_id, *m, c.step, options_.job_timeout_ms);
  spec.holds_mesh = true;
  spec.held_checkpoint = c.key();
  std::vector<TensorMeta> tensors;
  for (const Json& tj : c.tensors) {
    auto meta = TensorMetaFromJson(tj);
    if (!meta.ok()) {
      ReleaseHolds(spec);
      return meta.status().WithContext("the catalog's record of checkpoint " + c.key());
    }
    tensors.push_back(std::move(*meta));
  }
  // At least a file per worker (as the tensors allow), so that every worker writes.
  auto files = storage::PlanExportFiles(tensors, request.max_file_bytes,
                                        static_cast<size_t>(m->mesh.num_workers()));
  RETURN_IF_ERROR(CreateJob(spec, "export", mesh, request.ToJson()));
  Launch(std::make_unique<ExportMachine>(std::move(spec), std::move(files), request.dir));
  return Json{{"job", job_id}, {"checkpoint", c.Summary()}};
}

Result<Json> Service::StartImport(const std::string& mesh, const ImportRequest& request) {
  if (env_->IsObjectStore(request.source)) {
    return InvalidArgument("an import reads safetensors files from a file system every worker sees; " +
                               request.source + " is in an object store",
                           {{"field", "source"}});
  }
  const std::string job_id = NewJobId();
  ASSIGN_OR_RETURN(MeshRecord m, meshes_.Hold(mesh, job_id));
  SaveRequest save = request.save;
  if (!save.metadata.contains("imported_from")) save.metadata["imported_from"] = request.source;
  ASSIGN_OR_RETURN(CheckpointRecord c, CreateSaveJob(job_id, m, save, /*joined=*/false, &request));
  return Json{{"job", c.job}, {"checkpoint", c.Summary()}};
}

Result<Json> Service::ReadSafetensorsIo(const Json& input) {
  ASSIGN_OR_RETURN(auto files, storage::ReadSafetensorsSource(env_, input.value("source", "")));
  Json out = Json::array();
  for (const auto& f : files) {
    Json tensors = Json::array();
    for (const auto& t : f.header.tensors) tensors.push_back(TensorMetaToJson(storage::ImportedTensor(t)));
    out.push_back({{"path", f.path}, {"bytes", f.bytes}, {"tensors", std::move(tensors)}});
  }
  return Json{{"files", std::move(out)}};
}

Result<Json> Service::WriteExportIndexIo(const Json& input) {
  std::vector<storage::ExportFile> files;
  for (const Json& f : input.value("files", Json::array())) {
    files.push_back({f.value("name", ""), f.value("tensors", std::vector<std::string>{}),
                     f.value("bytes", uint64_t{0})});
  }
  const std::string dir = input.value("dir", "");
  RETURN_IF_ERROR(env_->CreateDirs(dir));
  RETURN_IF_ERROR(storage::WriteExportIndex(env_, dir, files));
  return Json::object();
}

}  // namespace tessera::service
