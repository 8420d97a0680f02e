// Workers and their liveness: each worker's record, its queue of tasks for its next
// long-poll, and the clock of its heartbeats. One lock, held for memory alone: the
// caller writes the catalog and publishes events with the copies these methods return.
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

class WorkerRegistry {
 public:
  // A worker from the catalog: suspect, with one lease from `now` to heartbeat again.
  void Load(WorkerRecord w, int64_t now);
  // Adds a worker or refreshes one registered before (alive); the record after.
  WorkerRecord Register(const WorkerRecord& fields, int64_t now);
  // not_found for a stranger; the record when this heartbeat revived the worker.
  Result<std::optional<WorkerRecord>> Heartbeat(const std::string& id, int64_t now);
  // Waits up to `wait_ms` for tasks and takes them all; a poll answered is a sign of life
  // from `now`, when it began. A newer poll of the same worker ends this one at once, with
  // none: only the newest connection is handed tasks.
  Result<std::vector<Json>> Poll(const std::string& id, int64_t wait_ms, int64_t now);
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
  struct Entry {
    WorkerRecord record;
    std::deque<Json> tasks;  // for the next long-poll
    // Wakes this worker's long-poll alone; shared so that a poll outlives a Remove.
    std::shared_ptr<CondVar> wake = std::make_shared<CondVar>();
    uint64_t poll = 0;  // the newest long-poll's number
  };
  static void Touch(WorkerRecord* w, int64_t now) {
    w->last_beat_mono_ms = std::max(w->last_beat_mono_ms, now);
  }

  mutable Mutex mu_;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::map<std::string, Entry> workers_ GUARDED_BY(mu_);
  std::vector<std::string> order_ GUARDED_BY(mu_);  // registration order
  uint64_t polls_ GUARDED_BY(mu_) = 0;              // long-polls started
  int64_t polls_waiting_ GUARDED_BY(mu_) = 0;
};

}  // namespace tessera::service
