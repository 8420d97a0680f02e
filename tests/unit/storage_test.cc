// Shard files, the index, read planning, save planning and the commit protocol.
#include <functional>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <set>

#include "checkpoint_fixture.h"
#include "eventually.h"
#include "storage/checkpoint_dir.h"
#include "storage/index.h"
#include "storage/testing/mem_env.h"
#include "storage/read_planner.h"
#include "storage/save_plan.h"
#include "storage/shard_reader.h"
#include "storage/shard_writer.h"
#include "storage/shared_chunks.h"
#include "storage/verify.h"

namespace tessera::storage {
namespace {

using testing::Expected;
using testing::MakeRequest;
using testing::MakeTensor;
using testing::Mesh22;
using testing::MixedCheckpoint;
using testing::MixedTensors;

TEST(ChunkCodec, CompressesWhenItPaysAndStoresRawOtherwise) {
  std::string zeros(1 << 16, '\0');
  std::string buf(MaxEncodedSize(zeros.size()), '\0');
  EncodedChunk z = EncodeChunk(zeros.data(), zeros.size(), true, 1, buf.data(), buf.size());
  EXPECT_EQ(z.codec, Codec::kZstd);
  EXPECT_LT(z.length, zeros.size() / 10);
  const std::string stored = buf.substr(0, z.length);
  std::string noise = SyntheticBytes(DType::kUInt8, 1 << 16, 7);
  EncodedChunk n = EncodeChunk(noise.data(), noise.size(), true, 1, buf.data(), buf.size());
  EXPECT_EQ(n.codec, Codec::kRaw);
  EXPECT_EQ(n.length, noise.size());
  std::string out(zeros.size(), 'x');
  ASSERT_TRUE(DecodeChunk(z.codec, stored, z.raw_length, z.checksum, out.data()).ok());
  EXPECT_EQ(out, zeros);
  EXPECT_EQ(DecodeChunk(z.codec, stored, z.raw_length, z.checksum + 1, out.data()).code(),
            Code::kDataLoss);
}

class ShardFileTest : public ::testing::TestWithParam<int> {};

TEST_P(ShardFileTest, RoundTripsChunksOfEverySlice) {
  MemEnv env;
  ThreadPool pool(2);
  ShardOptions opt;
  opt.chunk_size = 1003;  // rounded down to 1000: many chunks, odd boundaries
  opt.pool = GetParam() ? &pool : nullptr;
  std::vector<std::string> slices = {SyntheticBytes(DType::kFloat32, 1000, 1), std::string(5000, 'a'),
                                     std::string(), SyntheticBytes(DType::kUInt8, 333, 2)};
  auto w = ShardWriter::Create(&env, "s.tsr", opt);
  ASSERT_TRUE(w.ok());
  std::vector<size_t> handles;
  for (const auto& s : slices) handles.push_back(*(*w)->Add(s.data(), s.size()));
  ASSERT_TRUE((*w)->Finish().ok());
  auto r = ShardReader::Open(&env, "s.tsr");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto table = (*r)->ReadTable();
  ASSERT_TRUE(table.ok());
  size_t total_chunks = 0;
  for (size_t i = 0; i < slices.size(); ++i) {
    std::string back;
    uint64_t expect_offset = 0;
    for (const auto& c : (*w)->chunks(handles[i])) {
      EXPECT_EQ(c.raw_offset, expect_offset);
      EXPECT_LE(c.loc.raw_length, 1000u);
      std::string buf(c.loc.raw_length, '\0');
      ASSERT_TRUE((*r)->ReadChunk(c.loc, buf.data()).ok());
      back += buf;
      expect_offset += c.loc.raw_length;
      ++total_chunks;
    }
    EXPECT_EQ(back, slices[i]);
  }
  EXPECT_EQ(table->size(), total_chunks);
}

INSTANTIATE_TEST_SUITE_P(Pool, ShardFileTest, ::testing::Values(0, 1));

// Compression must pay for itself: float32 weights (~8% savings) are stored raw,
// bfloat16 weights (~22%) are compressed, and min_savings = 0 compresses anything.
TEST(ShardFile, SlicesAreCompressedOnlyWhenItPays) {
  auto codecs = [](const std::string& data, double min_savings) {
    MemEnv env;
    ShardOptions opt;
    opt.chunk_size = 64 << 10;
    opt.min_savings = min_savings;
    auto w = ShardWriter::Create(&env, "s.tsr", opt);
    size_t h = *(*w)->Add(data.data(), data.size());
    EXPECT_TRUE((*w)->Finish().ok());
    std::set<Codec> seen;
    for (const auto& c : (*w)->chunks(h)) seen.insert(c.loc.codec);
    return seen;
  };
  const std::string f32 = SyntheticBytes(DType::kFloat32, 1 << 18, 1);
  const std::string bf16 = SyntheticBytes(DType::kBFloat16, 1 << 19, 1);
  EXPECT_EQ(codecs(f32, 0.10), std::set<Codec>{Codec::kRaw});
  EXPECT_EQ(codecs(bf16, 0.10), std::set<Codec>{Codec::kZstd});
  EXPECT_EQ(codecs(f32, 0.0), std::set<Codec>{Codec::kZstd});
  // A slice of one chunk, below the sample size, obeys the same rule.
  EXPECT_EQ(codecs(f32.substr(0, 32 << 10), 0.10), std::set<Codec>{Codec::kRaw});
  EXPECT_EQ(codecs(bf16.substr(0, 32 << 10), 0.10), std::set<Codec>{Codec::kZstd});
}

TEST(ShardFile, HeaderChecksNameTheFile) {
  MemEnv env;
  ASSERT_TRUE(WriteFileDurably(&env, "bad.tsr", std::string(100, 'z')).ok());
  auto r = ShardReader::Open(&env, "bad.tsr");
  EXPECT_EQ(r.status().code(), Code::kDataLoss);
  EXPECT_NE(r.status().message().find("bad.tsr"), std::string::npos);
  std::string header = EncodeShardHeader(4096);
  header[8] = 9;  // format version 9
  ASSERT_TRUE(WriteFileDurably(&env, "v9.tsr", header + std::string(64, '\0')).ok());
  r = ShardReader::Open(&env, "v9.tsr");
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("version 9"), std::string::npos);
}

TEST(ThreadSet, FinishedThreadsAreReapedAndAllJoined) {
  ThreadSet set;
  std::atomic<int> ran{0};
  for (int i = 0; i < 200; ++i) set.Spawn([&ran] { ran++; });
  ASSERT_TRUE(tessera::testing::Eventually([&] { return ran.load() == 200; }));
  // Every one has run: a later Spawn joins the finished ones along the way.
  EXPECT_TRUE(tessera::testing::Eventually([&] {
    set.Spawn([&ran] { ran++; });
    return set.size() <= 2;
  }));
  set.JoinAll();
  EXPECT_GT(ran.load(), 200);
  EXPECT_EQ(set.size(), 0u);
}

TEST(SavePlan, ReplicatedSlicesWrittenOnceAndBalanced) {
  Mesh m = Mesh22();
  std::vector<TensorMeta> tensors;
  for (int i = 0; i < 8; ++i) {
    tensors.push_back({"r" + std::to_string(i), DType::kFloat32, {256}, Layout::Replicated(1)});
  }
  tensors.push_back({"s", DType::kFloat32, {64, 64}, Layout{{"data", "model"}}});
  auto plan = PlanSave(m, tensors);
  EXPECT_EQ(plan.size(), 8u + 4u);  // each replicated tensor once, 4 distinct shards
  auto bytes = BytesPerRank(m, plan);
  // 8 KiB of replicated tensors spread over 4 workers on top of 4 KiB shards each.
  for (uint64_t b : bytes) EXPECT_EQ(b, 4096u + 2048u);
}

TEST(Checkpoint, SaveAndReadBackEveryDtypeAndLayout) {
  MemEnv env;
  Mesh m = Mesh22();
  auto tensors = MixedTensors(m);
  // Also one tensor of each remaining dtype.
  for (DType d : AllDTypes()) {
    tensors.push_back(MakeTensor(m, {"all/" + std::string(DTypeName(d)), d, {8, 6},
                                     Layout{{"data", "unsharded"}}},
                                 static_cast<uint64_t>(d) + 50));
  }
  auto req = MakeRequest("root", m, 7, tensors);
  req.metadata = {{"lr", 0.1}};
  auto saved = SaveCheckpoint(&env, req);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  auto index = CheckpointIndex::Open(&env, saved->dir);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(index->meta().step, 7);
  EXPECT_EQ(index->meta().mesh, m);
  EXPECT_EQ(index->meta().metadata["lr"], 0.1);
  EXPECT_EQ(index->tensors().size(), tensors.size());
  for (const auto& t : tensors) {
    const TensorEntry* e = index->Find(t.meta.name);
    ASSERT_NE(e, nullptr) << t.meta.name;
    EXPECT_EQ(e->meta, t.meta);
    auto whole = ReadSlice(&env, saved->dir, t.meta.name, FullSlice(t.meta.shape));
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    EXPECT_EQ(*whole, t.global) << t.meta.name;
    for (int64_t d = 0; d < m.num_devices(); ++d) {
      SliceSpec s = DeviceSlice(m, t.meta.layout, t.meta.shape, d);
      EXPECT_EQ(*ReadSlice(&env, saved->dir, t.meta.name, s), t.shards[d]);
    }
  }
  // Fragments are gone after the merge; only shards and the index remain.
  auto names = env.ListDir(saved->dir);
  for (const auto& n : *names) EXPECT_EQ(n.find("fragment"), std::string::npos) << n;
  auto report = VerifyCheckpoint(&env, saved->dir);
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok()) << report->ToJson().dump();
}

