// FaultTransport wraps the S3 client's transport and answers every request whose
// "METHOD URL" contains a given text with 503 SlowDown, without sending it: a
// store that keeps refusing one part, or one commit, while the rest goes through.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "storage/s3/transport.h"

namespace tessera::storage {

class FaultTransport final : public s3::Transport {
 public:
  // `base` sends what does not match; `fail_matching` must not be empty.
  FaultTransport(std::shared_ptr<s3::Transport> base, std::string fail_matching);

  Result<s3::HttpResponse> Send(const s3::HttpRequest& request) override;
  // Requests answered with the injected 503.
  uint64_t failed() const { return failed_.load(); }

 private:
  std::shared_ptr<s3::Transport> base_;
  std::string fail_matching_;
  std::atomic<uint64_t> failed_{0};
};

}  // namespace tessera::storage
