// A job's runtime (service/job_runtime.h) with scripted effects: the effects record what
// the runtime asked of them, and answer as a script says (a join posted when tasks go
// out, a cancel that arrives while an I/O step runs, a worker found dead, an I/O step
// that fails). One thread, no sleeps: every event the runtime waits on is posted before
// it waits.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "service/job_runtime.h"
#include "service/save_machine.h"
#include "tests/unit/fake_clock.h"
#include "tests/unit/job_action_text.h"

namespace tessera::service {
namespace {

const Mesh kMesh{"m", {{"d", 2}}, 1};

JobSpec Spec() {
  MeshRecord mesh;
  mesh.mesh = kMesh;
  mesh.workers = {"w-a", "w-b"};
  JobSpec spec = JobSpec::Of("j-1", mesh, 7, 1000);
  spec.staging = "/root/m/.staging-7-w";
  spec.staging_id = "w";
  return spec;
}

// Rank `rank`'s join: tensor x [4] split over d, its half written.
SaveJoinRequest Join(int64_t rank) {
  SaveJoinRequest j;
  j.worker = rank == 0 ? "w-a" : "w-b";
  SnapshotTensor t;
  t.meta = TensorMeta{"x", DType::kFloat32, {4}, Layout{{"d"}}};
  t.devices = {rank};
  j.snapshot = SnapshotResult{{t}, 8};
  storage::FragmentSlice s;
  s.tensor = t.meta;
  s.slice = SliceSpec{{2 * rank}, {2}};
  s.file = "shard-" + std::to_string(rank) + "-t.tsr";
  s.chunks.push_back({0, {0, 8, 8, 42, storage::Codec::kRaw}, {}});
  j.written = SaveWritten{8, 8, storage::FragmentToJson({s}), 0, std::nullopt};
  return j;
}

// A status's code, "cancelled" for a cancel.
std::string CodeText(const Status& st) {
  return IsCancelled(st) ? "cancelled" : std::string(CodeName(st.code()));
}

class ScriptedEffects final : public JobEffects {
 public:
  explicit ScriptedEffects(std::shared_ptr<JobInbox> inbox) : inbox_(std::move(inbox)) {}

  std::vector<std::string> log;
  // What the script does when tasks go out / an I/O step of a kind runs.
  std::function<std::optional<JobEvent>(const JobAction&)> on_send;
  std::map<IoKind, std::function<Result<Json>()>> on_io;
  void Post(JobEvent e) { inbox_->Post(std::move(e)); }

  void SetPhase(const JobSpec&, const std::string& phase) override { log.push_back("phase " + phase); }
  void SetCheckpointState(const JobSpec&, CheckpointState s) override {
    log.push_back("checkpoint " + StateString(s));
  }
  void SetProgress(const JobSpec&, const JobAction& a) override {
    log.push_back("progress " + std::to_string(a.done_bytes) + "/" + std::to_string(a.total_bytes));
  }
  std::optional<JobEvent> QueueRound(const JobSpec&, const JobAction& a) override {
    log.push_back(ActionText(a, {}));
    return on_send ? on_send(a) : std::nullopt;
  }
  std::optional<JobEvent> SendTasks(const JobSpec&, const JobAction& a) override {
    log.push_back(ActionText(a, {}));
    return on_send ? on_send(a) : std::nullopt;
  }
  Result<Json> RunIo(const JobSpec&, const JobAction& a) override {
    JobAction shown = a;
    shown.slices.clear();
    shown.plan.clear();
    log.push_back(ActionText(shown, {}));
    auto it = on_io.find(a.io);
    return it == on_io.end() ? Result<Json>(Json::object()) : it->second();
  }
  void AbandonSave(const JobSpec&, const Status& why) override {
    log.push_back("abandon save: " + CodeText(why));
  }
  void AbortCollective(const JobSpec&, const Status& why) override {
    log.push_back("abort collective: " + CodeText(why));
  }
  void Finish(const JobSpec&, const Status& st, Json) override {
    log.push_back("finish " + CodeText(st));
  }
  int64_t NowMs() override { return clock_.MonoMs(); }