TEST(Checkpoint, ReplicatedTensorStoredOnce) {
  MemEnv env;
  Mesh m = Mesh22();
  std::vector<testing::SyntheticTensor> tensors = {
      MakeTensor(m, {"rep", DType::kUInt8, {4096}, Layout::Replicated(1)}, 3)};
  ShardOptions opt;
  opt.compress = false;
  auto saved = SaveCheckpoint(&env, MakeRequest("root", m, 1, tensors, opt));
  ASSERT_TRUE(saved.ok());
  EXPECT_EQ(saved->written_raw_bytes, 4096u);
  auto index = CheckpointIndex::Open(&env, saved->dir);
  EXPECT_EQ(index->Find("rep")->slices.size(), 1u);
}

// Random resharding: save on one mesh/layout, read every device slice of
// another mesh/layout, compare with the global tensor.
TEST(Checkpoint, ReshardingGivesTheSameGlobalTensor) {
  std::mt19937 rng(42);
  std::vector<Mesh> meshes = {Mesh22(), Mesh{"a", {{"data", 4}}, 1}, Mesh{"b", {{"x", 2}}, 1},
                              Mesh{"c", {{"x", 2}, {"y", 2}, {"z", 2}}, 2}};
  for (int iter = 0; iter < 20; ++iter) {
    MemEnv env;
    const Mesh& src = meshes[rng() % meshes.size()];
    const Mesh& dst = meshes[rng() % meshes.size()];
    DType dtype = AllDTypes()[rng() % AllDTypes().size()];
    Shape shape{static_cast<int64_t>(8 * (1 + rng() % 3)), static_cast<int64_t>(4 * (1 + rng() % 2)), 2};
    auto random_layout = [&](const Mesh& mesh) {
      Layout l = Layout::Replicated(shape.size());
      for (const auto& ax : mesh.axes) {
        size_t dim = rng() % (shape.size() + 1);  // == size: leave replicated
        if (dim < shape.size() && l.dims[dim] == kUnsharded && shape[dim] % ax.size == 0) {
          l.dims[dim] = ax.name;
        }
      }
      return l;
    };
    Layout src_layout = random_layout(src), dst_layout = random_layout(dst);
    std::vector<testing::SyntheticTensor> tensors = {
        MakeTensor(src, {"t", dtype, shape, src_layout}, iter)};
    ShardOptions opt;
    opt.chunk_size = 64;  // many chunks so partial overlaps are exercised
    auto saved = SaveCheckpoint(&env, MakeRequest("root", src, 1, tensors, opt));
    ASSERT_TRUE(saved.ok()) << saved.status().ToString();
    for (int64_t d = 0; d < dst.num_devices(); ++d) {
      SliceSpec s = DeviceSlice(dst, dst_layout, shape, d);
      auto got = ReadSlice(&env, saved->dir, "t", s);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_EQ(*got, Expected(tensors[0], s))
          << "iter " << iter << " " << src.ToString() << "[" << src_layout.ToString() << "] → "
          << dst.ToString() << "[" << dst_layout.ToString() << "] device " << d;
    }
  }
}

