#include "storage/read_planner.h"

#include <algorithm>
#include <cstring>
#include <future>

#include "storage/chunk_ref.h"

namespace tessera::storage {
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
  MutexLock lock(mu_);
  auto it = readers_.find(file);
  if (it != readers_.end()) return it->second.get();
  auto reader = ShardReader::Open(env_, ResolveChunkFile(dir_, file));
  if (!reader.ok()) {
    if (reader.status().code() == Code::kNotFound) {
      return DataLoss("shard file " + ResolveChunkFile(dir_, file) + " named by the index is missing",
                      {{"file", file}});
    }
    return reader.status();
  }
  const ShardReader* r = reader->get();
  readers_[file] = std::move(*reader);
  return r;
}

const MappedFile* ShardCache::Map(const std::string& file) {
  {
    MutexLock lock(mu_);
    auto it = maps_.find(file);
    if (it != maps_.end()) return it->second.get();
  }
  auto mapped = env_->MapFile(ResolveChunkFile(dir_, file));  // outside the lock: it opens the file
  MutexLock lock(mu_);
  auto& slot = maps_[file];
  if (slot == nullptr && mapped.ok()) slot = std::move(*mapped);
  return slot.get();
}

namespace {

// Where chunk `r` lands in `target` when it lands whole in one contiguous run of it
// (its decoded bytes then go straight there); -1 otherwise.
int64_t DirectOffset(const ChunkRead& r, const SliceSpec& target, size_t esize) {
  const uint64_t c0 = r.chunk.raw_offset, c1 = c0 + r.chunk.loc.raw_length;
  int64_t direct = -1;
  int runs = 0;
  ForEachRun(r.source->slice, target, esize, [&](uint64_t src, uint64_t d, uint64_t len) {
    if (src + len <= c0 || src >= c1) return;
    ++runs;
    if (src <= c0 && src + len >= c1) direct = static_cast<int64_t>(d + (c0 - src));
  });
  return runs == 1 ? direct : -1;
}

}  // namespace

std::vector<DirectChunk> DirectChunks(const ReadPlan& plan) {
  const size_t esize = DTypeSize(plan.tensor->meta.dtype);
  std::vector<DirectChunk> out;
  for (const ChunkRead& r : plan.reads) {
    if (r.chunk.loc.codec != Codec::kRaw || r.chunk.loc.length != r.chunk.loc.raw_length) return {};
    const int64_t direct = DirectOffset(r, plan.target, esize);
    if (direct < 0) return {};
    out.push_back({&ChunkFile(*r.source, r.chunk), r.chunk.loc, static_cast<uint64_t>(direct)});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.target_offset < b.target_offset; });
  uint64_t end = 0;
  for (const DirectChunk& c : out) {
    if (c.target_offset != end) return {};
    end += c.loc.raw_length;
  }
  if (end != static_cast<uint64_t>(plan.target.NumElements()) * esize) return {};
  return out;
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
    ASSIGN_OR_RETURN(const ShardReader* shard, shards->Get(ChunkFile(*r.source, r.chunk)));
    const uint64_t c0 = r.chunk.raw_offset, c1 = c0 + r.chunk.loc.raw_length;
    // When the whole chunk lands in one contiguous run of the target (reading
    // a slice as saved), decode it straight there: no second copy.
    const int64_t direct = DirectOffset(r, plan.target, esize);
    auto failed = [&](const Status& st) {
      return st.WithContext("tensor '" + meta.name + "'").WithDetail("tensor", meta.name);
    };
    if (direct >= 0) {
      Status st = shard->ReadChunk(r.chunk.loc, dst + direct);
      return st.ok() ? st : failed(st);
    }
    thread_local std::string buf;
    buf.resize(r.chunk.loc.raw_length);
    Status st = shard->ReadChunk(r.chunk.loc, buf.data());
    if (!st.ok()) return failed(st);
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
