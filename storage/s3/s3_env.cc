#include "storage/s3/s3_env.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "api/thread_annotations.h"
#include "storage/s3/client.h"
#include "storage/thread_pool.h"

namespace tessera::storage {
namespace {

constexpr std::string_view kScheme = "s3://";

std::mutex endpoint_mu;
std::string& EndpointSetting() {
  static std::string endpoint;
  return endpoint;
}

struct Location {
  std::string bucket;
  std::string key;  // no leading or trailing '/'
};

Location Parse(const std::string& path) {
  std::string_view rest = std::string_view(path).substr(kScheme.size());
  const size_t slash = rest.find('/');
  Location loc{std::string(rest.substr(0, slash)), ""};
  if (slash != std::string_view::npos) {
    std::string_view key = rest.substr(slash + 1);
    while (!key.empty() && key.front() == '/') key.remove_prefix(1);
    while (!key.empty() && key.back() == '/') key.remove_suffix(1);
    loc.key = std::string(key);
  }
  return loc;
}

// The prefix of everything "in" a directory.
std::string DirPrefix(const std::string& key) { return key.empty() ? "" : key + "/"; }

class S3WritableFile final : public WritableFile {
 public:
  S3WritableFile(std::shared_ptr<s3::Client> client, std::string key, std::string path,
                 const S3EnvOptions& options, ThreadPool* pool)
      : client_(std::move(client)), key_(std::move(key)), path_(std::move(path)),
        options_(options), pool_(pool) {}
  ~S3WritableFile() override { (void)Close(); }

  Status Append(const void* data, size_t n) override {
    if (closed_) return Internal("append to closed file " + path_, {{"file", path_}});
    RETURN_IF_ERROR(error_);
    if (synced_) {
      return Internal("append to " + path_ + " after Sync: an object is written once",
                      {{"file", path_}});
    }
    const char* p = static_cast<const char*>(data);
    size_ += n;
    while (n > 0) {
      if (buffer_ == nullptr) buffer_ = TakeBuffer();
      const size_t take = std::min(n, options_.part_bytes - buffer_->size());
      buffer_->append(p, take);
      p += take;
      n -= take;
      if (buffer_->size() == options_.part_bytes) RETURN_IF_ERROR(SendPart());
    }
    return Status::Ok();
  }

  Status Sync() override {
    if (closed_) return Internal("sync of closed file " + path_, {{"file", path_}});
    RETURN_IF_ERROR(error_);
    if (synced_) return Status::Ok();
    if (upload_id_.empty()) {
      // Smaller than one part: a single PUT.
      Status st = client_->Put(key_, buffer_ ? std::string_view(*buffer_) : std::string_view());
      if (!st.ok()) return Fail(st);
    } else {
      if (buffer_ != nullptr && !buffer_->empty()) RETURN_IF_ERROR(SendPart());
      while (!in_flight_.empty()) RETURN_IF_ERROR(WaitOldest());
      Status st = client_->FinishUpload(key_, upload_id_, etags_);
      if (!st.ok()) return Fail(st);
    }
    synced_ = true;
    buffer_.reset();
    free_.clear();
    return Status::Ok();
  }

  Status Close() override {
    if (closed_) return Status::Ok();
    closed_ = true;
    for (auto& part : in_flight_) part.etag.wait();
    in_flight_.clear();
    buffer_.reset();
    free_.clear();
    if (!synced_ && !upload_id_.empty()) {
      // Never completed: the parts already sent must not linger on the server.
      return client_->AbortUpload(key_, upload_id_);
    }
    return Status::Ok();
  }

  uint64_t Size() const override { return size_; }

 private:
  struct Part {
    std::future<Result<std::string>> etag;
    std::unique_ptr<std::string> body;
  };

  std::unique_ptr<std::string> TakeBuffer() {
    if (!free_.empty()) {
      auto b = std::move(free_.back());
      free_.pop_back();
      b->clear();
      return b;
    }
    auto b = std::make_unique<std::string>();
    b->reserve(options_.part_bytes);
    return b;
  }

  Status Fail(const Status& st) {
    error_ = st.WithDetail("file", path_);
    return error_;
  }

