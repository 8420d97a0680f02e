// The layer under the collectives: whole messages between the ranks of one group.
// Two implementations: InProcessTransport (ranks are threads of one process) and
// TcpTransport (a full TCP mesh between processes).
//
// Error model (as in Gloo): the first failure poisons the transport. Every later
// call fails fast with that original error, which names the peer involved; the
// group is rebuilt by creating a new transport. A poisoned rank tells its peers
// (Abort), so nobody waits for the full timeout on a group that cannot finish.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "api/status.h"
#include "collectives/buffer.h"

namespace tessera::collectives {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;
using ConstBytes = std::span<const uint8_t>;

// Milliseconds left until `deadline`, rounded up, as poll(2) wants them (0 once passed).
int PollTimeoutMs(Deadline deadline);

// The error every peer of `rank` sees when `rank` aborts the group with `reason`:
// same code and details, the message prefixed, and details.aborted_by = rank.
Status AbortedBy(int rank, const Status& reason);
// True for a status made by AbortedBy: in a full mesh it need not be relayed
// further, since every peer heard from the aborting rank directly (a transport
// that connects pair by pair relays it once, to the peers it reached).
bool IsRelayedAbort(const Status& status);

// "[1, 3]": how messages list ranks.
std::string RankList(const std::vector<int>& ranks);
// invalid_argument unless `peer` is a rank of a group of `size` other than `self`.
Status CheckPeerRank(int self, int size, int peer);
// The protocol error of a message from `peer` that is `got` bytes where
// `expected` were due.
Status WrongMessageSize(int peer, size_t expected, size_t got);

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Sends one message, the concatenation of `parts`, to `peer` (!= rank()).
  // Returns once the bytes are handed over (peer's queue or the kernel); the
  // caller may then reuse them. Never waits for the peer to call Recv: every
  // transport drains its peers in the background, so sends cannot deadlock.
  // Errors: the sticky error; unavailable if the peer closed or was lost;
  // deadline_exceeded if the bytes could not be handed over in time.
  virtual Status Send(int peer, std::span<const ConstBytes> parts, Deadline deadline) = 0;
  Status Send(int peer, ConstBytes bytes, Deadline deadline) {
    return Send(peer, std::span<const ConstBytes>(&bytes, 1), deadline);
  }

  // Receives the next message from `peer`, in send order, into `*message`; the
  // storage `*message` held before is recycled for later messages. Messages that
  // arrived before an error are still delivered. deadline_exceeded leaves the
  // transport usable; any other error poisons it.
  virtual Status Recv(int peer, Buffer* message, Deadline deadline) = 0;

  // Recv of a message that must be exactly `dst.size()` bytes, into `dst`. A
  // transport that can lands the bytes there straight from the wire (TCP: when
  // the message had not started to arrive); the default receives, then copies.
  // A message of another length is consumed and fails as a protocol error
  // naming the peer (internal), which poisons the transport.
  virtual Status RecvInto(int peer, std::span<uint8_t> dst, Deadline deadline);

  // Announces the RecvInto(peer, dst) that comes next from `peer`, so that the
  // bytes may land in `dst` while this thread is still sending (MPI's Irecv,
  // in effect). The next RecvInto from `peer` must pass the same `dst`; until
  // it returns, or CancelRecv(peer), `dst` must stay valid. Transports that
  // cannot ignore it.
  virtual void PostRecv(int /*peer*/, std::span<uint8_t> /*dst*/) {}
  // Withdraws a PostRecv whose RecvInto will not come (an error on the way).
  virtual void CancelRecv(int /*peer*/) {}

  // Poisons this transport with `reason` and, unless `reason` is itself a relayed
  // abort, tells every reachable peer: their transports become poisoned with
  // AbortedBy(rank(), reason). Thread-safe; the first poison wins.
  virtual void Abort(const Status& reason) = 0;
  // Poisons this transport with `reason` without telling the peers: for an
  // error every peer finds by itself (a mismatch in a header exchange that
  // completed), where an abort could reach a peer ahead of what shows it its own
  // view of the error.
  virtual void Poison(const Status& reason) = 0;

  // Says goodbye to every peer and releases the resources. Peers see this rank as
  // closed: messages it sent before stay receivable, anything more fails naming
  // it. Idempotent and thread-safe (may be called while another thread is inside
  // Send or Recv, which then fail). The destructor closes.
  virtual void Close() = 0;

  // OK, or the sticky error.
  virtual Status status() const = 0;

  // Whether the calls that wait on this transport now are bound by latency
  // (their data, a few KiB, rides the opening exchange), as opposed to moving
  // bulk data. TcpTransport then stops a waiting thread's spin once its CPU
  // turns out to be shared; other transports ignore it. The collectives set it
  // for each call (Call::SetLatencyBound); off by default.
  virtual void SetLatencyBound(bool /*latency_bound*/) {}

  // Connects this rank to `peers` where it is not connected yet, for a transport
  // joined without its full mesh (TcpTransport with TcpOptions::connect_all =
  // false); both ends of each pair must ask for each other. A transport whose
  // ranks are all connected has nothing to do. Call it while no other thread uses
  // the transport. Errors: as a join's (deadline_exceeded naming the ranks that
  // never connected, unauthenticated, invalid_argument for a peer that does not
  // match).
  virtual Status Reach(std::span<const int> /*peers*/, Deadline /*deadline*/) { return Status::Ok(); }
  // True when this rank can send to and receive from `peer`: always, unless the
  // transport connects pair by pair and has not reached `peer` yet.
  virtual bool Reached(int /*peer*/) const { return true; }
  // status(), after reading what the peers sent while this rank was inside no
  // call (an abort, a goodbye, a lost connection), so that an idle rank learns
  // of a failure before its next call instead of in the middle of it.
  virtual Status Poll() { return status(); }
};

}  // namespace tessera::collectives
