// The REST contract end to end: auth, error bodies for bad input, mesh
// registration rules, events (SSE), metrics, and a bounded random-request fuzz
// after which the server is healthy and still saves.
#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "cluster_fixture.h"

namespace tessera::e2e {
namespace {

struct Case {
  std::string method, path, body;
  int status;
  std::string code;
  std::string field;  // expected details.field, if any
};

class Api : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tools::ClusterOptions opts;
    opts.workers = 2;
    cluster_ = StartCluster(opts).release();
    ASSERT_NE(cluster_, nullptr);
    const Mesh two{"two", {{"data", 2}}, 1};
    ASSERT_TRUE(cluster_->PutMesh("two", MeshToJson(two)["axes"]).ok());
    Push(*cluster_, two, MakeGlobal("w", DType::kFloat32, {8, 8}, Layout{{"data", "unsharded"}}, 1));
  }
  static void TearDownTestSuite() { delete cluster_; }

  http::RawResponse Send(const std::string& method, const std::string& path,
                         const std::string& body = "", bool auth = true) {
    http::Client client(cluster_->url(), auth ? cluster_->token() : "");
    auto r = client.Send(method, path, body);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : http::RawResponse{};
  }

  static LocalCluster* cluster_;
};
LocalCluster* Api::cluster_ = nullptr;