TEST(ReadPlanner, ReadsOnlyChunksOverlappingTheTarget) {
  MemEnv env;
  Mesh one{"one", {{"d", 1}}, 1};
  // 1024 rows of 1 KiB, chunks of 4 KiB: each chunk is 4 rows.
  std::vector<testing::SyntheticTensor> tensors = {
      MakeTensor(one, {"big", DType::kUInt8, {1024, 1024}, Layout::Replicated(2)}, 9)};
  ShardOptions opt;
  opt.chunk_size = 4096;
  opt.compress = false;
  auto saved = SaveCheckpoint(&env, MakeRequest("root", one, 1, tensors, opt));
  ASSERT_TRUE(saved.ok());
  auto index = CheckpointIndex::Open(&env, saved->dir);
  const TensorEntry* t = index->Find("big");
  // A quarter of the rows (as for device 1 of {data:4}) needs exactly a quarter of the chunks.
  SliceSpec quarter{{256, 0}, {256, 1024}};
  auto plan = PlanRead(*t, quarter);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->reads.size(), 64u);
  EXPECT_EQ(plan->stored_bytes, 256u * 1024);
  // One row: one chunk. One column: every chunk (it touches every row).
  EXPECT_EQ(PlanRead(*t, SliceSpec{{5, 0}, {1, 1024}})->reads.size(), 1u);
  EXPECT_EQ(PlanRead(*t, SliceSpec{{0, 3}, {1024, 1}})->reads.size(), 256u);
  // A sub-box spanning rows 6..9 touches chunks 1 and 2 only.
  EXPECT_EQ(PlanRead(*t, SliceSpec{{6, 10}, {4, 10}})->reads.size(), 2u);
  EXPECT_EQ(PlanRead(*t, SliceSpec{{1020, 0}, {8, 1}}).status().code(), Code::kInvalidArgument);
}

