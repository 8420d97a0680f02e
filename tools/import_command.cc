// `tessera import SOURCE ROOT --mesh M --step N`: safetensors files (a file, or a
// Hugging Face model folder) as a committed checkpoint under a root, without tesserad.
#include <cstdio>

#include "api/names.h"
#include "storage/safetensors_import.h"
#include "storage/thread_pool.h"
#include "tools/commands.h"

namespace tessera::tools {

int RunImport(const std::string& source, const std::string& root, const std::string& mesh, int64_t step,
              const std::string& compression, int level) {
  Status valid = ValidateName(mesh, "mesh");
  if (!valid.ok()) return Fail(valid, /*json=*/false);
  if (compression != "zstd" && compression != "none") {
    return Fail(InvalidArgument("--compression must be zstd or none, not " + compression,
                                {{"field", "compression"}}),
                /*json=*/false);
  }
  storage::Env* env = storage::DefaultEnv();
  storage::ImportOptions options;
  options.mesh = mesh;
  options.step = step;
  options.shard.compress = compression == "zstd";
  options.shard.level = level;
  options.metadata = {{"imported_from", source}};
  storage::ThreadPool pool(2);
  options.shard.pool = &pool;
  auto summary = storage::ImportSafetensors(env, source, root, options);
  if (!summary.ok()) return Fail(summary.status(), /*json=*/false);
  std::printf("imported %zu tensors (%s, stored as %s) from %zu file%s into %s\n", summary->tensors,
              HumanBytes(static_cast<double>(summary->bytes)).c_str(),
              HumanBytes(static_cast<double>(summary->stored_bytes)).c_str(), summary->files,
              summary->files == 1 ? "" : "s", summary->dir.c_str());
  return 0;
}

}  // namespace tessera::tools
