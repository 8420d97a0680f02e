// Memory a trainer lends its worker (worker/borrowed_memory.h, borrowed_snapshot.h,
// TensorStore::Borrow) and the shard writer's slices read through a function: this
// test process is the lender, a forked child the one that goes away.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "storage/env.h"
#include "storage/shard_writer.h"
#include "storage/synthetic.h"
#include "storage/testing/mem_env.h"
#include "storage/thread_pool.h"
#include "worker/borrowed_memory.h"
#include "worker/borrowed_snapshot.h"
#include "worker/tensor_store.h"

namespace tessera::worker {
namespace {

// This worker is rank 1 of {data:2, model:2} with two devices each: it owns 2 and 3.
const Mesh kMesh{"m", {{"data", 2}, {"model", 2}}, 2};
const MeshPlacement kPlacement{kMesh, 1, {2, 3}, {}};
// float32[8,4] sharded over data: local shards are [4,4], 64 bytes.
const TensorDesc kMatrix{DType::kFloat32, {8, 4}, Layout{{"data", "unsharded"}}};
constexpr size_t kBytes = 64;

// The token this process lends under, as a worker reads it back.
const std::string kToken = "0123456789abcdef";

uint64_t Address(const void* p) { return reinterpret_cast<uint64_t>(p); }

std::string Hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

Json Lend(const std::vector<std::pair<int64_t, const std::string*>>& shards,
          const std::string& token_held = kToken) {
  Json list = Json::array();
  for (const auto& [device, bytes] : shards) {
    list.push_back({{"device", device}, {"address", Address(bytes->data())}, {"bytes", bytes->size()}});
  }
  return {{"pid", getpid()},
          {"token", Hex(kToken)},
          {"token_address", Address(token_held.data())},
          {"tensors",
           {{{"name", "w"}, {"dtype", "float32"}, {"shape", {8, 4}}, {"layout", {"data", nullptr}},
             {"shards", list}}}}};
}

TEST(BorrowedMemoryTest, ReadsAndWritesTheLendersBytesInPlace) {
  std::string lent = storage::SyntheticBytes(DType::kUInt8, 4096, 3);
  BorrowedMemory m(getpid(), Address(lent.data()), lent.size(), "w", 2);
  std::string got(100, '\0');
  ASSERT_TRUE(m.Read(1000, got.size(), got.data()).ok());
  EXPECT_EQ(got, lent.substr(1000, 100));
  const std::string fresh(100, 'z');
  ASSERT_TRUE(m.Write(4096 - 100, fresh.data(), fresh.size()).ok());
  EXPECT_EQ(lent.substr(4096 - 100), fresh);
  Status past = m.Read(4000, 100, got.data());
  EXPECT_EQ(past.code(), Code::kInternal) << past.ToString();
}

TEST(BorrowedMemoryTest, AProcessGoneIsNamedWithItsTensorAndDevice) {
  std::string lent(kBytes, 'a');
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the lender: its copy of `lent` is at the same address
    char c = 1;
    (void)!write(ready[1], &c, 1);
    pause();
    _exit(0);
  }
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  BorrowedMemory m(child, Address(lent.data()), lent.size(), "w", 3);
  std::string got(kBytes, '\0');
  ASSERT_TRUE(m.Read(0, kBytes, got.data()).ok());
  EXPECT_EQ(got, lent);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  close(ready[0]);
  close(ready[1]);
  Status gone = m.Read(0, kBytes, got.data());
  EXPECT_EQ(gone.code(), Code::kUnavailable) << gone.ToString();
  EXPECT_EQ(gone.details().value("tensor", ""), "w");
  EXPECT_EQ(gone.details().value("device", -1), 3);
  EXPECT_EQ(gone.details().value("pid", int64_t{-1}), child);
}

TEST(BorrowedMemoryTest, OnlyTheCallerHoldingItsTokenLends) {
  const std::string token = kToken;
  EXPECT_TRUE(CheckLender(getpid(), Address(token.data()), token).ok());
  auto refused = [](const Status& s) {
    EXPECT_EQ(s.code(), Code::kConflict) << s.ToString();
    EXPECT_EQ(s.details().value("reason", ""), "borrow_refused") << s.ToString();
  };
  const std::string other = "fedcba9876543210";
  refused(CheckLender(getpid(), Address(other.data()), token));  // not holding it
  refused(CheckLender(0, Address(token.data()), token));
  refused(CheckLender(1 << 30, Address(token.data()), token));  // no such process
  refused(CheckLender(getpid(), 8, token));                      // not its memory
  Status bad = CheckLent(getpid(), 8, 64);
  EXPECT_EQ(bad.code(), Code::kInvalidArgument) << bad.ToString();
}

TEST(BorrowedSnapshotTest, LendsEachShardWithoutACopyAndNamesWhatIsWrong) {
  const std::string token = kToken;
  std::string d2 = storage::SyntheticBytes(DType::kFloat32, 16, 2);
  std::string d3 = storage::SyntheticBytes(DType::kFloat32, 16, 3);
  auto snap = BorrowedSnapshot(kPlacement, Lend({{2, &d2}, {3, &d3}}, token));
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  ASSERT_EQ((*snap)->tensors.size(), 1u);
  EXPECT_TRUE((*snap)->borrows());
  EXPECT_EQ((*snap)->bytes(), 2 * kBytes);
  const Snapshot::Tensor& t = (*snap)->tensors[0];
  EXPECT_EQ(t.desc, kMatrix);
  d3[0] = 'X';  // read in place: a later change shows
  std::string got(kBytes, '\0');
  ASSERT_TRUE(t.shards[1].borrowed->Read(0, kBytes, got.data()).ok());
  EXPECT_EQ(got, d3);
  // A copy of its own, as a memory checkpoint keeps.
  TensorStore store([](const std::string&) -> Result<MeshPlacement> { return kPlacement; });
  auto owned = OwnSnapshot(*snap, &store);
  ASSERT_TRUE(owned.ok());
  EXPECT_FALSE((*owned)->borrows());
  d3[0] = 'Y';
  const auto& copy = *(*owned)->tensors[0].shards[1].buffer;
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(copy.data()), copy.size()), got);

  auto field = [&](const Json& body, const std::string& want) {
    auto r = BorrowedSnapshot(kPlacement, body);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().ToString();
    EXPECT_EQ(r.status().details().value("field", ""), want) << r.status().ToString();
  };
  Json short_one = Lend({{2, &d2}}, token);
  short_one["tensors"][0]["shards"][0]["bytes"] = kBytes - 4;
  field(short_one, "borrow.tensors[0].shards[0].bytes");
  Json elsewhere = Lend({{0, &d2}}, token);
  field(elsewhere, "borrow.tensors[0].shards[0].device");
  Json twice = Lend({{2, &d2}, {2, &d3}}, token);
  field(twice, "borrow.tensors[0].shards[1].device");
  Json unmapped = Lend({{2, &d2}}, token);
  unmapped["tensors"][0]["shards"][0]["address"] = 8;
  field(unmapped, "borrow.tensors[0].shards[0].address");
  Json bad_token = Lend({{2, &d2}}, token);
  bad_token["token"] = "zz";
  field(bad_token, "borrow.token");
}