TEST(Index, MergeRejectsDisagreeingWritersNamingTheTensor) {
  MemEnv env;
  ASSERT_TRUE(env.CreateDirs("s").ok());
  TensorMeta a{"t", DType::kFloat32, {4}, Layout{{"d"}}};
  TensorMeta b = a;
  b.dtype = DType::kInt32;
  SliceChunk c{0, {32, 8, 8, 0, Codec::kRaw}, {}};
  auto f0 = FragmentBuilder::Create();
  ASSERT_TRUE(f0->AddSlice(a, {{0}, {2}}, "shard-0.tsr", {c}).ok());
  ASSERT_TRUE(f0->WriteTo(&env, "s/fragment-0.sqlite").ok());
  auto f1 = FragmentBuilder::Create();
  ASSERT_TRUE(f1->AddSlice(b, {{2}, {2}}, "shard-1.tsr", {c}).ok());
  ASSERT_TRUE(f1->WriteTo(&env, "s/fragment-1.sqlite").ok());
  Status st = MergeFragments(&env, "s", {"fragment-0.sqlite", "fragment-1.sqlite"},
                             {Mesh{"m", {{"d", 2}}, 1}, 1, Json::object(), 0});
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.details()["tensor"], "t");
  EXPECT_NE(st.message().find("fragment-1.sqlite"), std::string::npos);
}

TEST(Index, MergeRejectsUncoveredTensor) {
  MemEnv env;
  ASSERT_TRUE(env.CreateDirs("s").ok());
  TensorMeta a{"t", DType::kFloat32, {4}, Layout{{"d"}}};
  auto f0 = FragmentBuilder::Create();
  ASSERT_TRUE(f0->AddSlice(a, {{0}, {2}}, "shard-0.tsr", {{0, {32, 8, 8, 0, Codec::kRaw}, {}}}).ok());
  ASSERT_TRUE(f0->WriteTo(&env, "s/fragment-0.sqlite").ok());
  Status st = MergeFragments(&env, "s", {"fragment-0.sqlite"},
                             {Mesh{"m", {{"d", 2}}, 1}, 1, Json::object(), 0});
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.details()["tensor"], "t");
}

