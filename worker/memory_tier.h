// The memory checkpoints a worker holds (docs/memory-tier.md): per mesh and step,
// its own share (the snapshot itself), the copies of other ranks' shares it keeps,
// or its part of a parity group. A checkpoint is added when its exchange begins and
// counts once committed. The committed ones of a mesh form one timeline, ascending
// in step and in commit order: committing step S, or restoring it, abandons whatever
// the timeline held past S (the trainer went back), and a mesh registered again
// abandons the RAM of its old registration (another fingerprint). The newest `keep`
// of the timeline are kept, and an older one is freed only when a newer one commits.
// Thread-safe: one lock, held for the tables alone (the bytes are shared, never
// copied or freed under it).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "api/json_codec.h"
#include "api/thread_annotations.h"
#include "worker/memory_layout.h"
#include "worker/memory_share.h"

namespace tessera::worker {

struct MemoryCheckpoint {
  std::string mesh;
  int64_t step = 0;
  int64_t rank = 0;
  MemoryPolicy policy;
  MemoryLayout layout;
  int64_t mesh_fingerprint = 0;
  int64_t persisted = -1;  // the newest persisted step when it was taken

  ShareHeader own_header;
  ShareBytes own;
  // Replica mode: the shares of other ranks this worker keeps, by rank.
  struct Copy {
    ShareHeader header;
    ShareBytes bytes;
  };
  std::map<int64_t, Copy> copies;
  // Parity mode: this worker's group (ranks in group order), every member's header,
  // and its parity (layout.parity rows of stripe_length bytes) with its checksum.
  std::vector<int> group;
  std::map<int64_t, ShareHeader> group_headers;
  ShareBytes parity;
  uint64_t stripe_length = 0;
  uint64_t parity_checksum = 0;

  // own + copies + parity (a buffer shared with the checkpoint before counted again:
  // MemoryTier::Bytes counts each once).
  uint64_t bytes() const;
  // own, parity and the copies, appended to *out.
  void Views(std::vector<const ShareBytes*>* out) const;
};

class MemoryTier {
 public:
  // Adds `ck` (not committed), replacing an earlier attempt of its step.
  void Begin(std::shared_ptr<MemoryCheckpoint> ck) EXCLUDES(mu_);
  // Commits (mesh, step) as the newest of the mesh's timeline: frees the committed
  // ones past `step` or of another mesh fingerprint (abandoned), then the oldest
  // beyond the newest ck.policy.keep, never `step` itself. A mesh without a timeline,
  // or one that abandoned some, begins one at `now_ms` (later than the one before).
  // False when it is not there (dropped meanwhile).
  bool Commit(const std::string& mesh, int64_t step, int64_t now_ms = 0) EXCLUDES(mu_);
  // A restore of `step` under `mesh_fingerprint`: the timeline goes on from `step`, so
  // the committed checkpoints past it, and those of another fingerprint, are freed
  // (they are no longer restorable); `timeline`, when given, is the one that begins
  // (agreed by the mesh's workers). The steps freed, ascending.
  std::vector<int64_t> Rollback(const std::string& mesh, int64_t step, int64_t mesh_fingerprint,
                                std::optional<int64_t> timeline = std::nullopt) EXCLUDES(mu_);
  // When the mesh's current timeline began (wall ms, as tesserad's reports carry it);
  // 0 before any.
  int64_t Timeline(const std::string& mesh) const EXCLUDES(mu_);
  // Forgets (mesh, step), committed or not.
  void Drop(const std::string& mesh, int64_t step) EXCLUDES(mu_);
  // The committed checkpoints of `mesh`, ascending step (the timeline's order).
  std::vector<std::shared_ptr<const MemoryCheckpoint>> Committed(const std::string& mesh) const
      EXCLUDES(mu_);
  // (mesh, step), committed or not, or null.
  std::shared_ptr<const MemoryCheckpoint> Find(const std::string& mesh, int64_t step) const EXCLUDES(mu_);
  // The mesh's checkpoint of the largest step, committed or not, or null.
  std::shared_ptr<const MemoryCheckpoint> Newest(const std::string& mesh) const EXCLUDES(mu_);
  // Bytes held for `mesh` (all meshes when empty), committed or not; a buffer that
  // checkpoints share (a piece that did not change) counted once. Called by the thread
  // that takes the mesh's checkpoints, between its exchanges.
  uint64_t Bytes(const std::string& mesh = "") const EXCLUDES(mu_);
  // {"meshes": {mesh: {"steps": [...], "bytes"}}, "bytes"}: the worker's /healthz, of
  // the committed checkpoints (one being taken is still written by its exchange).
  Json Summary() const EXCLUDES(mu_);

 private:
  struct Entry {
    std::shared_ptr<const MemoryCheckpoint> ck;
    bool committed = false;
    uint64_t order = 0;  // when it committed: retention counts the newest commits
  };
  using Steps = std::map<int64_t, Entry>;
  // Moves out of `steps` the committed entries past `step` or of another fingerprint.
  static void Abandon(Steps& steps, int64_t step, int64_t mesh_fingerprint,
                      std::vector<std::shared_ptr<const MemoryCheckpoint>>* freed);

  mutable Mutex mu_;
  uint64_t commits_ GUARDED_BY(mu_) = 0;
  std::map<std::string, Steps> meshes_ GUARDED_BY(mu_);
  std::map<std::string, int64_t> timelines_ GUARDED_BY(mu_);
};

}  // namespace tessera::worker
