// The training loop's routes of the worker's local API, over the Agent:
//   POST /v1/save              snapshot, answer, then start or join the job in the background
//   GET  /v1/saves/{step}      what that save became; waits for its job or its commit
//   POST /v1/restore           restore this worker's devices of a mesh from a committed step
//   GET  /v1/checkpoints       the mesh's checkpoints; /v1/checkpoints/{step} one (or
//                              "latest"), with its tensors and metadata
//   POST /v1/checkpoints/{step}/read  boxes of its tensors, read from the root (raw bytes)
//   GET  /v1/preemption        reached_preemption_sync_point(step)
#include "worker/trainer_api.h"

#include "api/names.h"

namespace tessera::worker {
namespace {

using http::Request;

// Longest wait one /v1/save or GET /v1/saves call may ask for (callers loop).
constexpr int64_t kMaxWaitMs = 60 * 1000;
// A restore answers when it is done: it may take as long as reading the state.
constexpr int64_t kMaxRestoreMs = 3600 * 1000;

Result<std::string> MeshQuery(const Request& req) {
  ASSIGN_OR_RETURN(std::string mesh, http::RequiredQuery(req, "mesh"));
  RETURN_IF_ERROR(ValidateName(mesh, "mesh"));
  return mesh;
}

Result<int64_t> TimeoutQuery(const Request& req, int64_t fallback, int64_t max = kMaxWaitMs) {
  ASSIGN_OR_RETURN(int64_t t, http::QueryInt(req, "timeout_ms", fallback));
  if (t < 0 || t > max) {
    return InvalidArgument("timeout_ms must be 0.." + std::to_string(max),
                           {{"field", "timeout_ms"}});
  }
  return t;
}

}  // namespace

void AddTrainerRoutes(http::Router* router, Agent* agent) {
  router->Add({"POST", "/v1/save", http::JsonHandler([agent](const Request& req) -> Result<Json> {
                 ASSIGN_OR_RETURN(std::string mesh, MeshQuery(req));
                 ASSIGN_OR_RETURN(std::string step_text, http::RequiredQuery(req, "step"));
                 ASSIGN_OR_RETURN(int64_t step, ParseStep(step_text, "step"));
                 ASSIGN_OR_RETURN(Json body, http::JsonBody(req));
                 ASSIGN_OR_RETURN(auto until, ParseSaveWait(req.Query("wait").value_or("")));
                 ASSIGN_OR_RETURN(int64_t timeout, TimeoutQuery(req, kMaxWaitMs));
                 return agent->SaveFromTrainer(mesh, step, body, until, timeout);
               }),
               "save from the training loop; answers once this worker's tensors are snapshotted",
               true});
  router->Add({"GET", "/v1/saves/{step}",
               http::JsonHandler([agent](const Request& req) -> Result<Json> {
                 ASSIGN_OR_RETURN(std::string mesh, MeshQuery(req));
                 ASSIGN_OR_RETURN(int64_t step, ParseStep(req.Param("step"), "step"));
                 ASSIGN_OR_RETURN(auto until, ParseSaveWait(req.Query("wait").value_or("")));
                 ASSIGN_OR_RETURN(int64_t timeout, TimeoutQuery(req, 30000));
                 return agent->WaitTrainerSave(mesh, step, until, timeout);
               }),
               "a save of the training loop: {checkpoint, job, state}; wait=started|committed",
               true});
  router->Add({"POST", "/v1/restore", http::JsonHandler([agent](const Request& req) -> Result<Json> {
                 ASSIGN_OR_RETURN(std::string mesh, MeshQuery(req));
                 const std::string step = req.Query("step").value_or("latest");
                 if (step != "latest") RETURN_IF_ERROR(ParseStep(step, "step").status());
                 ASSIGN_OR_RETURN(Json body, http::JsonBody(req));
                 ASSIGN_OR_RETURN(int64_t timeout, TimeoutQuery(req, 600 * 1000, kMaxRestoreMs));
                 return agent->RestoreForTrainer(mesh, step, body, timeout);
               }),
               "restore this worker's devices of a mesh from a committed step (default: the "
               "latest every worker of the mesh saw, agreed with them); strict by default",
               true});
  router->Add({"GET", "/v1/checkpoints", http::JsonHandler([agent](const Request& req) -> Result<Json> {
                 ASSIGN_OR_RETURN(std::string mesh, MeshQuery(req));
                 return agent->Checkpoints(mesh);
               }),
               "the checkpoints of a mesh, newest first", true});
  router->Add({"GET", "/v1/checkpoints/{step}",
               http::JsonHandler([agent](const Request& req) -> Result<Json> {
                 ASSIGN_OR_RETURN(std::string mesh, MeshQuery(req));
                 const std::string step = req.Param("step");
                 if (step != "latest") RETURN_IF_ERROR(ParseStep(step, "step").status());
                 return agent->Checkpoint(mesh, step);
               }),
               "one checkpoint of a mesh (step or \"latest\": the newest committed), with its "
               "tensors and metadata",
               true});
  router->Add({"POST", "/v1/checkpoints/{step}/read",
               http::Handle([agent](const Request& req) -> Result<http::Response> {
                 ASSIGN_OR_RETURN(std::string mesh, MeshQuery(req));
                 const std::string step = req.Param("step");
                 if (step != "latest") RETURN_IF_ERROR(ParseStep(step, "step").status());
                 ASSIGN_OR_RETURN(Json body, http::JsonBody(req));
                 http::Response res;
                 res.content_type = "application/octet-stream";
                 ASSIGN_OR_RETURN(Json read, agent->ReadBoxes(mesh, step, body, &res.body));
                 res.headers = {{"X-Tessera-Step", std::to_string(read.value("step", int64_t{-1}))},
                                {"X-Tessera-Stored-Bytes",
                                 std::to_string(read.value("stored_bytes", uint64_t{0}))}};
                 return res;
               }),
               "boxes {reads: [{tensor, offsets, lengths}]} of a committed checkpoint's tensors, "
               "read from the root: their raw bytes, one after the other",
               true});
  router->Add({"GET", "/v1/preemption", http::JsonHandler([agent](const Request& req) -> Result<Json> {
                 ASSIGN_OR_RETURN(std::string mesh, MeshQuery(req));
                 RETURN_IF_ERROR(http::RequiredQuery(req, "step").status());
                 ASSIGN_OR_RETURN(int64_t step, http::QueryInt(req, "step", -1));
                 ASSIGN_OR_RETURN(int64_t timeout, http::QueryInt(req, "timeout_ms", 60000));
                 return agent->PreemptionSyncPoint(mesh, step, timeout);
               }),
               "reached_preemption_sync_point(step): {sync, sync_step}", true});
}

}  // namespace tessera::worker