TEST(Index, MissingGarbageAndWrongVersionAreClearErrors) {
  MixedCheckpoint ck;
  ASSERT_FALSE(ck.dir.empty());
  MemEnv& env = ck.env;
  const std::string index_path = JoinPath(ck.dir, kIndexFile);
  auto image = ReadWholeFile(&env, index_path);
  ASSERT_TRUE(image.ok());

  // Wrong format version.
  auto db = SqliteDb::FromImage(*image, "x");
  ASSERT_TRUE(db->Exec("UPDATE meta SET value = '99' WHERE key = 'format_version'").ok());
  ASSERT_TRUE(WriteFileDurably(&env, index_path, SealIndexImage(*db->Serialize())).ok());
  auto idx = CheckpointIndex::Open(&env, ck.dir);
  EXPECT_EQ(idx.status().code(), Code::kInvalidArgument);
  EXPECT_NE(idx.status().message().find("version 99"), std::string::npos);

  // Garbage.
  ASSERT_TRUE(WriteFileDurably(&env, index_path, std::string(4096, 'g')).ok());
  idx = CheckpointIndex::Open(&env, ck.dir);
  EXPECT_EQ(idx.status().code(), Code::kDataLoss);
  EXPECT_NE(idx.status().message().find("index.sqlite"), std::string::npos);

  // A valid SQLite file that is not an index.
  auto other = SqliteDb::OpenMemory();
  ASSERT_TRUE(other->Exec("CREATE TABLE x(y)").ok());
  ASSERT_TRUE(WriteFileDurably(&env, index_path, SealIndexImage(*other->Serialize())).ok());
  EXPECT_EQ(CheckpointIndex::Open(&env, ck.dir).status().code(), Code::kDataLoss);

  // Missing.
  ASSERT_TRUE(env.DeleteFile(index_path).ok());
  EXPECT_EQ(CheckpointIndex::Open(&env, ck.dir).status().code(), Code::kNotFound);
}

TEST(CheckpointDir, CommitListDeleteAndGc) {
  MemEnv env;
  Mesh m = Mesh22("team/run-1");  // '/' in a mesh name stays one directory
  auto tensors = MixedTensors(m);
  for (int64_t step : {10, 20, 30}) {
    ASSERT_TRUE(SaveCheckpoint(&env, MakeRequest("root", m, step, tensors)).ok());
  }
  EXPECT_TRUE(env.IsDirectory("root/team%2Frun-1/step-20"));
  EXPECT_EQ(*ListSteps(&env, "root", m.name), (std::vector<int64_t>{10, 20, 30}));
  // Saving a committed step again is a conflict and leaves it intact.
  auto again = SaveCheckpoint(&env, MakeRequest("root", m, 20, tensors));
  EXPECT_EQ(again.status().code(), Code::kConflict);
  EXPECT_TRUE(VerifyCheckpoint(&env, CheckpointDir("root", m.name, 20))->ok());
  ASSERT_TRUE(DeleteCheckpoint(&env, "root", m.name, 20).ok());
  EXPECT_EQ(*ListSteps(&env, "root", m.name), (std::vector<int64_t>{10, 30}));
  EXPECT_EQ(DeleteCheckpoint(&env, "root", m.name, 20).code(), Code::kNotFound);
  // Leftovers: two staging dirs (one still in use) and a half-deleted dir.
  ASSERT_TRUE(CreateStaging(&env, "root", m.name, 40, "dead").ok());
  ASSERT_TRUE(CreateStaging(&env, "root", m.name, 50, "live").ok());
  ASSERT_TRUE(env.CreateDirs(JoinPath(MeshDir("root", m.name), ".deleting-9-0")).ok());
  auto removed = CollectGarbage(&env, "root", {"live"});
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(removed->size(), 2u);
  EXPECT_TRUE(env.IsDirectory(StagingDir("root", m.name, 50, "live")));
  EXPECT_FALSE(env.Exists(StagingDir("root", m.name, 40, "dead")));
  EXPECT_EQ(*ListSteps(&env, "root", m.name), (std::vector<int64_t>{10, 30}));
}

// A deposed control plane commits (renames its staging dir into step-N) while the
// new leader's garbage collection removes that dir: the commit must fail, never
// publish a dir half removed. Collection renames a staging dir away before it removes
// anything, so the commit finds no staging dir.
class CommitDuringRemoval : public EnvWrapper {
 public:
  using EnvWrapper::EnvWrapper;
  std::function<void()> on_first_delete;
  Status DeleteTree(const std::string& dir) override {
    if (auto f = std::exchange(on_first_delete, nullptr)) f();
    return EnvWrapper::DeleteTree(dir);
  }
};

