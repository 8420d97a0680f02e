// A group: the ranks that run collectives together, over one transport.
//
// REQUIRES of callers (SPMD): every rank issues the same collectives with the
// same arguments in the same order. Each call carries a sequence number and a
// fingerprint of (op, dtype, shape, reduce op, root, group id) that every rank
// checks, so a violation is an error naming the ranks and their calls, never a
// hang or garbage. Calls from several threads on one group are serialized; they
// must still reach the group in the same order on every rank.
//
// Subgroups (e.g. one per mesh axis) are separate Groups over separate
// transports, so concurrent collectives in different groups never share a queue.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "api/status.h"
#include "api/thread_annotations.h"
#include "collectives/transport/transport.h"

namespace tessera::collectives {

class Session;

class Group {
 public:
  // `id` names the group in fingerprints and messages; every rank passes the same.
  explicit Group(std::unique_ptr<Transport> transport, std::string id = "")
      : transport_(std::move(transport)), id_(std::move(id)) {}
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int rank() const { return transport_->rank(); }
  int size() const { return transport_->size(); }
  const std::string& id() const { return id_; }
  Transport& transport() { return *transport_; }

  // OK, or the error that poisoned the group. Once poisoned, every collective
  // fails at once with that error; rebuild the group on a new transport.
  Status status() const { return transport_->status(); }
  // status(), after the transport read what came while the group was idle
  // (Transport::Poll): check it before reusing a group.
  Status Poll() { return transport_->Poll(); }

 private:
  friend class Session;
  std::unique_ptr<Transport> transport_;
  const std::string id_;
  Mutex mu_;  // held by each collective for its whole duration (Session)
  uint64_t next_seq_ GUARDED_BY(mu_) = 0;
};

}  // namespace tessera::collectives
