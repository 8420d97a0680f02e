#include "storage/checkpoint_dir.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

namespace tessera::storage {
namespace {

constexpr std::string_view kStepPrefix = "step-";
constexpr std::string_view kStagingPrefix = ".staging-";
constexpr std::string_view kDeletingPrefix = ".deleting-";
constexpr std::string_view kManifestSuffix = ".commit";

bool ParseStep(std::string_view name, int64_t* step, std::string_view suffix = "") {
  if (name.substr(0, kStepPrefix.size()) != kStepPrefix) return false;
  if (name.size() < kStepPrefix.size() + suffix.size() ||
      name.substr(name.size() - suffix.size()) != suffix) {
    return false;
  }
  name.remove_suffix(suffix.size());
  std::string_view digits = name.substr(kStepPrefix.size());
  auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), *step);
  return ec == std::errc() && p == digits.data() + digits.size() && !digits.empty() && *step >= 0;
}

Status NotCommitted(const std::string& mesh, int64_t step) {
  return NotFound("mesh " + mesh + " has no committed step " + std::to_string(step),
                  {{"step", step}});
}

Status AlreadyCommitted(const std::string& mesh, int64_t step) {
  return Conflict("step " + std::to_string(step) + " of mesh " + mesh + " is already committed",
                  {{"step", step}});
}

// --- Object stores: the manifest ---------------------------------------------

std::string ManifestPath(const std::string& root, const std::string& mesh, int64_t step) {
  return JoinPath(MeshDir(root, mesh),
                  std::string(kStepPrefix) + std::to_string(step) + std::string(kManifestSuffix));
}

std::string ManifestBody(const std::string& mesh, int64_t step, const std::string& staging_name) {
  return nlohmann::json{{"format", "tessera-commit/1"}, {"mesh", mesh}, {"step", step},
                        {"dir", staging_name}}
      .dump();
}

// The "dir" a manifest's body names, "" if it names none.
std::string ManifestDir(std::string_view body) {
  auto j = nlohmann::json::parse(body, nullptr, false);
  return j.is_object() && j.value("dir", nlohmann::json()).is_string() ? j["dir"].get<std::string>()
                                                                        : "";
}

// The name (in the mesh dir) of the prefix that the manifest of `step` commits.
// The same, of the manifest at `path`; its body's errors as they come (not_found included).
Result<std::string> ReadManifestAt(Env* env, const std::string& path, int64_t step) {
  ASSIGN_OR_RETURN(std::string body, ReadWholeFile(env, path));
  const std::string dir = ManifestDir(body);
  const std::string expect = std::string(kStagingPrefix) + std::to_string(step) + "-";
  if (dir.rfind(expect, 0) != 0 || dir.find('/') != std::string::npos) {
    return DataLoss("commit manifest " + path + " does not name a staging prefix of step " +
                        std::to_string(step),
                    {{"file", path}});
  }
  return dir;
}

Result<std::string> ReadManifest(Env* env, const std::string& root, const std::string& mesh,
                                 int64_t step) {
  auto dir = ReadManifestAt(env, ManifestPath(root, mesh, step), step);
  if (!dir.ok() && dir.status().code() == Code::kNotFound) return NotCommitted(mesh, step);
  return dir;
}

std::string StagingName(int64_t step, const std::string& id) {
  return std::string(kStagingPrefix) + std::to_string(step) + "-" + id;
}

Status CommitObjects(Env* env, const std::string& root, const std::string& mesh, int64_t step,
                     const std::string& id) {
  const std::string name = StagingName(step, id);
  Status st = env->PublishFile(ManifestPath(root, mesh, step), ManifestBody(mesh, step, name));
  if (st.code() == Code::kConflict) {
    // Ours already, if an earlier attempt of this very request succeeded unseen.
    auto there = ReadManifest(env, root, mesh, step);
    if (there.ok() && *there == name) return Status::Ok();
    return AlreadyCommitted(mesh, step);
  }
  return st;
}

Status DeleteObjects(Env* env, const std::string& root, const std::string& mesh, int64_t step) {
  ASSIGN_OR_RETURN(std::string dir, ReadManifest(env, root, mesh, step));
  // The manifest goes first: from then on the step is gone, and the files are
  // an unreferenced staging prefix that garbage collection removes if this stops.
  RETURN_IF_ERROR(env->DeleteFile(ManifestPath(root, mesh, step)));
  (void)env->DeleteTree(JoinPath(MeshDir(root, mesh), dir));
  return Status::Ok();
}

using KeepFn = std::function<bool(const StagingRef&)>;

