// What this worker's incremental saves build on (docs/semantics.md, "Incremental
// checkpoints"): per mesh, the chunks of its share in its newest committed save, each
// with the file that holds it. A save compares each chunk's checksum with the chunk at
// the same place there, and writes only those that differ; the rest refer to the file
// that holds them. A save's chunks become the base once tesserad says it committed
// (save_ended); a failed save drops the base, so the next one writes every chunk.
//
// Its report (Report(), on every long-poll) tells tesserad what its saves may still build
// on: per mesh its base, the saves whose end it took in last, and each save in flight
// with its base.
// Retention prunes no step a worker may still build on (docs/semantics.md, S9).
//
// One lock, for the map alone: a save reads its base through a shared pointer.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "api/requests.h"
#include "api/thread_annotations.h"
#include "storage/fragment_json.h"

namespace tessera::worker {

struct SaveBase {
  int64_t step = -1;
  int64_t depth = 0;  // saves since its share was last written whole
  // By SliceKey: the slice's chunks, each with its file ("../<dir>/<name>").
  std::map<std::string, std::vector<storage::SliceChunk>> slices;
  // The chunks of `slice` of `tensor` in the base; null when it has none of them.
  const std::vector<storage::SliceChunk>* Find(const TensorMeta& tensor, const SliceSpec& slice) const;
};

std::string SliceKey(const TensorMeta& tensor, const SliceSpec& slice);

class SaveBases {
 public:
  // The base a save of `mesh` writes against; null when it writes every chunk: asked to
  // (`full`), none yet, or the base is `full_every` - 1 saves deep.
  std::shared_ptr<const SaveBase> For(const std::string& mesh, const SaveRequest& request) EXCLUDES(mu_);
  // A save of `step` of `mesh` wrote `fragment` (its own chunks in the files it names,
  // in `dir` once committed: storage::SaveDirName) against `base` (null: none).
  void Wrote(const std::string& mesh, int64_t step, const std::string& dir,
             const std::vector<storage::FragmentSlice>& fragment, const SaveBase* base) EXCLUDES(mu_);
  // tesserad's word on the save of `step`: committed, its chunks are the base; else the
  // base goes.
  void Ended(const std::string& mesh, int64_t step, bool committed) EXCLUDES(mu_);
  // The step of the mesh's base; -1 for none.
  int64_t BaseStep(const std::string& mesh) EXCLUDES(mu_);
  // {mesh: {"base": its base's step (-1: none), "ended": [the steps of the newest
  // kEndedReported ends taken in, committed or not], "saves": [[step, base step], ...]:
  // each save whose base For() gave and whose end has not come yet}}.
  Json Report() EXCLUDES(mu_);
  static constexpr size_t kEndedReported = 16;

 private:
  struct Written {
    uint64_t seq = 0;
    std::shared_ptr<SaveBase> base;
  };
  Mutex mu_;
  uint64_t seq_ GUARDED_BY(mu_) = 0;
  std::map<std::string, Written> bases_ GUARDED_BY(mu_);  // by mesh
  std::map<std::pair<std::string, int64_t>, Written> pending_ GUARDED_BY(mu_);
  std::map<std::string, std::deque<int64_t>> ended_ GUARDED_BY(mu_);  // by mesh, newest last
  // By (mesh, step): the base step of each save in flight that For() gave one.
  std::map<std::pair<std::string, int64_t>, int64_t> building_ GUARDED_BY(mu_);
};

}  // namespace tessera::worker
