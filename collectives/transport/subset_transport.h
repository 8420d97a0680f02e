// A view of some ranks of another transport as a group of their own: how one
// mesh-wide TCP mesh also carries the subgroups along mesh axes, without more
// connections. Rank i of the view is parent rank members[i].
//
// Messages between two ranks share the parent's queue whatever view sent them,
// so REQUIRES: the collectives of all views over one parent are issued one at a
// time, in the same order on every rank (e.g. serialized by one mutex per mesh).
// Errors are the parent's: a failure in a view poisons the parent and so every
// view over it; the owner then rebuilds the parent.
#pragma once

#include <memory>
#include <vector>

#include "api/status.h"
#include "collectives/transport/transport.h"

namespace tessera::collectives {

class SubsetTransport final : public Transport {
 public:
  // `members`: distinct parent ranks, including parent.rank(). `parent` must
  // outlive the view.
  static Result<std::unique_ptr<SubsetTransport>> Create(Transport* parent,
                                                         std::vector<int> members);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  Status Send(int peer, std::span<const ConstBytes> parts, Deadline deadline) override;
  using Transport::Send;
  Status Recv(int peer, Buffer* message, Deadline deadline) override;
  Status RecvInto(int peer, std::span<uint8_t> dst, Deadline deadline) override;
  void PostRecv(int peer, std::span<uint8_t> dst) override;
  void CancelRecv(int peer) override;
  void Abort(const Status& reason) override { parent_->Abort(reason); }
  void Poison(const Status& reason) override { parent_->Poison(reason); }
  // The parent stays open: it belongs to its owner.
  void Close() override {}
  Status status() const override { return parent_->status(); }
  Status Poll() override { return parent_->Poll(); }
  void SetLatencyBound(bool latency_bound) override { parent_->SetLatencyBound(latency_bound); }

  // The parent rank of view rank `rank`.
  int ParentRank(int rank) const { return members_[rank]; }

 private:
  SubsetTransport(Transport* parent, std::vector<int> members, int rank)
      : parent_(parent), members_(std::move(members)), rank_(rank) {}
  Transport* parent_;
  std::vector<int> members_;
  int rank_;
};

}  // namespace tessera::collectives
