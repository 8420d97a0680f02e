// Collectives driven by tesserad: REST collectives jobs on tensors the workers
// hold (docs/openapi.json "Collectives driven over REST") and the self-test every new mesh
// runs at registration (seed 000: the cluster checks itself at init).
#include <set>

#include "api/collective_ops.h"
#include "api/names.h"
#include "service/service.h"

namespace tessera::service {
namespace {

// sparse_all_reduce: `tensor` holds the values, `indices` the indices; the
// output is the dense sum, replicated.
Status CheckSparseBody(const Json& body) {
  ASSIGN_OR_RETURN(std::string indices, RequiredString(body, "indices"));
  RETURN_IF_ERROR(ValidateName(indices, "indices"));
  if (indices == body.value("tensor", "") || indices == body.value("output", "")) {
    return InvalidArgument("indices must differ from tensor and output", {{"field", "indices"}});
  }
  const Json* dense = body.contains("dense_shape") ? &body["dense_shape"] : nullptr;
  if (dense == nullptr || !dense->is_array() || dense->empty()) {
    return InvalidArgument("field 'dense_shape' must be a list of at least one dimension",
                           {{"field", "dense_shape"}});
  }
  Shape shape;
  for (const Json& d : *dense) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) {
      return InvalidArgument("dense_shape: " + d.dump() + " is not a non-negative integer",
                             {{"field", "dense_shape"}});
    }
    shape.push_back(d.get<int64_t>());
  }
  RETURN_IF_ERROR(CheckShapeSize(shape, "dense_shape"));
  ASSIGN_OR_RETURN(auto path, OptionalString(body, "path"));
  if (path && *path != "auto" && *path != "gather" && *path != "dense") {
    return InvalidArgument("path must be auto, gather or dense, not '" + *path + "'",
                           {{"field", "path"}});
  }
  return Status::Ok();
}

// What can be checked without the tensors (which only the workers hold).
Status CheckCollectiveBody(const Mesh& mesh, const Json& body) {
  RETURN_IF_ERROR(RequireObject(body));
  ASSIGN_OR_RETURN(std::string op, RequiredString(body, "op"));
  auto parsed = ParseCollectiveOp(op);
  if (!parsed.ok() || !IsRestCollective(*parsed)) {
    return InvalidArgument("op must be one of " + RestCollectiveNames() + "; not '" + op + "'",
                           {{"field", "op"}});
  }
  if (op != "barrier") {
    ASSIGN_OR_RETURN(std::string tensor, RequiredString(body, "tensor"));
    RETURN_IF_ERROR(ValidateName(tensor, "tensor"));
  }
  if (op != "barrier" && op != "assert_equal") {
    ASSIGN_OR_RETURN(std::string output, RequiredString(body, "output"));
    RETURN_IF_ERROR(ValidateName(output, "output"));
    if (output == body.value("tensor", "")) {
      return InvalidArgument("output must differ from tensor", {{"field", "output"}});
    }
  }
  if (op == "sparse_all_reduce") RETURN_IF_ERROR(CheckSparseBody(body));
  if (body.contains("axes")) {
    if (!body["axes"].is_array()) {
      return InvalidArgument("field 'axes' must be a list of mesh axis names", {{"field", "axes"}});
    }
    for (const Json& a : body["axes"]) {
      if (!a.is_string() || mesh.AxisIndex(a.get<std::string>()) < 0) {
        return InvalidArgument("axes: " + a.dump() + " is not an axis of mesh " + mesh.ToString(),
                               {{"field", "axes"}});
      }
    }
  }
  ASSIGN_OR_RETURN(auto reduce, OptionalString(body, "reduce"));
  if (reduce) RETURN_IF_ERROR(ParseReduceOp(*reduce).status());
  RETURN_IF_ERROR(OptionalBool(body, "tiled").status());
  ASSIGN_OR_RETURN(auto root, OptionalInt(body, "root"));
  if (root && (*root < 0 || *root >= mesh.num_devices())) {
    return InvalidArgument("root must be a position 0.." + std::to_string(mesh.num_devices() - 1),
                           {{"field", "root"}});
  }
  ASSIGN_OR_RETURN(auto timeout, OptionalInt(body, "timeout_ms"));
  if (timeout && (*timeout < 1 || *timeout > 3600 * 1000)) {
    return InvalidArgument("timeout_ms must be 1..3600000", {{"field", "timeout_ms"}});
  }
  return Status::Ok();
}

}  // namespace

