// The coordination endpoints over real HTTP against a real tesserad: barriers
// with concurrent clients, KV with a blocking GET, preemption sync points,
// auth and bad names; and a SIGTERM that must wake waiters, after which a
// restarted tesserad still has the KV values.
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <functional>
#include <thread>

#include "cluster_fixture.h"

namespace tessera::e2e {
namespace {

constexpr int64_t kLong = 20000;  // ms; only reached if tesserad is broken

class CoordinationApi : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tools::ClusterOptions opts;
    opts.workers = 2;
    cluster_ = StartCluster(opts).release();
    ASSERT_NE(cluster_, nullptr);
    ASSERT_TRUE(cluster_->PutMesh("pm", Json::array({{{"name", "data"}, {"size", 2}}})).ok());
  }
  static void TearDownTestSuite() { delete cluster_; }

  static http::RawResponse Send(const std::string& method, const std::string& path,
                                const std::string& body = "", bool auth = true,
                                const std::string& content_type = "application/json") {
    http::Client client(cluster_->url(), auth ? cluster_->token() : "", 60);
    auto r = client.Send(method, path, body, content_type);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : http::RawResponse{};
  }
  static Json Body(const http::RawResponse& r) { return Json::parse(r.body, nullptr, false); }

  static LocalCluster* cluster_;
};
LocalCluster* CoordinationApi::cluster_ = nullptr;

// The error body of `r`, after checking its status and code.
Json ExpectError(const http::RawResponse& r, int status, const std::string& code) {
  EXPECT_EQ(r.status, status) << r.body;
  Json j = Json::parse(r.body, nullptr, false);
  if (!j.is_object() || !j.contains("error")) {
    ADD_FAILURE() << "not an API error body: " << r.body;
    return Json::object();
  }
  EXPECT_EQ(j["error"]["code"], code) << r.body;
  return j["error"];
}

// Polls GET /api/v1/barriers until `name` has `n` arrived ranks (orders threads; ≤ 20 s).
Json WaitArrived(const std::string& name, size_t n,
                 const std::function<http::RawResponse()>& list) {
  Json found;
  const bool arrived = ::tessera::testing::Eventually([&] {
    Json all = Json::parse(list().body, nullptr, false);
    if (!all.is_array()) return false;
    for (const auto& b : all) {
      if (b["name"] == name && b["arrived_ranks"].size() == n) {
        found = b;
        return true;
      }
    }
    return false;
  });
  if (!arrived) ADD_FAILURE() << "barrier " << name << " never had " << n << " ranks";
  return found;
}

std::string BarrierBody(int64_t rank, int64_t world, int64_t timeout_ms = kLong) {
  return Json{{"rank", rank}, {"world", world}, {"timeout_ms", timeout_ms}}.dump();
}

TEST_F(CoordinationApi, FourClientsPassABarrierTogether) {
  auto list = [] { return Send("GET", "/api/v1/barriers"); };
  std::vector<http::RawResponse> results(4);
  std::atomic<int> released{0};
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      results[r] = Send("POST", "/api/v1/barriers/train/epoch-1", BarrierBody(r, 4));
      released++;
    });
  }
  // Three ranks wait: the listing shows who is missing, and nobody has been released.
  Json open = WaitArrived("train/epoch-1", 3, list);
  EXPECT_EQ(open["world"], 4);
  EXPECT_EQ(open["arrived_ranks"], Json({0, 1, 2}));
  EXPECT_EQ(open["missing_ranks"], Json({3}));
  EXPECT_EQ(released.load(), 0) << "a rank was released before rank 3 arrived";
  EXPECT_EQ(Body(Send("GET", "/api/v1/cluster"))["open_barriers"], 1);

  ranks.emplace_back([&] { results[3] = Send("POST", "/api/v1/barriers/train/epoch-1", BarrierBody(3, 4)); });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(results[r].status, 200) << results[r].body;
    Json j = Body(results[r]);
    EXPECT_EQ(j["name"], "train/epoch-1");
    EXPECT_EQ(j["world"], 4);
    EXPECT_EQ(j["generation"], 0);
    EXPECT_TRUE(j["waited_ms"].is_number_integer());
  }
  EXPECT_EQ(Body(list()), Json::array());
  // Reused: the next round is generation 1.
  ranks.clear();
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] { results[r] = Send("POST", "/api/v1/barriers/train/epoch-1", BarrierBody(r, 2)); });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(Body(results[0])["generation"], 1) << results[0].body;
  EXPECT_EQ(Body(results[1])["generation"], 1) << results[1].body;
  auto metrics = Send("GET", "/metrics", "", false);
  EXPECT_NE(metrics.body.find("tessera_barrier_waits_total{outcome=\"ok\"} 6"), std::string::npos)
      << metrics.body;
}

