// A small JSON-over-HTTP client for the project's own processes and tests:
// every call returns the parsed body or the server's docs/openapi.json error as a Status.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "api/json_codec.h"
#include "api/status.h"

namespace httplib {
class Client;
}

namespace tessera::http {

struct RawResponse {
  int status = 0;
  std::string body;
  std::map<std::string, std::string> headers;
};

class Client {
 public:
  // `base` like "http://127.0.0.1:7070"; `token` is sent as a bearer token when set.
  // `keep_alive` false closes the connection after each request: for callers
  // that call rarely, whose idle connection would only cost the server polling.
  Client(const std::string& base, std::string token = "", int timeout_s = 60,
         bool keep_alive = true);
  ~Client();

  // Raw request; transport failures are unavailable naming the address.
  Result<RawResponse> Send(const std::string& method, const std::string& path,
                           const std::string& body = "",
                           const std::string& content_type = "application/json");
  // JSON request; a non-2xx answer becomes the Status of its error body.
  Result<Json> Call(const std::string& method, const std::string& path,
                    const Json& body = nullptr);

  const std::string& base() const { return base_; }
  // How long a request may take to be written and answered, from the next request on.
  void SetTimeout(int timeout_s);

 private:
  // A fresh connection-holding client with this Client's settings.
  void Connect();

  std::string base_;
  std::string token_;
  int timeout_s_;
  bool keep_alive_;
  std::unique_ptr<httplib::Client> client_;
};

// Keep-alive clients of one server, shared by many threads: each caller gets a
// client of its own for as long as it holds it, and a connection already open
// when there is an idle one. Thread-safe; handles may outlive the pool.
class ClientPool {
 public:
  ClientPool(std::string base, std::string token, int timeout_s, size_t max_idle = 8);
  std::shared_ptr<Client> Acquire();

 private:
  struct Idle;
  std::string base_, token_;
  int timeout_s_;
  std::shared_ptr<Idle> idle_;
};

// The Status carried by a docs/openapi.json error body (or a generic one for other bodies).
Status StatusFromResponse(int http_status, const std::string& body);

}  // namespace tessera::http
