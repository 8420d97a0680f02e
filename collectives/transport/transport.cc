#include "collectives/transport/transport.h"

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
  // Relayed on (a transport that connects pair by pair): it names its first aborter.
  if (IsRelayedAbort(reason)) return reason;
  Status st(reason.code(),
            "rank " + std::to_string(rank) + " aborted the group: " + reason.message(),
            reason.details());
  return st.WithDetail("aborted_by", rank);
}

bool IsRelayedAbort(const Status& status) {
  return status.details().is_object() && status.details().contains("aborted_by");
}

std::string RankList(const std::vector<int>& ranks) {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out + "]";
}

Status CheckPeerRank(int self, int size, int peer) {
  if (peer >= 0 && peer < size && peer != self) return Status::Ok();
  return InvalidArgument("rank " + std::to_string(self) + ": no peer rank " + std::to_string(peer) +
                         " in a group of " + std::to_string(size));
}

Status WrongMessageSize(int peer, size_t expected, size_t got) {
  return Internal("protocol error: expected a message of " + std::to_string(expected) +
                      " bytes from rank " + std::to_string(peer) + ", got " + std::to_string(got),
                  {{"peer_rank", peer}});
}

Status Transport::RecvInto(int peer, std::span<uint8_t> dst, Deadline deadline) {
  Buffer message;
  RETURN_IF_ERROR(Recv(peer, &message, deadline));
  if (message.size() != dst.size()) {
    Status st = WrongMessageSize(peer, dst.size(), message.size());
    Abort(st);
    return st;
  }
  CopyBytes(dst.data(), message.data(), dst.size());
  return Status::Ok();
}

}  // namespace tessera::collectives
