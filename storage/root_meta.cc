#include "storage/root_meta.h"

#include <algorithm>
#include <cstdlib>

#include "api/tensor_desc.h"
#include "storage/checkpoint_dir.h"

namespace tessera::storage {
namespace {

constexpr std::string_view kMeshDocPrefix = "mesh-";
constexpr std::string_view kMeshDocSuffix = ".json";
constexpr int kSummaryFormat = 1;

// "mesh-<n>.json" → n; 0 for any other name.
int64_t MeshDocVersion(std::string_view name) {
  if (name.size() <= kMeshDocPrefix.size() + kMeshDocSuffix.size() ||
      name.substr(0, kMeshDocPrefix.size()) != kMeshDocPrefix ||
      name.substr(name.size() - kMeshDocSuffix.size()) != kMeshDocSuffix) {
    return 0;
  }
  const std::string_view digits =
      name.substr(kMeshDocPrefix.size(), name.size() - kMeshDocPrefix.size() - kMeshDocSuffix.size());
  if (digits.empty() || digits.size() > 18 || digits[0] == '0' ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return 0;
  }
  return std::strtoll(std::string(digits).c_str(), nullptr, 10);
}

std::string MeshDocPath(const std::string& root, const std::string& mesh, int64_t version) {
  return JoinPath(MeshDir(root, mesh),
                  std::string(kMeshDocPrefix) + std::to_string(version) + std::string(kMeshDocSuffix));
}

// Every version of the mesh's document present, ascending.
Result<std::vector<int64_t>> MeshDocVersions(Env* env, const std::string& root,
                                             const std::string& mesh) {
  std::vector<int64_t> versions;
  const std::string dir = MeshDir(root, mesh);
  if (!env->IsObjectStore(root) && !env->IsDirectory(dir)) return versions;
  auto names = env->ListDir(dir);
  if (!names.ok()) {
    if (names.status().code() == Code::kNotFound) return versions;
    return names.status();
  }
  for (const std::string& n : *names) {
    if (int64_t v = MeshDocVersion(n); v > 0) versions.push_back(v);
  }
  std::sort(versions.begin(), versions.end());
  return versions;
}

std::string UnescapeMeshDir(const std::string& name) {
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    if (name.compare(i, 3, "%2F") == 0) {
      out += '/';
      i += 2;
    } else {
      out += name[i];
    }
  }
  return out;
}

}  // namespace

Result<std::vector<std::string>> ListMeshDirs(Env* env, const std::string& root) {
  std::vector<std::string> meshes;
  const bool object_store = env->IsObjectStore(root);
  if (!object_store && !env->IsDirectory(root)) return meshes;
  ASSIGN_OR_RETURN(auto names, env->ListDir(root));
  for (const std::string& n : names) {
    if (n.empty() || n[0] == '.') continue;  // in progress, or not a mesh
    if (!object_store && !env->IsDirectory(JoinPath(root, n))) continue;
    meshes.push_back(UnescapeMeshDir(n));
  }
  std::sort(meshes.begin(), meshes.end());
  meshes.erase(std::unique(meshes.begin(), meshes.end()), meshes.end());
  return meshes;
}

Result<std::optional<MeshDoc>> ReadMeshDoc(Env* env, const std::string& root, const std::string& mesh) {
  ASSIGN_OR_RETURN(std::vector<int64_t> versions, MeshDocVersions(env, root, mesh));
  // The newest readable version: one being replaced may vanish under the listing.
  for (auto v = versions.rbegin(); v != versions.rend(); ++v) {
    const std::string path = MeshDocPath(root, mesh, *v);
    auto text = ReadWholeFile(env, path);
    if (!text.ok()) {
      if (text.status().code() == Code::kNotFound) continue;
      return text.status().WithContext("mesh document " + path);
    }
    Json doc = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (!doc.is_object()) {
      return DataLoss("mesh document " + path + " is not a JSON object", {{"file", path}});
    }
    return std::optional<MeshDoc>(MeshDoc{*v, std::move(doc)});
  }
  return std::optional<MeshDoc>();
}

