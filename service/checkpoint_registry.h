// The catalog's checkpoints, by "<mesh>@<step>". A job holds the checkpoint it works
// on (a save its step from the start, a restore or verify its source) until it ends,
// and a held checkpoint cannot be deleted. One lock, held for memory alone: the caller
// writes the catalog and publishes events with the copies these methods return.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "api/status.h"
#include "api/thread_annotations.h"
#include "service/records.h"

namespace tessera::service {

class CheckpointRegistry {
 public:
  void Load(CheckpointRecord c);  // replaces the record under its key

  std::optional<CheckpointRecord> Get(const std::string& key) const;
  // A pending record for job `pending.job`'s save, which holds it: conflict naming the
  // step's state and job when the step is committed, being saved or being deleted.
  Status Reserve(const CheckpointRecord& pending);
  void Erase(const std::string& key);  // undoes a Reserve whose record was not written
  // Changes a record in place; the record after (nullopt once it is gone).
  std::optional<CheckpointRecord> Update(const std::string& key,
                                         const std::function<void(CheckpointRecord&)>& change);

  // A committed checkpoint of `mesh` ("latest" or a step): not_found, or conflict for one
  // not committed.
  Result<CheckpointRecord> FindCommitted(const std::string& mesh, const std::string& step) const;
  // The same, held for job `job` until Release.
  Result<CheckpointRecord> Hold(const std::string& mesh, const std::string& step,
                                const std::string& job);
  void Release(const std::string& key, const std::string& job);
  // Holds a committed step of `mesh` for `job` unless the job holds it already: a save's
  // base (the checkpoint its unchanged chunks refer to), from its merge to its commit.
  Status HoldBase(const std::string& mesh, int64_t step, const std::string& job);
  // Releases every hold of `job` on a checkpoint of `mesh` other than `step`.
  void ReleaseBases(const std::string& mesh, int64_t step, const std::string& job);

  // Marks a committed or failed checkpoint as being deleted (no job may hold it then):
  // not_found, or conflict while it is being saved or held. EndDelete erases it
  // (`deleted`) or gives it back.
  Result<CheckpointRecord> BeginDelete(const std::string& mesh, int64_t step);
  void EndDelete(const std::string& key, bool deleted);

  // The list entries of a mesh, newest step first.
  std::vector<Json> Summaries(const std::string& mesh) const;
  std::vector<int64_t> CommittedSteps(const std::string& mesh) const;  // ascending
  struct Totals {
    uint64_t committed = 0, stored_bytes = 0, logical_bytes = 0;
  };
  Totals Total() const;

 private:
  struct Entry {
    CheckpointRecord record;
    std::multiset<std::string> holders;  // jobs using it
    bool deleting = false;
  };
  Result<const Entry*> FindCommittedLocked(const std::string& mesh, const std::string& step) const
      REQUIRES(mu_);

  mutable Mutex mu_;
  std::map<std::string, Entry> checkpoints_ GUARDED_BY(mu_);
};

}  // namespace tessera::service
