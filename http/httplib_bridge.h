// The one place that reaches past cpp-httplib's public API. A connection the gate
// accepted is served by httplib's request parser and response writer
// (httplib::Server::process_request, protected) through a Stream over our Conn, and
// streamed responses end when httplib's listening socket (svr_sock_, protected) is
// invalid. tests/unit/httplib_bridge_test.cc holds the library to what this relies on.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "api/thread_annotations.h"
#include "http/connection.h"
#include "http/router.h"

namespace tessera::http {

// A request's body, as the handler thread reads it.
class BodyReader {
 public:
  enum class Outcome { kRead, kTooLarge, kFailed };
  virtual ~BodyReader() = default;
  // True while no byte of the body has been read (POST, PUT, PATCH): what the
  // header alone decides can still be answered before any is. GET and DELETE
  // bodies are read by httplib before the handler runs (within max_body_bytes).
  virtual bool pending() const = 0;
  // The whole body into `*out`; kTooLarge once it passes `limit` (the rest is left
  // unread), kFailed when it is cut short or its chunked encoding is bad.
  virtual Outcome Read(uint64_t limit, std::string* out) = 0;
};

// A handler's answer to one request.
struct Answer {
  Response response;
  bool close = false;        // the connection closes after it
  bool body_unread = false;  // answered without reading (all of) the body; implies close
};

// What serving one request left: whether the connection can carry another.
struct Served {
  bool keep_alive = false;
  bool body_unread = false;  // the server should drain what the client still sends
};

struct BridgeOptions {
  size_t max_body_bytes = 64ull << 20;  // httplib's own 413 over this
  int keep_alive_timeout_s = 5;         // advertised in Keep-Alive
  int max_requests = 1000;              // per connection, advertised in Keep-Alive
  int read_timeout_ms = 30000;          // no byte of the request for this long: it fails
  int write_timeout_ms = 30000;         // no byte of the response moves for this long
};

class HttplibBridge {
 public:
  using Respond = std::function<Answer(BodyReader& body)>;

  explicit HttplibBridge(BridgeOptions options);
  ~HttplibBridge();
  HttplibBridge(const HttplibBridge&) = delete;
  HttplibBridge& operator=(const HttplibBridge&) = delete;

  // Reads one request from `c` (its buffered bytes first), has `respond` answer it
  // unless httplib refuses it first (a bad request line: 400 with the JSON error
  // body), and writes the answer. Reading fails once `deadline_ms` (MonoMs) passes.
  // `last`: the connection closes after this request. Thread-safe.
  Served ServeOne(Conn& c, int64_t deadline_ms, bool last, const Respond& respond);
  // Streamed responses run while `fd` (the listening socket) is not -1, and end at
  // their next chunk once it is.
  void SetListening(int fd);

 private:
  class Core;
  Core* Acquire();
  void Release(Core* core);

  const BridgeOptions options_;
  Mutex mu_;
  // One httplib server per request in flight: each carries the handler of the
  // request it serves, so nothing passes through thread-local state.
  std::vector<std::unique_ptr<Core>> cores_ GUARDED_BY(mu_);
  std::vector<Core*> idle_ GUARDED_BY(mu_);
  int listening_ GUARDED_BY(mu_) = -1;
};

}  // namespace tessera::http
