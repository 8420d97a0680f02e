// A TCP mesh between the ranks of a group (one connection per pair of ranks): the
// full mesh, or with TcpOptions::connect_all = false only the pairs that asked for
// each other (Reach), each pair connected the way Connect connects them all.
//
// Joining takes two steps so that port 0 works: every rank binds a TcpListener
// (learning its port), the addresses are exchanged out of band (the control
// plane's KV store, or the parent of forked processes), then every rank calls
// TcpTransport::Connect. Rank i connects to every rank j < i and accepts every
// rank j > i. The connecting side opens with a hello carrying the group id, the
// world size and both ranks; then both sides prove that they know the group's
// key (a challenge-response with HMAC-SHA256, bound to the hello: tcp_wire.h).
// A connection that fails the proof never reaches a group: the accepting side
// closes it, logs it (at most a line a second) and counts it (refused()); the
// connecting side fails naming the peer that did not prove it. Then the
// accepting side checks the hello's group id, world size and ranks and answers
// with an acceptance or the reason for a refusal, so a mismatch fails on both
// sides with a message saying what differs.
//
// On the wire every message is a frame: a 16-byte header (magic, kind, length)
// and the payload (tcp_wire.h). Senders write header and payload with one
// sendmsg (no copy into a staging buffer). Kinds besides data: goodbye (Close),
// and abort (carries the error that poisoned the sender).
//
// Receiving is done by the calling threads, as MPI's progress engines do: no
// thread of the transport's own sits between the socket and the caller, so a
// small message costs no extra wake-up. A caller waiting for a message (Recv) or
// for room to send (Send) becomes the transport's receiver: it spins for a
// little while (TcpOptions::spin: poll without blocking, yielding the CPU in
// between), then blocks in poll. In calls bound by latency (SetLatencyBound) it
// stops spinning early once a yield ran another thread: on a CPU shared by more
// runnable threads than it has (ranks outnumbering cores), the peer this rank
// waits for may need that very CPU. Bulk transfers keep the full spin: there a
// sleep's wake-up costs more than the turns the spin takes. It reads every
// peer's frames, not just the one it waits for, into per-peer queues (the
// Mailbox), so a ring of blocking sends cannot deadlock and an abort from any
// peer is seen at once. Small frames are read many at a time through a per-peer
// staging buffer; large payloads go straight into their buffer, or with
// RecvInto into the caller's memory.
// The price: bytes a peer sends while no thread of this rank is inside Send or
// Recv wait in the kernel's socket buffers (and a sender may wait for this rank
// to call in); every collective has all its ranks inside a call, so none waits
// long.
// Byte order is the host's: the mesh is homogeneous.
#pragma once

#include <poll.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "api/thread_annotations.h"
#include "collectives/mailbox.h"
#include "collectives/transport/tcp/tcp_listener.h"
#include "collectives/transport/tcp/tcp_socket.h"
#include "collectives/transport/tcp/tcp_wire.h"
#include "collectives/transport/transport.h"

namespace tessera::collectives {

class TcpTransport final : public Transport {
 public:
  // Joins the mesh as options.rank; addresses[j] is rank j's listener address
  // (this rank's own entry is not used), optionally prefixed "name@" to name the
  // peer in messages ("w-b@10.0.0.2:7071"). The listener is closed once every
  // higher rank has connected.
  // Errors: invalid_argument for bad options or a peer that does not match
  // (group id, world size, ranks), naming both sides' values; unauthenticated
  // naming a lower rank whose end did not prove it knows the key; deadline_exceeded
  // naming the ranks that could not be reached or never connected
  // (details.missing_ranks); unavailable for other connection failures.
  static Result<std::unique_ptr<TcpTransport>> Connect(std::unique_ptr<TcpListener> listener,
                                                       const std::vector<std::string>& addresses,
                                                       const TcpOptions& options);
  // The same, with higher ranks reaching this one through a shared acceptor
  // (the process's data port); addresses[j] is rank j's acceptor address.
  static Result<std::unique_ptr<TcpTransport>> Connect(TcpAcceptor& acceptor,
                                                       const std::vector<std::string>& addresses,
                                                       const TcpOptions& options);
  ~TcpTransport() override;

  // Connect with connect_all = false: connects to the ranks of `peers` not reached
  // yet; the lower rank of each pair accepts (its listener or data port stays open
  // for it), the higher dials. A connection from any rank not reached yet is taken
  // meanwhile. Send and Recv to a rank not reached fail (internal: a caller's bug).
  Status Reach(std::span<const int> peers, Deadline deadline) override;
  bool Reached(int peer) const override;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(peers_.size()); }
  Status Send(int peer, std::span<const ConstBytes> parts, Deadline deadline) override;
  using Transport::Send;
  Status Recv(int peer, Buffer* message, Deadline deadline) override;
  Status RecvInto(int peer, std::span<uint8_t> dst, Deadline deadline) override;
  void PostRecv(int peer, std::span<uint8_t> dst) override;
  void CancelRecv(int peer) override;
  void Abort(const Status& reason) override;
  void Poison(const Status& reason) override { mailbox_.Poison(reason); }
  void Close() override;
  Status status() const override { return mailbox_.status(); }
  Status Poll() override;
  void SetLatencyBound(bool latency_bound) override { latency_bound_.store(latency_bound); }

