// Clients that open connections and never finish a request (a trickled header,
// one line at a time, a body never sent, a data-port hello never sent) stall
// neither tesserad nor a worker: health checks answer, workers stay alive, saves
// and collectives succeed, and the strangers meet their deadline and are counted.
#include <arpa/inet.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <atomic>
#include <regex>
#include <thread>

#include "cluster_fixture.h"

namespace tessera::e2e {
namespace {

// A TCP connection to 127.0.0.1:`port`, or -1.
int ConnectLoopback(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Lets this test hold as many connections as its hard limit allows.
void RaiseFileLimit() {
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &lim);
}

// `n` connections to `url`, each sending a request header one line per second
// and never its end. A connection the server closes is opened again, so `n`
// stay open; the server's 408 answers are counted.
class Trickler {
 public:
  Trickler(const std::string& url, int n) : port_(std::stoi(url.substr(url.rfind(':') + 1))) {
    RaiseFileLimit();
    for (int i = 0; i < n; ++i) fds_.push_back(Open());
    thread_ = std::thread([this] { Loop(); });
  }
  ~Trickler() {
    stop_ = true;
    thread_.join();
    for (int fd : fds_) ::close(fd);
  }
  int open() const { return open_; }
  int answered_408() const { return answered_408_; }

 private:
  int Open() {
    int fd = ConnectLoopback(port_);
    if (fd >= 0 && !Send(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\n")) {
      ::close(fd);
      return -1;
    }
    return fd;
  }
  static bool Send(int fd, const std::string& s) {
    return ::send(fd, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size());
  }
  void Loop() {
    while (!stop_) {
      int open = 0;
      for (int& fd : fds_) {
        if (stop_) return;
        pollfd p{fd, POLLIN, 0};
        bool closed = fd < 0;
        if (!closed && ::poll(&p, 1, 0) > 0) {
          char buf[512];
          ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
          if (n > 0 && std::string(buf, static_cast<size_t>(n)).rfind("HTTP/1.1 408", 0) == 0) {
            answered_408_++;
          }
          closed = true;
        }
        if (!closed) closed = !Send(fd, "X-Trickle: 1\r\n");
        if (closed) {
          if (fd >= 0) ::close(fd);
          fd = Open();
        }
        open += fd >= 0;
      }
      open_ = open;
      for (int i = 0; i < 10 && !stop_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  const int port_;
  std::vector<int> fds_;
  std::atomic<bool> stop_{false};
  std::atomic<int> open_{0};
  std::atomic<int> answered_408_{0};
  std::thread thread_;
};

// Times `n` calls of `fn` (which must succeed); prints and returns the slowest in ms.
template <typename Fn>
double TimeCalls(const char* what, int n, Fn fn) {
  std::vector<double> ms;
  for (int i = 0; i < n; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                     .count());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::sort(ms.begin(), ms.end());
  std::printf("%s with 1000 trickling connections open: p50 %.2f ms, max %.2f ms\n", what,
              ms[ms.size() / 2], ms.back());
  return ms.back();
}

const Mesh kMesh{"two", {{"data", 2}}, 1};

TEST(HostileClients, TrickledHeadersStallNeitherTesseradNorItsWorkers) {
  tools::ClusterOptions opts;
  opts.workers = 2;
  opts.server_args = {"--header-timeout-s", "3"};
  auto c = StartCluster(opts);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->PutMesh("two", MeshToJson(kMesh)["axes"]).ok());
  Push(*c, kMesh, MakeGlobal("w", DType::kFloat32, {64, 64}, Layout{{"data", "unsharded"}}, 1));

  Trickler slow(c->url(), 1000);
  (void)::tessera::testing::Eventually([&] { return slow.open() >= 1000; });
  ASSERT_EQ(slow.open(), 1000);
  http::Client health(c->url(), "", 5);
  TimeCalls("GET /healthz", 20, [&] {
    auto r = health.Send("GET", "/healthz");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->status, 200) << r->body;
  });

  // Heartbeats get through: a save succeeds and every worker is alive.
  Json job = SaveAndWait(*c, "two", 1);
  EXPECT_EQ(job["state"], "succeeded") << job.dump();
  auto workers = c->Call("GET", "/api/v1/workers");
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->size(), 2u);
  for (const auto& w : *workers) EXPECT_EQ(w["state"], "alive") << w.dump();

  // The trickled headers meet their deadline, and the drops are counted.
  (void)::tessera::testing::Eventually([&] { return slow.answered_408() > 0; });
  EXPECT_GT(slow.answered_408(), 0);
  auto metrics = c->Client().Send("GET", "/metrics");
  ASSERT_TRUE(metrics.ok());
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      metrics->body, m,
      std::regex("tessera_http_connections_dropped_total\\{reason=\"header_timeout\"\\} ([0-9]+)")))
      << metrics->body;
  EXPECT_GT(std::stoi(m[1]), 0);
}

TEST(HostileClients, TrickledHeadersDoNotStallALocalApi) {
  tools::ClusterOptions opts;
  opts.workers = 2;
  auto c = StartCluster(opts);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->PutMesh("two", MeshToJson(kMesh)["axes"]).ok());

