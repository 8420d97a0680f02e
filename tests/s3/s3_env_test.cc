// The S3 object store behind the Env seam, against a real Ceph RGW: files as
// streamed multipart uploads, directories as prefixes, and whole checkpoints
// saved, read, committed once, deleted and garbage collected, with faults
// injected into parts, the commit and the writer's process.
#include "storage/s3/s3_env.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "storage/checkpoint_dir.h"
#include "storage/shared_chunks.h"
#include "storage/local_checkpoint.h"
#include "storage/s3/client.h"
#include "storage/testing/fault_transport.h"
#include "storage/verify.h"
#include "tests/s3/rgw_fixture.h"
#include "tests/unit/checkpoint_fixture.h"

namespace tessera::storage {
namespace {

using s3::Rgw;

constexpr size_t kPart = 5 << 20;

std::string Pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 131 + i / 4099 + seed);
  return s;
}

class S3EnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Rgw::error().empty()) GTEST_FAIL() << Rgw::error();
    Rgw::Export();
    ASSERT_TRUE(client_.CreateBucket().ok());
    // Each test its own prefix, so tests never see each other's objects.
    root_ = "s3://tessera-env-test/" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name());
    env_ = NewEnv();
    ASSERT_TRUE(env_->DeleteTree(root_).ok());
  }
  // fail_matching: the requests whose "METHOD URL" holds it get 503 SlowDown, unsent.
  static std::unique_ptr<Env> NewEnv(int64_t retry_budget_ms = 2000,
                                     const std::string& fail_matching = "") {
    S3EnvOptions o;
    if (!fail_matching.empty()) {
      o.transport = std::make_shared<FaultTransport>(s3::NewCurlTransport(), fail_matching);
    }
    o.part_bytes = kPart;
    o.parts_in_flight = 2;
    o.upload_threads = 3;
    o.retry_budget_ms = retry_budget_ms;
    return NewS3Env(o);
  }
  std::string Key(const std::string& rel) { return root_.substr(strlen("s3://tessera-env-test/")) + "/" + rel; }
  size_t Uploads() { return client_.ListUploads(Key(""))->size(); }

  s3::Client client_{Rgw::ConfigFor("tessera-env-test")};
  std::string root_;
  std::unique_ptr<Env> env_;
};

Status WriteFile(Env* env, const std::string& path, const std::string& data, size_t piece) {
  ASSIGN_OR_RETURN(auto f, env->NewWritableFile(path));
  for (size_t off = 0; off < data.size(); off += piece) {
    RETURN_IF_ERROR(f->Append(data.data() + off, std::min(piece, data.size() - off)));
  }
  RETURN_IF_ERROR(f->Sync());
  return f->Close();
}

TEST_F(S3EnvTest, FilesStreamAsPartsAndReadBackInRanges) {
  // 3 full parts and a tail, appended in odd pieces; and a file smaller than a part.
  const std::string big = Pattern(3 * kPart + 12345, 1), small = Pattern(1000, 2);
  ASSERT_TRUE(WriteFile(env_.get(), root_ + "/d/big", big, 777777).ok());
  ASSERT_TRUE(WriteFile(env_.get(), root_ + "/d/small", small, 100).ok());
  EXPECT_EQ(*env_->FileSize(root_ + "/d/big"), big.size());
  auto f = env_->NewRandomAccessFile(root_ + "/d/big");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  std::string got(kPart + 10, '\0');
  ASSERT_TRUE((*f)->Read(kPart - 5, got.size(), got.data()).ok());
  EXPECT_EQ(got, big.substr(kPart - 5, got.size()));
  EXPECT_EQ(*ReadWholeFile(env_.get(), root_ + "/d/small"), small);
  // Reading past the end is data_loss naming the file, before any request.
  Status past = (*f)->Read(big.size() - 1, 2, got.data());
  EXPECT_EQ(past.code(), Code::kDataLoss);
  EXPECT_NE(past.message().find(root_ + "/d/big"), std::string::npos);
  // Directories are prefixes.
  EXPECT_TRUE(env_->IsDirectory(root_ + "/d"));
  EXPECT_TRUE(env_->Exists(root_ + "/d/big"));
  EXPECT_FALSE(env_->IsDirectory(root_ + "/d/big"));
  EXPECT_FALSE(env_->Exists(root_ + "/d/none"));
  EXPECT_EQ(*env_->ListDir(root_), std::vector<std::string>{"d"});
  EXPECT_EQ(*env_->ListDir(root_ + "/d"), (std::vector<std::string>{"big", "small"}));
  auto missing = env_->NewRandomAccessFile(root_ + "/d/none");
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  EXPECT_EQ(missing.status().details().value("file", ""), root_ + "/d/none");
  ASSERT_TRUE(env_->DeleteTree(root_ + "/d").ok());
  EXPECT_TRUE(env_->ListDir(root_)->empty());
  EXPECT_EQ(Uploads(), 0u);
}

