// A committed checkpoint as Hugging Face safetensors files (docs/format.md,
// "Safetensors export"): each tensor whole in exactly one file, files of at most
// `max_file_bytes` (a tensor larger than that gets a file of its own), and
// model.safetensors.index.json mapping each tensor to its file. Tensors are read and
// written in blocks of rows: memory stays at two blocks whatever the state's size.
//
// A file: 8-byte little-endian header size, a JSON header {name: {"dtype", "shape",
// "data_offsets": [begin, end]}, "__metadata__": {...}} padded with spaces to a multiple
// of 8, then the tensors' bytes in header order.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "api/dtype.h"
#include "api/json_codec.h"
#include "api/status.h"
#include "storage/env.h"

namespace tessera::storage {

// safetensors' name of a dtype: "F32", "BF16", "I64", "BOOL", ...
std::string SafetensorsDType(DType dtype);

struct ExportOptions {
  uint64_t max_file_bytes = 5'000'000'000;  // Hugging Face's default shard size
  int threads = 2;                          // decode threads
  uint64_t block_bytes = 64 << 20;          // a tensor is read and written this much at a time
  // Called after each tensor: (tensors done, tensors in all, its name).
  std::function<void(size_t, size_t, const std::string&)> progress;
};

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
