// `tessera export CHECKPOINT DIR`: a committed checkpoint (a directory or an s3://
// path) as Hugging Face safetensors files, without tesserad.
#include <unistd.h>

#include <cstdio>

#include "storage/checkpoint_dir.h"
#include "storage/safetensors_export.h"
#include "tools/commands.h"

namespace tessera::tools {

int RunExport(const std::string& checkpoint, const std::string& out_dir, uint64_t max_file_bytes,
              uint64_t block_bytes, int threads, int writers) {
  storage::Env* env = storage::DefaultEnv();
  auto dir = storage::ResolveCheckpointPath(env, checkpoint);
  if (!dir.ok()) return Fail(dir.status(), /*json=*/false);
  storage::ExportOptions options;
  options.max_file_bytes = max_file_bytes;
  options.threads = threads;
  options.writers = writers;
  options.block_bytes = block_bytes;
  if (isatty(STDERR_FILENO)) {
    options.progress = [](size_t done, size_t total, const std::string& name) {
      std::fprintf(stderr, "\rexporting: %zu of %zu tensors (%s)\033[K", done, total, name.c_str());
      if (done == total) std::fprintf(stderr, "\n");
    };
  }
  auto summary = storage::ExportSafetensors(env, *dir, out_dir, options);
  if (!summary.ok()) return Fail(summary.status(), /*json=*/false);
  std::printf("exported %zu tensors (%s) into %zu file%s in %s, with model.safetensors.index.json\n",
              summary->tensors, HumanBytes(static_cast<double>(summary->tensor_bytes)).c_str(),
              summary->files.size(), summary->files.size() == 1 ? "" : "s", out_dir.c_str());
  return 0;
}

}  // namespace tessera::tools
