// The coordination service without HTTP: barriers with ranks as threads, the
// KV store (waits, limits, persistence across a reopen) and preemption sync
// points, plus Service's mesh checks around them. No assertion depends on
// timing: threads are ordered by waiting for visible state, and timeouts are
// only ever expected to expire when nobody else can arrive.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include "api/base64.h"
#include "eventually.h"
#include "fake_clock.h"
#include "service/coordination.h"
#include "service/service.h"
#include "storage/env.h"
#include "temp_dir.h"

namespace tessera::service {
namespace {

constexpr int64_t kLong = 20000;  // ms; only reached if the code under test is broken

using tessera::testing::Eventually;

// The value, or the error as text (so a failure reads well instead of aborting).
std::string ValueOr(const Result<std::string>& r) { return r.ok() ? *r : r.status().ToString(); }
Json JsonOr(const Result<Json>& r) { return r.ok() ? *r : Json{{"error", r.status().ToString()}}; }

void ExpectCode(const Status& st, Code code, const std::string& field = "") {
  EXPECT_EQ(st.code(), code) << st.ToString();
  if (!field.empty()) {
    const Json& d = st.details();
    EXPECT_EQ(d.is_object() ? d.value("field", "") : "", field) << st.ToString();
  }
}

// A fresh data dir per test; Reopen() (re)creates what the test holds on it,
// Close() drops it, and the dir goes away after the test.
class DataDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Reopen();
  }
  void TearDown() override {
    Close();
  }
  virtual void Reopen() = 0;
  virtual void Close() = 0;

  testing::TempDir tmp_{"tessera_coordination_test"};  // goes last
};

class CoordinationTest : public DataDirTest {
 protected:
  void Close() override {
    coord_.reset();
    catalog_.reset();
  }

  // Closes and opens the catalog and the coordination service again (a restart).
  void Reopen() override {
    Close();
    auto catalog = Catalog::Open(storage::DefaultEnv(), tmp_.path());
    ASSERT_TRUE(catalog.ok()) << catalog.status().ToString();
    catalog_ = std::move(*catalog);
    CoordinationOptions opts;
    opts.max_wait_ms = 60000;
    opts.clock = clock_;
    auto c = Coordination::Open(opts, catalog_.get(), &events_, &metrics_);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    coord_ = std::move(*c);
  }

  Result<Json> Arrive(const std::string& name, int64_t rank, int64_t world,
                      int64_t timeout_ms = kLong) {
    return coord_->ArriveBarrier(name, {{"rank", rank}, {"world", world}, {"timeout_ms", timeout_ms}});
  }

  // The open barrier `name` from ListBarriers(), or null.
  Json OpenBarrier(const std::string& name) {
    for (const auto& b : coord_->ListBarriers()) {
      if (b["name"] == name) return b;
    }
    return nullptr;
  }

  bool Arrived(const std::string& name, size_t n) {
    Json b = OpenBarrier(name);
    return !b.is_null() && b["arrived_ranks"].size() == n;
  }

  Clock* clock_ = RealClock();
  EventBus events_;
  Metrics metrics_;
  std::unique_ptr<Catalog> catalog_;
  std::unique_ptr<Coordination> coord_;
};

// The same, with barriers on a clock that moves only when the test advances it.
class FakeClockCoordinationTest : public CoordinationTest {
 protected:
  FakeClockCoordinationTest() { clock_ = &fake_clock_; }
  tessera::testing::FakeClock fake_clock_;
};

// ---------------------------------------------------------------- barriers

TEST_F(CoordinationTest, BarrierReleasesRanksOnlyWhenAllHaveArrived) {
  constexpr int kWorld = 4;
  std::atomic<int> arrivals{0};
  std::vector<Result<Json>> results(kWorld, Status(Code::kInternal, "not run"));
  std::vector<int> seen_arrivals(kWorld, -1);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      arrivals++;
      results[r] = Arrive("job/step-1", r, kWorld);
      seen_arrivals[r] = arrivals.load();
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(results[r].ok()) << results[r].status().ToString();
    EXPECT_EQ((*results[r])["name"], "job/step-1");
    EXPECT_EQ((*results[r])["world"], kWorld);
    EXPECT_EQ((*results[r])["generation"], 0);
    EXPECT_TRUE((*results[r])["waited_ms"].is_number_integer()) << results[r]->dump();
    EXPECT_EQ(seen_arrivals[r], kWorld) << "rank " << r << " left before everyone arrived";
  }
  EXPECT_TRUE(coord_->ListBarriers().empty()) << coord_->ListBarriers().dump();
  EXPECT_NE(metrics_.Render({}).find("tessera_barrier_waits_total{outcome=\"ok\"} 4"),
            std::string::npos);
}

