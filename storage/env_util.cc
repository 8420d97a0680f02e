// Whole-file and path helpers shared by every Env implementation.
#include <atomic>
#include <memory>
#include <string>
#include <string_view>

#include "storage/env.h"

namespace tessera::storage {

Status WriteFileDurably(Env* env, const std::string& path, std::string_view data) {
  const std::string tmp = path + ".tmp";
  {
    ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env->NewWritableFile(tmp));
    RETURN_IF_ERROR(file->Append(data.data(), data.size()));
    RETURN_IF_ERROR(file->Sync());
    RETURN_IF_ERROR(file->Close());
  }
  // Rename never overwrites, so the old copy goes first; both changes become durable together
  // with the SyncDir below, which is what a crash-consistent caller relies on.
  if (env->Exists(path)) RETURN_IF_ERROR(env->DeleteFile(path));
  RETURN_IF_ERROR(env->Rename(tmp, path));
  return env->SyncDir(ParentDir(path));
}

Result<std::unique_ptr<MappedFile>> Env::MapFile(const std::string& path) {
  return InvalidArgument("cannot map " + path + " into memory here; read it instead", {{"file", path}});
}

Status Env::PublishFile(const std::string& path, std::string_view data) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = path + ".publish-" + std::to_string(counter++);
  {
    ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, NewWritableFile(tmp));
    Status st = file->Append(data.data(), data.size());
    if (st.ok()) st = file->Sync();
    if (st.ok()) st = file->Close();
    if (!st.ok()) {
      (void)DeleteFile(tmp);
      return st;
    }
  }
  if (Status st = Rename(tmp, path); !st.ok()) {
    (void)DeleteFile(tmp);
    return st;
  }
  return SyncDir(ParentDir(path));
}

Result<std::string> ReadWholeFile(Env* env, const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, env->NewRandomAccessFile(path));
  std::string data(file->Size(), '\0');
  if (!data.empty()) RETURN_IF_ERROR(file->Read(0, data.size(), data.data()));
  return data;
}

std::string JoinPath(std::string_view a, std::string_view b) {
  if (a.empty()) return std::string(b);
  if (b.empty()) return std::string(a);
  std::string out(a);
  if (out.back() != '/') out += '/';
  while (!b.empty() && b.front() == '/') b.remove_prefix(1);
  out += b;
  return out;
}

std::string ParentDir(std::string_view path) {
  // Trailing slashes name the same entry ("a/b/" is "a/b").
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  const size_t slash = path.rfind('/');
  if (slash == std::string_view::npos) return ".";
  if (slash == 0) return "/";
  std::string_view parent = path.substr(0, slash);
  while (parent.size() > 1 && parent.back() == '/') parent.remove_suffix(1);
  return std::string(parent);
}

}  // namespace tessera::storage
