#include "http/request_head.h"

#include <cctype>

namespace tessera::http {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// A query value as httplib decodes it: '+' is a space, then percent-decoding.
std::string DecodeQuery(std::string_view s) {
  std::string plus(s);
  for (char& c : plus) c = c == '+' ? ' ' : c;
  return PercentDecode(plus);
}

}  // namespace

std::optional<Request> ParseRequestHead(std::string_view head) {
  const size_t eol = head.find("\r\n");
  if (eol == std::string_view::npos) return std::nullopt;
  const std::string_view line = head.substr(0, eol);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = line.rfind(' ');
  if (sp1 == std::string_view::npos || sp2 <= sp1 || line.substr(sp2 + 1).rfind("HTTP/1.", 0) != 0) {
    return std::nullopt;
  }
  Request req;
  req.method = std::string(line.substr(0, sp1));
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  target = target.substr(0, target.find('#'));  // a fragment is the client's, as in httplib
  const size_t q = target.find('?');
  req.path = std::string(target.substr(0, q));
  if (req.path.empty() || req.path[0] != '/') return std::nullopt;
  if (q != std::string_view::npos) {
    std::string_view rest = target.substr(q + 1);
    while (!rest.empty()) {
      const size_t amp = rest.find('&');
      const std::string_view pair = rest.substr(0, amp);
      const size_t eq = pair.find('=');
      if (!pair.empty()) {
        req.query.emplace(DecodeQuery(pair.substr(0, eq)),
                          eq == std::string_view::npos ? "" : DecodeQuery(pair.substr(eq + 1)));
      }
      if (amp == std::string_view::npos) break;
      rest.remove_prefix(amp + 1);
    }
  }
  size_t at = eol + 2;
  while (at < head.size()) {
    const size_t end = head.find("\r\n", at);
    if (end == std::string_view::npos || end == at) break;  // the blank line
    const std::string_view field = head.substr(at, end - at);
    const size_t colon = field.find(':');
    if (colon != std::string_view::npos) {
      std::string name(Trim(field.substr(0, colon)));
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      req.headers[name] = std::string(Trim(field.substr(colon + 1)));  // the last wins, as in ToRequest
    }
    at = end + 2;
  }
  return req;
}

}  // namespace tessera::http
