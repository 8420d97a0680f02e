#include "worker/collectives/algorithms.h"

#include <algorithm>

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

// One ring step: sends `send_block` to the right neighbour and receives
// `recv_block` from the left, one chunk at a time; `receive(range)` takes each
// chunk in (Call::Recv and reduce, or Call::RecvInto its place). While this
// rank handles chunk c, the peer's next chunk is already in the socket. (Sending
// further ahead was measured slower on 2 oversubscribed cores: the kernel
// copies then compete with the reduction.)
template <typename Receive>
Status RingStep(Call& call, uint8_t* data, size_t elem_size, const Range& send_block,
                const Range& recv_block, size_t chunks, size_t chunk_elems, Receive receive) {
  const int n = call.size(), me = call.rank();
  const int right = Mod(me + 1, n);
  for (size_t c = 0; c < chunks; ++c) {
    const Range out = ChunkOf(send_block, c, chunk_elems);
    RETURN_IF_ERROR(
        call.Send(right, ConstBytes(data + out.offset * elem_size, out.count * elem_size)));
    RETURN_IF_ERROR(receive(ChunkOf(recv_block, c, chunk_elems)));
  }
  return Status::Ok();
}

}  // namespace

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

Status RecursiveDoublingAllReduce(Call& call, ReduceOp op, DType dtype, uint8_t* data,
                                  size_t count) {
  const int n = call.size(), me = call.rank();
  const size_t bytes = count * DTypeSize(dtype);
  const ConstBytes mine(data, bytes);
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int folded = n - p;  // ranks [0, 2·folded) pair up around the core exchange
  Buffer theirs;

  int core_rank;  // position among the p ranks of the core exchange; -1 if sitting out
  if (me < 2 * folded) {
    if (me % 2 == 0) {  // hand the data to the odd neighbour, get the result back
      RETURN_IF_ERROR(call.Send(me + 1, mine));
      return call.RecvInto(me + 1, {data, bytes});
    }
    RETURN_IF_ERROR(call.Recv(me - 1, &theirs, bytes));
    ReduceElements(op, dtype, theirs.data(), data, data, count);
    core_rank = me / 2;
  } else {
    core_rank = me - folded;
  }
  for (int mask = 1; mask < p; mask <<= 1) {
    const int partner_core = core_rank ^ mask;
    const int partner = partner_core < folded ? partner_core * 2 + 1 : partner_core + folded;
    RETURN_IF_ERROR(call.Send(partner, mine));
    RETURN_IF_ERROR(call.Recv(partner, &theirs, bytes));
    if (partner < me) {
      ReduceElements(op, dtype, theirs.data(), data, data, count);
    } else {
      ReduceElements(op, dtype, data, theirs.data(), data, count);
    }
  }
  if (me < 2 * folded) RETURN_IF_ERROR(call.Send(me - 1, mine));
  return Status::Ok();
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
                             [&](const Range& in) -> Status {
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
  for (int step = 0; step < n - 1; ++step) {
    RETURN_IF_ERROR(RingStep(call, data, elem_size, blocks[Mod(me - step, n)],
                             blocks[Mod(me - step - 1, n)], chunks, chunk_elems,
                             [&](const Range& in) {
                               return call.RecvInto(
                                   left, {data + in.offset * elem_size, in.count * elem_size});
                             }));
  }
  return Status::Ok();
}

Status ChainBroadcast(Call& call, int root, uint8_t* data, size_t bytes, size_t chunk_bytes) {
  const int n = call.size(), me = call.rank();
  if (n == 1) return Status::Ok();
  const int position = Mod(me - root, n);
  const int next = Mod(me + 1, n), prev = Mod(me - 1, n);
  const size_t chunks = std::max<size_t>(1, (bytes + chunk_bytes - 1) / chunk_bytes);
  const Range all{0, bytes};
  for (size_t c = 0; c < chunks; ++c) {
    const Range chunk = ChunkOf(all, c, chunk_bytes);
    if (position > 0) RETURN_IF_ERROR(call.RecvInto(prev, {data + chunk.offset, chunk.count}));
    if (position < n - 1) {
      RETURN_IF_ERROR(call.Send(next, ConstBytes(data + chunk.offset, chunk.count)));
    }
  }
  return Status::Ok();
}

}  // namespace tessera::collectives
