// A full TCP mesh between the ranks of a group (one connection per pair of ranks).
//
// Joining takes two steps so that port 0 works: every rank binds a TcpListener
// (learning its port), the addresses are exchanged out of band (the control
// plane's KV store, or the parent of forked processes), then every rank calls
// TcpTransport::Connect. Rank i connects to every rank j < i and accepts every
// rank j > i. The connecting side opens with a hello carrying the group id, the
// world size and both ranks; the accepting side checks all of them and answers
// with an acceptance or the reason for a refusal, so a mismatch fails on both
// sides with a message saying what differs.
//
// On the wire every message is a frame: a 16-byte header (magic, kind, length)
// and the payload. Senders write header and payload with one sendmsg (no copy into
// a staging buffer). One background thread per transport polls every connection
// and reads whole frames into per-peer queues, so a Send never waits for the peer
// to call Recv and a ring of blocking sends cannot deadlock. Kinds besides data:
// goodbye (Close), and abort (carries the error that poisoned the sender).
// Byte order is the host's: the mesh is homogeneous.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "worker/collectives/mailbox.h"
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
};

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
// reads their hellos and hands each to the Connect of the group it names, so
// one well-known port serves any number of groups (one per mesh, per axis...).
// A connection whose group never forms here is dropped after kPendingLifetime.
class TcpAcceptor {
 public:
  static Result<std::unique_ptr<TcpAcceptor>> Start(std::unique_ptr<TcpListener> listener);
  ~TcpAcceptor();
  TcpAcceptor(const TcpAcceptor&) = delete;
  TcpAcceptor& operator=(const TcpAcceptor&) = delete;

  const std::string& address() const { return listener_->address(); }
  int port() const { return listener_->port(); }

  static constexpr std::chrono::seconds kPendingLifetime{60};
  static constexpr std::chrono::seconds kHelloTimeout{2};

 private:
  friend class TcpTransport;
  struct Pending;
  TcpAcceptor(std::unique_ptr<TcpListener> listener, int stop_fd);
  void AcceptLoop();
  // The oldest live connection for `group_id`, waiting until `deadline`; null on timeout.
  std::unique_ptr<Pending> Take(const std::string& group_id,
                                std::chrono::steady_clock::time_point deadline);

  std::unique_ptr<TcpListener> listener_;
  int stop_fd_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<std::string, std::unique_ptr<Pending>> pending_;  // GUARDED_BY(mu_) by group
  std::thread thread_;
};

class TcpTransport final : public Transport {
 public:
  // Joins the mesh as options.rank; addresses[j] is rank j's listener address
  // (this rank's own entry is not used), optionally prefixed "name@" to name the
  // peer in messages ("w-b@10.0.0.2:7071"). The listener is closed once every
  // higher rank has connected.
  // Errors: invalid_argument for bad options or a peer that does not match
  // (group id, world size, ranks), naming both sides' values; deadline_exceeded
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
  enum class FrameKind : uint32_t { kData = 1, kGoodbye = 2, kAbort = 3 };

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
