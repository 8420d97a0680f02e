// Saves started from the training loop (/v1/save). The trainer's call returns
// once this worker has snapshotted; the worker then starts or joins the job on
// tesserad and follows it to its end in the background. This table keeps what
// each such save became, so that the trainer can ask later (GET /v1/saves/{step})
// and wait for the job to exist or to commit, without ever having waited on
// tesserad inside its step. Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "api/json_codec.h"
#include "api/status.h"
#include "api/thread_annotations.h"

namespace tessera::worker {

class TrainerSaves {
 public:
  enum class State { kSnapshotted, kRunning, kCommitted, kFailed };
  // What a waiter waits for: nothing, the job's id, or the commit.
  enum class Until { kNow, kStarted, kCommitted };

  // Saves remembered per worker; the oldest ended ones are forgotten beyond it.
  static constexpr size_t kRemembered = 256;

  // A save whose snapshot was just taken (replaces an earlier, ended record of it).
  void Snapshotted(const std::string& mesh, int64_t step);
  // Its job exists on tesserad.
  void Started(const std::string& mesh, int64_t step, const std::string& job);
  // Its job ended: ok means committed; otherwise the job's error (or the start's).
  void Ended(const std::string& mesh, int64_t step, const Status& status);
  // The save whose job is `job` ended, as tesserad pushed it. The push may come
  // before Started(…, job): it is then kept (the newest kRemembered) for Started.
  void JobEnded(const std::string& job, const Status& status);
  // A REST save's job that this worker snapshots for itself (its trainer takes no part).
  void ServedByTask(const std::string& job);
  // tesserad's push of the end of the mesh's save of `step` (job `job`), which every
  // worker of the mesh gets. One that failed without this worker's trainer (no save of
  // that step here, or only an ended one of another job; not a REST save this worker
  // served by itself) is kept as this worker's
  // record of the step, failed, so that its trainer, late to that save, learns of the
  // failure (GET /v1/saves/{step}, and its next save of the step: TakeMissed) instead of
  // starting a save that the others have left.
  void Told(const std::string& job, const std::string& mesh, int64_t step, const Status& status,
            int64_t now_ms);
  // The failure kept by Told for `step`, if it ended within kMissedMs of `now_ms`; once:
  // the trainer's next save of the step starts a new save.
  std::optional<Status> TakeMissed(const std::string& mesh, int64_t step, int64_t now_ms);
  // How long a save's failure counts as the one a late trainer missed: a save's
  // workers wait this long for each other to join (tesserad's --join-wait-ms default).
  static constexpr int64_t kMissedMs = 120 * 1000;

  // {"checkpoint":{mesh,step},"job","state"} once `until` holds; the save's
  // error when it failed; deadline_exceeded after `timeout_ms`; not_found for a
  // save this worker does not know; unavailable when Shutdown was called.
  Result<Json> Wait(const std::string& mesh, int64_t step, Until until, int64_t timeout_ms);

  // Wakes every waiter with unavailable.
  void Shutdown();

  // "snapshotted", "running", "committed", "failed".
  static const char* StateName(State s);

 private:
  struct Record {
    std::string job;
    State state = State::kSnapshotted;
    Status error;
    uint64_t seq = 0;  // order of Snapshotted calls, for forgetting the oldest
    // Told: the mesh's save failed without this worker's trainer, at this time.
    std::optional<int64_t> missed_at_ms;
  };
  using Key = std::pair<std::string, int64_t>;

  void Forget() REQUIRES(mu_);
  void End(Record& r, const Status& status) REQUIRES(mu_);

  Mutex mu_;
  CondVar cv_;
  std::map<Key, Record> saves_ GUARDED_BY(mu_);
  uint64_t next_seq_ GUARDED_BY(mu_) = 0;
  // Ends pushed for jobs not started here yet, and their order (oldest first).
  std::map<std::string, Status> early_ends_ GUARDED_BY(mu_);
  std::deque<std::string> early_order_ GUARDED_BY(mu_);
  // ServedByTask's jobs, the newest kRemembered, oldest first.
  std::deque<std::string> served_ GUARDED_BY(mu_);
  bool shutdown_ GUARDED_BY(mu_) = false;
};

// Parses ?wait= of the local save routes: "", "started" or "committed"
// (also "snapshotted", the same as ""); invalid_argument naming `wait` otherwise.
Result<TrainerSaves::Until> ParseSaveWait(const std::string& text);

}  // namespace tessera::worker
