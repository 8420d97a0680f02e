// tesserad's registries, each alone: what a job holds cannot be deleted under it, a
// step is reserved by one save at a time, a round of tasks reaches every worker or
// none, and a newer long-poll of a worker supersedes the older one.
#include <gtest/gtest.h>

#include <thread>

#include "api/clock.h"
#include "service/base_use.h"
#include "service/checkpoint_registry.h"
#include "service/job_registry.h"
#include "service/mesh_registry.h"
#include "service/worker_registry.h"

namespace tessera::service {
namespace {

MeshRecord MeshOf(const std::string& name, std::vector<std::string> workers) {
  MeshRecord m;
  m.mesh = Mesh{name, {{"d", static_cast<int64_t>(workers.size())}}, 1};
  m.workers = std::move(workers);
  return m;
}

TEST(MeshRegistry, AHeldMeshCannotBeRemovedAndNamesItsJob) {
  MeshRegistry meshes;
  EXPECT_FALSE(meshes.Add(MeshOf("m", {"w-a", "w-b"})).has_value());
  // A second registration under the name answers the first record.
  auto again = meshes.Add(MeshOf("m", {"w-c"}));
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->workers, (std::vector<std::string>{"w-a", "w-b"}));

  ASSERT_TRUE(meshes.Hold("m", "j-1").ok());
  EXPECT_TRUE(meshes.WorkerHeld("w-b"));
  EXPECT_FALSE(meshes.WorkerHeld("w-c"));
  Status st = meshes.BeginRemove("m");
  EXPECT_EQ(st.code(), Code::kConflict);
  EXPECT_EQ(st.details().value("job", ""), "j-1");
  meshes.Release("m", "j-1");
  EXPECT_FALSE(meshes.WorkerHeld("w-b"));
  ASSERT_TRUE(meshes.BeginRemove("m").ok());
  // While its removal is written, no job takes it, and a refused write gives it back.
  EXPECT_EQ(meshes.Hold("m", "j-2").status().code(), Code::kUnavailable);
  EXPECT_EQ(meshes.BeginRemove("m").code(), Code::kUnavailable);
  meshes.EndRemove("m", /*removed=*/false);
  EXPECT_TRUE(meshes.Hold("m", "j-2").ok());
  meshes.Release("m", "j-2");
  ASSERT_TRUE(meshes.SetRetention("m", {3, 0}).ok());
  ASSERT_TRUE(meshes.BeginRemove("m").ok());
  meshes.EndRemove("m", /*removed=*/true);
  EXPECT_EQ(meshes.Hold("m", "j-3").status().code(), Code::kNotFound);
  EXPECT_FALSE(meshes.Retention("m").has_value()) << "a removed mesh kept its retention policy";
}

TEST(MeshRegistry, NoJobStartsOnAMeshUnderItsSelfTest) {
  MeshRegistry meshes;
  MeshRecord m = MeshOf("m", {"w-a"});
  m.self_testing = true;
  ASSERT_FALSE(meshes.Add(m).has_value());
  auto held = meshes.Hold("m", "j-1", "target_mesh");
  EXPECT_EQ(held.status().code(), Code::kUnavailable);
  EXPECT_EQ(held.status().details().value("field", ""), "target_mesh");
  EXPECT_EQ(meshes.BeginRemove("m").code(), Code::kUnavailable);
  EXPECT_TRUE(meshes.WorkerHeld("w-a"));
  meshes.MarkTested("m");
  EXPECT_TRUE(meshes.Hold("m", "j-1").ok());
}

CheckpointRecord Pending(int64_t step, const std::string& job) {
  CheckpointRecord c;
  c.mesh = "m";
  c.step = step;
  c.job = job;
  return c;
}

TEST(CheckpointRegistry, OneSaveReservesAStepAndAFailedOneGivesItBack) {
  CheckpointRegistry checkpoints;
  ASSERT_TRUE(checkpoints.Reserve(Pending(5, "j-1")).ok());
  Status taken = checkpoints.Reserve(Pending(5, "j-2"));
  EXPECT_EQ(taken.code(), Code::kConflict);
  EXPECT_EQ(taken.details().value("job", ""), "j-1");
  // A pending checkpoint is not deleted, nor restored.
  EXPECT_EQ(checkpoints.BeginDelete("m", 5).status().code(), Code::kConflict);
  EXPECT_EQ(checkpoints.Hold("m", "5", "j-9").status().code(), Code::kConflict);

  checkpoints.Update("m@5", [](CheckpointRecord& c) { c.state = CheckpointState::kFailed; });
  // Job j-1 may still be ending; a new save takes the step all the same.
  ASSERT_TRUE(checkpoints.Reserve(Pending(5, "j-3")).ok());
  checkpoints.Release("m@5", "j-1");  // the old job's release is not the new one's
  EXPECT_EQ(checkpoints.BeginDelete("m", 5).status().details().value("job", ""), "j-3");
  checkpoints.Update("m@5", [](CheckpointRecord& c) { c.state = CheckpointState::kCommitted; });
  EXPECT_EQ(checkpoints.Reserve(Pending(5, "j-4")).code(), Code::kConflict);
}

TEST(CheckpointRegistry, AHeldCheckpointIsNotDeletedAndADeletingOneIsNotHeld) {
  CheckpointRegistry checkpoints;
  for (int64_t step : {1, 2}) {
    CheckpointRecord c = Pending(step, "j-s");
    c.state = CheckpointState::kCommitted;
    checkpoints.Load(c);
  }
  auto latest = checkpoints.Hold("m", "latest", "j-r");
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->step, 2);
  Status busy = checkpoints.BeginDelete("m", 2).status();
  EXPECT_EQ(busy.code(), Code::kConflict);
  EXPECT_EQ(busy.details().value("job", ""), "j-r");
  checkpoints.Release("m@2", "j-r");

