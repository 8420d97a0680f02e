// Failures end to end: a worker killed in each save phase, tesserad killed
// mid-save and restarted, a full disk. Each must fail the job naming the
// culprit, leave no visible checkpoint for that step, and leave the earlier
// checkpoint verifiable and restorable.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cluster_fixture.h"
#include "storage/checkpoint_dir.h"

namespace tessera::e2e {
namespace {

const Mesh kTwo{"two", {{"data", 2}}, 1};

GlobalTensor Weights(uint64_t seed) {
  return MakeGlobal("w", DType::kFloat32, {256, 64}, Layout{{"data", "unsharded"}}, seed);
}

void ExpectNoTrace(LocalCluster& c, const std::string& mesh, int64_t step) {
  auto steps = storage::ListSteps(storage::DefaultEnv(), c.checkpoint_root(), mesh);
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(std::count(steps->begin(), steps->end(), step), 0) << "step " << step << " visible";
  auto latest = c.Call("GET", "/api/v1/meshes/" + mesh + "/checkpoints/latest");
  if (latest.ok()) {
    EXPECT_NE((*latest)["step"], step);
  }
}

// The earlier checkpoint verifies and restores onto the workers still alive.
void ExpectEarlierIntact(LocalCluster& c, int64_t step, const GlobalTensor& t,
                         const std::vector<int>& alive) {
  auto v = c.Call("POST", "/api/v1/meshes/two/checkpoints/" + std::to_string(step) + "/verify",
                  Json::object());
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(Wait(c, (*v)["job"])["state"], "succeeded");
  const Mesh one{"one-" + std::to_string(alive[0]), {{"data", 1}}, 1};
  ASSERT_TRUE(c.PutMesh(one.name, MeshToJson(one)["axes"], 1, alive[0]).ok());
  Json r = RestoreAndWait(c, "two", std::to_string(step), {{"target_mesh", one.name}});
  ASSERT_EQ(r["state"], "succeeded") << r.dump();
  ExpectShards(c, one, t, Layout{{"data", "unsharded"}}, alive[0]);
}

class WorkerDeath : public ::testing::TestWithParam<std::string> {};

TEST_P(WorkerDeath, JobFailsWithinTheLeaseNamingTheWorker) {
  const std::string phase = GetParam();
  tools::ClusterOptions opts;
  opts.workers = 2;
  opts.worker_env[1] = {"TESSERA_FAULT_TASK_DELAY=" + phase + ":2500"};
  auto c = StartCluster(opts);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->PutMesh("two", MeshToJson(kTwo)["axes"]).ok());
  auto t1 = Weights(1);
  Push(*c, kTwo, t1);
  SaveAndWait(*c, "two", 1);  // slow (the delay) but fine
  Push(*c, kTwo, Weights(2));
  // The job's phase is "write" from its start: each worker snapshots, writes and joins.
  // Worker 1 dies while it holds its snapshot or its write (the delay).
  std::string job = StartSave(*c, "two", 2);
  Json at = WaitPhase(*c, job, "write");
  ASSERT_EQ(at["phase"], "write") << at.dump();
  c->KillWorker(1);
  Json j = Wait(*c, job);
  EXPECT_EQ(j["state"], "failed");
  // unavailable, not deadline_exceeded: the lease ended the job, not its timeout.
  EXPECT_EQ(j["error"]["code"], "unavailable") << j.dump();
  EXPECT_EQ(j["error"]["details"]["worker"], c->worker_id(1));
  EXPECT_NE(j["error"]["message"].get<std::string>().find(c->worker_id(1)), std::string::npos);
  ExpectNoTrace(*c, "two", 2);
  ExpectEarlierIntact(*c, 1, t1, {0});
  auto ck = c->Call("GET", "/api/v1/meshes/two/checkpoints/2");
  ASSERT_TRUE(ck.ok());
  EXPECT_EQ((*ck)["state"], "failed");
  // The worker shows as dead.
  auto w = c->Call("GET", "/api/v1/workers/" + c->worker_id(1));
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)["state"], "dead");
  // A new save on the dead worker's mesh is refused naming it.
  auto again = c->Call("POST", "/api/v1/meshes/two/checkpoints", {{"step", 3}});
  EXPECT_EQ(again.status().code(), Code::kUnavailable);
  EXPECT_EQ(again.status().details()["worker"], c->worker_id(1));
}

INSTANTIATE_TEST_SUITE_P(Phases, WorkerDeath, ::testing::Values("snapshot", "write"));