TEST_F(CoordinationApi, BarrierTimeoutIs504WithMissingRanks) {
  auto r = Send("POST", "/api/v1/barriers/lonely", BarrierBody(1, 3, 30));
  Json e = ExpectError(r, 504, "deadline_exceeded");
  EXPECT_EQ(e["details"]["missing_ranks"], Json({0, 2}));
  EXPECT_EQ(e["details"]["arrived_ranks"], Json({1}));
  // The timed-out rank left: nothing is open.
  EXPECT_EQ(Body(Send("GET", "/api/v1/barriers")), Json::array());
}

TEST_F(CoordinationApi, BarrierWorldMismatchIs409) {
  http::RawResponse first;
  std::thread t([&] { first = Send("POST", "/api/v1/barriers/mix", BarrierBody(0, 2)); });
  WaitArrived("mix", 1, [] { return Send("GET", "/api/v1/barriers"); });
  Json e = ExpectError(Send("POST", "/api/v1/barriers/mix", BarrierBody(1, 5)), 409, "conflict");
  EXPECT_EQ(e["details"]["world"], 5);
  EXPECT_EQ(e["details"]["open_world"], 2);
  e = ExpectError(Send("POST", "/api/v1/barriers/mix", BarrierBody(0, 2)), 409, "conflict");
  EXPECT_EQ(e["details"]["rank"], 0);
  EXPECT_EQ(Send("POST", "/api/v1/barriers/mix", BarrierBody(1, 2)).status, 200);
  t.join();
  EXPECT_EQ(first.status, 200) << first.body;
}

