// What a checkpoint root holds besides checkpoint data (storage/root_meta.h): mesh
// documents in versions created once each, the newest winning; a committed
// checkpoint's summary, and its fallback to the index for checkpoints without one.
#include <gtest/gtest.h>

#include "storage/checkpoint_dir.h"
#include "storage/root_meta.h"
#include "tests/unit/checkpoint_fixture.h"

namespace tessera::storage {
namespace {

TEST(RootMeta, MeshDocumentsAreVersionsAndTheNewestWins) {
  MemEnv env;
  EXPECT_FALSE(ReadMeshDoc(&env, "root", "a/b")->has_value());
  EXPECT_EQ(*WriteMeshDoc(&env, "root", "a/b", {{"format", 1}, {"keep", 1}}), 1);
  EXPECT_EQ(*WriteMeshDoc(&env, "root", "a/b", {{"format", 1}, {"keep", 2}}), 2);
  EXPECT_EQ(*WriteMeshDoc(&env, "root", "a/b", {{"format", 1}, {"keep", 3}}), 3);
  auto doc = ReadMeshDoc(&env, "root", "a/b");
  ASSERT_TRUE(doc.ok() && doc->has_value());
  EXPECT_EQ((*doc)->version, 3);
  EXPECT_EQ((*doc)->doc["keep"], 3);
  EXPECT_FALSE((*doc)->deleted());
  // Garbage collection keeps the newest and the one it replaced.
  EXPECT_EQ(*PruneMeshDocs(&env, "root"), (std::vector<std::string>{"root/a%2Fb/mesh-1.json"}));
  auto names = env.ListDir(MeshDir("root", "a/b"));
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, (std::vector<std::string>{"mesh-2.json", "mesh-3.json"}));
  EXPECT_TRUE(PruneMeshDocs(&env, "root")->empty());
  // The mesh dir's name is escaped; the listing gives the mesh back.
  ASSERT_TRUE(env.CreateDirs("root/.staging-x").ok());
  EXPECT_EQ(*ListMeshDirs(&env, "root"), (std::vector<std::string>{"a/b"}));

  ASSERT_TRUE(WriteMeshDoc(&env, "root", "a/b", {{"deleted", true}}).ok());
  EXPECT_TRUE((*ReadMeshDoc(&env, "root", "a/b"))->deleted());
}

// An Env on which another control plane publishes the same file just before this one.
class RacingEnv : public EnvWrapper {
 public:
  using EnvWrapper::EnvWrapper;
  bool race = false;
  Status PublishFile(const std::string& path, std::string_view data) override {
    if (race) {
      race = false;
      (void)target()->PublishFile(path, R"({"by":"other"})");
    }
    return target()->PublishFile(path, data);
  }
};

TEST(RootMeta, AWriterThatLosesTheRaceForAVersionGetsAConflict) {
  MemEnv mem;
  RacingEnv env(&mem);
  ASSERT_TRUE(WriteMeshDoc(&env, "root", "m", {{"by", "first"}}).ok());
  env.race = true;
  auto mine = WriteMeshDoc(&env, "root", "m", {{"by", "second"}});
  EXPECT_EQ(mine.status().code(), Code::kConflict);
  EXPECT_NE(mine.status().message().find("another control plane"), std::string::npos);
  EXPECT_EQ((*ReadMeshDoc(&env, "root", "m"))->doc["by"], "other");  // the winner's stays
  // A document that is not JSON is data loss naming the file, not a crash.
  ASSERT_TRUE(mem.PublishFile(MeshDir("root", "m") + "/mesh-3.json", "{not json").ok());
  auto bad = ReadMeshDoc(&env, "root", "m");
  EXPECT_EQ(bad.status().code(), Code::kDataLoss);
  EXPECT_NE(bad.status().message().find("mesh-3.json"), std::string::npos);
}

TEST(RootMeta, ACommittedCheckpointCarriesItsSummary) {
  testing::MixedCheckpoint ck;
  ASSERT_FALSE(ck.dir.empty());
  ASSERT_TRUE(ck.env.Exists(ck.dir + "/" + kSummaryFile));
  auto summary = ReadSummary(&ck.env, ck.dir);
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  auto index = CheckpointIndex::Open(&ck.env, ck.dir);
  ASSERT_TRUE(index.ok());
  EXPECT_EQ(*summary, SummaryOf(*index));
  EXPECT_EQ((*summary)["tensors"].size(), ck.tensors.size());
  EXPECT_EQ((*summary)["step"], 1);
  EXPECT_GT((*summary)["stored_bytes"].get<uint64_t>(), 0u);

  // A checkpoint written before summaries: read from its index instead.
  ASSERT_TRUE(ck.env.DeleteFile(ck.dir + "/" + kSummaryFile).ok());
  auto fallback = ReadSummary(&ck.env, ck.dir);
  ASSERT_TRUE(fallback.ok());
  EXPECT_EQ(*fallback, *summary);
  // A summary that is not one is data loss.
  ASSERT_TRUE(WriteFileDurably(&ck.env, ck.dir + "/" + kSummaryFile, "[1,2]").ok());
  EXPECT_EQ(ReadSummary(&ck.env, ck.dir).status().code(), Code::kDataLoss);
}

}  // namespace
}  // namespace tessera::storage
