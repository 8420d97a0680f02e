// The worker's one client of tesserad. Every call of the agent goes through it, with a
// timeout chosen by what the call waits for, over kept-alive connections shared by the
// agent's threads (heartbeats excepted: see Heartbeat).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "http/client.h"
#include "http/server_list.h"
#include "api/json_codec.h"
#include "api/status.h"
#include "api/thread_annotations.h"

namespace tessera::worker {

class ControlPlane {
 public:
  // A call that tesserad answers at once (register, reports, mesh and job lookups).
  static constexpr int kCallTimeoutS = 30;
  // Room left, beyond what a call asks tesserad to wait, for the answer to arrive.
  static constexpr int kWaitMarginS = 10;

  // `servers`: tesserad's URL, or the URLs of several (http/server_list.h), which the
  // calls follow to the one that leads.
  ControlPlane(const http::ServerList& servers, std::string token);

  // A JSON call; transport failures are unavailable naming tesserad's address. A
  // standby's answer naming the leader is followed at once; after no answer the next
  // call goes to the next server (the caller decides whether to send it again).
  Result<Json> Call(const std::string& method, const std::string& path,
                    const Json& body = nullptr, int timeout_s = kCallTimeoutS);
  // A call that tesserad may hold up to `wait_ms` (long polls, barriers).
  Result<Json> Wait(const std::string& method, const std::string& path, const Json& body,
                    int64_t wait_ms);
  // POST /api/v1/workers/{id}/heartbeat on a connection of its own, closed after each beat:
  // an idle kept-alive connection between beats would cost tesserad more than a new one.
  // REQUIRES: called from one thread at a time.
  Result<Json> Heartbeat(const std::string& worker);

  // "/api/v1/workers/<id>" with the id as one path segment.
  static std::string WorkerPath(const std::string& worker);
  // The server calls go to now.
  std::string server() const { return servers_.Current(); }
  // How often calls moved to another server so far: a change means that a takeover
  // may have happened (docs/ha.md).
  uint64_t moves() const { return moves_.load(); }

 private:
  http::ClientPool* PoolOf(const std::string& url);

  http::ServerList servers_;
  std::atomic<uint64_t> moves_{0};
  const std::string token_;
  Mutex pools_mu_;
  std::map<std::string, std::unique_ptr<http::ClientPool>> pools_ GUARDED_BY(pools_mu_);
};

}  // namespace tessera::worker
