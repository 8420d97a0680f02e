// Incremental checkpoints in the storage layer (docs/format.md, "Incremental
// checkpoints"): chunks that equal the base's refer to the file that holds them, one
// hop away; reads, verify and deletes see through them; a file nothing refers to goes.
#include <gtest/gtest.h>

#include <set>

#include "storage/checkpoint_dir.h"
#include "storage/fragment_json.h"
#include "storage/chunk_ref.h"
#include "storage/index.h"
#include "storage/local_checkpoint.h"
#include "storage/rank_writer.h"
#include "storage/root_meta.h"
#include "storage/save_transaction.h"
#include "storage/shared_chunks.h"
#include "storage/testing/mem_env.h"
#include "storage/verify.h"
#include "worker/save_bases.h"

namespace tessera::storage {
namespace {

const Mesh kMesh{"m", {{"d", 1}}, 1};
const TensorMeta kA{"a", DType::kUInt8, {3000}, Layout{{"unsharded"}}};  // 3 chunks of 1 KiB
const TensorMeta kB{"b", DType::kUInt8, {100}, Layout{{"unsharded"}}};

struct Data {
  std::string a = std::string(3000, 'a');
  std::string b = std::string(100, 'b');
};

class Incremental : public ::testing::Test {
 protected:
  // Saves `data` as `step`, against the worker's base as an agent does; the dir.
  std::string Save(int64_t step, const Data& data, bool full = false) {
    ::tessera::SaveRequest request;
    request.full = full;
    std::shared_ptr<const worker::SaveBase> base = bases_.For("m", request);
    std::vector<SliceToWrite> slices = {
        {kA, FullSlice(kA.shape), data.a.data(), data.a.size(), nullptr},
        {kB, FullSlice(kB.shape), data.b.data(), data.b.size(), nullptr}};
    for (auto& s : slices) s.base = base ? base->Find(s.tensor, s.slice) : nullptr;
    SaveTransaction save(&env_, "root", kMesh, step, kSaveStagingId);
    EXPECT_TRUE(env_.CreateDirs(save.staging()).ok());
    ShardOptions opt;
    opt.chunk_size = 1024;
    opt.compress = false;
    auto w = WriteShard(&env_, save.staging(), ShardFileName(0, "t" + std::to_string(step)), slices, opt);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    if (!w.ok()) return "";
    std::set<int64_t> held;
    if (w->reused_bytes > 0) held.insert(base->step);
    Status merged = save.MergeSlices({w->fragment}, Json::object(), held);
    EXPECT_TRUE(merged.ok()) << merged.ToString();
    auto dir = save.Commit();
    EXPECT_TRUE(dir.ok()) << dir.status().ToString();
    bases_.Wrote("m", step, SaveDirName(&env_, "root", step), w->fragment, base.get());
    bases_.Ended("m", step, dir.ok());
    return dir.ok() ? *dir : "";
  }

  void ExpectHolds(int64_t step, const Data& data) {
    auto dir = CommittedDir(&env_, "root", "m", step);
    ASSERT_TRUE(dir.ok()) << dir.status().ToString();
    EXPECT_EQ(*ReadSlice(&env_, *dir, "a", FullSlice(kA.shape)), data.a) << "step " << step;
    EXPECT_EQ(*ReadSlice(&env_, *dir, "b", FullSlice(kB.shape)), data.b) << "step " << step;
    auto report = VerifyCheckpoint(&env_, *dir);
    ASSERT_TRUE(report.ok());
    EXPECT_TRUE(report->ok()) << report->ToJson().dump();
  }

  // The files each chunk of tensor `name` of `step` is in.
  std::vector<std::string> FilesOf(int64_t step, const std::string& name) {
    auto index = CheckpointIndex::Open(&env_, *CommittedDir(&env_, "root", "m", step));
    std::vector<std::string> out;
    for (const auto& s : index->Find(name)->slices) {
      for (const auto& c : s.chunks) out.push_back(ChunkFile(s, c));
    }
    return out;
  }

