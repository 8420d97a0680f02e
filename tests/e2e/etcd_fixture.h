// One throwaway etcd member per test (tools/etcd/etcd.sh, Debian's etcd-server), on a
// free port of 127.0.0.1, for the HA tests. A test that finds etcd missing fails with
// the script's own error.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace tessera::e2e {

class Etcd {
 public:
  Etcd() {
    static int n = 0;
    dir_ = "/tmp/tessera-etcd-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
    const std::string cmd = "bash " + Script() + " start " + dir_ + " 0 >" + dir_ + ".out 2>" + dir_ + ".err";
    if (std::system(cmd.c_str()) != 0) {
      error_ = "tools/etcd/etcd.sh could not start etcd: " + Read(dir_ + ".err");
      return;
    }
    std::ifstream out(dir_ + ".out");
    const std::string prefix = "export TESSERA_ETCD=";
    for (std::string line; std::getline(out, line);) {
      if (line.rfind(prefix, 0) == 0) url_ = line.substr(prefix.size());
    }
    if (url_.empty()) error_ = "tools/etcd/etcd.sh printed no TESSERA_ETCD: " + Read(dir_ + ".out");
  }
  ~Etcd() {
    (void)std::system(("bash " + Script() + " stop " + dir_ + " >/dev/null 2>&1").c_str());
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    std::filesystem::remove(dir_ + ".out", ec);
    std::filesystem::remove(dir_ + ".err", ec);
  }
  const std::string& url() const { return url_; }  // etcd://127.0.0.1:PORT
  const std::string& error() const { return error_; }

 private:
  // The script's path, quoted for the shell (a checkout's path may hold spaces).
  static std::string Script() { return "'" + std::string(TESSERA_SOURCE_DIR) + "/tools/etcd/etcd.sh'"; }
  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  std::string dir_, url_, error_;
};

}  // namespace tessera::e2e
