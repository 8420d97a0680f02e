// The worker's side of task delivery (docs/architecture.md, "Long-poll tasks"): what its
// long-polls acknowledge (the highest task number received, of which tesserad's queue),
// the version of the placements it was pushed, and the task ids it has started, so that
// a task answered again is run once. One lock of its own: the task loop writes it,
// registration and /healthz read it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <unordered_set>

#include "api/json_codec.h"
#include "api/thread_annotations.h"

namespace tessera::worker {

class TaskFeed {
 public:
  // Remembers the newest `remember` task ids started.
  explicit TaskFeed(size_t remember = 4096) : remember_(remember) {}

  // The query of the next long-poll after "wait_ms=...": "&ack=N&meshes=V&queue=Q".
  std::string Query() const;
  // A long-poll's answer arrived: its ack and queue (a new queue, of a fresh tesserad,
  // replaces the old numbers), and its meshes_version when it carries meshes.
  void Received(const Json& answer);
  // Whether task `id` is new here (it is then remembered); a repeat is counted.
  bool Start(const std::string& id);

  // The queue the last answer named (empty: none yet).
  std::string queue() const EXCLUDES(mu_);
  int64_t started() const;
  int64_t repeated() const;

 private:
  const size_t remember_;
  mutable Mutex mu_;
  uint64_t ack_ GUARDED_BY(mu_) = 0;
  uint64_t meshes_ GUARDED_BY(mu_) = 0;
  std::string queue_ GUARDED_BY(mu_);
  std::deque<std::string> order_ GUARDED_BY(mu_);  // started ids, oldest first
  std::unordered_set<std::string> ids_ GUARDED_BY(mu_);
  int64_t started_ GUARDED_BY(mu_) = 0;
  int64_t repeated_ GUARDED_BY(mu_) = 0;
};

}  // namespace tessera::worker
