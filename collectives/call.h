// Internal to the collectives library: one collective in flight.
//
// A public op opens a Session (which serializes it with other ops on the group and
// fixes its deadline) and begins one Call per collective step. Every Call opens
// with Exchange: each rank's header (sequence number, fingerprint of the
// signature, description, algorithm plan) plus an optional payload reaches every
// other rank, and each rank checks all of them. From 4 ranks up the records
// travel by recursive doubling among the largest power of two p ≤ n ranks
// (log2(p) rounds in which a rank swaps every record it holds with one
// partner), the other n - p ranks handing theirs to a neighbour first and
// getting all back from it at the end: n log2(n) messages for n a power of
// two. Smaller groups send every record to every peer in one round. That
// exchange gives
//   - mismatch detection before any data is interpreted, on every rank, with
//     both ranks' calls named;
//   - the exact list of ranks that did not arrive, when it times out (relayed:
//     a rank that timed out, or that got a roll call in place of a relay
//     message, sends a roll call to every rank and names those it has not
//     heard of that do not answer within min(timeout, 1 s));
//   - a path for small inputs with no other round (the payload is the data).
// Any communication failure after Begin aborts the group (Transport::Abort) and
// returns the error prefixed with the call's description.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "collectives/group.h"
#include "collectives/options.h"
#include "collectives/transport/transport.h"

namespace tessera::collectives {

// What a rank calls: e.g. {"all_reduce", "float32[8], sum"}. Everything that must
// agree across ranks goes into `args`; the fingerprint hashes it with the group id.
struct Signature {
  std::string op;
  std::string args;
  std::string Describe() const { return op + "(" + args + ")"; }
};

// The algorithm a rank will run; must be equal on every rank (checked).
struct Plan {
  Algorithm algorithm = Algorithm::kAuto;
  uint64_t chunk_bytes = 0;
};

class Call;

class Session {
 public:
  // Blocks until no other collective runs on `group`; `timeout` bounds
  // everything begun in this session.
  Session(Group& group, std::chrono::milliseconds timeout);

  // The next call: fails at once if the group is poisoned.
  Result<Call> Begin(Signature signature);
  Group& group() { return group_; }

 private:
  Group& group_;
  std::unique_lock<Mutex> lock_;  // group_.mu_, for the session's lifetime
  const std::chrono::milliseconds timeout_;
  const Deadline deadline_;
};

class Call {
 public:
  Call(Call&&) = default;

  int rank() const { return transport_->rank(); }
  int size() const { return transport_->size(); }
  const std::string& description() const { return description_; }

  // Gets this rank's header and `payload` to every peer and checks theirs.
  // Returns every rank's payload by rank (this rank's is `payload` itself), valid
  // until the next Exchange on this call. Payloads are 8-byte aligned.
  // Errors: conflict naming every mismatching rank and its call; deadline_exceeded
  // with details.missing_ranks; the transport's error naming a gone peer.
  Result<std::vector<ConstBytes>> Exchange(const Plan& plan, ConstBytes payload = {});

  Status Send(int peer, std::span<const ConstBytes> parts);
  Status Send(int peer, ConstBytes bytes) {
    return Send(peer, std::span<const ConstBytes>(&bytes, 1));
  }
  // The next message from `peer`, which must be exactly `expected_bytes` long.
  Status Recv(int peer, Buffer* message, size_t expected_bytes);
  // The next message from `peer`, which must be exactly `dst.size()` bytes, into
  // `dst` (straight from the wire where the transport can).
  Status RecvInto(int peer, std::span<uint8_t> dst);
  // Transport::PostRecv and CancelRecv.
  void PostRecv(int peer, std::span<uint8_t> dst) { transport_->PostRecv(peer, dst); }
  void CancelRecv(int peer) { transport_->CancelRecv(peer); }

  // Transport::SetLatencyBound for this call (Begin sets it off): on for calls
  // whose data rides the opening exchange.
  void SetLatencyBound(bool latency_bound) { transport_->SetLatencyBound(latency_bound); }

  // Prefixes `status` with this call, aborts the group with it and returns it.
  // tell_peers false: poisons only this rank (Transport::Poison).
  Status Fail(const Status& status, bool tell_peers = true);

 private:
  friend class Session;
  Call(Transport& transport, const std::string& group_id, Signature signature, uint64_t seq,
       std::chrono::milliseconds timeout, Deadline deadline);
  // The first phase of Exchange: every rank's record (header + payload) by rank
  // (empty: not received, and this rank's own), and what went wrong on the way.
  struct Gathered {
    std::vector<ConstBytes> records;
    std::vector<bool> arrived;  // by rank
    std::vector<int> missing;  // ranks not heard from by the deadline
    Status failure;            // the transport's error
    Status malformed;          // a message that is not records (protocol error)
  };
  // Every rank sends its record to every other one: one round, n(n-1) messages.
  Gathered GatherDirect(ConstBytes header, ConstBytes payload);
  // Records relayed by recursive doubling (n ≥ 4), ranks beyond a power of two
  // folded in and out.
  Gathered GatherByDoubling(ConstBytes header, ConstBytes payload);
  // The messages of GatherByDoubling; false when the exchange ends (`got` says why).
  bool SendRecords(int to, const std::vector<int>& ranks, ConstBytes header, ConstBytes payload,
                   const std::vector<uint64_t>& lengths, Gathered& got);
  bool ReceiveRecords(int from, const std::vector<int>& ranks, size_t slot,
                      std::vector<uint64_t>& lengths, Gathered& got);
  // After a relayed exchange stopped at the deadline (or at a partner's roll
  // call, heard_from): finds which of the ranks not heard of are missing.
  void RollCall(Gathered& got, int heard_from);
  // Fail for an error of the transport: reports the error that poisoned it, if any.
  Status TransportFailure(const Status& status);

  Transport* transport_;
  std::string group_id_;
  std::string description_;
  uint64_t fingerprint_;
  uint64_t seq_;
  std::chrono::milliseconds timeout_;
  Deadline deadline_;
  std::vector<Buffer> received_;  // the last Exchange's messages
};

}  // namespace tessera::collectives