TEST_F(FakeClockCoordinationTest, WaitedMsIsTheTimeFromArrivalToRelease) {
  Result<Json> rank0 = Status(Code::kInternal, "not run");
  Result<Json> rank1 = Status(Code::kInternal, "not run");
  std::thread first([&] { rank0 = Arrive("w", 0, 3); });
  ASSERT_TRUE(Eventually([&] { return Arrived("w", 1); }));
  fake_clock_.Advance(500);
  EXPECT_EQ(OpenBarrier("w")["waiting_ms"], 500);
  std::thread second([&] { rank1 = Arrive("w", 1, 3); });
  ASSERT_TRUE(Eventually([&] { return Arrived("w", 2); }));
  fake_clock_.Advance(250);
  EXPECT_EQ(OpenBarrier("w")["waiting_ms"], 750);
  auto rank2 = Arrive("w", 2, 3);
  first.join();
  second.join();
  ASSERT_TRUE(rank0.ok() && rank1.ok() && rank2.ok())
      << JsonOr(rank0) << JsonOr(rank1) << JsonOr(rank2);
  EXPECT_EQ((*rank0)["waited_ms"], 750);
  EXPECT_EQ((*rank1)["waited_ms"], 250);
  EXPECT_EQ((*rank2)["waited_ms"], 0);  // the last to arrive does not wait
}

TEST_F(CoordinationTest, BarrierOfOneRankReturnsAtOnce) {
  auto r = Arrive("solo", 0, 1, 0);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)["generation"], 0);
}

TEST_F(CoordinationTest, BarrierNameIsReusedAcrossGenerations) {
  constexpr int kWorld = 3, kRounds = 4;
  std::vector<std::vector<int64_t>> generations(kWorld);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      for (int round = 0; round < kRounds; ++round) {
        auto res = Arrive("loop", r, kWorld);
        generations[r].push_back(res.ok() ? (*res)["generation"].get<int64_t>() : -1);
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(generations[r], (std::vector<int64_t>{0, 1, 2, 3})) << "rank " << r;
  }
  // The next round may use another world: the name is not open any more.
  auto solo = Arrive("loop", 0, 1);
  ASSERT_TRUE(solo.ok()) << solo.status().ToString();
  EXPECT_EQ((*solo)["generation"], kRounds);
}

TEST_F(CoordinationTest, BarrierTimeoutNamesMissingRanksAndTheRankLeaves) {
  Result<Json> rank2 = Status(Code::kInternal, "not run");
  std::thread waiter([&] { rank2 = Arrive("t", 2, 4); });
  ASSERT_TRUE(Eventually([&] { return Arrived("t", 1); }));

  auto rank0 = Arrive("t", 0, 4, /*timeout_ms=*/30);
  ExpectCode(rank0.status(), Code::kDeadlineExceeded);
  EXPECT_EQ(rank0.status().details()["missing_ranks"], Json({1, 3}));
  EXPECT_EQ(rank0.status().details()["arrived_ranks"], Json({0, 2}));
  EXPECT_EQ(rank0.status().details()["barrier"], "t");

  // Rank 0 left; rank 2 still waits.
  Json open = OpenBarrier("t");
  ASSERT_FALSE(open.is_null());
  EXPECT_EQ(open["world"], 4);
  EXPECT_EQ(open["arrived_ranks"], Json({2}));
  EXPECT_EQ(open["missing_ranks"], Json({0, 1, 3}));
  EXPECT_TRUE(open["waiting_ms"].is_number_integer()) << open.dump();

  // Ranks 0 (again), 1 and 3 complete the round with rank 2.
  std::vector<std::thread> others;
  for (int r : {0, 1, 3}) others.emplace_back([&, r] { EXPECT_TRUE(Arrive("t", r, 4).ok()); });
  for (auto& t : others) t.join();
  waiter.join();
  ASSERT_TRUE(rank2.ok()) << rank2.status().ToString();
  EXPECT_EQ((*rank2)["generation"], 0);
}

