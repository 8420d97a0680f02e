// Tests of the Env seam: one behaviour suite run on POSIX and MemEnv, MemEnv's crash model,
// and FaultEnv's failure injection.
#include "storage/env.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "api/status.h"
#include "storage/testing/fault_env.h"
#include "storage/testing/mem_env.h"

namespace tessera::storage {
namespace {

#define ASSERT_OK(expr)                                       \
  do {                                                        \
    const ::tessera::Status _st = (expr);                     \
    ASSERT_TRUE(_st.ok()) << #expr << ": " << _st.ToString(); \
  } while (0)

#define EXPECT_OK(expr)                                       \
  do {                                                        \
    const ::tessera::Status _st = (expr);                     \
    EXPECT_TRUE(_st.ok()) << #expr << ": " << _st.ToString(); \
  } while (0)

// Creates `path` holding `data`, synced unless `sync` is false; the directory is not synced.
Status WriteFile(Env* env, const std::string& path, std::string_view data, bool sync = true) {
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env->NewWritableFile(path));
  RETURN_IF_ERROR(file->Append(data.data(), data.size()));
  if (sync) RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

// The file's contents, or "<error: ...>" so mismatches show why.
std::string Contents(Env* env, const std::string& path) {
  Result<std::string> data = ReadWholeFile(env, path);
  if (!data.ok()) return "<error: " + data.status().ToString() + ">";
  return *data;
}

std::string Pattern(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1103515245u + 12345u;
    s[i] = static_cast<char>(x >> 24);
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Behaviour shared by every Env.

enum class EnvKind { kPosix, kMem };

class EnvTest : public ::testing::TestWithParam<EnvKind> {
 protected:
  void SetUp() override {
    if (GetParam() == EnvKind::kPosix) {
      env_ = NewPosixEnv();
      char tmpl[] = "/tmp/tessera_env_test.XXXXXX";
      ASSERT_NE(::mkdtemp(tmpl), nullptr) << std::strerror(errno);
      root_ = tmpl;
    } else {
      env_ = std::make_unique<MemEnv>();
      root_ = "/scratch";
      ASSERT_OK(env_->CreateDirs(root_));
    }
  }

  void TearDown() override {
    if (GetParam() == EnvKind::kPosix && !root_.empty()) {
      EXPECT_OK(env_->DeleteTree(root_));
      EXPECT_FALSE(env_->Exists(root_));
    }
  }

  std::string Path(std::string_view name) const { return JoinPath(root_, name); }

  std::unique_ptr<Env> env_;
  std::string root_;
};

TEST_P(EnvTest, WriteReadAndSize) {
  const std::string path = Path("f");
  ASSERT_OK(WriteFile(env_.get(), path, "hello world"));
  EXPECT_TRUE(env_->Exists(path));
  EXPECT_FALSE(env_->IsDirectory(path));
  Result<uint64_t> size = env_->FileSize(path);
  ASSERT_TRUE(size.ok()) << size.status().ToString();
  EXPECT_EQ(*size, 11u);
  EXPECT_EQ(Contents(env_.get(), path), "hello world");

  Result<std::unique_ptr<RandomAccessFile>> file = env_->NewRandomAccessFile(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->Size(), 11u);
  char buf[5];
  ASSERT_OK((*file)->Read(6, 5, buf));
  EXPECT_EQ(std::string_view(buf, 5), "world");
  ASSERT_OK((*file)->Read(11, 0, buf));  // an empty read at the end is fine
}

TEST_P(EnvTest, WritableFileSizeCloseAndAppendAfterClose) {
  Result<std::unique_ptr<WritableFile>> file = env_->NewWritableFile(Path("f"));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->Size(), 0u);
  ASSERT_OK((*file)->Append("abc", 3));
  ASSERT_OK((*file)->Append("", 0));
  ASSERT_OK((*file)->Append("de", 2));
  EXPECT_EQ((*file)->Size(), 5u);
  ASSERT_OK((*file)->Sync());
  ASSERT_OK((*file)->Close());
  ASSERT_OK((*file)->Close());  // idempotent
  EXPECT_FALSE((*file)->Append("x", 1).ok());
  EXPECT_EQ(Contents(env_.get(), Path("f")), "abcde");
}

TEST_P(EnvTest, MixedSmallAndLargeAppendsKeepOrder) {
  // Crosses the POSIX write buffer in every way: tiny, just-below, exactly and far above it.
  const std::vector<size_t> sizes = {1, 7, 4096, (1u << 20) - 3, 1u << 20, 5, 3u << 20, 100, 0, 1};
  std::string expected;
  Result<std::unique_ptr<WritableFile>> file = env_->NewWritableFile(Path("big"));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::string piece = Pattern(sizes[i], static_cast<uint32_t>(i));
    ASSERT_OK((*file)->Append(piece.data(), piece.size()));
    expected += piece;
  }
  EXPECT_EQ((*file)->Size(), expected.size());
  ASSERT_OK((*file)->Sync());
  ASSERT_OK((*file)->Close());
  EXPECT_TRUE(Contents(env_.get(), Path("big")) == expected);
}

TEST_P(EnvTest, NewWritableFileTruncates) {
  ASSERT_OK(WriteFile(env_.get(), Path("f"), "a long first version"));
  ASSERT_OK(WriteFile(env_.get(), Path("f"), "short"));
  EXPECT_EQ(Contents(env_.get(), Path("f")), "short");
}

TEST_P(EnvTest, ListDirIsSortedNames) {
  ASSERT_OK(WriteFile(env_.get(), Path("b"), "1"));
  ASSERT_OK(WriteFile(env_.get(), Path("a"), "2"));
  ASSERT_OK(WriteFile(env_.get(), Path("c.tmp"), "3"));
  ASSERT_OK(env_->CreateDirs(Path("B")));
  Result<std::vector<std::string>> names = env_->ListDir(root_);
  ASSERT_TRUE(names.ok()) << names.status().ToString();
  EXPECT_EQ(*names, (std::vector<std::string>{"B", "a", "b", "c.tmp"}));

  ASSERT_OK(env_->CreateDirs(Path("empty")));
  names = env_->ListDir(Path("empty"));
  ASSERT_TRUE(names.ok());
  EXPECT_TRUE(names->empty());

  EXPECT_EQ(env_->ListDir(Path("missing")).status().code(), Code::kNotFound);
}

TEST_P(EnvTest, CreateDirsNested) {
  ASSERT_OK(env_->CreateDirs(Path("x/y/z")));
  EXPECT_TRUE(env_->IsDirectory(Path("x")));
  EXPECT_TRUE(env_->IsDirectory(Path("x/y")));
  EXPECT_TRUE(env_->IsDirectory(Path("x/y/z")));
  ASSERT_OK(env_->CreateDirs(Path("x/y/z")));   // ok if it exists
  ASSERT_OK(env_->CreateDirs(Path("x/y/z/")));  // trailing slash
  ASSERT_OK(WriteFile(env_.get(), Path("x/y/z/f"), "data"));
  EXPECT_EQ(Contents(env_.get(), Path("x/y/z/f")), "data");

  ASSERT_OK(WriteFile(env_.get(), Path("file"), "data"));
  EXPECT_EQ(env_->CreateDirs(Path("file")).code(), Code::kConflict);
  EXPECT_FALSE(env_->CreateDirs(Path("file/sub")).ok());
}

TEST_P(EnvTest, RenameFile) {
  ASSERT_OK(WriteFile(env_.get(), Path("a"), "payload"));
  ASSERT_OK(env_->Rename(Path("a"), Path("b")));
  EXPECT_FALSE(env_->Exists(Path("a")));
  EXPECT_EQ(Contents(env_.get(), Path("b")), "payload");

  ASSERT_OK(env_->CreateDirs(Path("sub")));
  ASSERT_OK(env_->Rename(Path("b"), Path("sub/c")));
  EXPECT_EQ(Contents(env_.get(), Path("sub/c")), "payload");
}

TEST_P(EnvTest, RenameDirectoryCarriesContents) {
  ASSERT_OK(env_->CreateDirs(Path("stage/inner")));
  ASSERT_OK(WriteFile(env_.get(), Path("stage/f"), "one"));
  ASSERT_OK(WriteFile(env_.get(), Path("stage/inner/g"), "two"));
  ASSERT_OK(env_->Rename(Path("stage"), Path("final")));
  EXPECT_FALSE(env_->Exists(Path("stage")));
  EXPECT_TRUE(env_->IsDirectory(Path("final")));
  EXPECT_EQ(Contents(env_.get(), Path("final/f")), "one");
  EXPECT_EQ(Contents(env_.get(), Path("final/inner/g")), "two");
}

TEST_P(EnvTest, RenameOntoExistingIsConflict) {
  ASSERT_OK(WriteFile(env_.get(), Path("a"), "A"));
  ASSERT_OK(WriteFile(env_.get(), Path("b"), "B"));
  Status s = env_->Rename(Path("a"), Path("b"));
  EXPECT_EQ(s.code(), Code::kConflict) << s.ToString();
  EXPECT_EQ(Contents(env_.get(), Path("a")), "A");
  EXPECT_EQ(Contents(env_.get(), Path("b")), "B");

  // rename(2) would silently replace an empty directory; Env must not.
  ASSERT_OK(env_->CreateDirs(Path("d1")));
  ASSERT_OK(env_->CreateDirs(Path("d2")));
  s = env_->Rename(Path("d1"), Path("d2"));
  EXPECT_EQ(s.code(), Code::kConflict) << s.ToString();
  EXPECT_TRUE(env_->IsDirectory(Path("d1")));

  s = env_->Rename(Path("a"), Path("d2"));
  EXPECT_EQ(s.code(), Code::kConflict) << s.ToString();
  EXPECT_EQ(Contents(env_.get(), Path("a")), "A");
}

TEST_P(EnvTest, RenameMissingSourceIsNotFound) {
  EXPECT_EQ(env_->Rename(Path("nope"), Path("other")).code(), Code::kNotFound);
}

TEST_P(EnvTest, RenameDirectoryIntoItselfFails) {
  ASSERT_OK(env_->CreateDirs(Path("d")));
  EXPECT_FALSE(env_->Rename(Path("d"), Path("d/sub")).ok());
  EXPECT_TRUE(env_->IsDirectory(Path("d")));
}

TEST_P(EnvTest, DeleteFile) {
  ASSERT_OK(WriteFile(env_.get(), Path("f"), "x"));
  ASSERT_OK(env_->DeleteFile(Path("f")));
  EXPECT_FALSE(env_->Exists(Path("f")));
  EXPECT_EQ(env_->DeleteFile(Path("f")).code(), Code::kNotFound);
}

TEST_P(EnvTest, DeleteTreeRemovesEverythingAndToleratesMissing) {
  ASSERT_OK(env_->CreateDirs(Path("t/a/b")));
  ASSERT_OK(env_->CreateDirs(Path("t/empty")));
  ASSERT_OK(WriteFile(env_.get(), Path("t/f"), "1"));
  ASSERT_OK(WriteFile(env_.get(), Path("t/a/b/g"), "2"));
  ASSERT_OK(WriteFile(env_.get(), Path("keep"), "3"));
  ASSERT_OK(env_->DeleteTree(Path("t")));
  EXPECT_FALSE(env_->Exists(Path("t")));
  EXPECT_FALSE(env_->Exists(Path("t/a/b/g")));
  EXPECT_EQ(Contents(env_.get(), Path("keep")), "3");
  ASSERT_OK(env_->DeleteTree(Path("t")));
  ASSERT_OK(env_->DeleteTree(Path("never/existed")));
}

TEST_P(EnvTest, ShortReadIsDataLossNamingFile) {
  const std::string path = Path("short");
  ASSERT_OK(WriteFile(env_.get(), path, "0123456789"));
  Result<std::unique_ptr<RandomAccessFile>> file = env_->NewRandomAccessFile(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  char buf[16];
  Status s = (*file)->Read(5, 10, buf);
  EXPECT_EQ(s.code(), Code::kDataLoss);
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("offset 5"), std::string::npos) << s.message();
  EXPECT_EQ(s.details()["file"], path);
  EXPECT_EQ(s.details()["offset"], 5);

  s = (*file)->Read(100, 1, buf);
  EXPECT_EQ(s.code(), Code::kDataLoss);
  EXPECT_EQ(s.details()["offset"], 100);
}

TEST_P(EnvTest, MissingPathsAreNotFound) {
  EXPECT_EQ(env_->NewRandomAccessFile(Path("missing")).status().code(), Code::kNotFound);
  EXPECT_EQ(env_->FileSize(Path("missing")).status().code(), Code::kNotFound);
  EXPECT_EQ(env_->NewWritableFile(Path("no/such/dir/f")).status().code(), Code::kNotFound);
  EXPECT_EQ(env_->SyncDir(Path("missing")).code(), Code::kNotFound);
  EXPECT_FALSE(env_->Exists(Path("missing")));
  EXPECT_FALSE(env_->IsDirectory(Path("missing")));
  Status s = env_->FileSize(Path("missing")).status();
  EXPECT_EQ(s.details()["file"], Path("missing"));
}

TEST_P(EnvTest, DirectoriesAreNotFiles) {
  ASSERT_OK(env_->CreateDirs(Path("d")));
  EXPECT_FALSE(env_->NewWritableFile(Path("d")).ok());
  EXPECT_FALSE(env_->NewRandomAccessFile(Path("d")).ok());
  EXPECT_FALSE(env_->FileSize(Path("d")).ok());
  EXPECT_FALSE(env_->DeleteFile(Path("d")).ok());
  EXPECT_TRUE(env_->IsDirectory(Path("d")));
  ASSERT_OK(env_->SyncDir(Path("d")));
  ASSERT_OK(env_->SyncDir(root_));
}

TEST_P(EnvTest, WriteFileDurablyCreatesAndReplaces) {
  const std::string path = Path("meta.json");
  ASSERT_OK(WriteFileDurably(env_.get(), path, "{\"v\":1}"));
  EXPECT_EQ(Contents(env_.get(), path), "{\"v\":1}");
  ASSERT_OK(WriteFileDurably(env_.get(), path, "{\"v\":2}"));
  EXPECT_EQ(Contents(env_.get(), path), "{\"v\":2}");
  ASSERT_OK(WriteFileDurably(env_.get(), Path("empty"), ""));
  EXPECT_EQ(Contents(env_.get(), Path("empty")), "");
  Result<std::vector<std::string>> names = env_->ListDir(root_);
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, (std::vector<std::string>{"empty", "meta.json"}));  // no .tmp left behind
}

