// One connection of a TcpTransport, shared by its send side (tcp_transport.cc) and
// its receive side (tcp_transport_recv.cc). Internal to collectives/transport/tcp/.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "api/thread_annotations.h"
#include "collectives/transport/tcp/tcp_transport.h"

namespace tessera::collectives {

// Staged reads: a frame header is read with whatever follows it, up to this
// many bytes, so that small frames come many to a recv(2); a payload's rest
// larger than half of it is read straight into its destination.
constexpr size_t kStageBytes = 16 << 10;

struct TcpTransport::Peer {
  int fd = -1;
  std::string address;

  // Not a timed_mutex: gcc 12's ThreadSanitizer does not see its timed locks.
  Mutex send_mu;
  bool stream_broken GUARDED_BY(send_mu) = false;  // a frame was cut short
  // Connected once (TcpTransport::Reach): a connection that ended since stays ended.
  bool ever_connected GUARDED_BY(send_mu) = false;

  // Receive state, touched only by the thread holding the transport's rx_mu_.
  std::unique_ptr<uint8_t[]> stage{new uint8_t[kStageBytes]};
  size_t stage_begin = 0, stage_end = 0;  // the staged bytes not consumed yet
  bool in_payload = false;
  FrameKind kind = FrameKind::kData;
  Buffer payload;
  uint8_t* dst = nullptr;  // where the payload goes: payload.data() or `target`
  size_t length = 0, filled = 0;
  // Set by RecvInto while it waits: the next data frame of this length lands
  // here, and `target_filled` says when it has.
  std::span<uint8_t> target;
  bool target_filled = false;
  bool into_target = false;  // the frame in progress goes to `target`
  bool said_goodbye = false;

  size_t staged() const { return stage_end - stage_begin; }
};

}  // namespace tessera::collectives