TEST(CheckpointDir, ACommitRacingGarbageCollectionFailsAndPublishesNothing) {
  MemEnv mem;
  CommitDuringRemoval env(&mem);
  Mesh m = Mesh22("m");
  ASSERT_TRUE(CreateStaging(&env, "root", m.name, 7, "j1-old").ok());
  ASSERT_TRUE(env.CreateDirs(StagingDir("root", m.name, 7, "j1-old") + "/sub").ok());
  Status late;
  env.on_first_delete = [&] { late = Commit(&env, "root", m.name, 7, "j1-old"); };
  auto removed = CollectGarbage(&env, "root", std::set<std::string>{});
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_FALSE(late.ok());
  EXPECT_EQ(*ListSteps(&env, "root", m.name), std::vector<int64_t>{});
  EXPECT_FALSE(env.Exists(StagingDir("root", m.name, 7, "j1-old")));
}

TEST(Verify, EveryFlippedChunkIsReportedWithTensorFileAndOffset) {
  MixedCheckpoint ck;
  ASSERT_FALSE(ck.dir.empty());
  MemEnv& env = ck.env;
  auto index = CheckpointIndex::Open(&env, ck.dir);
  for (const auto& t : index->tensors()) {
    for (const auto& s : t.slices) {
      for (const auto& c : s.chunks) {
        const std::string path = JoinPath(ck.dir, s.file);
        std::string orig = *ReadWholeFile(&env, path);
        std::string bad = orig;
        bad[c.loc.offset + c.loc.length / 2] ^= 0x10;
        ASSERT_TRUE(WriteFileDurably(&env, path, bad).ok());
        auto report = VerifyCheckpoint(&env, ck.dir);
        ASSERT_TRUE(report.ok());
        ASSERT_EQ(report->bad_chunks.size(), 1u) << t.meta.name;
        EXPECT_EQ(report->bad_chunks[0].tensor, t.meta.name);
        EXPECT_EQ(report->bad_chunks[0].file, s.file);
        EXPECT_EQ(report->bad_chunks[0].offset, c.loc.offset);
        // Reading the tensor fails the same way: data_loss naming the tensor.
        auto read = ReadSlice(&env, ck.dir, t.meta.name, FullSlice(t.meta.shape));
        EXPECT_EQ(read.status().code(), Code::kDataLoss);
        EXPECT_EQ(read.status().details()["tensor"], t.meta.name);
        ASSERT_TRUE(WriteFileDurably(&env, path, orig).ok());
      }
    }
  }
  EXPECT_TRUE(VerifyCheckpoint(&env, ck.dir)->ok());
}

TEST(Verify, TruncatedAndMissingShardsAreProblems) {
  MixedCheckpoint ck;
  ASSERT_FALSE(ck.dir.empty());
  MemEnv& env = ck.env;
  const std::string shard0 = JoinPath(ck.dir, "shard-0.tsr");
  std::string orig = *ReadWholeFile(&env, shard0);
  ASSERT_TRUE(WriteFileDurably(&env, shard0, orig.substr(0, orig.size() / 2)).ok());
  auto report = VerifyCheckpoint(&env, ck.dir);
  ASSERT_TRUE(report.ok());
  EXPECT_FALSE(report->ok());
  EXPECT_FALSE(report->problems.empty());
  EXPECT_FALSE(report->bad_chunks.empty());
  for (const auto& b : report->bad_chunks) EXPECT_EQ(b.file, "shard-0.tsr");
  ASSERT_TRUE(env.DeleteFile(shard0).ok());
  report = VerifyCheckpoint(&env, ck.dir);
  ASSERT_TRUE(report.ok());
  EXPECT_NE(report->problems[0].find("missing"), std::string::npos);
}

// Regressions found by the fuzz targets of fuzz/ (their inputs are in
// fuzz/corpus/index_reader/regress-*).

// The checkpoint's index after `sql`, written back in place with a fresh
// checksum (as a writer that means it would): what the rows say is checked.
void EditIndex(MemEnv* env, const std::string& dir, const std::string& sql) {
  const std::string path = JoinPath(dir, kIndexFile);
  std::string file = *ReadWholeFile(env, path);
  file.resize(file.size() - kIndexSealBytes);
  auto db = SqliteDb::FromImage(file, "index");
  ASSERT_TRUE(db.ok());
  ASSERT_TRUE(db->Exec(sql).ok()) << sql;
  ASSERT_TRUE(WriteFileDurably(env, path, SealIndexImage(*db->Serialize())).ok());
}

