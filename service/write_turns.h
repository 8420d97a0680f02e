// The writers of one store, one after the other, in the order they came: a writer takes
// a turn, writes (the catalog, the root) with no lock of the store held, applies what it
// wrote to memory, and passes the turn on. So the store's state lock is never held across
// I/O (a reader or a waiter never queues behind the disk), and memory changes in the
// order the durable copy did: a reader never sees a value that was not stored.
//
//   WriteTurns::Turn turn = turns_.Take();  // waits for the writers before this one
//   Status st = catalog_->Put(...);         // no lock held
//   { MutexLock l(mu_); if (st.ok()) values_[k] = v; }
//   // ~Turn: the next writer goes
#pragma once

#include <cstdint>

#include "api/thread_annotations.h"

namespace tessera::service {

class WriteTurns {
 public:
  // A writer's turn, from Take() until it is destroyed (or moved from).
  class Turn {
   public:
    Turn(Turn&& other) noexcept : turns_(other.turns_) { other.turns_ = nullptr; }
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;
    Turn& operator=(Turn&&) = delete;
    ~Turn() {
      if (turns_ != nullptr) turns_->Pass();
    }

   private:
    friend class WriteTurns;
    explicit Turn(WriteTurns* turns) : turns_(turns) {}
    WriteTurns* turns_;
  };

  // Waits until every writer that took a turn before this call has passed it.
  // REQUIRES: the caller holds no lock a writer takes while it holds its turn.
  Turn Take() EXCLUDES(mu_);
  // Turns taken and not yet passed (the writer at work and those waiting).
  uint64_t queued() EXCLUDES(mu_);

 private:
  void Pass() EXCLUDES(mu_);

  Mutex mu_;  // held for the counters alone
  CondVar cv_;
  uint64_t next_ GUARDED_BY(mu_) = 0;     // the ticket the next Take gets
  uint64_t serving_ GUARDED_BY(mu_) = 0;  // the ticket whose turn it is
};

}  // namespace tessera::service
