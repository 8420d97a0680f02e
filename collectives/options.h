// Options shared by every collective (Gloo style: one options struct per call).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tessera::collectives {

// How data moves. Every rank of a call must resolve to the same algorithm and
// chunk size (checked in the opening exchange: a mismatch is an error, not a hang).
enum class Algorithm : uint32_t {
  kAuto = 0,  // by size, with the thresholds below
  // The data rides in the opening header exchange: one round, every rank sends
  // its input to every other rank and reduces all of them in rank order.
  kDirect = 1,
  // All-reduce only: log2(n) rounds of whole-buffer exchanges (other ops use kRing).
  kRecursiveDoubling = 2,
  // Ring reduce-scatter / all-gather: 2(n-1) steps of 1/n of the data,
  // pipelined in chunks. Bandwidth-optimal.
  kRing = 3,
  // All-reduce only: Rabenseifner's reduce-scatter by recursive halving, then
  // all-gather by recursive doubling; the ring's traffic in 2·log2(n) rounds.
  kHalvingDoubling = 4,
  // Broadcast only (other ops use kRing): the root sends to every rank in turn.
  kStar = 5,
  // Broadcast only (other ops use kRing): the root scatters the data, and each
  // rank passes its piece on to all the others.
  kScatter = 6,
};
std::string_view AlgorithmName(Algorithm algorithm);

struct Options {
  // Bounds the whole call. A timeout names the ranks that did not arrive
  // (details.missing_ranks) and poisons the group, as does any failure after the
  // call began talking to its peers.
  std::chrono::milliseconds timeout{30000};
  Algorithm algorithm = Algorithm::kAuto;
  // The defaults below were the fastest with 4 ranks on 2 cores over loopback
  // (bench/RESULTS.md).

  // kAuto: inputs up to this size (per rank) are sent directly (kDirect).
  size_t direct_max_bytes = size_t{16} << 10;
  // kAuto, all-reduce: recursive doubling below this size; at or above it,
  // halving and doubling when the group size is a power of two, else the ring
  // (halving and doubling would move the whole input twice for the ranks
  // beyond the power of two). With 4 ranks on 2 cores, halving and doubling
  // beat the ring at every size from 1 MiB to 64 MiB, by up to 1.5×.
  size_t large_min_bytes = size_t{1} << 20;
  // Broadcast larger than direct_max_bytes: the root sends to every rank itself
  // (a star, chunk by chunk to each in turn) below this size, and by scatter
  // and all-gather at or above it, where the root's n-1 copies would be the
  // bottleneck. With 4 ranks on 2 cores the two took the same time at 1 MiB;
  // at 16 MiB scatter and all-gather took 7.3-10 ms where a pipelined chain
  // took 10-15 ms (8 ranks: 17-19 ms against 23-25 ms).
  size_t scatter_min_bytes = size_t{4} << 20;
  // Ring steps and broadcast chunks move at most this many bytes per message,
  // so that a rank handles one chunk while the next is on the wire. Ring steps
  // over small blocks use smaller chunks (at least 4 per step, of 16 KiB or
  // more). From 64 KiB up, chunks are cut to fill whole TCP segments
  // (FitSegments: 256 KiB becomes 4 × 65280 bytes).
  size_t chunk_bytes = size_t{256} << 10;
};

}  // namespace tessera::collectives
