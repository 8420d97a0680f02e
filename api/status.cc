#include "api/status.h"

#include <cerrno>
#include <cstring>

namespace tessera {
namespace {

struct CodeInfo {
  Code code;
  std::string_view name;
  int http;
};

constexpr CodeInfo kCodes[] = {
    {Code::kOk, "ok", 200},
    {Code::kInvalidArgument, "invalid_argument", 400},
    {Code::kUnauthenticated, "unauthenticated", 401},
    {Code::kNotFound, "not_found", 404},
    {Code::kMethodNotAllowed, "method_not_allowed", 405},
    {Code::kConflict, "conflict", 409},
    {Code::kPayloadTooLarge, "payload_too_large", 413},
    {Code::kUnavailable, "unavailable", 503},
    {Code::kDeadlineExceeded, "deadline_exceeded", 504},
    {Code::kDataLoss, "data_loss", 500},
    {Code::kResourceExhausted, "resource_exhausted", 507},
    {Code::kInternal, "internal", 500},
};

const CodeInfo& Info(Code code) {
  for (const auto& c : kCodes) {
    if (c.code == code) return c;
  }
  return kCodes[std::size(kCodes) - 1];
}

}  // namespace

std::string_view CodeName(Code code) { return Info(code).name; }

Code CodeFromName(std::string_view name) {
  for (const auto& c : kCodes) {
    if (c.name == name) return c.code;
  }
  return Code::kInternal;
}

int HttpStatus(Code code) { return Info(code).http; }

std::string Status::ToString() const {
  if (ok()) return "ok";
  return std::string(CodeName(code_)) + ": " + message_;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, std::string(context) + ": " + message_, details_);
}

Status Status::WithDetail(const std::string& key, nlohmann::json value) const {
  Status s = *this;
  if (!s.details_.is_object()) s.details_ = nlohmann::json::object();
  s.details_[key] = std::move(value);
  return s;
}

Status InvalidArgument(std::string m, nlohmann::json d) {
  return Status(Code::kInvalidArgument, std::move(m), std::move(d));
}
Status NotFound(std::string m, nlohmann::json d) {
  return Status(Code::kNotFound, std::move(m), std::move(d));
}
Status Conflict(std::string m, nlohmann::json d) {
  return Status(Code::kConflict, std::move(m), std::move(d));
}
Status DataLoss(std::string m, nlohmann::json d) {
  return Status(Code::kDataLoss, std::move(m), std::move(d));
}
Status Internal(std::string m, nlohmann::json d) {
  return Status(Code::kInternal, std::move(m), std::move(d));
}
Status Unavailable(std::string m, nlohmann::json d) {
  return Status(Code::kUnavailable, std::move(m), std::move(d));
}
Status DeadlineExceeded(std::string m, nlohmann::json d) {
  return Status(Code::kDeadlineExceeded, std::move(m), std::move(d));
}
Status ResourceExhausted(std::string m, nlohmann::json d) {
  return Status(Code::kResourceExhausted, std::move(m), std::move(d));
}

Status ErrnoStatus(int err, std::string_view what, std::string_view path) {
  std::string msg = std::string(what) + " " + std::string(path) + ": " + std::strerror(err);
  nlohmann::json details = {{"file", path}, {"errno", err}};
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      return ResourceExhausted("disk full: " + msg, details);
    case ENOENT:
      return NotFound(msg, details);
    case EEXIST:
    case ENOTEMPTY:
      return Conflict(msg, details);
    default:
      return Internal(msg, details);
  }
}

nlohmann::json ErrorBody(const Status& status) {
  nlohmann::json details = status.details().is_null() ? nlohmann::json::object() : status.details();
  return {{"error",
           {{"code", CodeName(status.code())}, {"message", status.message()}, {"details", details}}}};
}

Status StatusFromErrorJson(const nlohmann::json& j, std::string_view fallback) {
  const nlohmann::json& e = j.is_object() && j.contains("error") ? j["error"] : j;
  if (!e.is_object()) return Internal(std::string(fallback));
  const auto* code = e.contains("code") && e["code"].is_string() ? e["code"].get_ptr<const std::string*>() : nullptr;
  const auto* message =
      e.contains("message") && e["message"].is_string() ? e["message"].get_ptr<const std::string*>() : nullptr;
  Code c = code != nullptr ? CodeFromName(*code) : Code::kInternal;
  if (c == Code::kOk) c = Code::kInternal;
  nlohmann::json details = e.contains("details") ? e["details"] : nlohmann::json::object();
  return Status(c, message != nullptr ? *message : std::string(fallback), std::move(details));
}

}  // namespace tessera