TEST_F(CoordinationTest, BarrierWorldMismatchAndDuplicateRankConflict) {
  Result<Json> rank0 = Status(Code::kInternal, "not run");
  std::thread waiter([&] { rank0 = Arrive("c", 0, 2); });
  ASSERT_TRUE(Eventually([&] { return Arrived("c", 1); }));

  auto mismatch = Arrive("c", 1, 3);
  ExpectCode(mismatch.status(), Code::kConflict, "world");
  EXPECT_EQ(mismatch.status().details()["world"], 3);
  EXPECT_EQ(mismatch.status().details()["open_world"], 2);
  EXPECT_NE(mismatch.status().message().find('2'), std::string::npos);
  EXPECT_NE(mismatch.status().message().find('3'), std::string::npos);

  auto twice = Arrive("c", 0, 2);
  ExpectCode(twice.status(), Code::kConflict, "rank");
  EXPECT_EQ(twice.status().details()["rank"], 0);

  // Neither rejected call joined the round: rank 1 with world 2 completes it.
  auto rank1 = Arrive("c", 1, 2);
  ASSERT_TRUE(rank1.ok()) << rank1.status().ToString();
  waiter.join();
  ASSERT_TRUE(rank0.ok()) << rank0.status().ToString();
}

TEST_F(CoordinationTest, BarrierRejectsBadRequests) {
  struct Case {
    std::string name;
    Json body;
    std::string field;
  };
  const std::vector<Case> cases = {
      {"b", {{"rank", -1}, {"world", 2}}, "rank"},
      {"b", {{"rank", 2}, {"world", 2}}, "rank"},
      {"b", {{"rank", "0"}, {"world", 2}}, "rank"},
      {"b", {{"world", 2}}, "rank"},
      {"b", {{"rank", 0}, {"world", 0}}, "world"},
      {"b", {{"rank", 0}}, "world"},
      {"b", {{"rank", 0}, {"world", int64_t{1} << 40}}, "world"},
      {"b", {{"rank", 0}, {"world", 2}, {"timeout_ms", -1}}, "timeout_ms"},
      {"b", {{"rank", 0}, {"world", 2}, {"timeout_ms", "soon"}}, "timeout_ms"},
      {"b", Json::array(), "request body"},
      {"../b", {{"rank", 0}, {"world", 1}}, "barrier"},
      {"", {{"rank", 0}, {"world", 1}}, "barrier"},
      {"a b", {{"rank", 0}, {"world", 1}}, "barrier"},
  };
  for (const auto& c : cases) {
    auto r = coord_->ArriveBarrier(c.name, c.body);
    ExpectCode(r.status(), Code::kInvalidArgument, c.field);
  }
  EXPECT_TRUE(coord_->ListBarriers().empty());
}

TEST_F(CoordinationTest, ShutdownWakesBarrierKvAndSyncWaiters) {
  ASSERT_TRUE(coord_->NoticePreemption("m", Json::object()).ok());
  Result<Json> barrier = Status(Code::kInternal, "not run");
  Result<std::string> value = Status(Code::kInternal, "not run");
  Result<Json> sync = Status(Code::kInternal, "not run");
  std::thread a([&] { barrier = Arrive("s", 0, 2); });
  std::thread b([&] { value = coord_->GetValue("never", kLong); });
  std::thread c([&] {
    sync = coord_->SyncPreemption("m", {"w0", "w1"}, {{"worker", "w0"}, {"step", 1}, {"timeout_ms", kLong}});
  });
  ASSERT_TRUE(Eventually([&] {
    return Arrived("s", 1) && !coord_->PreemptionState("m")["reported_steps"].empty();
  }));
  coord_->Shutdown();
  a.join();
  b.join();
  c.join();
  ExpectCode(barrier.status(), Code::kUnavailable);
  ExpectCode(sync.status(), Code::kUnavailable);
  // The GET may have been woken or not yet waiting: either way it does not hang.
  EXPECT_FALSE(value.ok());
  ExpectCode(Arrive("s", 1, 2).status(), Code::kUnavailable);
}