// ".staging-<step>-<id>": the text of its step and its id; false for another name.
bool SplitStagingName(std::string_view name, std::string_view* step, std::string_view* id) {
  if (!name.starts_with(kStagingPrefix)) return false;
  std::string_view rest = name.substr(kStagingPrefix.size());
  const size_t dash = rest.find('-');
  if (dash == rest.npos) return false;
  *step = rest.substr(0, dash);
  *id = rest.substr(dash + 1);
  return true;
}


// The step of a staging dir name; -1 for another name.
int64_t StagingStep(std::string_view name) {
  std::string_view text, id;
  if (!SplitStagingName(name, &text, &id) || text.empty()) return -1;
  int64_t step = -1;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), step);
  return ec == std::errc() && p == text.data() + text.size() && step >= 0 ? step : -1;
}

// The mesh of a mesh dir's name (MeshDir escapes '/').
std::string MeshOfDirName(std::string_view name) {
  std::string mesh;
  for (size_t i = 0; i < name.size(); ++i) {
    if (name.substr(i, 3) == "%2F") {
      mesh += '/';
      i += 2;
    } else {
      mesh += name[i];
    }
  }
  return mesh;
}

// What `keep` is asked of the staging dir `name` in mesh dir `mesh_dir`.
StagingRef RefOf(std::string_view mesh_dir, std::string_view name) {
  std::string_view step, id;
  StagingRef ref;
  ref.mesh = MeshOfDirName(mesh_dir);
  ref.step = StagingStep(name);
  if (SplitStagingName(name, &step, &id)) ref.id = std::string(id);
  return ref;
}

Result<std::vector<std::string>> CollectObjectGarbage(Env* env, const std::string& root,
                                                      const KeepFn& keep) {
  std::vector<std::string> removed;
  ASSIGN_OR_RETURN(auto meshes, env->ListDir(root));
  for (const auto& m : meshes) {
    const std::string dir = JoinPath(root, m);
    ASSIGN_OR_RETURN(auto names, env->ListDir(dir));
    // A manifest is read only where its step has more than one staging prefix: with
    // one, that prefix is kept whatever the manifest names (keeping is never wrong),
    // so the common case is a listing, not a read per checkpoint.
    std::map<int64_t, int> prefixes;  // staging prefixes per step
    for (const auto& n : names) {
      if (int64_t step = StagingStep(n); step >= 0) ++prefixes[step];
    }
    std::set<std::string> referenced;
    std::set<int64_t> committed_single;  // committed steps with one staging prefix
    for (const auto& n : names) {
      int64_t step;
      if (!ParseStep(n, &step, kManifestSuffix)) continue;
      if (prefixes[step] <= 1) {
        committed_single.insert(step);
        continue;
      }
      auto body = ReadWholeFile(env, JoinPath(dir, n));
      // Deleted since the listing: its step is gone, and so may its files be.
      if (!body.ok() && body.status().code() == Code::kNotFound) continue;
      if (!body.ok()) return body.status();  // never guess what a manifest protects
      referenced.insert(ManifestDir(*body));
    }
    for (const auto& n : names) {
      if (!n.starts_with(kStagingPrefix) || referenced.count(n) ||
          committed_single.count(StagingStep(n)) || keep(RefOf(m, n))) {
        continue;
      }
      const std::string path = JoinPath(dir, n);
      if (IsRetired(env, path)) continue;  // SweepRetired's (shared_chunks.h)
      RETURN_IF_ERROR(env->DeleteTree(path));
      removed.push_back(path);
    }
  }
  return removed;
}

}  // namespace

std::string MeshDir(const std::string& root, const std::string& mesh) {
  // One directory per mesh even when its name has '/': '%' cannot occur in names.
  std::string escaped;
  for (char c : mesh) escaped += c == '/' ? std::string("%2F") : std::string(1, c);
  return JoinPath(root, escaped);
}

std::string CheckpointDir(const std::string& root, const std::string& mesh, int64_t step) {
  return JoinPath(MeshDir(root, mesh), std::string(kStepPrefix) + std::to_string(step));
}

std::string StagingDir(const std::string& root, const std::string& mesh, int64_t step,
                       const std::string& id) {
  return JoinPath(MeshDir(root, mesh), StagingName(step, id));
}

std::string SaveDirName(Env* env, const std::string& root, int64_t step) {
  return env->IsObjectStore(root) ? StagingName(step, kSaveStagingId)
                                  : std::string(kStepPrefix) + std::to_string(step);
}

