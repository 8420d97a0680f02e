#include "storage/chunk_ref.h"

#include <cctype>

namespace tessera::storage {
namespace {

bool AllDigits(std::string_view s) {
  if (s.empty() || s.size() > 19) return false;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// "step-<N>" or ".staging-<N>-<id>" (id: letters, digits and '-').
bool IsCheckpointDirName(std::string_view dir) {
  if (dir.starts_with("step-")) return AllDigits(dir.substr(5));
  if (!dir.starts_with(".staging-")) return false;
  std::string_view rest = dir.substr(9);
  const size_t dash = rest.find('-');
  if (dash == rest.npos || !AllDigits(rest.substr(0, dash))) return false;
  std::string_view id = rest.substr(dash + 1);
  if (id.empty() || id.size() > 64) return false;
  for (char c : id) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') return false;
  }
  return true;
}

}  // namespace

bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name.size() <= 255 && name.find('/') == std::string::npos &&
         name[0] != '.';
}

std::optional<ChunkRef> ParseChunkRef(const std::string& file) {
  if (!file.starts_with("../")) return std::nullopt;
  const std::string rest = file.substr(3);
  const size_t slash = rest.find('/');
  if (slash == std::string::npos) return std::nullopt;
  ChunkRef ref{rest.substr(0, slash), rest.substr(slash + 1)};
  if (!IsCheckpointDirName(ref.dir) || !IsPlainFileName(ref.name)) return std::nullopt;
  return ref;
}

std::string ResolveChunkFile(const std::string& dir, const std::string& file) {
  if (auto ref = ParseChunkRef(file)) return JoinPath(JoinPath(ParentDir(dir), ref->dir), ref->name);
  return JoinPath(dir, file);
}

}  // namespace tessera::storage
