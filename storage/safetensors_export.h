// A committed checkpoint as Hugging Face safetensors files (docs/format.md,
// "Safetensors export"): each tensor whole in exactly one file, files of at most
// `max_file_bytes` (a tensor larger than that gets a file of its own), and
// model.safetensors.index.json mapping each tensor to its file. Tensors are read and
// written in blocks of rows: memory stays at two blocks whatever the state's size.
//
// The export runs in steps so that several processes can share it: PlanExportFiles
// says which tensors go into which file, WriteExportFile writes one file (any process
// that reads the checkpoint, e.g. each worker of a REST export job its share), and
// WriteExportIndex writes the weight map once every file is there.
// ExportSafetensors runs them all in this process (`tessera export`).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "api/json_codec.h"
#include "api/status.h"
#include "storage/env.h"
#include "storage/index.h"
#include "storage/read_planner.h"
#include "storage/thread_pool.h"

namespace tessera::storage {

inline constexpr const char* kSafetensorsIndexFile = "model.safetensors.index.json";

struct ExportFile {
  std::string name;                  // "model.safetensors", "model-00001-of-00004.safetensors"
  std::vector<std::string> tensors;  // in the checkpoint's order
  uint64_t bytes = 0;                // the tensors' bytes
};

// The files for `tensors` (in the checkpoint's order). With `spread` ≤ 1 they fill
// files in order, a new one when the next tensor would pass `max_file_bytes`, as
// Hugging Face shards a model. With `spread` > 1 there are at least min(spread, tensors)
// files of balanced size (largest tensors first into the emptiest file that keeps
// under the limit), so `spread` writers each get a file.
std::vector<ExportFile> PlanExportFiles(const std::vector<TensorMeta>& tensors,
                                        uint64_t max_file_bytes, size_t spread = 1);

// The __metadata__ of every file: format "pt", the checkpoint's mesh, step and metadata.
Json ExportMetadata(const CheckpointMeta& meta);

struct ExportOptions {
  uint64_t max_file_bytes = 5'000'000'000;  // Hugging Face's default shard size
  int threads = 2;                          // decode threads
  uint64_t block_bytes = 64 << 20;          // a tensor is read and written this much at a time
  int writers = 2;                          // threads filling one file at once
  // Called after each tensor: (tensors done, tensors in all, its name).
  std::function<void(size_t, size_t, const std::string&)> progress;
};

// Writes `file` into `out_dir` (which exists) from the checkpoint whose index is open,
// its shards read through `shards`, fsynced. With `writers` > 1 (and a file that takes
// writes at offsets), that many threads fill it block by block at once. `on_tensor` is
// called after each tensor with its bytes, one call at a time.
Status WriteExportFile(Env* env, const CheckpointIndex& index, ShardCache* shards,
                       ThreadPool* pool, const ExportFile& file, const std::string& out_dir,
                       const Json& metadata, uint64_t block_bytes, int writers,
                       const std::function<void(const std::string&, uint64_t)>& on_tensor);

// model.safetensors.index.json for `files`, written durably into `out_dir`.
Status WriteExportIndex(Env* env, const std::string& out_dir, const std::vector<ExportFile>& files);

struct ExportSummary {
  std::vector<std::string> files;  // in DIR, in order
  uint64_t tensor_bytes = 0;
  size_t tensors = 0;
};

// Exports the checkpoint in `checkpoint_dir` into `out_dir` (created; files there of
// the same names are replaced).
Result<ExportSummary> ExportSafetensors(Env* env, const std::string& checkpoint_dir,
                                        const std::string& out_dir, const ExportOptions& options);

}  // namespace tessera::storage
