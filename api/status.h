// Status and Result<T>: how every module reports failure (no exceptions across
// module boundaries). Codes are those of the REST contract (docs/openapi.json).
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <nlohmann/json.hpp>

namespace tessera {

enum class Code {
  kOk = 0,
  kInvalidArgument,
  kUnauthenticated,
  kNotFound,
  kMethodNotAllowed,
  kConflict,
  kPayloadTooLarge,
  kUnavailable,
  kDeadlineExceeded,
  kDataLoss,
  kResourceExhausted,
  kInternal,
};

// "invalid_argument", ... as used in the JSON error body.
std::string_view CodeName(Code code);
// Parses a CodeName; unknown names map to kInternal.
Code CodeFromName(std::string_view name);
// HTTP status of docs/openapi.json's error table.
int HttpStatus(Code code);

// A success or an error with a code, a human sentence and machine-readable
// details (field, tensor, file, ranks...). Cheap to copy when ok.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message, nlohmann::json details = nullptr)
      : code_(code), message_(std::move(message)), details_(std::move(details)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  const nlohmann::json& details() const { return details_; }

  // "data_loss: chunk 3 of shard-0.tsr ..." for logs and CLI output.
  std::string ToString() const;
  // Returns a copy whose message is "<context>: <message>".
  Status WithContext(std::string_view context) const;
  // Returns a copy with details[key] = value.
  Status WithDetail(const std::string& key, nlohmann::json value) const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
  nlohmann::json details_;
};

Status InvalidArgument(std::string message, nlohmann::json details = nullptr);
Status NotFound(std::string message, nlohmann::json details = nullptr);
Status Conflict(std::string message, nlohmann::json details = nullptr);
Status DataLoss(std::string message, nlohmann::json details = nullptr);
Status Internal(std::string message, nlohmann::json details = nullptr);
Status Unavailable(std::string message, nlohmann::json details = nullptr);
Status DeadlineExceeded(std::string message, nlohmann::json details = nullptr);
Status ResourceExhausted(std::string message, nlohmann::json details = nullptr);
// Maps an errno from a failed system call on `path` to a Status
// (ENOSPC/EDQUOT → resource_exhausted, ENOENT → not_found, else internal).
Status ErrnoStatus(int err, std::string_view what, std::string_view path);

// The error body of the REST reference: {"error":{"code","message","details"}}.
nlohmann::json ErrorBody(const Status& status);
// The inverse of ErrorBody. Takes the whole body or only its inner "error" object. Anything
// else, or a code that names no error, gives an internal error whose message is `fallback`.
Status StatusFromErrorJson(const nlohmann::json& j, std::string_view fallback = "unreadable error");

// Either a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}
  Result(Status status) : v_(std::move(status)) { assert(!std::get<Status>(v_).ok()); }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace tessera

#define TESSERA_CONCAT_INNER(a, b) a##b
#define TESSERA_CONCAT(a, b) TESSERA_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` (a Status) is not ok.
#define RETURN_IF_ERROR(expr)                         \
  do {                                                \
    ::tessera::Status _st = (expr);                   \
    if (!_st.ok()) return _st;                        \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, MakeX())`: unwraps a Result or returns its Status.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(TESSERA_CONCAT(_res_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()
