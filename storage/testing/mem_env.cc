// MemEnv: an inode tree in memory. Each directory keeps its live entries and the snapshot
// made by its last SyncDir; each file keeps its live bytes and the bytes of its last Sync.
// SimulateCrash() rebuilds the tree from the snapshots with fresh nodes, so handles opened
// before the crash point at orphaned nodes and their writes go nowhere.
#include "storage/testing/mem_env.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "api/thread_annotations.h"

namespace tessera::storage {
namespace {

struct Node {
  explicit Node(bool dir) : is_dir(dir) {}

  bool is_dir;
  // Directories: live entries and those made durable by the last SyncDir.
  std::map<std::string, std::shared_ptr<Node>> entries;
  std::map<std::string, std::shared_ptr<Node>> durable_entries;
  // Files: live bytes and the bytes as of the last Sync.
  std::string data;
  std::string durable_data;
  // Set when data was truncated since the last Sync, so durable_data is not a prefix of data.
  bool rewritten = false;
};

using NodePtr = std::shared_ptr<Node>;

// Lexically normalized components; "/a/b", "a/b" and "a/./b/" are all {"a", "b"}.
std::vector<std::string> Split(std::string_view path) {
  std::vector<std::string> parts;
  while (!path.empty()) {
    const size_t slash = path.find('/');
    const std::string_view part = path.substr(0, slash);
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.emplace_back(part);
    }
    if (slash == std::string_view::npos) break;
    path.remove_prefix(slash + 1);
  }
  return parts;
}

void SyncFile(Node& file) {
  // Appends since the last Sync only extend the durable copy; avoids recopying big files.
  if (!file.rewritten && file.data.size() >= file.durable_data.size()) {
    file.durable_data.append(file.data, file.durable_data.size());
  } else {
    file.durable_data = file.data;
  }
  file.rewritten = false;
}

// A fresh copy of what survives a crash below `dir`.
NodePtr RebuildDurable(const Node& dir) {
  auto copy = std::make_shared<Node>(true);
  for (const auto& [name, child] : dir.durable_entries) {
    NodePtr c;
    if (child->is_dir) {
      c = RebuildDurable(*child);
    } else {
      c = std::make_shared<Node>(false);
      c->data = child->durable_data;
      c->durable_data = child->durable_data;
    }
    copy->entries.emplace(name, std::move(c));
  }
  copy->durable_entries = copy->entries;
  return copy;
}

}  // namespace

struct MemEnv::Impl {
  Mutex mu;
  NodePtr root GUARDED_BY(mu) = std::make_shared<Node>(true);

  // All helpers below REQUIRE: mu held.

  // The node at `parts`, or null if any component is missing or not a directory.
  NodePtr Find(const std::vector<std::string>& parts) const REQUIRES(mu) {
    NodePtr node = root;
    for (const std::string& part : parts) {
      if (!node->is_dir) return nullptr;
      const auto it = node->entries.find(part);
      if (it == node->entries.end()) return nullptr;
      node = it->second;
    }
    return node;
  }

  // The directory that holds the last component of `parts` (which must not be empty).
  Result<NodePtr> FindParent(const std::vector<std::string>& parts, const std::string& path,
                             std::string_view what) const REQUIRES(mu) {
    NodePtr node = root;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      const auto it = node->entries.find(parts[i]);
      if (it == node->entries.end()) return ErrnoStatus(ENOENT, what, path);
      node = it->second;
      if (!node->is_dir) return ErrnoStatus(ENOTDIR, what, path);
    }
    return node;
  }
};

namespace {

class MemWritableFile final : public WritableFile {
 public:
  MemWritableFile(std::shared_ptr<MemEnv::Impl> impl, NodePtr node, std::string path)
      : impl_(std::move(impl)), node_(std::move(node)), path_(std::move(path)) {}

  Status Append(const void* data, size_t n) override {
    if (closed_) return Internal("append to closed file " + path_, {{"file", path_}});
    MutexLock lock(impl_->mu);
    node_->data.append(static_cast<const char*>(data), n);
    size_ += n;
    return Status::Ok();
  }

