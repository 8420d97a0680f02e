// Internal to the collectives library: the data movement of each algorithm, run
// after the call's Exchange. Every function REQUIRES that all ranks pass the same
// sizes, op and dtype (the Exchange checked that) and keeps results bit-identical
// across ranks: each output element is combined in one fixed order, the same
// on every rank, then copied.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "api/dtype.h"
#include "collectives/call.h"
#include "collectives/reduce.h"

namespace tessera::collectives {

// A run of elements [offset, offset + count).
struct Range {
  size_t offset = 0;
  size_t count = 0;
};

// The size of chunks of nominally `chunk_bytes`, elements of `elem_size`. A
// chunk travels as one message: a 16-byte frame header, then the chunk. TCP
// cuts it into segments of at most 65483 bytes on loopback (64 KiB less the IP
// and TCP headers), and a segment costs the kernel about as much whether it is
// full or not: 64 KiB chunks spilled 69 bytes into a segment of their own, so
// a 1 MiB all-reduce sent 40% more segments than it needed. From 64 KiB up a
// chunk is cut to whole 64 KiB units less 256 bytes each, which leaves room for
// the headers; smaller chunks stay as they are.
size_t FitSegments(size_t chunk_bytes, size_t elem_size);

// `count` elements cut into `parts` contiguous ranges; the first count % parts
// ranges are one element longer.
std::vector<Range> SplitEven(size_t count, int parts);

// out = inputs[0] ⊕ inputs[1] ⊕ ... in rank order, over `count` elements starting
// `offset` elements into each input. `out` may be one of the inputs.
void ReduceInRankOrder(ReduceOp op, DType dtype, std::span<const ConstBytes> inputs, size_t offset,
                       size_t count, uint8_t* out);

// All-reduce by recursive doubling: log2(p) rounds of whole-buffer exchanges,
// where p is the largest power of two ≤ n. The first 2(n-p) ranks pair up first
// (odd folds in its even neighbour) and get the result back at the end. Partners
// always combine lower rank ⊕ higher rank, so both hold the same bits.
Status RecursiveDoublingAllReduce(Call& call, ReduceOp op, DType dtype, uint8_t* data,
                                  size_t count);

// All-reduce by recursive halving and doubling (Rabenseifner): a reduce-scatter
// in log2(p) exchanges of halves, then an all-gather retracing them, so each
// rank moves 2(p-1)/p of the data in 2·log2(p) rounds (the ring needs 2(p-1)).
// Ranks beyond p fold in and out as in recursive doubling. Exchanges are cut
// into chunks of `chunk_elems`.
Status HalvingDoublingAllReduce(Call& call, ReduceOp op, DType dtype, uint8_t* data, size_t count,
                                size_t chunk_elems);

// Ring reduce-scatter over `blocks` (one per rank): afterwards block r of rank r
// holds the reduction of every rank's block r. Each step sends one block to the
// right neighbour and reduces one from the left, chunk by chunk.
Status RingReduceScatter(Call& call, ReduceOp op, DType dtype, uint8_t* data,
                         std::span<const Range> blocks, size_t chunk_elems);

// Ring all-gather: block r of rank r (elements of `elem_size` bytes) ends up on
// every rank.
Status RingAllGather(Call& call, size_t elem_size, uint8_t* data, std::span<const Range> blocks,
                     size_t chunk_elems);

// Broadcast from `root` straight to every other rank, chunk by chunk to each in
// turn (Gloo's BroadcastOneToAll): the root sends n-1 copies, no rank forwards.
Status StarBroadcast(Call& call, int root, uint8_t* data, size_t bytes, size_t chunk_bytes);

// Broadcast by scatter and all-gather: the root sends each other rank one
// (n-1)th of the data, and each of them passes its piece on to the n-2 others,
// chunk by chunk as the pieces come in. Every rank but the root receives the
// whole once and sends (n-2)/(n-1) of it, so the root's n-1 copies of a star
// are spread over all ranks, with no pipeline to fill as along a chain.
Status ScatterBroadcast(Call& call, int root, uint8_t* data, size_t bytes, size_t chunk_bytes);

}  // namespace tessera::collectives
