#include "storage/testing/fault_transport.h"

#include <utility>

namespace tessera::storage {

FaultTransport::FaultTransport(std::shared_ptr<s3::Transport> base, std::string fail_matching)
    : base_(std::move(base)), fail_matching_(std::move(fail_matching)) {}

Result<s3::HttpResponse> FaultTransport::Send(const s3::HttpRequest& request) {
  if ((request.method + " " + request.url).find(fail_matching_) == std::string::npos) {
    return base_->Send(request);
  }
  ++failed_;
  s3::HttpResponse injected;
  injected.status = 503;
  injected.body = "<Error><Code>SlowDown</Code><Message>injected fault (requests matching '" +
                  fail_matching_ + "')</Message></Error>";
  return injected;
}

}  // namespace tessera::storage