TEST(BorrowedStoreTest, ARestoreWritesIntoTheLoanUntilItEnds) {
  TensorStoreOptions o;
  o.shm_prefix = "tessera-borrow-test-" + std::to_string(getpid());
  TensorStore store([](const std::string&) -> Result<MeshPlacement> { return kPlacement; }, o);
  ASSERT_TRUE(store.Put("m", "w", kMatrix, 2, std::string(kBytes, 'p')).ok());
  std::string target(kBytes, '\0');
  auto lent = std::make_shared<const BorrowedMemory>(getpid(), Address(target.data()), kBytes, "w", 2);
  ASSERT_TRUE(store.Borrow("m", "w", kMatrix, 2, lent).ok());  // replaces the held shard
  const std::string restored = storage::SyntheticBytes(DType::kFloat32, 16, 9);
  ASSERT_TRUE(store.Install("m", "w", kMatrix, 2, restored.data(), restored.size()).ok());
  EXPECT_EQ(target, restored);
  EXPECT_EQ(store.Get("m", "w", 2).status().code(), Code::kConflict);
  auto snap = store.TakeSnapshot("m", std::vector<std::string>{"w"});
  ASSERT_TRUE(snap.ok());
  EXPECT_TRUE((*snap)->borrows());  // read in place, not copied
  // Refused: a size that is not the shard's, another description.
  auto small = std::make_shared<const BorrowedMemory>(getpid(), Address(target.data()), 8, "w", 3);
  EXPECT_EQ(store.Borrow("m", "w", kMatrix, 3, small).code(), Code::kInvalidArgument);
  TensorDesc other = kMatrix;
  other.dtype = DType::kInt32;
  EXPECT_EQ(store.Borrow("m", "w", other, 3, lent).code(), Code::kConflict);
  store.EndLoans("m", {"w"});
  EXPECT_EQ(store.Get("m", "w", 2).status().code(), Code::kNotFound);
  // After the loan, an install makes a shard of the worker's own; the memory is untouched.
  ASSERT_TRUE(store.Install("m", "w", kMatrix, 2, std::string(kBytes, 'q').data(), kBytes).ok());
  EXPECT_EQ(target, restored);
}