// A slice moved onto another (one digit of an offset changed, as a flipped bit
// in an unsealed index would) or shortened: the slices no longer tile their
// tensor, and open, verify and read all say so, naming the file and the tensor.
TEST(Index, SlicesThatDoNotTileTheirTensorAreDataLoss) {
  for (const auto& [sql, want] : std::vector<std::pair<std::string, std::string>>{
           {"UPDATE slices SET offsets = '0,16' WHERE offsets = '32,16' AND tensor_id = "
            "(SELECT id FROM tensors WHERE name = 'w')",
            "of tensor 'w' overlap"},
           {"UPDATE slices SET lengths = '16,16', elements = 256 WHERE offsets = '32,16' AND "
            "tensor_id = (SELECT id FROM tensors WHERE name = 'w')",
            "the slices of tensor 'w' cover 1792 of its 2048 elements"}}) {
    MixedCheckpoint ck;
    ASSERT_FALSE(ck.dir.empty());
    EditIndex(&ck.env, ck.dir, sql);
    auto idx = CheckpointIndex::Open(&ck.env, ck.dir);
    EXPECT_EQ(idx.status().code(), Code::kDataLoss) << sql;
    EXPECT_NE(idx.status().message().find(want), std::string::npos) << idx.status().ToString();
    EXPECT_EQ(idx.status().details()["file"], JoinPath(ck.dir, kIndexFile));
    EXPECT_EQ(VerifyCheckpoint(&ck.env, ck.dir).status().code(), Code::kDataLoss);
    EXPECT_EQ(ReadSlice(&ck.env, ck.dir, "w", FullSlice({64, 32})).status().code(),
              Code::kDataLoss);
  }
}

// An index written before the checksum (format version 1, no trailer) is still
// read; one that claims version 2 without its trailer is not.
TEST(Index, AnUnsealedIndexIsReadOnlyAsFormatVersion1) {
  MixedCheckpoint ck;
  ASSERT_FALSE(ck.dir.empty());
  const std::string path = JoinPath(ck.dir, kIndexFile);
  std::string sealed = *ReadWholeFile(&ck.env, path);
  const std::string image = sealed.substr(0, sealed.size() - kIndexSealBytes);
  ASSERT_TRUE(WriteFileDurably(&ck.env, path, image).ok());
  auto idx = CheckpointIndex::Open(&ck.env, ck.dir);
  EXPECT_EQ(idx.status().code(), Code::kDataLoss);
  EXPECT_NE(idx.status().message().find("no checksum trailer"), std::string::npos)
      << idx.status().ToString();
  auto db = SqliteDb::FromImage(image, "index");
  ASSERT_TRUE(db->Exec("UPDATE meta SET value = '1' WHERE key = 'format_version'").ok());
  ASSERT_TRUE(WriteFileDurably(&ck.env, path, *db->Serialize()).ok());
  idx = CheckpointIndex::Open(&ck.env, ck.dir);
  ASSERT_TRUE(idx.ok()) << idx.status().ToString();
  EXPECT_EQ(idx->format_version(), 1);
}

TEST(FuzzRegression, IndexPageDamagedUnderAQueryNamesTheFile) {
  // The schema reads, then a damaged page of a table fails a row step: that
  // error lacked the file.
  MixedCheckpoint ck;
  ASSERT_FALSE(ck.dir.empty());
  const std::string path = JoinPath(ck.dir, kIndexFile);
  std::string image = *ReadWholeFile(&ck.env, path);
  auto db = SqliteDb::FromImage(image, "index");
  auto root = db->Prepare("SELECT rootpage FROM sqlite_master WHERE name = 'chunks'");
  ASSERT_TRUE(root.ok() && *root->Step());
  const int64_t page = root->Int(0);
  ASSERT_GT(page, 1);
  const int page_size = static_cast<uint8_t>(image[16]) << 8 | static_cast<uint8_t>(image[17]);
  image[(page - 1) * page_size] = 0;  // not a b-tree page type
  ASSERT_TRUE(WriteFileDurably(&ck.env, path, image).ok());
  auto idx = CheckpointIndex::Open(&ck.env, ck.dir);
  EXPECT_EQ(idx.status().code(), Code::kDataLoss);
  EXPECT_EQ(idx.status().details()["file"], path);
  EXPECT_NE(idx.status().message().find(path), std::string::npos);
}

