#include "storage/thread_pool.h"

namespace tessera::storage {

ThreadPool::ThreadPool(int threads) {
  if (threads < 1) threads = 1;
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  for (auto& t : threads_) t.join();
}

void ThreadPool::Enqueue(std::function<void()> fn) {
  {
    MutexLock lock(mu_);
    queue_.push_back(std::move(fn));
  }
  cv_.NotifyOne();
}

void ThreadPool::Loop() {
  while (true) {
    std::function<void()> fn;
    {
      MutexLock lock(mu_);
      while (!stop_ && queue_.empty()) cv_.Wait(mu_);
      if (queue_.empty()) return;
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
  }
}

void ThreadSet::Spawn(std::function<void()> fn) {
  MutexLock lock(mu_);
  for (auto it = threads_.begin(); it != threads_.end();) {
    if (it->done->load()) {
      it->thread.join();  // already finished: returns at once
      it = threads_.erase(it);
    } else {
      ++it;
    }
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  threads_.push_back({std::thread([fn = std::move(fn), done] {
                        fn();
                        done->store(true);
                      }),
                      done});
}

void ThreadSet::JoinAll() {
  std::list<Entry> all;
  {
    MutexLock lock(mu_);
    all.swap(threads_);
  }
  for (auto& e : all) e.thread.join();
}

size_t ThreadSet::size() {
  MutexLock lock(mu_);
  return threads_.size();
}

}  // namespace tessera::storage
