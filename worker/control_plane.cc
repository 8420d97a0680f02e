#include "worker/control_plane.h"

#include <utility>

#include "http/router.h"

namespace tessera::worker {

ControlPlane::ControlPlane(const http::ServerList& servers, std::string token)
    : servers_(servers), token_(std::move(token)) {}

http::ClientPool* ControlPlane::PoolOf(const std::string& url) {
  MutexLock lock(pools_mu_);
  auto& pool = pools_[url];
  if (!pool) pool = std::make_unique<http::ClientPool>(url, token_, kCallTimeoutS);
  return pool.get();
}

Result<Json> ControlPlane::Call(const std::string& method, const std::string& path,
                                const Json& body, int timeout_s) {
  for (size_t attempt = 0;; ++attempt) {
    const std::string url = servers_.Current();
    auto client = PoolOf(url)->Acquire();
    client->SetTimeout(timeout_s);
    auto r = client->Call(method, path, body);
    if (r.ok() || !servers_.FailOver(url, r.status())) return r;
    moves_++;
    // A standby named the leader: there at once (it changed nothing). Any other
    // failure goes back to the caller, whose next call goes to the next server.
    if (http::LeaderNamed(r.status()).empty() || attempt >= servers_.size()) return r;
  }
}

Result<Json> ControlPlane::Wait(const std::string& method, const std::string& path,
                                const Json& body, int64_t wait_ms) {
  return Call(method, path, body, static_cast<int>(wait_ms / 1000) + kWaitMarginS);
}

Result<Json> ControlPlane::Heartbeat(const std::string& worker) {
  const std::string url = servers_.Current();
  http::Client client(url, token_, 5, /*keep_alive=*/false);
  auto r = client.Call("POST", WorkerPath(worker) + "/heartbeat");
  if (!r.ok() && servers_.FailOver(url, r.status())) moves_++;
  return r;
}

std::string ControlPlane::WorkerPath(const std::string& worker) {
  return "/api/v1/workers/" + http::PercentEncodeSegment(worker);
}

}  // namespace tessera::worker
