#include "worker/trainer_saves.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace tessera::worker {

const char* TrainerSaves::StateName(State s) {
  switch (s) {
    case State::kSnapshotted: return "snapshotted";
    case State::kRunning: return "running";
    case State::kCommitted: return "committed";
    case State::kFailed: return "failed";
  }
  return "unknown";
}

void TrainerSaves::Snapshotted(const std::string& mesh, int64_t step) {
  MutexLock lock(mu_);
  Record& r = saves_[{mesh, step}];
  r = Record{};
  r.seq = next_seq_++;
  Forget();
  cv_.NotifyAll();
}

void TrainerSaves::Started(const std::string& mesh, int64_t step, const std::string& job) {
  MutexLock lock(mu_);
  auto it = saves_.find({mesh, step});
  if (it == saves_.end()) return;
  it->second.job = job;
  if (it->second.state == State::kSnapshotted) it->second.state = State::kRunning;
  auto early = early_ends_.find(job);
  if (early != early_ends_.end()) {
    End(it->second, early->second);
    early_ends_.erase(early);
  }
  cv_.NotifyAll();
}

void TrainerSaves::End(Record& r, const Status& status) {
  r.state = status.ok() ? State::kCommitted : State::kFailed;
  r.error = status;
  cv_.NotifyAll();
}

void TrainerSaves::Ended(const std::string& mesh, int64_t step, const Status& status) {
  MutexLock lock(mu_);
  auto it = saves_.find({mesh, step});
  if (it == saves_.end()) return;
  // The first end stands: a pushed end is not overwritten by the follower's.
  if (it->second.state == State::kCommitted || it->second.state == State::kFailed) return;
  End(it->second, status);
}

void TrainerSaves::JobEnded(const std::string& job, const Status& status) {
  MutexLock lock(mu_);
  for (auto& [key, r] : saves_) {
    if (r.job != job) continue;
    if (r.state != State::kCommitted && r.state != State::kFailed) End(r, status);
    return;
  }
  if (early_ends_.emplace(job, status).second) early_order_.push_back(job);
  while (early_order_.size() > kRemembered) {
    early_ends_.erase(early_order_.front());
    early_order_.pop_front();
  }
}

void TrainerSaves::ServedByTask(const std::string& job) {
  MutexLock lock(mu_);
  served_.push_back(job);
  if (served_.size() > kRemembered) served_.pop_front();
}

void TrainerSaves::Told(const std::string& job, const std::string& mesh, int64_t step,
                        const Status& status, int64_t now_ms) {
  JobEnded(job, status);
  if (status.ok()) return;
  MutexLock lock(mu_);
  if (std::find(served_.begin(), served_.end(), job) != served_.end()) return;
  auto it = saves_.find({mesh, step});
  if (it != saves_.end()) {
    const Record& r = it->second;
    const bool ended = r.state == State::kCommitted || r.state == State::kFailed;
    // Its own save of the step (running, or this job), or the one the trainer saves now.
    if (!ended || r.job == job) return;
  }
  Record& r = saves_[{mesh, step}];
  r = Record{};
  r.job = job;
  r.seq = next_seq_++;
  r.missed_at_ms = now_ms;
  End(r, Conflict("the save of step " + std::to_string(step) + " of mesh " + mesh + " (job " + job +
                      ") failed before this worker's trainer saved that step: " + status.message() +
                      "; save again to start a new save of it",
                  {{"mesh", mesh}, {"step", step}, {"job", job}, {"reason", "job_ended"}}));
  Forget();
}

std::optional<Status> TrainerSaves::TakeMissed(const std::string& mesh, int64_t step, int64_t now_ms) {
  MutexLock lock(mu_);
  auto it = saves_.find({mesh, step});
  if (it == saves_.end() || !it->second.missed_at_ms) return std::nullopt;
  const bool recent = now_ms - *it->second.missed_at_ms <= kMissedMs;
  it->second.missed_at_ms.reset();
  if (!recent) return std::nullopt;
  return it->second.error;
}

void TrainerSaves::Forget() {
  if (saves_.size() <= kRemembered) return;
  std::vector<std::pair<uint64_t, Key>> ended;
  for (const auto& [key, r] : saves_) {
    if (r.state == State::kCommitted || r.state == State::kFailed) ended.push_back({r.seq, key});
  }
  std::sort(ended.begin(), ended.end());
  for (size_t i = 0; i < ended.size() && saves_.size() > kRemembered; ++i) {
    saves_.erase(ended[i].second);
  }
}

Result<Json> TrainerSaves::Wait(const std::string& mesh, int64_t step, Until until,
                                int64_t timeout_ms) {
  MutexLock lock(mu_);
  const Key key{mesh, step};
  auto reached = [&](const Record& r) {
    if (r.state == State::kCommitted || r.state == State::kFailed) return true;
    if (until == Until::kNow) return true;
    if (until == Until::kStarted) return !r.job.empty();
    return false;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  bool timed_out = false;
  while (true) {
    if (shutdown_) return Unavailable("the worker is shutting down");
    auto it = saves_.find(key);
    if (it == saves_.end()) {
      return NotFound("this worker took no save of mesh " + mesh + " at step " +
                          std::to_string(step) + " (or has forgotten it)",
                      {{"mesh", mesh}, {"step", step}});
    }
    const Record& r = it->second;
    if (reached(r)) {
      if (r.state == State::kFailed) return r.error;
      return Json{{"checkpoint", {{"mesh", mesh}, {"step", step}}},
                  {"state", StateName(r.state)},
                  {"job", r.job.empty() ? Json() : Json(r.job)}};
    }
    if (timed_out) {
      return DeadlineExceeded("save of mesh " + mesh + " step " + std::to_string(step) +
                                  " is still " + StateName(r.state) + " after " +
                                  std::to_string(timeout_ms) + " ms",
                              {{"mesh", mesh}, {"step", step}, {"job", r.job}});
    }
    timed_out = !cv_.WaitUntil(mu_, deadline);
  }
}

void TrainerSaves::Shutdown() {
  MutexLock lock(mu_);
  shutdown_ = true;
  cv_.NotifyAll();
}

Result<TrainerSaves::Until> ParseSaveWait(const std::string& text) {
  if (text.empty() || text == "snapshotted") return TrainerSaves::Until::kNow;
  if (text == "started") return TrainerSaves::Until::kStarted;
  if (text == "committed") return TrainerSaves::Until::kCommitted;
  return InvalidArgument("wait must be 'snapshotted', 'started' or 'committed', got '" +
                             text.substr(0, 32) + "'",
                         {{"field", "wait"}});
}

}  // namespace tessera::worker
