// Clang's thread-safety analysis (-Wthread-safety): the attribute macros and a
// mutex, scoped lock and condition variable that carry them.
//
// Members protected by a mutex are declared `T x_ GUARDED_BY(mu_);`, functions
// that must run with it held `REQUIRES(mu_)`, and the mutex is a tessera::Mutex
// (libstdc++'s std::mutex has no annotations, so clang could check nothing).
// A clang build then rejects unlocked access at compile time; other compilers
// see the macros expand to nothing.
//
// Waiting: `while (!ready_) cv_.Wait(mu_);` with the lock held, not a predicate
// lambda (a lambda is analysed as a function of its own, which holds no lock).
// A lambda called with the lock held is declared `[&]() REQUIRES(mu_) { ... }`.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define TESSERA_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define TESSERA_THREAD_ANNOTATION(x)
#endif

// A type that is a lock ("mutex" in diagnostics).
#define CAPABILITY(x) TESSERA_THREAD_ANNOTATION(capability(x))
// An RAII type that holds a capability for its lifetime.
#define SCOPED_CAPABILITY TESSERA_THREAD_ANNOTATION(scoped_lockable)
// The member is read and written only with `x` held.
#define GUARDED_BY(x) TESSERA_THREAD_ANNOTATION(guarded_by(x))
// The pointee (not the pointer) is guarded by `x`.
#define PT_GUARDED_BY(x) TESSERA_THREAD_ANNOTATION(pt_guarded_by(x))
// Callers hold the capabilities (exclusively, resp. at least shared).
#define REQUIRES(...) TESSERA_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) TESSERA_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
// The function acquires / releases the capabilities (none named: `this`).
#define ACQUIRE(...) TESSERA_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) TESSERA_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define RELEASE(...) TESSERA_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) TESSERA_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
// Acquires when the function returns the first argument (true / false).
#define TRY_ACQUIRE(...) TESSERA_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
// Callers must not hold the capabilities (the function takes them itself).
#define EXCLUDES(...) TESSERA_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// The function returns a reference to the capability.
#define RETURN_CAPABILITY(x) TESSERA_THREAD_ANNOTATION(lock_returned(x))
// Tells the analysis the capability is held here (checked by the caller's logic).
#define ASSERT_CAPABILITY(x) TESSERA_THREAD_ANNOTATION(assert_capability(x))
// Turns the analysis off for one function. Last resort: say why next to it.
#define NO_THREAD_SAFETY_ANALYSIS TESSERA_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace tessera {

// std::mutex with annotations. BasicLockable and Lockable, so the std lock
// types accept it too, but the analysis sees only MutexLock and direct calls.
class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }
  bool try_lock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis that this thread holds the mutex where it cannot see
  // the lock (e.g. an object holds it across calls). No runtime check.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

  // The wrapped mutex, for waiting on a std::condition_variable (CondVar).
  std::mutex& native() { return mu_; }

 private:
  std::mutex mu_;
};

// Holds a Mutex from construction to destruction, except between unlock() and
// the next lock(), which a scope may use to drop the mutex for a while.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  // Takes over a mutex the caller already holds (after a successful try_lock()).
  MutexLock(Mutex& mu, std::adopt_lock_t) REQUIRES(mu) : mu_(mu) {}
  ~MutexLock() RELEASE() {
    if (locked_) mu_.unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void lock() ACQUIRE() {
    mu_.lock();
    locked_ = true;
  }
  void unlock() RELEASE() {
    mu_.unlock();
    locked_ = false;
  }

 private:
  Mutex& mu_;
  bool locked_ = true;
};

// std::condition_variable for a Mutex. Each wait atomically releases `mu`,
// blocks, and holds `mu` again when it returns (also spuriously: wait in a loop
// that checks the condition).
class CondVar {
 public:
  void Wait(Mutex& mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.native(), std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // false once `deadline` has passed.
  template <class Clock, class Duration>
  bool WaitUntil(Mutex& mu, const std::chrono::time_point<Clock, Duration>& deadline) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.native(), std::adopt_lock);
    const bool woken = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return woken;
  }
  // false once `timeout` has passed.
  template <class Rep, class Period>
  bool WaitFor(Mutex& mu, const std::chrono::duration<Rep, Period>& timeout) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.native(), std::adopt_lock);
    const bool woken = cv_.wait_for(lock, timeout) == std::cv_status::no_timeout;
    lock.release();
    return woken;
  }

  void NotifyOne() noexcept { cv_.notify_one(); }
  void NotifyAll() noexcept { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace tessera