  MemEnv env_;
  worker::SaveBases bases_;
};

TEST_F(Incremental, UnchangedChunksReferToTheFileThatHoldsThem) {
  Data one, two, three;
  two.a[1500] = 'x';         // the middle chunk of a changes
  three = two;
  three.b[0] = 'y';          // then b
  Save(1, one);
  Save(2, two);
  Save(3, three);
  for (auto [step, data] : {std::pair{1, one}, {2, two}, {3, three}}) ExpectHolds(step, data);
  EXPECT_EQ(FilesOf(2, "a"), (std::vector<std::string>{"../step-1/shard-0-t1.tsr", "shard-0-t2.tsr",
                                                         "../step-1/shard-0-t1.tsr"}));
  EXPECT_EQ(FilesOf(2, "b"), (std::vector<std::string>{"../step-1/shard-0-t1.tsr"}));
  // One hop: step 3 refers to the files that hold the bytes, never to step 2's references.
  EXPECT_EQ(FilesOf(3, "a"), (std::vector<std::string>{"../step-1/shard-0-t1.tsr",
                                                         "../step-2/shard-0-t2.tsr",
                                                         "../step-1/shard-0-t1.tsr"}));
  EXPECT_EQ(FilesOf(3, "b"), (std::vector<std::string>{"shard-0-t3.tsr"}));
  auto summary = ReadSummary(&env_, *CommittedDir(&env_, "root", "m", 3));
  EXPECT_EQ((*summary)["referenced_bytes"], 3000);
  EXPECT_EQ((*summary)["stored_bytes"], 3100);
  // A full save refers to nothing.
  Save(4, three, /*full=*/true);
  EXPECT_EQ(FilesOf(4, "a"), std::vector<std::string>(3, "shard-0-t4.tsr"));
}

TEST_F(Incremental, AWriterWithNothingChangedWritesNoFile) {
  Data same;
  Save(1, same);
  const std::string dir = Save(2, same);
  EXPECT_FALSE(env_.Exists(JoinPath(dir, "shard-0-t2.tsr")));
  ExpectHolds(2, same);
}

TEST_F(Incremental, AFlippedSharedChunkIsNamedByVerifyForEveryCheckpointThatUsesIt) {
  Data one, two;
  two.b[3] = 'z';
  Save(1, one);
  Save(2, two);
  Save(3, two);
  // The first chunk of a, in step 1's file, is shared by all three.
  const std::string file = JoinPath(*CommittedDir(&env_, "root", "m", 1), "shard-0-t1.tsr");
  auto bytes = ReadWholeFile(&env_, file);
  ASSERT_TRUE(bytes.ok());
  std::string flipped = *bytes;
  flipped[32 + 10] ^= 0x04;  // past the 32-byte header: the first chunk's bytes
  ASSERT_TRUE(env_.DeleteFile(file).ok());
  auto out = env_.NewWritableFile(file);
  ASSERT_TRUE((*out)->Append(flipped.data(), flipped.size()).ok());
  ASSERT_TRUE((*out)->Close().ok());
  for (int64_t step : {1, 2, 3}) {
    auto report = VerifyCheckpoint(&env_, *CommittedDir(&env_, "root", "m", step));
    ASSERT_TRUE(report.ok());
    ASSERT_EQ(report->bad_chunks.size(), 1u) << "step " << step << ": " << report->ToJson().dump();
    EXPECT_EQ(report->bad_chunks[0].tensor, "a");
    EXPECT_EQ(report->bad_chunks[0].file, step == 1 ? "shard-0-t1.tsr" : "../step-1/shard-0-t1.tsr");
    EXPECT_EQ(report->bad_chunks[0].offset, 32u);
  }
}

TEST_F(Incremental, ADeleteKeepsWhatLaterCheckpointsUseAndTheLastReferenceFreesIt) {
  Data one, two;
  two.a[10] = 'q';
  Save(1, one);
  Save(2, two);
  ASSERT_TRUE(DeleteCheckpoint(&env_, "root", "m", 1).ok());
  EXPECT_EQ(*ListSteps(&env_, "root", "m"), (std::vector<int64_t>{2}));
  EXPECT_EQ(CommittedDir(&env_, "root", "m", 1).status().code(), Code::kNotFound);
  // Retired: its marker and the file step 2 uses, nothing else.
  EXPECT_EQ(*env_.ListDir("root/m/step-1"), (std::vector<std::string>{kRetiredFile, "shard-0-t1.tsr"}));
  ExpectHolds(2, two);
  // Its step cannot be saved again while its files are in use.
  SaveTransaction again(&env_, "root", kMesh, 1, kSaveStagingId);
  EXPECT_EQ(again.MergeSlices({}, Json::object()).code(), Code::kConflict);
  // Nor imported (an import's merge takes fragment files), under any staging id.
  SaveTransaction import(&env_, "root", kMesh, 1, "j-import");
  EXPECT_EQ(import.Merge({}, Json::object()).code(), Code::kConflict);
  EXPECT_EQ(CreateStaging(&env_, "root", "m", 1, "j-1").code(), Code::kConflict);
  // The garbage collector keeps it, and the last reference's delete frees it.
  ASSERT_TRUE(SweepRetired(&env_, "root").ok());
  EXPECT_TRUE(env_.Exists("root/m/step-1/shard-0-t1.tsr"));
  ASSERT_TRUE(DeleteCheckpoint(&env_, "root", "m", 2).ok());
  auto names = env_.ListDir("root/m");
  ASSERT_TRUE(names.ok());
  for (const std::string& n : *names) EXPECT_FALSE(n.starts_with("step-")) << n;
}

TEST_F(Incremental, AReferenceToAFileNoBaseHoldsIsRefused) {
  Data one;
  Save(1, one);
  FragmentSlice s{kB, FullSlice(kB.shape), "shard-0-x.tsr",
                  {{0, {32, 100, 100, Checksum(one.b.data(), 100), Codec::kRaw},
                    "../step-9/shard-0-t9.tsr"}}};
  SaveTransaction save(&env_, "root", kMesh, 2, kSaveStagingId);
  ASSERT_TRUE(env_.CreateDirs(save.staging()).ok());
  Status st = save.MergeSlices({{s}}, Json::object(), {1});
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("../step-9/shard-0-t9.tsr"), std::string::npos) << st.ToString();
}

TEST(ChunkRefs, OnlyAPlainFileOfACheckpointDirOfTheMeshIsAReference) {
  EXPECT_TRUE(ParseChunkRef("../step-12/shard-0-ab.tsr"));
  EXPECT_TRUE(ParseChunkRef("../.staging-12-w/shard-0-ab.tsr"));
  for (const char* bad : {"shard-0.tsr", "../step-x/s.tsr", "../../etc/passwd", "../step-1/../x",
                          "../step-1/.hidden", "../.deleting-1-0/s.tsr", "../step-1/", "/abs/x",
                          "../step-1/a/b"}) {
    EXPECT_FALSE(ParseChunkRef(bad)) << bad;
  }
  EXPECT_EQ(ResolveChunkFile("s3://b/p/m/.staging-3-w", "../.staging-1-w/s.tsr"),
            "s3://b/p/m/.staging-1-w/s.tsr");
}

// A join's fragment names its shard files by the index reader's rule: a name the reader
// would refuse is refused at the join, before anything is merged.
TEST(FragmentJson, AShardFileNameTheIndexWouldRefuseIsRefused) {
  FragmentSlice s{kB, FullSlice(kB.shape), "shard-0-x.tsr",
                  {{0, {32, 100, 100, 7, Codec::kRaw}, ""}}};
  ASSERT_TRUE(FragmentFromJson(FragmentToJson({s})).ok());
  for (const std::string& bad :
       std::vector<std::string>{".shard-0-x.tsr", "", "a/b", std::string(256, 'f')}) {
    s.file = bad;
    auto parsed = FragmentFromJson(FragmentToJson({s}));
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), Code::kInvalidArgument) << bad;
    EXPECT_FALSE(IsPlainFileName(bad)) << bad;
  }
}

}  // namespace
}  // namespace tessera::storage
