#include "http/router.h"

#include <cctype>
#include <charconv>

namespace tessera::http {
namespace {

std::vector<std::string_view> Split(std::string_view path) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  if (!path.empty() && path[0] == '/') pos = 1;
  while (pos <= path.size()) {
    size_t slash = path.find('/', pos);
    out.push_back(path.substr(pos, slash == path.npos ? path.npos : slash - pos));
    if (slash == path.npos) break;
    pos = slash + 1;
  }
  return out;
}

// `*work` counts the steps taken and the segments decoded (see Router::Match).
bool MatchFrom(const std::vector<std::string_view>& pat, size_t pi,
               const std::vector<std::string_view>& seg, size_t si,
               std::map<std::string, std::string>* params, size_t* work) {
  ++*work;
  if (pi == pat.size()) return si == seg.size();
  std::string_view p = pat[pi];
  if (p.size() > 2 && p.front() == '{' && p.back() == '}') {
    bool greedy = p[p.size() - 2] == '+';
    std::string name(p.substr(1, p.size() - (greedy ? 3 : 2)));
    size_t max_take = greedy ? seg.size() - si : std::min<size_t>(1, seg.size() - si);
    // A value never spans an empty segment.
    for (size_t k = 0; k < max_take; ++k) {
      if (seg[si + k].empty()) max_take = k;
    }
    // Prefer the longest value that lets the rest of the pattern match, and
    // decode only that one: decoding every candidate made long paths quadratic.
    for (size_t take = max_take; take >= 1; --take) {
      if (!MatchFrom(pat, pi + 1, seg, si + take, params, work)) continue;
      *work += take;
      std::string value;
      for (size_t k = 0; k < take; ++k) value += (k ? "/" : "") + PercentDecode(seg[si + k]);
      (*params)[name] = value;
      return true;
    }
    return false;
  }
  if (si >= seg.size() || seg[si] != p) return false;
  return MatchFrom(pat, pi + 1, seg, si + 1, params, work);
}

}  // namespace

std::optional<std::string> Request::Query(const std::string& key) const {
  auto it = query.find(key);
  if (it == query.end()) return std::nullopt;
  return it->second;
}

const std::string& Request::Param(const std::string& key) const {
  static const std::string kEmpty;
  auto it = params.find(key);
  return it == params.end() ? kEmpty : it->second;
}

std::string Request::Header(const std::string& lower_name) const {
  auto it = headers.find(lower_name);
  return it == headers.end() ? std::string() : it->second;
}

Response Response::Json(int status, const tessera::Json& body) {
  Response r;
  r.status = status;
  r.body = body.dump(-1, ' ', false, tessera::Json::error_handler_t::replace);
  return r;
}

Response Response::Error(const Status& status) {
  return Json(HttpStatus(status.code()), ErrorBody(status));
}

Response Response::NoContent() {
  Response r;
  r.status = 204;
  r.content_type.clear();
  return r;
}

void Router::Add(Route route) { routes_.push_back(std::move(route)); }

void Router::SetQueryToken(const std::string& method, const std::string& pattern) {
  for (Route& r : routes_) {
    if (r.method == method && r.pattern == pattern) r.query_token = true;
  }
}

const Route* Router::Match(Request* req, bool* method_mismatch, size_t* work) const {
  *method_mismatch = false;
  size_t ignored = 0;
  if (work == nullptr) work = &ignored;
  auto seg = Split(req->path);
  for (const auto& r : routes_) {
    std::map<std::string, std::string> params;
    if (!MatchFrom(Split(r.pattern), 0, seg, 0, &params, work)) continue;
    if (r.method != req->method) {
      *method_mismatch = true;
      continue;
    }
    req->params = std::move(params);
    return &r;
  }
  return nullptr;
}

Response Router::Dispatch(Request req) const {
  bool wrong_method = false;
  const Route* route = Match(&req, &wrong_method);
  if (!route) return NoRoute(req, wrong_method);
  return route->handler(req);
}

Response NoRoute(const Request& req, bool method_mismatch) {
  if (method_mismatch) {
    return Response::Error(Status(Code::kMethodNotAllowed,
                                  "method " + req.method + " is not allowed on " + req.path,
                                  {{"field", "method"}}));
  }
  return Response::Error(
      NotFound("no such endpoint: " + req.method + " " + req.path, {{"field", "path"}}));
}

std::string PercentDecode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    // Exactly two hex digits: from_chars alone would also take a sign ("%-1").
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      int v = 0;
      std::from_chars(s.data() + i + 1, s.data() + i + 3, v, 16);
      out += static_cast<char>(v);
      i += 2;
      continue;
    }
    out += s[i];
  }
  return out;
}

namespace {

std::string Encode(std::string_view s, bool keep_slash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

}  // namespace

std::string PercentEncode(std::string_view s) { return Encode(s, true); }
std::string PercentEncodeSegment(std::string_view s) { return Encode(s, false); }

uint64_t ServerMaxBody(const Request&) { return UINT64_MAX; }

Result<int64_t> QueryInt(const Request& req, const std::string& key, int64_t fallback) {
  auto v = req.Query(key);
  if (!v) return fallback;
  int64_t out = 0;
  auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), out);
  if (ec != std::errc() || p != v->data() + v->size() || v->empty()) {
    return InvalidArgument("query parameter '" + key + "' must be an integer, got '" +
                               v->substr(0, 32) + "'",
                           {{"field", key}});
  }
  return out;
}

Result<std::string> RequiredQuery(const Request& req, const std::string& key) {
  std::optional<std::string> value = req.Query(key);
  if (!value.has_value()) return MissingQuery(key);
  return *std::move(value);
}

Status MissingQuery(const std::string& key) {
  return InvalidArgument("missing query parameter '" + key + "'", {{"field", key}});
}

Response Reply(const Result<tessera::Json>& r, int ok_status) {
  return r.ok() ? Response::Json(ok_status, *r) : Response::Error(r.status());
}

Response Reply(Result<Response> r) {
  return r.ok() ? std::move(r).value() : Response::Error(r.status());
}

Response ReplyStatus(const Status& st) {
  return st.ok() ? Response::NoContent() : Response::Error(st);
}

Handler Handle(std::function<Result<Response>(const Request&)> fn) {
  return [fn = std::move(fn)](const Request& req) { return Reply(fn(req)); };
}

Handler JsonHandler(std::function<Result<tessera::Json>(const Request&)> fn, int ok_status) {
  return [fn = std::move(fn), ok_status](const Request& req) { return Reply(fn(req), ok_status); };
}

Result<tessera::Json> JsonBody(const Request& req) {
  if (req.body.find_first_not_of(" \t\r\n") == std::string::npos) return tessera::Json::object();
  ASSIGN_OR_RETURN(auto j, ParseStrictJson(req.body, "request body"));
  RETURN_IF_ERROR(RequireObject(j, "request body"));
  return j;
}

}  // namespace tessera::http