  Trickler slow(c->worker_url(0), 1000);
  (void)::tessera::testing::Eventually([&] { return slow.open() >= 1000; });
  ASSERT_EQ(slow.open(), 1000);
  http::Client local = c->WorkerClient(0, 5);
  TimeCalls("GET /v1/tensors (local API)", 20, [&] {
    auto r = local.Call("GET", "/v1/tensors");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  });
  // A trainer pushes its shards and saves through that API meanwhile.
  const GlobalTensor t = MakeGlobal("w", DType::kFloat32, {64, 64}, Layout{{"data", "unsharded"}}, 2);
  Push(*c, kMesh, t);
  Json job = SaveAndWait(*c, "two", 2);
  EXPECT_EQ(job["state"], "succeeded") << job.dump();
}

TEST(HostileClients, ALocalApiRefusesRequestsWithoutItsCredential) {
  tools::ClusterOptions opts;
  opts.workers = 1;
  auto c = StartCluster(opts);
  ASSERT_TRUE(c);
  const std::string url = c->worker_url(0);
  for (const std::string token : {"", "not-the-credential"}) {
    http::Client stranger(url, token, 5);
    for (const auto& [method, path] : std::vector<std::pair<std::string, std::string>>{
             {"GET", "/v1/tensors"},
             {"DELETE", "/v1/tensors/w?mesh=m"},
             {"POST", "/v1/save?mesh=m&step=1"},
             {"POST", "/v1/collectives/all_reduce?mesh=m&dtype=float32&shape=1"},
             {"GET", "/v1/preemption?mesh=m&step=1"}}) {
      auto r = stranger.Send(method, path, method == "GET" ? "" : "{}");
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->status, 401) << method << " " << path << ": " << r->body;
      EXPECT_NE(r->body.find("local credential"), std::string::npos) << r->body;
    }
    // Liveness stays open.
    auto health = stranger.Send("GET", "/healthz");
    ASSERT_TRUE(health.ok());
    EXPECT_EQ(health->status, 200);
  }
  EXPECT_TRUE(c->WorkerClient(0).Call("GET", "/v1/tensors").ok());

  // The credential is a file only the worker's user can read, in a directory
  // only that user can enter.
  const std::string path = http::DefaultLocalCredentialPath(std::stoi(url.substr(url.rfind(':') + 1)));
  struct stat file {}, dir {};
  ASSERT_EQ(::stat(path.c_str(), &file), 0) << path;
  ASSERT_EQ(::stat(path.substr(0, path.rfind('/')).c_str(), &dir), 0);
  EXPECT_EQ(file.st_mode & 0777, 0600u);
  EXPECT_EQ(dir.st_mode & 0777, 0700u);
  EXPECT_EQ(file.st_uid, ::getuid());
}

