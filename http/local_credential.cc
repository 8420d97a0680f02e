#include "http/local_credential.h"

#include <fcntl.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace tessera::http {

std::string DefaultLocalCredentialPath(int port) {
  return "/tmp/tessera-" + std::to_string(::getuid()) + "/local-" + std::to_string(port) + ".key";
}

Result<std::string> NewLocalCredential() {
  unsigned char raw[32];
  if (RAND_bytes(raw, sizeof(raw)) != 1) return Internal("no random bytes for a local credential");
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : raw) {
    out += hex[c >> 4];
    out += hex[c & 15];
  }
  return out;
}

Status WriteLocalCredential(const std::string& path, const std::string& credential) {
  const std::string dir = path.substr(0, path.rfind('/'));
  if (!dir.empty()) {
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoStatus(errno, "create the local credential directory", dir);
    }
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0) return ErrnoStatus(errno, "stat", dir);
    if (!S_ISDIR(st.st_mode) || st.st_uid != ::getuid() || (st.st_mode & 0022) != 0) {
      return Status(Code::kInvalidArgument,
                    "the local credential directory " + dir +
                        " must be a directory of this user that others cannot write to",
                    {{"field", "local-credential"}, {"file", dir}});
    }
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return ErrnoStatus(errno, "create", tmp);
  ::fchmod(fd, 0600);  // whatever the umask
  const bool ok = ::write(fd, credential.data(), credential.size()) ==
                  static_cast<ssize_t>(credential.size());
  const int err = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, "write", tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(e, "rename to", path);
  }
  return Status::Ok();
}

Result<std::string> ReadLocalCredential(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "read the local credential", path);
  char buf[256];
  ssize_t n = ::read(fd, buf, sizeof(buf));
  ::close(fd);
  if (n < 0) return ErrnoStatus(errno, "read the local credential", path);
  std::string out(buf, static_cast<size_t>(n));
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r' || out.back() == ' ')) out.pop_back();
  return out;
}

std::string FindLocalCredential(const std::string& url) {
  std::string path;
  if (const char* env = std::getenv("TESSERA_LOCAL_CREDENTIAL"); env != nullptr && *env != '\0') {
    path = env;
  } else {
    size_t colon = url.rfind(':');
    if (colon == std::string::npos) return "";
    int port = std::atoi(url.c_str() + colon + 1);
    if (port <= 0) return "";
    path = DefaultLocalCredentialPath(port);
  }
  auto r = ReadLocalCredential(path);
  return r.ok() ? *r : "";
}

}  // namespace tessera::http
