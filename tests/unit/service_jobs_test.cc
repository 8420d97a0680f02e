// tesserad's jobs without a cluster: the pure step of a save (what it makes of the
// workers' snapshot reports), and the job engine driven by fake workers that poll
// and report through the same Service methods the HTTP routes call.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <mutex>
#include <thread>

#include "service/save_job.h"
#include "service/service.h"
#include "storage/env.h"
#include "storage/testing/fault_env.h"
#include "tests/unit/eventually.h"
#include "tests/unit/fake_worker.h"
#include "temp_dir.h"

namespace tessera::service {
namespace {

const Mesh kMesh{"m", {{"d", 2}}, 1};

SaveRequest SaveAt(int64_t step) {
  SaveRequest r;
  r.step = step;
  return r;
}
const std::vector<std::string> kWorkers = {"w-a", "w-b"};

Json Tensor(const std::string& name, std::vector<int64_t> devices, Shape shape = {4, 2},
            const std::string& dtype = "float32") {
  return {{"name", name}, {"dtype", dtype}, {"shape", shape}, {"layout", {"d", "unsharded"}},
          {"devices", devices}};
}

std::map<int64_t, SnapshotResult> Reports(Json rank0, Json rank1) {
  std::map<int64_t, SnapshotResult> out;
  for (auto& [rank, tensors] : {std::pair<int64_t, Json>{0, rank0}, {1, rank1}}) {
    auto r = SnapshotResultFromJson({{"tensors", tensors}});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) out[rank] = *r;
  }
  return out;
}

void ExpectNames(const Status& st, const std::string& tensor, const std::string& worker,
                 int64_t rank) {
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  const Json& d = st.details();
  ASSERT_TRUE(d.is_object()) << st.ToString();
  EXPECT_EQ(d.value("tensor", ""), tensor) << st.ToString();
  EXPECT_EQ(d.value("worker", ""), worker) << st.ToString();
  EXPECT_EQ(d.value("rank", int64_t{-1}), rank) << st.ToString();
}

TEST(CollectSnapshotTensors, TakesRankZerosOrderWhenEveryWorkerAgrees) {
  auto metas = CollectSnapshotTensors(
      kMesh, kWorkers,
      Reports({Tensor("b", {0}), Tensor("a", {0})}, {Tensor("a", {1}), Tensor("b", {1})}));
  ASSERT_TRUE(metas.ok()) << metas.status().ToString();
  ASSERT_EQ(metas->size(), 2u);
  EXPECT_EQ((*metas)[0].name, "b");
  EXPECT_EQ((*metas)[1].name, "a");
  EXPECT_EQ((*metas)[1].shape, (Shape{4, 2}));
  EXPECT_EQ((*metas)[1].layout.ToString(), "d,unsharded");
}

TEST(CollectSnapshotTensors, EveryDisagreementNamesTensorWorkerAndRank) {
  // A shard on a device the worker does not own.
  ExpectNames(CollectSnapshotTensors(kMesh, kWorkers,
                                     Reports({Tensor("a", {0})}, {Tensor("a", {0})}))
                  .status(),
              "a", "w-b", 1);
  // Only rank 1 holds it.
  ExpectNames(CollectSnapshotTensors(kMesh, kWorkers,
                                     Reports({Tensor("a", {0})}, {Tensor("a", {1}), Tensor("x", {1})}))
                  .status(),
              "x", "w-a", 0);
  // Rank 1 lacks it.
  ExpectNames(CollectSnapshotTensors(kMesh, kWorkers,
                                     Reports({Tensor("a", {0}), Tensor("y", {0})}, {Tensor("a", {1})}))
                  .status(),
              "y", "w-b", 1);
  // Described differently: the message has both descriptions.
  Status st = CollectSnapshotTensors(kMesh, kWorkers,
                                     Reports({Tensor("a", {0})}, {Tensor("a", {1}, {8, 2})}))
                  .status();
  ExpectNames(st, "a", "w-b", 1);
  EXPECT_NE(st.message().find("float32[4,2]"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("float32[8,2]"), std::string::npos) << st.ToString();
  st = CollectSnapshotTensors(kMesh, kWorkers,
                              Reports({Tensor("a", {0})}, {Tensor("a", {1}, {4, 2}, "int8")}))
           .status();
  ExpectNames(st, "a", "w-b", 1);
}

TEST(CollectSnapshotTensors, MalformedOrEmptyReportsAreClearErrors) {
  Status st = CollectSnapshotTensors(kMesh, kWorkers, Reports(Json::array(), Json::array())).status();
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("no tensors to save"), std::string::npos) << st.ToString();
  Json bad = Tensor("a", {1});
  bad["dtype"] = "float8";
  EXPECT_EQ(SnapshotResultFromJson({{"tensors", {bad}}}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(SnapshotResultFromJson("x").status().code(), Code::kInvalidArgument);
  // A layout that does not fit the mesh (a create-or-join body is untrusted input).
  Json unfit = Tensor("a", {0}, {3, 2});
  st = CollectSnapshotTensors(kMesh, kWorkers, Reports({unfit}, {Tensor("a", {1}, {3, 2})}))
           .status();
  ExpectNames(st, "a", "w-a", 0);
  Json unnamed = Tensor("../a", {0});
  ExpectNames(CollectSnapshotTensors(kMesh, kWorkers, Reports({unnamed}, {unnamed})).status(),
              "../a", "w-a", 0);
  st = CollectSnapshotTensors(kMesh, kWorkers, {{5, SnapshotResult{}}}).status();
  EXPECT_EQ(st.code(), Code::kInternal);
}

// ---------------------------------------------------------------- with fake workers

class ServiceJobsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    opts_.data_dir = tmp_.path() + "/data";
    opts_.checkpoint_root = tmp_.path() + "/checkpoints";
    Open();
    for (const char* name : {"a", "b"}) {
      ASSERT_TRUE(service_->RegisterWorker({{"name", name}, {"local_port", 1000}}).ok());
    }
    for (const char* mesh : {"m", "n"}) {
      ASSERT_TRUE(service_->PutMesh(mesh, {{"axes", {{{"name", "d"}, {"size", 2}}}}, {"self_test", false}})
                      .ok());
    }
  }
  // (Re)opens the service on tmp_.path().
  void Open() {
    service_.reset();
    auto s = Service::Create(opts_, storage::DefaultEnv());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    service_ = std::move(*s);
  }
  void TearDown() override {
    service_.reset();
  }
  // Starts a save of step 1 and waits for its end.
  Json SaveAndWait() {
    auto started = service_->StartSave("m", SaveAt(1));
    EXPECT_TRUE(started.ok()) << started.status().ToString();
    if (!started.ok()) return Json();
    auto job = service_->GetJob(started->value("job", ""), 20000);
    EXPECT_TRUE(job.ok());
    return job.ok() ? *job : Json();
  }

  testing::TempDir tmp_{"tessera_service_jobs_test"};  // goes last
  ServiceOptions opts_;
  std::unique_ptr<Service> service_;
};

Json Succeeded(Json result) { return {{"state", "succeeded"}, {"result", std::move(result)}}; }

TEST_F(ServiceJobsTest, ASaveWhoseWorkersDisagreeFailsNamingTheWorker) {
  auto answer = [](int64_t device, Shape shape) {
    return [device, shape](const Json&) {
      return Succeeded({{"tensors", {Tensor("weights", {device}, shape)}}});
    };
  };
  FakeWorker a(service_.get(), "w-a", answer(0, {4, 2}));
  FakeWorker b(service_.get(), "w-b", answer(1, {6, 2}));
  Json job = SaveAndWait();
  EXPECT_EQ(job["state"], "failed") << job.dump();
  EXPECT_EQ(job["error"]["details"]["worker"], "w-b") << job.dump();
  EXPECT_EQ(job["error"]["details"]["tensor"], "weights") << job.dump();
  auto ck = service_->GetCheckpoint("m", "1");
  ASSERT_TRUE(ck.ok());
  EXPECT_EQ((*ck)["state"], "failed");
  // The step may be saved again once the failed attempt is over.
  auto again = service_->StartSave("m", SaveAt(1));
  EXPECT_TRUE(again.ok()) << again.status().ToString();
}

TEST_F(ServiceJobsTest, AWorkersFailureBecomesTheJobsErrorWithItsRank) {
  FakeWorker a(service_.get(), "w-a",
               [](const Json&) { return Succeeded({{"tensors", {Tensor("t", {0})}}}); });
  FakeWorker b(service_.get(), "w-b", [](const Json&) {
    return Json{{"state", "failed"},
                {"error", ErrorBody(ResourceExhausted("disk full: write shard-1.tsr",
                                                      {{"file", "shard-1.tsr"}}))["error"]}};
  });
  Json job = SaveAndWait();
  EXPECT_EQ(job["state"], "failed") << job.dump();
  EXPECT_EQ(job["error"]["code"], "resource_exhausted") << job.dump();
  EXPECT_EQ(job["error"]["details"]["rank"], 1) << job.dump();
  EXPECT_EQ(job["error"]["details"]["file"], "shard-1.tsr") << job.dump();
  EXPECT_NE(job["error"]["message"].get<std::string>().find("worker w-b (rank 1)"),
            std::string::npos)
      << job.dump();
}

TEST_F(ServiceJobsTest, ACancelledSaveEndsCancelledAndLeavesNoCheckpoint) {
  // Nobody answers: the save waits in its snapshot phase until cancelled.
  auto started = service_->StartSave("m", SaveAt(3));
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  const std::string id = started->value("job", "");
  ASSERT_TRUE(service_->CancelJob(id).ok());
  auto job = service_->GetJob(id, 20000);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ((*job)["state"], "cancelled") << job->dump();
  auto latest = service_->GetCheckpoint("m", "latest");
  EXPECT_EQ(latest.status().code(), Code::kNotFound) << latest.status().ToString();
  EXPECT_EQ(service_->CancelJob(id).status().code(), Code::kConflict);
}

// ---------------------------------------------------------------- job history

// Saves that workers fail at once: finished jobs, made quickly.
class JobHistoryTest : public ServiceJobsTest {
 protected:
  std::vector<std::string> FailedSaves(const std::string& mesh, int n) {
    FakeWorker a(service_.get(), "w-a", Fail), b(service_.get(), "w-b", Fail);
    std::vector<std::string> ids;
    for (int i = 0; i < n; ++i) {
      auto started = service_->StartSave(mesh, SaveAt(1));
      EXPECT_TRUE(started.ok()) << started.status().ToString();
      ids.push_back(started->value("job", ""));
      auto job = service_->GetJob(ids.back(), 20000);
      EXPECT_TRUE(job.ok() && (*job)["state"] == "failed") << job->dump();
    }
    return ids;
  }
  std::vector<std::string> Listed(const std::string& mesh) {
    auto page = service_->ListJobs("", "", mesh, kMaxJobsPage);
    EXPECT_TRUE(page.ok()) << page.status().ToString();
    std::vector<std::string> ids;
    for (const Json& j : Json::parse(page->json)) ids.push_back(j["id"]);
    return ids;
  }
  static Json Fail(const Json&) {
    return {{"state", "failed"}, {"error", ErrorBody(Internal("no"))["error"]}};
  }
};

TEST_F(JobHistoryTest, FinishedJobsPastTheLastNOfTheirMeshAreForgottenInMemoryAndCatalog) {
  opts_.job_history_per_mesh = 3;
  opts_.job_history_min_age_ms = 0;
  Open();
  std::vector<std::string> m = FailedSaves("m", 8);
  std::vector<std::string> n = FailedSaves("n", 2);
  service_->PruneJobHistory();
  EXPECT_EQ(Listed("m"), (std::vector<std::string>{m[7], m[6], m[5]}));
  EXPECT_EQ(Listed("n"), (std::vector<std::string>{n[1], n[0]}));  // each mesh has its own N
  auto gone = service_->GetJob(m[4], 0);
  EXPECT_EQ(gone.status().code(), Code::kNotFound) << gone.status().ToString();
  // The checkpoint record of a failed save is not a job: it stays.
  EXPECT_TRUE(service_->GetCheckpoint("m", "1").ok());
  // The catalog forgot them too: a restarted tesserad lists the same.
  Open();
  EXPECT_EQ(Listed("m"), (std::vector<std::string>{m[7], m[6], m[5]}));
  // A new job after the restart still sorts first.
  std::vector<std::string> more = FailedSaves("m", 1);
  EXPECT_EQ(Listed("m").front(), more[0]);
}

TEST_F(JobHistoryTest, JobsYoungerThanTheMinimumAgeStayPastTheLastN) {
  opts_.job_history_per_mesh = 1;
  opts_.job_history_min_age_ms = 3600 * 1000;
  Open();
  std::vector<std::string> m = FailedSaves("m", 4);
  service_->PruneJobHistory();
  EXPECT_EQ(Listed("m").size(), 4u);
}

TEST_F(JobHistoryTest, ListingPagesNewestFirstWithACursorAndACappedLimit) {
  std::vector<std::string> m = FailedSaves("m", 7);
  std::vector<std::string> seen;
  uint64_t before = 0;
  for (int i = 0; i < 4; ++i) {
    auto page = service_->ListJobs("", "save", "m", 3, before);
    ASSERT_TRUE(page.ok()) << page.status().ToString();
    const Json jobs = Json::parse(page->json);
    for (const Json& j : jobs) seen.push_back(j["id"]);
    if (jobs.size() < 3) break;
    EXPECT_EQ(page->last_seq, jobs.back()["seq"].get<uint64_t>());
    before = page->last_seq;
  }
  EXPECT_EQ(seen, (std::vector<std::string>(m.rbegin(), m.rend())));
  for (int64_t limit : {int64_t{0}, int64_t{-1}, kMaxJobsPage + 1}) {
    auto r = service_->ListJobs("", "", "", limit);
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << limit;
    EXPECT_EQ(r.status().details().value("field", ""), "limit");
  }
}

// A save's workers answer with their joins: its job lists its workers with their joins,
// no task to report on, and a report of a task nobody knows is not_found.
TEST_F(JobHistoryTest, ASavesJobHasNoTasksAndAStrangersReportIsNotFound) {
  std::vector<std::string> m = FailedSaves("m", 1);
  auto job = service_->GetJob(m[0], 0);
  ASSERT_TRUE(job.ok());
  ASSERT_EQ((*job)["workers"].size(), 2u) << job->dump();
  for (const Json& w : (*job)["workers"]) {
    EXPECT_FALSE(w.contains("task")) << job->dump();
    EXPECT_TRUE(w["state"] == "waiting" || w["state"] == "joined") << job->dump();
  }
  EXPECT_EQ(service_->ReportTask("w-a", "t-unknown", Fail(Json())).code(), Code::kNotFound);
}

}  // namespace
}  // namespace tessera::service

