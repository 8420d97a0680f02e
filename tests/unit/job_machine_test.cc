// The jobs' state machines, driven by events alone: no threads, no sleeps, a clock
// that is a number in each event. Each test replays an interaction (task reports,
// deaths, joins, cancels, ticks) and checks the actions the loop would carry out.
#include <gtest/gtest.h>

#include "service/restore_machine.h"
#include "service/verify_machine.h"
#include "service/collective_machine.h"
#include "service/safetensors_machines.h"
#include "service/save_machine.h"

namespace tessera::service {
namespace {

using Kind = JobAction::Kind;

const Mesh kMesh{"m", {{"d", 2}}, 1};

JobSpec Spec(int64_t timeout_ms = 1000) {
  MeshRecord mesh;
  mesh.mesh = kMesh;
  mesh.workers = {"w-a", "w-b"};
  JobSpec spec = JobSpec::Of("j-1", mesh, 7, timeout_ms);
  spec.staging = "/root/m/.staging-7-j-1";
  return spec;
}

SnapshotResult Snapshot(int64_t device) {
  SnapshotTensor t;
  t.meta = TensorMeta{"x", DType::kFloat32, {4}, Layout{{"d"}}};
  t.devices = {device};
  return SnapshotResult{{t}, 8};
}

const JobAction* Find(const JobActions& actions, Kind kind) {
  for (const auto& a : actions) {
    if (a.kind == kind) return &a;
  }
  return nullptr;
}

// A copy of the finish among `actions` (the test fails without one).
JobAction Finished(const JobActions& actions) {
  const JobAction* f = Find(actions, Kind::kFinish);
  EXPECT_NE(f, nullptr);
  return f ? *f : JobAction{};
}

JobEvent Done(int64_t now, int64_t round, int64_t rank, Json result = Json::object()) {
  return JobEvent::TaskSucceeded(now, round, rank, std::move(result));
}

// Rank `rank`'s join: its snapshot (tensor x on `device`) and the half of x it wrote.
SaveJoinRequest Join(int64_t rank, int64_t device) {
  SaveJoinRequest j;
  j.worker = rank == 0 ? "w-a" : "w-b";
  j.snapshot = Snapshot(device);
  storage::FragmentSlice s;
  s.tensor = j.snapshot.tensors[0].meta;
  s.slice = SliceSpec{{2 * rank}, {2}};
  s.file = "shard-" + std::to_string(rank) + "-t.tsr";
  s.chunks.push_back({0, {0, 8, 8, 42, storage::Codec::kRaw}, {}});
  j.written = SaveWritten{8, 8, storage::FragmentToJson({s}), 0, std::nullopt};
  return j;
}
SaveJoinRequest Join(int64_t rank) { return Join(rank, rank); }

// A REST save through every phase: snapshot tasks sent, the joins (each the worker's
// write and report in one), merge, commit, retention.
TEST(SaveMachine, WalksEveryPhaseToTheCommit) {
  SaveRequest request;
  request.step = 7;
  SaveMachine m(Spec(), request, /*from_loop=*/false, 0);
  JobActions a = m.Step(JobEvent::Start(0));
  EXPECT_EQ(Find(a, Kind::kQueueTasks), nullptr);  // no round: the answers are joins
  ASSERT_NE(Find(a, Kind::kSendTasks), nullptr);
  const JobAction snap = *Find(a, Kind::kSendTasks);
  EXPECT_EQ(snap.tasks.size(), 2u);
  EXPECT_EQ(snap.tasks.at(1).kind, TaskKind::kSnapshot);
  EXPECT_EQ(snap.tasks.at(1).staging, "/root/m/.staging-7-j-1");
  EXPECT_EQ(Find(a, Kind::kSetCheckpointState)->checkpoint_state, CheckpointState::kWriting);
  EXPECT_EQ(m.phase(), "write");
  EXPECT_EQ(m.deadline_ms(), 1000);
  a = m.Step(JobEvent::Joined(5, 0, Join(0)));  // the job's progress only
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, Kind::kSetProgress);
  a = m.Step(JobEvent::Joined(6, 1, Join(1)));
  const JobAction* merge = Find(a, Kind::kRunIo);
  ASSERT_NE(merge, nullptr);
  EXPECT_EQ(merge->io, IoKind::kMerge);
  ASSERT_EQ(merge->slices.size(), 2u);
  EXPECT_EQ(merge->slices[1][0].file, "shard-1-t.tsr");
  EXPECT_EQ(Find(a, Kind::kSetCheckpointState)->checkpoint_state, CheckpointState::kMerging);
  EXPECT_EQ(m.phase(), "merge");
  a = m.Step(JobEvent::IoDone(10, Json::object()));
  EXPECT_EQ(Find(a, Kind::kRunIo)->io, IoKind::kCommit);
  EXPECT_EQ(Find(a, Kind::kRunIo)->plan.size(), 2u);
  // A cancel once the commit has begun changes nothing, nor does a death.
  EXPECT_TRUE(m.Step(JobEvent::Cancel(11)).empty());
  EXPECT_TRUE(m.Step(JobEvent::WorkerDead(11, "w-a", 3000)).empty());
  a = m.Step(JobEvent::IoDone(12, Json{{"checkpoint", {{"step", 7}}}}));
  EXPECT_EQ(Find(a, Kind::kRunIo)->io, IoKind::kRetention);
  a = m.Step(JobEvent::IoDone(13, Json{{"retention_error", {{"code", "internal"}}}}));
  const JobAction f = Finished(a);
  EXPECT_TRUE(f.status.ok());
  EXPECT_EQ(f.result["checkpoint"]["step"], 7);
  EXPECT_EQ(f.result["retention_error"]["code"], "internal");
  EXPECT_TRUE(m.ended());
  EXPECT_TRUE(m.Step(JobEvent::Tick(1 << 30)).empty());
}

TEST(SaveMachine, AJoinWithAnErrorAbandonsNamingTheWorkerAndRank) {
  SaveMachine m(Spec(), SaveRequest{}, false, 0);
  m.Step(JobEvent::Start(0));
  SaveJoinRequest failed = Join(1);
  failed.written.reset();
  failed.error = ResourceExhausted("disk full");
  JobActions a = m.Step(JobEvent::Joined(3, 1, failed));
  const JobAction f = Finished(a);
  EXPECT_EQ(f.status.code(), Code::kResourceExhausted);
  EXPECT_EQ(f.status.details().value("worker", ""), "w-b");
  EXPECT_EQ(f.status.details().value("rank", -1), 1);
  EXPECT_NE(f.status.message().find("worker w-b (rank 1)"), std::string::npos);
  ASSERT_NE(Find(a, Kind::kAbandonSave), nullptr);
  EXPECT_LT(Find(a, Kind::kAbandonSave) - a.data(), Find(a, Kind::kFinish) - a.data());
}

TEST(SaveMachine, ADeadWorkerFailsTheSaveUntilTheCommitJoinedOrNot) {
  SaveMachine m(Spec(), SaveRequest{}, true, 2000);
  m.Step(JobEvent::Start(0));
  m.Step(JobEvent::Joined(1, 0, Join(0)));
  EXPECT_TRUE(m.Step(JobEvent::WorkerDead(2, "w-zz", 3000)).empty());  // a stranger
  const JobAction f = Finished(m.Step(JobEvent::WorkerDead(3, "w-a", 3100)));
  EXPECT_EQ(f.status.code(), Code::kUnavailable);
  EXPECT_NE(f.status.message().find("no heartbeat for 3100 ms"), std::string::npos);
  EXPECT_NE(f.status.message().find("had joined"), std::string::npos);
  EXPECT_EQ(f.status.details().value("rank", -1), 0);

  SaveMachine n(Spec(), SaveRequest{}, true, 2000);
  n.Step(JobEvent::Start(0));
  n.Step(JobEvent::Joined(1, 0, Join(0)));
  const JobAction g = Finished(n.Step(JobEvent::WorkerDead(3, "w-b", 3000)));
  EXPECT_EQ(g.status.details().value("worker", ""), "w-b");
  EXPECT_NE(g.status.message().find("had not joined"), std::string::npos);
}

TEST(SaveMachine, TheJoinsTimeOutOnTheClockNamingMissingRanks) {
  SaveMachine m(Spec(/*timeout_ms=*/500), SaveRequest{}, false, 0);
  m.Step(JobEvent::Start(100));
  m.Step(JobEvent::Joined(200, 1, Join(1)));
  EXPECT_TRUE(m.Step(JobEvent::Tick(600)).empty());  // not yet: the deadline is 600
  const JobAction f = Finished(m.Step(JobEvent::Tick(601)));
  EXPECT_EQ(f.status.code(), Code::kDeadlineExceeded);
  EXPECT_EQ(f.status.details()["missing_ranks"], Json({0}));
  EXPECT_NE(f.status.message().find("did not snapshot and write step 7"), std::string::npos);

  SaveMachine late(Spec(), SaveRequest{}, true, 2000);
  late.Step(JobEvent::Start(0));
  late.Step(JobEvent::Joined(1, 1, Join(1)));
  const JobAction g = Finished(late.Step(JobEvent::Tick(2001)));
  EXPECT_EQ(g.status.code(), Code::kDeadlineExceeded);
  EXPECT_EQ(g.status.details()["workers"], Json({"w-a"}));
  EXPECT_NE(g.status.message().find("did not call save(7)"), std::string::npos);
}

TEST(SaveMachine, ACancelDuringIoEndsTheJobWhenTheStepIsDone) {
  SaveMachine m(Spec(), SaveRequest{}, false, 0);
  m.Step(JobEvent::Start(0));
  m.Step(JobEvent::Joined(1, 0, Join(0)));
  m.Step(JobEvent::Joined(1, 1, Join(1)));  // → merge
  EXPECT_TRUE(m.Step(JobEvent::Cancel(2)).empty());
  const JobAction f = Finished(m.Step(JobEvent::IoDone(3, Json::object())));
  EXPECT_TRUE(IsCancelled(f.status)) << f.status.ToString();
  // While the joins are awaited, a cancel ends the job at once.
  SaveMachine n(Spec(), SaveRequest{}, false, 0);
  n.Step(JobEvent::Start(0));
  EXPECT_TRUE(IsCancelled(Finished(n.Step(JobEvent::Cancel(1))).status));
}

TEST(SaveMachine, InLoopJoinsNeedNoTaskAndARepeatedJoinChangesNothing) {
  SaveMachine m(Spec(), SaveRequest{}, /*from_loop=*/true, /*join_wait_ms=*/2000);
  JobActions a = m.Step(JobEvent::Start(0));
  EXPECT_EQ(Find(a, Kind::kSendTasks), nullptr);  // no task goes to the workers
  EXPECT_EQ(m.deadline_ms(), 2000);
  EXPECT_EQ(Find(m.Step(JobEvent::Joined(1, 1, Join(1))), Kind::kRunIo), nullptr);
  EXPECT_TRUE(m.Step(JobEvent::Joined(2, 1, Join(1))).empty());  // a repeated join
  a = m.Step(JobEvent::Joined(3, 0, Join(0)));
  ASSERT_NE(Find(a, Kind::kRunIo), nullptr);
  EXPECT_EQ(Find(a, Kind::kRunIo)->io, IoKind::kMerge);
}

TEST(SaveMachine, SnapshotsThatDisagreeFailBeforeTheMerge) {
  SaveMachine m(Spec(), SaveRequest{}, true, 2000);
  m.Step(JobEvent::Start(0));
  m.Step(JobEvent::Joined(1, 0, Join(0)));
  JobActions a = m.Step(JobEvent::Joined(2, 1, Join(1, /*device=*/0)));  // rank 1 claims device 0
  EXPECT_EQ(Find(a, Kind::kRunIo), nullptr);
  const JobAction f = Finished(a);
  EXPECT_EQ(f.status.details().value("rank", -1), 1);
  EXPECT_NE(Find(a, Kind::kAbandonSave), nullptr);
}

// Each fragment is checked against the plan every worker computes: a slice the plan
// gives another rank, a slice missing, another worker's file, a described tensor that
// differs from the snapshot.
TEST(SaveMachine, FragmentsThatDisagreeWithThePlanFailNamingTheWorker) {
  auto fails = [](SaveJoinRequest bad, const std::string& says) {
    SaveMachine m(Spec(), SaveRequest{}, true, 2000);
    m.Step(JobEvent::Start(0));
    m.Step(JobEvent::Joined(1, 0, Join(0)));
    const JobAction f = Finished(m.Step(JobEvent::Joined(2, 1, std::move(bad))));
    EXPECT_EQ(f.status.code(), Code::kInvalidArgument) << f.status.ToString();
    EXPECT_EQ(f.status.details().value("worker", ""), "w-b");
    EXPECT_NE(f.status.message().find(says), std::string::npos) << f.status.ToString();
  };
  SaveJoinRequest other = Join(1);
  other.written->fragment[0]["slice"]["offsets"] = {0};
  fails(other, "which the plan does not give it");
  SaveJoinRequest none = Join(1);
  none.written->fragment = Json::array();
  fails(none, "lacks slice");
  SaveJoinRequest stolen = Join(1);
  stolen.written->fragment[0]["file"] = "shard-0-t.tsr";
  fails(stolen, "not one of its own");
  SaveJoinRequest torn = Join(1);
  torn.written->fragment[0]["chunks"][0][3] = 4;
  fails(torn, "chunks");
}

TEST(RestoreMachine, FindsTheCheckpointThenEveryRankReads) {
  std::vector<TensorMeta> tensors{{"x", DType::kFloat32, {4}, Layout{{"d"}}}};
  RestoreMachine m(Spec(), tensors, {0, 1});
  JobActions a = m.Step(JobEvent::Start(0));
  EXPECT_EQ(Find(a, Kind::kRunIo)->io, IoKind::kFindCommitted);
  EXPECT_EQ(m.phase(), "plan");
  a = m.Step(JobEvent::IoDone(1, Json{{"dir", "/root/m/step-7"}}));
  const JobAction* read = Find(a, Kind::kQueueTasks);
  ASSERT_NE(read, nullptr);
  EXPECT_EQ(read->tasks.at(0).dir, "/root/m/step-7");
  EXPECT_EQ(read->total_bytes, 16u);
  m.Step(Done(2, read->round, 0, {{"bytes", 8}, {"stored_bytes_read", 5}, {"tensors", 1}}));
  const JobAction& f =
      Finished(m.Step(Done(3, read->round, 1, {{"bytes", 8}, {"stored_bytes_read", 6}, {"tensors", 1}})));
  EXPECT_TRUE(f.status.ok());
  EXPECT_EQ(f.result["stored_bytes_read"], 11);
  EXPECT_EQ(f.result["tensors"], Json({"x"}));
}

TEST(ExportMachine, EveryWorkerWritesItsFilesThenTheIndexIsWritten) {
  const std::vector<TensorMeta> tensors{{"a", DType::kFloat32, {40}, Layout{{"d"}}},
                                        {"b", DType::kFloat32, {10}, Layout{{"unsharded"}}},
                                        {"c", DType::kFloat32, {30}, Layout{{"unsharded"}}}};
  auto files = storage::PlanExportFiles(tensors, 1 << 20, 2);
  ASSERT_EQ(files.size(), 2u);  // {a} and {b, c}: 160 and 160 bytes
  ExportMachine m(Spec(), files, "/hf");
  JobActions a = m.Step(JobEvent::Start(0));
  EXPECT_EQ(Find(a, Kind::kRunIo)->io, IoKind::kFindCommitted);
  a = m.Step(JobEvent::IoDone(1, Json{{"dir", "/root/m/step-7"}}));
  const JobAction write = *Find(a, Kind::kQueueTasks);
  ASSERT_EQ(write.tasks.size(), 2u);  // a file each
  EXPECT_EQ(write.tasks.at(0).kind, TaskKind::kExport);
  EXPECT_EQ(write.tasks.at(0).files.size() + write.tasks.at(1).files.size(), 2u);
  EXPECT_EQ(write.total_bytes, 320u);
  m.Step(Done(2, write.round, 0, {{"files", {files[0].name}}, {"bytes", 160}}));
  a = m.Step(Done(3, write.round, 1, {{"files", {files[1].name}}, {"bytes", 160}}));
  const JobAction* index = Find(a, Kind::kRunIo);
  ASSERT_NE(index, nullptr);
  EXPECT_EQ(index->io, IoKind::kWriteExportIndex);
  EXPECT_EQ(index->io_input["dir"], "/hf");
  const JobAction f = Finished(m.Step(JobEvent::IoDone(4, Json::object())));
  EXPECT_TRUE(f.status.ok());
  EXPECT_EQ(f.result["bytes"], 320);
  EXPECT_EQ(f.result["files"].size(), 2u);
}

TEST(ImportMachine, ReadsHeadersWritesSharesMergesAndCommitsOrAbandons) {
  const Json planned = {{"files", {{{"path", "/hf/1.safetensors"}, {"bytes", 100}, {"tensors", {TensorMetaToJson({"a", DType::kFloat32, {4}, Layout{{"unsharded"}}})}}},
                                   {{"path", "/hf/2.safetensors"}, {"bytes", 50}, {"tensors", {TensorMetaToJson({"b", DType::kInt8, {2, 2}, Layout{{"unsharded", "unsharded"}}})}}}}}};
  ImportMachine m(Spec(), SaveRequest{}, "/hf");
  JobActions a = m.Step(JobEvent::Start(0));
  EXPECT_EQ(Find(a, Kind::kRunIo)->io, IoKind::kReadSafetensors);
  EXPECT_EQ(Find(a, Kind::kRunIo)->io_input["source"], "/hf");
  a = m.Step(JobEvent::IoDone(1, planned));
  EXPECT_EQ(Find(a, Kind::kRunIo)->io, IoKind::kCreateStaging);
  a = m.Step(JobEvent::IoDone(2, Json::object()));
  const JobAction write = *Find(a, Kind::kQueueTasks);
  ASSERT_EQ(write.tasks.size(), 2u);
  EXPECT_EQ(write.tasks.at(0).sources, (std::vector<std::string>{"/hf/1.safetensors"}));
  EXPECT_EQ(write.tasks.at(1).tensors.at(0).name, "b");
  EXPECT_EQ(write.tasks.at(0).staging, "/root/m/.staging-7-j-1");
  m.Step(Done(3, write.round, 0, {{"fragment", "fragment-0.sqlite"}, {"bytes", 16}, {"stored_bytes", 20}}));
  a = m.Step(Done(4, write.round, 1, {{"fragment", "fragment-1.sqlite"}, {"bytes", 4}, {"stored_bytes", 8}}));
  const JobAction* merge = Find(a, Kind::kRunIo);
  ASSERT_NE(merge, nullptr);
  EXPECT_EQ(merge->io, IoKind::kMerge);
  EXPECT_EQ(merge->fragments.size(), 2u);
  EXPECT_EQ(Find(m.Step(JobEvent::IoDone(5, Json::object())), Kind::kRunIo)->io, IoKind::kCommit);
  EXPECT_TRUE(Finished(m.Step(JobEvent::IoDone(6, Json{{"checkpoint", Json::object()}}))).status.ok());

  // A bad file found by a worker: the job fails naming it, and the step is abandoned.
  ImportMachine bad(Spec(), SaveRequest{}, "/hf");
  bad.Step(JobEvent::Start(0));
  bad.Step(JobEvent::IoDone(1, planned));
  const JobAction w = *Find(bad.Step(JobEvent::IoDone(2, Json::object())), Kind::kQueueTasks);
  a = bad.Step(JobEvent::TaskFailed(3, w.round, 1, DataLoss("changed", {{"file", "/hf/2.safetensors"}})));
  EXPECT_EQ(Finished(a).status.code(), Code::kDataLoss);
  EXPECT_NE(Find(a, Kind::kAbandonSave), nullptr);
}

TEST(VerifyMachine, ACorruptCheckpointFailsWithTheReport) {
  VerifyMachine m(Spec());
  EXPECT_EQ(Find(m.Step(JobEvent::Start(0)), Kind::kRunIo)->io, IoKind::kVerify);
  Json report = {{"bad_chunks", Json::array()}, {"problems", {"shard-0.tsr is short"}}};
  const JobAction f = Finished(m.Step(JobEvent::IoDone(
      1, Json{{"report", report}, {"error", ErrorBody(DataLoss("checkpoint is corrupt"))["error"]}})));
  EXPECT_EQ(f.status.code(), Code::kDataLoss);
  EXPECT_EQ(f.result, report);
}

TEST(CollectiveMachine, AFailureMakesTheWorkersLeaveTheCollective) {
  CollectiveMachine m(Spec(), TaskKind::kCollective, {{"op", "all_reduce"}}, 3000);
  const JobAction run = *Find(m.Step(JobEvent::Start(0)), Kind::kQueueTasks);
  EXPECT_EQ(m.phase(), "all_reduce");
  EXPECT_EQ(run.tasks.at(0).timeout_ms, 3000);
  EXPECT_EQ(m.deadline_ms(), 8000);  // the workers' own timeout fires first
  JobActions a = m.Step(JobEvent::TaskFailed(1, run.round, 0, DeadlineExceeded("rank 1 missing")));
  ASSERT_NE(Find(a, Kind::kAbortCollective), nullptr);
  EXPECT_EQ(Finished(a).status.code(), Code::kDeadlineExceeded);
}

TEST(CollectiveMachine, TheSelfTestNeedsOneDeviceTable) {
  CollectiveMachine m(Spec(), TaskKind::kMeshInit, Json::object(), 3000);
  const JobAction run = *Find(m.Step(JobEvent::Start(0)), Kind::kQueueTasks);
  EXPECT_EQ(m.phase(), "self_test");
  m.Step(Done(1, run.round, 0, {{"digest", "aa"}}));
  const JobAction f = Finished(m.Step(Done(2, run.round, 1, {{"digest", "bb"}})));
  EXPECT_EQ(f.status.code(), Code::kInternal);
  EXPECT_EQ(f.status.details().value("worker", ""), "w-b");
}

TEST(JobMachine, ShutdownEndsAnyJob) {
  RestoreMachine m(Spec(), {}, {0});
  m.Step(JobEvent::Start(0));
  const JobAction f = Finished(m.Step(JobEvent::Stop(1)));
  EXPECT_EQ(f.status.code(), Code::kUnavailable);
  EXPECT_TRUE(m.ended());
}

}  // namespace
}  // namespace tessera::service
