#include "storage/s3/client.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>
#include <thread>

namespace tessera::storage::s3 {
namespace {

// The text of the first <tag>...</tag> in `xml` at or after `from`, unescaped;
// `end` (if given) gets the position after the closing tag, npos when absent.
std::string Tag(std::string_view xml, std::string_view tag, size_t from = 0, size_t* end = nullptr) {
  const std::string open = "<" + std::string(tag) + ">", close = "</" + std::string(tag) + ">";
  size_t a = xml.find(open, from);
  size_t b = a == std::string_view::npos ? a : xml.find(close, a + open.size());
  if (b == std::string_view::npos) {
    if (end) *end = std::string_view::npos;
    return "";
  }
  if (end) *end = b + close.size();
  std::string_view raw = xml.substr(a + open.size(), b - a - open.size());
  std::string out;
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] != '&') {
      out.push_back(raw[i]);
      continue;
    }
    static const std::pair<std::string_view, char> kEntities[] = {
        {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
    bool matched = false;
    for (const auto& [entity, c] : kEntities) {
      if (raw.substr(i, entity.size()) == entity) {
        out.push_back(c);
        i += entity.size() - 1;
        matched = true;
        break;
      }
    }
    if (!matched) out.push_back('&');
  }
  return out;
}

std::string XmlEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

bool Retriable(long status, std::string_view body) {
  return status >= 500 || status == 429 || Tag(body, "Code") == "SlowDown";
}

}  // namespace

Result<Config> Config::FromEnvironment(std::string bucket, std::string endpoint) {
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "");
  };
  Config c;
  c.bucket = std::move(bucket);
  c.endpoint = endpoint.empty() ? env("TESSERA_S3_ENDPOINT") : std::move(endpoint);
  while (!c.endpoint.empty() && c.endpoint.back() == '/') c.endpoint.pop_back();
  c.credentials = {env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY"), env("AWS_SESSION_TOKEN")};
  if (std::string region = env("AWS_REGION"); !region.empty()) c.region = region;
  if (c.endpoint.empty()) {
    return InvalidArgument("no S3 endpoint: pass --s3-endpoint or set TESSERA_S3_ENDPOINT",
                           {{"field", "s3_endpoint"}});
  }
  if (c.endpoint.rfind("http://", 0) != 0 && c.endpoint.rfind("https://", 0) != 0) {
    return InvalidArgument("S3 endpoint '" + c.endpoint + "' must start with http:// or https://",
                           {{"field", "s3_endpoint"}});
  }
  if (c.credentials.access_key.empty() || c.credentials.secret_key.empty()) {
    return InvalidArgument("no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
                           {{"field", "AWS_ACCESS_KEY_ID"}});
  }
  if (c.bucket.size() < 3) {
    return InvalidArgument("S3 bucket name '" + c.bucket + "' is shorter than 3 characters",
                           {{"field", "bucket"}});
  }
  return c;
}

Client::Client(Config config, std::shared_ptr<Transport> transport)
    : config_(std::move(config)),
      transport_(transport ? std::move(transport) : DefaultTransport()) {
  const size_t scheme = config_.endpoint.find("://");
  host_ = config_.endpoint.substr(scheme == std::string::npos ? 0 : scheme + 3);
  host_ = host_.substr(0, host_.find('/'));
}

Result<Client::Response> Client::SendOnce(const Request& r) {
  const std::string path = "/" + config_.bucket + (r.key.empty() ? "" : "/" + r.key);
  HttpRequest out;
  out.method = r.method;
  out.url = config_.endpoint + EncodePath(path);
  if (!r.query.empty()) out.url += "?" + CanonicalQuery(r.query);
  out.body = r.body;
  out.connect_timeout_ms = config_.connect_timeout_ms;
  out.timeout_ms = config_.request_timeout_ms;
  out.stall_timeout_ms = config_.stall_timeout_ms;

  SignRequest sign;
  sign.method = r.method;
  sign.path = path;
  sign.query = r.query;
  sign.payload_sha256 =
      r.body.size() >= kUnsignedPayloadBytes ? "UNSIGNED-PAYLOAD" : Sha256Hex(r.body);
  sign.amz_date = AmzDate(std::chrono::system_clock::now());
  sign.region = config_.region;
  sign.headers = r.headers;
  sign.headers.push_back({"host", host_});
  sign.headers.push_back({"x-amz-date", sign.amz_date});
  sign.headers.push_back({"x-amz-content-sha256", sign.payload_sha256});
  if (!config_.credentials.session_token.empty()) {
    sign.headers.push_back({"x-amz-security-token", config_.credentials.session_token});
  }
  const Signature signature = Sign(sign, config_.credentials);
  for (auto& header : sign.headers) {
    if (header.first != "host") out.headers.push_back(std::move(header));
  }
  out.headers.push_back({"Authorization", signature.authorization});
  out.headers.push_back({"Content-Type", "application/octet-stream"});

  Result<Response> response = transport_->Send(out);
  if (!response.ok()) {
    return Unavailable("S3 endpoint " + config_.endpoint + " (bucket " + config_.bucket + "): " +
                           r.method + " " + (r.key.empty() ? "/" : r.key) + ": " +
                           response.status().message(),
                       {{"endpoint", config_.endpoint}, {"bucket", config_.bucket}});
  }
  return response;
}

