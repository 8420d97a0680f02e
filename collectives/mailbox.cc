#include "collectives/mailbox.h"

#include <string>
#include <utility>

namespace tessera::collectives {

Mailbox::Mailbox(int self, int size) : self_(self), queues_(size), gone_(size) {}

void Mailbox::Deliver(int peer, Buffer message) {
  {
    MutexLock lock(mu_);
    queues_[peer].push_back(std::move(message));
  }
  cv_.NotifyAll();
}

void Mailbox::MarkPeerGone(int peer, Status why) {
  {
    MutexLock lock(mu_);
    if (gone_[peer].ok()) gone_[peer] = std::move(why);
  }
  cv_.NotifyAll();
}

bool Mailbox::PeerGone(int peer) const {
  MutexLock lock(mu_);
  return !gone_[peer].ok();
}

void Mailbox::Poison(Status why) {
  {
    MutexLock lock(mu_);
    if (poison_.ok()) poison_ = std::move(why);
  }
  cv_.NotifyAll();
}

Status Mailbox::status() const {
  MutexLock lock(mu_);
  return poison_;
}

Status Mailbox::SendStatus(int peer) const {
  MutexLock lock(mu_);
  if (!poison_.ok()) return poison_;
  return gone_[peer];
}

Result<bool> Mailbox::TakeLocked(int peer, Buffer* out) {
  auto& queue = queues_[peer];
  if (queue.empty()) {
    if (!poison_.ok()) return poison_;
    if (!gone_[peer].ok()) {
      poison_ = gone_[peer];  // sticky: the group cannot finish without this peer
      cv_.NotifyAll();
      return poison_;
    }
    return false;
  }
  if (out->capacity() >= kMinSpareBytes && spares_.size() < kMaxSpares) {
    spares_.push_back(std::move(*out));
  }
  *out = std::move(queue.front());
  queue.pop_front();
  return true;
}

Status Mailbox::Take(int peer, Buffer* out, Deadline deadline) {
  MutexLock lock(mu_);
  while (true) {
    // Errors are checked before the deadline: an error that came in while
    // waiting explains the wait better than "timed out".
    ASSIGN_OR_RETURN(bool taken, TakeLocked(peer, out));
    if (taken) return Status::Ok();
    if (Clock::now() >= deadline) {
      return DeadlineExceeded("timed out waiting for a message from rank " + std::to_string(peer),
                              {{"peer_rank", peer}, {"rank", self_}});
    }
    cv_.WaitUntil(mu_, deadline);
  }
}

Result<bool> Mailbox::TryTake(int peer, Buffer* out) {
  MutexLock lock(mu_);
  return TakeLocked(peer, out);
}

bool Mailbox::Ready(int peer) const {
  MutexLock lock(mu_);
  return !queues_[peer].empty() || !poison_.ok() || !gone_[peer].ok();
}

void Mailbox::Wait(int peer, Deadline until) {
  MutexLock lock(mu_);
  while (queues_[peer].empty() && poison_.ok() && gone_[peer].ok() && Clock::now() < until) {
    cv_.WaitUntil(mu_, until);
  }
}

Buffer Mailbox::Allocate(size_t size) {
  Buffer buffer;
  if (size >= kMinSpareBytes) {
    // Best fit, so that headers do not take the buffers that chunks need.
    MutexLock lock(mu_);
    auto best = spares_.end();
    for (auto it = spares_.begin(); it != spares_.end(); ++it) {
      if (it->capacity() >= size && (best == spares_.end() || it->capacity() < best->capacity())) {
        best = it;
      }
    }
    if (best != spares_.end()) {
      buffer = std::move(*best);
      spares_.erase(best);
    }
  }
  buffer.Reset(size);
  return buffer;
}

}  // namespace tessera::collectives
