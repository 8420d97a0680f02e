// Ranks that are threads of one process, joined by a hub of mailboxes: a Send
// copies the message into the peer's queue. For tests and for the local devices of
// one worker.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "collectives/mailbox.h"
#include "collectives/transport/transport.h"

namespace tessera::collectives {

class InProcessTransport final : public Transport {
 public:
  // `size` connected transports; element i is rank i. Hand each to its thread.
  static std::vector<std::unique_ptr<Transport>> CreateGroup(int size);

  ~InProcessTransport() override;

  int rank() const override { return rank_; }
  int size() const override;
  Status Send(int peer, std::span<const ConstBytes> parts, Deadline deadline) override;
  using Transport::Send;
  Status Recv(int peer, Buffer* message, Deadline deadline) override;
  void Abort(const Status& reason) override;
  void Poison(const Status& reason) override;
  void Close() override;
  Status status() const override;

 private:
  struct Hub;
  InProcessTransport(std::shared_ptr<Hub> hub, int rank);

  std::shared_ptr<Hub> hub_;
  const int rank_;
  std::atomic<bool> closed_{false};
};

}  // namespace tessera::collectives
