#include "api/http/client.h"

#include <httplib.h>

namespace tessera::http {

Client::Client(const std::string& base, std::string token, int timeout_s)
    : base_(base), token_(std::move(token)), client_(std::make_unique<httplib::Client>(base)) {
  client_->set_connection_timeout(5, 0);
  client_->set_read_timeout(timeout_s, 0);
  client_->set_write_timeout(timeout_s, 0);
  client_->set_keep_alive(true);
  client_->set_tcp_nodelay(true);
}

Client::~Client() = default;

Result<RawResponse> Client::Send(const std::string& method, const std::string& path,
                                 const std::string& body, const std::string& content_type) {
  httplib::Headers headers;
  if (!token_.empty()) headers.emplace("Authorization", "Bearer " + token_);
  httplib::Result res{nullptr, httplib::Error::Unknown};
  if (method == "GET") {
    res = client_->Get(path, headers);
  } else if (method == "DELETE") {
    res = client_->Delete(path, headers, body, content_type);
  } else if (method == "POST") {
    res = client_->Post(path, headers, body, content_type);
  } else if (method == "PUT") {
    res = client_->Put(path, headers, body, content_type);
  } else {
    return InvalidArgument("unsupported method " + method);
  }
  if (!res) {
    return Unavailable("cannot reach " + base_ + path + ": " + httplib::to_string(res.error()),
                       {{"address", base_}});
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

Status StatusFromResponse(int http_status, const std::string& body) {
  Json j = Json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object()) {
    const Json& e = j["error"];
    return Status(CodeFromName(e.value("code", "internal")), e.value("message", "error"),
                  e.value("details", Json::object()));
  }
  Code code = http_status == 404 ? Code::kNotFound
              : http_status == 401 ? Code::kUnauthenticated
              : http_status < 500  ? Code::kInvalidArgument
                                   : Code::kInternal;
  return Status(code, "HTTP " + std::to_string(http_status) + ": " + body.substr(0, 200));
}

}  // namespace tessera::http