// ---------------------------------------------------------------- KV

TEST_F(CoordinationTest, KvPutGetListDelete) {
  std::string binary;
  for (int i = 0; i < 256; ++i) binary += static_cast<char>(i);
  ASSERT_TRUE(coord_->PutValue("job/addr/1", binary).ok());
  ASSERT_TRUE(coord_->PutValue("job/addr/0", "10.0.0.1:1234").ok());
  ASSERT_TRUE(coord_->PutValue("other", "").ok());
  ASSERT_TRUE(coord_->PutValue("job/addr/0", "10.0.0.2:1234").ok());  // overwrite

  auto v = coord_->GetValue("job/addr/1", 0);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, binary);
  EXPECT_EQ(ValueOr(coord_->GetValue("job/addr/0", 0)), "10.0.0.2:1234");
  EXPECT_EQ(ValueOr(coord_->GetValue("other", 0)), "");

  EXPECT_EQ(coord_->ListKeys("job/"), Json({{"keys", {"job/addr/0", "job/addr/1"}}}));
  EXPECT_EQ(coord_->ListKeys("")["keys"], Json({"job/addr/0", "job/addr/1", "other"}));
  EXPECT_EQ(coord_->ListKeys("zzz")["keys"], Json::array());

  ASSERT_TRUE(coord_->DeleteValue("job/addr/1").ok());
  auto gone = coord_->GetValue("job/addr/1", 0);
  ExpectCode(gone.status(), Code::kNotFound);
  EXPECT_EQ(gone.status().details()["key"], "job/addr/1");
  ExpectCode(coord_->DeleteValue("job/addr/1"), Code::kNotFound);
  EXPECT_EQ(coord_->DeleteValue("nope").details()["key"], "nope");
  EXPECT_EQ(coord_->Counts()["kv_keys"], 2);
  EXPECT_NE(metrics_.Render({}).find("tessera_kv_ops_total{op=\"delete\",outcome=\"not_found\"} 2"),
            std::string::npos)
      << metrics_.Render({});
}

TEST_F(CoordinationTest, KvWaitingGetIsWokenByAPutFromAnotherThread) {
  Result<std::string> got = Status(Code::kInternal, "not run");
  std::thread reader([&] { got = coord_->GetValue("late", kLong); });
  ASSERT_TRUE(Eventually([&] { return coord_->Counts()["kv_waiting_gets"] == 1; }))
      << "the reader never waited";
  ASSERT_TRUE(coord_->PutValue("late", "here").ok());
  reader.join();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "here");
}

TEST_F(CoordinationTest, KvGetOfAnAbsentKeyIsNotFoundAfterTheWait) {
  auto r = coord_->GetValue("absent", 20);
  ExpectCode(r.status(), Code::kNotFound);
  EXPECT_EQ(r.status().details()["key"], "absent");
  // Negative waits are clamped to 0, not errors.
  ExpectCode(coord_->GetValue("absent", -5).status(), Code::kNotFound);
}

TEST_F(CoordinationTest, KvValueLimitIsOneMiB) {
  EXPECT_TRUE(coord_->PutValue("big", std::string(kMaxKvValueBytes, 'x')).ok());
  Status st = coord_->PutValue("bigger", std::string(kMaxKvValueBytes + 1, 'x'));
  ExpectCode(st, Code::kPayloadTooLarge);
  EXPECT_EQ(st.details()["key"], "bigger");
  ExpectCode(coord_->GetValue("bigger", 0).status(), Code::kNotFound);
  EXPECT_EQ(ValueOr(coord_->GetValue("big", 0)).size(), kMaxKvValueBytes);
}

TEST_F(CoordinationTest, KvKeysObeyTheNameRules) {
  const std::vector<std::string> keys = {"", "/a", "a/../b", "a//b", "a b", "a/", std::string(201, 'k'), "~x"};
  for (const auto& key : keys) {
    ExpectCode(coord_->PutValue(key, "v"), Code::kInvalidArgument, "key");
    ExpectCode(coord_->GetValue(key, 0).status(), Code::kInvalidArgument, "key");
    ExpectCode(coord_->DeleteValue(key), Code::kInvalidArgument, "key");
  }
}

