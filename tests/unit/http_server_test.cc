// The HTTP server against clients that are slow, greedy or confused: a
// trickled header holds no thread and meets a deadline, connections over a
// per-peer cap and oversized headers are refused, worker traffic has threads
// of its own, pipelined requests are all answered, and HTTPS is verified.
#include "http/server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "http/client.h"
#include "http/tls.h"
#include "eventually.h"

namespace tessera::http {
namespace {

int Connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

void SendText(int fd, const std::string& s) {
  ASSERT_EQ(::send(fd, s.data(), s.size(), MSG_NOSIGNAL), static_cast<ssize_t>(s.size()));
}

// What the server sends until it closes (or `timeout_ms` passes).
std::string ReadUntilClosed(int fd, int timeout_ms) {
  std::string out;
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return out;
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    router_ = std::make_shared<Router>();
    router_->Add({"GET", "/ping", [](const Request&) { return Response::Json(200, {{"ok", true}}); },
                  "", false});
    router_->Add({"GET", "/block", [this](const Request&) {
                    blocked_++;
                    while (!release_) std::this_thread::sleep_for(std::chrono::milliseconds(5));
                    return Response::Json(200, {{"blocked", true}});
                  }, "", false});
    router_->Add({"GET", "/w/x", [](const Request&) { return Response::Json(200, {{"w", 1}}); },
                  "", true});
    router_->Add({"POST", "/w/json", [this](const Request& r) {
                    handled_++;
                    return Response::Json(200, {{"bytes", r.body.size()}});
                  }, "", true});
    router_->Add({"PUT", "/w/bulk", [this](const Request& r) {
                    handled_++;
                    return Response::Json(200, {{"bytes", r.body.size()}});
                  }, "", true, [](const Request& r) {
                    return static_cast<uint64_t>(std::stoull(r.Query("bytes").value_or("0")));
                  }});
  }
  void TearDown() override { release_ = true; }

  std::unique_ptr<Server> Serve(ServerOptions o) {
    o.port = 0;
    auto s = std::make_unique<Server>(router_, o);
    auto port = s->Bind();
    EXPECT_TRUE(port.ok()) << port.status().ToString();
    s->Start();
    return s;
  }
  static std::string Url(const Server& s, const char* scheme = "http") {
    return std::string(scheme) + "://127.0.0.1:" + std::to_string(s.port());
  }

