// The root's epochs and lease (storage/root_epoch.h, service/root_fence.h): one holder
// at a time, a live holder refused by name, a released or dead one taken over, and a
// holder that a newer epoch replaced, or whose lease went stale, refuses to act. Leases
// run on a fake clock (fake_clock.h): no test waits for one to pass in real time.
#include "service/root_fence.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include <gtest/gtest.h>

#include <future>

#include "api/clock.h"
#include "eventually.h"
#include "fake_clock.h"
#include "storage/root_epoch.h"

namespace tessera::service {
namespace {

class RootFenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = "/tmp/tessera-fence-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  Result<std::unique_ptr<RootFence>> Acquire(const std::string& url, int64_t lease_ms = 3000,
                                             const std::string& ha = "") {
    return RootFence::Acquire(env_, {root_, url, ha, lease_ms, &clock_}, [this](const std::string& m) {
      if (m.find("watching its lease") != std::string::npos) watching_ = true;
    });
  }
  // An Acquire in the background, once it watches the holder's lease.
  std::future<Result<std::unique_ptr<RootFence>>> AcquireWatching(const std::string& url) {
    watching_ = false;
    auto f = std::async(std::launch::async, [this, url] { return Acquire(url); });
    EXPECT_TRUE(testing::Eventually([&] { return watching_.load(); })) << "it never watched";
    return f;
  }
  // Moves the clock on, a poll's length at a time, until `f` has its answer.
  template <class T>
  T AdvanceUntilDone(std::future<T>& f) {
    while (f.wait_for(std::chrono::milliseconds(1)) != std::future_status::ready) clock_.Advance(50);
    return f.get();
  }
  // An epoch file as a control plane on another machine would write it.
  void WriteForeignEpoch(int64_t epoch, int64_t ttl_ms, const std::string& ha = "") {
    Json holder = {{"url", "http://elsewhere:7070"}, {"host", "elsewhere"}, {"pid", 1}, {"machine", "other"}};
    ASSERT_TRUE(storage::CreateEpoch(env_, root_, epoch,
                                     {{"format", "tessera-root/1"}, {"epoch", epoch}, {"holder", holder}, {"ha", ha}})
                    .ok());
    ASSERT_TRUE(storage::WriteLease(env_, root_, epoch, {{"renewals", 0}, {"ttl_ms", ttl_ms}}).ok());
  }
  storage::Env* env_ = storage::DefaultEnv();
  std::string root_;
  testing::FakeClock clock_;
  std::atomic<bool> watching_{false};
};

TEST_F(RootFenceTest, OneHolderAtATimeAndALiveOneIsNamed) {
  auto a = Acquire("http://a:1");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ((*a)->epoch(), 1);
  EXPECT_TRUE((*a)->Check("commit").ok());
  auto b = Acquire("http://b:1");
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Code::kConflict);
  EXPECT_NE(b.status().message().find("held by the tesserad at http://a:1"), std::string::npos)
      << b.status().ToString();
  // Released on a clean stop: the next one takes the root at once.
  (*a)->Stop(/*release=*/true);
  auto c = Acquire("http://c:1");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ((*c)->epoch(), 2);
}

