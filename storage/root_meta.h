// What a checkpoint root holds besides the checkpoints' data, so that the root alone
// is the truth and a control plane with an empty catalog rebuilds its view from a
// listing (docs/format.md, "What the root holds"):
//
//   <root>/<mesh>/mesh-<n>.json          the mesh's definition and retention policy,
//                                        version n = 1, 2, ...; each version is created
//                                        once (create-if-absent) and the newest wins;
//                                        {"deleted": true} once the mesh is deleted
//   <root>/<mesh>/step-<N>/summary.json  a committed checkpoint's contents: its tensors
//                                        and sizes, written into staging by the merge
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "api/json_codec.h"
#include "api/status.h"
#include "storage/env.h"
#include "storage/index.h"

namespace tessera::storage {

inline constexpr const char* kSummaryFile = "summary.json";

// The mesh of every mesh directory under `root` (names unescaped), sorted.
Result<std::vector<std::string>> ListMeshDirs(Env* env, const std::string& root);

struct MeshDoc {
  int64_t version = 0;
  Json doc;  // {"format": 1, ...} as the writer gave it; {"deleted": true} for a tombstone
  bool deleted() const { return doc.is_object() && doc.value("deleted", false); }
};
// The newest version of a mesh's document; nullopt when none was ever written.
Result<std::optional<MeshDoc>> ReadMeshDoc(Env* env, const std::string& root, const std::string& mesh);
// Writes `doc` as the next version after the newest one: conflict when another writer
// took that version first (two control planes on one root).
Result<int64_t> WriteMeshDoc(Env* env, const std::string& root, const std::string& mesh,
                             const Json& doc);
// Garbage collection of mesh documents: every version older than the two newest of
// its mesh (the newest, and the one it replaced, which a reader may be on). The
// paths removed.
Result<std::vector<std::string>> PruneMeshDocs(Env* env, const std::string& root);

// A checkpoint's contents as summary.json holds them: {"format", "mesh", "step",
// "created_at", "metadata", "tensors": [meta + logical_bytes, stored_bytes],
// "logical_bytes", "stored_bytes"}.
Json SummaryOf(const CheckpointIndex& index);
// Writes the summary of the index in `dir` into `dir`, durably.
Status WriteSummary(Env* env, const std::string& dir);
// The summary of the checkpoint in `dir`: from summary.json, or else (a checkpoint
// written before summaries) from its index.
Result<Json> ReadSummary(Env* env, const std::string& dir);

}  // namespace tessera::storage
