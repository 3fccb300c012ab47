// A tiny fork-join pool for the kernels, instead of OpenMP.
//
// Why not OpenMP: libgomp's idle workers spin without yielding. With two processes on two cores
// (a test suite and a CLI, two servers, a busy host) spinning workers hold the cores the other
// process needs and a fork-join waits a scheduler slice for a descheduled thread: a decode step
// ran about 10x slower. Here a waiting thread spins briefly with `pause`, then yields its core on
// each try, then sleeps on a condition variable; between the kernel calls of one decode step
// (tens of microseconds apart) the worker is still spinning and starts at once.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mlxcel {

class ThreadPool {
 public:
  // Run f(0..n-1), f(0) on the calling thread; returns when all are done. Calls are serialized.
  void run(int n, const std::function<void(int)>& f);
  static ThreadPool& instance();
  ~ThreadPool();

 private:
  void ensure(int workers);
  void worker_loop(int index, uint64_t seen);

  std::mutex call_mutex_;  // one run() at a time
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<std::thread> threads_;
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> active_{0};  // workers taking part in the current job
  std::atomic<int> pending_{0};  // of those, not finished yet
  std::atomic<int> sleepers_{0};
  bool stop_ = false;
};

// run(begin, end) over [0, n) cut into `threads` even ranges, one per thread (threads <= 1: the
// whole range here). Callers decide the thread count from their own work estimate.
void run_ranges(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& run);

}  // namespace mlxcel