  ASSERT_TRUE(checkpoints.BeginDelete("m", 2).ok());
  // While step 2 is being deleted: "latest" is step 1, step 2 is not restorable, and
  // no save may take the step.
  EXPECT_EQ(checkpoints.FindCommitted("m", "latest")->step, 1);
  EXPECT_EQ(checkpoints.Hold("m", "2", "j-x").status().code(), Code::kConflict);
  EXPECT_EQ(checkpoints.Reserve(Pending(2, "j-y")).code(), Code::kConflict);
  checkpoints.EndDelete("m@2", /*deleted=*/false);  // the files stayed: it is back
  EXPECT_EQ(checkpoints.FindCommitted("m", "latest")->step, 2);
  ASSERT_TRUE(checkpoints.BeginDelete("m", 2).ok());
  checkpoints.EndDelete("m@2", /*deleted=*/true);
  EXPECT_FALSE(checkpoints.Get("m@2").has_value());
  EXPECT_EQ(checkpoints.CommittedSteps("m"), (std::vector<int64_t>{1}));
}

WorkerRecord Worker(const std::string& id) {
  WorkerRecord w;
  w.id = id;
  w.local_port = 1;
  return w;
}

// A long-poll of a worker that has every task up to `ack` and the first placements.
PollRequest Polling(int64_t wait_ms, uint64_t ack = 0) { return {wait_ms, ack, 1, "q-test"}; }

// The ids of a poll's tasks.
std::vector<std::string> Ids(const Result<PollAnswer>& a) {
  std::vector<std::string> ids;
  if (a.ok()) {
    for (const Json& t : a->tasks) ids.push_back(t.value("id", ""));
  }
  return ids;
}

TEST(WorkerRegistry, ARoundReachesEveryWorkerOrNone) {
  WorkerRegistry workers("q-test");
  workers.Register(Worker("w-a"), 0);
  workers.Register(Worker("w-b"), 0);
  ASSERT_TRUE(workers.Heartbeat("w-a", 5000).ok());
  // w-b has been silent past the lease: dead, and it alone changed.
  auto changes = workers.Scan(5000, 1500, 3000);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].worker.id, "w-b");
  EXPECT_EQ(changes[0].worker.state, WorkerState::kDead);

  auto missing = workers.QueueAll({{"w-a", Json{{"id", "t-1"}}}, {"w-b", Json{{"id", "t-2"}}}}, 5000);
  ASSERT_TRUE(missing.has_value());
  EXPECT_EQ(missing->worker, "w-b");
  EXPECT_EQ(missing->silent_ms, 5000);
  EXPECT_TRUE(workers.Poll("w-a", Polling(0), 5000)->tasks.empty())
      << "w-a got a task of a round that never went out";

  EXPECT_FALSE(workers.QueueAll({{"w-a", Json{{"id", "t-3"}}}}, 5000).has_value());
  workers.QueueToLive({"w-a", "w-b", "w-nobody"}, [] { return Json{{"id", "t-4"}}; });
  EXPECT_EQ(Ids(workers.Poll("w-a", Polling(0), 5000)), (std::vector<std::string>{"t-3", "t-4"}));
  // A dead worker's heartbeat revives it, once.
  auto revived = workers.Heartbeat("w-b", 6000);
  ASSERT_TRUE(revived.ok());
  ASSERT_TRUE(revived->has_value());
  EXPECT_EQ((*revived)->state, WorkerState::kAlive);
  EXPECT_FALSE(workers.Heartbeat("w-b", 6001)->has_value());
  EXPECT_EQ(workers.Heartbeat("w-c", 6001).status().code(), Code::kNotFound);
}

