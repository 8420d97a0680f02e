// The few calls of etcd's v3 API that leadership needs, through etcd's JSON gateway
// (POST /v3/..., keys and values in base64): one lease, and a key created only if
// absent, under that lease. Tries each endpoint in turn; not thread-safe (one owner).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "api/json_codec.h"
#include "api/status.h"
#include "http/client.h"

namespace tessera::service {

struct EtcdKey {
  std::string value;
  int64_t lease = 0;
  int64_t create_revision = 0;
};

class EtcdClient {
 public:
  // `spec`: "etcd://HOST:PORT[,HOST:PORT...][/PREFIX]". invalid_argument naming it when malformed.
  static Result<std::unique_ptr<EtcdClient>> Open(const std::string& spec, int timeout_s = 2);

  const std::string& prefix() const { return prefix_; }
  std::string endpoints() const;

  // A lease of `ttl_s` seconds; its id.
  Result<int64_t> Grant(int64_t ttl_s);
  // Renews the lease: the seconds it has left, 0 when it is gone (expired or revoked).
  Result<int64_t> KeepAlive(int64_t lease);
  Status Revoke(int64_t lease);
  // Creates `key` = `value` under `lease` unless the key exists: (true, ours) or (false, the key there).
  Result<std::pair<bool, EtcdKey>> CreateIfAbsent(const std::string& key, const std::string& value,
                                                  int64_t lease);
  Result<std::optional<EtcdKey>> Get(const std::string& key);
  // Deletes `key` if it still has `create_revision` (it is still ours).
  Status DeleteIfCreated(const std::string& key, int64_t create_revision);

 private:
  EtcdClient(std::vector<std::string> urls, std::string prefix, int timeout_s);
  // POSTs to the current endpoint, moving on to the next one when it cannot be reached.
  Result<Json> Post(const std::string& path, const Json& body);

  std::vector<std::string> urls_;
  std::string prefix_;
  int timeout_s_;
  size_t current_ = 0;
  std::unique_ptr<http::Client> client_;
};

}  // namespace tessera::service
