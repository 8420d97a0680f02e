// The agent's side of the training loop (local API):
//   POST /v1/save              snapshot, answer, then start or join the job in the background
//   GET  /v1/saves/{step}      what that save became; waits for its job or its commit
//   POST /v1/restore           restore this worker's devices of a mesh from a committed step
//   GET  /v1/checkpoints       the mesh's checkpoints; /v1/checkpoints/latest the newest
// Nothing the trainer waits for inside a step goes to tesserad: /v1/save answers
// after the copy, and the control plane is reached from a thread of the agent.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <thread>

#include "api/names.h"
#include "worker/agent.h"

namespace tessera::worker {
namespace {

using http::Request;

// Longest wait one /v1/save or GET /v1/saves call may ask for (callers loop).
constexpr int64_t kMaxWaitMs = 60 * 1000;
// A restore answers when it is done: it may take as long as reading the state.
constexpr int64_t kMaxRestoreMs = 3600 * 1000;
// How long the background start of a save retries an unreachable tesserad.
constexpr int64_t kStartRetryMs = 30 * 1000;
// How long an in-loop save may take, from the trainer's call to the commit, unless
// the body's deadline_ms says otherwise; then it is cancelled and reported failed.
constexpr int64_t kDefaultSaveDeadlineMs = 30 * 60 * 1000;
constexpr int64_t kMaxSaveDeadlineMs = 24 * 3600 * 1000;

Result<std::string> MeshQuery(const Request& req) {
  ASSIGN_OR_RETURN(std::string mesh, http::RequiredQuery(req, "mesh"));
  RETURN_IF_ERROR(ValidateName(mesh, "mesh"));
  return mesh;
}

Result<int64_t> StepFrom(const std::string& text, const std::string& field) {
  int64_t step = -1;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), step);
  if (text.empty() || ec != std::errc() || p != text.data() + text.size() || step < 0) {
    return InvalidArgument(field + " must be a non-negative integer, got '" + text.substr(0, 32) +
                               "'",
                           {{"field", field}});
  }
  return step;
}

Result<int64_t> TimeoutQuery(const Request& req, int64_t fallback, int64_t max = kMaxWaitMs) {
  ASSIGN_OR_RETURN(int64_t t, http::QueryInt(req, "timeout_ms", fallback));
  if (t < 0 || t > max) {
    return InvalidArgument("timeout_ms must be 0.." + std::to_string(max),
                           {{"field", "timeout_ms"}});
  }
  return t;
}

Status JobError(const std::string& kind, const std::string& job, const Json& j) {
  const Json e = j.value("error", Json::object());
  return Status(CodeFromName(e.value("code", "internal")),
                kind + " job " + job + " " + j.value("state", "") + ": " + e.value("message", ""),
                e.value("details", Json::object()));
}

}  // namespace

Result<Json> Agent::FollowJob(http::Client* client, const std::string& kind, const std::string& job,
                              int64_t timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    {
      MutexLock lock(mu_);
      if (stopping_) return Unavailable("worker " + id_ + " is stopping");
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      return DeadlineExceeded(kind + " job " + job + " did not end within " +
                                  std::to_string(timeout_ms) + " ms",
                              {{"job", job}});
    }
    const int64_t wait = std::min<int64_t>(left, 2000);
    auto r = client->Call("GET", "/api/v1/jobs/" + job + "?wait_ms=" + std::to_string(wait));
    if (!r.ok()) {
      if (r.status().code() != Code::kUnavailable) return r.status();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // tesserad restarting
      continue;
    }
    const std::string state = r->value("state", "");
    if (state == "succeeded") return *r;
    if (state == "failed" || state == "cancelled") return JobError(kind, job, *r);
  }
}

