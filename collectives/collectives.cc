#include "collectives/collectives.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/call.h"
#include "collectives/engine.h"
#include "collectives/hash.h"

namespace tessera::collectives {
namespace {

// Little fixed-size records at the front of an exchange payload (8-byte slots
// keep the data behind them aligned).
constexpr size_t kSlot = 8;

int64_t ReadI64(const uint8_t* p) {
  int64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

void AppendI64(std::vector<uint8_t>& out, int64_t v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof(v));
}

// Ring steps are cut into at least this many chunks while the chunks stay at
// least kMinChunkBytes, so that a step is pipelined (receive chunk c while the
// left neighbour sends c+1) even when blocks are small: with 4 ranks, a 1 MiB
// all-reduce in one 256 KiB chunk per step was 3.5× slower than in four.
constexpr size_t kChunksPerStep = 4;
constexpr size_t kMinChunkBytes = 16 << 10;

// Elements per chunk of a ring over `blocks`: o.chunk_bytes at most. The same
// on every rank, since it depends only on sizes that the Exchange checked.
size_t ChunkElems(const Options& o, size_t elem_size, std::span<const Range> blocks) {
  size_t largest = 0;
  for (const Range& b : blocks) largest = std::max(largest, b.count);
  const size_t cap = std::max<size_t>(1, o.chunk_bytes / elem_size);
  const size_t floor = std::max<size_t>(1, kMinChunkBytes / elem_size);
  const size_t piped = (largest + kChunksPerStep - 1) / kChunksPerStep;
  return FitSegments(std::min(cap, std::max(floor, piped)) * elem_size, elem_size) / elem_size;
}

Algorithm ResolveAllReduce(const Options& o, size_t bytes, int n) {
  if (o.algorithm != Algorithm::kAuto) return o.algorithm;
  if (n == 1 || bytes <= o.direct_max_bytes) return Algorithm::kDirect;
  if (bytes < o.large_min_bytes) return Algorithm::kRecursiveDoubling;
  return (n & (n - 1)) == 0 ? Algorithm::kHalvingDoubling : Algorithm::kRing;
}

// Whether a rank puts its data into the opening exchange (ops other than all-reduce).
bool Inline(const Options& o, size_t bytes) {
  return o.algorithm == Algorithm::kDirect ||
         (o.algorithm == Algorithm::kAuto && bytes <= o.direct_max_bytes);
}

// The plan of ops whose data phase is decided by per-rank flags in the payload.
Plan FlagPlan(const Options& o) { return {o.algorithm, o.chunk_bytes}; }

// How a broadcast of `bytes` moves: in the opening exchange, by star or by
// scatter. Every rank resolves it and the exchange compares the plans, so
// ranks with different options fail naming them instead of running two
// different data phases against each other.
Algorithm ResolveBroadcast(const Options& o, size_t bytes) {
  if (o.algorithm == Algorithm::kStar || o.algorithm == Algorithm::kScatter) return o.algorithm;
  if (Inline(o, bytes)) return Algorithm::kDirect;
  return bytes < o.scatter_min_bytes ? Algorithm::kStar : Algorithm::kScatter;
}

Status CheckPayload(Call& call, int peer, ConstBytes payload, size_t expected) {
  if (payload.size() == expected) return Status::Ok();
  return call.Fail(Internal("protocol error: rank " + std::to_string(peer) + " sent " +
                            std::to_string(payload.size()) + " payload bytes, expected " +
                            std::to_string(expected)));
}

}  // namespace

Status AllReduceAccum(Call& call, ReduceOp op, DType dtype, uint8_t* data, size_t count,
                      const Options& o) {
  const int n = call.size();
  const size_t es = DTypeSize(dtype), bytes = count * es;
  const Algorithm algorithm = ResolveAllReduce(o, bytes, n);
  call.SetLatencyBound(algorithm == Algorithm::kDirect);
  if (algorithm == Algorithm::kDirect) {
    ASSIGN_OR_RETURN(auto inputs, call.Exchange({algorithm, 0}, ConstBytes(data, bytes)));
    for (int r = 0; r < n; ++r) RETURN_IF_ERROR(CheckPayload(call, r, inputs[r], bytes));
    if (n > 1) ReduceInRankOrder(op, dtype, inputs, 0, count, data);
    return Status::Ok();
  }
  if (algorithm == Algorithm::kRecursiveDoubling) {
    RETURN_IF_ERROR(call.Exchange({algorithm, 0}).status());
    return RecursiveDoublingAllReduce(call, op, dtype, data, count);
  }
  RETURN_IF_ERROR(call.Exchange({algorithm, o.chunk_bytes}).status());
  const std::vector<Range> blocks = SplitEven(count, n);
  if (algorithm == Algorithm::kHalvingDoubling) {
    return HalvingDoublingAllReduce(call, op, dtype, data, count, ChunkElems(o, es, blocks));
  }
  RETURN_IF_ERROR(RingReduceScatter(call, op, dtype, data, blocks, ChunkElems(o, es, blocks)));
  return RingAllGather(call, es, data, blocks, ChunkElems(o, es, blocks));
}

Status FinishReduce(ReduceOp op, DType dtype, uint8_t* accum, size_t count, int64_t contributions,
                    bool check_inf_nan, uint8_t* out, const std::string& what) {
  const DType accum_dtype = AccumDType(dtype);
  if (op == ReduceOp::kMean) DivideElements(accum_dtype, accum, count, contributions);
  if (out != accum) FromAccum(dtype, accum, count, out);
  if (!check_inf_nan) return Status::Ok();
  const NonFinite found = CountNonFinite(dtype, out, count);
  if (!found.any()) return Status::Ok();
  return InvalidArgument(
      what + ": the result has " + std::to_string(found.nan) + " NaN and " +
          std::to_string(found.inf) + " infinite values (first at element " +
          std::to_string(found.first_index) + ")",
      {{"nan_count", found.nan}, {"inf_count", found.inf}, {"first_index", found.first_index}});
}

Status AllReduce(Group& group, Tensor& tensor, const AllReduceOptions& o) {
  RETURN_IF_ERROR(tensor.Validate("all_reduce input"));
  RETURN_IF_ERROR(CheckReducible(tensor.dtype, o.op));
  const size_t count = static_cast<size_t>(tensor.num_elements());
  const DType accum_dtype = AccumDType(tensor.dtype);
  std::vector<uint8_t> converted;
  uint8_t* accum = tensor.data.data();
  if (accum_dtype != tensor.dtype) {
    converted.resize(count * DTypeSize(accum_dtype));
    ToAccum(tensor.dtype, tensor.data.data(), count, converted.data());
    accum = converted.data();
  }
  Session session(group, o.timeout);
  ASSIGN_OR_RETURN(Call call,
                   session.Begin({"all_reduce", DescribeType(tensor.dtype, tensor.shape) + ", " +
                                                    std::string(ReduceOpName(o.op))}));
  RETURN_IF_ERROR(AllReduceAccum(call, o.op, accum_dtype, accum, count, o));
  return FinishReduce(o.op, tensor.dtype, accum, count, group.size(), o.check_inf_nan,
                      tensor.data.data(), call.description());
}

Status GatherTensor(Session& session, const Tensor& input, Tensor& output, bool tiled,
                    const Options& o, std::string_view op) {
  const int n = session.group().size(), me = session.group().rank();
  const bool stacked = !tiled || input.shape.empty();
  // Gathered along axis 0 in "rows": the whole input when stacking.
  const Shape row_shape = stacked ? input.shape : Shape(input.shape.begin() + 1, input.shape.end());
  const size_t row_bytes = static_cast<size_t>(NumElements(row_shape)) * DTypeSize(input.dtype);
  const int64_t my_rows = stacked ? 1 : input.shape[0];
  std::string args = stacked ? DescribeType(input.dtype, input.shape) + ", stacked"
                             : std::string(DTypeName(input.dtype)) + "[?" +
                                   (row_shape.empty() ? "" : "," + ShapeToString(row_shape)) +
                                   "], tiled";
  ASSIGN_OR_RETURN(Call call, session.Begin({std::string(op), std::move(args)}));

  // Payload: [rows][inlined?][data if inlined].
  const bool inlined = Inline(o, input.data.size());
  call.SetLatencyBound(inlined);
  std::vector<uint8_t> payload;
  AppendI64(payload, my_rows);
  AppendI64(payload, inlined ? 1 : 0);
  if (inlined) payload.insert(payload.end(), input.data.begin(), input.data.end());
  ASSIGN_OR_RETURN(auto payloads, call.Exchange(FlagPlan(o), payload));

  std::vector<int64_t> rows(n);
  bool all_inlined = true;
  int64_t total_rows = 0, max_rows = 0;
  for (int r = 0; r < n; ++r) {
    if (payloads[r].size() < 2 * kSlot) return CheckPayload(call, r, payloads[r], 2 * kSlot);
    rows[r] = ReadI64(payloads[r].data());
    const bool their_inline = ReadI64(payloads[r].data() + kSlot) != 0;
    if (rows[r] < 0 || rows[r] > kMaxElements) {
      return call.Fail(Internal("protocol error: rank " + std::to_string(r) + " sent " +
                                std::to_string(rows[r]) + " rows"));
    }
    const size_t expected =
        2 * kSlot + (their_inline ? static_cast<size_t>(rows[r]) * row_bytes : 0);
    RETURN_IF_ERROR(CheckPayload(call, r, payloads[r], expected));
    all_inlined = all_inlined && their_inline;
    total_rows += rows[r];
    max_rows = std::max(max_rows, rows[r]);
  }
  output.dtype = input.dtype;
  output.shape = stacked ? Shape{n} : Shape{total_rows};
  output.shape.insert(output.shape.end(), row_shape.begin(), row_shape.end());
  if (all_inlined) {
    output.data.resize(static_cast<size_t>(total_rows) * row_bytes);
    size_t at = 0;
    for (int r = 0; r < n; ++r) {
      CopyBytes(output.data.data() + at, payloads[r].data() + 2 * kSlot,
                payloads[r].size() - 2 * kSlot);
      at += payloads[r].size() - 2 * kSlot;
    }
    return Status::Ok();
  }
  // The ring moves equal blocks: pad every rank's rows to the longest, then close
  // the gaps (moving left, so in place).
  const size_t block = static_cast<size_t>(max_rows) * row_bytes;
  output.data.resize(block * n);
  CopyBytes(output.data.data() + block * me, input.data.data(), input.data.size());
  const std::vector<Range> blocks = SplitEven(block * n, n);
  RETURN_IF_ERROR(
      RingAllGather(call, 1, output.data.data(), blocks, ChunkElems(o, 1, blocks)));
  if (total_rows != max_rows * n) {
    size_t at = 0;
    for (int r = 0; r < n; ++r) {
      const size_t bytes = static_cast<size_t>(rows[r]) * row_bytes;
      if (bytes > 0) std::memmove(output.data.data() + at, output.data.data() + block * r, bytes);
      at += bytes;
    }
    output.data.resize(at);
  }
  return Status::Ok();
}

Status AllGatherInto(Group& group, const Tensor& input, Tensor& output, const AllGatherOptions& o) {
  RETURN_IF_ERROR(input.Validate("all_gather input"));
  if (&input == &output) return InvalidArgument("all_gather: output must not be the input");
  Session session(group, o.timeout);
  return GatherTensor(session, input, output, o.tiled, o, "all_gather");
}

Result<Tensor> AllGather(Group& group, const Tensor& input, const AllGatherOptions& o) {
  Tensor output;
  RETURN_IF_ERROR(AllGatherInto(group, input, output, o));
  return output;
}

Result<Tensor> ReduceScatter(Group& group, const Tensor& input, const ReduceScatterOptions& o) {
  RETURN_IF_ERROR(input.Validate("reduce_scatter input"));
  RETURN_IF_ERROR(CheckReducible(input.dtype, o.op));
  const int n = group.size(), me = group.rank();
  if (input.shape.empty() || input.shape[0] % n != 0) {
    return InvalidArgument("reduce_scatter needs a first dimension divisible by the group size " +
                               std::to_string(n) + ", got " +
                               DescribeType(input.dtype, input.shape),
                           {{"field", "shape"}});
  }
  const DType accum_dtype = AccumDType(input.dtype);
  const size_t count = static_cast<size_t>(input.num_elements());
  const size_t es = DTypeSize(accum_dtype);
  std::vector<uint8_t> work(count * es);
  ToAccum(input.dtype, input.data.data(), count, work.data());
  const std::vector<Range> blocks = SplitEven(count, n);

  Session session(group, o.timeout);
  ASSIGN_OR_RETURN(Call call,
                   session.Begin({"reduce_scatter", DescribeType(input.dtype, input.shape) + ", " +
                                                        std::string(ReduceOpName(o.op))}));
  const Range mine = blocks[me];
  call.SetLatencyBound(Inline(o, work.size()));
  if (Inline(o, work.size())) {
    ASSIGN_OR_RETURN(auto inputs, call.Exchange({Algorithm::kDirect, 0}, work));
    for (int r = 0; r < n; ++r) RETURN_IF_ERROR(CheckPayload(call, r, inputs[r], work.size()));
    ReduceInRankOrder(o.op, accum_dtype, inputs, mine.offset, mine.count,
                      work.data() + mine.offset * es);
  } else {
    RETURN_IF_ERROR(call.Exchange({Algorithm::kRing, o.chunk_bytes}).status());
    RETURN_IF_ERROR(
        RingReduceScatter(call, o.op, accum_dtype, work.data(), blocks, ChunkElems(o, es, blocks)));
  }
  Shape shape = input.shape;
  shape[0] /= n;
  Tensor output = Tensor::Zeros(input.dtype, std::move(shape));
  RETURN_IF_ERROR(FinishReduce(o.op, input.dtype, work.data() + mine.offset * es, mine.count, n,
                               false, output.data.data(), call.description()));
  return output;
}

Status Broadcast(Group& group, Tensor& tensor, const BroadcastOptions& o) {
  const int n = group.size(), me = group.rank();
  if (o.root < 0 || o.root >= n) {
    return InvalidArgument("broadcast root " + std::to_string(o.root) +
                               " is not a rank of a group of " + std::to_string(n),
                           {{"field", "root"}});
  }
  if (me == o.root) {
    RETURN_IF_ERROR(tensor.Validate("broadcast input"));
  } else {
    RETURN_IF_ERROR(CheckShapeSize(tensor.shape, "broadcast shape"));
    tensor.data.resize(tensor.num_bytes());
  }
  Session session(group, o.timeout);
  ASSIGN_OR_RETURN(Call call, session.Begin({"broadcast", DescribeType(tensor.dtype, tensor.shape) +
                                                              ", root=" + std::to_string(o.root)}));
  // Payload: [inlined?][data if inlined], from the root only.
  const Algorithm algorithm = ResolveBroadcast(o, tensor.data.size());
  const bool inlined = me == o.root && algorithm == Algorithm::kDirect;
  call.SetLatencyBound(algorithm == Algorithm::kDirect);
  std::vector<uint8_t> payload;
  AppendI64(payload, inlined ? 1 : 0);
  if (inlined) payload.insert(payload.end(), tensor.data.begin(), tensor.data.end());
  ASSIGN_OR_RETURN(auto payloads, call.Exchange({algorithm, o.chunk_bytes}, payload));
  const ConstBytes from_root = payloads[o.root];
  if (from_root.size() < kSlot) return CheckPayload(call, o.root, from_root, kSlot);
  if (ReadI64(from_root.data()) != 0) {
    RETURN_IF_ERROR(CheckPayload(call, o.root, from_root, kSlot + tensor.data.size()));
    if (me != o.root) CopyBytes(tensor.data.data(), from_root.data() + kSlot, tensor.data.size());
    return Status::Ok();
  }
  const size_t chunk = FitSegments(o.chunk_bytes, 1);
  if (algorithm != Algorithm::kScatter) {
    return StarBroadcast(call, o.root, tensor.data.data(), tensor.data.size(), chunk);
  }
  return ScatterBroadcast(call, o.root, tensor.data.data(), tensor.data.size(), chunk);
}

Status Barrier(Group& group, const BarrierOptions& o) {
  if (o.local_devices < 0) {
    return InvalidArgument("barrier: local_devices must be ≥ 0", {{"field", "local_devices"}});
  }
  const int64_t expected = o.mesh_size >= 0 ? o.mesh_size : group.size() * o.local_devices;
  Session session(group, o.timeout);
  std::string args = "mesh_size=" + std::to_string(expected);
  if (!o.name.empty()) args = "'" + o.name + "', " + args;
  ASSIGN_OR_RETURN(Call call, session.Begin({"barrier", std::move(args)}));
  int64_t devices = o.local_devices;
  RETURN_IF_ERROR(AllReduceAccum(call, ReduceOp::kSum, DType::kInt64,
                                 reinterpret_cast<uint8_t*>(&devices), 1, o));
  if (devices != expected) {
    return Conflict(call.description() + ": wrong mesh size: the barrier counted " +
                        std::to_string(devices) + " devices, the mesh has " +
                        std::to_string(expected),
                    {{"expected", expected}, {"actual", devices}});
  }
  return Status::Ok();
}

Status AssertEqual(Group& group, const Tensor& value, std::string_view message, const Options& o) {
  RETURN_IF_ERROR(value.Validate("assert_equal value"));
  const int n = group.size();
  // Digest: [dtype][rank of shape][dims...][128-bit hash of the bytes].
  std::vector<uint8_t> digest;
  AppendI64(digest, static_cast<int64_t>(value.dtype));
  AppendI64(digest, static_cast<int64_t>(value.shape.size()));
  for (int64_t d : value.shape) AppendI64(digest, d);
  for (uint64_t h : HashBytes(value.data)) AppendI64(digest, static_cast<int64_t>(h));

  Session session(group, o.timeout);
  ASSIGN_OR_RETURN(Call call, session.Begin({"assert_equal", ""}));
  call.SetLatencyBound(true);
  ASSIGN_OR_RETURN(auto digests, call.Exchange(FlagPlan(o), digest));
  std::vector<std::string> types(n);  // "float32[3,5]" per rank, for the message
  for (int r = 0; r < n; ++r) {
    const ConstBytes d = digests[r];
    const int64_t dims = d.size() >= 2 * kSlot ? ReadI64(d.data() + kSlot) : -1;
    const int64_t dtype = d.size() >= kSlot ? ReadI64(d.data()) : -1;
    if (dims < 0 || dims > static_cast<int64_t>(kMaxRank) || dtype < 0 ||
        dtype >= static_cast<int64_t>(AllDTypes().size())) {
      return CheckPayload(call, r, d, 0);  // malformed: a protocol error
    }
    RETURN_IF_ERROR(CheckPayload(call, r, d, (4 + static_cast<size_t>(dims)) * kSlot));
    Shape shape(static_cast<size_t>(dims));
    for (size_t i = 0; i < shape.size(); ++i) shape[i] = ReadI64(d.data() + (2 + i) * kSlot);
    types[r] = DescribeType(static_cast<DType>(dtype), shape);
  }
  auto same = [&](int a, int b) {
    return std::equal(digests[a].begin(), digests[a].end(), digests[b].begin(), digests[b].end());
  };
  std::vector<std::vector<int>> classes;  // ranks holding equal values, by first rank
  for (int r = 0; r < n; ++r) {
    auto it = std::find_if(classes.begin(), classes.end(),
                           [&](const std::vector<int>& c) { return same(c.front(), r); });
    if (it == classes.end()) {
      classes.push_back({r});
    } else {
      it->push_back(r);
    }
  }
  if (classes.size() == 1) return Status::Ok();
  std::vector<int> differing;
  std::string described;
  for (const auto& c : classes) {
    if (c.front() != 0) differing.insert(differing.end(), c.begin(), c.end());
    described += (described.empty() ? "" : ", ") + std::string("ranks ") + RankList(c) + ": " +
                 types[c.front()];
  }
  std::sort(differing.begin(), differing.end());
  return Conflict(std::string(message) + ": ranks " + RankList(differing) +
                      " hold values different from rank 0's (" + described + ")",
                  {{"message", message}, {"differing_ranks", differing}, {"classes", classes}});
}

}  // namespace tessera::collectives