TEST(ServerDeath, KilledMidSaveThenRestarted) {
  tools::ClusterOptions opts;
  opts.workers = 2;
  opts.worker_env[0] = {"TESSERA_FAULT_TASK_DELAY=write:1500"};
  auto c = StartCluster(opts);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->PutMesh("two", MeshToJson(kTwo)["axes"]).ok());
  auto t1 = Weights(1);
  Push(*c, kTwo, t1);
  SaveAndWait(*c, "two", 1);
  Push(*c, kTwo, Weights(2));
  // Tasks worker 0 has begun (its /healthz): the kill comes once it has begun the save's.
  auto started = [&] {
    auto h = c->WorkerClient(0, 10).Call("GET", "/healthz");
    return h.ok() ? h->value("tasks_started", int64_t{-1}) : int64_t{-1};
  };
  const int64_t before = started();
  std::string job = StartSave(*c, "two", 2);
  ASSERT_EQ(WaitPhase(*c, job, "write")["phase"], "write");
  (void)::tessera::testing::Eventually([&] { return started() > before; });
  ASSERT_GT(started(), before) << "worker 0 never began the save's snapshot task";
  c->KillServer();
  ASSERT_TRUE(c->RestartServer().ok()) << c->server_log();
  // The catalog remembers; the interrupted job failed, nothing of it is visible.
  Json j = Wait(*c, job);
  EXPECT_EQ(j["state"], "failed");
  EXPECT_NE(j["error"]["message"].get<std::string>().find("restarted"), std::string::npos);
  ExpectNoTrace(*c, "two", 2);
  // Workers keep heartbeating under the same ids and keep their tensors.
  ASSERT_TRUE(c->WaitAlive(2, 10000).ok());
  // The stale write ends (after its 1.5 s delay) and its join is refused, the job having
  // ended: the worker removes what it wrote.
  const std::string ended = "the join of job " + job + " was refused";
  const bool stale_ended = ::tessera::testing::Eventually([&] {
    std::ifstream log(c->worker_log(0));
    return std::string(std::istreambuf_iterator<char>(log), {}).find(ended) != std::string::npos;
  });
  ASSERT_TRUE(stale_ended) << "worker 0 never joined with its stale write";
  EXPECT_EQ(LeftoversOnceCollected(*c, "two"), std::vector<std::string>{});
  ExpectEarlierIntact(*c, 1, t1, {0});
  SaveAndWait(*c, "two", 3);
  auto list = c->Call("GET", "/api/v1/meshes/two/checkpoints");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ((*list)[0]["step"], 3);
}

TEST(DiskFull, SaveFailsWithResourceExhaustedNamingTheWorker) {
  tools::ClusterOptions opts;
  opts.workers = 2;
  opts.worker_env[1] = {"TESSERA_FAULT_DISK_FULL_AFTER=4096"};
  auto c = StartCluster(opts);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->PutMesh("two", MeshToJson(kTwo)["axes"]).ok());
  Push(*c, kTwo, Weights(1));
  Json j = Wait(*c, StartSave(*c, "two", 1));
  EXPECT_EQ(j["state"], "failed");
  EXPECT_EQ(j["error"]["code"], "resource_exhausted") << j.dump();
  EXPECT_EQ(j["error"]["details"]["worker"], c->worker_id(1));
  ExpectNoTrace(*c, "two", 1);
}

// A mesh is usable once its self-test has passed: a save asked for while the
// test runs is refused (503 naming the mesh) rather than started on a mesh
// that may yet be withdrawn.
TEST(MeshSelfTest, NoJobStartsOnAMeshUnderTest) {
  tools::ClusterOptions opts;
  opts.worker_env[0] = {"TESSERA_FAULT_TASK_DELAY=mesh_init:2000"};
  auto c = StartCluster(opts);
  ASSERT_TRUE(c);
  std::thread registering([&] { EXPECT_TRUE(c->PutMesh("two", MeshToJson(kTwo)["axes"]).ok()); });
  // Wait until the mesh is visible (its self-test is running), then try to save.
  Result<Json> save = NotFound("");
  (void)::tessera::testing::Eventually([&] {
    if (!c->Call("GET", "/api/v1/meshes/two").ok()) return false;
    save = c->Call("POST", "/api/v1/meshes/two/checkpoints", {{"step", 1}});
    return true;
  });
  registering.join();
  ASSERT_FALSE(save.ok());
  EXPECT_EQ(save.status().code(), Code::kUnavailable) << save.status().ToString();
  EXPECT_EQ(save.status().details().value("mesh", ""), "two");
  EXPECT_NE(save.status().message().find("self-test"), std::string::npos);
  // Registered now: the same request is taken (it fails later: no tensors pushed).
  EXPECT_TRUE(c->Call("POST", "/api/v1/meshes/two/checkpoints", {{"step", 1}}).ok());
}

