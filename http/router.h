// One route table for every HTTP server of the project: {method, pattern,
// handler, help}. Handlers are plain functions Request → Response, so tests can
// call them without a socket (Router::Dispatch).
//
// Patterns match the raw (undecoded) path segment by segment:
//   {x}   one segment, percent-decoded (a '/' inside a name may be sent as %2F)
//   {x+}  one or more segments joined by '/', e.g. tensor names "dense/kernel"
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/json_codec.h"
#include "api/status.h"

namespace tessera::http {

struct Request {
  std::string method;
  std::string path;                           // raw path, without the query
  std::map<std::string, std::string> params;  // from the pattern
  std::multimap<std::string, std::string> query;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;

  // Query parameter or nullopt.
  std::optional<std::string> Query(const std::string& key) const;
  const std::string& Param(const std::string& key) const;
  std::string Header(const std::string& lower_name) const;
};

struct Response {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
  // Set for streams (SSE): called repeatedly with a sink until it returns false.
  std::function<bool(const std::function<bool(std::string_view)>& write)> stream;

  static Response Json(int status, const tessera::Json& body);
  static Response Error(const Status& status);
  static Response NoContent();
};

using Handler = std::function<Response(const Request&)>;

struct Route {
  std::string method;
  std::string pattern;
  Handler handler;
  std::string help;
  bool auth = true;  // needs the bearer token (when the server has one)
  // The most body bytes a request may bring, worked out from its path and query
  // before any byte of the body is read (a tensor's declared size, say). Unset:
  // the server's max_json_body_bytes. Either way at most its max_body_bytes.
  std::function<uint64_t(const Request&)> body_limit = nullptr;
  // Also takes the token as ?token= (for browsers' EventSource, which cannot
  // set headers). Off for every other route: a URL is logged and shared.
  bool query_token = false;
};

class Router {
 public:
  void Add(Route route);
  // Finds the route and fills req->params. nullptr when none matches;
  // *method_mismatch is set when the path matches under another method. `work`, when
  // given, receives the matching steps and decoded segments: linear in the path's
  // segments per route, whatever the path (a hostile one included).
  const Route* Match(Request* req, bool* method_mismatch, size_t* work = nullptr) const;
  // Matches and runs the handler; unknown paths are not_found JSON errors.
  Response Dispatch(Request req) const;
  // Lets the route also take its bearer token as ?token= (Route::query_token).
  void SetQueryToken(const std::string& method, const std::string& pattern);
  const std::vector<Route>& routes() const { return routes_; }

 private:
  std::vector<Route> routes_;
};

// The 404 of a request no route matches, or its 405 when `method_mismatch`.
Response NoRoute(const Request& req, bool method_mismatch);

std::string PercentDecode(std::string_view s);
std::string PercentEncode(std::string_view s);  // everything but unreserved chars and '/'
// For a value that must stay one path segment ({id} routes): '/' too.
std::string PercentEncodeSegment(std::string_view s);

// A Route::body_limit for routes whose bodies are bulk data: only the server's
// max_body_bytes applies.
uint64_t ServerMaxBody(const Request& req);

// Parses an integer query parameter; absent → fallback; malformed → invalid_argument.
Result<int64_t> QueryInt(const Request& req, const std::string& key, int64_t fallback);
// A query parameter that must be present: MissingQuery(key) otherwise.
Result<std::string> RequiredQuery(const Request& req, const std::string& key);
// invalid_argument "missing query parameter '<key>'" naming the field.
Status MissingQuery(const std::string& key);

// The one way to adapt a function to a route: whatever it returns, an error becomes the
// JSON error body (with its HTTP status).
//   Reply(Result<Json>)  → 200 (or ok_status) with the JSON;
//   Reply(Result<Response>) → the response;
//   ReplyStatus(Status)  → 204.
Response Reply(const Result<tessera::Json>& r, int ok_status = 200);
Response Reply(Result<Response> r);
Response ReplyStatus(const Status& st);
// Handlers from functions Request → Result<Response> / Result<Json>.
Handler Handle(std::function<Result<Response>(const Request&)> fn);
Handler JsonHandler(std::function<Result<tessera::Json>(const Request&)> fn, int ok_status = 200);
// Parses the request body as a JSON object (empty body → {}).
Result<tessera::Json> JsonBody(const Request& req);

}  // namespace tessera::http
