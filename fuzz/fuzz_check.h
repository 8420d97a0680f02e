// Checks inside fuzz targets: a broken property prints what broke and aborts,
// which libFuzzer reports as a crash (saving the input) and a replay as a failure.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "api/status.h"

namespace tessera::fuzz {

[[noreturn]] inline void Fail(const char* file, int line, const char* cond, const std::string& what) {
  std::fprintf(stderr, "%s:%d: check failed: %s\n  %s\n", file, line, cond, what.c_str());
  std::abort();
}

// Every error a decoder of untrusted input returns must be one of `allowed`
// codes and carry a details object (so that REST errors name their culprit).
inline bool IsCleanError(const Status& st, std::initializer_list<Code> allowed) {
  if (st.ok()) return true;
  bool code_ok = false;
  for (Code c : allowed) code_ok = code_ok || st.code() == c;
  return code_ok && st.details().is_object() && !st.details().empty();
}

}  // namespace tessera::fuzz

#define FUZZ_CHECK(cond, what)                                        \
  do {                                                                \
    if (!(cond)) ::tessera::fuzz::Fail(__FILE__, __LINE__, #cond, (what)); \
  } while (0)