class SliceReaderTest : public ::testing::TestWithParam<bool> {};

TEST_P(SliceReaderTest, WritesTheSameFileAsFromMemoryAndStopsAtItsError) {
  storage::MemEnv env;
  storage::ThreadPool pool(2);
  storage::ShardOptions opt;
  opt.chunk_size = 4000;  // many chunks
  opt.sample_bytes = 1000;
  opt.compress = GetParam();
  opt.pool = &pool;
  const std::string floats = storage::SyntheticBytes(DType::kFloat32, 10000, 4);
  const std::string zeros(9000, '\0');
  auto write = [&](const std::string& path, bool through_reader, int fail_at_chunk) -> Status {
    ASSIGN_OR_RETURN(auto w, storage::ShardWriter::Create(&env, path, opt));
    for (const std::string* s : {&floats, &zeros}) {
      const int width = s == &floats ? 4 : 0;
      if (!through_reader) {
        RETURN_IF_ERROR(w->Add(s->data(), s->size(), width).status());
        continue;
      }
      storage::SliceReader read = [s, fail_at_chunk, &opt](uint64_t off, size_t n, void* dst) {
        if (static_cast<int>(off / opt.chunk_size) == fail_at_chunk && s->size() > 9000) {
          return Unavailable("lender gone", {{"tensor", "f"}});
        }
        std::memcpy(dst, s->data() + off, n);
        return Status::Ok();
      };
      RETURN_IF_ERROR(w->Add(read, s->size(), width).status());
    }
    return w->Finish();
  };
  ASSERT_TRUE(write("memory.tsr", false, -1).ok());
  ASSERT_TRUE(write("reader.tsr", true, -1).ok());
  EXPECT_EQ(*storage::ReadWholeFile(&env, "memory.tsr"), *storage::ReadWholeFile(&env, "reader.tsr"));
  Status failed = write("failed.tsr", true, 5);
  EXPECT_EQ(failed.code(), Code::kUnavailable) << failed.ToString();
  EXPECT_EQ(failed.details().value("tensor", ""), "f");
}

INSTANTIATE_TEST_SUITE_P(Compress, SliceReaderTest, ::testing::Bool());

}  // namespace
}  // namespace tessera::worker
