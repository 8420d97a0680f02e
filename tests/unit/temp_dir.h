// A fresh directory under /tmp for one test, removed with all it holds when the object
// goes: declare it before whatever writes into it, so that it goes last.
#pragma once

#include <stdlib.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "storage/env.h"

namespace tessera::testing {

class TempDir {
 public:
  // /tmp/<name>.XXXXXX; a test cannot go on without it, so a failure aborts, named.
  explicit TempDir(const std::string& name) : path_("/tmp/" + name + ".XXXXXX") {
    if (::mkdtemp(path_.data()) == nullptr) {
      std::perror(("mkdtemp " + path_).c_str());
      std::abort();
    }
  }
  ~TempDir() { (void)storage::DefaultEnv()->DeleteTree(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace tessera::testing
