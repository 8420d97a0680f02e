// A standby tesserad over a real etcd (docs/ha.md): it names the leader, takes over when
// the leader is killed or paused, and the root's fencing keeps a paused leader from
// committing, deleting or collecting anything once it resumes. Every checkpoint
// committed before a takeover is listed and restores bit for bit, none is listed that
// was not committed, nothing of the interrupted save is left after GC, and the next
// save commits, with workers that follow the leader on their own.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "storage/checkpoint_dir.h"
#include "storage/root_epoch.h"
#include "tests/e2e/cluster_fixture.h"
#include "tests/e2e/etcd_fixture.h"

namespace tessera::e2e {
namespace {

const Mesh kTwo{"two", {{"data", 2}}, 1};
const Layout kSharded{{"data", "unsharded"}};  // dim 0 split over axis data
constexpr int kLeaseS = 2;

std::string ReadLog(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Two workers, a leader and one standby over `etcd`; worker 0 holds each write task
// for `write_delay_ms`.
std::unique_ptr<LocalCluster> StartHa(const Etcd& etcd, int64_t write_delay_ms = 0) {
  tools::ClusterOptions opts;
  opts.workers = 2;
  opts.standbys = 1;
  opts.server_args = {"--ha", etcd.url(), "--ha-lease-s", std::to_string(kLeaseS)};
  if (write_delay_ms > 0) opts.worker_env[0] = {"TESSERA_FAULT_TASK_DELAY=write:" + std::to_string(write_delay_ms)};
  auto c = StartCluster(opts);
  if (c == nullptr) return c;
  EXPECT_TRUE(c->PutMesh("two", MeshToJson(kTwo)["axes"]).ok());
  return c;
}

std::vector<int64_t> ListedSteps(LocalCluster& c) {
  auto list = c.Call("GET", "/api/v1/meshes/two/checkpoints");
  EXPECT_TRUE(list.ok()) << list.status().ToString();
  std::vector<int64_t> steps;
  for (const Json& ck : list.ok() ? *list : Json::array()) {
    if (ck["state"] == "committed") steps.push_back(ck["step"]);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

// Step 1 committed; step 2's save started and in its write phase (held by worker 0).
std::pair<GlobalTensor, std::string> CommitOneThenStartTwo(LocalCluster& c) {
  auto t1 = MakeGlobal("w", DType::kFloat32, {64, 8}, kSharded, 1);
  Push(c, kTwo, t1);
  SaveAndWait(c, "two", 1);
  Push(c, kTwo, MakeGlobal("w", DType::kFloat32, {64, 8}, kSharded, 2));
  std::string job = StartSave(c, "two", 2);
  EXPECT_EQ(WaitPhase(c, job, "write")["phase"], "write");
  return {t1, job};
}

// After a takeover: step 1 listed and restored bit for bit, step 2 neither listed nor in
// the root, step 3 commits, and nothing is left after GC. (Step 2's staging dir may stay
// until then: a step above the newest committed one can still be saved, and the new
// leader never heard of the old leader's save of it.)
void ExpectTakenOver(LocalCluster& c, const GlobalTensor& t1) {
  EXPECT_EQ(ListedSteps(c), std::vector<int64_t>({1}));
  auto steps = storage::ListSteps(storage::DefaultEnv(), c.checkpoint_root(), "two");
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, std::vector<int64_t>({1}));
  ASSERT_TRUE(c.WaitAlive(2, 20000).ok());
  Push(c, kTwo, MakeGlobal("w", DType::kFloat32, {64, 8}, kSharded, 9));  // overwritten by the restore
  Json r = RestoreAndWait(c, "two", "1", Json::object());
  EXPECT_EQ(r.value("state", ""), "succeeded") << r.dump();
  ExpectShards(c, kTwo, t1, kSharded);
  Push(c, kTwo, MakeGlobal("w", DType::kFloat32, {64, 8}, kSharded, 3));
  SaveAndWait(c, "two", 3);
  EXPECT_EQ(ListedSteps(c), std::vector<int64_t>({1, 3}));
  auto gc = c.Call("POST", "/api/v1/gc");
  ASSERT_TRUE(gc.ok()) << gc.status().ToString();
  EXPECT_EQ(Leftovers(c, "two"), std::vector<std::string>{});
}

TEST(Ha, AStandbyNamesTheLeaderAndTakesOverWhenItIsKilledMidSave) {
  Etcd etcd;
  ASSERT_EQ(etcd.error(), "");
  auto c = StartHa(etcd, 1500);
  ASSERT_TRUE(c);
  const std::string leader = c->url(), standby = c->standby(0).url;
  // The standby says what it is, names the leader, and changes nothing.
  auto health = http::Client(standby, c->token()).Call("GET", "/healthz");
  ASSERT_TRUE(health.ok());
  EXPECT_EQ((*health)["role"], "standby");
  EXPECT_EQ((*health)["leader"], leader);
  auto write = http::Client(standby, c->token()).Send("PUT", "/api/v1/meshes/x", R"({"axes":[{"name":"d","size":1}]})");
  ASSERT_TRUE(write.ok());
  EXPECT_EQ(write->status, 503);
  EXPECT_EQ(write->headers["X-Tessera-Leader"], leader);
  Status refused = http::StatusFromResponse(write->status, write->body);
  EXPECT_EQ(refused.details().value("reason", ""), "not_leader") << refused.ToString();
  auto led = c->Call("GET", "/healthz");
  ASSERT_TRUE(led.ok());
  EXPECT_EQ((*led)["role"], "leader");
  EXPECT_EQ((*led)["epoch"], 1);

  auto [t1, job] = CommitOneThenStartTwo(*c);
  c->KillServer();
  auto now = c->WaitForLeader(10 * kLeaseS * 1000, leader);
  ASSERT_TRUE(now.ok()) << now.status().ToString() << ReadLog(c->dir() + "/tesserad-s0.log");
  EXPECT_EQ(*now, standby);
  auto h = c->Call("GET", "/healthz");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ((*h)["epoch"], 2);
  ExpectTakenOver(*c, t1);
}

TEST(Ha, APausedLeaderResumesFencedAndCommitsNothing) {
  Etcd etcd;
  ASSERT_EQ(etcd.error(), "");
  auto c = StartHa(etcd, 1000);
  ASSERT_TRUE(c);
  const std::string leader = c->url();
  auto [t1, job] = CommitOneThenStartTwo(*c);
  ASSERT_EQ(::kill(c->server_pid(), SIGSTOP), 0);
  auto now = c->WaitForLeader(10 * kLeaseS * 1000, leader);
  ASSERT_TRUE(now.ok()) << now.status().ToString();
  // Resumed, the old leader finds its lease stale and a newer epoch: it refuses to
  // commit and stops, deposed (exit status 3).
  ASSERT_EQ(::kill(c->server_pid(), SIGCONT), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(c->server_pid(), &status, 0), c->server_pid());
  // The new leader collected the failed save's staging dir at start; a worker that still
  // wrote into it afterwards had its join refused (the job ended) and removed its file.
  EXPECT_EQ(LeftoversOnceCollected(*c, "two"), std::vector<std::string>{});
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3) << c->server_log();
  const std::string log = ReadLog(c->server_log());
  EXPECT_NE(log.find("; stopping"), std::string::npos) << log;
  EXPECT_EQ(log.find("garbage collected"), std::string::npos) << log;
  ExpectTakenOver(*c, t1);
}

TEST(Ha, ASecondTesseradIsRefusedNamingTheHolder) {
  tools::ClusterOptions opts;
  opts.workers = 1;
  auto c = StartCluster(opts);
  ASSERT_TRUE(c);
  auto second = tools::Spawn({std::string(TESSERA_BIN_DIR) + "/tesserad", "--listen", "127.0.0.1:0",
                              "--data-dir", c->dir() + "/data2", "--checkpoint-root", c->checkpoint_root()},
                             {}, c->dir() + "/second.log", 10000);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("is held by the tesserad at " + c->url()), std::string::npos)
      << second.status().ToString();
}

TEST(Ha, BadDeploymentsGetClearErrors) {
  const std::string dir = "/tmp/tessera-ha-bad-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  auto run = [&](std::vector<std::string> args, const std::string& name) {
    args.insert(args.begin(), {std::string(TESSERA_BIN_DIR) + "/tesserad", "--listen", "127.0.0.1:0",
                               "--data-dir", dir + "/data-" + name});
    auto p = tools::Spawn(args, {}, dir + "/" + name + ".log", 10000);
    EXPECT_FALSE(p.ok());
    return p.ok() ? std::string() : p.status().message();
  };
  // etcd that does not answer.
  EXPECT_NE(run({"--checkpoint-root", dir + "/root", "--ha", "etcd://127.0.0.1:1"}, "noetcd")
                .find("etcd is unreachable at http://127.0.0.1:1"),
            std::string::npos);
  EXPECT_NE(run({"--ha", "http://x:1"}, "scheme").find("not an etcd:// address"), std::string::npos);
  // A root whose newest epoch a newer format wrote.
  ASSERT_TRUE(storage::CreateEpoch(storage::DefaultEnv(), dir + "/newer", 1,
                                   {{"format", "tessera-root/9"}, {"epoch", 1}})
                  .ok());
  EXPECT_NE(run({"--checkpoint-root", dir + "/newer"}, "newer").find("written by a newer tessera"),
            std::string::npos);
  // Two tesserads of one group on different roots.
  Etcd etcd;
  ASSERT_EQ(etcd.error(), "");
  auto first = tools::Spawn({std::string(TESSERA_BIN_DIR) + "/tesserad", "--listen", "127.0.0.1:0",
                             "--data-dir", dir + "/data-a", "--checkpoint-root", dir + "/root-a", "--ha",
                             etcd.url()},
                            {}, dir + "/a.log", 10000);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const bool leads = ::tessera::testing::Eventually([&] {  // it listens as a standby first, then campaigns
    auto h = http::Client(first->url, "", 2).Call("GET", "/healthz");
    return h.ok() && h->value("role", "") == "leader";
  });
  ASSERT_TRUE(leads) << ReadLog(dir + "/a.log");
  EXPECT_NE(run({"--checkpoint-root", dir + "/root-b", "--ha", etcd.url()}, "b").find("must share one root"),
            std::string::npos);
  ::kill(first->pid, SIGKILL);
  ::waitpid(first->pid, nullptr, 0);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace tessera::e2e
