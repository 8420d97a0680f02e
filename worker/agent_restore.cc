// The agent's side of a trainer's restore and checkpoint lookups (routes in
// trainer_api.cc). A restore of "latest", or of a named step of the memory tier, first
// agrees with the mesh's other workers
// on one step, in memory or persisted (agent_memory_restore.cc); a persisted one is
// then restored here: it matches the
// checkpoint against the tensors this worker holds (restore_match.h) before it asks
// tesserad for a restore job of this worker alone.
#include <chrono>
#include <cstring>

#include "api/names.h"
#include "worker/agent.h"
#include "worker/borrowed_snapshot.h"
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

// Ends a restore's loans of the trainer's memory (TensorStore::Borrow), however it returns.
struct Lent {
  TensorStore* store;
  std::string mesh;
  std::vector<std::string> names;
  ~Lent() { store->EndLoans(mesh, names); }
};

}  // namespace

Result<Json> Agent::RestoreForTrainer(const std::string& mesh, const std::string& step,
                                      const Json& body, int64_t timeout_ms) {
  ASSIGN_OR_RETURN(auto names, OptionalNameList(body, "tensors"));
  ASSIGN_OR_RETURN(std::optional<bool> strict, OptionalBool(body, "strict"));
  // "into": the trainer's fresh buffers, written in place and lent only for this call.
  Lent lent{store_, mesh, {}};
  if (body.contains("into")) {
    ASSIGN_OR_RETURN(MeshPlacement placement, store_->Placement(mesh));
    ASSIGN_OR_RETURN(auto into, BorrowedSnapshot(placement, body["into"], "into"));
    for (const Snapshot::Tensor& t : into->tensors) {
      lent.names.push_back(t.name);
      for (const Snapshot::Shard& s : t.shards) {
        RETURN_IF_ERROR(store_->Borrow(mesh, t.name, t.desc, s.device, s.borrowed));
      }
    }
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string resolved = step;
  std::string fallback;  // why a newer memory checkpoint was not taken
  if (step == "latest") {
    int64_t persisted = -1;
    ASSIGN_OR_RETURN(auto from_memory,
                     RestoreFromMemory(mesh, std::nullopt, body, timeout_ms, &persisted, &fallback));
    if (from_memory) return std::move(*from_memory);
    if (persisted < 0) {
      return NotFound("mesh " + mesh + " has no committed checkpoint that every worker saw" +
                          (fallback.empty() ? "" : " (" + fallback + ")"),
                      {{"mesh", mesh}, {"step", "latest"}});
    }
    resolved = std::to_string(persisted);
  } else if (auto s = ParseStep(step); s.ok()) {
    // A named step of the memory tier: every worker restores it, or none does.
    int64_t persisted = -1;
    ASSIGN_OR_RETURN(auto from_memory, RestoreFromMemory(mesh, *s, body, timeout_ms, &persisted, &fallback));
    if (from_memory) return std::move(*from_memory);
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
              {"tier", "persisted"},
              {"source", "root"},
              {"missing", match.missing},
              {"unexpected", match.unexpected},
              {"metadata", ck.value("metadata", Json::object())},
              {"job", nullptr},
              {"bytes", 0},
              {"tensors", Json::array()}};
  if (!fallback.empty()) out["fallback"] = fallback;
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