INSTANTIATE_TEST_SUITE_P(AllEnvs, EnvTest, ::testing::Values(EnvKind::kPosix, EnvKind::kMem),
                         [](const ::testing::TestParamInfo<EnvKind>& info) {
                           return info.param == EnvKind::kPosix ? "Posix" : "Mem";
                         });

// ---------------------------------------------------------------------------------------------
// POSIX only.

TEST(PosixEnvTest, DefaultEnvIsOneWorkingInstance) {
  Env* env = DefaultEnv();
  ASSERT_NE(env, nullptr);
  EXPECT_EQ(env, DefaultEnv());
  EXPECT_TRUE(env->IsDirectory("/tmp"));
}

TEST(PosixEnvTest, LargeFileRoundTrip) {
  std::unique_ptr<Env> env = NewPosixEnv();
  char tmpl[] = "/tmp/tessera_env_test.XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string path = JoinPath(dir, "large");
  const std::string chunk = Pattern(8u << 20, 7);
  {
    Result<std::unique_ptr<WritableFile>> file = env->NewWritableFile(path);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    for (int i = 0; i < 4; ++i) ASSERT_OK((*file)->Append(chunk.data(), chunk.size()));
    ASSERT_OK((*file)->Sync());
    ASSERT_OK((*file)->Close());
  }
  Result<uint64_t> size = env->FileSize(path);
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, 4 * chunk.size());
  Result<std::unique_ptr<RandomAccessFile>> file = env->NewRandomAccessFile(path);
  ASSERT_TRUE(file.ok());
  std::string back(chunk.size(), '\0');
  ASSERT_OK((*file)->Read(3 * chunk.size(), back.size(), back.data()));
  EXPECT_TRUE(back == chunk);
  ASSERT_OK(env->DeleteTree(dir));
  EXPECT_FALSE(env->Exists(dir));
}