Result<Json> Service::StartCollective(const std::string& mesh, const Json& body) {
  MutexLock lock(mu_);
  ASSIGN_OR_RETURN(const MeshRecord* m, ReadyMesh(mesh));
  RETURN_IF_ERROR(CheckCollectiveBody(m->mesh, body));
  JobRecord* job = NewJob("collective", mesh, -1, body);
  Launch(job->id, &Service::RunCollective);
  return Json{{"job", job->id}};
}

// One task per worker of the mesh, each running `request` as its rank.
Result<std::map<int64_t, Json>> Service::RunCollectiveTasks(const std::string& job_id,
                                                            const MeshRecord& mesh,
                                                            TaskKind kind,
                                                            const Json& request,
                                                            int64_t timeout_ms) {
  std::map<int64_t, Task> tasks;
  for (int64_t r = 0; r < mesh.mesh.num_workers(); ++r) {
    Task& t = tasks[r] = MeshTask(kind, mesh.mesh, r);
    t.workers = mesh.workers;
    t.request = request;
    t.timeout_ms = timeout_ms;
  }
  // The workers' own timeout fires first and names the ranks that did not join;
  // this one only covers a worker that never picks its task up.
  auto results = RunTasks(job_id, mesh.workers, std::move(tasks), 0, timeout_ms + 5000);
  if (!results.ok()) {
    // Workers still inside the collective stop now, with the reason.
    AbortOnWorkers(mesh, job_id, /*collective=*/true, results.status());
  }
  return results;
}

Status Service::RunCollective(const std::string& job_id) {
  MutexLock lock(mu_);
  JobRecord& job = BeginJob(job_id);
  const Json request = job.request;
  Json result;
  Status st = [&]() REQUIRES(mu_) -> Status {
    auto m = meshes_.find(job.mesh);
    if (m == meshes_.end()) return NotFound("mesh " + job.mesh + " was deleted", {{"mesh", job.mesh}});
    const MeshRecord mesh = m->second;
    SetPhase(job_id, request.value("op", "collective"));
    ASSIGN_OR_RETURN(auto results,
                     RunCollectiveTasks(job_id, mesh, TaskKind::kCollective, request,
                                        request.value("timeout_ms", int64_t{30000})));
    result = results.at(0);
    result.erase("bytes");
    uint64_t bytes = 0;
    for (const auto& [rank, r] : results) bytes += r.value("bytes", uint64_t{0});
    result["output_bytes"] = bytes;
    return Status::Ok();
  }();
  FinishJob(job_id, st, result);
  return st;
}

Status Service::RunMeshInit(const std::string& job_id) {
  MutexLock lock(mu_);
  JobRecord& job = BeginJob(job_id);
  const int64_t timeout_ms = job.request.value("timeout_ms", int64_t{10000});
  Json result;
  Status st = [&]() REQUIRES(mu_) -> Status {
    auto m = meshes_.find(job.mesh);
    if (m == meshes_.end()) return NotFound("mesh " + job.mesh + " was deleted", {{"mesh", job.mesh}});
    const MeshRecord mesh = m->second;
    SetPhase(job_id, "self_test");
    ASSIGN_OR_RETURN(auto results, RunCollectiveTasks(job_id, mesh, TaskKind::kMeshInit, Json::object(),
                                                      timeout_ms));
    // The merged table must be the same on every worker.
    const std::string digest = results.at(0).value("digest", "");
    for (const auto& [rank, r] : results) {
      if (r.value("digest", "") != digest) {
        const std::string& w = mesh.workers.at(rank);
        return Internal("self-test: worker " + w + " (rank " + std::to_string(rank) +
                            ") merged a different device table than rank 0",
                        {{"worker", w}, {"rank", rank}});
      }
    }
    result = {{"digest", digest}, {"devices", results.at(0).value("devices", Json::array())}};
    return Status::Ok();
  }();
  FinishJob(job_id, st, result);
  return st;
}

}  // namespace tessera::service
