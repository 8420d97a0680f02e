// The coordination stores' writes: the KV store and the preemption notices write the
// catalog with no lock of theirs held, so a reader or a waiter never queues behind the
// disk, and memory changes only once the catalog has: a value that could not be stored is
// never seen. A catalog write is held at the disk (GatedEnv) or failed (FaultEnv) through
// the Env seam the catalog writes through.
#include <gtest/gtest.h>

#include <unistd.h>

#include <future>
#include <thread>

#include "api/thread_annotations.h"
#include "eventually.h"
#include "service/catalog.h"
#include "service/kv_store.h"
#include "service/preemption.h"
#include "service/write_turns.h"
#include "storage/env.h"
#include "storage/testing/fault_env.h"
#include "temp_dir.h"

namespace tessera::service {
namespace {

using tessera::testing::Eventually;

// An Env whose file changes wait while the gate is shut: a catalog write held at the disk.
class GatedEnv : public storage::EnvWrapper {
 public:
  explicit GatedEnv(storage::Env* base) : EnvWrapper(base) {}
  void Shut() {
    MutexLock l(mu_);
    shut_ = true;
  }
  void Open() {
    {
      MutexLock l(mu_);
      shut_ = false;
    }
    cv_.NotifyAll();
  }
  int held() {
    MutexLock l(mu_);
    return held_;
  }
  Status BeforeChange(storage::FileChange change, const std::string& path, uint64_t bytes) override {
    {
      MutexLock l(mu_);
      ++held_;
      while (shut_) cv_.Wait(mu_);
      --held_;
    }
    return EnvWrapper::BeforeChange(change, path, bytes);
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool shut_ GUARDED_BY(mu_) = false;
  int held_ GUARDED_BY(mu_) = 0;
};

// The value, or the error as text (so a failure reads well instead of aborting).
std::string ValueOr(const Result<std::string>& r) { return r.ok() ? *r : r.status().ToString(); }

// Whether `f` finished (observed, with a generous bound that only a broken store reaches).
template <class T>
bool Finishes(std::future<T>& f) {
  return Eventually([&] { return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready; },
                    std::chrono::seconds(20));
}

class StoreWritesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto catalog = Catalog::Open(&faults_, tmp_.path());
    ASSERT_TRUE(catalog.ok()) << catalog.status().ToString();
    catalog_ = std::move(*catalog);
  }
  void TearDown() override {
    gate_.Open();
    catalog_.reset();
  }

  GatedEnv gate_{storage::DefaultEnv()};
  storage::FaultEnv faults_{&gate_};
  testing::TempDir tmp_{"tessera_store_writes_test"};  // goes last
  std::unique_ptr<Catalog> catalog_;
};

TEST_F(StoreWritesTest, AKvWriteAtTheDiskHoldsNoReaderAndShowsOnlyOnceStored) {
  KvStore kv(catalog_.get(), nullptr);
  ASSERT_TRUE(kv.Load().ok());
  ASSERT_TRUE(kv.Put("a", "1").ok());
  gate_.Shut();
  auto put = std::async(std::launch::async, [&] { return kv.Put("b", "2"); });
  ASSERT_TRUE(Eventually([&] { return gate_.held() > 0; })) << "the write never reached the disk";
  // The writer is at the disk: readers go on, and do not see what is not stored yet.
  auto reads = std::async(std::launch::async, [&] {
    return std::make_tuple(kv.Get("a", 0), kv.Get("b", 0), kv.Keys(""), kv.size());
  });
  ASSERT_TRUE(Finishes(reads)) << "a reader queued behind a catalog write";
  auto [a, b, keys, size] = reads.get();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(*a, "1");
  EXPECT_EQ(b.status().code(), Code::kNotFound) << "a value was seen before it was stored";
  EXPECT_EQ(keys, std::vector<std::string>{"a"});
  EXPECT_EQ(size, 1);
  // A second writer waits its turn; then both land in order.
  auto later = std::async(std::launch::async, [&] { return kv.Put("b", "3"); });
  gate_.Open();
  ASSERT_TRUE(Finishes(put) && Finishes(later));
  EXPECT_TRUE(put.get().ok());
  EXPECT_TRUE(later.get().ok());
  auto b_now = kv.Get("b", 0);
  ASSERT_TRUE(b_now.ok());
  EXPECT_EQ(*b_now, "3");
  // The catalog agrees with memory: a reload reads the last write.
  KvStore reloaded(catalog_.get(), nullptr);
  ASSERT_TRUE(reloaded.Load().ok());
  EXPECT_EQ(ValueOr(reloaded.Get("b", 0)), "3");
}

TEST_F(StoreWritesTest, AFailedKvWriteIsNamedAndNeverSeen) {
  KvStore kv(catalog_.get(), nullptr);
  ASSERT_TRUE(kv.Load().ok());
  ASSERT_TRUE(kv.Put("k", "old").ok());
  faults_.FailAt(1);
  Status st = kv.Put("k", "new");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.details().value("key", ""), "k") << st.ToString();
  EXPECT_EQ(ValueOr(kv.Get("k", 0)), "old");
  faults_.FailAt(1);
  st = kv.Delete("k");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.details().value("key", ""), "k") << st.ToString();
  EXPECT_EQ(ValueOr(kv.Get("k", 0)), "old") << "a delete that was not stored took effect";
  faults_.Reset();
  KvStore reloaded(catalog_.get(), nullptr);
  ASSERT_TRUE(reloaded.Load().ok());
  EXPECT_EQ(ValueOr(reloaded.Get("k", 0)), "old");
}