TEST_F(CoordinationTest, KvValuesSurviveAReopen) {
  std::string binary;
  for (int i = 0; i < 1000; ++i) binary += static_cast<char>(i * 7);
  ASSERT_TRUE(coord_->PutValue("keep/bin", binary).ok());
  ASSERT_TRUE(coord_->PutValue("keep/text", "hello").ok());
  ASSERT_TRUE(coord_->PutValue("drop", "x").ok());
  ASSERT_TRUE(coord_->DeleteValue("drop").ok());
  Reopen();
  EXPECT_EQ(coord_->ListKeys("")["keys"], Json({"keep/bin", "keep/text"}));
  EXPECT_EQ(ValueOr(coord_->GetValue("keep/bin", 0)), binary);
  EXPECT_EQ(ValueOr(coord_->GetValue("keep/text", 0)), "hello");
}

TEST(Base64Test, RoundTripsEveryLengthAndRejectsGarbage) {
  std::string bytes;
  for (int n = 0; n < 300; ++n) {
    auto back = Base64Decode(Base64Encode(bytes));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    ASSERT_EQ(*back, bytes) << "length " << n;
    bytes += static_cast<char>(n * 37 + 11);
  }
  EXPECT_EQ(Base64Encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(Base64Encode("fo"), "Zm8=");
  for (const char* bad : {"Zm9", "Zm9v!mFy", "Z===", "Zm=v", "=m9v"}) {
    EXPECT_FALSE(Base64Decode(bad).ok()) << bad;
  }
}

// ---------------------------------------------------------------- preemption

const std::vector<std::string> kWorkers = {"w0", "w1", "w2", "w3"};

Json SyncBody(const std::string& worker, int64_t step, int64_t timeout_ms = kLong) {
  return {{"worker", worker}, {"step", step}, {"timeout_ms", timeout_ms}};
}

TEST_F(CoordinationTest, SyncWithoutANoticeIsFalseAtOnce) {
  auto r = coord_->SyncPreemption("m", kWorkers, SyncBody("w0", 3));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, Json({{"noticed", false}, {"sync_step", nullptr}}));
  Json state = coord_->PreemptionState("m");
  EXPECT_EQ(state["noticed"], false);
  EXPECT_TRUE(state["sync_step"].is_null());
}

TEST_F(CoordinationTest, EveryWorkerGetsMaxStepPlusOne) {
  auto notice = coord_->NoticePreemption("m", {{"reason", "maintenance"}});
  ASSERT_TRUE(notice.ok()) << notice.status().ToString();
  EXPECT_EQ((*notice)["noticed"], true);
  EXPECT_EQ((*notice)["reason"], "maintenance");
  EXPECT_TRUE((*notice)["sync_step"].is_null());
  EXPECT_GT((*notice)["noticed_at"].get<int64_t>(), 0);

  const std::vector<int64_t> steps = {5, 7, 6, 7};
  std::vector<Result<Json>> results(4, Status(Code::kInternal, "not run"));
  std::vector<std::thread> workers;
  for (int i = 0; i < 4; ++i) {
    workers.emplace_back([&, i] {
      results[i] = coord_->SyncPreemption("m", kWorkers, SyncBody(kWorkers[i], steps[i]));
    });
  }
  for (auto& t : workers) t.join();
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status().ToString();
    EXPECT_EQ((*results[i])["noticed"], true);
    EXPECT_EQ((*results[i])["sync_step"], 8) << kWorkers[i];
    EXPECT_EQ((*results[i])["reached"], false);
  }
  Json state = coord_->PreemptionState("m");
  EXPECT_EQ(state["sync_step"], 8);
  EXPECT_EQ(state["reported_steps"], Json({{"w0", 5}, {"w1", 7}, {"w2", 6}, {"w3", 7}}));

  // Decided: later calls answer at once, and the call at the sync step is the one that reached it.
  auto at = coord_->SyncPreemption("m", kWorkers, SyncBody("w2", 8, 0));
  ASSERT_TRUE(at.ok());
  EXPECT_EQ(*at, Json({{"noticed", true}, {"sync_step", 8}, {"reached", true}}));
  // A second notice keeps the first one and its decision.
  auto again = coord_->NoticePreemption("m", {{"reason", "other"}});
  EXPECT_EQ(JsonOr(again).value("reason", ""), "maintenance");
  EXPECT_EQ(JsonOr(again).value("sync_step", 0), 8);
}