Result<Json> Agent::SaveFromTrainer(const std::string& mesh, int64_t step, const Json& body,
                                    TrainerSaves::Until until, int64_t timeout_ms) {
  ASSIGN_OR_RETURN(auto names, OptionalNameList(body, "tensors"));
  ASSIGN_OR_RETURN(std::optional<int64_t> deadline, OptionalInt(body, "deadline_ms"));
  if (deadline && (*deadline < 1 || *deadline > kMaxSaveDeadlineMs)) {
    return InvalidArgument("deadline_ms must be 1.." + std::to_string(kMaxSaveDeadlineMs),
                           {{"field", "deadline_ms"}});
  }
  Json job_body = body;
  job_body.erase("deadline_ms");  // ours, not the job's
  // The stall: one copy of this worker's shards. After it the trainer may go on.
  auto t0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(auto snap, store_->TakeSnapshot(mesh, names));
  const double snapshot_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  {
    MutexLock lock(mu_);
    trainer_snapshots_[{mesh, step}] = snap;
  }
  cv_.NotifyAll();
  trainer_saves_.Snapshotted(mesh, step);
  const auto until_ms = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(deadline.value_or(kDefaultSaveDeadlineMs));
  task_threads_.Spawn([this, mesh, step, job_body, until_ms] {
    FollowTrainerSave(mesh, step, job_body, until_ms);
  });
  Json out = {{"checkpoint", {{"mesh", mesh}, {"step", step}}},
              {"snapshot_ms", snapshot_ms},
              {"snapshot_bytes", snap->bytes()}};
  if (until == TrainerSaves::Until::kNow) return out;
  ASSIGN_OR_RETURN(Json w, trainer_saves_.Wait(mesh, step, until, timeout_ms));
  out["job"] = w["job"];
  out["state"] = w["state"];
  return out;
}

void Agent::FollowTrainerSave(const std::string& mesh, int64_t step, Json body,
                              std::chrono::steady_clock::time_point deadline) {
  http::Client client(options_.server, options_.token, 30);
  body["step"] = step;
  body["wait_for_trainer"] = true;
  const std::string path = "/api/v1/meshes/" + http::PercentEncode(mesh) + "/checkpoints";
  auto drop_snapshot = [&] {
    MutexLock lock(mu_);
    trainer_snapshots_.erase({mesh, step});
  };
  // Start the job, or join the one another trainer of the mesh started.
  std::string job;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(kStartRetryMs);
  while (job.empty()) {
    auto started = client.Call("POST", path, body);
    if (started.ok()) {
      job = started->value("job", "");
      continue;
    }
    const Json& d = started.status().details();
    const bool has_details = d.is_object();
    if (started.status().code() == Code::kConflict && has_details && d.contains("job") &&
        d["job"].is_string() && d.value("state", "") != "committed") {
      job = d["job"].get<std::string>();
    } else if (started.status().code() == Code::kUnavailable &&
               !(has_details && d.contains("worker")) &&
               std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // tesserad restarting
    } else {
      std::fprintf(stderr, "worker %s: save of mesh %s step %lld not started: %s\n", id_.c_str(),
                   mesh.c_str(), static_cast<long long>(step), started.status().ToString().c_str());
      drop_snapshot();
      trainer_saves_.Ended(mesh, step, started.status());
      return;
    }
  }
  trainer_saves_.Started(mesh, step, job);
  const int64_t left = std::chrono::duration_cast<std::chrono::milliseconds>(
                           deadline - std::chrono::steady_clock::now())
                           .count();
  auto ended = FollowJob(&client, "save", job, std::max<int64_t>(left, 1));
  if (!ended.ok() && ended.status().code() == Code::kDeadlineExceeded) {
    // Out of time: the job must not commit behind the trainer's back.
    auto cancelled = client.Call("POST", "/api/v1/jobs/" + http::PercentEncodeSegment(job) + "/cancel",
                                 Json::object());
    ended = Status(Code::kDeadlineExceeded,
                   "the save of step " + std::to_string(step) + " of mesh " + mesh +
                       " (job " + job + ") passed its deadline; " +
                       (cancelled.ok() ? "it was cancelled"
                                       : "cancelling it failed: " + cancelled.status().ToString()),
                   {{"job", job}, {"mesh", mesh}, {"step", step}});
  }
  if (!ended.ok()) drop_snapshot();  // a job that failed before taking it
  trainer_saves_.Ended(mesh, step, ended.status());
}