// ---------------------------------------------------------------------------------------------
// MemEnv's crash model.

class MemEnvCrashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The database directory itself is durable: created, then its parent synced.
    ASSERT_OK(env_.CreateDirs("/db"));
    ASSERT_OK(env_.SyncDir("/"));
  }

  MemEnv env_;
};

TEST_F(MemEnvCrashTest, UnsyncedFileDataIsLost) {
  Result<std::unique_ptr<WritableFile>> file = env_.NewWritableFile("/db/log");
  ASSERT_TRUE(file.ok());
  ASSERT_OK((*file)->Append("durable|", 8));
  ASSERT_OK((*file)->Sync());
  ASSERT_OK(env_.SyncDir("/db"));
  ASSERT_OK((*file)->Append("volatile", 8));
  EXPECT_EQ(Contents(&env_, "/db/log"), "durable|volatile");
  env_.SimulateCrash();
  EXPECT_EQ(Contents(&env_, "/db/log"), "durable|");
}

TEST_F(MemEnvCrashTest, NeverSyncedFileIsEmptyAfterCrash) {
  ASSERT_OK(WriteFile(&env_, "/db/f", "never synced", /*sync=*/false));
  ASSERT_OK(env_.SyncDir("/db"));
  env_.SimulateCrash();
  EXPECT_TRUE(env_.Exists("/db/f"));
  EXPECT_EQ(Contents(&env_, "/db/f"), "");
}