  std::shared_ptr<Router> router_;
  std::atomic<int> blocked_{0};
  std::atomic<int> handled_{0};
  std::atomic<bool> release_{false};
};

TEST_F(HttpServerTest, TrickledHeadersHoldNoThread) {
  ServerOptions o;
  o.threads = 2;
  auto server = Serve(o);
  std::vector<int> slow;
  for (int i = 0; i < 200; ++i) {
    slow.push_back(Connect(server->port()));
    SendText(slow.back(), "GET /ping HTTP/1.1\r\nHost: x\r\n");
  }
  for (int fd : slow) SendText(fd, "X-Slow: 1\r\n");
  Client client(Url(*server), "", 5);
  for (int i = 0; i < 20; ++i) {
    auto r = client.Call("GET", "/ping");
    ASSERT_TRUE(r.ok()) << i << ": " << r.status().ToString();
  }
  EXPECT_GE(server->stats().waiting, 200u);  // and the client's idle keep-alive connection
  // A trickled header that is finished at last is served like any other.
  SendText(slow[0], "\r\n");
  EXPECT_NE(ReadUntilClosed(slow[0], 2000).find("200 OK"), std::string::npos);
  for (int fd : slow) ::close(fd);
}

TEST_F(HttpServerTest, AHeaderNotWholeInTimeGets408) {
  ServerOptions o;
  o.header_timeout_s = 1;
  auto server = Serve(o);
  int fd = Connect(server->port());
  SendText(fd, "GET /ping HTTP/1.1\r\n");
  const std::string got = ReadUntilClosed(fd, 5000);
  ::close(fd);
  EXPECT_EQ(got.rfind("HTTP/1.1 408", 0), 0u) << got;
  EXPECT_NE(got.find("\"deadline_exceeded\""), std::string::npos) << got;
  EXPECT_NE(got.find("\"field\":\"header\""), std::string::npos) << got;
  EXPECT_EQ(server->stats().header_timeouts, 1u);
  // A connection that never sends a byte meets the same deadline.
  int silent = Connect(server->port());
  EXPECT_EQ(ReadUntilClosed(silent, 5000).rfind("HTTP/1.1 408", 0), 0u);
  ::close(silent);
}

TEST_F(HttpServerTest, OverThePerPeerCapTheLongestWaitingGoes) {
  ServerOptions o;
  o.max_waiting_per_peer = 5;
  auto server = Serve(o);
  std::vector<int> fds;
  for (int i = 0; i < 8; ++i) {
    fds.push_back(Connect(server->port()));
    SendText(fds.back(), "GET /ping HTTP/1.1\r\n");
    // In the gate before the next arrives: the order of arrival is known.
    const uint64_t n = static_cast<uint64_t>(i) + 1;
    ASSERT_TRUE(testing::Eventually([&] {
      const ServerStats st = server->stats();
      return st.waiting + st.evicted == n;
    })) << i;
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(ReadUntilClosed(fds[i], 3000), "") << i;  // closed, unanswered
  EXPECT_EQ(server->stats().evicted, 3u);
  SendText(fds[7], "\r\n");
  EXPECT_NE(ReadUntilClosed(fds[7], 2000).find("200 OK"), std::string::npos);
  for (int fd : fds) ::close(fd);
}

TEST_F(HttpServerTest, AHeaderOfBareLineFeedsWaitsInTheGateNotOnAThread) {
  ServerOptions o;
  o.threads = 1;
  o.header_timeout_s = 1;
  auto server = Serve(o);
  int fd = Connect(server->port());
  SendText(fd, "GET /ping HTTP/1.1\nHost: x\n\n");
  // The only handler thread is free for others meanwhile.
  auto r = Client(Url(*server), "", 5).Call("GET", "/ping");
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(ReadUntilClosed(fd, 5000).rfind("HTTP/1.1 408", 0), 0u);
  ::close(fd);
}

TEST_F(HttpServerTest, AnOversizedHeaderGets431) {
  ServerOptions o;
  o.max_header_bytes = 1024;
  auto server = Serve(o);
  int fd = Connect(server->port());
  SendText(fd, "GET /ping HTTP/1.1\r\nX-Big: " + std::string(4096, 'a'));
  const std::string got = ReadUntilClosed(fd, 3000);
  ::close(fd);
  EXPECT_EQ(got.rfind("HTTP/1.1 431", 0), 0u) << got;
  EXPECT_NE(got.find("\"limit\":1024"), std::string::npos) << got;
  EXPECT_EQ(server->stats().header_too_large, 1u);
}

TEST_F(HttpServerTest, PipelinedRequestsAreAllAnswered) {
  auto server = Serve({});
  int fd = Connect(server->port());
  SendText(fd, "GET /ping HTTP/1.1\r\nHost: x\r\n\r\nGET /ping HTTP/1.1\r\nHost: x\r\n\r\n"
               "GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string got = ReadUntilClosed(fd, 3000);
  ::close(fd);
  size_t n = 0;
  for (size_t at = got.find("HTTP/1.1 200"); at != std::string::npos;
       at = got.find("HTTP/1.1 200", at + 1)) {
    ++n;
  }
  EXPECT_EQ(n, 3u) << got;
}

TEST_F(HttpServerTest, WorkerTrafficHasThreadsOfItsOwn) {
  ServerOptions o;
  o.threads = 1;
  o.token = "secret";
  o.reserved_prefix = "/w/";
  o.reserved_threads = 1;
  auto server = Serve(o);
  // Another client takes the only general thread.
  std::thread holder([&] { (void)Client(Url(*server), "", 30).Call("GET", "/block"); });
  EXPECT_TRUE(tessera::testing::Eventually([&] { return blocked_ > 0; }));
  auto r = Client(Url(*server), "secret", 5).Call("GET", "/w/x");
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  release_ = true;
  holder.join();
}

// The route, the credential and the declared size are checked from the header: a
// stranger's body is never waited for, nor read, and takes no thread for long.
TEST_F(HttpServerTest, ABodyWithoutTheTokenIsRefusedFromItsHeader) {
  ServerOptions o;
  o.threads = 2;
  o.token = "secret";
  auto server = Serve(o);
  std::vector<int> strangers;
  for (int i = 0; i < 50; ++i) {  // 25 times the handler threads, no body byte ever sent
    strangers.push_back(Connect(server->port()));
    SendText(strangers.back(), std::string(i % 2 ? "PUT /w/bulk?bytes=1000000000" : "POST /w/json") +
                                   " HTTP/1.1\r\nHost: x\r\nContent-Length: 536870912\r\n\r\n");
  }
  for (int fd : strangers) {
    const std::string answer = ReadUntilClosed(fd, 20000);  // closed once answered
    EXPECT_EQ(answer.rfind("HTTP/1.1 401", 0), 0u) << answer;
    EXPECT_NE(answer.find("Connection: close"), std::string::npos) << answer;
    ::close(fd);
  }
  EXPECT_EQ(handled_, 0);
  auto r = Client(Url(*server), "secret", 5).Call("POST", "/w/json", Json{{"a", 1}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(handled_, 1);
}

// A request without the credential is answered by the gate itself: with the one
// handler thread held by another client, 200 strangers (half of them sending
// their bodies at once) still get their 401, and none reaches a handler.
TEST_F(HttpServerTest, StrangersGetTheir401WithoutAHandlerThread) {
  ServerOptions o;
  o.threads = 1;
  o.token = "secret";
  auto server = Serve(o);
  std::thread holder([&] { (void)Client(Url(*server), "secret", 30).Call("GET", "/block"); });
  EXPECT_TRUE(tessera::testing::Eventually([&] { return blocked_ > 0; }));
  for (int i = 0; i < 200; ++i) {
    const int fd = Connect(server->port());
    SendText(fd, i % 2 ? "POST /w/json HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n\r\n{\"a\":1}"
                       : "PUT /w/bulk?bytes=1000000000 HTTP/1.1\r\nHost: x\r\n"
                         "Authorization: Bearer wrong\r\nContent-Length: 536870912\r\n\r\n");
    const std::string answer = ReadUntilClosed(fd, 20000);
    ASSERT_EQ(answer.rfind("HTTP/1.1 401", 0), 0u) << i << ": " << answer;
    EXPECT_NE(answer.find("\"field\":\"authorization\""), std::string::npos) << answer;
    ::close(fd);
  }
  EXPECT_EQ(server->stats().unauthenticated_at_gate, 200u);
  EXPECT_EQ(handled_, 0);
  release_ = true;
  holder.join();
  // The credential still gets through, and an open route needs none.
  auto r = Client(Url(*server), "secret", 5).Call("POST", "/w/json", Json{{"a", 1}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
}

TEST_F(HttpServerTest, ADeclaredBodyOverTheRoutesLimitGets413BeforeItIsSent) {
  ServerOptions o;
  o.token = "secret";
  o.max_json_body_bytes = 1000;
  auto server = Serve(o);
  auto ask = [&](const std::string& head) {
    int fd = Connect(server->port());
    SendText(fd, head + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer secret\r\n"
                        "Content-Length: 104857600\r\n\r\n");  // 100 MiB declared, none sent
    std::string answer = ReadUntilClosed(fd, 20000);
    ::close(fd);
    return answer;
  };
  std::string json = ask("POST /w/json");
  EXPECT_EQ(json.rfind("HTTP/1.1 413", 0), 0u) << json;
  EXPECT_NE(json.find("at most 1000 bytes"), std::string::npos) << json;
  std::string bulk = ask("PUT /w/bulk?bytes=4096");  // the route's own limit
  EXPECT_EQ(bulk.rfind("HTTP/1.1 413", 0), 0u) << bulk;
  EXPECT_NE(bulk.find("at most 4096 bytes"), std::string::npos) << bulk;
  EXPECT_EQ(handled_, 0);
  // Within the limits, both are served; a chunked body past one is refused too.
  Client client(Url(*server), "secret", 5);
  auto small = client.Send("PUT", "/w/bulk?bytes=4096", std::string(4096, 'x'),
                           "application/octet-stream");
  ASSERT_TRUE(small.ok()) << small.status().ToString();
  EXPECT_EQ(small->status, 200) << small->body;
  auto over = client.Send("PUT", "/w/bulk?bytes=4096", std::string(4097, 'x'),
                          "application/octet-stream");
  ASSERT_TRUE(over.ok()) << over.status().ToString();
  EXPECT_EQ(over->status, 413) << over->body;
}

// A self-signed certificate for 127.0.0.1 made by the openssl command.
std::string MakeCert(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::string cmd =
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
      "-subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 -keyout " + dir +
      "/key.pem -out " + dir + "/cert.pem 2>/dev/null";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return dir;
}

TEST_F(HttpServerTest, ServesHttpsToClientsThatTrustItsCa) {
  const std::string dir = MakeCert(::testing::TempDir() + "/tls-" + std::to_string(::getpid()));
  ServerOptions o;
  o.tls_cert_file = dir + "/cert.pem";
  o.tls_key_file = dir + "/key.pem";
  auto server = Serve(o);
  ASSERT_TRUE(server->tls());

  SetDefaultCaFile(dir + "/cert.pem");
  auto ok = Client(Url(*server, "https"), "", 5).Call("GET", "/ping");
  EXPECT_TRUE(ok.ok()) << ok.status().ToString();

  // Another CA: the server is not trusted, and the error says what to do.
  const std::string other = MakeCert(dir + "/other");
  SetDefaultCaFile(other + "/cert.pem");
  auto untrusted = Client(Url(*server, "https"), "", 5).Call("GET", "/ping");
  EXPECT_EQ(untrusted.status().code(), Code::kUnavailable);
  EXPECT_NE(untrusted.status().message().find("TESSERA_TLS_CA"), std::string::npos)
      << untrusted.status().ToString();

  // Plain HTTP to the HTTPS port fails at once instead of hanging.
  auto plain = Client(Url(*server), "", 5).Call("GET", "/ping");
  EXPECT_FALSE(plain.ok());
  EXPECT_GE(server->stats().tls_failures, 1u);
  SetDefaultCaFile("");
  std::filesystem::remove_all(dir);
}

TEST_F(HttpServerTest, ATlsKeyOtherUsersCouldReadIsRefused) {
  const std::string dir = MakeCert(::testing::TempDir() + "/tls-open-" + std::to_string(::getpid()));
  ASSERT_EQ(::chmod((dir + "/key.pem").c_str(), 0640), 0);
  ServerOptions o;
  o.tls_cert_file = dir + "/cert.pem";
  o.tls_key_file = dir + "/key.pem";
  Server server(router_, o);
  auto port = server.Bind();
  ASSERT_FALSE(port.ok());
  EXPECT_EQ(port.status().code(), Code::kInvalidArgument);
  EXPECT_NE(port.status().message().find("the TLS key " + dir + "/key.pem has mode 0640"),
            std::string::npos)
      << port.status().ToString();
  EXPECT_NE(port.status().message().find("chmod 600"), std::string::npos);
  EXPECT_EQ(port.status().details()["field"], "tls-key");
  std::filesystem::remove_all(dir);
}

TEST_F(HttpServerTest, TlsFilesThatCannotBeLoadedAreNamed) {
  ServerOptions o;
  o.tls_cert_file = "/nonexistent/cert.pem";
  o.tls_key_file = "/nonexistent/key.pem";
  Server server(router_, o);
  auto port = server.Bind();
  ASSERT_FALSE(port.ok());
  EXPECT_EQ(port.status().code(), Code::kInvalidArgument);
  EXPECT_NE(port.status().message().find("/nonexistent/cert.pem"), std::string::npos);
  EXPECT_EQ(port.status().details()["field"], "tls-cert");
}

}  // namespace
}  // namespace tessera::http