// An in-loop save has a deadline (body deadline_ms): past it, the trainer hears
// deadline_exceeded naming the job, and the job is cancelled, never committed.
TEST(TrainerSave, PassesItsDeadlineAndIsCancelled) {
  tools::ClusterOptions opts;
  opts.worker_env[1] = {"TESSERA_FAULT_TASK_DELAY=write:4000"};
  auto c = StartCluster(opts);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->PutMesh("two", MeshToJson(kTwo)["axes"]).ok());
  Push(*c, kTwo, Weights(1));
  for (int w = 0; w < 2; ++w) {
    http::Client local = c->WorkerClient(w);
    auto r = local.Call("POST", "/v1/save?mesh=two&step=1", {{"deadline_ms", 800}});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  http::Client local = c->WorkerClient(0);
  auto waited = local.Call("GET", "/v1/saves/1?mesh=two&wait=committed&timeout_ms=20000");
  ASSERT_FALSE(waited.ok());
  EXPECT_EQ(waited.status().code(), Code::kDeadlineExceeded) << waited.status().ToString();
  const std::string job = waited.status().details().value("job", "");
  EXPECT_FALSE(job.empty()) << waited.status().ToString();
  EXPECT_NE(waited.status().message().find("cancelled"), std::string::npos);
  auto ended = c->WaitJob(job);
  ASSERT_TRUE(ended.ok());
  EXPECT_EQ((*ended)["state"], "cancelled") << ended->dump();
  auto ck = c->Call("GET", "/api/v1/meshes/two/checkpoints/1");
  ASSERT_TRUE(ck.ok());
  EXPECT_NE((*ck)["state"], "committed");
  // Bad deadlines are refused up front.
  auto bad = local.Call("POST", "/v1/save?mesh=two&step=2", {{"deadline_ms", 0}});
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(bad.status().details().value("field", ""), "deadline_ms");
}

// In-loop saves while tesserad is down keep their snapshots, up to the worker's
// limit (a count, or bytes); past it /v1/save answers 503 naming the limit and the
// pending saves, and copies nothing. Once tesserad is back, the pending saves commit.
// A snapshot's bytes are held until the worker has written them (each write is held
// back 5 s here, so that the snapshots taken in the meantime are all held), and the
// save is pending until tesserad took its join.
TEST(TrainerSave, PendingSnapshotsAreBoundedWhileTesseradIsDown) {
  constexpr int64_t kShard = 1 << 20;  // bytes of the tensor each worker holds
  tools::ClusterOptions opts;
  opts.workers = 2;
  opts.worker_env[0] = opts.worker_env[1] = {"TESSERA_FAULT_TASK_DELAY=write:5000"};
  opts.worker_args[0] = {"--max-pending-save-bytes", std::to_string(kShard * 3 / 2)};
  opts.worker_args[1] = {"--max-pending-saves", "3"};
  auto c = StartCluster(opts);
  ASSERT_TRUE(c);
  const Mesh one{"a", {{"data", 1}}, 1};
  for (int w = 0; w < 2; ++w) {
    const std::string name = w == 0 ? "a" : "b";
    ASSERT_TRUE(c->PutMesh(name, MeshToJson(one)["axes"], 1, w).ok());
    Mesh m = one;
    m.name = name;
    Push(*c, m, MakeGlobal("w", DType::kFloat32, {kShard / 4}, Layout{{"unsharded"}}, 7), w);
  }
  c->KillServer();
  auto save = [&](int w, int step) {
    return c->WorkerClient(w).Call("POST", "/v1/save?mesh=" + std::string(w == 0 ? "a" : "b") +
                                               "&step=" + std::to_string(step),
                                   Json::object());
  };
  auto pending_steps = [](const Status& st) {
    std::vector<int64_t> steps;
    for (const Json& p : st.details().value("pending", Json::array())) steps.push_back(p["step"]);
    return steps;
  };
  // Worker 0: two snapshots hold 2 MiB, past its 1.5 MiB.
  ASSERT_TRUE(save(0, 1).ok());
  ASSERT_TRUE(save(0, 2).ok());
  auto refused = save(0, 3);
  ASSERT_EQ(refused.status().code(), Code::kUnavailable) << refused.status().ToString();
  EXPECT_EQ(refused.status().details().value("limit", ""), "max_pending_save_bytes");
  EXPECT_EQ(pending_steps(refused.status()), (std::vector<int64_t>{1, 2}));
  EXPECT_NE(refused.status().message().find("--max-pending-save-bytes"), std::string::npos)
      << refused.status().ToString();
  // Worker 1: three saves, then its count.
  for (int step = 1; step <= 3; ++step) ASSERT_TRUE(save(1, step).ok()) << step;
  refused = save(1, 4);
  ASSERT_EQ(refused.status().code(), Code::kUnavailable) << refused.status().ToString();
  EXPECT_EQ(refused.status().details().value("limit", ""), "max_pending_saves");
  EXPECT_EQ(refused.status().details().value("max", 0), 3);
  EXPECT_EQ(refused.status().details().value("pending_bytes", int64_t{0}), 3 * kShard);
  EXPECT_EQ(pending_steps(refused.status()), (std::vector<int64_t>{1, 2, 3}));
  auto health = c->WorkerClient(1).Call("GET", "/healthz");
  ASSERT_TRUE(health.ok());
  EXPECT_EQ((*health)["pending_saves"]["count"], 3) << health->dump();
  EXPECT_EQ((*health)["pending_saves"]["bytes"], 3 * kShard) << health->dump();

  // tesserad comes back: every pending save commits, and the room is free again.
  ASSERT_TRUE(c->RestartServer().ok()) << c->server_log();
  for (const auto& [w, last] : std::vector<std::pair<int, int>>{{0, 2}, {1, 3}}) {
    for (int step = 1; step <= last; ++step) {
      auto done = c->WorkerClient(w, 90).Call(
          "GET", "/v1/saves/" + std::to_string(step) + "?mesh=" + (w == 0 ? "a" : "b") +
                     "&wait=committed&timeout_ms=60000");
      ASSERT_TRUE(done.ok()) << "worker " << w << " step " << step << ": "
                             << done.status().ToString();
      EXPECT_EQ((*done)["state"], "committed");
    }
  }
  health = c->WorkerClient(1).Call("GET", "/healthz");
  ASSERT_TRUE(health.ok());
  EXPECT_EQ((*health)["pending_saves"]["count"], 0) << health->dump();
  EXPECT_TRUE(save(1, 4).ok());
}