TEST_F(MemEnvCrashTest, SyncedDataAndEntriesAreKept) {
  ASSERT_OK(WriteFile(&env_, "/db/a", "alpha"));
  ASSERT_OK(env_.CreateDirs("/db/sub"));
  ASSERT_OK(WriteFile(&env_, "/db/sub/b", "beta"));
  ASSERT_OK(env_.SyncDir("/db/sub"));
  ASSERT_OK(env_.SyncDir("/db"));
  env_.SimulateCrash();
  EXPECT_EQ(Contents(&env_, "/db/a"), "alpha");
  EXPECT_EQ(Contents(&env_, "/db/sub/b"), "beta");
  // A second crash with nothing new changes nothing.
  env_.SimulateCrash();
  EXPECT_EQ(Contents(&env_, "/db/sub/b"), "beta");
}

TEST_F(MemEnvCrashTest, FileInUnsyncedDirectoryIsGone) {
  ASSERT_OK(WriteFile(&env_, "/db/orphan", "synced data"));  // file synced, /db never synced
  env_.SimulateCrash();
  EXPECT_FALSE(env_.Exists("/db/orphan"));
  EXPECT_TRUE(env_.IsDirectory("/db"));
}

TEST_F(MemEnvCrashTest, DirectoryCreationNeedsParentSync) {
  ASSERT_OK(env_.CreateDirs("/db/new/deep"));
  ASSERT_OK(env_.SyncDir("/db/new"));  // syncs the child's entries, not its own creation
  env_.SimulateCrash();
  EXPECT_FALSE(env_.Exists("/db/new"));
}