namespace tessera::service {
namespace {

// The catalog goes through the injected Env (its SQLite files announce every change to
// it), so a fault loop reaches it: fail the Nth change of a mesh's registration, for
// N = 1, 2, ... until it succeeds. Each failure names the catalog, leaves the mesh
// unregistered in memory and on disk (a reopened tesserad does not see it), and marks
// /healthz degraded; the registration that succeeds is there after a reopen. The
// mesh's document in the checkpoint root goes through the same Env, and its failures
// leave the mesh unregistered as well.
TEST(CatalogFaults, EveryFailedCatalogChangeLeavesTheMeshUnregistered) {
  char tmpl[] = "/tmp/tessera_catalog_faults.XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  storage::FaultEnv env(storage::DefaultEnv());
  ServiceOptions opts;
  opts.data_dir = dir + "/data";
  opts.checkpoint_root = dir + "/checkpoints";
  auto open = [&] {
    auto s = Service::Create(opts, &env);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  };
  {
    auto svc = open();
    ASSERT_NE(svc, nullptr);
    ASSERT_TRUE(svc->RegisterWorker({{"name", "a"}, {"local_port", 1}}).ok());
  }
  const Json mesh = {{"axes", {{{"name", "d"}, {"size", 1}}}}, {"self_test", false}};
  int failures = 0;
  for (uint64_t n = 1; n < 200; ++n) {
    auto svc = open();
    ASSERT_NE(svc, nullptr);
    ASSERT_TRUE(svc->Heartbeat("w-a").ok());  // alive again after the reopen
    env.FailAt(n, n % 2 ? storage::FaultEnv::Kind::kNoSpace : storage::FaultEnv::Kind::kIoError);
    auto put = svc->PutMesh("m", mesh);
    const bool fired = env.fired();
    env.Reset();
    if (put.ok()) {
      ASSERT_FALSE(fired) << "n=" << n;
      break;
    }
    ++failures;
    ASSERT_TRUE(fired) << "n=" << n << ": " << put.status().ToString();
    // The catalog's row, or the mesh's document in the checkpoint root: named.
    const bool in_catalog = put.status().message().find("the catalog refused it") != std::string::npos;
    const bool in_root = put.status().message().find("the checkpoint root refused it") !=
                         std::string::npos;
    EXPECT_TRUE(in_catalog || in_root) << "n=" << n << ": " << put.status().ToString();
    if (n % 2) {
      EXPECT_EQ(put.status().code(), Code::kResourceExhausted) << put.status().ToString();
    }
    EXPECT_EQ(svc->GetMesh("m").status().code(), Code::kNotFound) << "n=" << n;
    if (in_catalog) {
      EXPECT_EQ(svc->Health()["status"], "degraded");
    }
    svc.reset();
    auto reopened = open();
    ASSERT_NE(reopened, nullptr);
    EXPECT_EQ(reopened->GetMesh("m").status().code(), Code::kNotFound) << "n=" << n;
    EXPECT_EQ(reopened->ListWorkers().size(), 1u) << "n=" << n;
  }
  EXPECT_GT(failures, 0) << "no catalog change went past the Env";
  auto svc = open();
  ASSERT_NE(svc, nullptr);
  EXPECT_TRUE(svc->GetMesh("m").ok());
  svc.reset();
  EXPECT_TRUE(storage::DefaultEnv()->DeleteTree(dir).ok());
}

}  // namespace
}  // namespace tessera::service
