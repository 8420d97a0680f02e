// Task delivery and pushed placements, between real processes (docs/architecture.md,
// "Long-poll tasks" and "Placements"): a task stays leased to its worker until the worker
// acknowledges it, so a poll answer lost in flight strands nothing; and a worker knows its
// meshes' placements from what tesserad pushes, so a trainer's save needs no tesserad.
#include <signal.h>

#include <fstream>
#include <sstream>

#include "api/clock.h"
#include "tests/e2e/cluster_fixture.h"

namespace tessera::e2e {
namespace {

// How many lines of `log` hold `text`.
int CountLines(const std::string& log, const std::string& text) {
  std::istringstream in(log);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.find(text) != std::string::npos;
  return n;
}

std::string ReadLog(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

Json Health(LocalCluster& c, int w) {
  auto h = c.WorkerClient(w, 10).Call("GET", "/healthz");
  EXPECT_TRUE(h.ok()) << h.status().ToString();
  return h.ok() ? *h : Json::object();
}

// tesserad loses the answers of the first polls that carry tasks (TESSERA_FAULT_DROP_POLLS):
// the mesh's self-test, a save and a restore still succeed at once (not at the round's
// 30-minute timeout), and every worker runs each of its tasks once.
TEST(TaskDelivery, LostPollAnswersAreAnsweredAgainAndEachTaskRunsOnce) {
  constexpr int kDropped = 3;
  tools::ClusterOptions opts;
  opts.workers = 2;
  opts.server_env = {"TESSERA_FAULT_DROP_POLLS=" + std::to_string(kDropped)};
  auto c = StartCluster(opts);
  ASSERT_TRUE(c);
  const Mesh mesh{"m", {{"data", 2}}, 1};
  ASSERT_TRUE(c->PutMesh("m", MeshToJson(mesh)["axes"]).ok());
  const GlobalTensor t = MakeGlobal("w", DType::kFloat32, {1024}, Layout{{"data"}}, 3);
  Push(*c, mesh, t);
  SaveAndWait(*c, "m", 1);
  Push(*c, mesh, MakeGlobal("w", DType::kFloat32, {1024}, Layout{{"data"}}, 4));
  Json restored = RestoreAndWait(*c, "m", "1", Json::object());
  ASSERT_EQ(restored.value("state", ""), "succeeded") << restored.dump();
  ExpectShards(*c, mesh, t, t.layout);

  const std::string log = ReadLog(c->server_log());
  EXPECT_EQ(CountLines(log, "fault injection: dropped a poll answer"), kDropped) << log;
  // Each worker's tasks: the self-test's mesh_init, the save's snapshot (which writes, and
  // whose answer is the join), the save's end (save_ended: its next save builds on this
  // one), the restore.
  for (int w = 0; w < 2; ++w) {
    const Json h = Health(*c, w);
    EXPECT_EQ(h.value("tasks_started", -1), 4) << "worker " << w << ": " << h.dump();
    EXPECT_EQ(h.value("tasks_repeated", -1), 0) << "worker " << w << ": " << h.dump();
  }
}

// The GET /api/v1/meshes/{name} requests tesserad has answered (its /metrics).
int64_t MeshLookups(LocalCluster& c) {
  auto r = c.Client(10).Send("GET", "/metrics");
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return -1;
  std::istringstream in(r->body);
  int64_t n = 0;
  const std::string prefix = "tessera_http_requests_total{route=\"/api/v1/meshes/{";
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) != 0 || line.find("method=\"GET\"") == std::string::npos) continue;
    const std::string route = line.substr(prefix.size(), line.find('"', prefix.size()) - prefix.size());
    if (route.find('/') != std::string::npos) continue;  // a route below the mesh
    n += std::stoll(line.substr(line.rfind(' ') + 1));
  }
  return n;
}

// Once tesserad pushed a mesh's placement, a trainer's /v1/save needs no tesserad: with
// tesserad stopped (SIGSTOP) it still answers its snapshot, and no worker ever looked the
// mesh up. After SIGCONT the save commits.
TEST(PushedPlacements, ASaveNeedsNoTesserad) {
  tools::ClusterOptions opts;
  opts.workers = 2;
  auto c = StartCluster(opts);
  ASSERT_TRUE(c);
  const Mesh mesh{"m", {{"data", 2}}, 1};
  ASSERT_TRUE(c->PutMesh("m", MeshToJson(mesh)["axes"]).ok());
  // Each worker shows the placements it was pushed.
  for (int w = 0; w < 2; ++w) {
    (void)::tessera::testing::Eventually([&] { return Health(*c, w).value("meshes", Json::array()) == Json::array({"m"}); });
    ASSERT_EQ(Health(*c, w)["meshes"], Json::array({"m"})) << "worker " << w;
  }
  Push(*c, mesh, MakeGlobal("w", DType::kFloat32, {1024}, Layout{{"data"}}, 5));

  ASSERT_EQ(::kill(c->server_pid(), SIGSTOP), 0);
  for (int w = 0; w < 2; ++w) {
    // Promptly: well inside the client's 10 s, which a lookup on a stopped tesserad exceeds.
    auto r = c->WorkerClient(w, 10).Call("POST", "/v1/save?mesh=m&step=1", Json::object());
    EXPECT_TRUE(r.ok()) << "worker " << w << ": " << r.status().ToString();
  }
  ASSERT_EQ(::kill(c->server_pid(), SIGCONT), 0);

  for (int w = 0; w < 2; ++w) {
    auto done = c->WorkerClient(w, 90).Call(
        "GET", "/v1/saves/1?mesh=m&wait=committed&timeout_ms=60000");
    ASSERT_TRUE(done.ok()) << "worker " << w << ": " << done.status().ToString();
    EXPECT_EQ((*done)["state"], "committed");
  }
  EXPECT_EQ(MeshLookups(*c), 0) << "a worker looked up a mesh tesserad had pushed";
  // The save's job holds the mesh until it ends (its retention comes after the commit the
  // workers saw): a delete before then is refused as a conflict.
  auto ck = c->Call("GET", "/api/v1/meshes/m/checkpoints/1");
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  ASSERT_EQ(Wait(*c, (*ck)["job"])["state"], "succeeded");
  // A deleted mesh is pushed away.
  auto deleted = c->Call("DELETE", "/api/v1/meshes/m");
  ASSERT_TRUE(deleted.ok()) << deleted.status().ToString();
  for (int w = 0; w < 2; ++w) {
    (void)::tessera::testing::Eventually([&] { return Health(*c, w).value("meshes", Json::array()).empty(); });
    EXPECT_EQ(Health(*c, w)["meshes"], Json::array()) << "worker " << w;
  }
}

}  // namespace
}  // namespace tessera::e2e