TEST_F(S3EnvTest, AFileNeverSyncedLeavesNothing) {
  {
    auto f = env_->NewWritableFile(root_ + "/x/half");
    ASSERT_TRUE(f.ok());
    const std::string data = Pattern(2 * kPart + 1, 3);
    ASSERT_TRUE((*f)->Append(data.data(), data.size()).ok());
    // Parts were sent: the upload is open while the writer lives.
    EXPECT_EQ(Uploads(), 1u);
    EXPECT_EQ(*env_->ListDir(root_), std::vector<std::string>{"x"});
  }  // destroyed without Sync: aborted
  EXPECT_EQ(Uploads(), 0u);
  EXPECT_FALSE(env_->Exists(root_ + "/x/half"));
}

TEST_F(S3EnvTest, AFailedPartFailsTheFileNamingItAndAbortsTheUpload) {
  auto env = NewEnv(/*retry_budget_ms=*/300, /*fail_matching=*/"partNumber=2&");
  auto f = env->NewWritableFile(root_ + "/p/shard");
  ASSERT_TRUE(f.ok());
  const std::string data = Pattern(4 * kPart, 4);
  Status st;
  for (size_t off = 0; off < data.size() && st.ok(); off += kPart) {
    st = (*f)->Append(data.data() + off, kPart);
  }
  if (st.ok()) st = (*f)->Sync();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("part 2"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find(Key("p/shard")), std::string::npos) << st.ToString();
  EXPECT_EQ(st.details().value("file", ""), root_ + "/p/shard");
  EXPECT_EQ((*f)->Sync().code(), st.code());  // sticky: the object can never be whole
  ASSERT_TRUE((*f)->Close().ok());
  EXPECT_EQ(Uploads(), 0u);
  EXPECT_FALSE(env_->Exists(root_ + "/p/shard"));
}

TEST_F(S3EnvTest, PublishFileWinsOnce) {
  const std::string path = root_ + "/m/step-1.commit";
  std::vector<std::thread> racers;
  std::atomic<int> won{0}, lost{0};
  for (int i = 0; i < 6; ++i) {
    racers.emplace_back([&, i] {
      Status st = env_->PublishFile(path, "racer " + std::to_string(i));
      (st.ok() ? won : lost)++;
      if (!st.ok()) {
        EXPECT_EQ(st.code(), Code::kConflict) << st.ToString();
      }
    });
  }
  for (auto& t : racers) t.join();
  EXPECT_EQ(won.load(), 1);
  EXPECT_EQ(lost.load(), 5);
}

// Mixed small tensors and one whose shards span two parts of the store.
const std::vector<testing::SyntheticTensor>& Tensors() {
  static const auto* tensors = [] {
    const Mesh m = testing::Mesh22();
    auto* t = new std::vector<testing::SyntheticTensor>(testing::MixedTensors(m));
    t->push_back(testing::MakeTensor(
        m, {"big", DType::kFloat32, {4096, 1024}, Layout{{"data", "unsharded"}}}, 99));
    return t;
  }();
  return *tensors;
}

SaveRequest Request(const std::string& root, int64_t step) {
  SaveRequest req = testing::MakeRequest(root, testing::Mesh22(), step, Tensors());
  req.id = "job" + std::to_string(step);
  return req;
}

