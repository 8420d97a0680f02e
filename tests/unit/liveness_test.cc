// Heartbeats, worker leases and job timeouts on a fake clock (fake_clock.h): a Service
// whose clock moves only when the test advances it. A worker silent for suspect_ms is
// suspect and for lease_ms dead, and a job waiting on it fails naming it; a round of tasks
// that nobody answers fails once its timeout has passed. Nothing waits in real time for a
// lease or a timeout.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <memory>

#include "eventually.h"
#include "fake_clock.h"
#include "service/service.h"
#include "storage/env.h"
#include "temp_dir.h"

namespace tessera::service {
namespace {

using tessera::testing::Eventually;

constexpr int64_t kSuspectMs = 1500;
constexpr int64_t kLeaseMs = 3000;

class Liveness : public ::testing::Test {
 protected:
  void SetUp() override {
    ServiceOptions opts;
    opts.data_dir = tmp_.path() + "/data";
    opts.checkpoint_root = tmp_.path() + "/checkpoints";
    opts.suspect_ms = kSuspectMs;
    opts.lease_ms = kLeaseMs;
    opts.job_timeout_ms = 60 * kLeaseMs;
    opts.clock = &clock_;
    auto s = Service::Create(opts, storage::DefaultEnv());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    service_ = std::move(*s);
    service_->Start();
    ASSERT_TRUE(service_->RegisterWorker({{"name", "a"}, {"local_port", 1}}).ok());
  }
  void TearDown() override {
    service_->Stop();
    service_.reset();
  }
  std::string State(const std::string& worker) {
    auto w = service_->GetWorker(worker);
    return w.ok() ? w->value("state", "") : w.status().ToString();
  }
  Json Job(const std::string& id) {
    auto j = service_->GetJob(id, 0);
    return j.ok() ? *j : Json{{"error", j.status().ToString()}};
  }
  // A save of step 1 on a one-worker mesh: its snapshot task waits for worker a.
  std::string StartSave() {
    EXPECT_TRUE(service_->PutMesh("m", {{"axes", {{{"name", "d"}, {"size", 1}}}},
                                        {"self_test", false}})
                    .ok());
    SaveRequest request;
    request.step = 1;
    auto started = service_->StartSave("m", request);
    EXPECT_TRUE(started.ok()) << started.status().ToString();
    return started.ok() ? started->value("job", "") : "";
  }

  testing::TempDir tmp_{"tessera_liveness"};  // goes last
  testing::FakeClock clock_;
  std::unique_ptr<Service> service_;
};

TEST_F(Liveness, ASilentWorkerIsSuspectThenDeadAndAHeartbeatRevivesIt) {
  EXPECT_EQ(State("w-a"), "alive");
  clock_.Advance(kSuspectMs + 1);
  ASSERT_TRUE(Eventually([&] { return State("w-a") == "suspect"; })) << State("w-a");
  ASSERT_TRUE(service_->Heartbeat("w-a").ok());
  EXPECT_EQ(State("w-a"), "alive");
  clock_.Advance(kLeaseMs + 1);
  ASSERT_TRUE(Eventually([&] { return State("w-a") == "dead"; })) << State("w-a");
  ASSERT_TRUE(service_->Heartbeat("w-a").ok());
  EXPECT_EQ(State("w-a"), "alive");
}

TEST_F(Liveness, AJobWaitingOnAWorkerThatDiesFailsNamingIt) {
  const std::string job = StartSave();
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(Eventually([&] { return Job(job).value("state", "") == "running"; })) << Job(job);
  clock_.Advance(kLeaseMs + 1);
  ASSERT_TRUE(Eventually([&] { return Job(job).value("state", "") == "failed"; })) << Job(job);
  const Json error = Job(job)["error"];
  EXPECT_EQ(error.value("details", Json::object()).value("worker", ""), "w-a") << error.dump();
}

TEST_F(Liveness, ARoundNobodyAnswersFailsOnceItsTimeoutHasPassed) {
  const std::string job = StartSave();
  ASSERT_FALSE(job.empty());
  // The round is out once its task reaches the worker, which takes it and never answers;
  // it stays alive (it heartbeats).
  ASSERT_TRUE(Eventually([&] {
    auto polled = service_->PollTasks("w-a", PollRequest{});
    return polled.ok() && !(*polled)["tasks"].empty();
  })) << Job(job);
  const int64_t timeout = 60 * kLeaseMs;
  for (int64_t moved = 0; moved + kSuspectMs / 2 < timeout; moved += kSuspectMs / 2) {
    ASSERT_TRUE(service_->Heartbeat("w-a").ok());
    clock_.Advance(kSuspectMs / 2);
  }
  EXPECT_EQ(Job(job).value("state", ""), "running") << "failed before its timeout: " << Job(job);
  clock_.Advance(kSuspectMs);
  ASSERT_TRUE(service_->Heartbeat("w-a").ok());
  ASSERT_TRUE(Eventually([&] { return Job(job).value("state", "") == "failed"; })) << Job(job);
  EXPECT_EQ(Job(job)["error"].value("code", ""), "deadline_exceeded") << Job(job).dump();
  EXPECT_EQ(State("w-a"), "alive");
}

// A task answered stays leased to its worker: the next poll answers it again, until the
// worker reports it (a report acknowledges it), and it carries the mesh the worker is in.
TEST_F(Liveness, AReportAcknowledgesALeasedTask) {
  const std::string job = StartSave();
  ASSERT_FALSE(job.empty());
  Json first;
  ASSERT_TRUE(Eventually([&] {
    auto polled = service_->PollTasks("w-a", PollRequest{0, 0, 0, ""});
    if (polled.ok()) first = *polled;
    return polled.ok() && !(*polled)["tasks"].empty();
  })) << Job(job);
  ASSERT_EQ(first["meshes"].size(), 1u) << first.dump();
  EXPECT_EQ(first["meshes"][0]["name"], "m");
  EXPECT_EQ(first["meshes"][0]["workers"], Json::array({"w-a"}));
  const std::string task = first["tasks"][0]["id"];
  // Lost: asked again with nothing acknowledged, the same task comes.
  auto again = service_->PollTasks("w-a", PollRequest{});
  ASSERT_TRUE(again.ok());
  ASSERT_EQ((*again)["tasks"].size(), 1u) << again->dump();
  EXPECT_EQ((*again)["tasks"][0]["id"], task);
  // A snapshot task is answered by the worker's join, not by a report, so its job knows no
  // report of it (not_found); the report still tells tesserad that the worker has it.
  EXPECT_EQ(service_->ReportTask("w-a", task, {{"state", "running"},
                                               {"progress", {{"done_bytes", 0}, {"total_bytes", 1}}}})
                .code(),
            Code::kNotFound);
  auto after = service_->PollTasks("w-a", PollRequest{});
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE((*after)["tasks"].empty()) << after->dump();
}

}  // namespace
}  // namespace tessera::service
