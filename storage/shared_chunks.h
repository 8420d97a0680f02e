// Chunks that checkpoints share (docs/format.md, "Incremental checkpoints"): an
// incremental checkpoint's unchanged chunks stay in the shard files of the earlier
// checkpoint that wrote them, so those files live as long as any committed checkpoint
// of the mesh refers to them, whatever becomes of the checkpoint that wrote them.
//
// The references are read from the root (each committed checkpoint's summary.json
// lists them), never from a cache: the root alone decides what may be removed.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "api/status.h"
#include "storage/env.h"

namespace tessera::storage {

// The paths of the files of other dirs that the committed checkpoints of `mesh` refer
// to, less `except`'s own references. A checkpoint whose references cannot be read
// fails the call, naming it: nothing is removed on a guess.
Result<std::set<std::string>> LiveReferences(Env* env, const std::string& root,
                                             const std::string& mesh,
                                             std::optional<int64_t> except = std::nullopt);

// Every function here that changes the root REQUIRES the mesh's root turn
// (service/mesh_roots.h) or a process that alone uses the root: a sweep decides from the
// committed checkpoints it reads, which must not change until it is done.

// The root change of a delete of committed `step` of `mesh`: when later checkpoints
// refer to some of its files, it is retired (checkpoint_dir.h) and only those files stay;
// else it is removed whole. `*live` is then what the mesh's other committed checkpoints
// refer to: what the sweep after it keeps. not_found when the step is not committed.
Status RetireOrRemove(Env* env, const std::string& root, const std::string& mesh, int64_t step,
                      std::set<std::string>* live);

// Removes from every retired dir of `mesh` the files not in `live`, and the dir itself
// once none is left; appends the paths removed to `removed`.
Status SweepRetired(Env* env, const std::string& root, const std::string& mesh,
                    const std::set<std::string>& live, std::vector<std::string>* removed);

// RetireOrRemove, then the sweep of every retired dir of the mesh: the step's own (what
// nothing uses goes), and what the step alone referred to in others.
Status DeleteCheckpoint(Env* env, const std::string& root, const std::string& mesh, int64_t step);

// Removes from every retired dir under `root` (or of `mesh`) the files no committed
// checkpoint refers to, and the dir itself once none is left. The paths removed.
Result<std::vector<std::string>> SweepRetired(Env* env, const std::string& root);
Result<std::vector<std::string>> SweepRetired(Env* env, const std::string& root,
                                              const std::string& mesh);

}  // namespace tessera::storage
