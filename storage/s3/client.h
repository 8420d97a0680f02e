// A small S3 client over libcurl: the object operations a checkpoint store
// needs (put, conditional put, get, ranged get, head, delete, list, multipart
// upload and its abort), path-style addressing, SigV4 on every request.
//
// Failures name the endpoint, the bucket and the key. 5xx answers, SlowDown and
// connection failures are retried with exponential backoff until the request's
// retry budget is spent; other errors are returned at once:
//   404 NoSuchKey      → not_found (details: key)
//   404 NoSuchBucket   → not_found (details: bucket)
//   403                → unauthenticated (bad credentials or clock)
//   412 / 409          → conflict (a conditional put found the key)
//   unreachable / 5xx  → unavailable (details: endpoint), after the retries
// Requests go out through a Transport (transport.h), libcurl unless one is given.
// Thread-safe: each thread keeps its own connection to the endpoint.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "api/status.h"
#include "storage/s3/sigv4.h"
#include "storage/s3/transport.h"

namespace tessera::storage::s3 {

struct Config {
  std::string endpoint;  // http(s)://host[:port], no trailing slash
  std::string bucket;
  std::string region = "us-east-1";
  Credentials credentials;
  int connect_timeout_ms = 5000;
  int request_timeout_ms = 300000;
  // A request moving less than 1 byte/s for this long is abandoned (and retried):
  // a full Ceph cluster, for one, holds writes rather than failing them.
  int stall_timeout_ms = 30000;
  int64_t retry_budget_ms = 30000;  // total time one request may spend on retries
  int64_t first_backoff_ms = 50;

  // endpoint from TESSERA_S3_ENDPOINT; credentials and region from
  // AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION.
  // invalid_argument naming what is missing.
  static Result<Config> FromEnvironment(std::string bucket, std::string endpoint = "");
};

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
};

class Client {
 public:
  // transport null: DefaultTransport().
  explicit Client(Config config, std::shared_ptr<Transport> transport = nullptr);

  const Config& config() const { return config_; }

  Status CreateBucket();
  // if_absent: the put succeeds only if no object has the key (If-None-Match: *);
  // conflict when one does. This is how a checkpoint commits exactly once.
  Status Put(const std::string& key, std::string_view body, bool if_absent = false);
  Result<std::string> Get(const std::string& key);
  // bytes [offset, offset + n) of the object.
  Result<std::string> GetRange(const std::string& key, uint64_t offset, uint64_t n);
  Result<uint64_t> Size(const std::string& key);
  // Deleting a key that is not there succeeds (S3 semantics).
  Status Delete(const std::string& key);
  // Every object whose key starts with `prefix`, in key order. With `dirs`, the
  // listing stops at the next '/' after the prefix: keys below it are rolled up
  // into `dirs` (their common prefixes, ending in '/') and not returned.
  // max_keys > 0: one page of at most that many entries.
  Result<std::vector<ObjectInfo>> List(const std::string& prefix,
                                       std::vector<std::string>* dirs = nullptr,
                                       int max_keys = 0);

  // Multipart upload: parts are 1-based and at least 5 MiB except the last.
  Result<std::string> StartUpload(const std::string& key);
  Result<std::string> PutPart(const std::string& key, const std::string& upload_id, int part,
                              std::string_view body);  // → the part's ETag
  Status FinishUpload(const std::string& key, const std::string& upload_id,
                      const std::vector<std::string>& etags);
  Status AbortUpload(const std::string& key, const std::string& upload_id);
  // Uploads started and neither finished nor aborted, under `prefix`: key, upload id.
  Result<std::vector<std::pair<std::string, std::string>>> ListUploads(const std::string& prefix);

 private:
  using Response = HttpResponse;
  struct Request {
    std::string method;
    std::string key;  // "" for the bucket itself
    std::vector<std::pair<std::string, std::string>> query;
    std::vector<std::pair<std::string, std::string>> headers;
    std::string_view body;
  };
  // Bodies this large are sent as UNSIGNED-PAYLOAD: hashing them twice (here, and
  // again by the server to check) costs CPU a bulk transfer needs, and shard data
  // carries its own checksums, verified on every read. Smaller bodies (manifests,
  // indexes) are signed.
  static constexpr size_t kUnsignedPayloadBytes = 1 << 20;
  // Signs, sends and retries; any HTTP answer that is not retried is returned.
  Result<Response> Send(const Request& request);
  Result<Response> SendOnce(const Request& request);
  // The error of a non-2xx answer, naming what the request was about.
  Status ErrorOf(const Request& request, const Response& response) const;
  Result<Response> Call(const Request& request);  // Send, then ErrorOf unless 2xx

  Config config_;
  std::shared_ptr<Transport> transport_;
  std::string host_;  // the Host header: host[:port] of the endpoint
};

}  // namespace tessera::storage::s3