TEST(WorkerRegistry, ANewerPollSupersedesTheOlderOne) {
  WorkerRegistry workers("q-test");
  workers.Register(Worker("w-a"), MonoMs());
  Result<PollAnswer> older = PollAnswer{};
  // Were the older poll not to give way, it would wait for ten minutes: the test's timeout.
  std::thread t([&] { older = workers.Poll("w-a", Polling(600000), MonoMs()); });
  while (workers.Count().polls_waiting != 1) std::this_thread::yield();
  std::thread newer_poll;
  Result<PollAnswer> newer = PollAnswer{};
  newer_poll = std::thread([&] { newer = workers.Poll("w-a", Polling(60000), MonoMs()); });
  t.join();  // the older poll gave way to the newer one
  ASSERT_TRUE(older.ok());
  EXPECT_TRUE(older->tasks.empty());
  EXPECT_FALSE(workers.QueueAll({{"w-a", Json{{"id", "t-1"}}}}, MonoMs()).has_value());
  newer_poll.join();
  EXPECT_EQ(Ids(newer), (std::vector<std::string>{"t-1"}));
  // Stop ends every poll, now and later.
  workers.Stop();
  EXPECT_TRUE(workers.Poll("w-a", Polling(60000, newer->ack), MonoMs())->tasks.empty());
}

// A task stays leased to its worker until acknowledged: an answer lost in flight is
// answered again; an ack (the highest number received) or a report of the task drops it.
TEST(WorkerRegistry, AnsweredTasksStayUntilAcknowledged) {
  WorkerRegistry workers("q-test");
  workers.Register(Worker("w-a"), 0);
  ASSERT_FALSE(workers.QueueAll({{"w-a", Json{{"id", "t-1"}}}}, 0).has_value());
  auto first = workers.Poll("w-a", Polling(0), 0);
  ASSERT_EQ(Ids(first), (std::vector<std::string>{"t-1"}));
  EXPECT_EQ(first->queue, "q-test");
  const uint64_t ack = first->ack;
  EXPECT_GT(ack, 0u);
  // The answer was lost: the worker asks again with what it had.
  auto again = workers.Poll("w-a", Polling(0), 0);
  EXPECT_EQ(Ids(again), (std::vector<std::string>{"t-1"})) << "a lost answer's task went with it";
  EXPECT_EQ(again->ack, ack);
  // Received: the ack drops it.
  auto acked = workers.Poll("w-a", Polling(0, ack), 0);
  EXPECT_TRUE(Ids(acked).empty());
  EXPECT_EQ(acked->ack, ack);
  // Every task above the ack comes, in order; a report of one drops it alone.
  ASSERT_FALSE(workers.QueueAll({{"w-a", Json{{"id", "t-2"}}}}, 0).has_value());
  workers.QueueToLive({"w-a"}, [] { return Json{{"id", "t-3"}}; });
  auto both = workers.Poll("w-a", Polling(0, ack), 0);
  EXPECT_EQ(Ids(both), (std::vector<std::string>{"t-2", "t-3"}));
  EXPECT_GT(both->ack, ack);
  workers.Acknowledge("w-a", "t-2");
  EXPECT_EQ(Ids(workers.Poll("w-a", Polling(0, ack), 0)), (std::vector<std::string>{"t-3"}));
  workers.Acknowledge("w-a", "t-3");
  EXPECT_TRUE(Ids(workers.Poll("w-a", Polling(0, ack), 0)).empty());
}

