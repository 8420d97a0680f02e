// Subcommands of the `tessera` CLI. Each returns the process exit code.
#pragma once

#include <cstdint>
#include <string>

#include "api/status.h"

namespace tessera::tools {

// 0 on success, 1 on error (message on stderr).
int RunInspect(const std::string& dir, bool json);
// 0 if every chunk verifies, 2 if some are bad, 1 if the checkpoint cannot be read.
int RunVerify(const std::string& dir, bool json, int threads);
// A root's meshes and committed steps with their sizes: 0, 2 if a checkpoint's summary
// cannot be read (listed as unreadable), 1 if the root cannot be listed.
int RunLs(const std::string& root, bool json);
// A committed checkpoint as safetensors files in `out_dir` (storage/safetensors_export.h):
// 0, or 1 with the error on stderr.
int RunExport(const std::string& checkpoint, const std::string& out_dir, uint64_t max_file_bytes,
              uint64_t block_bytes, int threads, int writers);
// Safetensors files (a file or a model folder) as committed step `step` of `mesh` under
// `root` (storage/safetensors_import.h): 0, or 1 with the error on stderr.
int RunImport(const std::string& source, const std::string& root, const std::string& mesh, int64_t step,
              const std::string& compression, int level);
// Writes a checkpoint of synthetic tensors, inspects, verifies and reads it back.
int RunDemo(const std::string& dir, bool keep);

// Prints `st` (as the JSON error body with `json`, else a line on stderr); 1.
int Fail(const Status& st, bool json);
// "12.3 MiB"
std::string HumanBytes(double bytes);

}  // namespace tessera::tools
