// The agent's side of a trainer's restore and checkpoint lookups (routes in
// trainer_api.cc). A restore of "latest" first agrees with the mesh's other workers
// on one step (an all-reduce of their views over the data port), then matches the
// checkpoint against the tensors this worker holds (restore_match.h) before it asks
// tesserad for a restore job of this worker alone.
#include <chrono>
#include <cstring>

#include "api/names.h"
#include "worker/agent.h"
#include "worker/restore_match.h"

namespace tessera::worker {
namespace {

using Clock = std::chrono::steady_clock;

std::string CheckpointsPath(const std::string& mesh) {
  return "/api/v1/meshes/" + http::PercentEncode(mesh) + "/checkpoints";
}

std::string CheckpointPath(const std::string& mesh, const std::string& step) {
  return CheckpointsPath(mesh) + "/" + http::PercentEncodeSegment(step);
}

int64_t LeftMs(Clock::time_point deadline) {
  return std::max<int64_t>(
      1, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
}

}  // namespace

Result<int64_t> Agent::AgreeOnLatest(const std::string& mesh, int64_t timeout_ms) {
  ASSIGN_OR_RETURN(MeshPlacement p, Resolver()(mesh));
  RETURN_IF_ERROR(CheckCollectives());
  // Each worker brings [its latest committed step or -1, -(1 + its rank) if it could
  // not look that up, else 0]; the minimum of both is the step every worker saw
  // committed (steps only commit), and whether one of them failed.
  auto latest = Checkpoint(mesh, "latest");
  int64_t mine[2] = {-1, 0};
  if (latest.ok()) {
    mine[0] = latest->value("step", int64_t{-1});
  } else if (latest.status().code() != Code::kNotFound) {
    mine[1] = -(1 + p.rank);
  }
  CollectiveRequest r;
  r.op = CollectiveOp::kAllReduce;
  r.mesh = mesh;
  r.dtype = DType::kInt64;
  r.shape = {2};
  r.reduce = collectives::ReduceOp::kMin;
  r.timeout_ms = timeout_ms;
  std::vector<collectives::Tensor> inputs;
  for (size_t d = 0; d < p.devices.size(); ++d) {
    collectives::Tensor t = collectives::Tensor::Zeros(DType::kInt64, {2});
    std::memcpy(t.data.data(), mine, sizeof(mine));
    inputs.push_back(std::move(t));
  }
  auto agreed = collectives_->Run(p, r, std::move(inputs));
  if (!agreed.ok()) {
    return agreed.status().WithContext(
        "agreeing on the latest step of mesh " + mesh +
        " with its other workers (a restore without a step is made by every trainer of the "
        "mesh together; to restore alone, name the step)");
  }
  if (mine[1] != 0) return latest.status();
  const auto values = agreed->outputs.at(0).values<int64_t>();
  if (values[1] != 0) {
    const std::string other = MeshCollectives::WorkerName(p, -values[1] - 1);
    return Unavailable("worker " + other + " of mesh " + mesh +
                           " could not look up the latest step, so no worker restores",
                       {{"mesh", mesh}, {"worker", other}});
  }
  if (values[0] < 0) {
    return NotFound("mesh " + mesh + " has no committed checkpoint that every worker saw",
                    {{"mesh", mesh}, {"step", "latest"}});
  }
  return values[0];
}

Result<Json> Agent::RestoreForTrainer(const std::string& mesh, const std::string& step,
                                      const Json& body, int64_t timeout_ms) {
  ASSIGN_OR_RETURN(auto names, OptionalNameList(body, "tensors"));
  ASSIGN_OR_RETURN(std::optional<bool> strict, OptionalBool(body, "strict"));
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string resolved = step;
  if (step == "latest") {
    ASSIGN_OR_RETURN(int64_t agreed, AgreeOnLatest(mesh, timeout_ms));
    resolved = std::to_string(agreed);
  }
  ASSIGN_OR_RETURN(Json ck, Checkpoint(mesh, resolved));
  RestoreRequest request{mesh, ck.value("step", int64_t{-1}), id_, names, strict.value_or(true)};
  if (const std::string state = ck.value("state", ""); state != "committed") {
    return Conflict("checkpoint " + mesh + " step " + std::to_string(request.step) + " is " +
                        state + ", not committed",
                    {{"mesh", mesh}, {"step", request.step}, {"state", state}});
  }
  std::vector<HeldTensor> held;
  for (const TensorInfo& t : store_->List()) {
    if (t.mesh == mesh) held.push_back({t.name, t.desc});
  }
  ASSIGN_OR_RETURN(RestoreMatch match, MatchCheckpoint(request, held, ck.value("tensors", Json())));
  Json out = {{"checkpoint", {{"mesh", mesh}, {"step", request.step}}},
              {"missing", match.missing},
              {"unexpected", match.unexpected},
              {"metadata", ck.value("metadata", Json::object())},
              {"job", nullptr},
              {"bytes", 0},
              {"tensors", Json::array()}};
  if (match.tensors.empty()) return out;  // strict=false and nothing in common
  Json job_request = {{"target_mesh", mesh},
                      {"workers", {id_}},
                      {"tensors", match.tensors},
                      {"layouts", match.layouts}};
  ASSIGN_OR_RETURN(Json started, control_.Call("POST", CheckpointPath(mesh, resolved) + "/restore",
                                               job_request));
  const std::string job = started.value("job", "");
  ASSIGN_OR_RETURN(Json done, FollowJob("restore", job, LeftMs(deadline)));
  const Json result = done.value("result", Json::object());
  out["job"] = job;
  out["bytes"] = result.value("bytes", uint64_t{0});
  out["tensors"] = result.value("tensors", Json::array());
  return out;
}

Result<Json> Agent::Checkpoints(const std::string& mesh) {
  ASSIGN_OR_RETURN(Json list, control_.Call("GET", CheckpointsPath(mesh), nullptr, 10));
  return Json{{"checkpoints", list}};
}

Result<Json> Agent::Checkpoint(const std::string& mesh, const std::string& step) {
  return control_.Call("GET", CheckpointPath(mesh, step), nullptr, 10);
}

}  // namespace tessera::worker
