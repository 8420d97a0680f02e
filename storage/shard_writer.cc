#include "storage/shard_writer.h"

#include <algorithm>

namespace tessera::storage {

Result<std::unique_ptr<ShardWriter>> ShardWriter::Create(Env* env, const std::string& path,
                                                         ShardOptions options) {
  options.chunk_size =
      std::clamp<uint64_t>(options.chunk_size & ~uint64_t{7}, 8, kMaxChunkSize);
  return std::unique_ptr<ShardWriter>(new ShardWriter(env, path, std::move(options)));
}

ShardWriter::ShardWriter(Env* env, std::string path, ShardOptions options)
    : env_(env), path_(std::move(path)), options_(std::move(options)) {
  // Enough chunks in flight to keep every pool thread busy while one is written.
  max_inflight_ = options_.pool ? 2 * options_.pool->size() + 1 : 1;
  if (options_.compress) {
    // Not zero-filled: pages are touched once per writer, not once per chunk.
    buffer_capacity_ = MaxEncodedSize(std::max<size_t>(options_.chunk_size, options_.sample_bytes));
    for (size_t i = 0; i < max_inflight_ + 2; ++i) {
      buffers_.emplace_back(new char[buffer_capacity_]);
    }
  }
}

Status ShardWriter::Open() {
  ASSIGN_OR_RETURN(file_, env_->NewWritableFile(path_));
  std::string header = EncodeShardHeader(options_.chunk_size);
  RETURN_IF_ERROR(file_->Append(header.data(), header.size()));
  offset_ = header.size();
  return Status::Ok();
}

ShardWriter::~ShardWriter() {
  Drain();
  if (file_) (void)file_->Close();
}

void ShardWriter::Drain() {
  for (auto& p : pending_) {
    if (p.encoded.valid()) p.encoded.wait();
  }
  pending_.clear();
}

namespace {

// The base chunk at `raw_offset` of `n` bytes, or null.
const SliceChunk* BaseChunkAt(const std::vector<SliceChunk>* base, uint64_t raw_offset, size_t n) {
  if (base == nullptr) return nullptr;
  auto it = std::lower_bound(base->begin(), base->end(), raw_offset,
                             [](const SliceChunk& c, uint64_t off) { return c.raw_offset < off; });
  if (it == base->end() || it->raw_offset != raw_offset || it->loc.raw_length != n) return nullptr;
  return &*it;
}

}  // namespace

Result<size_t> ShardWriter::Add(const void* data, size_t n, int width,
                                const std::vector<SliceChunk>* base) {
  return AddSlice(static_cast<const char*>(data), nullptr, n, width, base);
}

Result<size_t> ShardWriter::Add(const SliceReader& read, size_t n, int width,
                                const std::vector<SliceChunk>* base) {
  return AddSlice(nullptr, &read, n, width, base);
}

Result<size_t> ShardWriter::AddSlice(const char* data, const SliceReader* read, size_t n,
                                     int width, const std::vector<SliceChunk>* base) {
  if (!error_.ok()) return error_;
  if (finished_) return Internal("ShardWriter::Add after Finish for " + path_);
  const size_t ring = max_inflight_ + 2;
  if (read != nullptr && inputs_.empty()) {
    for (size_t i = 0; i < ring; ++i) inputs_.emplace_back(new char[options_.chunk_size]);
  }
  size_t handle = slices_.size();
  slices_.emplace_back();
  bool compress = options_.compress;
  if (compress && n > options_.sample_bytes && options_.min_savings > 0) {
    size_t m = std::min<size_t>(n, options_.sample_bytes);
    // The sample uses the buffers the next chunk will take, before it is queued.
    const char* sampled = data;
    if (read != nullptr) {
      m = std::min<size_t>(m, options_.chunk_size);  // an input buffer's size
      char* in = inputs_[next_buffer_ % ring].get();
      error_ = (*read)(0, m, in);
      if (!error_.ok()) return error_;
      sampled = in;
    }
    EncodedChunk sample = EncodeChunk(sampled, m, true, options_.level,
                                      buffers_[next_buffer_ % ring].get(), buffer_capacity_, 0,
                                      width);
    compress = sample.codec != Codec::kRaw &&
               sample.length <= static_cast<size_t>(m * (1 - options_.min_savings));
  }
  for (uint64_t off = 0; off < n || (n == 0 && off == 0); off += options_.chunk_size) {
    size_t len = std::min<uint64_t>(options_.chunk_size, n - off);
    // At most max_inflight_ + 1 chunks are pending, so the round-robin never
    // hands out a buffer that is still being filled or written.
    const size_t slot = next_buffer_++ % ring;
    char* out = buffers_.empty() ? nullptr : buffers_[slot].get();
    char* in = read != nullptr ? inputs_[slot].get() : nullptr;
    Pending p{handle, off, in != nullptr ? in : data + off, len, out, {}};
    const int level = options_.level;
    const size_t cap = buffer_capacity_;
    const double min_savings = options_.min_savings;
    const SliceChunk* was = BaseChunkAt(base, off, len);
    SliceReader reader = read != nullptr ? *read : SliceReader();
    auto encode = [s = p.src, in, off, len, compress, level, out, cap, min_savings, width, was,
                   reader = std::move(reader)] {
      if (reader) {
        Status got = reader(off, len, in);
        if (!got.ok()) return Encoded{EncodedChunk{}, nullptr, std::move(got)};
      }
      const uint64_t sum = Checksum(s, len);
      if (was != nullptr && was->loc.checksum == sum) {
        return Encoded{EncodedChunk{Codec::kRaw, 0, len, sum}, was};
      }
      return Encoded{EncodeSummedChunk(s, len, sum, compress, level, out, cap, min_savings, width)};
    };
    if (options_.pool) {
      p.encoded = options_.pool->Submit(std::move(encode));
    } else {
      std::promise<Encoded> done;
      done.set_value(encode());
      p.encoded = done.get_future();
    }
    pending_.push_back(std::move(p));
    while (pending_.size() > max_inflight_) {
      error_ = WriteFront();
      if (!error_.ok()) return error_;
    }
    if (n == 0) break;
  }
  return handle;
}

Status ShardWriter::WriteFront() {
  Pending p = std::move(pending_.front());
  pending_.pop_front();
  Encoded got = p.encoded.get();
  if (!got.read.ok()) return got.read;
  const EncodedChunk& e = got.chunk;
  if (got.reused != nullptr) {
    raw_done_ += e.raw_length;
    reused_ += e.raw_length;
    slices_[p.slice].push_back(*got.reused);
    if (options_.on_progress) options_.on_progress(raw_done_);
    return Status::Ok();
  }
  if (!file_) RETURN_IF_ERROR(Open());
  const char* bytes = e.codec == Codec::kRaw ? p.src : p.out;
  const size_t len = e.length;
  RETURN_IF_ERROR(file_->Append(bytes, len));
  ChunkLocation loc{offset_, len, e.raw_length, e.checksum, e.codec};
  offset_ += len;
  raw_done_ += e.raw_length;
  table_.push_back(loc);
  slices_[p.slice].push_back({p.raw_offset, loc, {}});
  if (options_.on_progress) options_.on_progress(raw_done_);
  return Status::Ok();
}

Status ShardWriter::Finish() {
  if (finished_) return error_;
  finished_ = true;
  while (error_.ok() && !pending_.empty()) error_ = WriteFront();
  Drain();
  if (!error_.ok()) return error_;
  if (!file_ && reused_ > 0) return error_;  // every chunk refers to a base: no file
  if (!file_) error_ = Open();  // a writer of empty slices still writes its file
  if (!error_.ok()) return error_;
  std::string footer = EncodeShardFooter(table_, offset_);
  error_ = file_->Append(footer.data(), footer.size());
  if (error_.ok()) error_ = file_->Sync();
  if (error_.ok()) error_ = file_->Close();
  if (error_.ok()) offset_ += footer.size();
  return error_;
}

}  // namespace tessera::storage
