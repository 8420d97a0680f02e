// One throwaway Ceph RGW per test binary, started by tools/s3/rgw.sh (label s3;
// needs root and Debian's ceph packages). Tests that find it missing fail with
// the script's own error.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "storage/s3/client.h"

namespace tessera::storage::s3 {

inline std::string SourceDir() { return TESSERA_SOURCE_DIR; }

// One RGW for the whole binary: about 20 s to start.
class Rgw : public ::testing::Environment {
 public:
  void SetUp() override {
    dir_ = "/var/tmp/tessera-rgw-test-" + std::to_string(getpid());
    // Quoted: a checkout's path may hold spaces.
    const std::string cmd = "bash '" + SourceDir() + "/tools/s3/rgw.sh' start " + dir_ + " 0 >" +
                            dir_ + ".out 2>" + dir_ + ".err";
    if (std::system(cmd.c_str()) != 0) {
      std::ifstream err(dir_ + ".err");
      std::string text((std::istreambuf_iterator<char>(err)), {});
      error_ = "tools/s3/rgw.sh could not start RGW: " + text;
      return;
    }
    std::ifstream out(dir_ + ".out");
    for (std::string line; std::getline(out, line);) {
      // export NAME=VALUE
      const size_t eq = line.find('=');
      if (line.rfind("export ", 0) != 0 || eq == std::string::npos) continue;
      vars_[line.substr(7, eq - 7)] = line.substr(eq + 1);
    }
  }
  void TearDown() override {
    (void)std::system(("bash '" + SourceDir() + "/tools/s3/rgw.sh' stop " + dir_ + " >/dev/null 2>&1")
                          .c_str());
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    std::filesystem::remove(dir_ + ".out", ec);
    std::filesystem::remove(dir_ + ".err", ec);
  }

  static Config ConfigFor(const std::string& bucket) {
    Config c;
    c.endpoint = vars_["TESSERA_S3_ENDPOINT"];
    c.bucket = bucket;
    c.region = vars_.count("AWS_REGION") ? vars_["AWS_REGION"] : "us-east-1";
    c.credentials = {vars_["AWS_ACCESS_KEY_ID"], vars_["AWS_SECRET_ACCESS_KEY"], ""};
    c.retry_budget_ms = 2000;
    return c;
  }
  static const std::string& error() { return error_; }
  // Exports the endpoint and credentials, as a process configured for the store has them.
  static void Export() {
    for (const auto& [name, value] : vars_) setenv(name.c_str(), value.c_str(), 1);
  }

 private:
  std::string dir_;
  static inline std::map<std::string, std::string> vars_;
  static inline std::string error_;
};

}  // namespace tessera::storage::s3
