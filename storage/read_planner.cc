#include "storage/read_planner.h"

#include <algorithm>
#include <cstring>
#include <future>

namespace tessera::storage {
namespace {

// Row-major element strides of a box with the given lengths.
std::vector<uint64_t> Strides(const std::vector<int64_t>& lengths) {
  std::vector<uint64_t> s(lengths.size(), 1);
  for (size_t i = lengths.size(); i-- > 1;) s[i - 1] = s[i] * lengths[i];
  return s;
}

}  // namespace

void ForEachRun(const SliceSpec& src, const SliceSpec& dst, size_t elem_size,
                const std::function<void(uint64_t, uint64_t, uint64_t)>& fn) {
  auto inter = Intersect(src, dst);
  if (!inter) return;
  const size_t rank = inter->lengths.size();
  if (rank == 0) {
    fn(0, 0, elem_size);
    return;
  }
  // Merge trailing dims that both boxes hold whole into one contiguous run.
  size_t k = rank - 1;
  uint64_t run = inter->lengths[k];
  while (k > 0 && inter->lengths[k] == src.lengths[k] && inter->lengths[k] == dst.lengths[k]) {
    --k;
    run *= inter->lengths[k];
  }
  const auto ss = Strides(src.lengths), ds = Strides(dst.lengths);
  std::vector<int64_t> idx(k, 0);  // position over the outer dims [0, k)
  while (true) {
    uint64_t so = 0, d_o = 0;
    for (size_t i = 0; i < rank; ++i) {
      int64_t g = inter->offsets[i] + (i < k ? idx[i] : 0);
      so += (g - src.offsets[i]) * ss[i];
      d_o += (g - dst.offsets[i]) * ds[i];
    }
    fn(so * elem_size, d_o * elem_size, run * elem_size);
    size_t d = k;
    while (d > 0) {
      if (++idx[d - 1] < inter->lengths[d - 1]) break;
      idx[d - 1] = 0;
      --d;
    }
    if (d == 0) return;
  }
}

Result<ReadPlan> PlanRead(const TensorEntry& tensor, const SliceSpec& target) {
  const auto& meta = tensor.meta;
  if (target.offsets.size() != meta.shape.size() || target.lengths.size() != meta.shape.size() ||
      !Contains(FullSlice(meta.shape), target)) {
    return InvalidArgument("slice " + target.ToString() + " is outside tensor '" + meta.name +
                               "' of shape [" + ShapeToString(meta.shape) + "]",
                           {{"tensor", meta.name}});
  }
  ReadPlan plan;
  plan.tensor = &tensor;
  plan.target = target;
  const size_t esize = DTypeSize(meta.dtype);
  int64_t covered = 0;
  for (const auto& s : tensor.slices) {
    auto inter = Intersect(s.slice, target);
    if (!inter) continue;
    covered += inter->NumElements();
    std::vector<bool> needed(s.chunks.size(), false);
    size_t hint = 0;  // runs come in ascending source order
    ForEachRun(s.slice, target, esize, [&](uint64_t src, uint64_t, uint64_t len) {
      while (hint < s.chunks.size() &&
             s.chunks[hint].raw_offset + s.chunks[hint].loc.raw_length <= src) {
        ++hint;
      }
      for (size_t c = hint; c < s.chunks.size() && s.chunks[c].raw_offset < src + len; ++c) {
        needed[c] = true;
      }
    });
    for (size_t c = 0; c < s.chunks.size(); ++c) {
      if (!needed[c]) continue;
      plan.reads.push_back({&s, s.chunks[c]});
      plan.stored_bytes += s.chunks[c].loc.length;
      plan.raw_bytes += s.chunks[c].loc.raw_length;
    }
  }
  if (covered != target.NumElements()) {
    return DataLoss("saved slices of tensor '" + meta.name + "' cover " + std::to_string(covered) +
                        " of the " + std::to_string(target.NumElements()) + " elements of " +
                        target.ToString(),
                    {{"tensor", meta.name}});
  }
  return plan;
}

Result<const ShardReader*> ShardCache::Get(const std::string& file) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = readers_.find(file);
  if (it != readers_.end()) return it->second.get();
  auto reader = ShardReader::Open(env_, JoinPath(dir_, file));
  if (!reader.ok()) {
    if (reader.status().code() == Code::kNotFound) {
      return DataLoss("shard file " + JoinPath(dir_, file) + " named by the index is missing",
                      {{"file", file}});
    }
    return reader.status();
  }
  const ShardReader* r = reader->get();
  readers_[file] = std::move(*reader);
  return r;
}

Status ExecuteRead(const ReadPlan& plan, ShardCache* shards, void* out, size_t out_bytes,
                   ThreadPool* pool) {
  const auto& meta = plan.tensor->meta;
  const size_t esize = DTypeSize(meta.dtype);
  if (out_bytes != static_cast<uint64_t>(plan.target.NumElements()) * esize) {
    return InvalidArgument("buffer of " + std::to_string(out_bytes) + " bytes for " +
                               plan.target.ToString() + " of tensor '" + meta.name + "'",
                           {{"tensor", meta.name}});
  }
  char* dst = static_cast<char*>(out);
  auto one = [&](const ChunkRead& r) -> Status {
    ASSIGN_OR_RETURN(const ShardReader* shard, shards->Get(r.source->file));
    const uint64_t c0 = r.chunk.raw_offset, c1 = c0 + r.chunk.loc.raw_length;
    thread_local std::string buf;
    buf.resize(r.chunk.loc.raw_length);
    Status st = shard->ReadChunk(r.chunk.loc, buf.data());
    if (!st.ok()) {
      return st.WithContext("tensor '" + meta.name + "'").WithDetail("tensor", meta.name);
    }
    ForEachRun(r.source->slice, plan.target, esize, [&](uint64_t src, uint64_t d, uint64_t len) {
      uint64_t lo = std::max(src, c0), hi = std::min(src + len, c1);
      if (lo < hi) std::memcpy(dst + d + (lo - src), buf.data() + (lo - c0), hi - lo);
    });
    return Status::Ok();
  };
  if (!pool || plan.reads.size() < 2) {
    for (const auto& r : plan.reads) RETURN_IF_ERROR(one(r));
    return Status::Ok();
  }
  // Chunks write disjoint parts of `out`, so they may decode in parallel.
  std::vector<std::future<Status>> futures;
  futures.reserve(plan.reads.size());
  for (const auto& r : plan.reads) futures.push_back(pool->Submit([&one, &r] { return one(r); }));
  Status first;
  for (auto& f : futures) {
    Status st = f.get();
    if (first.ok() && !st.ok()) first = st;
  }
  return first;
}

}  // namespace tessera::storage
