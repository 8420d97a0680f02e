// `tessera inspect` and `tessera verify`.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>

#include "storage/checkpoint_dir.h"
#include "storage/index.h"
#include "storage/verify.h"
#include "tools/commands.h"

namespace tessera::tools {

using storage::CheckpointIndex;

std::string HumanBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

namespace {

double Ratio(uint64_t logical, uint64_t stored) {
  return stored ? static_cast<double>(logical) / stored : 1.0;
}

Json IndexJson(const std::string& dir, const CheckpointIndex& index) {
  Json tensors = Json::array();
  for (const auto& t : index.tensors()) {
    size_t chunks = 0;
    for (const auto& s : t.slices) chunks += s.chunks.size();
    tensors.push_back({{"name", t.meta.name},
                       {"dtype", DTypeName(t.meta.dtype)},
                       {"shape", t.meta.shape},
                       {"layout", LayoutToJson(t.meta.layout)},
                       {"slices", t.slices.size()},
                       {"chunks", chunks},
                       {"logical_bytes", t.meta.logical_bytes()},
                       {"stored_bytes", t.stored_bytes}});
  }
  const auto& m = index.meta();
  return {{"dir", dir},
          {"format_version", index.format_version()},
          {"mesh", MeshToJson(m.mesh)},
          {"step", m.step},
          {"created_at_ms", m.created_at_ms},
          {"metadata", m.metadata},
          {"files", index.files()},
          {"referenced_files", index.referenced_files()},
          {"logical_bytes", index.logical_bytes()},
          {"stored_bytes", index.stored_bytes()},
          {"referenced_bytes", index.referenced_bytes()},
          {"tensors", tensors}};
}

}  // namespace

int Fail(const Status& st, bool json) {
  if (json) {
    std::cout << ErrorBody(st).dump(2) << "\n";
  } else {
    std::cerr << "error: " << st.ToString() << "\n";
  }
  return 1;
}

int RunInspect(const std::string& path, bool json) {
  auto resolved = storage::ResolveCheckpointPath(storage::DefaultEnv(), path);
  if (!resolved.ok()) return Fail(resolved.status(), json);
  const std::string& dir = *resolved;
  auto index = CheckpointIndex::Open(storage::DefaultEnv(), dir);
  if (!index.ok()) return Fail(index.status(), json);
  if (json) {
    std::cout << IndexJson(dir, *index).dump(2) << "\n";
    return 0;
  }
  const auto& m = index->meta();
  std::printf("checkpoint %s\n  mesh %s %s (%lld devices, %lld per worker)  step %lld  format v%d\n",
              dir.c_str(), m.mesh.name.c_str(), m.mesh.ToString().c_str(),
              static_cast<long long>(m.mesh.num_devices()),
              static_cast<long long>(m.mesh.devices_per_worker), static_cast<long long>(m.step),
              index->format_version());
  std::printf("  %zu tensors, %zu shard files, logical %s, stored %s, ratio %.2f\n\n",
              index->tensors().size(), index->files().size(),
              HumanBytes(index->logical_bytes()).c_str(), HumanBytes(index->stored_bytes()).c_str(),
              Ratio(index->logical_bytes(), index->stored_bytes()));
  if (const auto refs = index->referenced_files(); !refs.empty()) {
    std::printf("  incremental: %s of it in %zu files of earlier checkpoints (%s ...)\n\n",
                HumanBytes(index->referenced_bytes()).c_str(), refs.size(), refs[0].c_str());
  }
  std::printf("%-28s %-9s %-14s %-20s %6s %6s %10s %10s %6s\n", "TENSOR", "DTYPE", "SHAPE",
              "LAYOUT", "SLICES", "CHUNKS", "LOGICAL", "STORED", "RATIO");
  for (const auto& t : index->tensors()) {
    size_t chunks = 0;
    for (const auto& s : t.slices) chunks += s.chunks.size();
    std::string shape = "[" + ShapeToString(t.meta.shape) + "]";
    std::string layout = "[" + t.meta.layout.ToString() + "]";
    std::printf("%-28s %-9s %-14s %-20s %6zu %6zu %10s %10s %6.2f\n", t.meta.name.c_str(),
                std::string(DTypeName(t.meta.dtype)).c_str(), shape.c_str(), layout.c_str(),
                t.slices.size(), chunks, HumanBytes(t.meta.logical_bytes()).c_str(),
                HumanBytes(t.stored_bytes).c_str(), Ratio(t.meta.logical_bytes(), t.stored_bytes));
  }
  return 0;
}

int RunVerify(const std::string& path, bool json, int threads) {
  auto resolved = storage::ResolveCheckpointPath(storage::DefaultEnv(), path);
  if (!resolved.ok()) return Fail(resolved.status(), json);
  const std::string& dir = *resolved;
  storage::ThreadPool pool(threads);
  // Progress on a terminal only, so scripts and --json output stay clean.
  const bool show = !json && isatty(STDERR_FILENO);
  auto last = std::chrono::steady_clock::now();
  auto progress = [&](uint64_t done, uint64_t total) {
    auto now = std::chrono::steady_clock::now();
    if (!show || (now - last < std::chrono::milliseconds(200) && done != total)) return;
    last = now;
    std::fprintf(stderr, "\rverifying: %s of %s (%.0f%%)", HumanBytes(done).c_str(),
                 HumanBytes(total).c_str(), total ? 100.0 * done / total : 100.0);
    if (done == total) std::fprintf(stderr, "\n");
  };
  auto report = storage::VerifyCheckpoint(storage::DefaultEnv(), dir, &pool, progress);
  if (!report.ok()) return Fail(report.status(), json);
  if (json) {
    std::cout << report->ToJson().dump(2) << "\n";
  } else {
    for (const auto& p : report->problems) std::printf("PROBLEM  %s\n", p.c_str());
    for (const auto& b : report->bad_chunks) {
      std::printf("BAD      tensor %s  file %s  offset %llu: %s\n", b.tensor.c_str(),
                  b.file.c_str(), static_cast<unsigned long long>(b.offset), b.error.c_str());
    }
    std::printf("%s: %llu tensors, %llu chunks, %s checked, %zu bad chunks, %zu problems\n",
                report->ok() ? "OK" : "CORRUPT", static_cast<unsigned long long>(report->tensors),
                static_cast<unsigned long long>(report->chunks_checked),
                HumanBytes(report->bytes_checked).c_str(), report->bad_chunks.size(),
                report->problems.size());
  }
  return report->ok() ? 0 : 2;
}

}  // namespace tessera::tools
