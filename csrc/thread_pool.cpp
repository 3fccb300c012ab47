#include "thread_pool.h"

#include <algorithm>

#include <sched.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define MLXCEL_PAUSE() _mm_pause()
#else
#define MLXCEL_PAUSE() ((void)0)
#endif

namespace mlxcel {

namespace {
constexpr int kSpin = 2000;    // pause-spins (~50 us) before yielding
constexpr int kYield = 200;    // then yields before sleeping
}  // namespace

ThreadPool& ThreadPool::instance() {
  static ThreadPool* pool = new ThreadPool();  // leaked on purpose: no join at static destruction
  return *pool;
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(m_);
    stop_ = true;
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::ensure(int workers) {
  while (static_cast<int>(threads_.size()) < workers) {
    const int index = static_cast<int>(threads_.size()) + 1;
    // the generation it has seen is fixed here, before run() announces the job: a thread that
    // started late and read the new generation itself would skip the job and hang the caller
    const uint64_t seen = generation_.load();
    threads_.emplace_back([this, index, seen] { worker_loop(index, seen); });
  }
}

void ThreadPool::worker_loop(int index, uint64_t seen) {
  for (;;) {
    // wait for a new generation: spin, then yield, then sleep
    int tries = 0;
    while (generation_.load(std::memory_order_acquire) == seen) {
      if (tries < kSpin) {
        MLXCEL_PAUSE();
      } else if (tries < kSpin + kYield) {
        sched_yield();
      } else {
        std::unique_lock<std::mutex> lock(m_);
        sleepers_.fetch_add(1);
        cv_.wait(lock, [&] { return generation_.load() != seen || stop_; });
        sleepers_.fetch_sub(1);
      }
      ++tries;
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_) return;
    if (index < active_.load(std::memory_order_acquire)) {
      (*job_)(index);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }
}

void ThreadPool::run(int n, const std::function<void(int)>& f) {
  if (n <= 1) {
    f(0);
    return;
  }
  std::lock_guard<std::mutex> call(call_mutex_);
  ensure(n - 1);
  job_ = &f;
  active_.store(n, std::memory_order_release);
  pending_.store(n - 1, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(m_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  if (sleepers_.load() > 0) cv_.notify_all();
  f(0);
  int tries = 0;
  while (pending_.load(std::memory_order_acquire) > 0) {
    if (++tries < kSpin) MLXCEL_PAUSE();
    else sched_yield();
  }
  job_ = nullptr;
}

void run_ranges(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& run) {
  if (threads <= 1 || n <= 1) {
    run(0, n);
    return;
  }
  const int64_t chunk = (n + threads - 1) / threads;
  ThreadPool::instance().run(threads, [&](int t) { run(std::min(n, t * chunk), std::min(n, (t + 1) * chunk)); });
}

}  // namespace mlxcel
