// Transport: the seam between the S3 client and the network. The client signs a
// request and hands it over; a transport sends it and brings back the answer.
// The default sends with libcurl (curl_transport.cc); tests wrap it to fail chosen
// requests (storage/testing/fault_transport.h), and programs never hold such code.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "api/status.h"

namespace tessera::storage::s3 {

struct HttpRequest {
  std::string method;  // GET, HEAD, PUT, POST, DELETE
  std::string url;     // endpoint, encoded path and canonical query: what was signed
  std::vector<std::pair<std::string, std::string>> headers;  // to send (Host is the URL's)
  std::string_view body;
  int connect_timeout_ms = 5000;
  int timeout_ms = 300000;
  int stall_timeout_ms = 30000;  // moving less than 1 byte/s this long: abandoned
};

struct HttpResponse {
  long status = 0;
  std::string body;
  std::map<std::string, std::string> headers;  // lower-case names
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Any HTTP answer, whatever its status; unavailable (the message says why) when
  // none came. Thread-safe.
  virtual Result<HttpResponse> Send(const HttpRequest& request) = 0;
};

// libcurl: each thread keeps its own connection to the endpoint alive.
std::shared_ptr<Transport> NewCurlTransport();

// What a client made without a transport uses: libcurl, unless the program's entry
// set another before its first S3 request (tests/faults: a failing one).
void SetDefaultTransport(std::shared_ptr<Transport> transport);
std::shared_ptr<Transport> DefaultTransport();

}  // namespace tessera::storage::s3
