// The fault loops over the path tesserad takes: a Service whose checkpoint root and
// catalog go through a FaultEnv, and three workers in the process that answer their
// snapshot tasks as agents do on a shared file system: they write their shards through
// the same Env (storage::WriteShard) and join the save. Every I/O of a save, in turn, fails once (EIO or ENOSPC), or
// the power goes after it (MemEnv's crash model) and tesserad starts again. Each
// time: the checkpoint committed before is whole, the new one is either whole and
// listed or absent, and the garbage collector leaves no staging behind.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <memory>

#include "api/clock.h"
#include "storage/checkpoint_dir.h"
#include "storage/local_checkpoint.h"
#include "storage/rank_writer.h"
#include "storage/save_plan.h"
#include "storage/testing/fault_env.h"
#include "storage/testing/mem_env.h"
#include "storage/verify.h"
#include "tests/unit/fake_worker.h"
#include "temp_dir.h"

namespace tessera::service {
namespace {

constexpr int kRanks = 3;
const Mesh kMesh{"m", {{"d", kRanks}}, 1};

// The state every worker holds: "x" sharded over d (4 floats a rank), "r" replicated.
struct State {
  std::string x;  // the global bytes
  std::string r;
  explicit State(uint8_t seed) : x(kRanks * 16, '\0'), r(24, '\0') {
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<char>(seed + 7 * i);
    for (size_t i = 0; i < r.size(); ++i) r[i] = static_cast<char>(seed ^ (3 * i));
  }
};

const TensorMeta kX{"x", DType::kFloat32, {kRanks * 4}, Layout{{"d"}}};
const TensorMeta kR{"r", DType::kFloat32, {6}, Layout{{"unsharded"}}};

SnapshotResult SnapshotOf(int64_t rank) {
  SnapshotResult s;
  for (const TensorMeta& m : {kX, kR}) s.tensors.push_back({m, {rank}});
  return s;
}

// What an agent does with a save's snapshot task: it plans from its snapshot, writes
// its slices through `env` into the step's staging dir, and joins the save (the
// Service method the join's route calls). No report: the join is the answer.
Json Answer(Service* service, storage::Env* env, const State& state, const Json& task_json) {
  auto task = TaskFromJson(task_json);
  if (!task.ok()) return TaskReportToJson({ReportState::kFailed, 0, 0, nullptr, task.status()});
  if (task->kind != TaskKind::kSnapshot) return Json();
  SaveJoinRequest join;
  join.save.step = task->step;
  join.save.compress = task->compress;
  join.worker = "w-" + std::to_string(task->rank);
  join.job = task->job;
  join.snapshot = SnapshotOf(task->rank);
  const std::vector<TensorMeta> metas = {kR, kX};  // by name, as a snapshot lists them
  std::vector<storage::SliceToWrite> slices;
  for (const auto& p : storage::PlanSave(kMesh, metas)) {
    if (p.rank != task->rank) continue;
    const bool sharded = metas[p.tensor].name == "x";
    const std::string& global = sharded ? state.x : state.r;
    const size_t offset = static_cast<size_t>(p.slice.offsets[0]) * 4;
    slices.push_back({metas[p.tensor], p.slice, global.data() + offset, p.bytes});
  }
  Result<storage::ShardWritten> w = storage::ShardWritten{};
  if (!slices.empty()) {
    Status made = env->CreateDirs(task->staging);
    w = made.ok() ? storage::WriteShard(env, task->staging,
                                        storage::ShardFileName(task->rank, "t"), slices,
                                        storage::ShardOptions{})
                  : Result<storage::ShardWritten>(made);
  }
  if (w.ok()) {
    join.written = SaveWritten{w->raw_bytes, w->stored_bytes, storage::FragmentToJson(w->fragment), 0,
                               std::nullopt};
  } else {
    join.error = w.status();
  }
  (void)service->JoinSave("m", join);
  return Json();
}

class SaveFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    opts_.data_dir = tmp_.path() + "/data";  // the catalog's bytes stay on disk (SQLite in place)
    ASSERT_EQ(::mkdir(opts_.data_dir.c_str(), 0700), 0);
    opts_.checkpoint_root = "/root";
    opts_.job_timeout_ms = 20000;
    ASSERT_TRUE(mem_.CreateDirs(opts_.data_dir).ok());
    Open();
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_TRUE(service_->RegisterWorker({{"name", std::to_string(r)}, {"local_port", 1}}).ok());
    }
    ASSERT_TRUE(service_->PutMesh("m", {{"axes", {{{"name", "d"}, {"size", kRanks}}}},
                                        {"self_test", false}})
                    .ok());
  }
  void TearDown() override {
    Close();
  }
  void Open() {
    auto s = Service::Create(opts_, &env_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    service_ = std::move(*s);
  }
  void Close() {
    workers_.clear();
    service_.reset();
  }
  // The workers answer for `state` from now on.
  void Serve(const State& state) {
    workers_.clear();
    for (int r = 0; r < kRanks; ++r) {
      workers_.push_back(std::make_unique<FakeWorker>(
          service_.get(), "w-" + std::to_string(r),
          [this, &state](const Json& task) { return Answer(service_.get(), &env_, state, task); }));
    }
  }
  // A save of `step`; the job's end (null when it could not even start).
  Json Save(int64_t step) {
    SaveRequest request;
    request.step = step;
    request.compress = false;
    auto started = service_->StartSave("m", request);
    if (!started.ok()) return Json();
    auto job = service_->GetJob(started->value("job", ""), 30000);
    EXPECT_TRUE(job.ok()) << job.status().ToString();
    return job.ok() ? *job : Json();
  }
  // Step `step` is committed, listed, and holds exactly `state`.
  void ExpectWhole(int64_t step, const State& state, const std::string& when) {
    auto dir = storage::CommittedDir(&env_, opts_.checkpoint_root, "m", step);
    ASSERT_TRUE(dir.ok()) << when << ": " << dir.status().ToString();
    auto report = storage::VerifyCheckpoint(&env_, *dir);
    ASSERT_TRUE(report.ok() && report->ok()) << when;
    auto x = storage::ReadSlice(&env_, *dir, "x", FullSlice(kX.shape));
    auto r = storage::ReadSlice(&env_, *dir, "r", FullSlice(kR.shape));
    ASSERT_TRUE(x.ok() && r.ok()) << when;
    EXPECT_EQ(*x, state.x) << when;
    EXPECT_EQ(*r, state.r) << when;
    auto listed = service_->GetCheckpoint("m", std::to_string(step));
    ASSERT_TRUE(listed.ok()) << when;
    EXPECT_EQ((*listed)["state"], "committed") << when;
  }
  // Step `step` is nowhere: not committed, not listed as committed, no staging left
  // once the garbage collector has run.
  void ExpectAbsent(int64_t step, const std::string& when) {
    EXPECT_EQ(storage::CommittedDir(&env_, opts_.checkpoint_root, "m", step).status().code(),
              Code::kNotFound)
        << when;
    auto listed = service_->GetCheckpoint("m", std::to_string(step));
    if (listed.ok()) {
      EXPECT_NE((*listed)["state"], "committed") << when;
    }
    ASSERT_TRUE(service_->CollectGarbage().ok()) << when;
    auto names = env_.ListDir(storage::MeshDir(opts_.checkpoint_root, "m"));
    ASSERT_TRUE(names.ok()) << when;
    for (const auto& n : *names) EXPECT_NE(n[0], '.') << when << ": " << n;
  }

  testing::TempDir tmp_{"tessera_save_faults"};  // goes last
  ServiceOptions opts_;
  storage::MemEnv mem_;
  storage::FaultEnv env_{&mem_};
  std::unique_ptr<Service> service_;
  std::vector<std::unique_ptr<FakeWorker>> workers_;
};

