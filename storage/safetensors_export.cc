#include "storage/safetensors_export.h"

#include <cstdio>

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
      ASSIGN_OR_RETURN(ReadPlan plan, PlanRead(*t, FullSlice(t->meta.shape)));
      std::string bytes(t->meta.logical_bytes(), '\0');
      Status read = ExecuteRead(plan, &shards, bytes.data(), bytes.size(), &pool);
      if (!read.ok()) return read.WithContext("tensor " + t->meta.name).WithDetail("tensor", t->meta.name);
      RETURN_IF_ERROR(out->Append(bytes.data(), bytes.size()).WithContext(path));
      weight_map[t->meta.name] = name;
      summary.tensor_bytes += bytes.size();
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
