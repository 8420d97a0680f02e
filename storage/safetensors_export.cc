#include "storage/safetensors_export.h"

#include <algorithm>
#include <cstdio>
#include <future>

#include "storage/index.h"
#include "storage/read_planner.h"
#include "storage/thread_pool.h"

namespace tessera::storage {
namespace {

std::string FileName(size_t i, size_t n) {
  if (n == 1) return "model.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

// The header of one file: its tensors with their byte ranges, padded to 8 bytes.
std::string Header(const std::vector<const TensorEntry*>& tensors, const Json& metadata) {
  Json h = Json::object();
  uint64_t offset = 0;
  for (const TensorEntry* t : tensors) {
    const uint64_t bytes = t->meta.logical_bytes();
    h[t->meta.name] = {{"dtype", SafetensorsDType(t->meta.dtype)},
                       {"shape", t->meta.shape},
                       {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  h["__metadata__"] = metadata;
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
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

}  // namespace

std::string SafetensorsDType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "F32";
    case DType::kFloat64: return "F64";
    case DType::kFloat16: return "F16";
    case DType::kBFloat16: return "BF16";
    case DType::kInt8: return "I8";
    case DType::kInt16: return "I16";
    case DType::kInt32: return "I32";
    case DType::kInt64: return "I64";
    case DType::kUInt8: return "U8";
    case DType::kBool: return "BOOL";
  }
  return "";
}

Result<ExportSummary> ExportSafetensors(Env* env, const std::string& checkpoint_dir,
                                        const std::string& out_dir, const ExportOptions& options) {
  ASSIGN_OR_RETURN(CheckpointIndex index, CheckpointIndex::Open(env, checkpoint_dir));
  // Files: tensors in index order, a new file when the next would pass the limit.
  std::vector<std::vector<const TensorEntry*>> files(1);
  uint64_t in_file = 0;
  for (const auto& t : index.tensors()) {
    const uint64_t bytes = t.meta.logical_bytes();
    if (!files.back().empty() && in_file + bytes > options.max_file_bytes) {
      files.emplace_back();
      in_file = 0;
    }
    files.back().push_back(&t);
    in_file += bytes;
  }
  if (index.tensors().empty()) files.clear();
  const auto& m = index.meta();
  const Json metadata = {{"format", "pt"},
                         {"tessera.mesh", MeshToJson(m.mesh).dump()},
                         {"tessera.step", std::to_string(m.step)},
                         {"tessera.metadata", m.metadata.dump()}};
  RETURN_IF_ERROR(env->CreateDirs(out_dir));
  ExportSummary summary;
  Json weight_map = Json::object();
  ShardCache shards(env, checkpoint_dir);
  std::vector<char> buffers[2];
  ThreadPool pool(std::max(1, options.threads));
  const size_t total = index.tensors().size();
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string name = FileName(f, files.size());
    const std::string path = JoinPath(out_dir, name);
    const std::string header = Header(files[f], metadata);
    ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> out, env->NewWritableFile(path));
    uint8_t size_le[8];
    for (int i = 0; i < 8; ++i) size_le[i] = static_cast<uint8_t>(header.size() >> (8 * i));
    RETURN_IF_ERROR(out->Append(size_le, 8));
    RETURN_IF_ERROR(out->Append(header.data(), header.size()));
    for (const TensorEntry* t : files[f]) {
      // Block by block of rows (dimension 0), so that memory stays bounded whatever
      // the tensor's size; the next block is read while this one is written.
      const std::vector<SliceSpec> blocks = RowBlocks(t->meta, std::max<uint64_t>(1, options.block_bytes));
      auto read_block = [&](size_t b, std::vector<char>* buf) -> Status {
        ASSIGN_OR_RETURN(ReadPlan plan, PlanRead(*t, blocks[b]));
        const size_t n = static_cast<size_t>(blocks[b].NumElements()) * DTypeSize(t->meta.dtype);
        if (buf->size() < n) buf->resize(n);
        Status st = ExecuteRead(plan, &shards, buf->data(), n, &pool);
        return st.ok() ? st : st.WithContext("tensor " + t->meta.name).WithDetail("tensor", t->meta.name);
      };
      RETURN_IF_ERROR(read_block(0, &buffers[0]));
      for (size_t b = 0; b < blocks.size(); ++b) {
        std::vector<char>& now = buffers[b % 2];
        std::future<Status> next;
        if (b + 1 < blocks.size()) {
          next = std::async(std::launch::async, read_block, b + 1, &buffers[(b + 1) % 2]);
        }
        const size_t n = static_cast<size_t>(blocks[b].NumElements()) * DTypeSize(t->meta.dtype);
        Status wrote = out->Append(now.data(), n).WithContext(path);
        Status read = next.valid() ? next.get() : Status::Ok();
        RETURN_IF_ERROR(wrote);
        RETURN_IF_ERROR(read);
      }
      weight_map[t->meta.name] = name;
      summary.tensor_bytes += t->meta.logical_bytes();
      ++summary.tensors;
      if (options.progress) options.progress(summary.tensors, total, t->meta.name);
    }
    RETURN_IF_ERROR(out->Sync().WithContext(path));
    RETURN_IF_ERROR(out->Close().WithContext(path));
    summary.files.push_back(name);
  }
  const Json index_json = {{"metadata", {{"total_size", summary.tensor_bytes}}}, {"weight_map", weight_map}};
  RETURN_IF_ERROR(WriteFileDurably(env, JoinPath(out_dir, "model.safetensors.index.json"), index_json.dump(2)));
  return summary;
}

}  // namespace tessera::storage
