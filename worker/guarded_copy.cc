#include "worker/guarded_copy.h"

#include <csetjmp>
#include <csignal>
#include <cstring>
#include <mutex>

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxh_x86dispatch.h>

namespace tessera::worker {
namespace {

// Blocks small enough to be hashed from cache right after they are copied.
constexpr size_t kBlock = size_t{32} << 10;

thread_local sigjmp_buf* t_guard = nullptr;
struct sigaction g_previous {};

void OnSigbus(int sig, siginfo_t* info, void* context) {
  if (t_guard != nullptr) siglongjmp(*t_guard, 1);
  // Not a guarded copy's: what the process had before, or its default end.
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler == SIG_DFL || g_previous.sa_handler == SIG_IGN) {
    signal(sig, SIG_DFL);
    raise(sig);
  } else {
    g_previous.sa_handler(sig);
  }
}

void InstallOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = OnSigbus;
    // Not blocked while handled; the jump restores the mask saved where the copy
    // began besides (a runtime that wraps handlers may block it all the same).
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &g_previous);
  });
}

// Out of line, so that nothing of it is kept in registers across the jump. A null
// `dst` only checksums.
__attribute__((noinline)) void CopyBlocks(uint8_t* dst, const uint8_t* src, size_t n, XXH3_state_t* state) {
  if (dst == nullptr) {
    XXH3_64bits_update_dispatch(state, src, n);
    return;
  }
  if (state == nullptr) {
    std::memcpy(dst, src, n);
    return;
  }
  for (size_t at = 0; at < n; at += kBlock) {
    const size_t take = n - at < kBlock ? n - at : kBlock;
    std::memcpy(dst + at, src + at, take);
    XXH3_64bits_update_dispatch(state, dst + at, take);
  }
}

__attribute__((noinline)) bool SameBytes(const uint8_t* a, const uint8_t* b, size_t n) {
  return std::memcmp(a, b, n) == 0;
}

// Runs `body` with SIGBUS turned into a false answer.
template <typename Body>
bool Guarded(Body&& body) {
  InstallOnce();
  sigjmp_buf here;
  sigjmp_buf* const outer = t_guard;
  if (sigsetjmp(here, 1) != 0) {
    t_guard = outer;
    return false;
  }
  t_guard = &here;
  body();
  t_guard = outer;
  return true;
}

}  // namespace

uint64_t Checksum64(const void* data, size_t n) { return XXH3_64bits_dispatch(data, n); }

Checksum64Stream::Checksum64Stream() : state_(XXH3_createState()) {
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

Checksum64Stream::~Checksum64Stream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Checksum64Stream::Update(const void* data, size_t n) {
  XXH3_64bits_update_dispatch(static_cast<XXH3_state_t*>(state_), data, n);
}

uint64_t Checksum64Stream::Digest() const { return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_)); }

bool GuardedChecksum(const uint8_t* data, size_t n, uint64_t* checksum) {
  return GuardedCopy(nullptr, data, n, checksum);
}

bool GuardedCopy(uint8_t* dst, const uint8_t* src, size_t n, uint64_t* checksum) {
  XXH3_state_t state;
  if (checksum != nullptr) XXH3_64bits_reset(&state);
  if (n == 0) {
    if (checksum != nullptr) *checksum = XXH3_64bits_digest(&state);
    return true;
  }
  if (!Guarded([&] { CopyBlocks(dst, src, n, checksum != nullptr ? &state : nullptr); })) return false;
  if (checksum != nullptr) *checksum = XXH3_64bits_digest(&state);
  return true;
}

bool GuardedEqual(const uint8_t* a, const uint8_t* b, size_t n, bool* equal) {
  *equal = true;
  if (n == 0) return true;
  bool same = true;
  if (!Guarded([&] { same = SameBytes(a, b, n); })) return false;
  *equal = same;
  return true;
}

}  // namespace tessera::worker
