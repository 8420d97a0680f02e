#include "storage/safetensors_export.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <future>
#include <map>
#include <numeric>
#include <thread>

#include "storage/chunk_codec.h"
#include "storage/chunk_ref.h"
#include "storage/safetensors_format.h"

namespace tessera::storage {
namespace {

std::string FileName(size_t i, size_t n) {
  if (n == 1) return "model.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

// `meta`'s global tensor as slices of whole rows (dimension 0) of at most `bytes`
// each (at least one row); one slice for a scalar or an empty tensor.
std::vector<SliceSpec> RowBlocks(const TensorMeta& meta, uint64_t bytes) {
  const SliceSpec whole = FullSlice(meta.shape);
  if (meta.shape.empty() || meta.shape[0] <= 1 || meta.logical_bytes() <= bytes) return {whole};
  const uint64_t row_bytes = meta.logical_bytes() / static_cast<uint64_t>(meta.shape[0]);
  const int64_t rows = std::max<int64_t>(1, row_bytes ? static_cast<int64_t>(bytes / row_bytes) : meta.shape[0]);
  std::vector<SliceSpec> out;
  for (int64_t r = 0; r < meta.shape[0]; r += rows) {
    SliceSpec s = whole;
    s.offsets[0] = r;
    s.lengths[0] = std::min(rows, meta.shape[0] - r);
    out.push_back(std::move(s));
  }
  return out;
}

// Files filled in order, a new one when the next tensor would pass the limit.
std::vector<std::vector<size_t>> InOrder(const std::vector<TensorMeta>& tensors, uint64_t max_bytes) {
  std::vector<std::vector<size_t>> files(1);
  uint64_t in_file = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t bytes = tensors[i].logical_bytes();
    if (!files.back().empty() && in_file + bytes > max_bytes) {
      files.emplace_back();
      in_file = 0;
    }
    files.back().push_back(i);
    in_file += bytes;
  }
  return files;
}

// At least `spread` files of balanced size: largest tensor first, each into the
// emptiest file it fits in (a new file when none has room).
std::vector<std::vector<size_t>> Balanced(const std::vector<TensorMeta>& tensors, uint64_t max_bytes,
                                          size_t spread) {
  uint64_t total = 0;
  for (const auto& t : tensors) total += t.logical_bytes();
  const size_t by_size = static_cast<size_t>((total + max_bytes - 1) / std::max<uint64_t>(1, max_bytes));
  std::vector<std::vector<size_t>> files(std::min(tensors.size(), std::max(spread, by_size)));
  std::vector<uint64_t> fill(files.size(), 0);
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return tensors[a].logical_bytes() > tensors[b].logical_bytes();
  });
  for (size_t i : order) {
    const uint64_t bytes = tensors[i].logical_bytes();
    size_t best = files.size();
    for (size_t f = 0; f < files.size(); ++f) {
      const bool fits = files[f].empty() || fill[f] + bytes <= max_bytes;
      if (fits && (best == files.size() || fill[f] < fill[best])) best = f;
    }
    if (best == files.size()) {
      files.emplace_back();
      fill.push_back(0);
    }
    files[best].push_back(i);
    fill[best] += bytes;
  }
  for (auto& f : files) std::sort(f.begin(), f.end());
  // Files in the order of their first tensor, so that names follow the checkpoint's order.
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return a.front() < b.front(); });
  return files;
}

}  // namespace

std::vector<ExportFile> PlanExportFiles(const std::vector<TensorMeta>& tensors, uint64_t max_file_bytes,
                                        size_t spread) {
  if (tensors.empty()) return {};
  const auto groups = spread <= 1 ? InOrder(tensors, max_file_bytes) : Balanced(tensors, max_file_bytes, spread);
  std::vector<ExportFile> out;
  for (size_t f = 0; f < groups.size(); ++f) {
    ExportFile file;
    file.name = FileName(f, groups.size());
    for (size_t i : groups[f]) {
      file.tensors.push_back(tensors[i].name);
      file.bytes += tensors[i].logical_bytes();
    }
    out.push_back(std::move(file));
  }
  return out;
}

Json ExportMetadata(const CheckpointMeta& m) {
  return {{"format", "pt"},
          {"tessera.mesh", MeshToJson(m.mesh).dump()},
          {"tessera.step", std::to_string(m.step)},
          {"tessera.metadata", m.metadata.dump()}};
}

