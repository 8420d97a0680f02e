// Collectives driven by tesserad: REST collectives jobs on tensors the workers
// hold (docs/openapi.json "Collectives driven over REST") and the self-test every new mesh
// runs at registration (seed 000: the cluster checks itself at init).
#include <set>

#include "api/collective_ops.h"
#include "api/names.h"
#include "service/collective_machine.h"
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
  const std::string job_id = NewJobId();
  ASSIGN_OR_RETURN(MeshRecord m, meshes_.Hold(mesh, job_id));
  JobSpec spec = JobSpec::Of(job_id, m, -1, options_.job_timeout_ms);
  spec.holds_mesh = true;
  if (Status st = CheckCollectiveBody(m.mesh, body); !st.ok()) {
    ReleaseHolds(spec);
    return st;
  }
  RETURN_IF_ERROR(CreateJob(spec, "collective", mesh, body));
  Launch(std::make_unique<CollectiveMachine>(std::move(spec), TaskKind::kCollective, body,
                                             body.value("timeout_ms", int64_t{30000})));
  return Json{{"job", job_id}};
}

Result<Json> Service::StartMemorySave(const std::string& mesh, const Json& body) {
  ASSIGN_OR_RETURN(int64_t step, RequiredInt(body, "step"));
  if (step < 0) return InvalidArgument("step must be ≥ 0", {{"field", "step"}});
  ASSIGN_OR_RETURN(auto deadline, OptionalInt(body, "deadline_ms"));
  if (deadline && (*deadline < 1 || *deadline > 3600 * 1000)) {
    return InvalidArgument("deadline_ms must be 1..3600000 for a memory checkpoint", {{"field", "deadline_ms"}});
  }
  const std::string job_id = NewJobId();
  ASSIGN_OR_RETURN(MeshRecord m, meshes_.Hold(mesh, job_id));
  JobSpec spec = JobSpec::Of(job_id, m, step, options_.job_timeout_ms);
  spec.holds_mesh = true;
  RETURN_IF_ERROR(CreateJob(spec, "memory_save", mesh, body));
  Launch(std::make_unique<CollectiveMachine>(std::move(spec), TaskKind::kMemorySave, body,
                                             deadline.value_or(60000)));
  return Json{{"job", job_id}, {"checkpoint", {{"mesh", mesh}, {"step", step}, {"tiers", {"memory"}}}}};
}

}  // namespace tessera::service
