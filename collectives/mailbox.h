// The receiving side of one rank, shared by both transports: a FIFO of whole
// messages per peer, which peers are gone, and the transport's sticky error.
// Internal to the collectives library. Thread-safe.
#pragma once

#include <deque>
#include <vector>

#include "api/status.h"
#include "api/thread_annotations.h"
#include "collectives/buffer.h"
#include "collectives/transport/transport.h"

namespace tessera::collectives {

class Mailbox {
 public:
  Mailbox(int self, int size);

  // Queues a message from `peer` and wakes the receiver.
  void Deliver(int peer, Buffer message);
  // `peer` will send nothing more; `why` (naming it) is what Take and SendStatus
  // report for it once its queue is empty. The first reason wins.
  void MarkPeerGone(int peer, Status why);
  bool PeerGone(int peer) const;
  // The sticky error; the first one wins. Wakes every waiter.
  void Poison(Status why);
  Status status() const;
  // OK if a message may be sent to `peer`: not poisoned and the peer not gone.
  Status SendStatus(int peer) const;

  // The next message from `peer` into *out; the old storage of *out is kept for
  // Allocate. Queued messages come out even after an error. An empty queue of a
  // gone peer poisons the mailbox with the peer's reason; a deadline leaves it as is.
  Status Take(int peer, Buffer* out, Deadline deadline);
  // Take without waiting: true with the message in *out, false if none is queued
  // yet, or the error Take would report (poisoned, or the peer gone and its
  // queue empty).
  Result<bool> TryTake(int peer, Buffer* out);
  // Waits until a message from `peer` is queued, the mailbox is poisoned, the
  // peer is gone, or `until`.
  void Wait(int peer, Deadline until);
  // True when Take would return at once: a message from `peer` is queued, or
  // there is an error to report.
  bool Ready(int peer) const;

  // A buffer of `size` bytes, reusing recycled storage when one is large enough.
  Buffer Allocate(size_t size);

 private:
  // Keeps a few spare buffers; enough for the messages one collective has in
  // flight. Below kMinSpareBytes malloc is cheap and recycling is not worth it.
  static constexpr size_t kMaxSpares = 8;
  static constexpr size_t kMinSpareBytes = 64 << 10;

  // True with the front message of `peer` in *out, false if its queue is empty
  // and nothing is wrong, else the error.
  Result<bool> TakeLocked(int peer, Buffer* out) REQUIRES(mu_);

  const int self_;
  mutable Mutex mu_;
  CondVar cv_;
  std::vector<std::deque<Buffer>> queues_ GUARDED_BY(mu_);  // by peer
  std::vector<Status> gone_ GUARDED_BY(mu_);                // by peer
  Status poison_ GUARDED_BY(mu_);
  std::vector<Buffer> spares_ GUARDED_BY(mu_);
};

}  // namespace tessera::collectives