TEST_F(MemEnvCrashTest, RenamedDirectoryWithSyncedParentSurvives) {
  ASSERT_OK(env_.CreateDirs("/db/stage"));
  ASSERT_OK(WriteFile(&env_, "/db/stage/shard", "tensor bytes"));
  ASSERT_OK(env_.SyncDir("/db/stage"));
  ASSERT_OK(env_.Rename("/db/stage", "/db/final"));
  ASSERT_OK(env_.SyncDir("/db"));
  env_.SimulateCrash();
  EXPECT_FALSE(env_.Exists("/db/stage"));
  EXPECT_EQ(Contents(&env_, "/db/final/shard"), "tensor bytes");
}

TEST_F(MemEnvCrashTest, RenameWithoutSyncDirReverts) {
  ASSERT_OK(WriteFile(&env_, "/db/a", "content"));
  ASSERT_OK(env_.SyncDir("/db"));
  ASSERT_OK(env_.Rename("/db/a", "/db/b"));
  env_.SimulateCrash();
  EXPECT_EQ(Contents(&env_, "/db/a"), "content");
  EXPECT_FALSE(env_.Exists("/db/b"));
}

TEST_F(MemEnvCrashTest, DeleteWithoutSyncDirReverts) {
  ASSERT_OK(WriteFile(&env_, "/db/a", "content"));
  ASSERT_OK(env_.SyncDir("/db"));
  ASSERT_OK(env_.DeleteFile("/db/a"));
  ASSERT_OK(env_.CreateDirs("/db/t/u"));
  ASSERT_OK(env_.SyncDir("/db"));
  ASSERT_OK(env_.DeleteTree("/db/t"));
  env_.SimulateCrash();
  EXPECT_FALSE(env_.Exists("/db/a"));  // deletion was made durable by the second SyncDir
  EXPECT_TRUE(env_.IsDirectory("/db/t"));
  EXPECT_FALSE(env_.Exists("/db/t/u"));  // t's own entries were never synced
}