TEST_F(CoordinationApi, KvStoresRawBytesAndGetCanWait) {
  std::string binary;
  for (int i = 0; i < 256; ++i) binary += static_cast<char>(i);
  auto put = Send("PUT", "/api/v1/kv/job/blob", binary, true, "application/octet-stream");
  EXPECT_EQ(put.status, 204) << put.body;
  auto get = Send("GET", "/api/v1/kv/job/blob");
  EXPECT_EQ(get.status, 200);
  EXPECT_EQ(get.body, binary);
  EXPECT_EQ(get.headers["Content-Type"], "application/octet-stream");
  // curl -d sends a form content type: the bytes are kept as sent all the same.
  EXPECT_EQ(Send("PUT", "/api/v1/kv/job/form", "a=b&c", true, "application/x-www-form-urlencoded").status, 204);
  EXPECT_EQ(Send("GET", "/api/v1/kv/job/form").body, "a=b&c");

  // A blocking GET is answered by a PUT from another client.
  http::RawResponse waited;
  std::thread reader([&] { waited = Send("GET", "/api/v1/kv/job/late?wait_ms=" + std::to_string(kLong)); });
  const bool reader_waits = ::tessera::testing::Eventually([&] {  // tesserad's gauge says the reader waits
    return Send("GET", "/metrics", "", false).body.find("tessera_kv_waiting_gets 1") != std::string::npos;
  });
  ASSERT_TRUE(reader_waits) << "the reader never waited";
  EXPECT_EQ(Send("PUT", "/api/v1/kv/job/late", "10.0.0.7:5555", true, "text/plain").status, 204);
  reader.join();
  EXPECT_EQ(waited.status, 200) << waited.body;
  EXPECT_EQ(waited.body, "10.0.0.7:5555");

  Json e = ExpectError(Send("GET", "/api/v1/kv/job/never?wait_ms=20"), 404, "not_found");
  EXPECT_EQ(e["details"]["key"], "job/never");
  EXPECT_EQ(Body(Send("GET", "/api/v1/kv?prefix=job/")),
            Json({{"keys", {"job/blob", "job/form", "job/late"}}}));
  EXPECT_EQ(Send("DELETE", "/api/v1/kv/job/form").status, 204);
  ExpectError(Send("DELETE", "/api/v1/kv/job/form"), 404, "not_found");
  e = ExpectError(Send("PUT", "/api/v1/kv/job/huge", std::string((1 << 20) + 1, 'x'), true,
                       "application/octet-stream"),
                  413, "payload_too_large");
  EXPECT_EQ(e["details"]["key"], "job/huge");
  ExpectError(Send("GET", "/api/v1/kv/job/late?wait_ms=soon"), 400, "invalid_argument");
  auto metrics = Send("GET", "/metrics", "", false);
  EXPECT_NE(metrics.body.find("tessera_kv_ops_total{op=\"put\",outcome=\"ok\"}"), std::string::npos);
}

TEST_F(CoordinationApi, PreemptionSyncPointOverRest) {
  const std::string base = "/api/v1/meshes/pm/preemption";
  auto sync_body = [](int i, int64_t step) {
    return Json{{"worker", "w-worker-" + std::to_string(i)}, {"step", step}, {"timeout_ms", kLong}}.dump();
  };
  EXPECT_EQ(Body(Send("POST", base + "/sync", sync_body(0, 3))),
            Json({{"noticed", false}, {"sync_step", nullptr}}));
  auto notice = Send("POST", base, R"({"reason":"maintenance"})");
  ASSERT_EQ(notice.status, 200) << notice.body;
  EXPECT_EQ(Body(notice)["noticed"], true);
  EXPECT_TRUE(Body(notice)["sync_step"].is_null());
  ExpectError(Send("POST", "/api/v1/meshes/nope/preemption", "{}"), 404, "not_found");
  Json e = ExpectError(Send("POST", base + "/sync", R"({"worker":"w-stranger","step":1})"), 409, "conflict");
  EXPECT_EQ(e["details"]["worker"], "w-stranger");

  http::RawResponse w0;
  std::thread t([&] { w0 = Send("POST", base + "/sync", sync_body(0, 3)); });
  auto w1 = Send("POST", base + "/sync", sync_body(1, 4));
  t.join();
  EXPECT_EQ(Body(w0)["sync_step"], 5) << w0.body;
  EXPECT_EQ(Body(w1)["sync_step"], 5) << w1.body;
  Json state = Body(Send("GET", base));
  EXPECT_EQ(state["noticed"], true);
  EXPECT_EQ(state["reason"], "maintenance");
  EXPECT_EQ(state["sync_step"], 5);
  EXPECT_EQ(state["reported_steps"], Json({{"w-worker-0", 3}, {"w-worker-1", 4}}));
  EXPECT_EQ(Body(Send("GET", "/api/v1/cluster"))["preemption_notices"], 1);

  EXPECT_EQ(Send("DELETE", base).status, 204);
  EXPECT_EQ(Body(Send("GET", base))["noticed"], false);
}