Status WriteExportFile(Env* env, const CheckpointIndex& index, ShardCache* shards, ThreadPool* pool,
                       const ExportFile& file, const std::string& out_dir, const Json& metadata,
                       uint64_t block_bytes, int writers,
                       const std::function<void(const std::string&, uint64_t)>& on_tensor) {
  std::vector<const TensorEntry*> tensors;
  std::vector<SafetensorsEntry> entries;
  for (const std::string& name : file.tensors) {
    const TensorEntry* t = index.Find(name);
    if (t == nullptr) {
      return NotFound("the checkpoint has no tensor '" + name + "' to export into " + file.name,
                      {{"tensor", name}, {"file", file.name}});
    }
    tensors.push_back(t);
    entries.push_back({name, t->meta.dtype, t->meta.shape, t->meta.logical_bytes()});
  }
  const std::string path = JoinPath(out_dir, file.name);
  const std::string header = EncodeSafetensorsHeader(entries, metadata);
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> out, env->NewWritableFile(path));
  // Every tensor block by block of rows (dimension 0), so that memory stays bounded
  // whatever a tensor's size.
  struct Block {
    const TensorEntry* tensor;
    SliceSpec slice;
    bool last;  // of its tensor
  };
  std::vector<Block> blocks;
  for (const TensorEntry* t : tensors) {
    std::vector<SliceSpec> rows = RowBlocks(t->meta, std::max<uint64_t>(1, block_bytes));
    for (size_t b = 0; b < rows.size(); ++b) blocks.push_back({t, std::move(rows[b]), b + 1 == rows.size()});
  }
  auto bytes_of = [](const Block& b) {
    return static_cast<size_t>(b.slice.NumElements()) * DTypeSize(b.tensor->meta.dtype);
  };
  // A block whose chunks are raw and tile it (rows of a row-sharded or whole tensor,
  // uncompressed) is written straight from the mapped shards, each chunk's checksum
  // verified there: one copy, as a save makes. Any other is read into a buffer.
  using Sink = std::function<Status(uint64_t, const char*, size_t)>;  // (offset in block, bytes)
  auto direct_write = [&](const Block& b, const Sink& sink, bool* done) -> Status {
    *done = false;
    ASSIGN_OR_RETURN(ReadPlan plan, PlanRead(*b.tensor, b.slice));
    const std::vector<DirectChunk> chunks = DirectChunks(plan);
    if (chunks.empty() && plan.target.NumElements() > 0) return Status::Ok();
    auto bad_chunk = [&](const DirectChunk& c, const std::string& what) {
      const std::string file = ResolveChunkFile(shards->dir(), *c.file);
      return DataLoss("tensor '" + b.tensor->meta.name + "': chunk at offset " + std::to_string(c.loc.offset) +
                          " of " + file + ": " + what,
                      {{"file", file}, {"tensor", b.tensor->meta.name}, {"offset", c.loc.offset}});
    };
    std::vector<const char*> bytes;
    for (const DirectChunk& c : chunks) {
      const MappedFile* m = shards->Map(*c.file);
      if (m == nullptr) return Status::Ok();
      if (c.loc.offset + c.loc.length > m->size() || c.loc.offset + c.loc.length < c.loc.offset) {
        return bad_chunk(c, "lies outside the file; the shard is truncated or the index is wrong");
      }
      bytes.push_back(m->data() + c.loc.offset);
    }
    for (size_t i = 0; i < chunks.size(); ++i) {
      const DirectChunk& c = chunks[i];
      if (Checksum(bytes[i], c.loc.raw_length) != c.loc.checksum) {
        return bad_chunk(c, "checksum mismatch (xxh64 of the raw bytes differs from the index)");
      }
      RETURN_IF_ERROR(sink(c.target_offset, bytes[i], c.loc.raw_length));
    }
    *done = true;
    return Status::Ok();
  };
  auto read_block = [&](const Block& b, std::vector<char>* buf) -> Status {
    const TensorEntry& t = *b.tensor;
    ASSIGN_OR_RETURN(ReadPlan plan, PlanRead(t, b.slice));
    const size_t n = bytes_of(b);
    if (buf->size() < n) buf->resize(n);
    Status st = ExecuteRead(plan, shards, buf->data(), n, pool);
    return st.ok() ? st : st.WithContext("tensor " + t.meta.name).WithDetail("tensor", t.meta.name);
  };
  if (writers > 1 && blocks.size() > 1 && out->CanWriteAt()) {
    // `writers` threads fill the file at the blocks' offsets, each taking the next
    // block not yet taken; a tensor is reported once all its blocks are written.
    RETURN_IF_ERROR(out->WriteAt(0, header.data(), header.size()).WithContext(path));
    std::vector<uint64_t> offset(blocks.size());
    std::map<const TensorEntry*, size_t> left;  // blocks not yet written, by tensor
    for (size_t i = 0, at = header.size(); i < blocks.size(); at += bytes_of(blocks[i]), ++i) {
      offset[i] = at;
      ++left[blocks[i].tensor];
    }
    std::atomic<size_t> taken{0};
    std::atomic<bool> failed{false};
    Mutex mu;
    std::vector<Status> errors(static_cast<size_t>(writers));
    auto write_blocks = [&](size_t w) {
      std::vector<char> buf;
      for (size_t i = taken++; i < blocks.size() && !failed; i = taken++) {
        const Sink at = [&](uint64_t rel, const char* data, size_t n) {
          return out->WriteAt(offset[i] + rel, data, n).WithContext(path);
        };
        bool done = false;
        Status st = direct_write(blocks[i], at, &done);
        if (st.ok() && !done) st = read_block(blocks[i], &buf);
        if (st.ok() && !done) st = at(0, buf.data(), bytes_of(blocks[i]));
        if (!st.ok()) {
          errors[w] = st;
          failed = true;
          return;
        }
        MutexLock lock(mu);
        if (--left[blocks[i].tensor] == 0 && on_tensor) {
          on_tensor(blocks[i].tensor->meta.name, blocks[i].tensor->meta.logical_bytes());
        }
      }
    };
    std::vector<std::thread> threads;
    for (int w = 1; w < writers; ++w) threads.emplace_back(write_blocks, static_cast<size_t>(w));
    write_blocks(0);
    for (auto& t : threads) t.join();
    for (const Status& st : errors) RETURN_IF_ERROR(st);
  } else {
    // One writer: the next block (of this tensor or the next) is read while this one
    // is written.
    RETURN_IF_ERROR(out->Append(header.data(), header.size()).WithContext(path));
    const Sink append = [&](uint64_t, const char* data, size_t n) { return out->Append(data, n).WithContext(path); };
    std::vector<char> buffers[2];
    std::future<Status> next;  // the read of block i into buffers[i % 2], when one runs
    for (size_t i = 0; i < blocks.size(); ++i) {
      bool done = false;
      if (!next.valid()) RETURN_IF_ERROR(direct_write(blocks[i], append, &done));
      if (!done) {
        Status read = next.valid() ? next.get() : read_block(blocks[i], &buffers[i % 2]);
        RETURN_IF_ERROR(read);
        if (i + 1 < blocks.size()) {
          next = std::async(std::launch::async, read_block, std::cref(blocks[i + 1]), &buffers[(i + 1) % 2]);
        }
        Status wrote = append(0, buffers[i % 2].data(), bytes_of(blocks[i]));
        if (!wrote.ok()) {
          if (next.valid()) next.wait();
          return wrote;
        }
      }
      if (blocks[i].last && on_tensor) on_tensor(blocks[i].tensor->meta.name, blocks[i].tensor->meta.logical_bytes());
    }
  }
  RETURN_IF_ERROR(out->Sync().WithContext(path));
  return out->Close().WithContext(path);
}