TEST_F(StoreWritesTest, APreemptionReportAtTheDiskHoldsNoWaiter) {
  Preemption p(catalog_.get(), nullptr, nullptr);
  ASSERT_TRUE(p.Load().ok());
  ASSERT_TRUE(p.Notice("m", "maintenance").ok());
  const std::vector<std::string> workers = {"w0", "w1"};
  gate_.Shut();
  auto first = std::async(std::launch::async, [&] { return p.Sync("m", workers, "w0", 5, 20000); });
  ASSERT_TRUE(Eventually([&] { return gate_.held() > 0; }));
  // The report is at the disk: the state can still be read, and does not show it yet.
  auto state = std::async(std::launch::async, [&] { return p.State("m"); });
  ASSERT_TRUE(Finishes(state)) << "a reader queued behind a catalog write";
  EXPECT_EQ(state.get()["reported_steps"], Json::object());
  gate_.Open();
  ASSERT_TRUE(Eventually([&] { return p.State("m")["reported_steps"].size() == 1; }));
  auto second = p.Sync("m", workers, "w1", 7, 20000);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ((*second)["sync_step"], 8);
  ASSERT_TRUE(Finishes(first));
  auto got = first.get();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ((*got)["sync_step"], 8);
}

TEST_F(StoreWritesTest, AReportThatCannotBeStoredFailsTheCallAndDoesNotCount) {
  Preemption p(catalog_.get(), nullptr, nullptr);
  ASSERT_TRUE(p.Load().ok());
  ASSERT_TRUE(p.Notice("m", "").ok());
  faults_.FailAt(1);
  auto r = p.Sync("m", {"w0"}, "w0", 3, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().details().value("mesh", ""), "m") << r.status().ToString();
  EXPECT_EQ(r.status().details().value("worker", ""), "w0") << r.status().ToString();
  EXPECT_TRUE(p.State("m")["sync_step"].is_null());
  EXPECT_EQ(p.State("m")["reported_steps"], Json::object());
  faults_.Reset();
  auto again = p.Sync("m", {"w0"}, "w0", 3, 0);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)["sync_step"], 4);
  faults_.FailAt(1);
  EXPECT_FALSE(p.Clear("m").ok());
  EXPECT_EQ(p.State("m")["noticed"], true) << "a clear that was not stored took effect";
}

TEST(WriteTurnsTest, NoWriterGoesWhileAnotherHoldsItsTurn) {
  WriteTurns turns;
  Mutex mu;
  int wrote = 0;
  auto first = std::make_unique<WriteTurns::Turn>(turns.Take());
  std::vector<std::thread> writers;
  for (int i = 0; i < 3; ++i) {
    writers.emplace_back([&] {
      WriteTurns::Turn t = turns.Take();
      MutexLock l(mu);
      ++wrote;
    });
  }
  ASSERT_TRUE(Eventually([&] { return turns.queued() == 4; })) << "the writers never queued";
  {
    MutexLock l(mu);
    EXPECT_EQ(wrote, 0) << "a writer went while the first held its turn";
  }
  first.reset();
  for (auto& w : writers) w.join();
  EXPECT_EQ(wrote, 3);
}

}  // namespace
}  // namespace tessera::service
