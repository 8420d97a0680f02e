#include "http/client.h"

#include <httplib.h>

#include <mutex>

#include "http/tls.h"
#include "api/thread_annotations.h"

namespace tessera::http {

Client::Client(const std::string& base, std::string token, int timeout_s, bool keep_alive)
    : base_(base), token_(std::move(token)), timeout_s_(timeout_s), keep_alive_(keep_alive) {
  Connect();
}

void Client::Connect() {
  client_ = std::make_unique<httplib::Client>(base_);
  client_->set_connection_timeout(5, 0);
  client_->set_read_timeout(timeout_s_, 0);
  client_->set_write_timeout(timeout_s_, 0);
  client_->set_keep_alive(keep_alive_);
  client_->set_tcp_nodelay(true);
  if (base_.rfind("https://", 0) == 0) {
    const std::string ca = DefaultCaFile();
    if (!ca.empty()) client_->set_ca_cert_path(ca.c_str());
    client_->enable_server_certificate_verification(true);
  }
}

Client::~Client() = default;

void Client::SetTimeout(int timeout_s) {
  timeout_s_ = timeout_s;
  client_->set_read_timeout(timeout_s, 0);
  client_->set_write_timeout(timeout_s, 0);
}

Result<RawResponse> Client::Send(const std::string& method, const std::string& path,
                                 const std::string& body, const std::string& content_type) {
  httplib::Headers headers;
  if (!token_.empty()) headers.emplace("Authorization", "Bearer " + token_);
  if (method != "GET" && method != "DELETE" && method != "POST" && method != "PUT") {
    return InvalidArgument("unsupported method " + method);
  }
  auto send = [&] {
    if (method == "GET") return client_->Get(path, headers);
    if (method == "DELETE") return client_->Delete(path, headers, body, content_type);
    if (method == "POST") return client_->Post(path, headers, body, content_type);
    return client_->Put(path, headers, body, content_type);
  };
  httplib::Result res = send();
  // A kept-alive connection may have died unseen (the peer closed it while the
  // link was down): an idempotent request goes again once, on a new connection.
  if (!res && (res.error() == httplib::Error::Read || res.error() == httplib::Error::Write) &&
      method != "POST") {
    // A new client rather than stop(): stop() releases a lock the library took
    // inside itself, which ThreadSanitizer (seeing only one side) reports.
    Connect();
    res = send();
  }
  if (!res) {
    std::string why = httplib::to_string(res.error());
    if (res.error() == httplib::Error::SSLServerVerification) {
      why += " (the server's certificate is not signed by a trusted CA: pass --tls-ca or set "
             "TESSERA_TLS_CA to the CA's PEM file)";
    } else if (res.error() == httplib::Error::SSLConnection) {
      why += " (is the server speaking HTTPS?)";
    }
    // "sent": whether the request may have reached the server (a failed connect never did).
    return Unavailable("cannot reach " + base_ + path + ": " + why,
                       {{"address", base_}, {"sent", res.error() != httplib::Error::Connection}});
  }
  RawResponse out;
  out.status = res->status;
  out.body = std::move(res->body);
  for (const auto& [k, v] : res->headers) out.headers[k] = v;
  return out;
}

Result<Json> Client::Call(const std::string& method, const std::string& path, const Json& body) {
  ASSIGN_OR_RETURN(auto r, Send(method, path, body.is_null() ? "" : body.dump()));
  if (r.status < 200 || r.status >= 300) return StatusFromResponse(r.status, r.body);
  if (r.body.empty()) return Json();
  return ParseJson(r.body, "response from " + base_ + path);
}

struct ClientPool::Idle {
  Mutex mu;
  std::vector<std::unique_ptr<Client>> clients GUARDED_BY(mu);
  size_t max = 8;
};

ClientPool::ClientPool(std::string base, std::string token, int timeout_s, size_t max_idle)
    : base_(std::move(base)), token_(std::move(token)), timeout_s_(timeout_s),
      idle_(std::make_shared<Idle>()) {
  idle_->max = max_idle;
}

std::shared_ptr<Client> ClientPool::Acquire() {
  std::unique_ptr<Client> client;
  {
    MutexLock lock(idle_->mu);
    if (!idle_->clients.empty()) {
      client = std::move(idle_->clients.back());
      idle_->clients.pop_back();
    }
  }
  if (!client) client = std::make_unique<Client>(base_, token_, timeout_s_);
  std::weak_ptr<Idle> home = idle_;
  return std::shared_ptr<Client>(client.release(), [home](Client* raw) {
    std::unique_ptr<Client> owned(raw);
    if (auto idle = home.lock()) {
      MutexLock lock(idle->mu);
      if (idle->clients.size() < idle->max) idle->clients.push_back(std::move(owned));
    }
  });
}

Status StatusFromResponse(int http_status, const std::string& body) {
  Json j = Json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object()) {
    return StatusFromErrorJson(j, "error");
  }
  Code code = http_status == 404 ? Code::kNotFound
              : http_status == 401 ? Code::kUnauthenticated
              : http_status < 500  ? Code::kInvalidArgument
                                   : Code::kInternal;
  return Status(code, "HTTP " + std::to_string(http_status) + ": " + body.substr(0, 200));
}

}  // namespace tessera::http
