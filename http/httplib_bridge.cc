#include "http/httplib_bridge.h"

#include <httplib.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <tuple>

#include "api/clock.h"

namespace tessera::http {
namespace {

// The request side of a connection for httplib's parser: reads from the Conn's
// buffer first, then the socket, and fails once the request's deadline has passed.
class ConnStream final : public httplib::Stream {
 public:
  ConnStream(Conn& c, int read_timeout_ms, int write_timeout_ms, int64_t deadline_ms)
      : c_(c),
        read_timeout_ms_(read_timeout_ms),
        write_timeout_ms_(write_timeout_ms),
        deadline_ms_(deadline_ms) {}

  bool is_readable() const override {
    if (c_.Buffered() > 0) return true;
    if (c_.ssl != nullptr && SSL_pending(c_.ssl) > 0) return true;
    return Wait(POLLIN);
  }

  bool is_writable() const override {
    // A peer that has closed is not writable, whatever the socket buffer says.
    pollfd p{c_.fd, POLLOUT, 0};
    if (::poll(&p, 1, write_timeout_ms_) <= 0 || (p.revents & (POLLERR | POLLHUP)) != 0) {
      return false;
    }
    return (p.revents & POLLOUT) != 0;
  }

  ssize_t read(char* ptr, size_t size) override {
    for (;;) {
      if (c_.Buffered() > 0) {
        const size_t n = std::min(size, c_.Buffered());
        std::memcpy(ptr, c_.buf.data() + c_.pos, n);
        c_.pos += n;
        if (c_.pos == c_.buf.size()) {
          c_.buf.clear();
          c_.pos = 0;
        }
        return static_cast<ssize_t>(n);
      }
      if (deadline_ms_ > 0 && MonoMs() >= deadline_ms_) return -1;
      bool wait_write = false;
      const bool open = c_.ReadAvailable(&wait_write);
      if (c_.Buffered() > 0) continue;
      if (!open) return 0;  // the peer closed
      if (!Wait(wait_write ? POLLOUT : POLLIN)) return -1;
    }
  }

  ssize_t write(const char* ptr, size_t size) override {
    return c_.WriteAll(ptr, size, write_timeout_ms_) ? static_cast<ssize_t>(size) : -1;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = c_.peer_ip;
    port = c_.peer_port;
  }

  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    ip.clear();
    port = 0;
    if (::getsockname(c_.fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return;
    std::tie(ip, port) = AddressOf(ss);
  }

  int socket() const override { return c_.fd; }

 private:
  // Waits for `events` within the read timeout and the request's deadline.
  bool Wait(short events) const {
    int64_t ms = read_timeout_ms_;
    if (deadline_ms_ > 0) ms = std::min<int64_t>(ms, deadline_ms_ - MonoMs());
    return c_.WaitFor(events, static_cast<int>(std::max<int64_t>(ms, -1)));
  }

  Conn& c_;
  const int read_timeout_ms_;
  const int write_timeout_ms_;
  const int64_t deadline_ms_;
};

// A body through httplib: its ContentReader (POST, PUT, PATCH), or what it has read.
class HttplibBody final : public BodyReader {
 public:
  HttplibBody(const httplib::Request& req, const httplib::Response& res,
              const httplib::ContentReader* reader)
      : req_(req), res_(res), reader_(reader) {}

  bool pending() const override { return reader_ != nullptr && !consumed_; }

  Outcome Read(uint64_t limit, std::string* out) override {
    if (reader_ == nullptr) {
      *out = req_.body;
      return out->size() > limit ? Outcome::kTooLarge : Outcome::kRead;
    }
    consumed_ = true;
    bool over = false;
    const bool read = (*reader_)([&](const char* data, size_t n) {
      if (out->size() + n > limit) {
        over = true;
        return false;
      }
      out->append(data, n);
      return true;
    });
    // httplib answers a declared Content-Length over its payload limit with 413 itself.
    if (over || res_.status == 413) return Outcome::kTooLarge;
    return read ? Outcome::kRead : Outcome::kFailed;
  }

