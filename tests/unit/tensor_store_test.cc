#include "worker/tensor_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <fstream>
#include <filesystem>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace tessera::worker {
namespace {

// This worker is rank 1 of {data:2, model:2} with two devices each: it owns 2 and 3.
const Mesh kMesh{"m", {{"data", 2}, {"model", 2}}, 2};

Result<MeshPlacement> Resolve(const std::string& mesh) {
  if (mesh != "m") return NotFound("unknown mesh '" + mesh + "'", {{"mesh", mesh}});
  return MeshPlacement{kMesh, 1, {2, 3}, {}};
}

// Distinct bytes per (seed, position), so swapped or stale shards show.
std::string Pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + seed * 17 + i / 251) & 0xff);
  return s;
}

std::string Contents(const ShardBuffer& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// The trainer's side of a mapping: open the file and map it shared.
class TrainerMapping {
 public:
  explicit TrainerMapping(const std::string& path) {
    fd_ = open(path.c_str(), O_RDWR | O_CLOEXEC);
    EXPECT_GE(fd_, 0) << path;
    struct stat st;
    EXPECT_EQ(fstat(fd_, &st), 0);
    size_ = static_cast<size_t>(st.st_size);
    void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    EXPECT_NE(p, MAP_FAILED);
    data_ = static_cast<char*>(p);
  }
  ~TrainerMapping() {
    munmap(data_, size_);
    close(fd_);
  }
  char* data() { return data_; }
  size_t size() const { return size_; }
  std::string contents() const { return std::string(data_, size_); }

 private:
  int fd_ = -1;
  char* data_ = nullptr;
  size_t size_ = 0;
};

TensorDesc Desc(DType dtype, Shape shape, std::vector<std::string> layout) {
  return TensorDesc{dtype, std::move(shape), Layout{std::move(layout)}};
}

// float32[8,4] sharded over data: local shards are [4,4], 64 bytes.
const TensorDesc kMatrix = Desc(DType::kFloat32, {8, 4}, {"data", "unsharded"});
constexpr size_t kMatrixBytes = 64;

class TensorStoreTest : public ::testing::Test {
 protected:
  static TensorStoreOptions Options() {
    TensorStoreOptions o;
    o.shm_prefix = "tessera-test-" + std::to_string(getpid());
    return o;
  }
  void ExpectField(const Status& st, Code code, const std::string& field) {
    EXPECT_EQ(st.code(), code) << st.ToString();
    EXPECT_EQ(st.details().value("field", ""), field) << st.ToString();
  }

  TensorStore store_{Resolve, Options()};
};

TEST_F(TensorStoreTest, PutGetRoundTripForEveryDType) {
  for (DType dtype : AllDTypes()) {
    // [4,6] over data: local [2,6]; over data and model: local [2,3].
    const std::string name = "t/" + std::string(DTypeName(dtype));
    const TensorDesc desc = Desc(dtype, {4, 6}, {"data", "unsharded"});
    const size_t bytes = 12 * DTypeSize(dtype);
    for (int64_t device : {2, 3}) {
      ASSERT_TRUE(store_.Put("m", name, desc, device, Pattern(bytes, device)).ok());
    }
    for (int64_t device : {2, 3}) {
      auto ref = store_.Get("m", name, device);
      ASSERT_TRUE(ref.ok()) << ref.status().ToString();
      EXPECT_EQ(ref->desc, desc);
      EXPECT_EQ(ref->local_shape, (Shape{2, 6}));
      EXPECT_FALSE(ref->buffer->mapped());
      EXPECT_EQ(Contents(*ref->buffer), Pattern(bytes, static_cast<int>(device)));
    }
    const TensorDesc both = Desc(dtype, {4, 6}, {"data", "model"});
    ASSERT_TRUE(store_.Put("m", name + "/2d", both, 3, Pattern(6 * DTypeSize(dtype), 9)).ok());
    std::string read;
    auto ref = store_.Read("m", name + "/2d", 3, &read);
    ASSERT_TRUE(ref.ok());
    EXPECT_EQ(ref->local_shape, (Shape{2, 3}));
    EXPECT_EQ(read, Pattern(6 * DTypeSize(dtype), 9));
  }
  EXPECT_EQ(store_.List().size(), 2 * AllDTypes().size());
}

TEST_F(TensorStoreTest, ScalarsAndEmptyTensors) {
  const TensorDesc scalar = Desc(DType::kInt64, {}, {});
  ASSERT_TRUE(store_.Put("m", "step", scalar, 2, Pattern(8, 1)).ok());
  EXPECT_EQ(Contents(*store_.Get("m", "step", 2)->buffer), Pattern(8, 1));

  const TensorDesc empty = Desc(DType::kFloat32, {0, 4}, {"data", "unsharded"});
  ASSERT_TRUE(store_.Put("m", "empty", empty, 2, "").ok());
  EXPECT_EQ(store_.Get("m", "empty", 2)->buffer->size(), 0u);
  auto mapping = store_.Map("m", "empty", empty, 3);
  ASSERT_TRUE(mapping.ok()) << mapping.status().ToString();
  EXPECT_EQ(mapping->bytes, 0u);
  EXPECT_TRUE(FileExists(mapping->path));
  ASSERT_TRUE(store_.Install("m", "empty", empty, 3, nullptr, 0).ok());
  auto snap = store_.TakeSnapshot("m");
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ((*snap)->Find("empty")->shards.size(), 2u);
  EXPECT_EQ((*snap)->Find("step")->shards.size(), 1u);
  ASSERT_TRUE(store_.Delete("m", "empty").ok());
  EXPECT_FALSE(FileExists(mapping->path));
}

TEST_F(TensorStoreTest, ChecksNameTheField) {
  const std::string body = Pattern(kMatrixBytes, 0);
  Status st = store_.Put("m", "w", kMatrix, 2, body.substr(1));
  ExpectField(st, Code::kInvalidArgument, "body");
  EXPECT_NE(st.message().find("63"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("64"), std::string::npos) << st.message();

  st = store_.Put("m", "w", kMatrix, 0, body);
  ExpectField(st, Code::kInvalidArgument, "device");
  EXPECT_EQ(st.details()["devices"], nlohmann::json({2, 3}));
  EXPECT_NE(st.message().find("2,3"), std::string::npos) << st.message();
  ExpectField(store_.Put("m", "w", kMatrix, 4, body), Code::kInvalidArgument, "device");

  ExpectField(store_.Put("m", "w", Desc(DType::kFloat32, {8, 4}, {"pipe", "unsharded"}), 2, body),
              Code::kInvalidArgument, "layout");
  ExpectField(store_.Put("m", "w", Desc(DType::kFloat32, {8, 4}, {"data"}), 2, body),
              Code::kInvalidArgument, "layout");
  // 3 rows cannot be split over data:2.
  ExpectField(store_.Put("m", "w", Desc(DType::kFloat32, {3, 4}, {"data", "unsharded"}), 2, body),
              Code::kInvalidArgument, "layout");
  ExpectField(store_.Put("m", "w", Desc(DType::kFloat32, {-1, 4}, {"data", "unsharded"}), 2, body),
              Code::kInvalidArgument, "shape");

  for (const char* bad : {"", "../x", "/abs", "a//b", "a b", "a/./b"}) {
    ExpectField(store_.Put("m", bad, kMatrix, 2, body), Code::kInvalidArgument, "name");
    ExpectField(store_.Map("m", bad, kMatrix, 2).status(), Code::kInvalidArgument, "name");
  }
  ExpectField(store_.Put("../m", "w", kMatrix, 2, body), Code::kInvalidArgument, "mesh");
  EXPECT_EQ(store_.Put("other", "w", kMatrix, 2, body).code(), Code::kNotFound);
  EXPECT_EQ(store_.TakeSnapshot("other").status().code(), Code::kNotFound);
  ExpectField(store_.Map("m", "w", kMatrix, 1).status(), Code::kInvalidArgument, "device");
  ExpectField(store_.Install("m", "w", kMatrix, 2, body.data(), 65), Code::kInvalidArgument,
              "body");
  EXPECT_TRUE(store_.List().empty());
}

TEST_F(TensorStoreTest, DifferentDescriptionIsConflictNamingBoth) {
  ASSERT_TRUE(store_.Put("m", "w", kMatrix, 2, Pattern(kMatrixBytes, 0)).ok());
  const TensorDesc half = Desc(DType::kFloat16, {8, 4}, {"data", "unsharded"});
  Status st = store_.Put("m", "w", half, 3, Pattern(32, 0));
  EXPECT_EQ(st.code(), Code::kConflict);
  EXPECT_EQ(st.details()["tensor"], "w");
  EXPECT_NE(st.message().find("float32[8,4]"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("float16[8,4]"), std::string::npos) << st.message();
  EXPECT_EQ(st.details()["existing"]["dtype"], "float32");
  EXPECT_EQ(st.details()["requested"]["dtype"], "float16");
  EXPECT_EQ(store_.Map("m", "w", half, 3).status().code(), Code::kConflict);
  // The same description for another device is fine; the other mesh-less name too.
  EXPECT_TRUE(store_.Put("m", "w", kMatrix, 3, Pattern(kMatrixBytes, 1)).ok());
  ASSERT_TRUE(store_.Delete("m", "w").ok());
  EXPECT_TRUE(store_.Put("m", "w", half, 3, Pattern(32, 0)).ok());
}

TEST_F(TensorStoreTest, NotFoundNamesTensorAndDevice) {
  Status st = store_.Get("m", "nope", 2).status();
  EXPECT_EQ(st.code(), Code::kNotFound);
  EXPECT_EQ(st.details()["tensor"], "nope");
  ASSERT_TRUE(store_.Put("m", "w", kMatrix, 2, Pattern(kMatrixBytes, 0)).ok());
  st = store_.Get("m", "w", 3).status();
  EXPECT_EQ(st.code(), Code::kNotFound);
  EXPECT_EQ(st.details()["device"], 3);
  EXPECT_EQ(store_.Delete("m", "nope").code(), Code::kNotFound);
  EXPECT_EQ(store_.Get("other", "w", 2).status().code(), Code::kNotFound);
}

TEST_F(TensorStoreTest, MappingIsSharedWithTheTrainer) {
  ASSERT_TRUE(store_.Put("m", "w", kMatrix, 2, Pattern(kMatrixBytes, 5)).ok());
  auto mapping = store_.Map("m", "dense/kernel", kMatrix, 2);
  ASSERT_TRUE(mapping.ok()) << mapping.status().ToString();
  EXPECT_EQ(mapping->bytes, kMatrixBytes);
  EXPECT_EQ(mapping->local_shape, (Shape{4, 4}));
  EXPECT_EQ(mapping->path.rfind("/dev/shm/tessera-test-", 0), 0u) << mapping->path;
  struct stat st;
  ASSERT_EQ(stat(mapping->path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  EXPECT_EQ(static_cast<size_t>(st.st_size), kMatrixBytes);

  TrainerMapping trainer(mapping->path);
  EXPECT_EQ(trainer.contents(), std::string(kMatrixBytes, '\0'));  // new shards start zeroed
  std::memcpy(trainer.data(), Pattern(kMatrixBytes, 7).data(), kMatrixBytes);
  auto ref = store_.Get("m", "dense/kernel", 2);
  ASSERT_TRUE(ref.ok());
  EXPECT_TRUE(ref->buffer->mapped());
  EXPECT_EQ(Contents(*ref->buffer), Pattern(kMatrixBytes, 7));

  // A Put lands in the trainer's memory instead of replacing it.
  ASSERT_TRUE(store_.Put("m", "dense/kernel", kMatrix, 2, Pattern(kMatrixBytes, 8)).ok());
  EXPECT_EQ(trainer.contents(), Pattern(kMatrixBytes, 8));
  // Idempotent: the same file again.
  EXPECT_EQ(store_.Map("m", "dense/kernel", kMatrix, 2)->path, mapping->path);

  auto list = store_.List();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].name, "dense/kernel");
  EXPECT_TRUE(list[0].mapped);
  EXPECT_FALSE(list[1].mapped);
}

TEST_F(TensorStoreTest, MappingKeepsBytesAlreadyPut) {
  ASSERT_TRUE(store_.Put("m", "w", kMatrix, 3, Pattern(kMatrixBytes, 3)).ok());
  auto mapping = store_.Map("m", "w", kMatrix, 3);
  ASSERT_TRUE(mapping.ok());
  TrainerMapping trainer(mapping->path);
  EXPECT_EQ(trainer.contents(), Pattern(kMatrixBytes, 3));
}

TEST_F(TensorStoreTest, DeleteUnlinksTheMapping) {
  auto mapping = store_.Map("m", "w", kMatrix, 2);
  ASSERT_TRUE(mapping.ok());
  ASSERT_TRUE(FileExists(mapping->path));
  ASSERT_TRUE(store_.Delete("m", "w").ok());
  EXPECT_FALSE(FileExists(mapping->path));
  EXPECT_EQ(store_.Get("m", "w", 2).status().code(), Code::kNotFound);
  EXPECT_EQ(store_.Delete("m", "w").code(), Code::kNotFound);
}

TEST_F(TensorStoreTest, DestroyingTheStoreUnlinksMappings) {
  std::string path;
  {
    TensorStoreOptions options = Options();
    options.shm_prefix += "-scoped";
    TensorStore store(Resolve, options);
    auto mapping = store.Map("m", "w", kMatrix, 2);
    ASSERT_TRUE(mapping.ok());
    path = mapping->path;
    ASSERT_TRUE(FileExists(path));
  }
  EXPECT_FALSE(FileExists(path));
}

TEST_F(TensorStoreTest, SnapshotIsIsolatedFromLaterWrites) {
  ASSERT_TRUE(store_.Put("m", "heap", kMatrix, 2, Pattern(kMatrixBytes, 1)).ok());
  ASSERT_TRUE(store_.Put("m", "heap", kMatrix, 3, Pattern(kMatrixBytes, 2)).ok());
  auto mapping = store_.Map("m", "mapped", kMatrix, 2);
  ASSERT_TRUE(mapping.ok());
  TrainerMapping trainer(mapping->path);
  std::memcpy(trainer.data(), Pattern(kMatrixBytes, 3).data(), kMatrixBytes);

  auto snap = store_.TakeSnapshot("m");
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();

  // The trainer moves on: overwrites both tensors, then deletes one.
  ASSERT_TRUE(store_.Put("m", "heap", kMatrix, 2, Pattern(kMatrixBytes, 9)).ok());
  std::memcpy(trainer.data(), Pattern(kMatrixBytes, 9).data(), kMatrixBytes);
  ASSERT_TRUE(store_.Put("m", "mapped", kMatrix, 2, Pattern(kMatrixBytes, 10)).ok());
  ASSERT_TRUE(store_.Delete("m", "heap").ok());

  const Snapshot& s = **snap;
  EXPECT_EQ(s.placement.devices, (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(s.tensors.size(), 2u);
  const Snapshot::Tensor* heap = s.Find("heap");
  ASSERT_NE(heap, nullptr);
  EXPECT_EQ(heap->desc, kMatrix);
  ASSERT_EQ(heap->shards.size(), 2u);
  EXPECT_EQ(heap->shards[0].device, 2);
  EXPECT_EQ(Contents(*heap->shards[0].buffer), Pattern(kMatrixBytes, 1));
  EXPECT_EQ(Contents(*heap->shards[1].buffer), Pattern(kMatrixBytes, 2));
  EXPECT_TRUE(heap->absent_devices.empty());
  const Snapshot::Tensor* mapped = s.Find("mapped");
  ASSERT_NE(mapped, nullptr);
  ASSERT_EQ(mapped->shards.size(), 1u);
  EXPECT_FALSE(mapped->shards[0].buffer->mapped());
  EXPECT_EQ(Contents(*mapped->shards[0].buffer), Pattern(kMatrixBytes, 3));
  EXPECT_EQ(mapped->absent_devices, (std::vector<int64_t>{3}));
  EXPECT_EQ(s.bytes(), 3 * kMatrixBytes);
  EXPECT_EQ(s.Find("nope"), nullptr);
}

TEST_F(TensorStoreTest, SnapshotOfNamedTensors) {
  for (const char* name : {"a", "b", "c"}) {
    ASSERT_TRUE(store_.Put("m", name, kMatrix, 2, Pattern(kMatrixBytes, name[0])).ok());
  }
  auto snap = store_.TakeSnapshot("m", std::vector<std::string>{"c", "a", "c"});
  ASSERT_TRUE(snap.ok());
  ASSERT_EQ((*snap)->tensors.size(), 2u);
  EXPECT_EQ((*snap)->tensors[0].name, "a");
  EXPECT_EQ((*snap)->tensors[1].name, "c");
  auto missing = store_.TakeSnapshot("m", std::vector<std::string>{"a", "zz"});
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  EXPECT_EQ(missing.status().details()["tensor"], "zz");
  auto none = store_.TakeSnapshot("m", std::vector<std::string>{});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE((*none)->tensors.empty());
}

TEST_F(TensorStoreTest, LargeSnapshotCopiesEveryByteAcrossThreads) {
  // 2048 x 1024 float32 over data: 4 MiB per shard, split across copy threads.
  const TensorDesc big = Desc(DType::kFloat32, {2048, 1024}, {"data", "unsharded"});
  const size_t bytes = size_t{4} << 20;
  ASSERT_TRUE(store_.Put("m", "big", big, 2, Pattern(bytes, 1)).ok());
  auto mapping = store_.Map("m", "big", big, 3);
  ASSERT_TRUE(mapping.ok());
  ASSERT_TRUE(store_.Put("m", "big", big, 3, Pattern(bytes, 2)).ok());
  ASSERT_TRUE(store_.Put("m", "small", kMatrix, 3, Pattern(kMatrixBytes, 3)).ok());
  auto snap = store_.TakeSnapshot("m");
  ASSERT_TRUE(snap.ok());
  const Snapshot::Tensor* t = (*snap)->Find("big");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Contents(*t->shards[0].buffer), Pattern(bytes, 1));
  EXPECT_EQ(Contents(*t->shards[1].buffer), Pattern(bytes, 2));
  EXPECT_EQ(Contents(*(*snap)->Find("small")->shards[0].buffer), Pattern(kMatrixBytes, 3));
}

TEST_F(TensorStoreTest, SnapshotBuffersAreReused) {
  const TensorDesc big = Desc(DType::kFloat32, {1024, 1024}, {"data", "unsharded"});
  for (int64_t device : {2, 3}) {
    ASSERT_TRUE(store_.Put("m", "big", big, device, Pattern(size_t{2} << 20, 1)).ok());
    ASSERT_TRUE(store_.Put("m", "small", kMatrix, device, Pattern(kMatrixBytes, 2)).ok());
  }
  {
    auto first = store_.TakeSnapshot("m");
    ASSERT_TRUE(first.ok());
  }
  auto stats = store_.snapshot_pool_stats();
  EXPECT_EQ(stats.allocated, 4u);
  EXPECT_EQ(stats.reused, 0u);
  EXPECT_EQ(stats.pooled_bytes, 2 * ((size_t{2} << 20) + kMatrixBytes));

  ASSERT_TRUE(store_.Put("m", "big", big, 2, Pattern(size_t{2} << 20, 3)).ok());
  auto second = store_.TakeSnapshot("m");
  ASSERT_TRUE(second.ok());
  stats = store_.snapshot_pool_stats();
  EXPECT_EQ(stats.allocated, 4u);
  EXPECT_EQ(stats.reused, 4u);
  EXPECT_EQ(stats.pooled_bytes, 0u);
  // Recycled buffers carry the new bytes, not the old ones.
  EXPECT_EQ(Contents(*(*second)->Find("big")->shards[0].buffer), Pattern(size_t{2} << 20, 3));
}

TEST(ShardBufferPool, EvictsOldestBeyondItsCap) {
  auto pool = ShardBufferPool::Create(300);
  {
    auto a = pool->Acquire(100);
    auto b = pool->Acquire(200);
    auto c = pool->Acquire(150);
    auto huge = pool->Acquire(400);  // larger than the cap: never pooled
    ASSERT_TRUE(a.ok() && b.ok() && c.ok() && huge.ok());
  }  // released in reverse order: huge (dropped), c, b (evicts c), a
  auto stats = pool->stats();
  EXPECT_EQ(stats.allocated, 4u);
  EXPECT_EQ(stats.pooled_bytes, 300u);
  auto again = pool->Acquire(200);
  auto evicted = pool->Acquire(150);
  ASSERT_TRUE(again.ok() && evicted.ok());
  EXPECT_EQ(pool->stats().reused, 1u);
  EXPECT_EQ(pool->stats().allocated, 5u);
  // A buffer outliving its pool is simply freed.
  auto orphan = pool->Acquire(10);
  pool.reset();
  orphan->reset();
}

TEST_F(TensorStoreTest, InstallWritesIntoExistingShards) {
  const TensorDesc desc = kMatrix;
  ASSERT_TRUE(
      store_.Install("m", "restored", desc, 2, Pattern(kMatrixBytes, 1).data(), kMatrixBytes).ok());
  EXPECT_EQ(Contents(*store_.Get("m", "restored", 2)->buffer), Pattern(kMatrixBytes, 1));

  auto mapping = store_.Map("m", "w", desc, 3);
  ASSERT_TRUE(mapping.ok());
  TrainerMapping trainer(mapping->path);
  ASSERT_TRUE(
      store_.Install("m", "w", desc, 3, Pattern(kMatrixBytes, 2).data(), kMatrixBytes).ok());
  EXPECT_EQ(trainer.contents(), Pattern(kMatrixBytes, 2));
  EXPECT_EQ(store_.Map("m", "w", desc, 3)->path, mapping->path);

  const TensorDesc other = Desc(DType::kFloat32, {4, 4}, {"data", "unsharded"});
  Status st = store_.Install("m", "w", other, 3, Pattern(32, 0).data(), 32);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.details()["tensor"], "w");
  EXPECT_NE(st.message().find("[8,4]"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("[4,4]"), std::string::npos) << st.message();
  EXPECT_EQ(st.details()["existing"]["shape"], nlohmann::json({8, 4}));
  EXPECT_EQ(st.details()["requested"]["shape"], nlohmann::json({4, 4}));
  EXPECT_EQ(trainer.contents(), Pattern(kMatrixBytes, 2));
}

TEST_F(TensorStoreTest, ConcurrentPutMapSnapshotList) {
  const TensorDesc desc = Desc(DType::kFloat32, {512, 512}, {"data", "unsharded"});  // 512 KiB
  const size_t bytes = size_t{512} << 10;
  ASSERT_TRUE(store_.Map("m", "mapped", desc, 2).ok());
  std::atomic<bool> failed{false};
  auto check = [&](const Status& st) {
    if (!st.ok()) {
      ADD_FAILURE() << st.ToString();
      failed = true;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      const std::string mine = Pattern(bytes, t);
      for (int i = 0; i < 40 && !failed; ++i) {
        check(store_.Put("m", "heap" + std::to_string(i % 4), desc, 2 + t, mine));
        check(store_.Put("m", "mapped", desc, 2, mine));
        if (i % 8 == 0) check(store_.Map("m", "late" + std::to_string(i), desc, 2 + t).status());
      }
    });
  }
  threads.emplace_back([&] {
    for (int i = 0; i < 20 && !failed; ++i) {
      auto snap = store_.TakeSnapshot("m");
      check(snap.status());
      if (!snap.ok()) continue;
      // Every shard is one writer's whole pattern, never a mix of two.
      for (const auto& tensor : (*snap)->tensors) {
        for (const auto& shard : tensor.shards) {
          const std::string got = Contents(*shard.buffer);
          if (got != Pattern(bytes, 0) && got != Pattern(bytes, 1) &&
              got != std::string(bytes, '\0')) {
            ADD_FAILURE() << "torn shard of " << tensor.name;
            failed = true;
          }
        }
      }
    }
  });
  threads.emplace_back([&] {
    for (int i = 0; i < 200 && !failed; ++i) {
      for (const auto& info : store_.List()) {
        std::string bytes_read;
        (void)store_.Read(info.mesh, info.name, info.devices.front(), &bytes_read);
      }
      if (i % 50 == 0) (void)store_.Delete("m", "heap0");
    }
  });
  for (auto& th : threads) th.join();
  EXPECT_FALSE(failed);
}

TEST(ShmFiles, OrphansOfDeadProcessesAreRemoved) {
  const std::string dir = ::testing::TempDir() + "/shm-sweep-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string dead = dir + "/tessera-999999999-0-d0-w";  // no such pid
  const std::string alive = dir + "/tessera-" + std::to_string(::getpid()) + "-0-d0-w";
  const std::string other = dir + "/someone-else";
  for (const auto& f : {dead, alive, other}) std::ofstream(f) << "x";
  EXPECT_EQ(RemoveOrphanedShmFiles(dir), 1);
  EXPECT_FALSE(std::filesystem::exists(dead));
  EXPECT_TRUE(std::filesystem::exists(alive));
  EXPECT_TRUE(std::filesystem::exists(other));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera::worker