Status WriteExportIndex(Env* env, const std::string& out_dir, const std::vector<ExportFile>& files) {
  Json weight_map = Json::object();
  uint64_t total = 0;
  for (const ExportFile& f : files) {
    for (const std::string& t : f.tensors) weight_map[t] = f.name;
    total += f.bytes;
  }
  const std::string text = Json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2);
  const std::string path = JoinPath(out_dir, kSafetensorsIndexFile);
  if (!env->IsObjectStore(path)) return WriteFileDurably(env, path, text);
  // An object appears whole when its upload completes: no rename needed (or possible).
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> out, env->NewWritableFile(path));
  RETURN_IF_ERROR(out->Append(text.data(), text.size()).WithContext(path));
  RETURN_IF_ERROR(out->Sync().WithContext(path));
  return out->Close().WithContext(path);
}

Result<ExportSummary> ExportSafetensors(Env* env, const std::string& checkpoint_dir,
                                        const std::string& out_dir, const ExportOptions& options) {
  ASSIGN_OR_RETURN(CheckpointIndex index, CheckpointIndex::Open(env, checkpoint_dir));
  std::vector<TensorMeta> metas;
  for (const auto& t : index.tensors()) metas.push_back(t.meta);
  const std::vector<ExportFile> files = PlanExportFiles(metas, options.max_file_bytes);
  const Json metadata = ExportMetadata(index.meta());
  RETURN_IF_ERROR(env->CreateDirs(out_dir));
  ExportSummary summary;
  ShardCache shards(env, checkpoint_dir);
  ThreadPool pool(std::max(1, options.threads));
  for (const ExportFile& file : files) {
    RETURN_IF_ERROR(WriteExportFile(env, index, &shards, &pool, file, out_dir, metadata, options.block_bytes,
                                    options.writers,
                                    [&](const std::string& name, uint64_t bytes) {
                                      summary.tensor_bytes += bytes;
                                      ++summary.tensors;
                                      if (options.progress) options.progress(summary.tensors, metas.size(), name);
                                    }));
    summary.files.push_back(file.name);
  }
  RETURN_IF_ERROR(WriteExportIndex(env, out_dir, files));
  return summary;
}

}  // namespace tessera::storage