  Status Sync() override {
    if (closed_) return Internal("sync of closed file " + path_, {{"file", path_}});
    MutexLock lock(impl_->mu);
    SyncFile(*node_);
    return Status::Ok();
  }

  Status Close() override {
    closed_ = true;
    return Status::Ok();
  }

  uint64_t Size() const override { return size_; }

 private:
  std::shared_ptr<MemEnv::Impl> impl_;
  NodePtr node_;
  std::string path_;
  uint64_t size_ = 0;
  bool closed_ = false;
};

class MemRandomAccessFile final : public RandomAccessFile {
 public:
  MemRandomAccessFile(std::shared_ptr<MemEnv::Impl> impl, NodePtr node, std::string path)
      : impl_(std::move(impl)), node_(std::move(node)), path_(std::move(path)) {}

  Status Read(uint64_t offset, size_t n, void* buf) const override {
    MutexLock lock(impl_->mu);
    const std::string& data = node_->data;
    const size_t got = offset >= data.size() ? 0 : std::min<uint64_t>(n, data.size() - offset);
    if (got > 0) std::memcpy(buf, data.data() + offset, got);
    if (got < n) {
      return DataLoss("short read of " + path_ + " at offset " + std::to_string(offset) +
                          ": wanted " + std::to_string(n) + " bytes, got " + std::to_string(got),
                      {{"file", path_}, {"offset", offset}, {"wanted", n}, {"got", got}});
    }
    return Status::Ok();
  }

  uint64_t Size() const override {
    MutexLock lock(impl_->mu);
    return node_->data.size();
  }

 private:
  std::shared_ptr<MemEnv::Impl> impl_;
  NodePtr node_;
  std::string path_;
};

}  // namespace

MemEnv::MemEnv() : impl_(std::make_shared<Impl>()) {}
MemEnv::~MemEnv() = default;

Result<std::unique_ptr<WritableFile>> MemEnv::NewWritableFile(const std::string& path) {
  const std::vector<std::string> parts = Split(path);
  if (parts.empty()) return ErrnoStatus(EISDIR, "create", path);
  MutexLock lock(impl_->mu);
  ASSIGN_OR_RETURN(NodePtr parent, impl_->FindParent(parts, path, "create"));
  NodePtr& slot = parent->entries[parts.back()];
  if (slot == nullptr) {
    slot = std::make_shared<Node>(false);
  } else if (slot->is_dir) {
    return ErrnoStatus(EISDIR, "create", path);
  } else {
    // O_TRUNC keeps the inode; the old bytes stay durable until the next Sync.
    slot->data.clear();
    slot->rewritten = true;
  }
  return std::unique_ptr<WritableFile>(std::make_unique<MemWritableFile>(impl_, slot, path));
}

Result<std::unique_ptr<RandomAccessFile>> MemEnv::NewRandomAccessFile(const std::string& path) {
  MutexLock lock(impl_->mu);
  NodePtr node = impl_->Find(Split(path));
  if (node == nullptr) return ErrnoStatus(ENOENT, "open", path);
  if (node->is_dir) return ErrnoStatus(EISDIR, "open", path);
  return std::unique_ptr<RandomAccessFile>(
      std::make_unique<MemRandomAccessFile>(impl_, std::move(node), path));
}

bool MemEnv::Exists(const std::string& path) {
  MutexLock lock(impl_->mu);
  return impl_->Find(Split(path)) != nullptr;
}

bool MemEnv::IsDirectory(const std::string& path) {
  MutexLock lock(impl_->mu);
  const NodePtr node = impl_->Find(Split(path));
  return node != nullptr && node->is_dir;
}

Result<std::vector<std::string>> MemEnv::ListDir(const std::string& dir) {
  MutexLock lock(impl_->mu);
  const NodePtr node = impl_->Find(Split(dir));
  if (node == nullptr) return ErrnoStatus(ENOENT, "opendir", dir);
  if (!node->is_dir) return ErrnoStatus(ENOTDIR, "opendir", dir);
  std::vector<std::string> names;
  names.reserve(node->entries.size());
  for (const auto& entry : node->entries) names.push_back(entry.first);  // std::map: sorted
  return names;
}