  // Sends the buffer as the next part; waits first if too many parts are out.
  Status SendPart() {
    if (upload_id_.empty()) {
      auto id = client_->StartUpload(key_);
      if (!id.ok()) return Fail(id.status());
      upload_id_ = *id;
    }
    while (static_cast<int>(in_flight_.size()) >= std::max(1, options_.parts_in_flight)) {
      RETURN_IF_ERROR(WaitOldest());
    }
    const int number = static_cast<int>(etags_.size() + in_flight_.size()) + 1;
    Part part;
    part.body = std::move(buffer_);
    const std::string* body = part.body.get();
    part.etag = pool_->Submit([client = client_, key = key_, id = upload_id_, number, body] {
      return client->PutPart(key, id, number, *body);
    });
    in_flight_.push_back(std::move(part));
    return Status::Ok();
  }

  Status WaitOldest() {
    Part part = std::move(in_flight_.front());
    in_flight_.pop_front();
    Result<std::string> etag = part.etag.get();
    free_.push_back(std::move(part.body));
    if (!etag.ok()) {
      return Fail(etag.status().WithContext("part " + std::to_string(etags_.size() + 1)));
    }
    etags_.push_back(*etag);
    return Status::Ok();
  }

  std::shared_ptr<s3::Client> client_;
  const std::string key_;
  const std::string path_;
  const S3EnvOptions options_;
  ThreadPool* pool_;
  uint64_t size_ = 0;
  std::unique_ptr<std::string> buffer_;  // the part being filled
  std::vector<std::unique_ptr<std::string>> free_;  // sent parts' buffers, for reuse
  std::deque<Part> in_flight_;
  std::vector<std::string> etags_;  // of the parts sent and acknowledged, in order
  std::string upload_id_;
  Status error_;  // sticky: after a failed part the object can never be whole
  bool synced_ = false;
  bool closed_ = false;
};

class S3RandomAccessFile final : public RandomAccessFile {
 public:
  S3RandomAccessFile(std::shared_ptr<s3::Client> client, std::string key, std::string path,
                     uint64_t size)
      : client_(std::move(client)), key_(std::move(key)), path_(std::move(path)), size_(size) {}

  Status Read(uint64_t offset, size_t n, void* buf) const override {
    if (offset > size_ || n > size_ - offset) {
      return DataLoss(path_ + " has " + std::to_string(size_) + " bytes; cannot read " +
                          std::to_string(n) + " at offset " + std::to_string(offset),
                      {{"file", path_}});
    }
    ASSIGN_OR_RETURN(std::string bytes, client_->GetRange(key_, offset, n));
    if (n > 0) std::memcpy(buf, bytes.data(), n);
    return Status::Ok();
  }
  uint64_t Size() const override { return size_; }

 private:
  std::shared_ptr<s3::Client> client_;
  const std::string key_;
  const std::string path_;
  const uint64_t size_;
};

class S3Env final : public Env {
 public:
  explicit S3Env(S3EnvOptions options)
      : options_(std::move(options)), pool_(std::max(1, options_.upload_threads)) {
    options_.part_bytes = std::max<size_t>(options_.part_bytes, 5 << 20);
  }

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    ASSIGN_OR_RETURN(auto at, Open(path, /*want_key=*/true));
    return std::unique_ptr<WritableFile>(
        new S3WritableFile(at.first, at.second.key, path, options_, &pool_));
  }

  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override {
    ASSIGN_OR_RETURN(auto at, Open(path, /*want_key=*/true));
    auto size = at.first->Size(at.second.key);
    if (!size.ok()) return size.status().WithDetail("file", path);
    return std::unique_ptr<RandomAccessFile>(
        new S3RandomAccessFile(at.first, at.second.key, path, *size));
  }

  bool Exists(const std::string& path) override {
    auto at = Open(path, false);
    if (!at.ok()) return false;
    if (!at->second.key.empty() && at->first->Size(at->second.key).ok()) return true;
    return IsDirectory(path);
  }

  bool IsDirectory(const std::string& path) override {
    auto at = Open(path, false);
    if (!at.ok()) return false;
    std::vector<std::string> dirs;
    auto objects = at->first->List(DirPrefix(at->second.key), &dirs, 1);
    return objects.ok() && (!objects->empty() || !dirs.empty());
  }

  Result<std::vector<std::string>> ListDir(const std::string& dir) override {
    ASSIGN_OR_RETURN(auto at, Open(dir, false));
    const std::string prefix = DirPrefix(at.second.key);
    std::vector<std::string> dirs;
    ASSIGN_OR_RETURN(auto objects, at.first->List(prefix, &dirs));
    // A directory whose only content is an unfinished upload exists too: its
    // writer is at work (or died, and garbage collection must find it).
    // (Listed in full: RGW does not roll uploads up by delimiter, and there are few.)
    ASSIGN_OR_RETURN(auto uploads, at.first->ListUploads(prefix));
    std::set<std::string> names;
    for (const auto& o : objects) names.insert(o.key.substr(prefix.size()));
    for (const auto& [key, id] : uploads) {
      (void)id;
      std::string name = key.substr(prefix.size());
      names.insert(name.substr(0, name.find('/')));
    }
    for (const auto& d : dirs) {
      std::string name = d.substr(prefix.size());
      while (!name.empty() && name.back() == '/') name.pop_back();
      if (!name.empty()) names.insert(name);
    }
    return std::vector<std::string>(names.begin(), names.end());
  }