Result<Client::Response> Client::Send(const Request& r) {
  const auto start = std::chrono::steady_clock::now();
  int64_t backoff = config_.first_backoff_ms;
  thread_local std::mt19937 jitter{std::random_device{}()};
  while (true) {
    Result<Response> got = SendOnce(r);
    const bool retry = !got.ok() || Retriable(got->status, got->body);
    const int64_t spent = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::steady_clock::now() - start).count();
    if (!retry || spent + backoff > config_.retry_budget_ms) {
      if (!got.ok() && spent > 0) {
        return Status(got.status().code(), got.status().message() + " (gave up after " +
                                               std::to_string(spent) + " ms of retries)",
                      got.status().details());
      }
      return got;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(
        backoff / 2 + std::uniform_int_distribution<int64_t>(0, backoff / 2)(jitter)));
    backoff = std::min<int64_t>(backoff * 2, 2000);
  }
}

Status Client::ErrorOf(const Request& r, const Response& response) const {
  const std::string code = Tag(response.body, "Code");
  const std::string message = Tag(response.body, "Message");
  std::string what = "S3 " + r.method + " of " + (r.key.empty() ? "bucket " + config_.bucket
                                                                  : "key " + r.key) +
                     " at " + config_.endpoint + " (bucket " + config_.bucket + ") answered " +
                     std::to_string(response.status) + (code.empty() ? "" : " " + code) +
                     (message.empty() ? "" : ": " + message);
  nlohmann::json details = {{"endpoint", config_.endpoint}, {"bucket", config_.bucket},
                            {"http_status", response.status}};
  if (!r.key.empty()) details["key"] = r.key;
  if (!code.empty()) details["s3_code"] = code;
  switch (response.status) {
    case 404:
      return Status(Code::kNotFound, what, details);
    case 401:
    case 403:
      return Status(Code::kUnauthenticated, what, details);
    case 409:
    case 412:
      return Status(Code::kConflict, what, details);
    case 400:
    case 411:
    case 416:
      return Status(Code::kInvalidArgument, what, details);
    default:
      return Status(response.status >= 500 ? Code::kUnavailable : Code::kInternal, what, details);
  }
}

Result<Client::Response> Client::Call(const Request& r) {
  ASSIGN_OR_RETURN(Response response, Send(r));
  if (response.status < 200 || response.status >= 300) return ErrorOf(r, response);
  // CompleteMultipartUpload may answer 200 with an error in the body.
  if (r.method == "POST" && response.body.find("<Error>") != std::string::npos) {
    response.status = 500;
    return ErrorOf(r, response);
  }
  return response;
}

Status Client::CreateBucket() {
  auto r = Call({"PUT", "", {}, {}, ""});
  if (!r.ok() && r.status().details().value("s3_code", "") == "BucketAlreadyOwnedByYou") {
    return Status::Ok();
  }
  return r.status();
}

Status Client::Put(const std::string& key, std::string_view body, bool if_absent) {
  Request r{"PUT", key, {}, {}, body};
  if (if_absent) r.headers.push_back({"If-None-Match", "*"});
  return Call(r).status();
}

Result<std::string> Client::Get(const std::string& key) {
  ASSIGN_OR_RETURN(Response r, Call({"GET", key, {}, {}, ""}));
  return std::move(r.body);
}

Result<std::string> Client::GetRange(const std::string& key, uint64_t offset, uint64_t n) {
  if (n == 0) return std::string();
  Request req{"GET", key, {}, {{"Range", "bytes=" + std::to_string(offset) + "-" +
                                              std::to_string(offset + n - 1)}}, ""};
  ASSIGN_OR_RETURN(Response r, Call(req));
  if (r.body.size() != n) {
    return DataLoss("S3 ranged GET of key " + key + " at " + config_.endpoint + " (bucket " +
                        config_.bucket + ") returned " + std::to_string(r.body.size()) +
                        " bytes for " + std::to_string(n) + " at offset " + std::to_string(offset),
                    {{"endpoint", config_.endpoint}, {"bucket", config_.bucket}, {"key", key}});
  }
  return std::move(r.body);
}