// A catalog that cannot be written (its disk is full) is never silent: the
// request whose record it refuses fails naming the catalog, memory stays as it
// was, and /healthz says degraded. Needs root for a small tmpfs.
TEST(CatalogFull, AMeshTheCatalogCannotRecordIsNotRegistered) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: mounts a 16 MiB tmpfs as the data dir";
  char tmpl[] = "/tmp/tessera-catalog-full-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  ASSERT_EQ(std::system(("mount -t tmpfs -o size=16m tmpfs " + dir).c_str()), 0);
  {
    tools::ClusterOptions opts;
    opts.dir = dir;
    opts.workers = 2;
    auto c = StartCluster(opts);
    ASSERT_TRUE(c);
    const Mesh one{"one", {{"data", 1}}, 1};
    ASSERT_TRUE(c->PutMesh("one", MeshToJson(one)["axes"]).ok());
    // Fill the disk.
    {
      std::ofstream fill(dir + "/fill", std::ios::binary);
      const std::string block(64 * 1024, 'x');
      while (fill.write(block.data(), block.size()) && fill.flush()) {
      }
    }
    auto r = c->PutMesh("two", MeshToJson(kTwo)["axes"]);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kResourceExhausted) << r.status().ToString();
    // The root is written first (it shares the full disk here), so it is the one named.
    EXPECT_NE(r.status().message().find("cannot register mesh two: the checkpoint root refused it"),
              std::string::npos)
        << r.status().ToString();
    EXPECT_EQ(c->Call("GET", "/api/v1/meshes/two").status().code(), Code::kNotFound);
    // A save whose checkpoint cannot be recorded is refused and leaves no job behind.
    auto save = c->Call("POST", "/api/v1/meshes/one/checkpoints", {{"step", 1}});
    ASSERT_FALSE(save.ok());
    EXPECT_EQ(save.status().code(), Code::kResourceExhausted) << save.status().ToString();
    auto jobs = c->Call("GET", "/api/v1/jobs?kind=save");
    ASSERT_TRUE(jobs.ok()) << jobs.status().ToString();
    EXPECT_EQ(jobs->size(), 0u) << jobs->dump();
    http::Client client(c->url());
    auto health = client.Send("GET", "/healthz");
    ASSERT_TRUE(health.ok());
    EXPECT_EQ(health->status, 503) << health->body;
    EXPECT_NE(health->body.find("degraded"), std::string::npos) << health->body;
  }
  EXPECT_EQ(std::system(("umount " + dir).c_str()), 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera::e2e