Result<std::string> CommittedDir(Env* env, const std::string& root, const std::string& mesh,
                                 int64_t step) {
  if (env->IsObjectStore(root)) {
    ASSIGN_OR_RETURN(std::string name, ReadManifest(env, root, mesh, step));
    return JoinPath(MeshDir(root, mesh), name);
  }
  std::string dir = CheckpointDir(root, mesh, step);
  if (!env->IsDirectory(dir) || IsRetired(env, dir)) return NotCommitted(mesh, step);
  return dir;
}

Result<std::string> ResolveCheckpointPath(Env* env, const std::string& path) {
  std::string trimmed = path;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  const std::string parent = ParentDir(trimmed);
  const std::string name = trimmed.substr(parent.empty() ? 0 : parent.size() + 1);
  int64_t step = 0;
  if (!env->IsObjectStore(trimmed) || !ParseStep(name, &step)) return trimmed;
  const std::string manifest = trimmed + std::string(kManifestSuffix);
  auto dir = ReadManifestAt(env, manifest, step);
  if (!dir.ok() && dir.status().code() == Code::kNotFound) {
    return NotFound("no committed checkpoint at " + trimmed + " (no manifest " + manifest + ")",
                    {{"file", manifest}});
  }
  if (!dir.ok()) return dir.status();
  return JoinPath(parent, *dir);
}

Status CreateStaging(Env* env, const std::string& root, const std::string& mesh, int64_t step,
                     const std::string& id) {
  if (env->IsObjectStore(root)) {
    auto there = ReadManifest(env, root, mesh, step);
    if (there.ok()) return AlreadyCommitted(mesh, step);
    if (there.status().code() != Code::kNotFound) return there.status();
  } else if (env->Exists(CheckpointDir(root, mesh, step))) {
    RETURN_IF_ERROR(CheckNotRetired(env, root, mesh, step));
    return AlreadyCommitted(mesh, step);
  }
  const std::string staging = StagingDir(root, mesh, step, id);
  if (IsRetired(env, staging)) return CheckNotRetired(env, root, mesh, step);
  RETURN_IF_ERROR(env->DeleteTree(staging));  // (on an object store this also checks the bucket)
  return env->CreateDirs(staging);
}

Status Commit(Env* env, const std::string& root, const std::string& mesh, int64_t step,
              const std::string& id) {
  if (env->IsObjectStore(root)) return CommitObjects(env, root, mesh, step, id);
  const std::string staging = StagingDir(root, mesh, step, id);
  const std::string final_dir = CheckpointDir(root, mesh, step);
  if (env->Exists(final_dir)) return AlreadyCommitted(mesh, step);
  RETURN_IF_ERROR(env->SyncDir(staging));
  RETURN_IF_ERROR(env->Rename(staging, final_dir));
  Status st = env->SyncDir(MeshDir(root, mesh));
  // The mesh dir (and the root) may be new: their own entries must be durable too.
  if (st.ok()) st = env->SyncDir(root);
  if (st.ok()) st = env->SyncDir(ParentDir(root));
  if (!st.ok()) {
    // Not known to be durable: take it back, so a failed commit leaves no visible step.
    if (env->Rename(final_dir, staging).ok()) (void)env->SyncDir(MeshDir(root, mesh));
  }
  return st;
}

bool IsRetired(Env* env, const std::string& dir) { return env->Exists(JoinPath(dir, kRetiredFile)); }

Result<std::string> RetireCheckpoint(Env* env, const std::string& root, const std::string& mesh,
                                     int64_t step) {
  ASSIGN_OR_RETURN(std::string dir, CommittedDir(env, root, mesh, step));
  Status marked = env->PublishFile(JoinPath(dir, kRetiredFile), "");
  if (!marked.ok() && marked.code() != Code::kConflict) return marked;  // conflict: marked before
  if (env->IsObjectStore(root)) RETURN_IF_ERROR(env->DeleteFile(ManifestPath(root, mesh, step)));
  return dir;
}

Result<std::vector<std::string>> RetiredDirs(Env* env, const std::string& root,
                                             const std::string& mesh) {
  std::vector<std::string> out;
  const std::string dir = MeshDir(root, mesh);
  if (!env->IsObjectStore(root) && !env->IsDirectory(dir)) return out;
  ASSIGN_OR_RETURN(auto names, env->ListDir(dir));
  if (env->IsObjectStore(root)) {
    // A step with a manifest is committed: only the prefixes of other steps may be retired.
    std::set<int64_t> committed;
    for (const auto& n : names) {
      int64_t step;
      if (ParseStep(n, &step, kManifestSuffix)) committed.insert(step);
    }
    for (const auto& n : names) {
      const int64_t step = StagingStep(n);
      if (step >= 0 && !committed.count(step) && IsRetired(env, JoinPath(dir, n))) {
        out.push_back(JoinPath(dir, n));
      }
    }
    return out;
  }
  for (const auto& n : names) {
    int64_t step;
    if (ParseStep(n, &step) && IsRetired(env, JoinPath(dir, n))) out.push_back(JoinPath(dir, n));
  }
  return out;
}

