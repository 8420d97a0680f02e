// A restore: a read plan per target device (any mesh, any layout), read by every
// target worker; tensors land in the target mesh's workers.
#include <algorithm>
#include <set>

#include "api/names.h"
#include "service/service.h"
#include "storage/checkpoint_dir.h"
#include "storage/index.h"

namespace tessera::service {
namespace {

// The saved layout carried over to `mesh`: axes the mesh lacks, or that do not
// divide the dimension, become unsharded.
Layout AdaptLayout(const Layout& saved, const Shape& shape, const Mesh& mesh) {
  Layout out = saved;
  std::set<std::string> used;
  for (size_t i = 0; i < out.dims.size(); ++i) {
    const std::string& ax = out.dims[i];
    if (ax == kUnsharded) continue;
    int idx = mesh.AxisIndex(ax);
    if (idx < 0 || shape[i] % mesh.axes[idx].size != 0 || !used.insert(ax).second) {
      out.dims[i] = kUnsharded;
    }
  }
  return out;
}

}  // namespace

Result<Json> Service::StartRestore(const std::string& mesh, const std::string& step,
                                   const Json& body) {
  RETURN_IF_ERROR(RequireObject(body));
  ASSIGN_OR_RETURN(auto target, OptionalString(body, "target_mesh"));
  if (body.contains("tensors") && !body["tensors"].is_null() && !body["tensors"].is_array()) {
    return InvalidArgument("field 'tensors' must be a list", {{"field", "tensors"}});
  }
  if (body.contains("layouts") && !body["layouts"].is_null() && !body["layouts"].is_object()) {
    return InvalidArgument("field 'layouts' must be an object {tensor: layout}",
                           {{"field", "layouts"}});
  }
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(CheckpointRecord * c, FindCommitted(mesh, step));
  const std::string target_mesh = target.value_or(mesh);
  ASSIGN_OR_RETURN(const MeshRecord* t, ReadyMesh(target_mesh, "target_mesh"));
  if (body.contains("workers") && !body["workers"].is_null()) {
    // Only these workers of the target mesh restore (a trainer restoring its own host).
    if (!body["workers"].is_array() || body["workers"].empty()) {
      return InvalidArgument("field 'workers' must be a non-empty list of worker ids",
                             {{"field", "workers"}});
    }
    const auto& members = t->workers;
    for (const auto& w : body["workers"]) {
      if (!w.is_string() ||
          std::find(members.begin(), members.end(), w.get<std::string>()) == members.end()) {
        return InvalidArgument("worker " + (w.is_string() ? w.get<std::string>() : w.dump()) +
                                   " is not a worker of mesh " + target_mesh,
                               {{"field", "workers"}, {"worker", w}, {"mesh", target_mesh}});
      }
    }
  }
  Json request = body;
  request["target_mesh"] = target_mesh;
  JobRecord* job = NewJob("restore", mesh, c->step, request);
  Launch(job->id, &Service::RunRestore);
  return Json{{"job", job->id}, {"checkpoint", c->Summary()}};
}

Status Service::RunRestore(const std::string& job_id) {
  MutexLock lock(mu_);
  JobRecord& job0 = BeginJob(job_id);
  const Json request = job0.request;
  const std::string mesh_name = job0.mesh;
  const int64_t step = job0.step;
  std::string dir;
  const std::string target_name = request.value("target_mesh", job0.mesh);
  Json result;
  // Drops mu_ through mu_ itself, as RunSave does.
  Status st = [&]() REQUIRES(mu_) -> Status {
    auto t = meshes_.find(target_name);
    if (t == meshes_.end()) return NotFound("no mesh " + target_name, {{"mesh", target_name}});
    const MeshRecord target = t->second;
    SetPhase(job_id, "plan");
    mu_.unlock();
    auto committed = storage::CommittedDir(env_, options_.checkpoint_root, mesh_name, step);
    if (committed.ok()) dir = *committed;
    auto index = committed.ok() ? storage::CheckpointIndex::Open(env_, dir)
                                : Result<storage::CheckpointIndex>(committed.status());
    mu_.lock();
    RETURN_IF_ERROR(index.status());
    // Tensors in the order asked for (SEMANTICS: names are restored in the order given).
    std::vector<storage::TensorMeta> wanted;
    const Json names = request.value("tensors", Json());
    const Json layouts = request.value("layouts", Json::object());
    auto add = [&](const std::string& name, const Json& spec) -> Status {
      const storage::TensorEntry* e = index->Find(name);
      if (!e) {
        return NotFound("checkpoint " + job0.mesh + " step " + std::to_string(job0.step) +
                            " has no tensor '" + name + "'",
                        {{"tensor", name}});
      }
      storage::TensorMeta m = e->meta;
      if (spec.is_object()) {
        if (spec.contains("dtype")) {
          ASSIGN_OR_RETURN(DType want, DTypeFromJson(spec["dtype"], "tensors[].dtype"));
          if (want != m.dtype) {
            return InvalidArgument("tensor '" + name + "': the checkpoint holds " +
                                       std::string(DTypeName(m.dtype)) + " but " +
                                       std::string(DTypeName(want)) + " was asked for",
                                   {{"tensor", name}, {"field", "dtype"}});
          }
        }
        if (spec.contains("shape")) {
          ASSIGN_OR_RETURN(Shape want, ShapeFromJson(spec["shape"], "tensors[].shape"));
          if (want != m.shape) {
            return InvalidArgument("tensor '" + name + "': the checkpoint holds shape [" +
                                       ShapeToString(m.shape) + "] but [" + ShapeToString(want) +
                                       "] was asked for",
                                   {{"tensor", name}, {"field", "shape"}});
          }
        }
      }
      if (layouts.is_object() && layouts.contains(name)) {
        ASSIGN_OR_RETURN(m.layout, LayoutFromJson(layouts[name], "layouts." + name));
        Status v = ValidateLayout(target.mesh, m.layout, m.shape);
        if (!v.ok()) return v.WithContext("tensor '" + name + "'").WithDetail("tensor", name);
      } else {
        m.layout = AdaptLayout(m.layout, m.shape, target.mesh);
      }
      wanted.push_back(m);
      return Status::Ok();
    };
    if (names.is_array()) {
      for (const auto& n : names) {
        if (n.is_string()) {
          RETURN_IF_ERROR(add(n.get<std::string>(), Json()));
        } else if (n.is_object() && n.contains("name") && n["name"].is_string()) {
          RETURN_IF_ERROR(add(n["name"].get<std::string>(), n));
        } else {
          return InvalidArgument("each entry of 'tensors' is a name or {name, dtype?, shape?}",
                                 {{"field", "tensors"}});
        }
      }
    } else {
      for (const auto& e : index->tensors()) RETURN_IF_ERROR(add(e.meta.name, Json()));
    }
    SetPhase(job_id, "read");
    std::vector<int64_t> ranks;  // every worker of the target mesh, or those asked for
    const Json only = request.value("workers", Json());
    for (int64_t r = 0; r < target.mesh.num_workers(); ++r) {
      if (only.is_array() && std::find(only.begin(), only.end(), Json(target.workers[r])) ==
                                 only.end()) {
        continue;
      }
      ranks.push_back(r);
    }
    std::map<int64_t, Task> tasks;
    uint64_t total = 0;
    Json tensors = Json::array();
    for (const auto& m : wanted) {
      tensors.push_back(TensorMetaToJson(m));
      total += NumElements(LocalShape(target.mesh, m.layout, m.shape)) * DTypeSize(m.dtype) *
               target.mesh.devices_per_worker * ranks.size();
    }
    for (int64_t r : ranks) {
      Task& t = tasks[r] = MeshTask(TaskKind::kRestore, target.mesh, r);
      t.dir = dir;
      t.tensors = wanted;
    }
    ASSIGN_OR_RETURN(auto done, RunTasks(job_id, target.workers, std::move(tasks), total));
    uint64_t read = 0;
    for (const auto& [rank, res] : done) {
      auto restored = RestoreResultFromJson(res);
      if (!restored.ok()) {
        return restored.status().WithContext("the restore of worker " + target.workers[rank]);
      }
      read += restored->stored_bytes_read;
    }
    Json names_out = Json::array();
    for (const auto& m : wanted) names_out.push_back(m.name);
    result = {{"target_mesh", target_name}, {"tensors", names_out}, {"bytes", total},
              {"stored_bytes_read", read}, {"layouts", tensors}};
    metrics_.ObserveRestore((WallMs() - jobs_.at(job_id).started_ms) / 1000.0, total);
    return Status::Ok();
  }();
  FinishJob(job_id, st, result);
  return st;
}

}  // namespace tessera::service
