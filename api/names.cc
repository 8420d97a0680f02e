#include "api/names.h"

#include <charconv>
#include <string>

namespace tessera {

Status ValidateName(std::string_view name, std::string_view field) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument("invalid " + std::string(field) + " '" +
                               std::string(name.substr(0, 64)) + "': " + why,
                           {{"field", field}});
  };
  if (name.empty()) return bad("must not be empty");
  if (name.size() > kMaxNameLength) {
    return bad("longer than " + std::to_string(kMaxNameLength) + " characters");
  }
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '/' || c == '-';
    if (!ok) return bad("only letters, digits and . _ / - are allowed");
  }
  if (name.front() == '/') return bad("must not start with '/'");
  size_t pos = 0;
  while (pos <= name.size()) {
    size_t slash = name.find('/', pos);
    std::string_view seg = name.substr(pos, slash == name.npos ? name.npos : slash - pos);
    if (seg == ".." || seg == ".") return bad("must not contain a '.' or '..' segment");
    if (seg.empty()) return bad("must not contain an empty segment ('//' or a trailing '/')");
    if (slash == name.npos) break;
    pos = slash + 1;
  }
  return Status::Ok();
}

Result<int64_t> ParseStep(std::string_view text, std::string_view field) {
  int64_t step = -1;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), step);
  if (text.empty() || ec != std::errc() || p != text.data() + text.size() || step < 0) {
    return InvalidArgument(std::string(field) + " must be a non-negative integer, got '" +
                               std::string(text.substr(0, 32)) + "'",
                           {{"field", field}});
  }
  return step;
}

}  // namespace tessera