void ExpectError(const http::RawResponse& r, const Case& c) {
  EXPECT_EQ(r.status, c.status) << c.method << " " << c.path << " " << c.body << " → " << r.body;
  Json j = Json::parse(r.body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << c.path << ": " << r.body;
  EXPECT_EQ(j["error"]["code"], c.code) << c.path << ": " << r.body;
  EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
  if (!c.field.empty()) {
    EXPECT_EQ(j["error"]["details"]["field"], c.field) << c.path << ": " << r.body;
  }
}

TEST_F(Api, EveryRouteNeedsTheToken) {
  auto list = Send("GET", "/api/v1");
  ASSERT_EQ(list.status, 200);
  int checked = 0;
  const Json routes = Json::parse(list.body)["routes"];
  for (const auto& r : routes) {
    std::string path = std::regex_replace(r["path"].get<std::string>(), std::regex("\\{[^}]+\\}"), "x");
    if (path.rfind("/api/v1", 0) != 0) continue;
    auto res = Send(r["method"], path, "{}", /*auth=*/false);
    ExpectError(res, {r["method"], path, "", 401, "unauthenticated", "authorization"});
    ++checked;
  }
  EXPECT_GT(checked, 20);
  // Wrong token, and the open endpoints.
  http::Client wrong(cluster_->url(), "nope");
  EXPECT_EQ(wrong.Send("GET", "/api/v1/cluster")->status, 401);
  EXPECT_EQ(Send("GET", "/healthz", "", false).status, 200);
  EXPECT_EQ(Send("GET", "/metrics", "", false).status, 200);
}

TEST_F(Api, BadInputGetsTheRightError) {
  const std::string big(3 << 20, 'x');
  const std::vector<Case> cases = {
      {"PUT", "/api/v1/meshes/a", "{\"axes\":", 400, "invalid_argument", "request body"},
      {"PUT", "/api/v1/meshes/a", "[]", 400, "invalid_argument", "request body"},
      {"PUT", "/api/v1/meshes/a", R"({"axes":5})", 400, "invalid_argument", "axes"},
      {"PUT", "/api/v1/meshes/a", R"({"axes":[{"name":"d","size":0}]})", 400, "invalid_argument", "axes[0].size"},
      {"PUT", "/api/v1/meshes/a", R"({"axes":[{"name":"d","size":1}],"axes":[]})", 400, "invalid_argument", "request body"},
      {"PUT", "/api/v1/meshes/a", R"({"axes":[{"name":"d","size":2}],"devices_per_worker":"1"})", 400, "invalid_argument", "devices_per_worker"},
      {"PUT", "/api/v1/meshes/a%2F..%2Fb", R"({"axes":[{"name":"d","size":1}]})", 400, "invalid_argument", "mesh"},
      {"PUT", "/api/v1/meshes/a%20b", R"({"axes":[{"name":"d","size":1}]})", 400, "invalid_argument", "mesh"},
      {"PUT", "/api/v1/meshes/" + std::string(201, 'n'), R"({"axes":[{"name":"d","size":1}]})", 400, "invalid_argument", "mesh"},
      {"PUT", "/api/v1/meshes/big", R"({"axes":[{"name":"d","size":64}]})", 503, "unavailable", ""},
      {"GET", "/api/v1/meshes/nope", "", 404, "not_found", ""},
      {"POST", "/api/v1/meshes/nope/checkpoints", R"({"step":1})", 404, "not_found", ""},
      {"POST", "/api/v1/meshes/two/checkpoints", R"({"step":"1"})", 400, "invalid_argument", "step"},
      {"POST", "/api/v1/meshes/two/checkpoints", R"({})", 400, "invalid_argument", "step"},
      {"POST", "/api/v1/meshes/two/checkpoints", R"({"step":-1})", 400, "invalid_argument", "step"},
      {"POST", "/api/v1/meshes/two/checkpoints", R"({"step":1,"compression":"lz4"})", 400, "invalid_argument", "compression"},
      {"POST", "/api/v1/meshes/two/checkpoints", R"({"step":1,"tensors":["../x"]})", 400, "invalid_argument", "tensors"},
      {"POST", "/api/v1/meshes/two/checkpoints", R"({"step":1,"metadata":[1]})", 400, "invalid_argument", "metadata"},
      {"GET", "/api/v1/meshes/two/checkpoints/999", "", 404, "not_found", ""},
      {"GET", "/api/v1/meshes/two/checkpoints/abc", "", 400, "invalid_argument", "step"},
      {"GET", "/api/v1/meshes/two/checkpoints/latest", "", 404, "not_found", ""},
      {"POST", "/api/v1/meshes/two/checkpoints/999/restore", "{}", 404, "not_found", ""},
      {"POST", "/api/v1/meshes/two/checkpoints/999/verify", "{}", 404, "not_found", ""},
      {"DELETE", "/api/v1/meshes/two/checkpoints/999", "", 404, "not_found", ""},
      {"PUT", "/api/v1/meshes/two/retention", R"({"keep_last":"a"})", 400, "invalid_argument", "keep_last"},
      {"PUT", "/api/v1/meshes/two/retention", R"({"keep_last":-2})", 400, "invalid_argument", "keep_last"},
      {"GET", "/api/v1/jobs/j-nope", "", 404, "not_found", ""},
      {"GET", "/api/v1/jobs?limit=x", "", 400, "invalid_argument", "limit"},
      {"GET", "/api/v1/jobs/j-nope?wait_ms=abc", "", 400, "invalid_argument", "wait_ms"},
      {"POST", "/api/v1/jobs/j-nope/cancel", "{}", 404, "not_found", ""},
      {"GET", "/api/v1/workers/w-nope", "", 404, "not_found", ""},
      // A long-poll's report of what its saves build on (service/base_use.h), malformed.
      {"GET", "/api/v1/workers/w-nope/tasks?wait_ms=0&bases=%7B", "", 400, "invalid_argument", ""},
      {"GET", "/api/v1/workers/w-nope/tasks?wait_ms=0&bases=%5B%5D", "", 400, "invalid_argument", "bases"},
      {"POST", "/api/v1/workers/w-nope/tasks?wait_ms=0", R"({"bases":[]})", 400, "invalid_argument", "bases"},
      {"POST", "/api/v1/workers/w-nope/tasks?wait_ms=0&bases=%7B%7D", R"({"bases":{}})", 400, "invalid_argument", "bases"},
      {"GET", "/api/v1/workers/w-nope/tasks?wait_ms=0&bases=%7B%22m%22%3A5%7D", "", 400, "invalid_argument", "bases.m"},
      {"GET", "/api/v1/workers/w-nope/tasks?wait_ms=0&bases=%7B%22m%22%3A%7B%22base%22%3A%22x%22%7D%7D", "", 400, "invalid_argument", "bases.m.base"},
      {"GET", "/api/v1/workers/w-nope/tasks?wait_ms=0&bases=%7B%22m%22%3A%7B%22saves%22%3A%5B%5B1%5D%5D%7D%7D", "", 400, "invalid_argument", "bases.m.saves[0]"},
      {"POST", "/api/v1/workers", R"({"local_port":"x"})", 400, "invalid_argument", "local_port"},
      {"POST", "/api/v1/workers", R"({"local_port":70000})", 400, "invalid_argument", "local_port"},
      {"GET", "/api/v1/no/such/thing", "", 404, "not_found", "path"},
      {"DELETE", "/api/v1/cluster", "", 405, "method_not_allowed", "method"},
      {"POST", "/api/v1/meshes/two/checkpoints", big, 413, "payload_too_large", ""},
  };
  for (const auto& c : cases) ExpectError(Send(c.method, c.path, c.body), c);
}

TEST_F(Api, MeshRegistrationIsIdempotentAndChecked) {
  const std::string body = R"({"axes":[{"name":"x","size":2}]})";
  EXPECT_EQ(Send("PUT", "/api/v1/meshes/idem", body).status, 201);
  EXPECT_EQ(Send("PUT", "/api/v1/meshes/idem", body).status, 200);
  ExpectError(Send("PUT", "/api/v1/meshes/idem", R"({"axes":[{"name":"x","size":1}]})"),
              {"PUT", "idem", "", 409, "conflict", ""});
  // Wrong device count per worker names the worker.
  auto r = Send("PUT", "/api/v1/meshes/dpw", R"({"axes":[{"name":"x","size":4}],"devices_per_worker":2})");
  ExpectError(r, {"PUT", "dpw", "", 400, "invalid_argument", "devices_per_worker"});
  EXPECT_NE(r.body.find("w-worker-"), std::string::npos) << r.body;
  // A mesh shows its retention policy (none until one is set).
  Json mesh = Json::parse(Send("GET", "/api/v1/meshes/idem").body);
  EXPECT_EQ(mesh["retention"], Json({{"keep_last", nullptr}, {"keep_every_n_steps", nullptr}}));
  EXPECT_EQ(Send("PUT", "/api/v1/meshes/idem/retention", R"({"keep_last":3})").status, 200);
  mesh = Json::parse(Send("GET", "/api/v1/meshes/idem").body);
  EXPECT_EQ(mesh["retention"]["keep_last"], 3) << mesh.dump();
  EXPECT_EQ(Send("DELETE", "/api/v1/meshes/idem").status, 204);
  EXPECT_EQ(Send("DELETE", "/api/v1/meshes/idem").status, 404);
}

// A worker whose process died mid long-poll, or whose connection broke unseen,
// leaves a poll waiting in tesserad. Only the newest poll of a worker may take
// its tasks: the older one gives way at once, with none.
TEST_F(Api, OnlyTheNewestTaskPollOfAWorkerTakesItsTasks) {
  auto reg = Json::parse(Send("POST", "/api/v1/workers", R"({"name":"polls","local_port":1})").body);
  const std::string id = reg.value("id", "");
  ASSERT_FALSE(id.empty()) << reg.dump();
  ASSERT_EQ(Send("PUT", "/api/v1/meshes/polls",
                 R"({"axes":[{"name":"x","size":1}],"self_test":false,"workers":[")" + id + R"("]})")
                .status,
            201);
  const std::string polls = "/api/v1/workers/" + id + "/tasks?wait_ms=";
  std::atomic<bool> stale_done{false};
  Json stale;
  std::thread older([&] {
    stale = Json::parse(Send("GET", polls + "20000").body, nullptr, false);
    stale_done = true;
  });
  // Wait until the first poll waits in tesserad (the worker's record says so), not for a while.
  const bool waiting = ::tessera::testing::Eventually([&] {
    Json w = Json::parse(Send("GET", "/api/v1/workers/" + id).body, nullptr, false);
    return w.is_object() && w.value("task_polls_waiting", 0) == 1;
  });
  ASSERT_TRUE(waiting) << "the first poll never waited";
  EXPECT_FALSE(stale_done) << "the first poll should be waiting";
  // A newer poll (here one that does not wait) supersedes it; then a task is queued.
  EXPECT_EQ(Json::parse(Send("GET", polls + "0").body)["tasks"], Json::array());
  auto save = Json::parse(Send("POST", "/api/v1/meshes/polls/checkpoints", R"({"step":1})").body);
  older.join();
  EXPECT_EQ(stale.value("tasks", Json()), Json::array()) << "a superseded poll took " << stale.dump();
  Json fresh = Json::parse(Send("GET", polls + "10000").body, nullptr, false);
  ASSERT_TRUE(fresh.is_object() && fresh["tasks"].size() == 1) << fresh.dump();
  EXPECT_EQ(fresh["tasks"][0]["job"], save["job"]);
  // End the job: the simulated worker answers its snapshot task with a join that failed.
  EXPECT_EQ(fresh["tasks"][0]["kind"], "snapshot");
  const Json failed_join = {{"worker", id},
                            {"job", save["job"]},
                            {"snapshot", {{"tensors", Json::array()}}},
                            {"error", {{"code", "internal"}, {"message", "simulated"}}}};
  EXPECT_EQ(Send("PUT", "/api/v1/meshes/polls/checkpoints/1", failed_join.dump()).status, 200);
  auto job = Json::parse(
      Send("GET", "/api/v1/jobs/" + save["job"].get<std::string>() + "?wait_ms=10000").body);
  EXPECT_EQ(job["state"], "failed") << job.dump();
  EXPECT_EQ(Send("DELETE", "/api/v1/meshes/polls").status, 204);
  EXPECT_EQ(Send("DELETE", "/api/v1/workers/" + id).status, 204);
}

// Worker traffic has threads of its own; each worker's task long-poll holds
// one. With more workers than a small reserved pool, polls queued behind the
// pool and heartbeats behind them, and every worker went dead at once.
TEST_F(Api, ManyWorkersLongPollingAllWaitAndStillHeartbeat) {
  constexpr int kWorkers = 12;  // more than the 8 reserved threads there once were
  std::vector<std::string> ids;
  for (int i = 0; i < kWorkers; ++i) {
    auto reg = Json::parse(
        Send("POST", "/api/v1/workers",
             R"({"name":"many-)" + std::to_string(i) + R"(","local_port":1})")
            .body);
    ASSERT_TRUE(reg.contains("id")) << reg.dump();
    ids.push_back(reg["id"]);
  }
  std::vector<std::thread> polls;
  for (const std::string& id : ids) {
    polls.emplace_back([&, id] { Send("GET", "/api/v1/workers/" + id + "/tasks?wait_ms=30000"); });
  }
  // Every poll gets to wait in tesserad (each worker's record says so).
  int waiting = 0;
  (void)::tessera::testing::Eventually([&] {
    waiting = 0;
    for (const std::string& id : ids) {
      Json w = Json::parse(Send("GET", "/api/v1/workers/" + id).body, nullptr, false);
      if (w.is_object() && w.value("task_polls_waiting", 0) == 1) ++waiting;
    }
    return waiting == kWorkers;
  });
  EXPECT_EQ(waiting, kWorkers) << "task polls queued for a thread instead of waiting";
  // Heartbeats get through while every poll waits.
  for (const std::string& id : ids) {
    EXPECT_EQ(Send("POST", "/api/v1/workers/" + id + "/heartbeat", "{}").status, 200) << id;
  }
  // A newer poll that does not wait ends each waiting one.
  for (const std::string& id : ids) Send("GET", "/api/v1/workers/" + id + "/tasks?wait_ms=0");
  for (auto& t : polls) t.join();
  for (const std::string& id : ids) Send("DELETE", "/api/v1/workers/" + id);
}

TEST_F(Api, DashboardIsServedWithoutTheToken) {
  auto index = Send("GET", "/", "", /*auth=*/false);
  EXPECT_EQ(index.status, 200);
  EXPECT_EQ(index.headers["Content-Type"], "text/html; charset=utf-8");
  EXPECT_NE(index.body.find("assets/js/main.js"), std::string::npos) << index.body;
  auto js = Send("GET", "/assets/js/main.js", "", /*auth=*/false);
  EXPECT_EQ(js.status, 200);
  EXPECT_EQ(js.headers["Content-Type"], "text/javascript; charset=utf-8");
  ExpectError(Send("GET", "/assets/nope.js", "", false),
              {"GET", "/assets/nope.js", "", 404, "not_found", "path"});
  // The page itself is open; what it calls is not.
  EXPECT_EQ(Send("GET", "/api/v1/cluster", "", false).status, 401);
}

// The exposition passes Prometheus' own linter: every metric has HELP and TYPE,
// and a summary with no observations reports NaN quantiles, not 0.
TEST_F(Api, MetricsPassPromtool) {
  auto m = Send("GET", "/metrics", "", false);
  ASSERT_EQ(m.status, 200);
  std::istringstream lines(m.body);
  std::set<std::string> helped;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("# HELP ", 0) == 0) helped.insert(line.substr(7, line.find(' ', 7) - 7));
    if (line.rfind("# TYPE ", 0) == 0) {
      const std::string name = line.substr(7, line.find(' ', 7) - 7);
      EXPECT_TRUE(helped.count(name)) << "no HELP before " << line;
    }
  }
  // No restore has run on this cluster: its summary has no quantiles yet.
  EXPECT_NE(m.body.find("tessera_restore_duration_seconds{quantile=\"0.5\"} NaN"), std::string::npos)
      << m.body;
  const std::string file = "/tmp/tessera-metrics-" + std::to_string(::getpid()) + ".txt";
  {
    std::ofstream out(file);
    out << m.body;
  }
  ASSERT_EQ(std::system("command -v promtool >/dev/null"), 0)
      << "promtool is missing (Debian's prometheus package; bash tools/setup.sh installs it)";
  const std::string cmd = "promtool check metrics < " + file + " > " + file + ".out 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream report(file + ".out");
  std::string text((std::istreambuf_iterator<char>(report)), {});
  EXPECT_EQ(rc, 0) << text;
  std::remove(file.c_str());
  std::remove((file + ".out").c_str());
}

