#include "storage/verify.h"

#include <algorithm>
#include <future>
#include <map>
#include <mutex>
#include <set>

#include "storage/chunk_ref.h"
#include "storage/index.h"
#include "storage/read_planner.h"

namespace tessera::storage {

Json VerifyReport::ToJson() const {
  Json bad = Json::array();
  for (const auto& b : bad_chunks) {
    bad.push_back({{"tensor", b.tensor}, {"file", b.file}, {"offset", b.offset}, {"error", b.error}});
  }
  return {{"ok", ok()},           {"tensors", tensors},     {"chunks_checked", chunks_checked},
          {"bytes_checked", bytes_checked}, {"bad_chunks", bad}, {"problems", problems}};
}

Result<VerifyReport> VerifyCheckpoint(Env* env, const std::string& dir, ThreadPool* pool,
                                      const std::function<void(uint64_t, uint64_t)>& progress) {
  ASSIGN_OR_RETURN(auto index, CheckpointIndex::Open(env, dir));
  VerifyReport report;
  report.tensors = index.tensors().size();
  ShardCache shards(env, dir);

  struct Item {
    const TensorEntry* tensor;
    const SliceEntry* slice;
    const SliceChunk* chunk;
  };
  std::vector<Item> items;
  std::map<std::string, std::set<std::pair<uint64_t, uint64_t>>> indexed;  // file → (offset, len)
  uint64_t total = 0;
  for (const auto& t : index.tensors()) {
    for (const auto& s : t.slices) {
      for (const auto& c : s.chunks) {
        items.push_back({&t, &s, &c});
        indexed[ChunkFile(s, c)].insert({c.loc.offset, c.loc.length});
        total += c.loc.length;
      }
    }
  }
  // File level: every shard opens, and its own table agrees with the index.
  for (const auto& [file, locs] : indexed) {
    auto shard = shards.Get(file);
    if (!shard.ok()) {
      report.problems.push_back(shard.status().message());
      continue;
    }
    auto table = (*shard)->ReadTable();
    if (!table.ok()) {
      report.problems.push_back(table.status().message());
      continue;
    }
    std::set<std::pair<uint64_t, uint64_t>> in_file;
    for (const auto& c : *table) in_file.insert({c.offset, c.length});
    // An earlier checkpoint's file holds the chunks referred to, and maybe others.
    const bool referenced = ParseChunkRef(file).has_value();
    if (referenced ? !std::includes(in_file.begin(), in_file.end(), locs.begin(), locs.end())
                   : in_file != locs) {
      report.problems.push_back("shard file " + file + ": its chunk table (" +
                                std::to_string(in_file.size()) + " chunks) disagrees with the index (" +
                                std::to_string(locs.size()) + " chunks)");
    }
  }
  std::mutex mu;
  uint64_t done = 0;
  auto check = [&](const Item& it) {
    std::string buf(it.chunk->loc.raw_length, '\0');
    Status st;
    const std::string& file = ChunkFile(*it.slice, *it.chunk);
    auto shard = shards.Get(file);
    st = shard.ok() ? (*shard)->ReadChunk(it.chunk->loc, buf.data()) : shard.status();
    std::lock_guard<std::mutex> lock(mu);
    report.chunks_checked++;
    done += it.chunk->loc.length;
    if (!st.ok()) {
      report.bad_chunks.push_back(
          {it.tensor->meta.name, file, it.chunk->loc.offset, st.message()});
    }
    if (progress) progress(done, total);
  };
  if (pool) {
    std::vector<std::future<void>> futures;
    for (const auto& it : items) futures.push_back(pool->Submit([&check, it] { check(it); }));
    for (auto& f : futures) f.get();
  } else {
    for (const auto& it : items) check(it);
  }
  report.bytes_checked = done;
  return report;
}

}  // namespace tessera::storage