// What `n` connections to `url`, each sending `head` (a request header that
// declares a body) and never a byte of the body, are answered, in order. Each is
// read until the server closes it.
std::vector<std::string> Unsent(const std::string& url, const std::string& head, int n) {
  const int port = std::stoi(url.substr(url.rfind(':') + 1));
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    const int fd = ConnectLoopback(port);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::send(fd, head.data(), head.size(), MSG_NOSIGNAL), static_cast<ssize_t>(head.size()));
    fds.push_back(fd);
  }
  std::vector<std::string> answers;
  for (int fd : fds) {
    std::string out;
    char buf[4096];
    for (;;) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 60000) <= 0) break;
      const ssize_t got = ::recv(fd, buf, sizeof(buf), 0);
      if (got <= 0) break;
      out.append(buf, static_cast<size_t>(got));
    }
    answers.push_back(out.substr(0, out.find("\r\n")));
    ::close(fd);
  }
  return answers;
}

// 300 requests that declare a 512 MiB body and never send it, without the
// credential, are answered 401 from their header on tesserad and on a worker's
// local API; one with the credential but over a JSON route's limit gets 413.
TEST(HostileClients, BodiesAreRefusedFromTheirHeaderOnBothServers) {
  tools::ClusterOptions opts;
  opts.workers = 1;
  auto c = StartCluster(opts);
  ASSERT_TRUE(c);
  const std::string declares = " HTTP/1.1\r\nHost: x\r\nContent-Length: 536870912\r\n";
  for (const auto& [url, head] : std::vector<std::pair<std::string, std::string>>{
           {c->url(), "POST /api/v1/meshes/m/checkpoints" + declares},
           {c->worker_url(0), "PUT /v1/tensors/w?mesh=m&device=0&dtype=uint8&shape=536870912"
                              "&layout=unsharded" + declares}}) {
    for (const std::string& answer : Unsent(url, head + "\r\n", 300)) {
      EXPECT_EQ(answer, "HTTP/1.1 401 Unauthorized") << url;
    }
  }
  for (const auto& [url, head] : std::vector<std::pair<std::string, std::string>>{
           {c->url(), "POST /api/v1/meshes/m/checkpoints" + declares + "Authorization: Bearer " +
                          c->token() + "\r\n"},
           {c->worker_url(0), "POST /v1/save?mesh=m&step=1" + declares + "Authorization: Bearer " +
                                  http::FindLocalCredential(c->worker_url(0)) + "\r\n"}}) {
    for (const std::string& answer : Unsent(url, head + "\r\n", 1)) {
      EXPECT_EQ(answer, "HTTP/1.1 413 Payload Too Large") << url;
    }
  }
  // Both still answer their clients.
  EXPECT_TRUE(c->Call("GET", "/api/v1/workers").ok());
  EXPECT_TRUE(c->WorkerClient(0).Call("GET", "/v1/tensors").ok());
}

// `n` TCP connections to 127.0.0.1:`port` that never send a byte. Whenever the
// server closes one, it is opened again at once, so `n` are always held.
class SilentFlood {
 public:
  SilentFlood(int port, int n) : port_(port), fds_(static_cast<size_t>(n), -1) {
    RaiseFileLimit();
    thread_ = std::thread([this] { Loop(); });
  }
  ~SilentFlood() {
    stop_ = true;
    thread_.join();
    for (int fd : fds_) ::close(fd);
  }
  int held() const { return held_; }
  int64_t reopened() const { return reopened_; }