TEST_F(MemEnvCrashTest, TruncationIsUndoneUntilSync) {
  ASSERT_OK(WriteFile(&env_, "/db/f", "old contents"));
  ASSERT_OK(env_.SyncDir("/db"));
  ASSERT_OK(WriteFile(&env_, "/db/f", "new", /*sync=*/false));
  env_.SimulateCrash();
  EXPECT_EQ(Contents(&env_, "/db/f"), "old contents");
  ASSERT_OK(WriteFile(&env_, "/db/f", "new"));
  env_.SimulateCrash();
  EXPECT_EQ(Contents(&env_, "/db/f"), "new");
}

TEST_F(MemEnvCrashTest, WriteFileDurablySurvivesCrash) {
  ASSERT_OK(WriteFileDurably(&env_, "/db/CURRENT", "v1"));
  env_.SimulateCrash();
  EXPECT_EQ(Contents(&env_, "/db/CURRENT"), "v1");
  ASSERT_OK(WriteFileDurably(&env_, "/db/CURRENT", "v2"));
  env_.SimulateCrash();
  EXPECT_EQ(Contents(&env_, "/db/CURRENT"), "v2");
  EXPECT_FALSE(env_.Exists("/db/CURRENT.tmp"));
}

TEST_F(MemEnvCrashTest, StaleHandlesWriteNowhere) {
  Result<std::unique_ptr<WritableFile>> file = env_.NewWritableFile("/db/f");
  ASSERT_TRUE(file.ok());
  ASSERT_OK((*file)->Append("kept", 4));
  ASSERT_OK((*file)->Sync());
  ASSERT_OK(env_.SyncDir("/db"));
  env_.SimulateCrash();
  ASSERT_OK((*file)->Append("+stale", 6));
  ASSERT_OK((*file)->Sync());
  EXPECT_EQ(Contents(&env_, "/db/f"), "kept");
  env_.SimulateCrash();
  EXPECT_EQ(Contents(&env_, "/db/f"), "kept");
}

TEST_F(MemEnvCrashTest, RootEntriesNeedRootSync) {
  ASSERT_OK(env_.CreateDirs("/other"));
  env_.SimulateCrash();
  EXPECT_FALSE(env_.Exists("/other"));
  EXPECT_TRUE(env_.IsDirectory("/"));
  EXPECT_TRUE(env_.IsDirectory("/db"));
}

TEST(MemEnvTest, AbsoluteAndRelativePathsNameTheSameEntries) {
  MemEnv env;
  ASSERT_OK(env.CreateDirs("a/b"));
  ASSERT_OK(WriteFile(&env, "/a/b/f", "x"));
  EXPECT_EQ(Contents(&env, "a/b/f"), "x");
  EXPECT_EQ(Contents(&env, "./a//b/./f"), "x");
  EXPECT_TRUE(env.IsDirectory("/a/b/"));
  EXPECT_TRUE(env.IsDirectory("/"));
  EXPECT_TRUE(env.IsDirectory("."));
  Result<std::vector<std::string>> names = env.ListDir("/");
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, std::vector<std::string>{"a"});
}

TEST(MemEnvTest, ConcurrentWritersInOneDirectory) {
  MemEnv env;
  ASSERT_OK(env.CreateDirs("/d"));
  constexpr int kThreads = 8;
  constexpr int kFiles = 50;
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&env, &failures, t] {
      for (int i = 0; i < kFiles; ++i) {
        const std::string name = "/d/f" + std::to_string(t) + "_" + std::to_string(i);
        if (!WriteFile(&env, name, name).ok()) ++failures[t];
        if (!env.SyncDir("/d").ok()) ++failures[t];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0);
  Result<std::vector<std::string>> names = env.ListDir("/d");
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(names->size(), static_cast<size_t>(kThreads * kFiles));
  EXPECT_EQ(Contents(&env, "/d/f3_7"), "/d/f3_7");
}

// ---------------------------------------------------------------------------------------------
// FaultEnv.