Result<uint64_t> Client::Size(const std::string& key) {
  ASSIGN_OR_RETURN(Response r, Call({"HEAD", key, {}, {}, ""}));
  return std::strtoull(r.headers["content-length"].c_str(), nullptr, 10);
}

Status Client::Delete(const std::string& key) {
  auto r = Call({"DELETE", key, {}, {}, ""});
  if (!r.ok() && r.status().code() == Code::kNotFound &&
      r.status().details().value("s3_code", "") != "NoSuchBucket") {
    return Status::Ok();
  }
  return r.status();
}

Result<std::vector<ObjectInfo>> Client::List(const std::string& prefix,
                                             std::vector<std::string>* dirs, int max_keys) {
  std::vector<ObjectInfo> out;
  std::string token;
  do {
    Request req{"GET", "", {{"list-type", "2"}, {"prefix", prefix}}, {}, ""};
    if (dirs) req.query.push_back({"delimiter", "/"});
    if (max_keys > 0) req.query.push_back({"max-keys", std::to_string(max_keys)});
    if (!token.empty()) req.query.push_back({"continuation-token", token});
    ASSIGN_OR_RETURN(Response r, Call(req));
    size_t pos = 0, end = 0;
    while (true) {
      std::string contents = Tag(r.body, "Contents", pos, &end);
      if (end == std::string::npos) break;
      out.push_back({Tag(contents, "Key"), std::strtoull(Tag(contents, "Size").c_str(), nullptr, 10)});
      pos = end;
    }
    for (pos = 0; dirs;) {
      std::string common = Tag(r.body, "CommonPrefixes", pos, &end);
      if (end == std::string::npos) break;
      dirs->push_back(Tag(common, "Prefix"));
      pos = end;
    }
    token = Tag(r.body, "IsTruncated") == "true" ? Tag(r.body, "NextContinuationToken") : "";
  } while (!token.empty() && max_keys <= 0);
  return out;
}

Result<std::string> Client::StartUpload(const std::string& key) {
  ASSIGN_OR_RETURN(Response r, Call({"POST", key, {{"uploads", ""}}, {}, ""}));
  std::string id = Tag(r.body, "UploadId");
  if (id.empty()) {
    return Internal("S3 at " + config_.endpoint + " started an upload of " + key +
                        " without an UploadId",
                    {{"endpoint", config_.endpoint}, {"bucket", config_.bucket}, {"key", key}});
  }
  return id;
}

Result<std::string> Client::PutPart(const std::string& key, const std::string& upload_id, int part,
                                    std::string_view body) {
  ASSIGN_OR_RETURN(Response r, Call({"PUT", key,
                                     {{"partNumber", std::to_string(part)}, {"uploadId", upload_id}},
                                     {}, body}));
  return r.headers["etag"];
}

Status Client::FinishUpload(const std::string& key, const std::string& upload_id,
                            const std::vector<std::string>& etags) {
  std::string xml = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < etags.size(); ++i) {
    xml += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" +
           XmlEscape(etags[i]) + "</ETag></Part>";
  }
  xml += "</CompleteMultipartUpload>";
  return Call({"POST", key, {{"uploadId", upload_id}}, {}, xml}).status();
}

Status Client::AbortUpload(const std::string& key, const std::string& upload_id) {
  auto r = Call({"DELETE", key, {{"uploadId", upload_id}}, {}, ""});
  if (!r.ok() && r.status().details().value("s3_code", "") == "NoSuchUpload") return Status::Ok();
  return r.status();
}

Result<std::vector<std::pair<std::string, std::string>>> Client::ListUploads(
    const std::string& prefix) {
  std::vector<std::pair<std::string, std::string>> out;
  std::string key_marker, id_marker;
  while (true) {
    Request req{"GET", "", {{"uploads", ""}, {"prefix", prefix}}, {}, ""};
    if (!key_marker.empty()) {
      req.query.push_back({"key-marker", key_marker});
      req.query.push_back({"upload-id-marker", id_marker});
    }
    ASSIGN_OR_RETURN(Response r, Call(req));
    size_t pos = 0, end = 0;
    while (true) {
      std::string upload = Tag(r.body, "Upload", pos, &end);
      if (end == std::string::npos) break;
      out.emplace_back(Tag(upload, "Key"), Tag(upload, "UploadId"));
      pos = end;
    }
    if (Tag(r.body, "IsTruncated") != "true") break;
    key_marker = Tag(r.body, "NextKeyMarker");
    id_marker = Tag(r.body, "NextUploadIdMarker");
    if (key_marker.empty()) break;
  }
  return out;
}

}  // namespace tessera::storage::s3
