// A fixed-size thread pool. Compression and decompression run here so that
// the calling thread can keep the disk busy at the same time.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <future>
#include <list>
#include <memory>
#include <thread>
#include <vector>

#include "api/thread_annotations.h"

namespace tessera::storage {

class ThreadPool {
 public:
  // `threads` ≥ 1 worker threads.
  explicit ThreadPool(int threads);
  // Waits for queued tasks to finish.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  template <typename F>
  auto Submit(F fn) -> std::future<decltype(fn())> {
    using R = decltype(fn());
    auto task = std::make_shared<std::packaged_task<R()>>(std::move(fn));
    std::future<R> fut = task->get_future();
    Enqueue([task] { (*task)(); });
    return fut;
  }

  int size() const { return static_cast<int>(threads_.size()); }

 private:
  void Enqueue(std::function<void()> fn) EXCLUDES(mu_);
  void Loop() EXCLUDES(mu_);

  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> queue_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// Threads for long-running work started on demand (jobs, worker tasks).
// Finished threads are joined at the next Spawn, so a long-lived process does
// not accumulate them; JoinAll waits for the rest. Thread-safe.
class ThreadSet {
 public:
  ThreadSet() = default;
  ~ThreadSet() { JoinAll(); }
  ThreadSet(const ThreadSet&) = delete;
  ThreadSet& operator=(const ThreadSet&) = delete;

  void Spawn(std::function<void()> fn);
  void JoinAll();
  // Threads not yet joined (running, or finished since the last Spawn).
  size_t size();

 private:
  struct Entry {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  Mutex mu_;
  std::list<Entry> threads_ GUARDED_BY(mu_);
};

}  // namespace tessera::storage