 private:
  const httplib::Request& req_;
  const httplib::Response& res_;
  const httplib::ContentReader* const reader_;
  bool consumed_ = false;
};

// Our response as httplib writes it.
void ToHttplib(const Response& r, httplib::Response& res) {
  res.status = r.status;
  for (const auto& [k, v] : r.headers) res.set_header(k, v);
  if (r.stream) {
    auto stream = r.stream;
    res.set_chunked_content_provider(r.content_type, [stream](size_t, httplib::DataSink& sink) {
      const bool more = stream([&sink](std::string_view chunk) {
        return sink.is_writable() && sink.write(chunk.data(), chunk.size());
      });
      if (!more) sink.done();
      return more;
    });
  } else if (!r.content_type.empty()) {
    res.set_content(r.body, r.content_type);
  } else if (!r.body.empty()) {
    res.set_content(r.body, "application/octet-stream");
  }
}

// A handler's exception: logged, and answered 500 with the JSON error body.
void OnException(const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
  std::string what = "unknown exception";
  try {
    std::rethrow_exception(ep);
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  std::fprintf(stderr, "error: %s %s: %s\n", req.method.c_str(), req.path.c_str(), what.c_str());
  const Response r = Response::Error(Internal("internal error: " + what));
  res.status = r.status;
  res.set_content(r.body, "application/json");
}

// The JSON error body of a refusal httplib made itself (a bad request line, a body
// over its limit); other errors already carry ours.
void FillErrorBody(const httplib::Request& req, httplib::Response& res) {
  if (!res.body.empty()) return;
  if (res.status == 400 && (req.method == "POST" || req.method == "PUT") &&
      !req.has_header("Content-Length") && !req.has_header("Transfer-Encoding")) {
    res.set_content(
        ErrorBody(InvalidArgument(req.method + " needs a body with a Content-Length; "
                                               "send an empty JSON object (curl -d '{}')",
                                  {{"field", "body"}}))
            .dump(),
        "application/json");
    return;
  }
  const Code code = res.status == 413   ? Code::kPayloadTooLarge
                    : res.status == 404 ? Code::kNotFound
                    : res.status < 500  ? Code::kInvalidArgument
                                        : Code::kInternal;
  const std::string msg = res.status == 413 ? "request body too large" : "bad request";
  res.set_content(ErrorBody(Status(code, msg)).dump(), "application/json");
}

}  // namespace

// httplib's parser and writer for one request at a time; `respond` and the flags
// below belong to the request it is serving.
class HttplibBridge::Core : public httplib::Server {
 public:
  explicit Core(const BridgeOptions& o) {
    set_payload_max_length(o.max_body_bytes);
    set_keep_alive_max_count(static_cast<size_t>(o.max_requests));
    set_keep_alive_timeout(o.keep_alive_timeout_s);
    auto plain = [this](const httplib::Request& req, httplib::Response& res) {
      Handle(req, res, nullptr);
    };
    // Bodies are read by our handler, whatever their Content-Type: left to httplib, a
    // body that says it is a form (curl --data-binary's default) is capped at 8 KiB.
    auto with_body = [this](const httplib::Request& req, httplib::Response& res,
                            const httplib::ContentReader& reader) { Handle(req, res, &reader); };
    Get(".*", plain);
    Delete(".*", plain);
    Post(".*", with_body);
    Put(".*", with_body);
    Patch(".*", with_body);
    set_exception_handler(OnException);
    set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      // After a refused request line or body, the rest of what the client sent is unread.
      if (res.status == 400 || res.status == 413 || res.status == 414) Close(res);
      FillErrorBody(req, res);
    });
  }

  // One request from `strm`: true when the connection may carry another.
  bool ServeOne(httplib::Stream& strm, bool last, const Respond& respond, bool* body_unread) {
    respond_ = &respond;
    close_ = false;
    body_unread_ = false;
    bool closed = false;
    const bool ok = process_request(strm, last, closed, nullptr);
    respond_ = nullptr;
    *body_unread = body_unread_;
    // A stream cut short by SetListening(-1) never sent its last chunk.
    return ok && !closed && !last && !close_ && svr_sock_ != INVALID_SOCKET;
  }

  void SetListening(int fd) { svr_sock_ = fd; }

 private:
  void Handle(const httplib::Request& req, httplib::Response& res,
              const httplib::ContentReader* reader) {
    HttplibBody body(req, res, reader);
    const Answer answer = (*respond_)(body);
    ToHttplib(answer.response, res);
    body_unread_ = answer.body_unread;
    if (answer.close || answer.body_unread || res.get_header_value("Connection") == "close") {
      Close(res);
    }
  }

  void Close(httplib::Response& res) {
    res.set_header("Connection", "close");
    close_ = true;
  }

  const Respond* respond_ = nullptr;
  bool close_ = false;
  bool body_unread_ = false;
};

HttplibBridge::HttplibBridge(BridgeOptions options) : options_(options) {}

HttplibBridge::~HttplibBridge() = default;

HttplibBridge::Core* HttplibBridge::Acquire() {
  MutexLock l(mu_);
  if (idle_.empty()) {
    cores_.push_back(std::make_unique<Core>(options_));
    cores_.back()->SetListening(listening_);
    return cores_.back().get();
  }
  Core* core = idle_.back();
  idle_.pop_back();
  return core;
}

void HttplibBridge::Release(Core* core) {
  MutexLock l(mu_);
  idle_.push_back(core);
}

Served HttplibBridge::ServeOne(Conn& c, int64_t deadline_ms, bool last, const Respond& respond) {
  Core* core = Acquire();
  ConnStream strm(c, options_.read_timeout_ms, options_.write_timeout_ms, deadline_ms);
  Served served;
  served.keep_alive = core->ServeOne(strm, last, respond, &served.body_unread);
  Release(core);
  return served;
}

void HttplibBridge::SetListening(int fd) {
  MutexLock l(mu_);
  listening_ = fd;
  for (auto& core : cores_) core->SetListening(fd);  // svr_sock_ is atomic: read mid-stream
}

}  // namespace tessera::http