// A poll that names another queue (a tesserad before this one) has its numbers
// ignored: nothing is dropped, and it gets the placements.
TEST(WorkerRegistry, AnotherQueuesNumbersAreIgnored) {
  WorkerRegistry workers("q-test");
  workers.Register(Worker("w-a"), 0);
  ASSERT_FALSE(workers.QueueAll({{"w-a", Json{{"id", "t-1"}}}}, 0).has_value());
  auto a = workers.Poll("w-a", PollRequest{0, 1000000, 1000000, "q-old"}, 0);
  EXPECT_EQ(Ids(a), (std::vector<std::string>{"t-1"}));
  EXPECT_EQ(a->queue, "q-test");
  EXPECT_EQ(a->meshes, std::optional<uint64_t>(1));
  EXPECT_LT(a->ack, 1000000u);
}

// A dead worker's leased tasks go; it comes back to an empty queue.
TEST(WorkerRegistry, ADeadWorkersQueueIsCleared) {
  WorkerRegistry workers("q-test");
  workers.Register(Worker("w-a"), 0);
  ASSERT_FALSE(workers.QueueAll({{"w-a", Json{{"id", "t-1"}}}}, 0).has_value());
  ASSERT_EQ(Ids(workers.Poll("w-a", Polling(0), 0)), (std::vector<std::string>{"t-1"}));
  auto changes = workers.Scan(5000, 1500, 3000);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].worker.state, WorkerState::kDead);
  ASSERT_TRUE(workers.Heartbeat("w-a", 5001).ok());
  EXPECT_TRUE(Ids(workers.Poll("w-a", Polling(0), 5001)).empty());
}

// A change of placements wakes a waiting poll, which answers the new version.
TEST(WorkerRegistry, APlacementChangeWakesAPoll) {
  // A poll that takes no placements neither waits for nor gets them.
  WorkerRegistry tasks_only("q-test");
  tasks_only.Register(Worker("w-a"), MonoMs());
  EXPECT_FALSE(tasks_only.Poll("w-a", PollRequest{0, 0, std::nullopt, "q-test"}, MonoMs())->meshes);

  WorkerRegistry workers("q-test");
  workers.Register(Worker("w-a"), MonoMs());
  EXPECT_EQ(workers.Poll("w-a", PollRequest{0, 0, 0, "q-test"}, MonoMs())->meshes,
            std::optional<uint64_t>(1));
  Result<PollAnswer> waited = PollAnswer{};
  // Were it not woken, it would wait for ten minutes: the test's timeout.
  std::thread t([&] { waited = workers.Poll("w-a", Polling(600000), MonoMs()); });
  while (workers.Count().polls_waiting != 1) std::this_thread::yield();
  workers.PlacementsChanged();
  t.join();
  ASSERT_TRUE(waited.ok());
  EXPECT_TRUE(waited->tasks.empty());
  EXPECT_EQ(waited->meshes, std::optional<uint64_t>(2));
  // Told: a worker that has version 2 waits again.
  EXPECT_FALSE(workers.Poll("w-a", PollRequest{0, 0, 2, "q-test"}, MonoMs())->meshes.has_value());
}

BaseReport Report(const Json& j) {
  auto r = BaseReportFromJson(j);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : BaseReport{};
}

TEST(BaseUse, TheFloorIsTheLowestBaseOfAWorkerOrOfASaveThatMayStillCommit) {
  BaseUse use(RealClock());
  auto open = [](int64_t step) { return step != 7; };  // step 7's save ended
  EXPECT_EQ(use.Floor({"a", "b"}, "m", open), std::nullopt) << "no report: nothing is held";
  use.Put("a", Report({{"m", {{"base", 6}, {"ended", {6}}, {"saves", {{7, 3}, {8, 5}}}}}}));
  use.Put("b", Report({{"m", {{"base", 9}, {"ended", {9}}}}, {"other", {{"base", 1}}}}));
  EXPECT_EQ(use.Floor({"a", "b"}, "m", open), 5);  // 7's base 3 no longer counts
  EXPECT_EQ(use.Floor({"b"}, "m", open), 9);
  EXPECT_EQ(use.Floor({"b"}, "other", open), 1);
  use.Put("a", Report({{"m", {{"base", -1}}}}));  // a failed save dropped its base
  EXPECT_EQ(use.Floor({"a"}, "m", open), std::nullopt);
}

