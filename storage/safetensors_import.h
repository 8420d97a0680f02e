// Safetensors files into a Tessera checkpoint (docs/format.md, "Safetensors import"):
// a file, or a Hugging Face model folder (its *.safetensors.index.json weight map, or
// else every *.safetensors file in it). Each tensor becomes a tensor of the checkpoint,
// whole (a replicated layout), so a restore reshards it onto any mesh and layout with
// the usual name, dtype and shape checks.
//
// Headers are read and checked first (safetensors_format.h), every file's before any
// byte is written; the tensors' bytes are then written into shards straight from the
// files mapped into memory, so memory stays small whatever the model's size. A file
// must not change while it is imported (as with any reader that maps it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "api/json_codec.h"
#include "api/mesh.h"
#include "api/status.h"
#include "storage/env.h"
#include "storage/index.h"
#include "storage/rank_writer.h"
#include "storage/safetensors_format.h"
#include "storage/shard_writer.h"

namespace tessera::storage {

struct SafetensorsSource {
  std::string path;
  uint64_t bytes = 0;  // its tensors' bytes
  SafetensorsHeader header;
};

// The files of `source` with their headers, checked: a folder's index must name files
// that hold the tensors it maps to them; a tensor in two files is invalid_argument
// naming both. An object store path is invalid_argument (imports read local files).
Result<std::vector<SafetensorsSource>> ReadSafetensorsSource(Env* env, const std::string& source);

// A file's tensor as the checkpoint's: name, dtype, shape and a replicated layout.
TensorMeta ImportedTensor(const SafetensorsTensor& t);
// The checkpoint's tensors of `files`, in order.
std::vector<TensorMeta> ImportedTensors(const std::vector<SafetensorsSource>& files);

// Writes every tensor of `files` into `staging` as the shard and fragment of `rank`.
// `expected` (when not empty) are the tensors planned from these files: a file whose
// header no longer says so is data_loss naming it.
Result<RankWriteResult> WriteImportRank(Env* env, const std::vector<std::string>& files,
                                        const std::vector<TensorMeta>& expected,
                                        const std::string& staging, int64_t rank,
                                        const ShardOptions& options);

struct ImportOptions {
  std::string mesh;  // the checkpoint's mesh name: <root>/<mesh>/step-<step>
  int64_t step = 0;
  ShardOptions shard;
  Json metadata = Json::object();
};

struct ImportSummary {
  std::string dir;  // the committed checkpoint
  size_t files = 0;
  size_t tensors = 0;
  uint64_t bytes = 0;
  uint64_t stored_bytes = 0;
};

// The whole import in this process (`tessera import`): committed as step `step` of
// `mesh` under `root`, a conflict when that step exists. The checkpoint's mesh is the
// root's document of `mesh` when it has one, else one device ({replica: 1}).
Result<ImportSummary> ImportSafetensors(Env* env, const std::string& source, const std::string& root,
                                        const ImportOptions& options);

}  // namespace tessera::storage