TEST_F(CoordinationTest, SyncTimeoutNamesMissingWorkersAndKeepsReports) {
  ASSERT_TRUE(coord_->NoticePreemption("m", Json::object()).ok());
  auto first = coord_->SyncPreemption("m", kWorkers, SyncBody("w0", 10, 20));
  ExpectCode(first.status(), Code::kDeadlineExceeded);
  EXPECT_EQ(first.status().details()["missing_workers"], Json({"w1", "w2", "w3"}));
  EXPECT_EQ(first.status().details()["mesh"], "m");

  auto second = coord_->SyncPreemption("m", kWorkers, SyncBody("w2", 11, 20));
  ExpectCode(second.status(), Code::kDeadlineExceeded);
  EXPECT_EQ(second.status().details()["missing_workers"], Json({"w1", "w3"}));

  // w0 goes on training and reports again with a later step; the larger one counts.
  EXPECT_FALSE(coord_->SyncPreemption("m", kWorkers, SyncBody("w0", 12, 0)).ok());
  EXPECT_EQ(coord_->PreemptionState("m")["reported_steps"], Json({{"w0", 12}, {"w2", 11}}));
  EXPECT_TRUE(coord_->PreemptionState("m")["sync_step"].is_null());
}

TEST_F(CoordinationTest, SyncRejectsWorkersOutsideTheMeshAndBadBodies) {
  ASSERT_TRUE(coord_->NoticePreemption("m", Json::object()).ok());
  auto r = coord_->SyncPreemption("m", kWorkers, SyncBody("w9", 1));
  ExpectCode(r.status(), Code::kConflict, "worker");
  EXPECT_EQ(r.status().details()["worker"], "w9");
  ExpectCode(coord_->SyncPreemption("m", kWorkers, {{"step", 1}}).status(), Code::kInvalidArgument,
             "worker");
  ExpectCode(coord_->SyncPreemption("m", kWorkers, {{"worker", "w0"}}).status(),
             Code::kInvalidArgument, "step");
  ExpectCode(coord_->SyncPreemption("m", kWorkers, {{"worker", "w0"}, {"step", -1}}).status(),
             Code::kInvalidArgument, "step");
  ExpectCode(coord_->SyncPreemption("m", kWorkers, SyncBody("w0", 1, -1)).status(),
             Code::kInvalidArgument, "timeout_ms");
  ExpectCode(coord_->NoticePreemption("m", {{"reason", 5}}).status(), Code::kInvalidArgument, "reason");
  EXPECT_TRUE(coord_->PreemptionState("m")["reported_steps"].empty());
}

TEST_F(CoordinationTest, ClearingTheNoticeReleasesWaitersWithNoticedFalse) {
  ASSERT_TRUE(coord_->NoticePreemption("m", Json::object()).ok());
  Result<Json> waiting = Status(Code::kInternal, "not run");
  std::thread w([&] { waiting = coord_->SyncPreemption("m", kWorkers, SyncBody("w1", 4)); });
  ASSERT_TRUE(Eventually([&] { return !coord_->PreemptionState("m")["reported_steps"].empty(); }));
  ASSERT_TRUE(coord_->ClearPreemption("m").ok());
  w.join();
  ASSERT_TRUE(waiting.ok()) << waiting.status().ToString();
  EXPECT_EQ((*waiting)["noticed"], false);
  EXPECT_EQ(coord_->PreemptionState("m")["noticed"], false);
  EXPECT_TRUE(coord_->ClearPreemption("m").ok());  // idempotent
}