TEST_F(Api, EventsStreamJobProgressAndMetricsCount) {
  std::atomic<bool> saw_done{false};
  std::atomic<bool> subscribed{false};
  std::string received;
  std::thread reader([&] {
    httplib::Client cli(cluster_->url());
    cli.set_read_timeout(20, 0);
    cli.Get(("/api/v1/events?token=" + cluster_->token()).c_str(),
            [&](const char* data, size_t n) {
              received.append(data, n);
              if (received.find(": tessera events") != std::string::npos) subscribed = true;
              if (received.find("\"state\":\"succeeded\"") != std::string::npos &&
                  received.find("event: job") != std::string::npos) {
                saw_done = true;
                return false;
              }
              return received.size() < (4 << 20);
            });
  });
  // The stream's first bytes (": tessera events") say it is subscribed.
  ASSERT_TRUE(::tessera::testing::Eventually([&] { return subscribed.load(); })) << "the event stream never started";
  SaveAndWait(*cluster_, "two", 42);
  reader.join();
  EXPECT_TRUE(saw_done) << received.substr(0, 2000);
  EXPECT_NE(received.find("event: checkpoint"), std::string::npos);
  auto m = Send("GET", "/metrics", "", false);
  EXPECT_NE(m.body.find("tessera_jobs{state=\"succeeded\",kind=\"save\"} 1"), std::string::npos) << m.body;
  EXPECT_NE(m.body.find("tessera_workers{state=\"alive\"} 2"), std::string::npos);
  EXPECT_NE(m.body.find("tessera_save_duration_seconds_count 1"), std::string::npos);
  EXPECT_NE(m.body.find("tessera_http_requests_total{route=\"/api/v1/meshes/{m+}/checkpoints\",method=\"POST\",code=\"202\"}"),
            std::string::npos);
  auto cluster = Json::parse(Send("GET", "/api/v1/cluster").body);
  EXPECT_EQ(cluster["workers"]["alive"], 2);
  EXPECT_EQ(cluster["checkpoints"], 1);
  EXPECT_GT(cluster["storage_bytes"], 0);
}

