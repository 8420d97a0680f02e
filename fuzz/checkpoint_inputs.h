// A small committed checkpoint in memory, for the storage fuzz targets and the
// seed corpus: the mixed tensors of tests/unit/checkpoint_builders.h over a
// {data:2, model:2} mesh, saved with 512-byte chunks (so that every shard has
// several, raw and zstd), and a reader that reads all of it back.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "storage/index.h"
#include "storage/local_checkpoint.h"
#include "storage/testing/mem_env.h"
#include "storage/read_planner.h"
#include "storage/verify.h"
#include "tests/unit/checkpoint_builders.h"

namespace tessera::fuzz {

struct SavedCheckpoint {
  storage::MemEnv env;
  Mesh mesh = testing::Mesh22();
  std::vector<testing::SyntheticTensor> tensors = testing::MixedTensors(mesh);
  std::string dir;

  SavedCheckpoint() {
    storage::ShardOptions options;
    options.chunk_size = 512;
    auto saved = storage::SaveCheckpoint(&env, testing::MakeRequest("root", mesh, 1, tensors, options));
    if (!saved.ok()) {
      std::fprintf(stderr, "cannot save the fuzz checkpoint: %s\n", saved.status().ToString().c_str());
      std::abort();
    }
    dir = saved->dir;
  }

  std::string Path(const std::string& file) const { return storage::JoinPath(dir, file); }
  std::string Read(const std::string& file) {
    auto bytes = storage::ReadWholeFile(&env, Path(file));
    FUZZ_CHECK(bytes.ok(), bytes.status().ToString());
    return *bytes;
  }
  void Write(const std::string& file, std::string_view bytes) {
    Status st = storage::WriteFileDurably(&env, Path(file), bytes);
    FUZZ_CHECK(st.ok(), st.ToString());
  }
};

// The codes a reader may answer for damaged input (as tests/unit/fuzz_test.cc).
inline bool IsCleanReadError(const Status& st) {
  return IsCleanError(st, {Code::kDataLoss, Code::kInvalidArgument, Code::kNotFound});
}

// Tensors and chunks larger than this are not read: the harness would spend its
// time allocating. (Real chunks hold up to 256 MiB; the fuzz checkpoint's 512 B.)
inline constexpr uint64_t kMaxReadBytes = 1 << 20;

// Verifies the checkpoint and reads every tensor its index lists, whole and by
// halves of its first dimension. Failures must be clean. When the checkpoint
// verifies, a tensor of `expected` (same name and meta) must read back exactly:
// pass the tensors only when the index is the one saved with them, since an
// index whose rows move a chunk or a slice elsewhere still verifies (chunk
// checksums cover bytes, not where they belong).
inline void ReadEverything(storage::Env* env, const std::string& dir,
                           const std::vector<testing::SyntheticTensor>& expected) {
  auto index = storage::CheckpointIndex::Open(env, dir);
  FUZZ_CHECK(IsCleanReadError(index.status()), "index: " + index.status().ToString());
  if (!index.ok()) return;
  (void)index->logical_bytes();
  (void)index->stored_bytes();
  (void)index->files();
  auto report = storage::VerifyCheckpoint(env, dir);
  FUZZ_CHECK(IsCleanReadError(report.status()), "verify: " + report.status().ToString());
  const bool verified = report.ok() && report->ok();
  if (report.ok()) (void)report->ToJson().dump(-1, ' ', false, Json::error_handler_t::replace);
  for (const auto& t : index->tensors()) {
    FUZZ_CHECK(index->Find(t.meta.name) != nullptr, "Find misses " + t.meta.name);
    if (t.meta.logical_bytes() > kMaxReadBytes) continue;
    const SliceSpec full = FullSlice(t.meta.shape);
    std::vector<SliceSpec> targets = {full};
    if (!full.lengths.empty() && full.lengths[0] >= 2) {
      SliceSpec lo = full, hi = full;
      lo.lengths[0] = full.lengths[0] / 2;
      hi.offsets[0] = lo.lengths[0];
      hi.lengths[0] = full.lengths[0] - lo.lengths[0];
      targets.push_back(lo);
      targets.push_back(hi);
    }
    const testing::SyntheticTensor* want = nullptr;
    for (const auto& e : expected) {
      if (e.meta == t.meta) want = &e;
    }
    storage::ShardCache shards(env, dir);
    for (const auto& target : targets) {
      // ReadSlice itself for the whole tensor; its steps, on the index opened
      // once, for the halves (opening the index is most of the cost).
      Result<std::string> got = std::string();
      if (target == full) {
        got = storage::ReadSlice(env, dir, t.meta.name, target);
      } else if (auto plan = storage::PlanRead(t, target); !plan.ok()) {
        got = plan.status();
      } else {
        got->resize(target.NumElements() * DTypeSize(t.meta.dtype));
        if (Status st = storage::ExecuteRead(*plan, &shards, got->data(), got->size()); !st.ok()) got = st;
      }
      FUZZ_CHECK(IsCleanReadError(got.status()),
                 "read " + t.meta.name + target.ToString() + ": " + got.status().ToString());
      if (!got.ok()) continue;
      FUZZ_CHECK(got->size() == static_cast<size_t>(target.NumElements()) * DTypeSize(t.meta.dtype),
                 "read " + t.meta.name + ": wrong size");
      if (verified && want) {
        FUZZ_CHECK(*got == testing::Expected(*want, target),
                   "a verified checkpoint reads back other bytes for " + t.meta.name + target.ToString());
      }
    }
  }
}

}  // namespace tessera::fuzz
