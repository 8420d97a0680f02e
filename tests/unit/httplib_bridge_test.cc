// What the server relies on from cpp-httplib below its public API (httplib_bridge.h):
// a request fed through the bridge over a socket pair is parsed and answered, its
// body reads through the BodyReader (whole, chunked, over a limit), a refused
// request line gets the JSON error and closes, and a streamed response stops once
// the listening socket is -1. An update of the library that changes any of these
// fails here rather than in production.
#include "http/httplib_bridge.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "api/clock.h"

namespace tessera::http {
namespace {

constexpr int64_t kNoDeadline = 0;

// One end of a socket pair as the server's connection; the other is the client.
struct Pair {
  Pair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    const int flags = ::fcntl(fds[0], F_GETFL);
    ::fcntl(fds[0], F_SETFL, flags | O_NONBLOCK);  // as the gate accepts them
    conn = std::make_unique<Conn>(fds[0], nullptr, "10.0.0.1", 4242);
    client = fds[1];
  }
  ~Pair() { ::close(client); }

  void Send(const std::string& s) const {
    ASSERT_EQ(::send(client, s.data(), s.size(), MSG_NOSIGNAL), static_cast<ssize_t>(s.size()));
  }
  // What the server has sent so far: all of its answer once ServeOne has returned.
  std::string Received() const {
    std::string out;
    char buf[4096];
    for (;;) {
      pollfd p{client, POLLIN, 0};
      if (::poll(&p, 1, 0) <= 0) return out;
      const ssize_t n = ::recv(client, buf, sizeof(buf), 0);
      if (n <= 0) return out;
      out.append(buf, static_cast<size_t>(n));
    }
  }
  // Reads until `text` has come (or the server closes).
  std::string ReceivedThrough(const std::string& text) const {
    std::string out;
    char buf[4096];
    while (out.find(text) == std::string::npos) {
      const ssize_t n = ::recv(client, buf, sizeof(buf), 0);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }

  std::unique_ptr<Conn> conn;
  int client = -1;
};

BridgeOptions Options() {
  BridgeOptions o;
  o.max_body_bytes = 64;
  o.read_timeout_ms = 5000;
  o.write_timeout_ms = 5000;
  return o;
}

class HttplibBridgeTest : public ::testing::Test {
 protected:
  void SetUp() override { bridge_.SetListening(1000); }  // any fd: only -1 ends streams

  // Serves one request, answering it with `answer` after reading its body (the
  // body's outcome and bytes are kept).
  Served Serve(Pair& p, Answer answer, uint64_t limit = 64) {
    return bridge_.ServeOne(*p.conn, kNoDeadline, false, [&](BodyReader& body) {
      ++calls_;
      was_pending_ = body.pending();
      outcome_ = body.Read(limit, &body_);
      return answer;
    });
  }