// Eight mutating operations, with non-mutating ones between them that must not be counted.
// Returns the 1-based step that failed (0 if none) and its status.
std::pair<int, Status> RunScript(Env* env) {
  std::unique_ptr<WritableFile> file;
  const std::vector<std::function<Status()>> steps = {
      [&] { return env->CreateDirs("/d"); },
      [&]() -> Status {
        ASSIGN_OR_RETURN(file, env->NewWritableFile("/d/f"));
        return Status::Ok();
      },
      [&] { return file->Append("0123", 4); },
      [&] { return file->Append("4567", 4); },
      [&] { return file->Sync(); },
      [&]() -> Status {
        RETURN_IF_ERROR(file->Close());
        return env->Rename("/d/f", "/d/g");
      },
      [&] { return env->SyncDir("/d"); },
      [&] { return env->DeleteFile("/d/g"); },
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    Status s = steps[i]();
    if (!s.ok()) return {static_cast<int>(i + 1), s};
    // Reads and queries are never counted.
    (void)env->Exists("/d/f");
    (void)env->IsDirectory("/d");
    (void)env->ListDir("/d");
    (void)env->FileSize("/d/f");
  }
  return {0, Status::Ok()};
}

TEST(FaultEnvTest, CountsOnlyMutatingOperations) {
  MemEnv mem;
  FaultEnv env(&mem);
  EXPECT_EQ(env.ops(), 0u);
  auto [failed, status] = RunScript(&env);
  EXPECT_EQ(failed, 0) << status.ToString();
  EXPECT_EQ(env.ops(), 8u);
  EXPECT_FALSE(env.fired());

  ASSERT_OK(WriteFile(&mem, "/r", "read me"));
  Result<std::unique_ptr<RandomAccessFile>> file = env.NewRandomAccessFile("/r");
  ASSERT_TRUE(file.ok());
  char buf[4];
  ASSERT_OK((*file)->Read(0, 4, buf));
  EXPECT_EQ(Contents(&env, "/r"), "read me");
  EXPECT_EQ(env.ops(), 8u);

  ASSERT_OK(env.DeleteTree("/d"));
  EXPECT_EQ(env.ops(), 9u);
  env.Reset();
  EXPECT_EQ(env.ops(), 0u);
}

TEST(FaultEnvTest, FailAtFailsExactlyTheNthOperation) {
  for (int n = 1; n <= 9; ++n) {
    SCOPED_TRACE("n=" + std::to_string(n));
    MemEnv mem;
    FaultEnv env(&mem);
    env.FailAt(n);
    auto [failed, status] = RunScript(&env);
    if (n == 9) {
      EXPECT_EQ(failed, 0) << status.ToString();
      EXPECT_FALSE(env.fired());
      continue;
    }
    EXPECT_EQ(failed, n);
    EXPECT_EQ(status.code(), Code::kInternal) << status.ToString();
    EXPECT_EQ(status.details()["injected"], true);
    EXPECT_TRUE(env.fired());
    EXPECT_EQ(env.ops(), static_cast<uint64_t>(n));
    // Not sticky: the next operation goes through.
    EXPECT_OK(env.CreateDirs("/after"));
    EXPECT_TRUE(mem.IsDirectory("/after"));
  }
}

TEST(FaultEnvTest, InjectedFailuresDoNotReachTheBase) {
  MemEnv mem;
  FaultEnv env(&mem);
  env.FailAt(1);
  EXPECT_FALSE(env.CreateDirs("/d").ok());
  EXPECT_FALSE(mem.Exists("/d"));
  ASSERT_OK(env.CreateDirs("/d"));
  ASSERT_OK(WriteFile(&env, "/d/f", "x"));
  env.FailAt(1);
  EXPECT_FALSE(env.Rename("/d/f", "/d/g").ok());
  EXPECT_TRUE(mem.Exists("/d/f"));
  EXPECT_FALSE(mem.Exists("/d/g"));
}

TEST(FaultEnvTest, NoSpaceKindIsResourceExhausted) {
  MemEnv mem;
  FaultEnv env(&mem);
  env.FailAt(3, FaultEnv::Kind::kNoSpace);
  auto [failed, status] = RunScript(&env);
  EXPECT_EQ(failed, 3);
  EXPECT_EQ(status.code(), Code::kResourceExhausted) << status.ToString();
  EXPECT_EQ(status.details()["file"], "/d/f");
  EXPECT_EQ(status.details()["errno"], ENOSPC);
}

TEST(FaultEnvTest, FailAtCountsFromNow) {
  MemEnv mem;
  FaultEnv env(&mem);
  ASSERT_OK(env.CreateDirs("/a"));
  ASSERT_OK(env.CreateDirs("/b"));
  env.FailAt(2);
  ASSERT_OK(env.CreateDirs("/c"));
  EXPECT_EQ(env.CreateDirs("/d").code(), Code::kInternal);
  EXPECT_EQ(env.ops(), 4u);
  env.FailAt(0);  // disabled
  ASSERT_OK(env.CreateDirs("/e"));
}

