// Route matching, percent-decoding and query parsing (http/router.h) over
// the route patterns of tesserad (service/routes.cc, service/dashboard.cc) and
// of the worker (its local API, trainer, collective and agent routes), each
// with a stand-in handler that reads its parameters as the real one does.
//
// The input is three lines: the method, the request target (path?query), and
// the body (the rest). Properties checked:
//  - Dispatch answers 200, 400, 404 or 405 with a JSON body that parses;
//  - parameters are never empty and decode as a strict percent-decoder does;
//  - PercentDecode inverts PercentEncode and PercentEncodeSegment;
//  - a path built from a route's pattern, its parameters percent-encoded,
//    reaches that route with those parameters (or a route registered before it);
//  - parsed query values (shape, layout, dtype) survive their text form.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "api/dtype.h"
#include "http/request_head.h"
#include "http/router.h"
#include "api/mesh.h"
#include "api/names.h"
#include "api/shape.h"
#include "fuzz/fuzz_check.h"

namespace tessera::http {
namespace {

// The route table: method and pattern as the servers register them, in order.
struct Pattern {
  const char* method;
  const char* pattern;
};
const Pattern kTesserad[] = {
    {"GET", "/healthz"},
    {"GET", "/metrics"},
    {"GET", "/api/v1"},
    {"GET", "/api/v1/cluster"},
    {"GET", "/api/v1/events"},
    {"POST", "/api/v1/workers"},
    {"POST", "/api/v1/workers/{id}/heartbeat"},
    {"GET", "/api/v1/workers/{id}/tasks"},
    {"POST", "/api/v1/workers/{id}/tasks/{task}/report"},
    {"GET", "/api/v1/workers"},
    {"GET", "/api/v1/workers/{id}"},
    {"DELETE", "/api/v1/workers/{id}"},
    {"POST", "/api/v1/gc"},
    {"POST", "/api/v1/meshes/{m+}/checkpoints"},
    {"GET", "/api/v1/meshes/{m+}/checkpoints"},
    {"GET", "/api/v1/meshes/{m+}/checkpoints/{step}"},
    {"DELETE", "/api/v1/meshes/{m+}/checkpoints/{step}"},
    {"POST", "/api/v1/meshes/{m+}/checkpoints/{step}/restore"},
    {"POST", "/api/v1/meshes/{m+}/checkpoints/{step}/verify"},
    {"PUT", "/api/v1/meshes/{m+}/retention"},
    {"POST", "/api/v1/meshes/{m+}/collectives"},
    {"POST", "/api/v1/meshes/{m+}/preemption/sync"},
    {"POST", "/api/v1/meshes/{m+}/preemption"},
    {"GET", "/api/v1/meshes/{m+}/preemption"},
    {"DELETE", "/api/v1/meshes/{m+}/preemption"},
    {"GET", "/api/v1/meshes"},
    {"PUT", "/api/v1/meshes/{name+}"},
    {"GET", "/api/v1/meshes/{name+}"},
    {"DELETE", "/api/v1/meshes/{name+}"},
    {"POST", "/api/v1/barriers/{barrier+}"},
    {"GET", "/api/v1/barriers"},
    {"PUT", "/api/v1/kv/{key+}"},
    {"GET", "/api/v1/kv/{key+}"},
    {"GET", "/api/v1/kv"},
    {"DELETE", "/api/v1/kv/{key+}"},
    {"GET", "/api/v1/jobs"},
    {"GET", "/api/v1/jobs/{id}"},
    {"POST", "/api/v1/jobs/{id}/cancel"},
    {"GET", "/"},
    {"GET", "/assets/{file+}"},
};
const Pattern kWorker[] = {
    {"POST", "/v1/save"},
    {"GET", "/v1/saves/{step}"},
    {"POST", "/v1/restore"},
    {"GET", "/v1/checkpoints"},
    {"GET", "/v1/checkpoints/latest"},
    {"GET", "/v1/preemption"},
    {"GET", "/healthz"},
    {"POST", "/v1/tensors/{name+}/mapping"},
    {"PUT", "/v1/tensors/{name+}"},
    {"GET", "/v1/tensors/{name+}"},
    {"GET", "/v1/tensors"},
    {"DELETE", "/v1/tensors/{name+}"},
    {"POST", "/v1/collectives/{op}"},
    {"POST", "/v1/barriers/{name+}"},
};

// A strict decoder: "%" and two hex digits is a byte; anything else is itself.
std::string ReferenceDecode(std::string_view s) {
  auto hex = [](char c) {
    return c >= '0' && c <= '9' ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
  };
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out += static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

void CheckEncodings(std::string_view s) {
  FUZZ_CHECK(PercentDecode(s) == ReferenceDecode(s), "PercentDecode of '" + std::string(s) + "'");
  FUZZ_CHECK(PercentDecode(PercentEncode(s)) == s, "PercentEncode round trip");
  const std::string seg = PercentEncodeSegment(s);
  FUZZ_CHECK(seg.find('/') == std::string::npos, "PercentEncodeSegment kept a '/'");
  FUZZ_CHECK(PercentDecode(seg) == s, "PercentEncodeSegment round trip");
}

void CheckError(const Status& st, const std::string& what) {
  FUZZ_CHECK(fuzz::IsCleanError(st, {Code::kInvalidArgument}), what + ": " + st.ToString());
}

// What the handlers read from the query string.
void ReadQuery(const Request& req) {
  for (const char* key : {"wait_ms", "limit", "step", "timeout_ms", "device", "deadline_ms"}) {
    CheckError(QueryInt(req, key, 0).status(), "QueryInt");
  }
  for (const char* key : {"mesh", "step", "prefix", "state", "kind", "wait"}) {
    auto v = RequiredQuery(req, key);
    if (v.ok()) {
      FUZZ_CHECK(req.Query(key) == *v, "RequiredQuery and Query disagree");
    } else {
      CheckError(v.status(), "RequiredQuery");
    }
  }
  if (auto mesh = req.Query("mesh")) CheckError(ValidateName(*mesh, "mesh"), "ValidateName");
  if (auto dtype = req.Query("dtype")) {
    auto d = ParseDType(*dtype);
    if (d.ok()) FUZZ_CHECK(DTypeName(*d) == *dtype, "dtype name");
    CheckError(d.status(), "ParseDType");
  }
  for (const char* key : {"shape", "shapes"}) {
    auto text = req.Query(key);
    if (!text) continue;
    auto shape = ParseShape(*text, key);
    if (shape.ok()) {
      auto again = ParseShape(ShapeToString(*shape));
      FUZZ_CHECK(again.ok() && *again == *shape, "shape round trip");
    }
    CheckError(shape.status(), "ParseShape");
  }
  if (auto text = req.Query("layout")) {
    auto layout = ParseLayout(*text);
    if (layout.ok()) {
      auto again = ParseLayout(layout->ToString());
      FUZZ_CHECK(again.ok() && *again == *layout, "layout round trip");
    }
    CheckError(layout.status(), "ParseLayout");
  }
}

Handler StandIn(const std::string& pattern) {
  return [pattern](const Request& req) {
    for (const auto& [name, value] : req.params) {
      FUZZ_CHECK(!value.empty(), "empty parameter " + name + " of " + pattern);
      FUZZ_CHECK(pattern.find("{" + name) != std::string::npos, "parameter not in the pattern");
    }
    // tesserad checks names in the path before its handlers run (service/routes.cc).
    for (const char* named : {"m", "name", "barrier", "key"}) {
      if (pattern.find("{" + std::string(named) + "+}") == std::string::npos) continue;
      Status st = ValidateName(req.Param(named), named);
      if (!st.ok()) return Response::Error(st);
    }
    ReadQuery(req);
    auto body = JsonBody(req);
    if (!body.ok()) return Response::Error(body.status());
    Json params = Json::object();
    for (const auto& [name, value] : req.params) params[name] = value;
    return Response::Json(200, {{"pattern", pattern}, {"params", params}});
  };
}

std::vector<Router> MakeRouters() {
  std::vector<Router> routers(2);
  for (const auto& p : kTesserad) routers[0].Add({p.method, p.pattern, StandIn(p.pattern), ""});
  for (const auto& p : kWorker) routers[1].Add({p.method, p.pattern, StandIn(p.pattern), ""});
  return routers;
}

// Splits "a=1&b=%20" into decoded pairs, as the HTTP server does.
std::multimap<std::string, std::string> ParseQueryString(std::string_view q) {
  std::multimap<std::string, std::string> out;
  size_t pos = 0;
  while (pos <= q.size() && !q.empty()) {
    size_t amp = q.find('&', pos);
    std::string_view pair = q.substr(pos, amp == q.npos ? q.npos : amp - pos);
    if (!pair.empty()) {
      size_t eq = pair.find('=');
      out.emplace(PercentDecode(pair.substr(0, eq)),
                  eq == pair.npos ? std::string() : PercentDecode(pair.substr(eq + 1)));
    }
    if (amp == q.npos) break;
    pos = amp + 1;
  }
  return out;
}

// The route's pattern with every parameter set to `value`, encoded as a client
// would: one segment each ({x}), or '/' kept between name segments ({x+}).
std::string BuildPath(const std::string& pattern, const std::string& value, bool keep_slash,
                      std::map<std::string, std::string>* params) {
  std::string path;
  size_t pos = 1;
  while (pos <= pattern.size()) {
    size_t slash = pattern.find('/', pos);
    std::string seg = pattern.substr(pos, slash == std::string::npos ? std::string::npos : slash - pos);
    path += '/';
    if (seg.size() > 2 && seg.front() == '{' && seg.back() == '}') {
      const bool greedy = seg[seg.size() - 2] == '+';
      const std::string name = seg.substr(1, seg.size() - (greedy ? 3 : 2));
      path += greedy && keep_slash ? PercentEncode(value) : PercentEncodeSegment(value);
      (*params)[name] = value;
    } else {
      path += seg;
    }
    if (slash == std::string::npos) break;
    pos = slash + 1;
  }
  return path;
}

// A name for a greedy parameter: the non-empty '/'-separated parts of `s`.
std::string AsName(std::string_view s) {
  std::string out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t slash = s.find('/', pos);
    std::string_view part = s.substr(pos, slash == s.npos ? s.npos : slash - pos);
    if (!part.empty()) out += (out.empty() ? "" : "/") + std::string(part);
    if (slash == s.npos) break;
    pos = slash + 1;
  }
  return out.empty() ? "x" : out;
}

void CheckRoundTrip(const Router& router, size_t which, const std::string& value) {
  const Route& route = router.routes()[which];
  for (bool keep_slash : {false, true}) {
    std::map<std::string, std::string> want;
    Request req;
    req.method = route.method;
    req.path = BuildPath(route.pattern, keep_slash ? AsName(value) : value, keep_slash, &want);
    bool wrong_method = false;
    const Route* got = router.Match(&req, &wrong_method);
    FUZZ_CHECK(got != nullptr, "path " + req.path + " built from " + route.pattern + " matches nothing");
    FUZZ_CHECK(got <= &route, "path " + req.path + " built from " + route.pattern +
                                  " reaches a later route " + got->pattern);
    if (got == &route) {
      FUZZ_CHECK(req.params == want, "path " + req.path + " gives other parameters for " +
                                         route.pattern);
    }
  }
}

}  // namespace
}  // namespace tessera::http

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera::http;
  static const std::vector<Router> routers = MakeRouters();
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nl1 = std::min(in.find('\n'), in.size());
  const size_t nl2 = std::min(in.find('\n', nl1 + (nl1 < in.size())), in.size());
  const std::string_view method = in.substr(0, nl1);
  const std::string_view target = in.substr(std::min(nl1 + 1, in.size()), nl2 - std::min(nl1 + 1, nl2));
  const std::string_view body = in.substr(std::min(nl2 + 1, in.size()));

  CheckEncodings(in);
  // The gate parses a stranger's raw header (request_head.h): whatever the bytes,
  // a parse is a method, a path from '/', and headers with lower-case names.
  const std::string raw_head = std::string(method) + " " + std::string(target) +
                               " HTTP/1.1\r\n" + std::string(body) + "\r\n\r\n";
  for (std::string_view head : {in, std::string_view(raw_head)}) {
    if (auto parsed = ParseRequestHead(head)) {
      FUZZ_CHECK(!parsed->path.empty() && parsed->path[0] == '/', parsed->path);
      for (const auto& [name, value] : parsed->headers) {
        for (char c : name) FUZZ_CHECK(!(c >= 'A' && c <= 'Z'), name);
      }
    }
  }
  const size_t q = target.find('?');
  const std::string_view path = target.substr(0, q);
  Request req;
  req.method = std::string(method);
  req.path = std::string(path);
  if (q != target.npos) req.query = ParseQueryString(target.substr(q + 1));
  req.body = std::string(body);
  for (const auto& [k, v] : req.query) CheckEncodings(v);

  for (const Router& router : routers) {
    Response res = router.Dispatch(req);
    FUZZ_CHECK(res.status == 200 || res.status == 400 || res.status == 404 || res.status == 405,
               "status " + std::to_string(res.status));
    auto j = tessera::ParseJson(res.body, "response");
    FUZZ_CHECK(j.ok(), "response body is not JSON: " + res.body);
    // Route a path built from the input back to a route chosen by the input.
    const std::string value = PercentDecode(path).empty() ? "x" : PercentDecode(path);
    CheckRoundTrip(router, size % router.routes().size(), value);
  }
  return 0;
}
