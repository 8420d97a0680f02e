#include "http/bearer_token.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "api/json_codec.h"

namespace tessera::http {

Status CheckOwnerOnly(const std::string& path, const std::string& what, const std::string& field) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, "stat " + what, path).WithDetail("field", field);
  const Json where = {{"field", field}, {"file", path}};
  if (!S_ISREG(st.st_mode)) {
    return Status(Code::kInvalidArgument, what + " " + path + " is not a regular file", where);
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return Status(Code::kInvalidArgument,
                  what + " " + path + " has mode " + mode +
                      ": other users could read or change it; chmod 600 it",
                  where);
  }
  return Status::Ok();
}

Result<std::string> ReadTokenFile(const std::string& path) {
  const Json where = {{"field", "token-file"}, {"file", path}};
  RETURN_IF_ERROR(CheckOwnerOnly(path, "the token file", "token-file"));
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "read the token file", path).WithDetail("field", "token-file");
  std::string out(4096, '\0');
  const ssize_t n = ::read(fd, out.data(), out.size());
  const int err = errno;
  ::close(fd);
  if (n < 0) return ErrnoStatus(err, "read the token file", path).WithDetail("field", "token-file");
  out.resize(static_cast<size_t>(n));
  out = out.substr(0, out.find('\n'));
  while (!out.empty() && (out.back() == '\r' || out.back() == ' ' || out.back() == '\t')) {
    out.pop_back();
  }
  if (out.empty()) return Status(Code::kInvalidArgument, "the token file " + path + " is empty", where);
  return out;
}

Result<ChosenToken> ChooseToken(const std::string& flag, const std::string& file,
                                const std::string& program) {
  if (!flag.empty() && !file.empty()) {
    return InvalidArgument("give the token once: --token-file or --token, not both",
                           {{"field", "token"}});
  }
  if (!file.empty()) {
    ASSIGN_OR_RETURN(std::string token, ReadTokenFile(file));
    return ChosenToken{std::move(token), "--token-file " + file};
  }
  if (!flag.empty()) {
    std::fprintf(stderr,
                 "%s: warning: --token puts the cluster's secret on the command line, where every "
                 "user of this host can read it (/proc/<pid>/cmdline); use --token-file or "
                 "TESSERA_TOKEN instead\n",
                 program.c_str());
    return ChosenToken{flag, "--token"};
  }
  if (const char* env = std::getenv("TESSERA_TOKEN"); env != nullptr && *env != '\0') {
    return ChosenToken{env, "TESSERA_TOKEN"};
  }
  return ChosenToken{};
}

bool BearerMatches(const std::string& header, const std::string& token) {
  const std::string prefix = "Bearer ";
  if (header.size() != prefix.size() + token.size() || header.compare(0, prefix.size(), prefix)) {
    return false;
  }
  unsigned char diff = 0;
  for (size_t i = 0; i < token.size(); ++i) diff |= header[prefix.size() + i] ^ token[i];
  return diff == 0;
}

}  // namespace tessera::http