 private:
  std::shared_ptr<JobInbox> inbox_;
  testing::FakeClock clock_;
};

struct Scripted {
  testing::FakeClock clock;
  std::shared_ptr<JobInbox> inbox = std::make_shared<JobInbox>(&clock);
  ScriptedEffects effects{inbox};
  SaveMachine machine{Spec(), SaveRequest{}, /*from_loop=*/false, /*join_wait_ms=*/1000};
  Status Go() { return JobRuntime(&machine, inbox, &effects).Run(); }
};

// Both workers answer their snapshot tasks with their joins.
std::optional<JobEvent> BothJoin(ScriptedEffects& e) {
  e.Post(JobEvent::Joined(1, 0, Join(0)));
  e.Post(JobEvent::Joined(2, 1, Join(1)));
  return std::nullopt;
}

TEST(JobRuntime, CarriesOutEveryActionInOrderAndFeedsBackTheIoResults) {
  Scripted r;
  r.effects.on_send = [&](const JobAction&) { return BothJoin(r.effects); };
  ASSERT_TRUE(r.Go().ok());
  EXPECT_EQ(r.effects.log, (std::vector<std::string>{
                               "phase write", "checkpoint writing", "progress 0/0",
                               "send tasks: rank 0 snapshot(step 7), rank 1 snapshot(step 7)",
                               "progress 8/16", "progress 16/16", "phase merge", "checkpoint merging", "io merge",
                               "phase commit", "io commit", "phase retention",
                               "io retention", "finish ok"}));
}

// A cancel posted while the merge runs is seen before the merge's result: the save is
// abandoned, and no commit runs.
TEST(JobRuntime, ACancelThatArrivesDuringAnIoStepComesBeforeItsResult) {
  Scripted r;
  r.effects.on_send = [&](const JobAction&) { return BothJoin(r.effects); };
  r.effects.on_io[IoKind::kMerge] = [&]() -> Result<Json> {
    r.effects.Post(JobEvent::Cancel(3));
    return Json::object();
  };
  EXPECT_TRUE(IsCancelled(r.Go()));
  ASSERT_GE(r.effects.log.size(), 2u);
  EXPECT_EQ(r.effects.log[r.effects.log.size() - 2], "abandon save: cancelled");
  EXPECT_EQ(r.effects.log.back(), "finish cancelled");
  for (const std::string& line : r.effects.log) EXPECT_EQ(line.find("io commit"), std::string::npos);
}

// A worker found dead when the tasks go out is the runtime's own event: the job fails
// naming it.
TEST(JobRuntime, AWorkerFoundDeadWhenTasksGoOutFailsTheJobNamingIt) {
  Scripted r;
  r.effects.on_send = [&](const JobAction&) -> std::optional<JobEvent> {
    return JobEvent::WorkerDead(1, "w-b", 9000);
  };
  Status st = r.Go();
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.ToString();
  EXPECT_EQ(st.details().value("worker", ""), "w-b");
  EXPECT_EQ(r.effects.log.back(), "finish unavailable");
}

// An I/O step that fails fails the job: the save is abandoned, and nothing after the
// step runs.
TEST(JobRuntime, AFailedIoStepAbandonsTheSave) {
  Scripted r;
  r.effects.on_send = [&](const JobAction&) { return BothJoin(r.effects); };
  r.effects.on_io[IoKind::kCommit] = []() -> Result<Json> {
    return ResourceExhausted("disk full", {{"file", "index.sqlite"}});
  };
  Status st = r.Go();
  EXPECT_EQ(st.code(), Code::kResourceExhausted) << st.ToString();
  const std::vector<std::string> tail(r.effects.log.end() - 3, r.effects.log.end());
  EXPECT_EQ(tail, (std::vector<std::string>{"io commit", "abandon save: resource_exhausted",
                                            "finish resource_exhausted"}));
}

}  // namespace
}  // namespace tessera::service