TEST(FuzzRegression, IndexSliceEndingPastInt64IsCorrupt) {
  // offset + length of a slice overflowed in Contains, and the slice was taken.
  MixedCheckpoint ck;
  ASSERT_FALSE(ck.dir.empty());
  EditIndex(&ck.env, ck.dir,
            "UPDATE tensors SET shape = '0,9223372036854775807', elements = 0 WHERE name = 'w';"
            "UPDATE slices SET offsets = '0,9223372036854775807', lengths = '0,1' "
            "WHERE tensor_id = (SELECT id FROM tensors WHERE name = 'w');"
            "DELETE FROM chunks WHERE slice_id IN "
            "(SELECT s.id FROM slices s JOIN tensors t ON t.id = s.tensor_id WHERE t.name = 'w')");
  auto idx = CheckpointIndex::Open(&ck.env, ck.dir);
  EXPECT_EQ(idx.status().code(), Code::kDataLoss);
  EXPECT_EQ(idx.status().details()["file"], JoinPath(ck.dir, kIndexFile));
}

TEST(FuzzRegression, IndexMeshWithTooManyDevicesIsCorrupt) {
  MixedCheckpoint ck;
  ASSERT_FALSE(ck.dir.empty());
  EditIndex(&ck.env, ck.dir,
            "UPDATE meta SET value = '{\"name\":\"m\",\"axes\":[{\"name\":\"a\",\"size\":65536},"
            "{\"name\":\"b\",\"size\":65536},{\"name\":\"c\",\"size\":65536},"
            "{\"name\":\"d\",\"size\":65536}],\"devices_per_worker\":1}' WHERE key = 'mesh'");
  auto idx = CheckpointIndex::Open(&ck.env, ck.dir);
  EXPECT_EQ(idx.status().code(), Code::kDataLoss);
  EXPECT_NE(idx.status().message().find("bad mesh"), std::string::npos);
}

TEST(FuzzRegression, IndexTablesMustHoldStoredRows) {
  // A recursive view in place of a table made Open read rows forever; a
  // generated column computes what it returns as well.
  const char* edits[] = {
      "DROP TABLE meta; CREATE VIEW meta(key, value) AS WITH RECURSIVE r(k) AS "
      "(SELECT 1 UNION ALL SELECT k + 1 FROM r) SELECT 'k' || k, 'v' FROM r",
      "ALTER TABLE tensors RENAME TO t0; CREATE VIEW tensors AS SELECT * FROM t0",
      "CREATE TABLE m2 AS SELECT * FROM meta; DROP TABLE meta;"
      "CREATE TABLE meta(key TEXT, v TEXT, value TEXT AS (v));"
      "INSERT INTO meta(key, v) SELECT key, value FROM m2",
  };
  for (const char* sql : edits) {
    MixedCheckpoint ck;
    ASSERT_FALSE(ck.dir.empty());
    EditIndex(&ck.env, ck.dir, sql);
    auto idx = CheckpointIndex::Open(&ck.env, ck.dir);
    EXPECT_EQ(idx.status().code(), Code::kDataLoss) << sql;
    EXPECT_NE(idx.status().message().find("plain tables"), std::string::npos) << sql;
    EXPECT_EQ(idx.status().details()["file"], JoinPath(ck.dir, kIndexFile));
  }
}

TEST(FuzzRegression, IndexSchemaThatDoesNotCompileIsCorrupt) {
  // A view over a column that does not exist fails the schema query itself,
  // which was answered `internal`.
  MixedCheckpoint ck;
  ASSERT_FALSE(ck.dir.empty());
  EditIndex(&ck.env, ck.dir,
            "DROP TABLE meta; CREATE VIEW meta(key, value) AS WITH RECURSIVE r(k) AS "
            "(SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT 'k' || k, 'v' FROM r");
  auto idx = CheckpointIndex::Open(&ck.env, ck.dir);
  EXPECT_EQ(idx.status().code(), Code::kDataLoss) << idx.status().ToString();
  EXPECT_EQ(idx.status().details()["file"], JoinPath(ck.dir, kIndexFile));
}

}  // namespace
}  // namespace tessera::storage
