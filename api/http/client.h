// A small JSON-over-HTTP client for the project's own processes and tests:
// every call returns the parsed body or the server's API.md error as a Status.
#pragma once

#include <map>
#include <memory>
#include <string>

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
  Client(const std::string& base, std::string token = "", int timeout_s = 60);
  ~Client();

  // Raw request; transport failures are unavailable naming the address.
  Result<RawResponse> Send(const std::string& method, const std::string& path,
                           const std::string& body = "",
                           const std::string& content_type = "application/json");
  // JSON request; a non-2xx answer becomes the Status of its error body.
  Result<Json> Call(const std::string& method, const std::string& path,
                    const Json& body = nullptr);

  const std::string& base() const { return base_; }

 private:
  std::string base_;
  std::string token_;
  std::unique_ptr<httplib::Client> client_;
};

// The Status carried by an API.md error body (or a generic one for other bodies).
Status StatusFromResponse(int http_status, const std::string& body);

}  // namespace tessera::http