  // How receiving threads waited, since Connect: counts of waits for a message
  // that was not there at once, of spins cut short because a yield ran another
  // thread (in calls bound by latency), and of waits that went on to sleep in
  // poll(2).
  struct WaitStats {
    uint64_t waits = 0;
    uint64_t spins_cut = 0;
    uint64_t sleeps = 0;
  };
  WaitStats wait_stats() const {
    return {waits_.load(std::memory_order_relaxed), spins_cut_.load(std::memory_order_relaxed),
            sleeps_.load(std::memory_order_relaxed)};
  }

 private:
  struct Peer;
  using FrameKind = wire::FrameKind;

  // Accepts one connection of a higher rank (AcceptOne, or the data port's).
  using AcceptFn = std::function<Result<std::pair<int, tcp::Fd>>(Deadline, const std::set<int>&)>;

  TcpTransport(int rank, std::string group_id, std::chrono::microseconds spin,
               std::vector<std::unique_ptr<Peer>> peers);
  static Result<std::unique_ptr<TcpTransport>> Join(const std::vector<std::string>& addresses,
                                                    const TcpOptions& options, AcceptFn accept);
  // Makes `fd` the connection to `peer`.
  void Install(int peer, int fd);
  // Joined with connect_all = false.
  bool sparse() const { return accept_ != nullptr; }
  // internal (a caller's bug) for a rank this one has not reached (connect_all = false).
  Status CheckReached(int peer) const;
  Status SendFrame(int peer, FrameKind kind, std::span<const ConstBytes> parts, Deadline deadline);
  enum class SendWait { kReady, kTimeout, kStopped };
  // Until `peer`'s socket takes more bytes (kReady: or its end is finished, so
  // that sending fails and names it), receiving from every peer meanwhile unless
  // another thread is the receiver.
  SendWait WaitToSend(int peer, Deadline deadline);
  // Recv and RecvInto: the next message of `peer` into `dst` when it is given,
  // else into *message.
  Status Receive(int peer, Buffer* message, std::span<uint8_t>* dst, Deadline deadline);
  // As the receiver (holding rx_mu_): waits up to `timeout_ms` (0: not at all)
  // for any peer's bytes and reads what came; rx_fds_ keep the revents. True
  // once the transport is closing (or poll failed, which poisons it).
  bool Pump(int timeout_ms) REQUIRES(rx_mu_);
  // Reads what `peer` has sent so far; false once its connection is finished.
  bool ReadFrom(int peer) REQUIRES(rx_mu_);
  // The header at the front of `peer`'s staged bytes is complete: sets up its payload.
  bool StartFrame(int peer) REQUIRES(rx_mu_);
  bool FinishFrame(int peer) REQUIRES(rx_mu_);
  // Points `peer`'s next data frame at `dst`, unless a message of `peer` is
  // queued or arriving (it comes first): false then.
  bool Target(int peer, std::span<uint8_t> dst) REQUIRES(rx_mu_);
  // Ends `peer`'s target; a frame half-way into it goes on into a queued message.
  void Untarget(int peer) REQUIRES(rx_mu_);
  void PeerLost(int peer, const std::string& why);

  const int rank_;
  const std::string group_id_;
  // connect_all = false: what Reach connects with (the options, the addresses by
  // rank, and the accepting side: a listener's, which it owns, or the data port's).
  // Null accept_: the full mesh, joined by Connect.
  TcpOptions options_;
  std::vector<std::string> addresses_;
  AcceptFn accept_;
  const std::chrono::microseconds spin_;
  std::vector<std::unique_ptr<Peer>> peers_;  // by rank; own entry has no connection
  Mailbox mailbox_;
  int stop_fd_ = -1;  // eventfd: readable once Close starts; wakes receivers and senders
  std::atomic<bool> closed_{false};
  std::atomic<bool> abort_sent_{false};
  std::atomic<uint64_t> waits_{0}, spins_cut_{0}, sleeps_{0};  // wait_stats()
  std::atomic<bool> latency_bound_{false};                       // SetLatencyBound
  // Held by the thread acting as the receiver: it alone reads the sockets and
  // touches the peers' receive state.
  Mutex rx_mu_;
  std::vector<pollfd> rx_fds_ GUARDED_BY(rx_mu_);  // by rank, then stop_fd_; -1: not read
};

}  // namespace tessera::collectives