TEST_F(CoordinationTest, NoticesAndSyncStepsSurviveAReopenAndStayOutOfKv) {
  ASSERT_TRUE(coord_->NoticePreemption("a/mesh", {{"reason", "spot"}}).ok());
  ASSERT_TRUE(coord_->NoticePreemption("b", Json::object()).ok());
  ASSERT_TRUE(coord_->SyncPreemption("a/mesh", {"w0"}, SyncBody("w0", 41)).ok());
  ASSERT_TRUE(coord_->PutValue("user", "v").ok());
  Reopen();
  Json a = coord_->PreemptionState("a/mesh");
  EXPECT_EQ(a["noticed"], true);
  EXPECT_EQ(a["reason"], "spot");
  EXPECT_EQ(a["sync_step"], 42);
  EXPECT_EQ(a["reported_steps"], Json({{"w0", 41}}));
  EXPECT_EQ(coord_->PreemptionState("b")["noticed"], true);
  EXPECT_EQ(coord_->Counts()["preemption_notices"], 2);
  EXPECT_EQ(coord_->ListKeys("")["keys"], Json({"user"}));
  ASSERT_TRUE(coord_->ClearPreemption("b").ok());
  Reopen();
  EXPECT_EQ(coord_->PreemptionState("b")["noticed"], false);
  EXPECT_EQ(coord_->PreemptionState("a/mesh")["sync_step"], 42);
}

// ---------------------------------------------------------------- through Service

class ServiceCoordinationTest : public DataDirTest {
 protected:
  void Close() override { service_.reset(); }
  void Reopen() override {
    Close();
    ServiceOptions opts;
    opts.data_dir = tmp_.path() + "/data";
    opts.checkpoint_root = tmp_.path() + "/checkpoints";
    auto s = Service::Create(opts, storage::DefaultEnv());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    service_ = std::move(*s);
  }

  std::unique_ptr<Service> service_;
};

TEST_F(ServiceCoordinationTest, PreemptionNeedsAKnownMeshAndItsWorkers) {
  for (const char* name : {"a", "b"}) {
    ASSERT_TRUE(service_->RegisterWorker({{"name", name}, {"local_port", 1000}}).ok());
  }
  ASSERT_TRUE(service_->PutMesh("m", {{"axes", {{{"name", "d"}, {"size", 2}}}}, {"self_test", false}}).ok());

  ExpectCode(service_->NoticePreemption("nope", Json::object()).status(), Code::kNotFound);
  ExpectCode(service_->GetPreemption("nope").status(), Code::kNotFound);
  ExpectCode(service_->ClearPreemption("nope"), Code::kNotFound);
  ExpectCode(service_->SyncPreemption("nope", SyncBody("w-a", 1)).status(), Code::kNotFound);

  ASSERT_TRUE(service_->NoticePreemption("m", {{"reason", "test"}}).ok());
  ExpectCode(service_->SyncPreemption("m", SyncBody("w-c", 1)).status(), Code::kConflict, "worker");
  Result<Json> a = Status(Code::kInternal, "not run");
  std::thread t([&] { a = service_->SyncPreemption("m", SyncBody("w-a", 3)); });
  auto b = service_->SyncPreemption("m", SyncBody("w-b", 9));
  t.join();
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
  EXPECT_EQ((*a)["sync_step"], 10);
  EXPECT_EQ((*b)["sync_step"], 10);
  EXPECT_EQ(service_->Cluster()["preemption_notices"], 1);

  // Restart: the notice and the decision are still there; deleting the mesh drops them.
  Reopen();
  EXPECT_EQ(JsonOr(service_->GetPreemption("m")).value("sync_step", 0), 10);
  ASSERT_TRUE(service_->DeleteMesh("m").ok());
  EXPECT_EQ(service_->Cluster()["preemption_notices"], 0);
}

TEST_F(ServiceCoordinationTest, KvSurvivesAServiceRestartAndShowsInMetrics) {
  ASSERT_TRUE(service_->coordination()->PutValue("cfg/lr", "0.001").ok());
  Reopen();
  auto v = service_->coordination()->GetValue("cfg/lr", 0);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, "0.001");
  EXPECT_EQ(service_->Cluster()["kv_keys"], 1);
  EXPECT_NE(service_->RenderMetrics().find("tessera_kv_keys 1"), std::string::npos);
  EXPECT_NE(service_->RenderMetrics().find("tessera_kv_ops_total{op=\"get\",outcome=\"ok\"} 1"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera::service