TEST_F(S3EnvTest, CheckpointsCommitByManifestAndReadBack) {
  auto one = SaveCheckpoint(env_.get(), Request(root_, 1));
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  auto two = SaveCheckpoint(env_.get(), Request(root_, 2));
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ(*ListSteps(env_.get(), root_, "m"), (std::vector<int64_t>{1, 2}));
  // The committed files are where the manifest says, and verify clean.
  EXPECT_EQ(*CommittedDir(env_.get(), root_, "m", 2), StagingDir(root_, "m", 2, "job2"));
  EXPECT_EQ(one->dir, StagingDir(root_, "m", 1, "job1"));
  auto report = VerifyCheckpoint(env_.get(), two->dir);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->ok());
  for (const auto& t : Tensors()) {
    auto bytes = ReadSlice(env_.get(), two->dir, t.meta.name, FullSlice(t.meta.shape));
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    EXPECT_EQ(*bytes, t.global) << t.meta.name;
  }
  // A step commits once; a second save of it is conflict, and leaves step 2 as it was.
  SaveRequest again = Request(root_, 2);
  again.id = "other";
  EXPECT_EQ(SaveCheckpoint(env_.get(), again).status().code(), Code::kConflict);
  EXPECT_EQ(*CommittedDir(env_.get(), root_, "m", 2), StagingDir(root_, "m", 2, "job2"));
  // Committing again with the same id (a retried request that had succeeded) is ok.
  EXPECT_TRUE(Commit(env_.get(), root_, "m", 2, "job2").ok());
  // Delete: the step is gone at once, then its files; garbage collection finds nothing.
  ASSERT_TRUE(DeleteCheckpoint(env_.get(), root_, "m", 1).ok());
  EXPECT_EQ(*ListSteps(env_.get(), root_, "m"), (std::vector<int64_t>{2}));
  EXPECT_EQ(CommittedDir(env_.get(), root_, "m", 1).status().code(), Code::kNotFound);
  EXPECT_EQ(DeleteCheckpoint(env_.get(), root_, "m", 1).code(), Code::kNotFound);
  EXPECT_TRUE(CollectGarbage(env_.get(), root_)->empty());
  EXPECT_EQ(*env_->ListDir(MeshDir(root_, "m")),
            (std::vector<std::string>{".staging-2-job2", "step-2.commit"}));
}

TEST_F(S3EnvTest, AFailedCommitLeavesNoStepAndEarlierOnesIntact) {
  ASSERT_TRUE(SaveCheckpoint(env_.get(), Request(root_, 1)).ok());
  auto faulty = NewEnv(300, "step-2.commit");
  auto st = SaveCheckpoint(faulty.get(), Request(root_, 2)).status();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("step-2.commit"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find(Rgw::ConfigFor("x").endpoint), std::string::npos) << st.ToString();
  EXPECT_EQ(*ListSteps(env_.get(), root_, "m"), (std::vector<int64_t>{1}));
  EXPECT_EQ(*env_->ListDir(MeshDir(root_, "m")),
            (std::vector<std::string>{".staging-1-job1", "step-1.commit"}));
  EXPECT_TRUE(VerifyCheckpoint(env_.get(), *CommittedDir(env_.get(), root_, "m", 1))->ok());
}

// A committed step's other, failed attempt: its step has two staging prefixes, so the
// manifest is read to learn which one it protects, and the other goes.
TEST_F(S3EnvTest, AFailedAttemptOfACommittedStepIsCollected) {
  ASSERT_TRUE(SaveCheckpoint(env_.get(), Request(root_, 1)).ok());
  // Written in place, as a writer cut off before the commit left it.
  ASSERT_TRUE(WriteFile(env_.get(), JoinPath(StagingDir(root_, "m", 1, "failed"), "f"), "x", 1).ok());
  auto removed = CollectGarbage(env_.get(), root_);
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_EQ(*removed, std::vector<std::string>{StagingDir(root_, "m", 1, "failed")});
  EXPECT_TRUE(VerifyCheckpoint(env_.get(), *CommittedDir(env_.get(), root_, "m", 1))->ok());
}