Result<Json> Agent::RestoreForTrainer(const std::string& mesh, const std::string& step,
                                      const Json& body, int64_t timeout_ms) {
  Json request = {{"target_mesh", mesh}, {"workers", {id_}}};
  if (body.contains("tensors")) request["tensors"] = body["tensors"];
  http::Client client(options_.server, options_.token, 30);
  ASSIGN_OR_RETURN(Json started,
                   client.Call("POST",
                               "/api/v1/meshes/" + http::PercentEncode(mesh) + "/checkpoints/" +
                                   http::PercentEncode(step) + "/restore",
                               request));
  const std::string job = started.value("job", "");
  ASSIGN_OR_RETURN(Json done, FollowJob(&client, "restore", job, timeout_ms));
  const Json ck = started.value("checkpoint", Json::object());
  const Json result = done.value("result", Json::object());
  return Json{{"job", job},
              {"checkpoint", {{"mesh", mesh}, {"step", ck.value("step", int64_t{-1})}}},
              {"bytes", result.value("bytes", uint64_t{0})},
              {"tensors", result.value("tensors", Json::array())}};
}

void Agent::AddTrainerRoutes(http::Router* router) {
  router->Add({"POST", "/v1/save", http::JsonHandler([this](const Request& req) -> Result<Json> {
                 ASSIGN_OR_RETURN(std::string mesh, MeshQuery(req));
                 ASSIGN_OR_RETURN(std::string step_text, http::RequiredQuery(req, "step"));
                 ASSIGN_OR_RETURN(int64_t step, StepFrom(step_text, "step"));
                 ASSIGN_OR_RETURN(Json body, http::JsonBody(req));
                 ASSIGN_OR_RETURN(auto until, ParseSaveWait(req.Query("wait").value_or("")));
                 ASSIGN_OR_RETURN(int64_t timeout, TimeoutQuery(req, kMaxWaitMs));
                 return SaveFromTrainer(mesh, step, body, until, timeout);
               }),
               "save from the training loop; answers once this worker's tensors are snapshotted",
               true});
  router->Add({"GET", "/v1/saves/{step}",
               http::JsonHandler([this](const Request& req) -> Result<Json> {
                 ASSIGN_OR_RETURN(std::string mesh, MeshQuery(req));
                 ASSIGN_OR_RETURN(int64_t step, StepFrom(req.Param("step"), "step"));
                 ASSIGN_OR_RETURN(auto until, ParseSaveWait(req.Query("wait").value_or("")));
                 ASSIGN_OR_RETURN(int64_t timeout, TimeoutQuery(req, 30000));
                 return trainer_saves_.Wait(mesh, step, until, timeout);
               }),
               "a save of the training loop: {checkpoint, job, state}; wait=started|committed",
               true});
  router->Add({"POST", "/v1/restore", http::JsonHandler([this](const Request& req) -> Result<Json> {
                 ASSIGN_OR_RETURN(std::string mesh, MeshQuery(req));
                 const std::string step = req.Query("step").value_or("latest");
                 if (step != "latest") RETURN_IF_ERROR(StepFrom(step, "step").status());
                 ASSIGN_OR_RETURN(Json body, http::JsonBody(req));
                 ASSIGN_OR_RETURN(int64_t timeout, TimeoutQuery(req, 600 * 1000, kMaxRestoreMs));
                 return RestoreForTrainer(mesh, step, body, timeout);
               }),
               "restore this worker's devices of a mesh from a committed step (default latest)",
               true});
  router->Add({"GET", "/v1/checkpoints", http::JsonHandler([this](const Request& req) -> Result<Json> {
                 ASSIGN_OR_RETURN(std::string mesh, MeshQuery(req));
                 http::Client client(options_.server, options_.token, 10);
                 ASSIGN_OR_RETURN(Json list, client.Call("GET", "/api/v1/meshes/" +
                                                                    http::PercentEncode(mesh) +
                                                                    "/checkpoints"));
                 return Json{{"checkpoints", list}};
               }),
               "the checkpoints of a mesh, newest first", true});
  router->Add({"GET", "/v1/checkpoints/latest",
               http::JsonHandler([this](const Request& req) -> Result<Json> {
                 ASSIGN_OR_RETURN(std::string mesh, MeshQuery(req));
                 http::Client client(options_.server, options_.token, 10);
                 return client.Call("GET", "/api/v1/meshes/" + http::PercentEncode(mesh) +
                                               "/checkpoints/latest");
               }),
               "the newest committed checkpoint of a mesh", true});
}

}  // namespace tessera::worker
