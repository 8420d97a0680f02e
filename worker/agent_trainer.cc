// The agent's side of the training loop's saves (routes in trainer_api.cc; restores in
// agent_restore.cc): an in-loop save snapshots, answers, then starts or joins the job in
// the background. Nothing the trainer waits for inside a step goes to tesserad:
// /v1/save answers after the copy, and the control plane is reached from a thread of
// the agent.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <thread>

#include "api/clock.h"
#include "api/names.h"
#include "api/requests.h"
#include "worker/agent.h"
#include "worker/borrowed_snapshot.h"

namespace tessera::worker {
namespace {

// The background start of a save retries an unreachable tesserad until the
// save's deadline, waiting this long at first, then twice as long each time.
constexpr int64_t kStartRetryFirstMs = 200;
constexpr int64_t kStartRetryMaxMs = 5000;
// How often a running in-loop save's job is looked up, in case its pushed end was lost.
constexpr int64_t kEndCheckMs = 30 * 1000;
// ... and within this of the worker's calls moving to another tesserad (a takeover,
// docs/ha.md): the new leader knows nothing of the old one's jobs.
constexpr int64_t kMovedCheckMs = 1000;
// How long an in-loop save may take, from the trainer's call to the commit, unless
// the body's deadline_ms says otherwise; then it is cancelled and reported failed.
constexpr int64_t kDefaultSaveDeadlineMs = 30 * 60 * 1000;
constexpr int64_t kMaxSaveDeadlineMs = 24 * 3600 * 1000;

Status JobError(const std::string& kind, const std::string& job, const Json& j) {
  return StatusFromErrorJson(j.value("error", Json::object()), "")
      .WithContext(kind + " job " + job + " " + j.value("state", ""));
}

}  // namespace

Result<Json> Agent::FollowJob(const std::string& kind, const std::string& job, int64_t timeout_ms) {
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
    auto r = control_.Wait("GET", "/api/v1/jobs/" + job + "?wait_ms=" + std::to_string(wait), nullptr,
                           wait);
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

uint64_t Agent::PendingBytes() const {
  uint64_t bytes = 0;
  for (const auto& [key, snap] : trainer_snapshots_) bytes += snap ? snap->bytes() : 0;
  return bytes;
}

Status Agent::CheckPendingRoom(const std::string& mesh, int64_t step) {
  const uint64_t bytes = PendingBytes();
  const int64_t count = static_cast<int64_t>(trainer_snapshots_.size());
  const uint64_t max_bytes = options_.max_pending_save_bytes;
  const bool over_count = count >= options_.max_pending_saves;
  const bool over_bytes = max_bytes > 0 && bytes >= max_bytes;
  if (!over_count && !over_bytes) return Status::Ok();
  Json pending = Json::array();
  for (const auto& [key, snap] : trainer_snapshots_) {
    pending.push_back({{"mesh", key.first}, {"step", key.second}, {"bytes", snap ? snap->bytes() : 0}});
  }
  const std::string limit = over_count
      ? "--max-pending-saves " + std::to_string(options_.max_pending_saves)
      : "--max-pending-save-bytes " + std::to_string(max_bytes);
  return Unavailable(
      "the save of step " + std::to_string(step) + " of mesh " + mesh + " was not taken: " +
          std::to_string(count) + " in-loop save" + (count == 1 ? "" : "s") + " (" +
          std::to_string(bytes) + " bytes) still wait for their job on tesserad, the limit is " +
          limit + "; is tesserad reachable at " + options_.server + "?",
      {{"limit", over_count ? "max_pending_saves" : "max_pending_save_bytes"},
       {"max", over_count ? Json(options_.max_pending_saves) : Json(max_bytes)},
       {"pending", pending},
       {"pending_bytes", bytes},
       {"mesh", mesh},
       {"step", step}});
}

Json Agent::PendingSaves() {
  MutexLock lock(mu_);
  return {{"count", trainer_snapshots_.size()},
          {"bytes", PendingBytes()},
          {"max", options_.max_pending_saves},
          {"max_bytes", options_.max_pending_save_bytes}};
}

Result<Json> Agent::SaveFromTrainer(const std::string& mesh, int64_t step, const Json& body,
                                    TrainerSaves::Until until, int64_t timeout_ms) {
  ASSIGN_OR_RETURN(auto tier, OptionalString(body, "tier"));
  if (tier && *tier == "memory") return SaveToMemory(mesh, step, body, until, timeout_ms);
  if (tier && *tier != "disk") {
    return InvalidArgument("tier must be \"disk\" or \"memory\", not \"" + *tier + "\"", {{"field", "tier"}});
  }
  ASSIGN_OR_RETURN(auto names, OptionalNameList(body, "tensors"));
  ASSIGN_OR_RETURN(std::optional<int64_t> deadline, OptionalInt(body, "deadline_ms"));
  if (deadline && (*deadline < 1 || *deadline > kMaxSaveDeadlineMs)) {
    return InvalidArgument("deadline_ms must be 1.." + std::to_string(kMaxSaveDeadlineMs),
                           {{"field", "deadline_ms"}});
  }
  // The save's request, checked here, before any copy: a bad compression, level or
  // metadata is the trainer's 400, not a save that fails later.
  ASSIGN_OR_RETURN(SaveRequest request, SaveRequest::FromJson(body, step));
  // The mesh's save of this step failed while this trainer was on its way to it: the
  // others have left it, so it gets that failure, not a save that waits for them.
  if (std::optional<Status> missed = trainer_saves_.TakeMissed(mesh, step, MonoMs())) return *missed;
  {
    // Bounded memory while tesserad is away: refused before any copy is made.
    MutexLock lock(mu_);
    RETURN_IF_ERROR(CheckPendingRoom(mesh, step));
  }
  // The stall: one copy of this worker's shards (none of borrowed ones). After it the
  // trainer may go on.
  auto t0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(auto snap, TrainerSnapshot(mesh, body, names));
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
  // The write and the join, off the trainer's path.
  task_threads_.Spawn([this, mesh, step, request, t0, until_ms, snap, names]() mutable {
    FollowTrainerSave(mesh, step, request, std::move(snap), names, t0, until_ms);
  });
  return AnswerSave(mesh, step,
                    {{"checkpoint", {{"mesh", mesh}, {"step", step}}},
                     {"snapshot_ms", snapshot_ms},
                     {"snapshot_bytes", snap->bytes()},
                     {"borrowing", snap->borrows()}},
                    until, timeout_ms);
}

Result<std::shared_ptr<const Snapshot>> Agent::TrainerSnapshot(
    const std::string& mesh, const Json& body, const std::optional<std::vector<std::string>>& names,
    const Snapshot* base, const ShardChecksums* base_sums) {
  ASSIGN_OR_RETURN(MeshPlacement placement, store_->Placement(mesh));
  if (!body.contains("borrow")) return store_->TakeSnapshot(placement, names, base, base_sums);
  ASSIGN_OR_RETURN(auto borrowed, BorrowedSnapshot(placement, body["borrow"]));
  std::vector<std::string> copied;
  if (names) {
    copied = *names;
  } else {
    for (const TensorInfo& t : store_->List()) {
      if (t.mesh == mesh) copied.push_back(t.name);
    }
  }
  std::erase_if(copied, [&](const std::string& n) { return borrowed->Find(n) != nullptr; });
  if (copied.empty()) return borrowed;
  ASSIGN_OR_RETURN(auto taken, store_->TakeSnapshot(placement, copied, base, base_sums));
  return MergeSnapshots(std::move(taken), std::move(borrowed));
}

Result<Json> Agent::AnswerSave(const std::string& mesh, int64_t step, Json out, TrainerSaves::Until until,
                               int64_t timeout_ms) {
  if (until == TrainerSaves::Until::kNow) return out;
  ASSIGN_OR_RETURN(Json w, trainer_saves_.Wait(mesh, step, until, timeout_ms));
  out["job"] = w["job"];
  out["state"] = w["state"];
  return out;
}

Result<std::string> Agent::CreateOrJoinSave(const std::string& mesh, int64_t step, Json body,
                                            std::chrono::steady_clock::time_point snapped,
                                            std::chrono::steady_clock::time_point deadline) {
  const std::string path = "/api/v1/meshes/" + http::PercentEncode(mesh) + "/checkpoints/" +
                           std::to_string(step);
  // An unreachable tesserad is retried with backoff until the save's deadline; the
  // snapshot waits meanwhile (CheckPendingRoom bounds how many do).
  int64_t backoff_ms = kStartRetryFirstMs;
  while (true) {
    body["snapshot_age_ms"] = std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::steady_clock::now() - snapped)
                                  .count();
    auto joined = control_.Call("PUT", path, body);
    if (joined.ok()) return joined->value("job", "");
    const Json& d = joined.status().details();
    const bool names_worker = d.is_object() && d.contains("worker");
    if (joined.status().code() != Code::kUnavailable || names_worker ||
        std::chrono::steady_clock::now() + std::chrono::milliseconds(backoff_ms) >= deadline) {
      return joined.status();
    }
    // tesserad restarting, or away: wait, unless the worker stops.
    MutexLock lock(mu_);
    if (!stopping_) cv_.WaitFor(mu_, std::chrono::milliseconds(backoff_ms));
    if (stopping_) return Unavailable("worker " + id_ + " stopped");
    backoff_ms = std::min(backoff_ms * 2, kStartRetryMaxMs);
  }
}

void Agent::FollowTrainerSave(const std::string& mesh, int64_t step, const SaveRequest& request,
                              std::shared_ptr<const Snapshot> snap,
                              const std::optional<std::vector<std::string>>& names,
                              std::chrono::steady_clock::time_point snapped,
                              std::chrono::steady_clock::time_point deadline) {
  auto staging = SaveStaging(mesh, step);
  Json sent;  // the join, to send again should its job be lost with its tesserad
  auto job = staging.ok() ? WriteAndJoin(mesh, step, request, std::nullopt, std::move(snap), names,
                                         *staging, snapped, deadline, &sent)
                          : Result<std::string>(staging.status());
  {
    MutexLock lock(mu_);
    trainer_snapshots_.erase({mesh, step});  // joined (or refused): no longer pending
  }
  if (!job.ok()) {
    std::fprintf(stderr, "worker %s: save of mesh %s step %lld not started: %s\n", id_.c_str(),
                 mesh.c_str(), static_cast<long long>(step), job.status().ToString().c_str());
    trainer_saves_.Ended(mesh, step, job.status());
    return;
  }
  trainer_saves_.Started(mesh, step, *job);
  // The end comes as a save_ended task on the task long-poll. Should that push be
  // lost (tesserad restarted and failed the job), the job is looked up once every
  // kEndCheckMs, or soon after the worker's calls moved to another tesserad.
  int64_t next_check = MonoMs() + kEndCheckMs;
  uint64_t moves = control_.moves();
  while (true) {
    const int64_t left = std::chrono::duration_cast<std::chrono::milliseconds>(
                             deadline - std::chrono::steady_clock::now())
                             .count();
    if (left <= 0) break;
    (void)trainer_saves_.Wait(mesh, step, TrainerSaves::Until::kCommitted,
                              std::clamp<int64_t>(left, 1, kMovedCheckMs));
    // Ended (committed or failed), forgotten, or the worker stops: nothing left to do.
    auto now = trainer_saves_.Wait(mesh, step, TrainerSaves::Until::kNow, 0);
    if (!now.ok() || now->value("state", "") == "committed") return;
    if (control_.moves() == moves && MonoMs() < next_check) continue;
    moves = control_.moves();
    next_check = MonoMs() + kEndCheckMs;
    auto j = control_.Call("GET", "/api/v1/jobs/" + http::PercentEncodeSegment(*job));
    if (j.ok()) {
      const std::string state = j->value("state", "");
      if (state == "succeeded") {
        trainer_saves_.JobEnded(*job, Status::Ok());
      } else if (state == "failed" || state == "cancelled") {
        trainer_saves_.JobEnded(*job, JobError("save", *job, *j));
      }
    } else if (j.status().code() == Code::kNotFound) {
      // Its tesserad restarted with another catalog, or another one took over: the job
      // ended with it and nothing of it committed. What this worker wrote is still in
      // the step's staging dir: it joins again, and the save goes on under a new job
      // once every worker has (the others do the same, or joined it first).
      auto again = sent.is_object() ? CreateOrJoinSave(mesh, step, sent, snapped, deadline)
                                    : Result<std::string>(NotFound("no join to send again"));
      if (again.ok()) {
        std::fprintf(stderr, "worker %s: job %s of the save of mesh %s step %lld was lost; joined job %s\n",
                     id_.c_str(), job->c_str(), mesh.c_str(), static_cast<long long>(step),
                     again->c_str());
        trainer_saves_.Started(mesh, step, *again);
        job = *again;
        continue;
      }
      const Json& d = again.status().details();
      if (again.status().code() == Code::kConflict && d.is_object() &&
          d.value("state", "") == "committed") {
        // The lost job committed before its tesserad went: the new one found the step
        // in the root.
        trainer_saves_.JobEnded(*job, Status::Ok());
        continue;
      }
      // Refused: nothing will commit what this worker wrote. Unavailable: saving
      // again is right.
      std::fprintf(stderr,
                   "worker %s: job %s of the save of mesh %s step %lld was lost; joining again was "
                   "refused: %s\n",
                   id_.c_str(), job->c_str(), mesh.c_str(), static_cast<long long>(step),
                   again.status().ToString().c_str());
      if (sent.is_object() && sent.contains("written") && sent["written"].is_object()) {
        RemoveWritten(*staging, sent["written"].value("fragment", Json()));
      }
      trainer_saves_.JobEnded(
          *job, Unavailable("the save of step " + std::to_string(step) + " of mesh " + mesh + " (job " + *job +
                                ") did not commit: tesserad no longer knows the job (it restarted, or "
                                "another tesserad took over); save again",
                            {{"job", *job}, {"mesh", mesh}, {"step", step}, {"reason", "job_lost"}}));
    }
  }
  // Out of time: the job must not commit behind the trainer's back.
  auto cancelled = control_.Call(
      "POST", "/api/v1/jobs/" + http::PercentEncodeSegment(*job) + "/cancel", Json::object());
  Status ended(Code::kDeadlineExceeded,
                 "the save of step " + std::to_string(step) + " of mesh " + mesh + " (job " +
                     *job + ") passed its deadline; " +
                     (cancelled.ok() ? "it was cancelled"
                                     : "cancelling it failed: " + cancelled.status().ToString()),
                 {{"job", *job}, {"mesh", mesh}, {"step", step}});
  trainer_saves_.Ended(mesh, step, ended);
}

Result<Json> Agent::WaitTrainerSave(const std::string& mesh, int64_t step,
                                    TrainerSaves::Until until, int64_t timeout_ms) {
  return trainer_saves_.Wait(mesh, step, until, timeout_ms);
}

}  // namespace tessera::worker