  HttplibBridge bridge_{Options()};
  int calls_ = 0;
  bool was_pending_ = false;
  BodyReader::Outcome outcome_ = BodyReader::Outcome::kFailed;
  std::string body_;
};

Answer Ok(std::string body = "{\"ok\":true}") {
  Answer a;
  a.response.status = 200;
  a.response.body = std::move(body);
  return a;
}

TEST_F(HttplibBridgeTest, ARequestIsParsedAndAnsweredAndTheConnectionKeptAlive) {
  Pair p;
  p.Send("GET /x?a=1 HTTP/1.1\r\nHost: h\r\n\r\n");
  const Served served = Serve(p, Ok());
  EXPECT_TRUE(served.keep_alive);
  EXPECT_FALSE(served.body_unread);
  EXPECT_EQ(calls_, 1);
  EXPECT_FALSE(was_pending_);  // GET: nothing left to read
  const std::string got = p.Received();
  EXPECT_EQ(got.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << got;
  EXPECT_NE(got.find("Content-Type: application/json\r\n"), std::string::npos) << got;
  EXPECT_NE(got.find("Keep-Alive: timeout=5, max=1000\r\n"), std::string::npos) << got;
  EXPECT_NE(got.find("\r\n\r\n{\"ok\":true}"), std::string::npos) << got;
}

TEST_F(HttplibBridgeTest, PipelinedRequestsStayBufferedForTheNextCall) {
  Pair p;
  p.Send("GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\nConnection: close\r\n\r\n");
  EXPECT_TRUE(Serve(p, Ok("1")).keep_alive);
  EXPECT_FALSE(p.conn->PendingHead().empty());  // the second, read along with the first
  EXPECT_FALSE(Serve(p, Ok("2")).keep_alive);   // it asked to close
  const std::string got = p.Received();
  EXPECT_NE(got.find("\r\n\r\n1HTTP/1.1 200 OK"), std::string::npos) << got;
  EXPECT_NE(got.find("Connection: close\r\n"), std::string::npos) << got;
}

TEST_F(HttplibBridgeTest, ABodyIsReadThroughTheReaderWithoutAFormCap) {
  Pair p;
  const std::string body(40, 'b');  // a "form" over httplib's own 8 KiB form cap would be refused
  p.Send(
      "POST /x HTTP/1.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
      "Content-Length: 40\r\n\r\n" +
      body);
  EXPECT_TRUE(Serve(p, Ok()).keep_alive);
  EXPECT_TRUE(was_pending_);
  EXPECT_EQ(outcome_, BodyReader::Outcome::kRead);
  EXPECT_EQ(body_, body);
}

TEST_F(HttplibBridgeTest, AChunkedBodyIsDecoded) {
  Pair p;
  p.Send(
      "PUT /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n "
      "world\r\n0\r\n\r\n");
  EXPECT_TRUE(Serve(p, Ok()).keep_alive);
  EXPECT_EQ(outcome_, BodyReader::Outcome::kRead);
  EXPECT_EQ(body_, "hello world");
}

TEST_F(HttplibBridgeTest, AChunkedBodyPastTheLimitStopsBeingRead) {
  Pair p;
  p.Send(
      "PUT /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n12345678\r\n8\r\n12345678\r\n"
      "0\r\n\r\n");
  Answer refusal = Ok();
  refusal.body_unread = true;
  const Served served = Serve(p, refusal, 10);
  EXPECT_EQ(outcome_, BodyReader::Outcome::kTooLarge);
  EXPECT_FALSE(served.keep_alive);
  EXPECT_TRUE(served.body_unread);
  EXPECT_NE(p.Received().find("Connection: close\r\n"), std::string::npos);
}

TEST_F(HttplibBridgeTest, ADeclaredLengthOverTheLibrarysLimitIsTooLarge) {
  Pair p;
  p.Send("POST /x HTTP/1.1\r\nContent-Length: 100\r\n\r\n" + std::string(100, 'x'));
  Serve(p, Ok(), 1000);  // within the handler's limit, over max_body_bytes (64)
  EXPECT_EQ(outcome_, BodyReader::Outcome::kTooLarge);
}

TEST_F(HttplibBridgeTest, ABodyCutShortFails) {
  Pair p;
  p.Send("POST /x HTTP/1.1\r\nContent-Length: 50\r\n\r\nonly this");
  ::shutdown(p.client, SHUT_WR);
  Serve(p, Ok());
  EXPECT_EQ(outcome_, BodyReader::Outcome::kFailed);
}

TEST_F(HttplibBridgeTest, ADeleteBodyArrivesRead) {
  Pair p;
  p.Send("DELETE /x HTTP/1.1\r\nContent-Length: 4\r\n\r\nabcd");
  Serve(p, Ok());
  EXPECT_FALSE(was_pending_);
  EXPECT_EQ(body_, "abcd");
}

TEST_F(HttplibBridgeTest, ABadRequestLineGetsTheJsonErrorAndCloses) {
  Pair p;
  p.Send("BREW /pot HTTP/1.1\r\n\r\n");
  const Served served = Serve(p, Ok());
  EXPECT_EQ(calls_, 0);
  EXPECT_FALSE(served.keep_alive);
  const std::string got = p.Received();
  EXPECT_EQ(got.rfind("HTTP/1.1 400", 0), 0u) << got;
  EXPECT_NE(got.find("\"invalid_argument\""), std::string::npos) << got;
  EXPECT_NE(got.find("Connection: close\r\n"), std::string::npos) << got;
}

TEST_F(HttplibBridgeTest, AnAnswerThatClosesClosesAndErrorsKeepTheirBody) {
  Pair p;
  p.Send("GET /x HTTP/1.1\r\n\r\n");
  Answer a;
  a.response = Response::Error(NotFound("no such thing"));
  a.close = true;
  EXPECT_FALSE(Serve(p, a).keep_alive);
  const std::string got = p.Received();
  EXPECT_EQ(got.rfind("HTTP/1.1 404", 0), 0u) << got;
  EXPECT_NE(got.find("no such thing"), std::string::npos) << got;
  EXPECT_NE(got.find("Connection: close\r\n"), std::string::npos) << got;
}

TEST_F(HttplibBridgeTest, AHandlersExceptionIsA500) {
  Pair p;
  p.Send("GET /x HTTP/1.1\r\n\r\n");
  bridge_.ServeOne(*p.conn, kNoDeadline, false,
                   [](BodyReader&) -> Answer { throw std::runtime_error("boom"); });
  const std::string got = p.Received();
  EXPECT_EQ(got.rfind("HTTP/1.1 500", 0), 0u) << got;
  EXPECT_NE(got.find("internal error: boom"), std::string::npos) << got;
}

TEST_F(HttplibBridgeTest, AStreamedResponseEndsOnceTheListeningSocketIsGone) {
  Pair p;
  p.Send("GET /events HTTP/1.1\r\n\r\n");
  std::promise<void> stopped;
  std::shared_future<void> stopped_f = stopped.get_future().share();
  std::atomic<int> calls{0};
  Answer a;
  a.response.content_type = "text/event-stream";
  a.response.stream = [&calls, stopped_f](const std::function<bool(std::string_view)>& write) {
    if (++calls > 1) return false;  // called again after the stop: the library no longer checks
    const bool sent = write("data: 1\n\n");
    stopped_f.wait();  // the server stops while the stream waits for its next event
    return sent;
  };
  std::promise<Served> served;
  std::thread t([&] {
    served.set_value(bridge_.ServeOne(*p.conn, kNoDeadline, false, [&](BodyReader&) { return a; }));
  });
  const std::string first = p.ReceivedThrough("data: 1\n\n");
  EXPECT_NE(first.find("Transfer-Encoding: chunked\r\n"), std::string::npos) << first;
  bridge_.SetListening(-1);
  stopped.set_value();
  const Served s = served.get_future().get();
  t.join();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_FALSE(s.keep_alive);  // the stream never sent its last chunk
}

}  // namespace
}  // namespace tessera::http
