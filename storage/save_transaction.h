// One save of a checkpoint as a transaction, the steps of docs/format.md in order:
//   Stage   a fresh staging dir
//   ranks   each writer stores shard-<rank>.tsr + fragment-<rank>.sqlite in it
//           (WriteRank, storage/rank_writer.h: in a worker, or in this process)
//   Merge   the fragments → index.sqlite (with its checksum trailer)
//   Commit  the staging dir becomes step-<N> (a rename, or an object store's
//           manifest), or
//   Abandon the staging dir goes (leftovers of writers still running are the GC's).
// SaveCheckpoint (local_checkpoint.h) and tesserad's save job (its machine's I/O
// steps) both run their saves through it, so the fault and power-loss loops over
// it (tests/unit/fault_test.cc) cover the path tesserad takes.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "api/mesh.h"
#include "api/status.h"
#include "storage/env.h"
#include "storage/index.h"

namespace tessera::storage {

class SaveTransaction {
 public:
  // The save of `step` of `mesh` under `root`; `id` names its staging dir (a job id).
  SaveTransaction(Env* env, std::string root, Mesh mesh, int64_t step, std::string id);

  const std::string& staging() const { return staging_; }

  // Creates the staging dir; conflict if the step is committed.
  Status Stage();
  // Merges the writers' fragments (file names in the staging dir) into the index.
  Status Merge(const std::vector<std::string>& fragments, const Json& metadata);
  // Merges the writers' fragments as their joins carried them into the index, then
  // removes what else the staging dir holds (a late writer's files of an abandoned
  // attempt at the same step): only the index, its summary and the shards it names
  // are committed. A chunk that refers to an earlier checkpoint's file must refer to
  // one that a checkpoint of `bases` (committed steps the caller holds) refers to.
  Status MergeSlices(const std::vector<std::vector<FragmentSlice>>& fragments,
                     const Json& metadata, const std::set<int64_t>& bases = {});
  // Makes the checkpoint visible; the committed dir.
  Result<std::string> Commit();
  // Removes the staging dir (nothing if it is gone; never a retired checkpoint's). Never
  // fails the caller: what cannot be removed now is the garbage collector's.
  void Abandon();

 private:
  Env* const env_;
  const std::string root_;
  const Mesh mesh_;
  const int64_t step_;
  const std::string id_;
  const std::string staging_;
};

}  // namespace tessera::storage