TEST_F(CoordinationApi, NewRoutesNeedTheTokenAndValidNames) {
  const std::vector<std::pair<std::string, std::string>> routes = {
      {"POST", "/api/v1/barriers/b"},          {"GET", "/api/v1/barriers"},
      {"PUT", "/api/v1/kv/k"},                 {"GET", "/api/v1/kv/k"},
      {"GET", "/api/v1/kv"},                   {"DELETE", "/api/v1/kv/k"},
      {"POST", "/api/v1/meshes/pm/preemption"}, {"GET", "/api/v1/meshes/pm/preemption"},
      {"DELETE", "/api/v1/meshes/pm/preemption"},
      {"POST", "/api/v1/meshes/pm/preemption/sync"}};
  for (const auto& [method, path] : routes) {
    Json e = ExpectError(Send(method, path, "{}", /*auth=*/false), 401, "unauthenticated");
    EXPECT_EQ(e["details"]["field"], "authorization") << method << " " << path;
  }
  const std::vector<std::tuple<std::string, std::string, std::string>> bad = {
      {"POST", "/api/v1/barriers/a%20b", "barrier"},
      {"POST", "/api/v1/barriers/a%2F..%2Fb", "barrier"},
      {"POST", "/api/v1/barriers/" + std::string(201, 'b'), "barrier"},
      {"PUT", "/api/v1/kv/%7Einternal", "key"},
      {"GET", "/api/v1/kv/..%2Fetc", "key"},
      {"DELETE", "/api/v1/kv/a%00b", "key"},
      {"POST", "/api/v1/meshes/a%20b/preemption", "mesh"},
  };
  for (const auto& [method, path, field] : bad) {
    Json e = ExpectError(Send(method, path, R"({"rank":0,"world":1})"), 400, "invalid_argument");
    EXPECT_EQ(e["details"]["field"], field) << method << " " << path;
  }
  Json e = ExpectError(Send("POST", "/api/v1/barriers/b", R"({"rank":3,"world":2})"), 400,
                       "invalid_argument");
  EXPECT_EQ(e["details"]["field"], "rank");
  e = ExpectError(Send("POST", "/api/v1/barriers/b", "{\"rank\":"), 400, "invalid_argument");
  EXPECT_EQ(e["details"]["field"], "request body");
}

// SIGTERM while a rank waits at a barrier: it answers 503 and tesserad exits;
// restarted on the same data dir, tesserad still has the KV values.
TEST(CoordinationShutdown, SigtermWakesWaitersAndKvSurvivesARestart) {
  tools::ClusterOptions opts;
  opts.workers = 0;
  auto cluster = StartCluster(opts);
  ASSERT_NE(cluster, nullptr);
  http::Client client = cluster->Client();
  auto put = client.Send("PUT", "/api/v1/kv/keep", "kept", "application/octet-stream");
  ASSERT_TRUE(put.ok() && put->status == 204);

  http::RawResponse barrier;
  std::thread waiter([&] {
    http::Client c = cluster->Client();
    auto r = c.Send("POST", "/api/v1/barriers/b", BarrierBody(0, 2));
    if (r.ok()) barrier = *r;
  });
  WaitArrived("b", 1, [&] { return *client.Send("GET", "/api/v1/barriers"); });
  const pid_t pid = cluster->server_pid();
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  waiter.join();
  ExpectError(barrier, 503, "unavailable");
  const bool exited = ::tessera::testing::Eventually([&] { return ::waitpid(pid, nullptr, WNOHANG) == pid; });
  EXPECT_TRUE(exited) << "tesserad did not exit after SIGTERM:\n" << cluster->server_log();
  if (!exited) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }

  ASSERT_TRUE(cluster->RestartServer().ok());
  http::Client again = cluster->Client();
  auto get = again.Send("GET", "/api/v1/kv/keep");
  ASSERT_TRUE(get.ok());
  EXPECT_EQ(get->status, 200);
  EXPECT_EQ(get->body, "kept");
  EXPECT_EQ(Json::parse(again.Send("GET", "/api/v1/barriers")->body), Json::array());
}

}  // namespace
}  // namespace tessera::e2e
