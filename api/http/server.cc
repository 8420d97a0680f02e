#include "api/http/server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <cctype>
#include <chrono>
#include <cstdio>

namespace tessera::http {

bool BearerMatches(const std::string& header, const std::string& token) {
  const std::string prefix = "Bearer ";
  if (header.size() != prefix.size() + token.size() || header.compare(0, prefix.size(), prefix)) {
    return false;
  }
  unsigned char diff = 0;
  for (size_t i = 0; i < token.size(); ++i) diff |= header[prefix.size() + i] ^ token[i];
  return diff == 0;
}

Server::Server(std::shared_ptr<Router> router, ServerOptions options)
    : router_(std::move(router)), options_(std::move(options)),
      server_(std::make_unique<httplib::Server>()) {
  auto& s = *server_;
  const int threads = options_.threads;
  s.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s.set_payload_max_length(options_.max_body_bytes);
  s.set_read_timeout(options_.read_timeout_s, 0);
  s.set_write_timeout(options_.write_timeout_s, 0);
  s.set_keep_alive_max_count(1000);
  s.set_keep_alive_timeout(options_.keep_alive_timeout_s);
  s.set_tcp_nodelay(true);  // small responses must not wait for delayed ACKs
  // Remember the listening socket, so that Bind can raise its backlog.
  s.set_socket_options([this](int sock) {
    httplib::default_socket_options(sock);
    listen_fd_ = sock;
  });
  auto handler = [this](const httplib::Request& req, httplib::Response& res) { Handle(&req, &res); };
  // Bodies are read here, whatever their Content-Type: left to httplib, a body
  // that says it is a form (curl --data-binary's default) is capped at 8 KiB,
  // and tensor bytes are not forms. The size limit still applies (413).
  auto with_body = [this](const httplib::Request& req, httplib::Response& res,
                          const httplib::ContentReader& reader) {
    // An answer without reading (the rest of) the body: the connection then closes.
    auto refuse = [&res](const Status& st) {
      Response r = Response::Error(st);
      res.status = r.status;
      res.set_header("Connection", "close");
      res.set_content(r.body, "application/json");
    };
    if (req.is_multipart_form_data()) {
      // Nothing here takes forms, and httplib's form parser is not ours to feed.
      reader([](const httplib::MultipartFormData&) { return false; },
             [](const char*, size_t) { return false; });
      return refuse(InvalidArgument(
          "multipart/form-data bodies are not accepted; send the bytes as the body "
          "(curl --data-binary @FILE)",
          {{"field", "content-type"}}));
    }
    std::string body;
    bool too_large = false;
    const size_t limit = options_.max_body_bytes;
    const bool read = reader([&](const char* data, size_t n) {
      if (body.size() + n > limit) {
        too_large = true;
        return false;
      }
      body.append(data, n);
      return true;
    });
    // httplib refuses a declared Content-Length over the limit itself (status 413).
    if (too_large || res.status == 413) {
      return refuse(Status(Code::kPayloadTooLarge,
                           "request body too large: more than " + std::to_string(limit) + " bytes",
                           {{"field", "body"}, {"limit", limit}}));
    }
    if (!read) {
      return refuse(InvalidArgument(
          "could not read the request body (cut short, or a bad chunked encoding)",
          {{"field", "body"}}));
    }
    Handle(&req, &res, &body);
  };
  s.Get(".*", handler);
  s.Post(".*", with_body);
  s.Put(".*", with_body);
  s.Patch(".*", with_body);
  s.Delete(".*", handler);
  s.set_exception_handler([](const httplib::Request& req, httplib::Response& res,
                             std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    std::fprintf(stderr, "error: %s %s: %s\n", req.method.c_str(), req.path.c_str(), what.c_str());
    Response r = Response::Error(Internal("internal error: " + what));
    res.status = r.status;
    res.set_content(r.body, "application/json");
  });
  // httplib's own rejections (oversized body, bad request line) get the JSON body too.
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 400 && (req.method == "POST" || req.method == "PUT") &&
        !req.has_header("Content-Length") && !req.has_header("Transfer-Encoding")) {
      res.set_content(ErrorBody(InvalidArgument(req.method + " needs a body with a Content-Length; "
                                                "send an empty JSON object (curl -d '{}')",
                                                {{"field", "body"}}))
                          .dump(),
                      "application/json");
      return;
    }
    Code code = res.status == 413   ? Code::kPayloadTooLarge
                : res.status == 404 ? Code::kNotFound
                : res.status < 500  ? Code::kInvalidArgument
                                    : Code::kInternal;
    std::string msg = res.status == 413 ? "request body too large" : "bad request";
    res.set_content(ErrorBody(Status(code, msg)).dump(), "application/json");
  });
}