TEST_F(SaveFaults, EveryFailingIoOfTesseradsSaveLeavesNothingVisible) {
  const State before(1), after(2);
  Serve(before);
  ASSERT_EQ(Save(1)["state"], "succeeded") << Save(1).dump();
  Serve(after);
  int failed = 0;
  for (uint64_t n = 1; n < 2000; ++n) {
    const int64_t step = 100 + static_cast<int64_t>(n);
    env_.FailAt(n, n % 2 ? storage::FaultEnv::Kind::kIoError : storage::FaultEnv::Kind::kNoSpace);
    Json job = Save(step);
    const bool fired = env_.fired();
    env_.Reset();
    const std::string when = "I/O " + std::to_string(n) + " failing";
    ExpectWhole(1, before, when);
    if (!job.is_null() && job["state"] == "succeeded") {
      ExpectWhole(step, after, when);
      if (!fired) break;  // past the last I/O of a save
    } else {
      ++failed;
      EXPECT_TRUE(fired) << when << ": " << job.dump();
      ExpectAbsent(step, when);
    }
  }
  EXPECT_GT(failed, 20) << "the save's I/O did not go through the Env";
}

TEST_F(SaveFaults, PowerLossAfterAnyIoOfTesseradsSaveKeepsCheckpointsWhole) {
  const State before(1), after(2);
  Serve(before);
  ASSERT_EQ(Save(1)["state"], "succeeded");
  int crashed = 0;
  int recovered = 0;  // jobs the restart found committed, though they ended otherwise before
  for (uint64_t n = 1; n < 2000; n += 3) {
    const int64_t step = 100 + static_cast<int64_t>(n);
    Serve(after);
    // From the Nth I/O on, nothing reaches the disk: the power is gone.
    env_.FailAt(n, storage::FaultEnv::Kind::kIoError, /*sticky=*/true);
    Json job = Save(step);
    const bool fired = env_.fired();
    Close();
    env_.Reset();
    mem_.SimulateCrash();
    Open();  // tesserad starts again on what the disk kept
    ASSERT_NE(service_, nullptr);
    const std::string when = "power lost at I/O " + std::to_string(n);
    ExpectWhole(1, before, when);
    // A save reported committed survives the power loss.
    if (!job.is_null() && job["state"] == "succeeded") ExpectWhole(step, after, when);
    if (storage::CommittedDir(&env_, opts_.checkpoint_root, "m", step).ok()) {
      ExpectWhole(step, after, when);
      // The restarted tesserad reports the save's job as it ended: it committed. (A
      // job whose record never reached the disk is not known at all.)
      if (!job.is_null()) {
        auto again = service_->GetJob(job.value("id", ""), 0);
        if (again.ok()) {
          EXPECT_EQ((*again)["state"], "succeeded") << when << ": " << again->dump();
          recovered += (*again)["result"].value("recovered", false) ? 1 : 0;
        }
      }
    } else {
      ExpectAbsent(step, when);
    }
    if (!fired) {
      EXPECT_EQ(job["state"], "succeeded") << when;
      break;
    }
    ++crashed;
  }
  EXPECT_GT(crashed, 5);
  EXPECT_GT(recovered, 0) << "no power loss fell between a commit and its job's end";
}

}  // namespace
}  // namespace tessera::service
