#include "collectives/transport/subset_transport.h"

#include <set>
#include <string>

namespace tessera::collectives {

Result<std::unique_ptr<SubsetTransport>> SubsetTransport::Create(Transport* parent,
                                                                 std::vector<int> members) {
  std::set<int> seen;
  int self = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] < 0 || members[i] >= parent->size() || !seen.insert(members[i]).second) {
      return InvalidArgument("subgroup member " + std::to_string(members[i]) +
                             " is not a distinct rank of a group of size " +
                             std::to_string(parent->size()));
    }
    if (members[i] == parent->rank()) self = static_cast<int>(i);
  }
  if (self < 0) {
    return InvalidArgument("rank " + std::to_string(parent->rank()) + " is not in subgroup " +
                           RankList(members));
  }
  return std::unique_ptr<SubsetTransport>(new SubsetTransport(parent, std::move(members), self));
}

Status SubsetTransport::Send(int peer, std::span<const ConstBytes> parts, Deadline deadline) {
  RETURN_IF_ERROR(CheckPeerRank(rank_, size(), peer));
  return parent_->Send(members_[peer], parts, deadline);
}

Status SubsetTransport::Recv(int peer, Buffer* message, Deadline deadline) {
  RETURN_IF_ERROR(CheckPeerRank(rank_, size(), peer));
  return parent_->Recv(members_[peer], message, deadline);
}

Status SubsetTransport::RecvInto(int peer, std::span<uint8_t> dst, Deadline deadline) {
  RETURN_IF_ERROR(CheckPeerRank(rank_, size(), peer));
  return parent_->RecvInto(members_[peer], dst, deadline);
}

void SubsetTransport::PostRecv(int peer, std::span<uint8_t> dst) {
  if (CheckPeerRank(rank_, size(), peer).ok()) parent_->PostRecv(members_[peer], dst);
}

void SubsetTransport::CancelRecv(int peer) {
  if (CheckPeerRank(rank_, size(), peer).ok()) parent_->CancelRecv(members_[peer]);
}

}  // namespace tessera::collectives
