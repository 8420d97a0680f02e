#include "worker/control_plane.h"

#include <utility>

#include "http/router.h"

namespace tessera::worker {

ControlPlane::ControlPlane(std::string server, std::string token)
    : server_(std::move(server)),
      token_(std::move(token)),
      clients_(server_, token_, kCallTimeoutS),
      heartbeat_client_(server_, token_, 5, /*keep_alive=*/false) {}

Result<Json> ControlPlane::Call(const std::string& method, const std::string& path,
                                const Json& body, int timeout_s) {
  auto client = clients_.Acquire();
  client->SetTimeout(timeout_s);
  return client->Call(method, path, body);
}

Result<Json> ControlPlane::Wait(const std::string& method, const std::string& path,
                                const Json& body, int64_t wait_ms) {
  return Call(method, path, body, static_cast<int>(wait_ms / 1000) + kWaitMarginS);
}

Result<Json> ControlPlane::Heartbeat(const std::string& worker) {
  return heartbeat_client_.Call("POST", WorkerPath(worker) + "/heartbeat");
}

std::string ControlPlane::WorkerPath(const std::string& worker) {
  return "/api/v1/workers/" + http::PercentEncodeSegment(worker);
}

}  // namespace tessera::worker