 private:
  void Loop() {
    std::vector<pollfd> p(fds_.size());
    while (!stop_) {
      int held = 0;
      for (size_t i = 0; i < fds_.size(); ++i) {
        if (fds_[i] < 0) {
          fds_[i] = ConnectLoopback(port_);
          reopened_ += fds_[i] >= 0;
        }
        held += fds_[i] >= 0;
        p[i] = {fds_[i], POLLIN, 0};
      }
      held_ = held;
      if (::poll(p.data(), p.size(), 20) <= 0) continue;
      for (size_t i = 0; i < p.size(); ++i) {
        if (p[i].fd >= 0 && p[i].revents != 0) {  // closed by the server (nothing else comes)
          ::close(fds_[i]);
          fds_[i] = -1;
        }
      }
    }
  }

  const int port_;
  std::vector<int> fds_;
  std::atomic<bool> stop_{false};
  std::atomic<int> held_{0};
  std::atomic<int64_t> reopened_{0};
  std::thread thread_;
};

// A worker's data port held by 1,000 silent connections (opened again as the
// worker drops them) still admits the peers of a mesh: it registers (its
// self-test forms the mesh's groups), runs collectives, and forms again after
// it is deleted and registered anew. The strangers are refused and counted.
TEST(HostileClients, AFloodedDataPortStillAdmitsItsMesh) {
  tools::ClusterOptions opts;
  opts.workers = 2;
  auto c = StartCluster(opts);
  ASSERT_TRUE(c);
  const int port = DataPort(*c, 0);
  ASSERT_GT(port, 0);
  auto refused = [&] { return RefusedAtDataPort(*c, 0); };
  const int64_t refused_before = refused();

  SilentFlood flood(port, 1000);
  while (flood.held() < 1000) std::this_thread::yield();
  // The worker has dropped some already: its table holds far fewer than 1,000.
  while (refused() < refused_before + 1000) std::this_thread::yield();

  std::string floats;
  for (float f : {1.0f, 2.0f}) floats.append(reinterpret_cast<const char*>(&f), sizeof(f));
  for (int round = 0; round < 2; ++round) {
    auto m = c->PutMesh("two", MeshToJson(kMesh)["axes"]);
    ASSERT_TRUE(m.ok()) << "round " << round << ": " << m.status().ToString();
    for (int i = 0; i < 3; ++i) {
      std::vector<Result<http::RawResponse>> answers(2, Unavailable("not run"));
      std::vector<std::thread> ranks;
      for (int r = 0; r < 2; ++r) {
        ranks.emplace_back([&, r] {
          answers[r] = c->WorkerClient(r, 60).Send(
              "POST", "/v1/collectives/all_reduce?mesh=two&dtype=float32&shape=2", floats,
              "application/octet-stream");
        });
      }
      for (auto& t : ranks) t.join();
      for (int r = 0; r < 2; ++r) {
        ASSERT_TRUE(answers[r].ok()) << answers[r].status().ToString();
        ASSERT_EQ(answers[r]->status, 200) << "rank " << r << ": " << answers[r]->body;
        float sum[2];
        ASSERT_EQ(answers[r]->body.size(), sizeof(sum));
        std::memcpy(sum, answers[r]->body.data(), sizeof(sum));
        EXPECT_EQ(sum[0], 2.0f);
        EXPECT_EQ(sum[1], 4.0f);
      }
    }
    ASSERT_TRUE(c->Call("DELETE", "/api/v1/meshes/two").ok());
  }
  EXPECT_GE(flood.held(), 900);
  std::printf("the flood held %d connections and opened %lld after drops; the data port refused "
              "%lld\n",
              flood.held(), static_cast<long long>(flood.reopened()),
              static_cast<long long>(refused() - refused_before));
}

TEST(HostileClients, ACredentialDirectoryOthersCanWriteToIsRefused) {
  const std::string dir = ::testing::TempDir() + "/open-" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  Status st = http::WriteLocalCredential(dir + "/local.key", "x");
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find(dir), std::string::npos) << st.ToString();
  ::rmdir(dir.c_str());
}

}  // namespace
}  // namespace tessera::e2e