TEST(BaseUse, AWaitEndsWhenEveryReportingWorkerTookTheEndInOrAtItsTimeout) {
  BaseUse use(RealClock());
  EXPECT_TRUE(use.WaitHeard({"silent"}, "m", 4, 0)) << "a worker that never reports is not waited for";
  use.Put("a", Report({{"m", {{"ended", {3}}}}}));
  EXPECT_FALSE(use.WaitHeard({"a"}, "m", 4, 1));
  std::thread later([&] { use.Put("a", Report({{"m", {{"ended", {3, 5, 4}}}}})); });
  EXPECT_TRUE(use.WaitHeard({"a", "silent"}, "m", 4, 60000));
  later.join();
}

TEST(BaseUse, AMalformedReportNamesTheField) {
  const std::pair<Json, std::string> cases[] = {
      {Json::array(), "bases"},
      {{{"m", 1}}, "bases.m"},
      {{{"m", {{"base", -2}}}}, "bases.m.base"},
      {{{"m", {{"ended", {1, -1}}}}}, "bases.m.ended[1]"},
      {{{"m", {{"ended", Json(std::vector<int>(65, 1))}}}}, "bases.m.ended"},
      {{{"m", {{"saves", {{1, 2, 3}}}}}}, "bases.m.saves[0]"},
      {{{"m", {{"saves", {{1, "x"}}}}}}, "bases.m.saves[0]"},
  };
  for (const auto& [j, field] : cases) {
    auto r = BaseReportFromJson(j);
    ASSERT_FALSE(r.ok()) << j.dump();
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_EQ(r.status().details().value("field", ""), field) << j.dump();
  }
}

TEST(JobRegistry, ReportsReachTheRoundsJobAndLateOnesAreHarmless) {
  EventBus events;
  JobRegistry jobs(&events, RealClock());
  SaveRequest waits;  // a save its trainers join: its workers are told of its end
  waits.wait_for_trainer = true;
  jobs.Create("j-1", "save", "m", 3, Json::object(), waits);
  EXPECT_TRUE(jobs.Running("j-1"));
  EXPECT_TRUE(jobs.JoinOf("j-1").has_value());
  auto [record, inbox] = jobs.Begin("j-1");
  EXPECT_EQ(record.state, JobState::kRunning);
  JobAction round;
  round.round = 1;
  round.tasks[0].kind = TaskKind::kWrite;
  round.tasks[1].kind = TaskKind::kWrite;
  auto tasks = jobs.NewRound("j-1", {"w-a", "w-b"}, round);
  ASSERT_EQ(tasks.size(), 2u);
  const std::string t0 = tasks[0].second["id"];
  TaskReport done;
  done.state = ReportState::kSucceeded;
  done.result = Json{{"ok", 1}};
  // Only the task's own worker may report it.
  EXPECT_EQ(jobs.Report("w-b", t0, done).code(), Code::kInvalidArgument);
  ASSERT_TRUE(jobs.Report("w-a", t0, done).ok());
  JobEvent e = inbox->Next(0);
  EXPECT_EQ(e.kind, JobEvent::Kind::kTaskEnded);
  EXPECT_EQ(e.round, 1);
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(jobs.Report("w-a", "t-never", done).code(), Code::kNotFound);

  auto ended = jobs.Finish("j-1", Status::Ok(), Json::object());
  EXPECT_TRUE(ended.joined);
  EXPECT_EQ(ended.record.state, JobState::kSucceeded);
  EXPECT_FALSE(jobs.Running("j-1"));
  EXPECT_FALSE(jobs.JoinOf("j-1").has_value());
  // A report after the end is accepted and changes nothing.
  EXPECT_TRUE(jobs.Report("w-a", t0, done).ok());
  EXPECT_EQ(jobs.Cancel("j-1").status().code(), Code::kConflict);
  EXPECT_EQ(jobs.Get("j-1", 0)->value("state", ""), "succeeded");
  // The history policy: keep none older than now.
  EXPECT_EQ(jobs.Prune(0, WallMs() + 1), (std::vector<std::string>{"j-1"}));
  EXPECT_EQ(jobs.Get("j-1", 0).status().code(), Code::kNotFound);
}

}  // namespace
}  // namespace tessera::service