Status MemEnv::CreateDirs(const std::string& dir) {
  const std::vector<std::string> parts = Split(dir);
  MutexLock lock(impl_->mu);
  NodePtr node = impl_->root;
  for (size_t i = 0; i < parts.size(); ++i) {
    NodePtr& slot = node->entries[parts[i]];
    if (slot == nullptr) slot = std::make_shared<Node>(true);
    if (!slot->is_dir) return ErrnoStatus(i + 1 == parts.size() ? EEXIST : ENOTDIR, "mkdir", dir);
    node = slot;
  }
  return Status::Ok();
}

Status MemEnv::DeleteFile(const std::string& path) {
  const std::vector<std::string> parts = Split(path);
  if (parts.empty()) return ErrnoStatus(EISDIR, "unlink", path);
  MutexLock lock(impl_->mu);
  ASSIGN_OR_RETURN(NodePtr parent, impl_->FindParent(parts, path, "unlink"));
  const auto it = parent->entries.find(parts.back());
  if (it == parent->entries.end()) return ErrnoStatus(ENOENT, "unlink", path);
  if (it->second->is_dir) return ErrnoStatus(EISDIR, "unlink", path);
  parent->entries.erase(it);
  return Status::Ok();
}

Status MemEnv::DeleteTree(const std::string& dir) {
  const std::vector<std::string> parts = Split(dir);
  MutexLock lock(impl_->mu);
  if (parts.empty()) {
    impl_->root->entries.clear();
    return Status::Ok();
  }
  Result<NodePtr> parent = impl_->FindParent(parts, dir, "rmdir");
  if (!parent.ok()) return Status::Ok();  // a missing ancestor means nothing to delete
  (*parent)->entries.erase(parts.back());
  return Status::Ok();
}

Status MemEnv::Rename(const std::string& from, const std::string& to) {
  const std::vector<std::string> from_parts = Split(from);
  const std::vector<std::string> to_parts = Split(to);
  const std::string what = "rename " + from + " to";
  if (from_parts.empty() || to_parts.empty()) return ErrnoStatus(EBUSY, what, to);
  MutexLock lock(impl_->mu);
  ASSIGN_OR_RETURN(NodePtr from_parent, impl_->FindParent(from_parts, from, "rename"));
  const auto it = from_parent->entries.find(from_parts.back());
  if (it == from_parent->entries.end()) return ErrnoStatus(ENOENT, "rename", from);
  ASSIGN_OR_RETURN(NodePtr to_parent, impl_->FindParent(to_parts, to, what));
  if (to_parent->entries.count(to_parts.back()) != 0) {
    return ErrnoStatus(EEXIST, what, to).WithDetail("from", from);
  }
  NodePtr node = it->second;
  // Without symlinks a lexical prefix is exactly "moving a directory below itself".
  if (node->is_dir && to_parts.size() > from_parts.size() &&
      std::equal(from_parts.begin(), from_parts.end(), to_parts.begin())) {
    return ErrnoStatus(EINVAL, what, to).WithDetail("from", from);
  }
  from_parent->entries.erase(it);
  to_parent->entries.emplace(to_parts.back(), std::move(node));
  return Status::Ok();
}

Status MemEnv::SyncDir(const std::string& dir) {
  MutexLock lock(impl_->mu);
  const NodePtr node = impl_->Find(Split(dir));
  if (node == nullptr) return ErrnoStatus(ENOENT, "open", dir);
  if (!node->is_dir) return ErrnoStatus(ENOTDIR, "open", dir);
  node->durable_entries = node->entries;
  return Status::Ok();
}

Result<uint64_t> MemEnv::FileSize(const std::string& path) {
  MutexLock lock(impl_->mu);
  const NodePtr node = impl_->Find(Split(path));
  if (node == nullptr) return ErrnoStatus(ENOENT, "stat", path);
  if (node->is_dir) return ErrnoStatus(EISDIR, "stat", path);
  return static_cast<uint64_t>(node->data.size());
}

void MemEnv::SimulateCrash() {
  MutexLock lock(impl_->mu);
  impl_->root = RebuildDurable(*impl_->root);
}

}  // namespace tessera::storage