Server::~Server() { Stop(); }

Result<int> Server::Bind() {
  if (options_.port == 0) {
    port_ = server_->bind_to_any_port(options_.host);
  } else {
    port_ = server_->bind_to_port(options_.host, options_.port) ? options_.port : -1;
  }
  if (port_ <= 0) {
    return Unavailable("cannot listen on " + options_.host + ":" + std::to_string(options_.port),
                       {{"field", "listen"}});
  }
  // cpp-httplib listens with a backlog of 5: when more clients connect at once
  // (16 workers reporting a phase together), the kernel drops the extra SYNs and
  // each client retries a second later. Listening again only changes the backlog.
  if (listen_fd_ >= 0) (void)::listen(listen_fd_, kListenBacklog);
  return port_;
}

void Server::Start() {
  thread_ = std::thread([this] { server_->listen_after_bind(); });
}

void Server::Run() { server_->listen_after_bind(); }

void Server::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

void Server::Handle(const void* raw_req, void* raw_res, std::string* body) {
  const auto& hreq = *static_cast<const httplib::Request*>(raw_req);
  auto& hres = *static_cast<httplib::Response*>(raw_res);
  auto t0 = std::chrono::steady_clock::now();
  Request req;
  req.method = hreq.method;
  // Route on the raw target so a %2F inside a name stays inside that name.
  const std::string& target = hreq.target.empty() ? hreq.path : hreq.target;
  req.path = target.substr(0, target.find('?'));
  for (const auto& [k, v] : hreq.params) req.query.emplace(k, v);
  for (const auto& [k, v] : hreq.headers) {
    std::string lower = k;
    for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    req.headers[lower] = v;
  }
  req.body = body != nullptr ? std::move(*body) : hreq.body;

  Response res;
  std::string pattern;
  bool wrong_method = false;
  Request matched = req;
  const Route* route = router_->Match(&matched, &wrong_method);
  if (!route) {
    res = router_->Dispatch(req);  // produces the 404 / 405 body
  } else {
    pattern = route->pattern;
    // Browsers' EventSource cannot set headers, so ?token= is accepted too.
    if (route->auth && !options_.token.empty() &&
        !BearerMatches(req.Header("authorization"), options_.token) &&
        !BearerMatches("Bearer " + req.Query("token").value_or(""), options_.token)) {
      res = Response::Error(Status(Code::kUnauthenticated,
                                   "missing or wrong bearer token (Authorization: Bearer <token>)",
                                   {{"field", "authorization"}}));
    } else {
      res = route->handler(matched);
    }
  }
  hres.status = res.status;
  for (const auto& [k, v] : res.headers) hres.set_header(k, v);
  if (res.stream) {
    auto stream = res.stream;
    hres.set_chunked_content_provider(
        res.content_type, [stream](size_t, httplib::DataSink& sink) {
          bool more = stream([&sink](std::string_view chunk) {
            return sink.is_writable() && sink.write(chunk.data(), chunk.size());
          });
          if (!more) sink.done();
          return more;
        });
  } else if (!res.content_type.empty()) {
    hres.set_content(res.body, res.content_type);
  } else if (!res.body.empty()) {
    hres.set_content(res.body, "application/octet-stream");
  }
  if (options_.on_request) {
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count();
    options_.on_request(matched, pattern, res.status, ms);
  }
}

}  // namespace tessera::http
