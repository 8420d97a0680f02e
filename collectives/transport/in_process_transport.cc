#include "collectives/transport/in_process_transport.h"

#include <string>
#include <utility>

namespace tessera::collectives {

struct InProcessTransport::Hub {
  std::vector<std::unique_ptr<Mailbox>> mailboxes;  // by rank
};

std::vector<std::unique_ptr<Transport>> InProcessTransport::CreateGroup(int size) {
  auto hub = std::make_shared<Hub>();
  for (int r = 0; r < size; ++r) hub->mailboxes.push_back(std::make_unique<Mailbox>(r, size));
  std::vector<std::unique_ptr<Transport>> group;
  for (int r = 0; r < size; ++r) group.emplace_back(new InProcessTransport(hub, r));
  return group;
}

InProcessTransport::InProcessTransport(std::shared_ptr<Hub> hub, int rank)
    : hub_(std::move(hub)), rank_(rank) {}

InProcessTransport::~InProcessTransport() { Close(); }

int InProcessTransport::size() const { return static_cast<int>(hub_->mailboxes.size()); }

Status InProcessTransport::Send(int peer, std::span<const ConstBytes> parts, Deadline) {
  RETURN_IF_ERROR(CheckPeerRank(rank_, size(), peer));
  Mailbox& own = *hub_->mailboxes[rank_];
  if (Status st = own.SendStatus(peer); !st.ok()) {
    own.Poison(st);
    return st;
  }
  size_t total = 0;
  for (ConstBytes part : parts) total += part.size();
  Mailbox& dest = *hub_->mailboxes[peer];
  Buffer message = dest.Allocate(total);
  size_t at = 0;
  for (ConstBytes part : parts) {
    CopyBytes(message.data() + at, part.data(), part.size());
    at += part.size();
  }
  dest.Deliver(rank_, std::move(message));
  return Status::Ok();
}

Status InProcessTransport::Recv(int peer, Buffer* message, Deadline deadline) {
  RETURN_IF_ERROR(CheckPeerRank(rank_, size(), peer));
  return hub_->mailboxes[rank_]->Take(peer, message, deadline);
}

void InProcessTransport::Abort(const Status& reason) {
  hub_->mailboxes[rank_]->Poison(reason);
  if (IsRelayedAbort(reason)) return;
  Status relayed = AbortedBy(rank_, reason);
  for (int p = 0; p < size(); ++p) {
    if (p != rank_) hub_->mailboxes[p]->Poison(relayed);
  }
}

void InProcessTransport::Poison(const Status& reason) { hub_->mailboxes[rank_]->Poison(reason); }

void InProcessTransport::Close() {
  if (closed_.exchange(true)) return;
  hub_->mailboxes[rank_]->Poison(
      Unavailable("the transport of rank " + std::to_string(rank_) + " is closed"));
  for (int p = 0; p < size(); ++p) {
    if (p == rank_) continue;
    hub_->mailboxes[p]->MarkPeerGone(
        rank_, Unavailable("rank " + std::to_string(rank_) + " closed its transport",
                           {{"peer_rank", rank_}}));
  }
}

Status InProcessTransport::status() const { return hub_->mailboxes[rank_]->status(); }

}  // namespace tessera::collectives
