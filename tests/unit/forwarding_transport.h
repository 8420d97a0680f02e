// A transport that passes every call on to another: tests derive from it to count or
// watch what a rank sends and receives.
#pragma once

#include <memory>
#include <span>
#include <utility>

#include "collectives/transport/transport.h"

namespace tessera::collectives {

class ForwardingTransport : public Transport {
 public:
  explicit ForwardingTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Status Send(int peer, std::span<const ConstBytes> parts, Deadline deadline) override {
    return inner_->Send(peer, parts, deadline);
  }
  using Transport::Send;
  Status Recv(int peer, Buffer* message, Deadline deadline) override {
    return inner_->Recv(peer, message, deadline);
  }
  Status RecvInto(int peer, std::span<uint8_t> dst, Deadline deadline) override {
    return inner_->RecvInto(peer, dst, deadline);
  }
  Status Reach(std::span<const int> peers, Deadline deadline) override { return inner_->Reach(peers, deadline); }
  bool Reached(int peer) const override { return inner_->Reached(peer); }
  void Abort(const Status& reason) override { inner_->Abort(reason); }
  void Poison(const Status& reason) override { inner_->Poison(reason); }
  void Close() override { inner_->Close(); }
  Status status() const override { return inner_->status(); }

 private:
  std::unique_ptr<Transport> inner_;
};

}  // namespace tessera::collectives