TEST_F(Api, WorkerLocalApiErrors) {
  http::Client local = cluster_->WorkerClient(0);
  auto r = local.Send("PUT", "/v1/tensors/x?device=0&dtype=float32&shape=2&layout=unsharded", "12345678");
  ExpectError(*r, {"PUT", "", "", 400, "invalid_argument", "mesh"});
  r = local.Send("PUT", "/v1/tensors/x?mesh=two&device=0&dtype=float32&shape=2&layout=unsharded", "123");
  ExpectError(*r, {"PUT", "", "", 400, "invalid_argument", "body"});
  r = local.Send("PUT", "/v1/tensors/x?mesh=two&device=1&dtype=float32&shape=2&layout=unsharded", "12345678");
  ExpectError(*r, {"PUT", "", "", 400, "invalid_argument", "device"});
  r = local.Send("GET", "/v1/tensors/none?mesh=two&device=0");
  ExpectError(*r, {"GET", "", "", 404, "not_found", ""});
  r = local.Send("POST", "/v1/save?mesh=two&step=x", "{}");
  ExpectError(*r, {"POST", "", "", 400, "invalid_argument", "step"});
}

// Random requests with a fixed seed: no 5xx, every error is docs/openapi.json's JSON, and
// the server is healthy and saves afterwards.
TEST_F(Api, RandomRequestFuzzLeavesTheServerHealthy) {
  std::mt19937_64 rng(1234);
  const std::vector<std::string> methods = {"GET", "POST", "PUT", "DELETE"};
  const std::vector<std::string> roots = {
      "/api/v1/meshes/", "/api/v1/jobs/", "/api/v1/workers/", "/api/v1/meshes/two/checkpoints/",
      "/api/v1/meshes/fz/retention", "/api/v1/kv/", "/api/v1/", "/", "/api/v1/meshes/two/"};
  const std::vector<std::string> pieces = {"a", "..", "%2F", "%00", "latest", "-1", "99999999999999999999",
                                           "restore", "verify", "cancel", "tasks", "heartbeat", "%", "é", "x y", ""};
  auto random_json = [&](auto& self, int depth) -> Json {
    switch (rng() % (depth > 2 ? 5 : 7)) {
      case 0: return Json(static_cast<int64_t>(rng()) >> (rng() % 64));
      case 1: return Json(std::string(rng() % 8, 'a' + rng() % 26));
      case 2: return Json(rng() % 2 == 0);
      case 3: return Json(nullptr);
      case 4: return Json(1.5);
      case 5: {
        Json a = Json::array();
        for (int i = 0, n = rng() % 4; i < n; ++i) a.push_back(self(self, depth + 1));
        return a;
      }
      default: {
        Json o = Json::object();
        const char* keys[] = {"step", "axes", "name", "size", "tensors", "layouts", "target_mesh",
                              "keep_last", "local_port", "devices", "state", "workers", "compression"};
        for (int i = 0, n = rng() % 4; i < n; ++i) o[keys[rng() % std::size(keys)]] = self(self, depth + 1);
        return o;
      }
    }
  };
  int server_errors = 0;
  for (int i = 0; i < 400; ++i) {
    std::string path = roots[rng() % roots.size()];
    for (int k = 0, n = rng() % 3; k < n; ++k) path += (k ? "/" : "") + pieces[rng() % pieces.size()];
    std::string body = rng() % 3 == 0 ? std::string(rng() % 64, static_cast<char>(rng()))
                                      : random_json(random_json, 0).dump();
    const std::string method = methods[rng() % methods.size()];
    if (method == "DELETE" && path.find("two") != std::string::npos) continue;  // keep the fixture
    auto r = Send(method, path, body);
    if (r.status >= 500) {
      ++server_errors;
      ADD_FAILURE() << method << " " << path << " " << body << " → " << r.status << " " << r.body;
    }
    if (r.status >= 400) {
      Json j = Json::parse(r.body, nullptr, false);
      EXPECT_TRUE(j.is_object() && j.contains("error")) << method << " " << path << " → " << r.body;
    }
  }
  EXPECT_EQ(server_errors, 0);
  EXPECT_EQ(Send("GET", "/healthz", "", false).status, 200);
  SaveAndWait(*cluster_, "two", 4242);
}

}  // namespace
}  // namespace tessera::e2e