Result<int64_t> WriteMeshDoc(Env* env, const std::string& root, const std::string& mesh,
                             const Json& doc) {
  ASSIGN_OR_RETURN(std::vector<int64_t> versions, MeshDocVersions(env, root, mesh));
  const int64_t next = versions.empty() ? 1 : versions.back() + 1;
  const std::string path = MeshDocPath(root, mesh, next);
  Status st = env->CreateDirs(MeshDir(root, mesh));
  if (st.ok()) st = env->PublishFile(path, doc.dump());
  if (st.code() == Code::kConflict) {
    return Conflict("mesh " + mesh + "'s document version " + std::to_string(next) +
                        " was written by another control plane at the same time",
                    {{"mesh", mesh}, {"file", path}});
  }
  RETURN_IF_ERROR(st.WithContext("mesh document " + path));
  return next;
}

Result<std::vector<std::string>> PruneMeshDocs(Env* env, const std::string& root) {
  std::vector<std::string> removed;
  ASSIGN_OR_RETURN(std::vector<std::string> meshes, ListMeshDirs(env, root));
  for (const std::string& mesh : meshes) {
    ASSIGN_OR_RETURN(std::vector<int64_t> versions, MeshDocVersions(env, root, mesh));
    // The newest and the one it replaced (a reader may be on it) stay.
    for (size_t i = 0; i + 2 < versions.size(); ++i) {
      const std::string path = MeshDocPath(root, mesh, versions[i]);
      Status st = env->DeleteFile(path);
      if (!st.ok() && st.code() != Code::kNotFound) return st.WithContext("mesh document " + path);
      removed.push_back(path);
    }
  }
  return removed;
}

Json SummaryOf(const CheckpointIndex& index) {
  Json tensors = Json::array();
  for (const auto& t : index.tensors()) {
    Json tj = TensorMetaToJson(t.meta);
    tj["logical_bytes"] = t.meta.logical_bytes();
    tj["stored_bytes"] = t.stored_bytes;
    tensors.push_back(std::move(tj));
  }
  const CheckpointMeta& meta = index.meta();
  Json summary = {{"format", kSummaryFormat},
                  {"mesh", meta.mesh.name},
                  {"step", meta.step},
                  {"created_at", meta.created_at_ms},
                  {"metadata", meta.metadata},
                  {"tensors", std::move(tensors)},
                  {"logical_bytes", index.logical_bytes()},
                  {"stored_bytes", index.stored_bytes()}};
  // An incremental checkpoint: what of earlier checkpoints' files it needs, which
  // deletes and garbage collection keep (storage/shared_chunks.h).
  if (std::vector<std::string> refs = index.referenced_files(); !refs.empty()) {
    summary["referenced_bytes"] = index.referenced_bytes();
    summary["references"] = refs;
  }
  return summary;
}

Status WriteSummary(Env* env, const std::string& dir) {
  ASSIGN_OR_RETURN(auto index, CheckpointIndex::Open(env, dir));
  // Staging is not visible until its commit: written in place (object stores have no
  // rename), synced before the commit like every file in it.
  const std::string path = JoinPath(dir, kSummaryFile);
  const std::string text = SummaryOf(index).dump();
  ASSIGN_OR_RETURN(auto file, env->NewWritableFile(path));
  RETURN_IF_ERROR(file->Append(text.data(), text.size()));
  RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

Result<Json> ReadSummary(Env* env, const std::string& dir) {
  const std::string path = JoinPath(dir, kSummaryFile);
  auto text = ReadWholeFile(env, path);
  if (text.ok()) {
    Json doc = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (doc.is_object() && doc.value("format", 0) == kSummaryFormat && doc.contains("tensors") &&
        doc["tensors"].is_array()) {
      return doc;
    }
    return DataLoss("checkpoint summary " + path + " is not a summary of format " +
                        std::to_string(kSummaryFormat),
                    {{"file", path}});
  }
  if (text.status().code() != Code::kNotFound) return text.status().WithContext("checkpoint summary");
  ASSIGN_OR_RETURN(auto index, CheckpointIndex::Open(env, dir));
  return SummaryOf(index);
}

}  // namespace tessera::storage
