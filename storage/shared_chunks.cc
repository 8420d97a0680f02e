#include "storage/shared_chunks.h"

#include <atomic>

#include "storage/checkpoint_dir.h"
#include "storage/chunk_ref.h"
#include "storage/index.h"
#include "storage/root_meta.h"

namespace tessera::storage {
namespace {

// The references of the checkpoint in `dir`: its summary's, or its index's.
Result<std::vector<std::string>> ReferencesOf(Env* env, const std::string& dir) {
  auto summary = ReadSummary(env, dir);
  if (summary.ok()) {
    const Json refs = summary->value("references", Json::array());
    if (refs.is_array()) {
      std::vector<std::string> out;
      for (const Json& r : refs) {
        if (r.is_string()) out.push_back(r.get<std::string>());
      }
      return out;
    }
  }
  ASSIGN_OR_RETURN(CheckpointIndex index, CheckpointIndex::Open(env, dir));
  return index.referenced_files();
}

// Removes the files of `dir` but its marker and those in `live`; true once none is left.
Result<bool> RemoveUnreferenced(Env* env, const std::string& dir, const std::set<std::string>& live,
                                std::vector<std::string>* removed) {
  ASSIGN_OR_RETURN(auto names, env->ListDir(dir));
  bool kept = false;
  for (const std::string& n : names) {
    if (n == kRetiredFile) continue;
    const std::string path = JoinPath(dir, n);
    if (live.count(path)) {
      kept = true;
      continue;
    }
    Status st = env->DeleteFile(path);
    if (!st.ok() && st.code() != Code::kNotFound) return st;
    removed->push_back(path);
  }
  return !kept;
}

// Removes a retired dir none of whose files is referred to: on a file system renamed
// out of sight first, like a delete (a crash leaves a ".deleting-" dir for the collector).
Status RemoveRetiredDir(Env* env, const std::string& dir) {
  if (env->IsObjectStore(dir)) return env->DeleteTree(dir);
  static std::atomic<uint64_t> counter{0};
  const std::string doomed =
      JoinPath(ParentDir(dir), ".deleting-retired-" + std::to_string(counter++));
  RETURN_IF_ERROR(env->Rename(dir, doomed));
  RETURN_IF_ERROR(env->SyncDir(ParentDir(dir)));
  return env->DeleteTree(doomed);
}

Status Sweep(Env* env, const std::vector<std::string>& retired, const std::set<std::string>& live,
             std::vector<std::string>* removed) {
  for (const std::string& dir : retired) {
    ASSIGN_OR_RETURN(bool empty, RemoveUnreferenced(env, dir, live, removed));
    if (!empty) {
      if (!env->IsObjectStore(dir)) RETURN_IF_ERROR(env->SyncDir(dir));
      continue;
    }
    RETURN_IF_ERROR(RemoveRetiredDir(env, dir));
    removed->push_back(dir);
  }
  return Status::Ok();
}

}  // namespace

Result<std::set<std::string>> LiveReferences(Env* env, const std::string& root,
                                             const std::string& mesh,
                                             std::optional<int64_t> except) {
  std::set<std::string> live;
  const std::string mesh_dir = MeshDir(root, mesh);
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListSteps(env, root, mesh));
  for (int64_t step : steps) {
    if (except && step == *except) continue;
    auto dir = CommittedDir(env, root, mesh, step);
    if (!dir.ok() && dir.status().code() == Code::kNotFound) continue;  // deleted meanwhile
    if (!dir.ok()) return dir.status();
    auto refs = ReferencesOf(env, *dir);
    if (!refs.ok()) {
      return refs.status().WithContext("cannot tell which files step " + std::to_string(step) +
                                       " of mesh " + mesh + " refers to, so none is removed");
    }
    for (const std::string& r : *refs) {
      if (auto ref = ParseChunkRef(r)) live.insert(JoinPath(JoinPath(mesh_dir, ref->dir), ref->name));
    }
  }
  return live;
}

Status RetireOrRemove(Env* env, const std::string& root, const std::string& mesh, int64_t step,
                      std::set<std::string>* live) {
  ASSIGN_OR_RETURN(std::string dir, CommittedDir(env, root, mesh, step));
  ASSIGN_OR_RETURN(*live, LiveReferences(env, root, mesh, step));
  const std::string prefix = dir + "/";
  auto first = live->lower_bound(prefix);
  if (first != live->end() && first->starts_with(prefix)) {
    return RetireCheckpoint(env, root, mesh, step).status();
  }
  return RemoveCheckpoint(env, root, mesh, step);
}

Status SweepRetired(Env* env, const std::string& root, const std::string& mesh,
                    const std::set<std::string>& live, std::vector<std::string>* removed) {
  ASSIGN_OR_RETURN(std::vector<std::string> retired, RetiredDirs(env, root, mesh));
  return Sweep(env, retired, live, removed);
}

Status DeleteCheckpoint(Env* env, const std::string& root, const std::string& mesh, int64_t step) {
  std::set<std::string> live;
  RETURN_IF_ERROR(RetireOrRemove(env, root, mesh, step, &live));
  std::vector<std::string> removed;
  return SweepRetired(env, root, mesh, live, &removed);
}

Result<std::vector<std::string>> SweepRetired(Env* env, const std::string& root,
                                              const std::string& mesh) {
  std::vector<std::string> removed;
  ASSIGN_OR_RETURN(std::vector<std::string> retired, RetiredDirs(env, root, mesh));
  if (retired.empty()) return removed;
  ASSIGN_OR_RETURN(std::set<std::string> live, LiveReferences(env, root, mesh));
  RETURN_IF_ERROR(Sweep(env, retired, live, &removed));
  return removed;
}

Result<std::vector<std::string>> SweepRetired(Env* env, const std::string& root) {
  std::vector<std::string> removed;
  if (!env->IsObjectStore(root) && !env->IsDirectory(root)) return removed;
  ASSIGN_OR_RETURN(std::vector<std::string> meshes, ListMeshDirs(env, root));
  for (const std::string& mesh : meshes) {
    ASSIGN_OR_RETURN(std::vector<std::string> swept, SweepRetired(env, root, mesh));
    removed.insert(removed.end(), swept.begin(), swept.end());
  }
  return removed;
}

}  // namespace tessera::storage