Status CheckNotRetired(Env* env, const std::string& root, const std::string& mesh, int64_t step) {
  const std::string dir = JoinPath(MeshDir(root, mesh), SaveDirName(env, root, step));
  if (!IsRetired(env, dir)) return Status::Ok();
  return Conflict("step " + std::to_string(step) + " of mesh " + mesh +
                      " was deleted, and later checkpoints still refer to its files in " + dir +
                      ": save it again once they are deleted",
                  {{"step", step}, {"file", dir}});
}

Status RemoveCheckpoint(Env* env, const std::string& root, const std::string& mesh, int64_t step) {
  if (env->IsObjectStore(root)) return DeleteObjects(env, root, mesh, step);
  const std::string dir = CheckpointDir(root, mesh, step);
  if (!env->IsDirectory(dir)) return NotCommitted(mesh, step);
  static std::atomic<uint64_t> counter{0};
  const std::string doomed =
      JoinPath(MeshDir(root, mesh), std::string(kDeletingPrefix) + std::to_string(step) + "-" +
                                        std::to_string(counter++));
  RETURN_IF_ERROR(env->Rename(dir, doomed));
  RETURN_IF_ERROR(env->SyncDir(MeshDir(root, mesh)));
  return env->DeleteTree(doomed);
}

Result<std::vector<int64_t>> ListSteps(Env* env, const std::string& root, const std::string& mesh) {
  std::vector<int64_t> steps;
  const std::string dir = MeshDir(root, mesh);
  if (env->IsObjectStore(root)) {
    ASSIGN_OR_RETURN(auto names, env->ListDir(dir));
    for (const auto& n : names) {
      int64_t step;
      if (ParseStep(n, &step, kManifestSuffix)) steps.push_back(step);
    }
    std::sort(steps.begin(), steps.end());
    return steps;
  }
  if (!env->IsDirectory(dir)) return steps;
  ASSIGN_OR_RETURN(auto names, env->ListDir(dir));
  for (const auto& n : names) {
    int64_t step;
    if (ParseStep(n, &step) && env->IsDirectory(JoinPath(dir, n)) && !IsRetired(env, JoinPath(dir, n))) {
      steps.push_back(step);
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

Result<std::vector<std::string>> CollectGarbage(Env* env, const std::string& root,
                                                const std::set<std::string>& keep) {
  return CollectGarbage(env, root, [&keep](const StagingRef& s) { return keep.count(s.id) > 0; });
}

Result<std::vector<std::string>> CollectGarbage(Env* env, const std::string& root,
                                                const KeepFn& keep) {
  if (env->IsObjectStore(root)) return CollectObjectGarbage(env, root, keep);
  std::vector<std::string> removed;
  if (!env->IsDirectory(root)) return removed;
  ASSIGN_OR_RETURN(auto meshes, env->ListDir(root));
  for (const auto& m : meshes) {
    const std::string dir = JoinPath(root, m);
    if (!env->IsDirectory(dir)) continue;
    ASSIGN_OR_RETURN(auto names, env->ListDir(dir));
    for (const auto& n : names) {
      std::string path = JoinPath(dir, n);
      if (n.starts_with(kStagingPrefix)) {
        if (keep(RefOf(m, n))) continue;
        // Renamed away first: a deposed control plane's commit (a rename of this very
        // dir) then fails, rather than publishing a dir half removed.
        static std::atomic<uint64_t> counter{0};
        const std::string doomed = JoinPath(
            dir, std::string(kDeletingPrefix) + "gc-" + std::to_string(counter++) + "-" +
                     n.substr(kStagingPrefix.size()));
        Status moved = env->Rename(path, doomed);
        if (moved.code() == Code::kNotFound) continue;  // committed or removed meanwhile
        RETURN_IF_ERROR(moved);
        removed.push_back(path);
        path = doomed;
      } else if (!n.starts_with(kDeletingPrefix)) {
        continue;
      } else {
        removed.push_back(path);
      }
      RETURN_IF_ERROR(env->DeleteTree(path));
    }
  }
  return removed;
}

}  // namespace tessera::storage
