// Workers and their liveness: each worker's record, its queue of tasks leased to it
// until it acknowledges them, the version of the mesh placements pushed to workers, and
// the clock of its heartbeats. One lock, held for memory alone: the caller writes the
// catalog and publishes events with the copies these methods return.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "api/json_codec.h"
#include "api/status.h"
#include "api/thread_annotations.h"
#include "service/base_use.h"
#include "service/records.h"

namespace tessera::service {

// A worker that a round of tasks cannot reach: unknown or dead.
struct Unreachable {
  std::string worker;
  int64_t silent_ms = 0;  // since its last heartbeat (0: unknown)
};

// A worker whose state the liveness scan changed.
struct WorkerChange {
  WorkerRecord worker;
  int64_t silent_ms = 0;
};

// What a worker's long-poll says it has (docs/architecture.md, "Long-poll tasks").
struct PollRequest {
  int64_t wait_ms = 0;
  uint64_t ack = 0;     // the highest task number it received
  // The placements version it received; none: it takes no placements (a client that
  // only runs tasks), so they neither wake nor go with its answers.
  std::optional<uint64_t> meshes;
  std::string queue;    // the queue those numbers belong to (empty: none yet)
  // What its saves build on (base_use.h); none: a client that sends no report.
  std::optional<BaseReport> bases = std::nullopt;
};

// A long-poll's answer: every task above the ack, none removed.
struct PollAnswer {
  std::vector<Json> tasks;
  uint64_t ack = 0;  // the highest number the worker now has
  std::string queue;
  // The placements version, when the worker's is older: its meshes go with the answer.
  std::optional<uint64_t> meshes;
};

class WorkerRegistry {
 public:
  // `queue`: names this registry's task numbers and placement versions, which a fresh
  // tesserad starts again; a poll naming another queue is answered from the start.
  explicit WorkerRegistry(std::string queue) : queue_(std::move(queue)) {}

  // A worker from the catalog: suspect, with one lease from `now` to heartbeat again.
  void Load(WorkerRecord w, int64_t now);
  // Adds a worker or refreshes one registered before (alive); the record after.
  WorkerRecord Register(const WorkerRecord& fields, int64_t now);
  // not_found for a stranger; the record when this heartbeat revived the worker.
  Result<std::optional<WorkerRecord>> Heartbeat(const std::string& id, int64_t now);
  // Drops the worker's tasks up to the request's ack, then waits up to `wait_ms` for a task
  // above it (or newer placements) and answers them all, leased: they stay queued until a
  // later ack or Acknowledge. A poll answered is a sign of life from `now`, when it began.
  // A newer poll of the same worker ends this one at once, with none.
  Result<PollAnswer> Poll(const std::string& id, const PollRequest& request, int64_t now);
  // The worker has task `task` (it reported it): it leaves the queue.
  void Acknowledge(const std::string& id, const std::string& task);
  // A mesh was registered or deleted: every long-poll answers the new version.
  void PlacementsChanged();
  // Queues a task per worker, all or none: the first worker missing or dead is answered.
  std::optional<Unreachable> QueueAll(const std::vector<std::pair<std::string, Json>>& tasks,
                                      int64_t now);
  // Queues a task (made per worker) for each of `ids` that is alive or suspect.
  void QueueToLive(const std::vector<std::string>& ids, const std::function<Json()>& make);

  std::optional<WorkerRecord> Get(const std::string& id) const;
  std::vector<WorkerRecord> List() const;  // in registration order
  Status Remove(const std::string& id);    // not_found
  // Moves workers between alive, suspect and dead by the age of their last heartbeat
  // (a dead one's queued tasks go); the workers whose state changed.
  std::vector<WorkerChange> Scan(int64_t now, int64_t suspect_ms, int64_t lease_ms);

  struct Counts {
    int64_t alive = 0, suspect = 0, dead = 0;
    int64_t polls_waiting = 0;
  };
  Counts Count() const;
  void Stop();  // ends every long-poll, now and later

 private:
  struct Leased {
    uint64_t seq = 0;  // over every worker, so that a worker registered again never reuses one
    Json task;
  };
  struct Entry {
    WorkerRecord record;
    std::deque<Leased> tasks;  // in order of seq, until acknowledged
    // Wakes this worker's long-poll alone; shared so that a poll outlives a Remove.
    std::shared_ptr<CondVar> wake = std::make_shared<CondVar>();
    uint64_t poll = 0;  // the newest long-poll's number
  };
  static void Touch(WorkerRecord* w, int64_t now) {
    w->last_beat_mono_ms = std::max(w->last_beat_mono_ms, now);
  }

  void Enqueue(Entry& e, Json task) REQUIRES(mu_);

  const std::string queue_;
  mutable Mutex mu_;
  bool stopping_ GUARDED_BY(mu_) = false;
  uint64_t seq_ GUARDED_BY(mu_) = 0;         // the newest task's number
  uint64_t placements_ GUARDED_BY(mu_) = 1;  // above 0: a worker that has none gets them
  std::map<std::string, Entry> workers_ GUARDED_BY(mu_);
  std::vector<std::string> order_ GUARDED_BY(mu_);  // registration order
  uint64_t polls_ GUARDED_BY(mu_) = 0;              // long-polls started
  int64_t polls_waiting_ GUARDED_BY(mu_) = 0;
};

}  // namespace tessera::service