TEST_F(RootFenceTest, ADeadHolderOfThisMachineIsTakenOverAtOnce) {
  const pid_t child = ::fork();
  if (child == 0) {
    auto f = RootFence::Acquire(storage::DefaultEnv(), {root_, "http://dead:1", "", 60000},
                                [](const std::string&) {});
    ::_exit(f.ok() ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  auto e = storage::ReadNewestEpoch(env_, root_);
  ASSERT_TRUE(e.ok() && *e);
  EXPECT_EQ(HolderState((*e)->doc["holder"]), Holder::kGone);
  // Its lease was 60 s and never released: only knowing it is gone lets this through.
  auto next = Acquire("http://next:1");
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ((*next)->epoch(), 2);
}

TEST_F(RootFenceTest, AHolderElsewhereIsWatchedRenewedRefusedSilentTakenOver) {
  WriteForeignEpoch(1, 300);
  // Renewed while watched: refused, naming it.
  auto watched = AcquireWatching("http://me:1");
  ASSERT_TRUE(storage::WriteLease(env_, root_, 1, {{"renewals", 1}, {"ttl_ms", 300}}).ok());
  auto refused = AdvanceUntilDone(watched);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("http://elsewhere:7070"), std::string::npos);
  // Silent for longer than its lease: taken over, once the clock has moved past it.
  const int64_t began = clock_.MonoMs();
  auto silent = AcquireWatching("http://me:1");
  auto taken = AdvanceUntilDone(silent);
  ASSERT_TRUE(taken.ok()) << taken.status().ToString();
  EXPECT_EQ((*taken)->epoch(), 2);
  EXPECT_GE(clock_.MonoMs() - began, 300) << "taken over before the holder's lease ran out";
  // A holder of the same --ha group: etcd chose this one, nothing to watch.
  WriteForeignEpoch(3, 600000, "etcd://e:1");
  auto grouped = Acquire("http://me:1", 3000, "etcd://e:1");
  ASSERT_TRUE(grouped.ok()) << grouped.status().ToString();
  EXPECT_EQ((*grouped)->epoch(), 4);
}

TEST_F(RootFenceTest, ANewerEpochDeposesAndAStaleLeaseRefuses) {
  auto a = Acquire("http://a:1", 400);
  ASSERT_TRUE(a.ok());
  // Not renewed (never started): within 3/4 of the lease it still acts, past it it stops.
  clock_.Advance(300);
  EXPECT_TRUE((*a)->Check("delete step 3 of mesh m").ok());
  clock_.Advance(1);
  Status st = (*a)->Check("delete step 3 of mesh m");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.details().value("reason", ""), "lease_expired") << st.ToString();
  EXPECT_NE(st.message().find("refusing to delete step 3 of mesh m"), std::string::npos);

  (*a)->Stop(/*release=*/true);
  auto b = Acquire("http://b:1", 60000);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  WriteForeignEpoch((*b)->epoch() + 1, 60000);
  st = (*b)->Check("commit step 7 of mesh m");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.details().value("reason", ""), "deposed");
  EXPECT_NE(st.message().find("http://elsewhere:7070"), std::string::npos) << st.ToString();
}

TEST_F(RootFenceTest, RenewingKeepsTheLeaseFreshAndFindsTheNewerEpoch) {
  auto a = Acquire("http://a:1", 300);
  ASSERT_TRUE(a.ok());
  std::atomic<int> deposed{0};
  (*a)->Start([&](const Status& st) {
    EXPECT_EQ(st.details().value("reason", ""), "deposed");
    deposed++;
  });
  // Every third of the lease it renews: after ten leases of the clock it still acts.
  const int64_t began = clock_.MonoMs();
  auto renewals = [&] {
    const Json lease = Json::parse(storage::ReadLease(env_, root_, 1).value(), nullptr, false);
    return lease.is_object() ? lease.value("renewals", int64_t{0}) : int64_t{-1};  // mid-write
  };
  for (int64_t i = 1; i <= 30; ++i) {
    ASSERT_TRUE(testing::Eventually([&] {
      clock_.Advance(10);
      return renewals() >= i;
    })) << "no renewal " << clock_.MonoMs() - began << " ms into the clock";
  }
  EXPECT_GE(clock_.MonoMs() - began, 30 * 100) << "renewed more often than every third of the lease";
  EXPECT_TRUE((*a)->Check("commit").ok());
  WriteForeignEpoch(2, 60000);
  ASSERT_TRUE(testing::Eventually([&] {
    clock_.Advance(100);
    return deposed.load() > 0;
  }));
  EXPECT_EQ(deposed, 1);
  (*a)->Stop(/*release=*/true);  // deposed: nothing released
  auto lease = storage::ReadLease(env_, root_, 1);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->find("released"), std::string::npos);
}

TEST(RootEpoch, JobIdsCarryTheEpoch) {
  EXPECT_EQ(storage::EpochOfJobId("j7-0123456789ab"), 7);
  EXPECT_EQ(storage::EpochOfJobId("j-0123456789ab"), 0);
  EXPECT_EQ(storage::EpochOfJobId("jx-1"), 0);
  EXPECT_EQ(storage::EpochOfJobId("t3-1"), 0);
  EXPECT_EQ(storage::EpochOfJobId("j12"), 0);
}

TEST(RootEpoch, ANewerFormatIsRefusedNamingTheFile) {
  const std::string root = "/tmp/tessera-epoch-format-" + std::to_string(::getpid());
  std::filesystem::remove_all(root);
  ASSERT_TRUE(storage::CreateEpoch(storage::DefaultEnv(), root, 1, {{"format", "tessera-root/2"}}).ok());
  auto e = storage::ReadNewestEpoch(storage::DefaultEnv(), root);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), Code::kInvalidArgument);
  EXPECT_NE(e.status().message().find("epoch-1.json has format tessera-root/2"), std::string::npos)
      << e.status().ToString();
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace tessera::service
