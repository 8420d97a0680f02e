// Bounded fuzzing of the readers (fixed seeds, a few seconds): mutated shard
// files and indexes must give clean errors, never a crash, and a checkpoint that
// verifies must read back exactly.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <set>

#include "checkpoint_fixture.h"
#include "storage/index.h"
#include "storage/testing/mem_env.h"
#include "storage/verify.h"

namespace tessera::storage {
namespace {

using testing::MakeRequest;
using testing::Mesh22;
using testing::MixedCheckpoint;
using testing::MixedTensors;

// TESSERA_FUZZ_SCALE multiplies the iteration counts (the `slow` ctest tier uses 20).
int Iterations(int base) {
  const char* scale = std::getenv("TESSERA_FUZZ_SCALE");
  return base * (scale ? std::max(1, std::atoi(scale)) : 1);
}

const std::set<Code> kCleanCodes = {Code::kOk, Code::kDataLoss, Code::kInvalidArgument,
                                    Code::kNotFound};

std::string Mutate(std::string s, std::mt19937_64& rng) {
  switch (rng() % 5) {
    case 0:  // flip a few bits
      for (int i = 0, n = 1 + rng() % 4; i < n && !s.empty(); ++i) s[rng() % s.size()] ^= 1 << (rng() % 8);
      break;
    case 1:  // truncate
      s.resize(s.empty() ? 0 : rng() % s.size());
      break;
    case 2:  // overwrite a run with garbage
      if (!s.empty()) {
        size_t at = rng() % s.size(), n = std::min<size_t>(s.size() - at, 1 + rng() % 64);
        for (size_t i = 0; i < n; ++i) s[at + i] = static_cast<char>(rng());
      }
      break;
    case 3:  // insert bytes
      s.insert(s.empty() ? 0 : rng() % s.size(), std::string(1 + rng() % 16, static_cast<char>(rng())));
      break;
    default:  // set a byte to 0xff (large lengths)
      if (!s.empty()) s[rng() % s.size()] = static_cast<char>(0xff);
  }
  return s;
}

// Reads everything; checks that failures are clean and success is exact.
void ReadAll(Env* env, const std::string& dir, const std::vector<testing::SyntheticTensor>& tensors,
             const std::string& what) {
  auto report = VerifyCheckpoint(env, dir);
  ASSERT_TRUE(kCleanCodes.count(report.status().code())) << what << report.status().ToString();
  for (const auto& t : tensors) {
    auto got = ReadSlice(env, dir, t.meta.name, FullSlice(t.meta.shape));
    ASSERT_TRUE(kCleanCodes.count(got.status().code())) << what << got.status().ToString();
    if (report.ok() && report->ok() && got.ok()) {
      EXPECT_EQ(*got, t.global) << what << t.meta.name;
    }
  }
}

TEST(Fuzz, MutatedShardFiles) {
  MemEnv env;
  Mesh m = Mesh22();
  auto tensors = MixedTensors(m);
  ShardOptions opt;
  opt.chunk_size = 512;
  auto saved = SaveCheckpoint(&env, MakeRequest("root", m, 1, tensors, opt));
  ASSERT_TRUE(saved.ok());
  std::mt19937_64 rng(20261122);
  for (int iter = 0; iter < Iterations(3000); ++iter) {
    const std::string path = JoinPath(saved->dir, ShardFileName(rng() % 4));
    const std::string orig = *ReadWholeFile(&env, path);
    ASSERT_TRUE(WriteFileDurably(&env, path, Mutate(orig, rng)).ok());
    ReadAll(&env, saved->dir, tensors, "shard iter " + std::to_string(iter) + ": ");
    ASSERT_TRUE(WriteFileDurably(&env, path, orig).ok());
  }
}

TEST(Fuzz, MutatedIndexBytes) {
  MixedCheckpoint ck;
  ASSERT_FALSE(ck.dir.empty());
  MemEnv& env = ck.env;
  const auto& tensors = ck.tensors;
  const std::string path = JoinPath(ck.dir, kIndexFile);
  const std::string orig = *ReadWholeFile(&env, path);
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < Iterations(3000); ++iter) {
    ASSERT_TRUE(WriteFileDurably(&env, path, Mutate(orig, rng)).ok());
    auto index = CheckpointIndex::Open(&env, ck.dir);
    ASSERT_TRUE(kCleanCodes.count(index.status().code())) << index.status().ToString();
    if (index.ok()) ReadAll(&env, ck.dir, tensors, "index iter " + std::to_string(iter) + ": ");
  }
}

// Semantically wrong rows in an otherwise valid SQLite index.
TEST(Fuzz, MutatedIndexRows) {
  MixedCheckpoint ck;
  ASSERT_FALSE(ck.dir.empty());
  MemEnv& env = ck.env;
  const auto& tensors = ck.tensors;
  const std::string path = JoinPath(ck.dir, kIndexFile);
  std::string orig = *ReadWholeFile(&env, path);
  orig.resize(orig.size() - kIndexSealBytes);  // the SQLite image; each edit is sealed again
  const char* columns[] = {"chunks.raw_offset", "chunks.offset", "chunks.length",
                           "chunks.raw_length", "chunks.codec", "chunks.checksum",
                           "chunks.slice_id", "slices.offsets", "slices.lengths", "slices.file",
                           "slices.tensor_id", "tensors.shape", "tensors.dtype", "tensors.layout",
                           "tensors.elements", "meta.value"};
  const char* values[] = {"-1", "0", "9223372036854775807", "'x'", "NULL", "'../../etc/passwd'",
                          "'1,2,3'", "'99999999999,99999999999'", "4294967296", "''", "'float8'"};
  std::mt19937_64 rng(99);
  for (int iter = 0; iter < Iterations(2000); ++iter) {
    auto db = SqliteDb::FromImage(orig, "index");
    ASSERT_TRUE(db.ok());
    std::string col = columns[rng() % std::size(columns)];
    std::string table = col.substr(0, col.find('.')), field = col.substr(col.find('.') + 1);
    std::string sql = "UPDATE " + table + " SET " + field + " = " + values[rng() % std::size(values)] +
                      " WHERE rowid = (SELECT rowid FROM " + table + " ORDER BY random() LIMIT 1)";
    (void)db->Exec(sql);  // constraint violations simply leave the row alone
    ASSERT_TRUE(WriteFileDurably(&env, path, SealIndexImage(*db->Serialize())).ok());
    auto index = CheckpointIndex::Open(&env, ck.dir);
    ASSERT_TRUE(kCleanCodes.count(index.status().code())) << sql << index.status().ToString();
    if (index.ok()) ReadAll(&env, ck.dir, tensors, sql + ": ");
  }
}

}  // namespace
}  // namespace tessera::storage
