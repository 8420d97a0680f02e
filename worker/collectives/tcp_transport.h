// A full TCP mesh between the ranks of a group (one connection per pair of ranks).
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
// sendmsg (no copy into a staging buffer). One background thread per transport
// polls every connection and reads whole frames into per-peer queues, so a Send
// never waits for the peer to call Recv and a ring of blocking sends cannot
// deadlock. Kinds besides data: goodbye (Close), and abort (carries the error
// that poisoned the sender).
// Byte order is the host's: the mesh is homogeneous.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "api/thread_annotations.h"
#include "worker/collectives/auth.h"
#include "worker/collectives/mailbox.h"
#include "worker/collectives/tcp_wire.h"
#include "worker/collectives/transport.h"

namespace tessera::collectives {

struct TcpOptions {
  int rank = 0;
  int size = 1;
  // Every rank of the group passes the same id (e.g. "mesh-a/data"); a peer with
  // another id is refused.
  std::string group_id;
  // For the whole of Connect: reaching lower ranks (retrying refused connections,
  // since they may not listen yet) and being reached by higher ones.
  std::chrono::milliseconds connect_timeout{30000};
  // The secret every rank of the group shares (Connect with a listener); a
  // connection whose other side does not prove it knows the same key is refused.
  // Connect through a TcpAcceptor uses the acceptor's key instead.
  DataPortKey key{};
};

// Connections that a data port (TcpAcceptor) or a listener of this process
// refused since it started: they failed the handshake (no proof, a wrong one, a
// stranger's bytes, another protocol version, too slow).
uint64_t RefusedConnections();

class TcpAcceptor;

class TcpListener {
 public:
  // Binds `host`:`port` and listens; port 0 asks the OS for a free port.
  static Result<std::unique_ptr<TcpListener>> Bind(const std::string& host, int port = 0);
  ~TcpListener();
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;

  // "127.0.0.1:41234": what peers pass to Connect.
  const std::string& address() const { return address_; }
  int port() const { return port_; }

 private:
  friend class TcpTransport;
  friend class TcpAcceptor;
  TcpListener(int fd, std::string address, int port);
  int fd_;
  std::string address_;
  int port_;
};

// A process's data port, shared by every group it joins: accepts connections,
// runs their handshakes (many at once, on one thread) and hands each connection
// that proved it knows `key` to the Connect of the group its hello names, so one
// well-known port serves any number of groups (one per mesh, per axis...). A
// connection that does not complete the handshake within kHelloTimeout, or fails
// it, is closed, logged and counted; one whose group never forms here is dropped
// after kPendingLifetime.
class TcpAcceptor {
 public:
  // `key`: the process's data-port key (DeriveDataPortKey of the cluster's
  // token); every group joined through this acceptor uses it, both ways.
  static Result<std::unique_ptr<TcpAcceptor>> Start(std::unique_ptr<TcpListener> listener,
                                                    const DataPortKey& key);
  ~TcpAcceptor();
  TcpAcceptor(const TcpAcceptor&) = delete;
  TcpAcceptor& operator=(const TcpAcceptor&) = delete;

  const std::string& address() const { return listener_->address(); }
  int port() const { return listener_->port(); }

  // Connections this acceptor refused (see RefusedConnections).
  uint64_t refused() const { return refused_.load(); }

  static constexpr std::chrono::seconds kPendingLifetime{60};
  // From a connection's arrival to its proof: a hello and a proof are a few bytes
  // sent at once; a client that is slower than this is not a peer.
  static constexpr std::chrono::seconds kHelloTimeout{2};
  // Connections in the middle of their handshake at once; more are refused.
  static constexpr size_t kMaxHandshakes = 256;

 private:
  friend class TcpTransport;
  struct Pending;
  TcpAcceptor(std::unique_ptr<TcpListener> listener, const DataPortKey& key, int stop_fd);
  void AcceptLoop();
  // The oldest live connection for `group_id`, waiting until `deadline`; null on timeout.
  std::unique_ptr<Pending> Take(const std::string& group_id,
                                std::chrono::steady_clock::time_point deadline);

  std::unique_ptr<TcpListener> listener_;
  const DataPortKey key_;
  int stop_fd_;
  std::atomic<uint64_t> refused_{0};
  Mutex mu_;
  CondVar cv_;
  std::multimap<std::string, std::unique_ptr<Pending>> pending_ GUARDED_BY(mu_);  // by group
  std::thread thread_;
};

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

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(peers_.size()); }
  Status Send(int peer, std::span<const ConstBytes> parts, Deadline deadline) override;
  using Transport::Send;
  Status Recv(int peer, Buffer* message, Deadline deadline) override;
  void Abort(const Status& reason) override;
  void Close() override;
  Status status() const override { return mailbox_.status(); }

 private:
  struct Peer;
  using FrameKind = wire::FrameKind;

  TcpTransport(int rank, std::string group_id, std::vector<std::unique_ptr<Peer>> peers);
  template <typename AcceptFn>
  static Result<std::unique_ptr<TcpTransport>> Join(const std::vector<std::string>& addresses,
                                                    const TcpOptions& options, AcceptFn accept);
  Status SendFrame(int peer, FrameKind kind, std::span<const ConstBytes> parts, Deadline deadline);
  void ReceiveLoop();
  // Reads what `peer` has sent so far; false once its connection is finished.
  bool ReadFrom(int peer);
  bool FinishFrame(int peer);
  void PeerLost(int peer, const std::string& why);

  const int rank_;
  const std::string group_id_;
  std::vector<std::unique_ptr<Peer>> peers_;  // by rank; own entry has no connection
  Mailbox mailbox_;
  int stop_fd_ = -1;  // eventfd: readable once Close starts; wakes the receiver and senders
  std::atomic<bool> closed_{false};
  std::atomic<bool> abort_sent_{false};
  std::thread receiver_;
};

}  // namespace tessera::collectives
