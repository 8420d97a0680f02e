// The connections a data port (TcpAcceptor) holds in the middle of their
// handshake, internal to collectives/transport/tcp/. A hello and a proof are a few
// bytes sent at once, so a peer of the mesh is here for a round trip; strangers
// that connect and say nothing must not keep it out. The table is capped per
// source address and in all, and over a cap a connection already here makes
// room: the oldest that has sent nothing yet, else the oldest. A newcomer is
// never the one turned away. When the table fills past a quarter of its cap, the
// hello deadline of every connection in it tightens.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "api/status.h"
#include "collectives/transport/tcp/tcp_handshake.h"

namespace tessera::collectives::tcp {

struct HandshakeLimits {
  size_t per_source = 128;
  size_t total = 1024;
  std::chrono::milliseconds hello_timeout{2000};
  std::chrono::milliseconds hello_timeout_under_load{250};
};

class HandshakeTable {
 public:
  // A connection turned out to make room, and why.
  struct Dropped {
    std::unique_ptr<ServerHandshake> handshake;
    Status why;
  };

  explicit HandshakeTable(HandshakeLimits limits) : limits_(limits) {}

  // The deadline of a connection arriving now.
  Deadline NewDeadline(Deadline now) const;

  // Holds `h` and returns the connections that made room for it (none while
  // under both caps). Connections from one remote address share its cap.
  std::vector<Dropped> Admit(std::unique_ptr<ServerHandshake> h);

  // Under load (more than a quarter of the total cap), every connection's hello
  // deadline becomes at most hello_timeout_under_load after its arrival.
  void TightenUnderLoad();

  size_t size() const { return entries_.size(); }
  ServerHandshake& at(size_t i) { return *entries_[i].handshake; }
  // Takes the i-th connection out (finished or failed); Compact() closes the gaps.
  std::unique_ptr<ServerHandshake> Take(size_t i);
  void Compact();

 private:
  struct Entry {
    std::unique_ptr<ServerHandshake> handshake;  // null once taken
    std::string source;
  };
  // The index of the connection to drop among those for which `in` holds: the
  // oldest silent one, else the oldest; `skip` (the newcomer) never.
  template <typename Pred>
  size_t Victim(Pred in, size_t skip) const;
  Dropped Drop(size_t i, Status why);

  const HandshakeLimits limits_;
  std::vector<Entry> entries_;  // in order of arrival
  std::unordered_map<std::string, size_t> per_source_;
  size_t live_ = 0;
};

}  // namespace tessera::collectives::tcp
