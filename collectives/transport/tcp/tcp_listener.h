// The listening side of the TCP transport: a TcpListener (one group's own port) and
// a TcpAcceptor (the process's data port, shared by every group it joins), which
// admit only connections that prove they know the group's key (tcp_handshake.h).
// See tcp_transport.h for how a group joins.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "api/status.h"
#include "api/thread_annotations.h"
#include "collectives/transport/tcp/auth.h"

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
  // How long a thread waiting on the transport polls without blocking (yielding
  // the CPU between polls) before it sleeps in poll(2). A message that comes
  // within it costs no wake-up. In calls bound by latency
  // (Transport::SetLatencyBound) the spin ends early once a yield ran another
  // thread (the CPU is shared; TcpTransport::wait_stats counts it), so there
  // the full spin is only spent on a core of its own.
  std::chrono::microseconds spin{50};
  // Connect joins the full mesh (every pair of ranks connected). false: Connect
  // connects to no one and the ranks connect pair by pair as they need to
  // (TcpTransport::Reach), so that a large group whose ranks each talk to a few
  // others holds a few connections per rank instead of one per rank.
  bool connect_all = true;
};

// Connections that a data port (TcpAcceptor) or a listener of this process
// refused since it started: they failed the handshake (no proof, a wrong one, a
// stranger's bytes, another protocol version, too slow).
uint64_t RefusedConnections();

// Connection attempts to a peer that did not listen yet (or dropped the
// connection unanswered) and were tried again, in this process since it started.
uint64_t ConnectRetries();

class TcpAcceptor;
class TcpTransport;

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
// connection that does not complete the handshake within kHelloTimeout (250 ms
// once more than a quarter of kMaxHandshakes are waiting), or fails it, is
// closed, logged and counted; one whose group never forms here is dropped after
// kPendingLifetime. Handshakes are capped per source address and in all; over a
// cap, the oldest connection that has sent nothing (else the oldest) makes room
// for the newcomer, so a flood of silent connections cannot keep peers out.
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
  // Connections in the middle of their handshake now.
  uint64_t handshaking() const { return handshaking_.load(); }

  static constexpr std::chrono::seconds kPendingLifetime{60};
  // From a connection's arrival to its proof: a hello and a proof are a few bytes
  // sent at once; a client that is slower than this is not a peer.
  static constexpr std::chrono::seconds kHelloTimeout{2};
  static constexpr std::chrono::milliseconds kHelloTimeoutUnderLoad{250};
  // Connections in the middle of their handshake at once, in all and from one
  // source address; over either, the oldest makes room (handshake_table.h).
  static constexpr size_t kMaxHandshakes = 1024;
  static constexpr size_t kMaxHandshakesPerSource = 128;
  // Connections accepted between two polls of those already here.
  static constexpr size_t kAcceptBatch = 32;

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
  std::atomic<uint64_t> handshaking_{0};
  Mutex mu_;
  CondVar cv_;
  std::multimap<std::string, std::unique_ptr<Pending>> pending_ GUARDED_BY(mu_);  // by group
  std::thread thread_;
};

}  // namespace tessera::collectives
