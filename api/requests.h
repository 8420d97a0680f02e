// The job requests of the REST API as types: decoded once, at the route, from
// untrusted JSON (every error is invalid_argument naming the field), and kept
// typed from there on. ToJson gives the canonical form a job records.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "api/json_codec.h"
#include "api/mesh.h"
#include "api/status.h"
#include "api/task_protocol.h"

namespace tessera {

// POST /api/v1/meshes/{mesh}/checkpoints, and the in-loop save's create-or-join
// (PUT /api/v1/meshes/{mesh}/checkpoints/{step}, whose path gives the step).
struct SaveRequest {
  int64_t step = 0;
  std::optional<std::vector<std::string>> tensors;  // absent: every tensor the workers hold
  bool compress = true;                             // "compression": "zstd" | "none"
  int64_t level = 1;                                // zstd level, 1..19
  // Incremental saves (docs/semantics.md, "Incremental checkpoints"): a worker writes
  // only the chunks that changed since its last committed save, and all of them every
  // `full_every`-th save, or when `full`.
  bool full = false;
  int64_t full_every = 10;
  Json metadata = Json::object();
  // The workers snapshot when their trainer calls save(), not when the job asks.
  bool wait_for_trainer = false;
  // Each worker writes its share of the memory checkpoint of `step` (a persist,
  // POST .../checkpoints/{step}/persist), not the tensors it holds; the checkpoint
  // takes the memory checkpoint's metadata.
  bool from_memory = false;

  // `step` (when given) replaces the body's: the create-or-join route takes it from the path.
  static Result<SaveRequest> FromJson(const Json& body, std::optional<int64_t> step = std::nullopt);
  Json ToJson() const;
  // The same save: what a second trainer's create-or-join must agree on.
  bool SameSave(const SaveRequest& other) const;
};

// What a worker's write at its snapshot produced: its shard's bytes and its fragment
// (the slices it stored and where, as storage/fragment_json.h encodes them; tesserad
// decodes and checks it).
struct SaveWritten {
  uint64_t bytes = 0;         // raw bytes of its slices
  uint64_t stored_bytes = 0;  // after compression, of the chunks it wrote
  Json fragment = Json::array();
  uint64_t reused_bytes = 0;  // raw bytes of unchanged chunks, referring to `base`
  std::optional<int64_t> base;  // the committed step its unchanged chunks refer to
};

// PUT /api/v1/meshes/{mesh}/checkpoints/{step}: a worker's join of a save, which is
// also its report. It creates the save of `step` (the in-loop save's first worker), or
// joins it, bringing its snapshot's description and what it wrote at that snapshot
// into the step's staging dir, or the error that stopped it. A REST save's workers
// join with the job that asked them to snapshot.
struct SaveJoinRequest {
  SaveRequest save;  // wait_for_trainer is implied
  std::string worker;
  std::optional<std::string> job;  // a REST save's job
  SnapshotResult snapshot;
  std::optional<SaveWritten> written;  // exactly one of written and error
  Status error;
  // How long before this request the worker took its snapshot (-1: not said). tesserad
  // places the snapshot on its own clock with it: a join whose snapshot precedes the end
  // of the step's failed save belongs to that save, not to a new one.
  int64_t snapshot_age_ms = -1;

  static Result<SaveJoinRequest> FromJson(const Json& body, int64_t step);
  Json ToJson() const;  // with "step", for the route's body ("step" is ignored there)
};

// One tensor of a restore, with what the caller expects of it.
struct RestoreTensor {
  std::string name;
  std::optional<DType> dtype;
  std::optional<Shape> shape;
};

// POST /api/v1/meshes/{mesh}/checkpoints/{step}/restore.
struct RestoreRequest {
  std::optional<std::string> target_mesh;           // absent: the checkpoint's mesh
  std::optional<std::vector<RestoreTensor>> tensors;  // absent: all, in the index's order
  std::map<std::string, Layout> layouts;            // per tensor; others keep the saved layout
  std::optional<std::vector<std::string>> workers;  // only these workers of the target restore

  static Result<RestoreRequest> FromJson(const Json& body);
  Json ToJson() const;
};

// POST /api/v1/meshes/{mesh}/checkpoints/{step}/export: the checkpoint as safetensors
// files in `dir`, written by the mesh's workers.
struct ExportRequest {
  std::string dir;                          // an absolute path, or s3://BUCKET/PREFIX
  uint64_t max_file_bytes = 5'000'000'000;  // "max_file_size"

  static Result<ExportRequest> FromJson(const Json& body);
  Json ToJson() const;
};

// POST /api/v1/meshes/{mesh}/imports: safetensors files (a file or a Hugging Face model
// folder at an absolute path every worker and tesserad see) as step `save.step`.
struct ImportRequest {
  std::string source;
  SaveRequest save;  // step, compression, level, metadata

  static Result<ImportRequest> FromJson(const Json& body);
  Json ToJson() const;
};

}  // namespace tessera