TEST(FaultEnvTest, StickyFailsEveryLaterOperation) {
  MemEnv mem;
  FaultEnv env(&mem);
  env.FailAt(3, FaultEnv::Kind::kIoError, /*sticky=*/true);
  ASSERT_OK(env.CreateDirs("/a"));
  ASSERT_OK(env.CreateDirs("/b"));
  for (int i = 0; i < 5; ++i) EXPECT_EQ(env.SyncDir("/a").code(), Code::kInternal);
  EXPECT_FALSE(env.NewWritableFile("/a/f").ok());
  EXPECT_FALSE(mem.Exists("/a/f"));
  env.Reset();
  ASSERT_OK(env.SyncDir("/a"));
  EXPECT_FALSE(env.fired());
}

TEST(FaultEnvTest, FailAfterBytesIsResourceExhausted) {
  MemEnv mem;
  FaultEnv env(&mem);
  env.FailAfterBytes(10);
  Result<std::unique_ptr<WritableFile>> file = env.NewWritableFile("/f");
  ASSERT_TRUE(file.ok());
  ASSERT_OK((*file)->Append("012345", 6));
  ASSERT_OK((*file)->Append("6789", 4));
  EXPECT_FALSE(env.fired());
  Status s = (*file)->Append("X", 1);
  EXPECT_EQ(s.code(), Code::kResourceExhausted) << s.ToString();
  EXPECT_TRUE(env.fired());
  EXPECT_EQ((*file)->Append("Y", 1).code(), Code::kResourceExhausted);
  ASSERT_OK((*file)->Sync());  // only appends run out of space
  ASSERT_OK((*file)->Close());
  EXPECT_EQ(Contents(&mem, "/f"), "0123456789");
  env.Reset();
  ASSERT_OK(WriteFile(&env, "/g", "no limit after Reset"));
}

// The SQLite-style loop FaultEnv exists for: fail each step of WriteFileDurably in turn, crash,
// and require the old or the new contents, never anything else.
TEST(FaultEnvTest, WriteFileDurablyIsAtomicUnderEveryFault) {
  for (uint64_t n = 1;; ++n) {
    SCOPED_TRACE("n=" + std::to_string(n));
    MemEnv mem;
    ASSERT_OK(mem.CreateDirs("/db"));
    ASSERT_OK(mem.SyncDir("/"));
    ASSERT_OK(WriteFileDurably(&mem, "/db/MANIFEST", "old"));
    FaultEnv env(&mem);
    env.FailAt(n);
    Status s = WriteFileDurably(&env, "/db/MANIFEST", "new");
    EXPECT_EQ(s.ok(), !env.fired()) << s.ToString();
    mem.SimulateCrash();
    const std::string after = Contents(&mem, "/db/MANIFEST");
    EXPECT_TRUE(after == "old" || after == "new") << after;
    if (!env.fired()) {
      EXPECT_EQ(after, "new");
      EXPECT_GT(n, 5u);  // create, append, sync, delete, rename, syncdir
      break;
    }
    ASSERT_LT(n, 100u);
  }
}

// ---------------------------------------------------------------------------------------------
// Path helpers.

TEST(PathTest, JoinPath) {
  EXPECT_EQ(JoinPath("a/b", "c"), "a/b/c");
  EXPECT_EQ(JoinPath("a/b/", "c"), "a/b/c");
  EXPECT_EQ(JoinPath("/", "c"), "/c");
  EXPECT_EQ(JoinPath("", "c"), "c");
  EXPECT_EQ(JoinPath("a", ""), "a");
  EXPECT_EQ(JoinPath("a", "/c"), "a/c");
}

TEST(PathTest, ParentDir) {
  EXPECT_EQ(ParentDir("a/b/c"), "a/b");
  EXPECT_EQ(ParentDir("a/b/c/"), "a/b");
  EXPECT_EQ(ParentDir("/a"), "/");
  EXPECT_EQ(ParentDir("/"), "/");
  EXPECT_EQ(ParentDir("a"), ".");
  EXPECT_EQ(ParentDir(""), ".");
  EXPECT_EQ(ParentDir("a//b"), "a");
}

}  // namespace
}  // namespace tessera::storage
