#include "worker/collectives/transport.h"

#include <algorithm>
#include <climits>
#include <string>

namespace tessera::collectives {

int PollTimeoutMs(Deadline deadline) {
  auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

Status AbortedBy(int rank, const Status& reason) {
  Status st(reason.code(), "rank " + std::to_string(rank) + " aborted the group: " + reason.message(),
            reason.details());
  return st.WithDetail("aborted_by", rank);
}

bool IsRelayedAbort(const Status& status) {
  return status.details().is_object() && status.details().contains("aborted_by");
}

}  // namespace tessera::collectives
