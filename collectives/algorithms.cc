#include "collectives/algorithms.h"

#include <algorithm>
#include <utility>

#include "collectives/core_ranks.h"

namespace tessera::collectives {
namespace {

int Mod(int a, int n) { return ((a % n) + n) % n; }

// Chunk `c` of `block`, cut every `chunk_elems` elements (empty past its end).
Range ChunkOf(const Range& block, size_t c, size_t chunk_elems) {
  const size_t begin = std::min(block.count, c * chunk_elems);
  const size_t end = std::min(block.count, begin + chunk_elems);
  return {block.offset + begin, end - begin};
}

// Chunks per ring step: enough for the largest block, so every rank agrees.
size_t ChunkCount(std::span<const Range> blocks, size_t chunk_elems) {
  size_t largest = 0;
  for (const Range& b : blocks) largest = std::max(largest, b.count);
  return std::max<size_t>(1, (largest + chunk_elems - 1) / chunk_elems);
}

// Withdraws, when the scope ends, what a function posted from `peers` (a no-op
// once its RecvInto came): an error on the way must not leave a transport
// writing into the caller's memory.
struct CancelOnExit {
  CancelOnExit(Call& call, int peer) : call(call), peers{peer} {}
  CancelOnExit(Call& call, std::vector<int> peers) : call(call), peers(std::move(peers)) {}
  ~CancelOnExit() {
    for (int peer : peers) call.CancelRecv(peer);
  }
  Call& call;
  std::vector<int> peers;
};

// One ring step: sends `send_block` to the right neighbour and receives
// `recv_block` from the left, one chunk at a time; `receive(range)` takes each
// chunk in (Call::Recv and reduce, or Call::RecvInto its place). While this
// rank handles chunk c, the peer's next chunk is already in the socket. (Sending
// further ahead was measured slower on 2 oversubscribed cores: the kernel
// copies then compete with the reduction.)
template <typename Prepare, typename Receive>
Status RingStep(Call& call, uint8_t* data, size_t elem_size, const Range& send_block,
                const Range& recv_block, size_t chunks, size_t chunk_elems, Prepare prepare,
                Receive receive) {
  const int n = call.size(), me = call.rank();
  const int right = Mod(me + 1, n);
  for (size_t c = 0; c < chunks; ++c) {
    const Range out = ChunkOf(send_block, c, chunk_elems);
    const Range in = ChunkOf(recv_block, c, chunk_elems);
    prepare(in);
    RETURN_IF_ERROR(
        call.Send(right, ConstBytes(data + out.offset * elem_size, out.count * elem_size)));
    RETURN_IF_ERROR(receive(in));
  }
  return Status::Ok();
}

}  // namespace

size_t FitSegments(size_t chunk_bytes, size_t elem_size) {
  constexpr size_t kUnit = 64 << 10, kRoom = 256;
  const size_t units = chunk_bytes / kUnit;
  if (units == 0) return chunk_bytes;
  const size_t fitted = std::min(chunk_bytes, units * (kUnit - kRoom));
  return std::max(elem_size, fitted / elem_size * elem_size);
}

std::vector<Range> SplitEven(size_t count, int parts) {
  std::vector<Range> ranges(parts);
  const size_t base = count / parts, extra = count % parts;
  size_t offset = 0;
  for (int i = 0; i < parts; ++i) {
    ranges[i] = {offset, base + (static_cast<size_t>(i) < extra ? 1 : 0)};
    offset += ranges[i].count;
  }
  return ranges;
}

void ReduceInRankOrder(ReduceOp op, DType dtype, std::span<const ConstBytes> inputs, size_t offset,
                       size_t count, uint8_t* out) {
  const size_t es = DTypeSize(dtype), at = offset * es, bytes = count * es;
  // Accumulate apart from `out`, which may be one of the inputs still to be read.
  Buffer acc(bytes);
  CopyBytes(acc.data(), inputs[0].data() + at, bytes);
  for (size_t i = 1; i < inputs.size(); ++i) {
    ReduceElements(op, dtype, acc.data(), inputs[i].data() + at, acc.data(), count);
  }
  CopyBytes(out, acc.data(), bytes);
}

namespace {

Status FoldIn(Call& call, const CoreRanks& core, ReduceOp op, DType dtype, uint8_t* data,
              size_t count, Buffer& scratch) {
  const int me = call.rank();
  if (me >= 2 * core.folded) return Status::Ok();
  const size_t bytes = count * DTypeSize(dtype);
  if (core.rank < 0) return call.Send(me + 1, ConstBytes(data, bytes));
  RETURN_IF_ERROR(call.Recv(me - 1, &scratch, bytes));
  ReduceElements(op, dtype, scratch.data(), data, data, count);
  return Status::Ok();
}

Status FoldOut(Call& call, const CoreRanks& core, uint8_t* data, size_t bytes) {
  const int me = call.rank();
  if (me >= 2 * core.folded) return Status::Ok();
  if (core.rank < 0) return call.RecvInto(me + 1, {data, bytes});
  return call.Send(me - 1, ConstBytes(data, bytes));
}

// Combines `theirs` from `partner` into `mine` so that both partners hold the
// same bits: lower rank ⊕ higher rank.
void Combine(ReduceOp op, DType dtype, int me, int partner, const uint8_t* theirs, uint8_t* mine,
             size_t count) {
  if (partner < me) {
    ReduceElements(op, dtype, theirs, mine, mine, count);
  } else {
    ReduceElements(op, dtype, mine, theirs, mine, count);
  }
}

}  // namespace

Status RecursiveDoublingAllReduce(Call& call, ReduceOp op, DType dtype, uint8_t* data,
                                  size_t count) {
  const int me = call.rank();
  const size_t bytes = count * DTypeSize(dtype);
  const CoreRanks core(call.size(), me);
  Buffer theirs;
  RETURN_IF_ERROR(FoldIn(call, core, op, dtype, data, count, theirs));
  if (core.rank >= 0) {
    for (int mask = 1; mask < core.p; mask <<= 1) {
      const int partner = core.Member(core.rank ^ mask);
      RETURN_IF_ERROR(call.Send(partner, ConstBytes(data, bytes)));
      RETURN_IF_ERROR(call.Recv(partner, &theirs, bytes));
      Combine(op, dtype, me, partner, theirs.data(), data, count);
    }
  }
  return FoldOut(call, core, data, bytes);
}

Status HalvingDoublingAllReduce(Call& call, ReduceOp op, DType dtype, uint8_t* data, size_t count,
                                size_t chunk_elems) {
  const int me = call.rank();
  const size_t es = DTypeSize(dtype);
  const CoreRanks core(call.size(), me);
  Buffer theirs;
  RETURN_IF_ERROR(FoldIn(call, core, op, dtype, data, count, theirs));
  if (core.rank >= 0) {
    // Reduce-scatter by recursive halving: at each level keep one half of the
    // range, send the other to the partner and add in the partner's copy of the
    // kept half. levels[i] = (kept, sent) at level i.
    std::vector<std::pair<Range, Range>> levels;
    Range range{0, count};
    for (int mask = core.p / 2; mask >= 1; mask >>= 1) {
      const int partner = core.Member(core.rank ^ mask);
      const Range low{range.offset, range.count / 2};
      const Range high{range.offset + low.count, range.count - low.count};
      const bool keep_low = (core.rank & mask) == 0;
      const Range kept = keep_low ? low : high, sent = keep_low ? high : low;
      const size_t chunks = std::max<size_t>(
          1, (std::max(kept.count, sent.count) + chunk_elems - 1) / chunk_elems);
      for (size_t c = 0; c < chunks; ++c) {
        const Range out = ChunkOf(sent, c, chunk_elems), in = ChunkOf(kept, c, chunk_elems);
        RETURN_IF_ERROR(call.Send(partner, ConstBytes(data + out.offset * es, out.count * es)));
        RETURN_IF_ERROR(call.Recv(partner, &theirs, in.count * es));
        Combine(op, dtype, me, partner, theirs.data(), data + in.offset * es, in.count);
      }
      levels.emplace_back(kept, sent);
      range = kept;
    }
    // All-gather by recursive doubling, the levels in reverse: send what this
    // rank holds, receive the partner's half in its place.
    for (int mask = 1, level = static_cast<int>(levels.size()) - 1; mask < core.p;
         mask <<= 1, --level) {
      const int partner = core.Member(core.rank ^ mask);
      const auto& [kept, sent] = levels[level];
      const size_t chunks = std::max<size_t>(
          1, (std::max(kept.count, sent.count) + chunk_elems - 1) / chunk_elems);
      CancelOnExit cancel{call, partner};
      for (size_t c = 0; c < chunks; ++c) {
        const Range out = ChunkOf(kept, c, chunk_elems), in = ChunkOf(sent, c, chunk_elems);
        const std::span<uint8_t> place(data + in.offset * es, in.count * es);
        call.PostRecv(partner, place);
        RETURN_IF_ERROR(call.Send(partner, ConstBytes(data + out.offset * es, out.count * es)));
        RETURN_IF_ERROR(call.RecvInto(partner, place));
      }
    }
  }
  return FoldOut(call, core, data, count * es);
}

Status RingReduceScatter(Call& call, ReduceOp op, DType dtype, uint8_t* data,
                         std::span<const Range> blocks, size_t chunk_elems) {
  const int n = call.size(), me = call.rank();
  if (n == 1) return Status::Ok();
  const int left = Mod(me - 1, n);
  const size_t es = DTypeSize(dtype), chunks = ChunkCount(blocks, chunk_elems);
  Buffer incoming;
  // Block b starts at rank b+1 and travels right, picking up one contribution per
  // hop, until it reaches rank b after n-1 steps.
  for (int step = 0; step < n - 1; ++step) {
    RETURN_IF_ERROR(RingStep(call, data, es, blocks[Mod(me - step - 1, n)],
                             blocks[Mod(me - step - 2, n)], chunks, chunk_elems,
                             [](const Range&) {}, [&](const Range& in) -> Status {
                               RETURN_IF_ERROR(call.Recv(left, &incoming, in.count * es));
                               uint8_t* dst = data + in.offset * es;
                               ReduceElements(op, dtype, incoming.data(), dst, dst, in.count);
                               return Status::Ok();
                             }));
  }
  return Status::Ok();
}

Status RingAllGather(Call& call, size_t elem_size, uint8_t* data, std::span<const Range> blocks,
                     size_t chunk_elems) {
  const int n = call.size(), me = call.rank();
  if (n == 1) return Status::Ok();
  const int left = Mod(me - 1, n);
  const size_t chunks = ChunkCount(blocks, chunk_elems);
  auto place = [&](const Range& in) {
    return std::span<uint8_t>(data + in.offset * elem_size, in.count * elem_size);
  };
  CancelOnExit cancel{call, left};
  for (int step = 0; step < n - 1; ++step) {
    // Each chunk is posted before this rank sends, so that it lands in place
    // while the send waits for room.
    RETURN_IF_ERROR(RingStep(
        call, data, elem_size, blocks[Mod(me - step, n)], blocks[Mod(me - step - 1, n)], chunks,
        chunk_elems, [&](const Range& in) { call.PostRecv(left, place(in)); },
        [&](const Range& in) { return call.RecvInto(left, place(in)); }));
  }
  return Status::Ok();
}

Status StarBroadcast(Call& call, int root, uint8_t* data, size_t bytes, size_t chunk_bytes) {
  const int n = call.size(), me = call.rank();
  if (n == 1) return Status::Ok();
  const size_t chunks = std::max<size_t>(1, (bytes + chunk_bytes - 1) / chunk_bytes);
  const Range all{0, bytes};
  auto place = [&](size_t c) {
    const Range chunk = ChunkOf(all, c, chunk_bytes);
    return std::span<uint8_t>(data + chunk.offset, chunk.count);
  };
  if (me == root) {
    // Chunk by chunk to every peer in turn, so that all of them receive at once.
    for (size_t c = 0; c < chunks; ++c) {
      for (int i = 1; i < n; ++i) RETURN_IF_ERROR(call.Send(Mod(root + i, n), place(c)));
    }
    return Status::Ok();
  }
  CancelOnExit cancel{call, root};
  call.PostRecv(root, place(0));
  for (size_t c = 0; c < chunks; ++c) {
    RETURN_IF_ERROR(call.RecvInto(root, place(c)));
    if (c + 1 < chunks) call.PostRecv(root, place(c + 1));
  }
  return Status::Ok();
}

Status ScatterBroadcast(Call& call, int root, uint8_t* data, size_t bytes, size_t chunk_bytes) {
  const int n = call.size(), me = call.rank();
  if (n == 1) return Status::Ok();
  // Piece k (0 ≤ k < n-1) is the part of the rank k+1 places after the root.
  const std::vector<Range> pieces = SplitEven(bytes, n - 1);
  const size_t chunks = ChunkCount(pieces, chunk_bytes);
  auto owner = [&](int k) { return Mod(root + 1 + k, n); };
  auto place = [&](int k, size_t c) {
    const Range chunk = ChunkOf(pieces[k], c, chunk_bytes);
    return std::span<uint8_t>(data + chunk.offset, chunk.count);
  };
  if (me == root) {
    // Chunk c of every piece in turn, so that every rank receives at once.
    for (size_t c = 0; c < chunks; ++c) {
      for (int k = 0; k < n - 1; ++k) RETURN_IF_ERROR(call.Send(owner(k), place(k, c)));
    }
    return Status::Ok();
  }
  const int mine = Mod(me - root, n) - 1;
  // Chunks of this rank's piece come from the root, those of piece k from its owner.
  std::vector<int> sources(n - 1);
  for (int k = 0; k < n - 1; ++k) sources[k] = k == mine ? root : owner(k);
  CancelOnExit cancel{call, sources};
  for (int k = 0; k < n - 1; ++k) call.PostRecv(sources[k], place(k, 0));
  auto take = [&](int k, size_t c) -> Status {
    RETURN_IF_ERROR(call.RecvInto(sources[k], place(k, c)));
    if (c + 1 < chunks) call.PostRecv(sources[k], place(k, c + 1));
    return Status::Ok();
  };
  for (size_t c = 0; c < chunks; ++c) {
    // Pass each chunk of this rank's piece on as soon as it is in, then take
    // the same chunk of every other piece.
    RETURN_IF_ERROR(take(mine, c));
    for (int k = 0; k < n - 1; ++k) {
      if (k != mine) RETURN_IF_ERROR(call.Send(owner(k), place(mine, c)));
    }
    for (int k = 0; k < n - 1; ++k) {
      if (k != mine) RETURN_IF_ERROR(take(k, c));
    }
  }
  return Status::Ok();
}

}  // namespace tessera::collectives
