#include "storage/root_epoch.h"

#include <algorithm>
#include <charconv>

namespace tessera::storage {
namespace {

constexpr std::string_view kEpochPrefix = "epoch-";
constexpr std::string_view kEpochSuffix = ".json";
constexpr std::string_view kLeaseSuffix = ".lease";
constexpr std::string_view kFormatPrefix = "tessera-root/";

// "epoch-<n><suffix>" → n; 0 for any other name.
int64_t ParseEpochName(std::string_view name, std::string_view suffix) {
  if (!name.starts_with(kEpochPrefix) || !name.ends_with(suffix)) return 0;
  std::string_view digits = name.substr(kEpochPrefix.size());
  digits.remove_suffix(suffix.size());
  if (digits.empty() || digits[0] == '0') return 0;
  int64_t n = 0;
  auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  return ec == std::errc() && p == digits.data() + digits.size() ? n : 0;
}

Result<std::vector<std::string>> ListEpochDir(Env* env, const std::string& root) {
  const std::string dir = EpochDir(root);
  if (!env->IsObjectStore(root) && !env->IsDirectory(dir)) return std::vector<std::string>{};
  auto names = env->ListDir(dir);
  if (!names.ok() && names.status().code() == Code::kNotFound) return std::vector<std::string>{};
  return names;
}

Status CheckFormat(const Json& doc, const std::string& path) {
  const std::string format = doc.value("format", "");
  int version = 0;
  if (format.starts_with(kFormatPrefix)) {
    const char* b = format.data() + kFormatPrefix.size();
    std::from_chars(b, format.data() + format.size(), version);
  }
  if (version <= 0) {
    return DataLoss(path + " is not a tessera epoch file (format \"" + format + "\")", {{"file", path}});
  }
  if (version > kRootFormatVersion) {
    return InvalidArgument(
        "the checkpoint root was written by a newer tessera: " + path + " has format " + format +
            ", this tesserad knows tessera-root/" + std::to_string(kRootFormatVersion) +
            " and older; upgrade it",
        {{"file", path}, {"format", format}});
  }
  return Status::Ok();
}

}  // namespace

std::string EpochDoc::holder_url() const {
  const Json holder = doc.value("holder", Json::object());
  return holder.is_object() ? holder.value("url", "") : "";
}

std::string EpochDir(const std::string& root) { return JoinPath(root, ".tesserad"); }

std::string EpochPath(const std::string& root, int64_t epoch) {
  return JoinPath(EpochDir(root),
                  std::string(kEpochPrefix) + std::to_string(epoch) + std::string(kEpochSuffix));
}

std::string LeasePath(const std::string& root, int64_t epoch) {
  return JoinPath(EpochDir(root),
                  std::string(kEpochPrefix) + std::to_string(epoch) + std::string(kLeaseSuffix));
}

Result<std::optional<EpochDoc>> ReadNewestEpoch(Env* env, const std::string& root) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListEpochDir(env, root));
  std::vector<int64_t> epochs;
  for (const auto& n : names) {
    if (int64_t e = ParseEpochName(n, kEpochSuffix); e > 0) epochs.push_back(e);
  }
  if (epochs.empty()) return std::optional<EpochDoc>();
  const int64_t newest = *std::max_element(epochs.begin(), epochs.end());
  const std::string path = EpochPath(root, newest);
  ASSIGN_OR_RETURN(std::string text, ReadWholeFile(env, path));
  Json doc = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) return DataLoss(path + " is not a JSON object", {{"file", path}});
  RETURN_IF_ERROR(CheckFormat(doc, path));
  return std::optional<EpochDoc>(EpochDoc{newest, std::move(doc)});
}

Status CreateEpoch(Env* env, const std::string& root, int64_t epoch, const Json& doc) {
  RETURN_IF_ERROR(env->CreateDirs(EpochDir(root)));
  const std::string path = EpochPath(root, epoch);
  Status st = env->PublishFile(path, doc.dump());
  if (st.code() == Code::kConflict) {
    std::string holder = "another control plane";
    if (auto text = ReadWholeFile(env, path); text.ok()) {
      Json there = Json::parse(*text, nullptr, false);
      if (there.is_object()) holder = EpochDoc{epoch, there}.holder_url();
    }
    return Conflict("epoch " + std::to_string(epoch) + " of checkpoint root " + root +
                        " was taken first by " + holder,
                    {{"file", path}, {"holder", holder}});
  }
  return st.WithContext("epoch file " + path);
}

Result<bool> EpochTaken(Env* env, const std::string& root, int64_t epoch) {
  const std::string path = EpochPath(root, epoch);
  if (!env->IsObjectStore(root)) return env->Exists(path);
  auto size = env->FileSize(path);
  if (size.ok()) return true;
  if (size.status().code() == Code::kNotFound) return false;
  return size.status().WithContext("epoch file " + path);
}

Result<std::string> ReadLease(Env* env, const std::string& root, int64_t epoch) {
  auto text = ReadWholeFile(env, LeasePath(root, epoch));
  if (!text.ok() && text.status().code() == Code::kNotFound) return std::string();
  return text;
}

Status WriteLease(Env* env, const std::string& root, int64_t epoch, const Json& lease) {
  // Written in place: a reader that catches it half-written sees a change, which is
  // what a renewal is.
  const std::string path = LeasePath(root, epoch);
  const std::string text = lease.dump();
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env->NewWritableFile(path));
  RETURN_IF_ERROR(file->Append(text.data(), text.size()));
  return file->Close();
}

Result<std::vector<std::string>> PruneEpochs(Env* env, const std::string& root, int64_t keep_from) {
  std::vector<std::string> removed;
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListEpochDir(env, root));
  for (const auto& n : names) {
    int64_t e = ParseEpochName(n, kEpochSuffix);
    if (e == 0) e = ParseEpochName(n, kLeaseSuffix);
    if (e == 0 || e >= keep_from) continue;
    const std::string path = JoinPath(EpochDir(root), n);
    Status st = env->DeleteFile(path);
    if (!st.ok() && st.code() != Code::kNotFound) return st.WithContext("epoch file " + path);
    removed.push_back(path);
  }
  return removed;
}

int64_t EpochOfJobId(std::string_view id) {
  if (!id.starts_with("j")) return 0;
  const size_t dash = id.find('-');
  if (dash == std::string_view::npos || dash == 1) return 0;
  int64_t n = 0;
  auto [p, ec] = std::from_chars(id.data() + 1, id.data() + dash, n);
  return ec == std::errc() && p == id.data() + dash ? n : 0;
}

}  // namespace tessera::storage