  Status CreateDirs(const std::string& dir) override {
    // Prefixes need no creating; this checks that the bucket is there and ours.
    ASSIGN_OR_RETURN(auto at, Open(dir, false));
    return at.first->List(DirPrefix(at.second.key), nullptr, 1).status();
  }

  Status DeleteFile(const std::string& path) override {
    ASSIGN_OR_RETURN(auto at, Open(path, true));
    return at.first->Delete(at.second.key);
  }

  Status DeleteTree(const std::string& dir) override {
    ASSIGN_OR_RETURN(auto at, Open(dir, true));
    const std::string prefix = DirPrefix(at.second.key);
    ASSIGN_OR_RETURN(auto uploads, at.first->ListUploads(prefix));
    for (const auto& [key, id] : uploads) RETURN_IF_ERROR(at.first->AbortUpload(key, id));
    ASSIGN_OR_RETURN(auto objects, at.first->List(prefix));
    std::vector<std::future<Status>> deletes;
    for (const auto& o : objects) {
      deletes.push_back(pool_.Submit([client = at.first, key = o.key] { return client->Delete(key); }));
    }
    Status first;
    for (auto& d : deletes) {
      Status st = d.get();
      if (first.ok() && !st.ok()) first = st;
    }
    return first;
  }

  Status Rename(const std::string& from, const std::string& to) override {
    return Internal("cannot rename " + from + " to " + to + ": object stores have no rename",
                    {{"file", from}});
  }

  Status SyncDir(const std::string&) override { return Status::Ok(); }

  Result<uint64_t> FileSize(const std::string& path) override {
    ASSIGN_OR_RETURN(auto at, Open(path, true));
    auto size = at.first->Size(at.second.key);
    if (!size.ok()) return size.status().WithDetail("file", path);
    return size;
  }

  bool IsObjectStore(const std::string&) override { return true; }

  Status PublishFile(const std::string& path, std::string_view data) override {
    ASSIGN_OR_RETURN(auto at, Open(path, true));
    return at.first->Put(at.second.key, data, /*if_absent=*/true);
  }

 private:
  // The bucket's client (made on first use) and the parsed path.
  Result<std::pair<std::shared_ptr<s3::Client>, Location>> Open(const std::string& path,
                                                                bool want_key) {
    Location loc = Parse(path);
    if (want_key && loc.key.empty()) {
      return InvalidArgument("'" + path + "' names a bucket, not an object", {{"file", path}});
    }
    MutexLock lock(mu_);
    auto it = clients_.find(loc.bucket);
    if (it == clients_.end()) {
      const std::string endpoint =
          options_.endpoint.empty() ? DefaultS3Endpoint() : options_.endpoint;
      auto config = s3::Config::FromEnvironment(loc.bucket, endpoint);
      if (!config.ok()) return config.status().WithContext("checkpoint store " + path);
      config->retry_budget_ms = options_.retry_budget_ms;
      it = clients_.emplace(loc.bucket, std::make_shared<s3::Client>(*config, options_.transport))
               .first;
    }
    return std::make_pair(it->second, std::move(loc));
  }

  S3EnvOptions options_;
  ThreadPool pool_;
  Mutex mu_;
  std::map<std::string, std::shared_ptr<s3::Client>> clients_ GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<Env> NewS3Env(S3EnvOptions options) {
  return std::make_unique<S3Env>(std::move(options));
}

bool IsS3Path(const std::string& path) { return path.rfind(kScheme, 0) == 0; }

void SetDefaultS3Endpoint(const std::string& endpoint) {
  std::lock_guard<std::mutex> lock(endpoint_mu);
  EndpointSetting() = endpoint;
}

std::string DefaultS3Endpoint() {
  {
    std::lock_guard<std::mutex> lock(endpoint_mu);
    if (!EndpointSetting().empty()) return EndpointSetting();
  }
  const char* e = std::getenv("TESSERA_S3_ENDPOINT");
  return e != nullptr ? e : "";
}

}  // namespace tessera::storage
