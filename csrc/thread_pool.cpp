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
constexpr int kSpin = 10000;        // pause-spins (~200 us) before sleeping
constexpr int kTasksPerThread = 4;  // run_ranges: ranges a thread, so a late thread's share is taken by others
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
    const uint64_t seen = generation_.load();
    threads_.emplace_back([this, seen] { worker_loop(seen); });
  }
}

// Take and run tasks until none is left. Only called while open_ (see worker_loop).
void ThreadPool::drain() {
  const int n = tasks_.load(std::memory_order_acquire);
  for (int i = next_.fetch_add(1, std::memory_order_acq_rel); i < n; i = next_.fetch_add(1, std::memory_order_acq_rel)) {
    (*job_)(i);
    done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::worker_loop(uint64_t seen) {
  for (;;) {
    // wait for a new call: spin, then yield, then sleep
    int tries = 0;
    while (generation_.load(std::memory_order_acquire) == seen) {
      if (tries < kSpin) {
        MLXCEL_PAUSE();
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
    // Dekker with run(): the caller clears open_ and then waits for inside_ to reach 0, a worker
    // counts itself in and then reads open_ (both sequentially consistent), so a worker that
    // woke late either sees the job closed or is waited for; it never reads a finished call's job
    inside_.fetch_add(1);
    if (open_.load()) drain();
    inside_.fetch_sub(1);
  }
}

void ThreadPool::run(int tasks, int threads, const std::function<void(int)>& f) {
  if (tasks <= 0) return;
  if (threads <= 1 || tasks == 1) {
    for (int i = 0; i < tasks; ++i) f(i);
    return;
  }
  std::lock_guard<std::mutex> call(call_mutex_);
  ensure(threads - 1);
  job_ = &f;
  tasks_.store(tasks);
  next_.store(0);
  done_.store(0);
  open_.store(true);
  {
    std::lock_guard<std::mutex> lock(m_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  if (sleepers_.load() > 0) cv_.notify_all();
  drain();
  int tries = 0;
  // tasks a worker took and is still running: spin, then yield (a worker pinned to this core
  // finishes only when this thread lets it run)
  while (done_.load(std::memory_order_acquire) < tasks) {
    if (++tries < kSpin) MLXCEL_PAUSE();
    else sched_yield();
  }
  open_.store(false);
  while (inside_.load() > 0) MLXCEL_PAUSE();
  job_ = nullptr;
}

void run_ranges(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& run) {
  if (threads <= 1 || n <= 1) {
    run(0, n);
    return;
  }
  const int64_t parts = std::min<int64_t>(n, static_cast<int64_t>(threads) * kTasksPerThread);
  const int64_t chunk = (n + parts - 1) / parts;
  const int tasks = static_cast<int>((n + chunk - 1) / chunk);
  ThreadPool::instance().run(tasks, threads, [&](int t) { run(t * chunk, std::min(n, (t + 1) * chunk)); });
}

}  // namespace mlxcel