TEST_F(S3EnvTest, AWriterKilledBetweenPartsIsCollected) {
  ASSERT_TRUE(SaveCheckpoint(env_.get(), Request(root_, 1)).ok());
  ASSERT_TRUE(CreateStaging(env_.get(), root_, "m", 2, "dead").ok());
  const std::string shard = JoinPath(StagingDir(root_, "m", 2, "dead"), "shard-0.tsr");
  // The writer is this binary again, in a process of its own (exec, so that it
  // starts clean: no threads or connections inherited), killed between parts.
  const pid_t child = fork();
  if (child == 0) {
    execl("/proc/self/exe", "s3_env_test", "--write-parts-and-die", shard.c_str(), nullptr);
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(Uploads(), 1u);
  // The dead writer's staging exists only as an unfinished upload; a running
  // save's staging is kept.
  ASSERT_TRUE(CreateStaging(env_.get(), root_, "m", 3, "live").ok());
  ASSERT_TRUE(WriteFile(env_.get(), JoinPath(StagingDir(root_, "m", 3, "live"), "f"), "x", 1).ok());
  auto removed = CollectGarbage(env_.get(), root_, {"live"});
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_EQ(*removed, std::vector<std::string>{StagingDir(root_, "m", 2, "dead")});
  EXPECT_EQ(Uploads(), 0u);
  EXPECT_EQ(*ListSteps(env_.get(), root_, "m"), (std::vector<int64_t>{1}));
  EXPECT_TRUE(env_->Exists(JoinPath(StagingDir(root_, "m", 3, "live"), "f")));
}

TEST_F(S3EnvTest, AnUnreachableStoreBadCredentialsAndAMissingBucketAreNamed) {
  const std::string endpoint = Rgw::ConfigFor("x").endpoint;
  // Missing bucket.
  Status st = env_->CreateDirs("s3://no-such-bucket-tessera/p");
  EXPECT_EQ(st.code(), Code::kNotFound) << st.ToString();
  EXPECT_NE(st.message().find("no-such-bucket-tessera"), std::string::npos) << st.ToString();
  // Bad credentials.
  const std::string secret = std::getenv("AWS_SECRET_ACCESS_KEY");
  setenv("AWS_SECRET_ACCESS_KEY", "wrong", 1);
  st = NewEnv()->CreateDirs(root_);
  setenv("AWS_SECRET_ACCESS_KEY", secret.c_str(), 1);
  EXPECT_EQ(st.code(), Code::kUnauthenticated) << st.ToString();
  EXPECT_NE(st.message().find(endpoint), std::string::npos) << st.ToString();
  // Nobody listening: unavailable after the bounded retries, naming endpoint and bucket.
  S3EnvOptions o;
  o.endpoint = "http://127.0.0.1:1";
  o.retry_budget_ms = 300;
  auto down = NewS3Env(o);
  auto saved = SaveCheckpoint(down.get(), Request("s3://tessera-env-test/down", 1));
  ASSERT_FALSE(saved.ok());
  EXPECT_EQ(saved.status().code(), Code::kUnavailable) << saved.status().ToString();
  EXPECT_NE(saved.status().message().find("http://127.0.0.1:1"), std::string::npos);
  EXPECT_NE(saved.status().message().find("tessera-env-test"), std::string::npos);
  // No endpoint at all: said so.
  unsetenv("TESSERA_S3_ENDPOINT");
  S3EnvOptions none;
  st = NewS3Env(none)->CreateDirs("s3://tessera-env-test/x");
  Rgw::Export();
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("--s3-endpoint"), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace tessera::storage

// The writer of AWriterKilledBetweenPartsIsCollected: three parts sent, then
// gone without completing or aborting the upload.
int WriteAndDie(const std::string& path) {
  tessera::storage::S3EnvOptions o;
  o.part_bytes = tessera::storage::kPart;
  o.parts_in_flight = 1;  // each part acknowledged before the next is sent
  auto env = tessera::storage::NewS3Env(o);
  auto f = env->NewWritableFile(path);
  const std::string data = tessera::storage::Pattern(3 * tessera::storage::kPart + 1, 5);
  if (!f.ok() || !(*f)->Append(data.data(), data.size()).ok()) _exit(2);
  _exit(0);  // parts sent, the upload neither completed nor aborted
}

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--write-parts-and-die") return WriteAndDie(argv[2]);
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new tessera::storage::s3::Rgw);
  return RUN_ALL_TESTS();
}
