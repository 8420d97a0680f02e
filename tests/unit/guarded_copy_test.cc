// Copies through a trainer's shared-memory file that the trainer may truncate
// (worker/guarded_copy.h): the copy fails, naming the file, and the worker lives.
#include "worker/guarded_copy.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <xxhash.h>

#include "worker/shard_buffer.h"
#include "worker/tensor_store.h"

namespace tessera::worker {
namespace {

const Mesh kMesh{"m", {{"data", 2}}, 1};

Result<MeshPlacement> Resolve(const std::string& mesh) {
  if (mesh != "m") return NotFound("unknown mesh '" + mesh + "'", {{"mesh", mesh}});
  return MeshPlacement{kMesh, 0, {0}, {}};
}

std::vector<uint8_t> Pattern(size_t n, int seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 131 + seed * 17 + i / 251) & 0xff);
  return v;
}

TEST(GuardedCopy, CopiesAndChecksumsWhatLandsAtAnySize) {
  const std::vector<uint8_t> src = Pattern((size_t{1} << 20) + 77, 3);
  for (size_t n : {size_t{0}, size_t{1}, size_t{4095}, size_t{32} << 10, (size_t{32} << 10) + 1, src.size()}) {
    std::vector<uint8_t> dst(n + 1, 0xee);
    uint64_t sum = 1;
    ASSERT_TRUE(GuardedCopy(dst.data(), src.data(), n, &sum));
    EXPECT_EQ(0, std::memcmp(dst.data(), src.data(), n)) << n;
    EXPECT_EQ(dst[n], 0xee) << "wrote past " << n;
    // The same value as the library's one-shot XXH3 on any CPU.
    EXPECT_EQ(sum, XXH3_64bits(src.data(), n)) << n;
    EXPECT_EQ(sum, Checksum64(src.data(), n)) << n;
    // ... and given in parts.
    Checksum64Stream parts;
    for (size_t at = 0; at < n; at += 1000) parts.Update(src.data() + at, std::min<size_t>(1000, n - at));
    EXPECT_EQ(parts.Digest(), sum) << n;
    bool equal = false;
    ASSERT_TRUE(GuardedEqual(dst.data(), src.data(), n, &equal));
    EXPECT_TRUE(equal) << n;
    if (n > 0) {
      dst[n - 1] ^= 1;
      ASSERT_TRUE(GuardedEqual(dst.data(), src.data(), n, &equal));
      EXPECT_FALSE(equal) << n;
    }
  }
}

TEST(GuardedCopy, AFileTruncatedUnderTheCopyFailsItAndTheProcessLives) {
  const std::string dir = ::testing::TempDir();
  const size_t bytes = size_t{1} << 20;
  auto shm = ShardBuffer::Shm(dir, "tessera-guarded-" + std::to_string(getpid()), bytes);
  ASSERT_TRUE(shm.ok()) << shm.status().ToString();
  const std::vector<uint8_t> pattern = Pattern(bytes, 5);
  ASSERT_TRUE(GuardedCopy((*shm)->data(), pattern.data(), bytes));
  // The trainer shrinks its file: the pages past the new end are gone.
  ASSERT_EQ(truncate((*shm)->path().c_str(), 4096), 0);
  std::vector<uint8_t> out(bytes);
  EXPECT_FALSE(GuardedCopy(out.data(), (*shm)->data(), bytes));
  uint64_t sum = 0;
  EXPECT_FALSE(GuardedCopy((*shm)->data(), pattern.data(), bytes, &sum));
  // The page that is still there copies, again and again.
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(GuardedCopy(out.data(), (*shm)->data(), 4096));
    EXPECT_EQ(0, std::memcmp(out.data(), pattern.data(), 4096));
  }
}

TEST(GuardedCopyDeathTest, ASigbusOutsideAGuardedCopyStillEndsTheProcess) {
  auto unguarded = [] {
    uint8_t a[16] = {};
    const uint8_t b[16] = {};
    if (!GuardedCopy(a, b, sizeof(a))) std::abort();  // the handler is installed now
    auto shm = ShardBuffer::Shm(::testing::TempDir(), "tessera-unguarded-" + std::to_string(getpid()), 8192);
    if (!shm.ok() || truncate((*shm)->path().c_str(), 0) != 0) std::abort();
    unlink((*shm)->path().c_str());  // the process ends before its buffer would
    // A plain read of a vanished page, as a bug outside the guarded copies would make.
    const volatile uint8_t* p = (*shm)->data();
    std::printf("%d\n", p[100]);
  };
  // By SIGBUS, or by the handler that was there before (a sanitizer's report).
  EXPECT_DEATH(unguarded(), "");
}

TEST(GuardedCopy, TheStoreNamesATruncatedMappingAndKeepsServing) {
  TensorStoreOptions o;
  o.shm_prefix = "tessera-guarded-store-" + std::to_string(getpid());
  TensorStore store(Resolve, o);
  const TensorDesc desc{DType::kUInt8, {2, int64_t{1} << 20}, Layout{{"data", "unsharded"}}};
  auto mapping = store.Map("m", "w", desc, 0);
  ASSERT_TRUE(mapping.ok()) << mapping.status().ToString();
  ASSERT_EQ(truncate(mapping->path.c_str(), 0), 0);
  auto snap = store.TakeSnapshot("m", std::nullopt);
  ASSERT_FALSE(snap.ok());
  EXPECT_EQ(snap.status().code(), Code::kConflict) << snap.status().ToString();
  EXPECT_EQ(snap.status().details().value("file", ""), mapping->path) << snap.status().ToString();
  const std::vector<uint8_t> bytes = Pattern(mapping->bytes, 1);
  uint64_t sum = 0;
  Status st = store.Install("m", "w", desc, 0, bytes.data(), bytes.size(), &sum);
  EXPECT_EQ(st.code(), Code::kConflict) << st.ToString();
  EXPECT_NE(st.message().find(mapping->path), std::string::npos) << st.ToString();
  // Another tensor of the same store is untouched by it.
  ASSERT_TRUE(store.Put("m", "other", desc, 0, std::string(mapping->bytes, 'x')).ok());
  auto other = store.TakeSnapshot("m", std::vector<std::string>{"other"});
  EXPECT_TRUE(other.ok()) << other.status().ToString();
}

}  // namespace
}  // namespace tessera::worker
