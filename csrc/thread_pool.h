// A tiny work-sharing pool for the kernels, instead of OpenMP.
//
// Why not OpenMP: libgomp's idle workers spin without yielding. With two processes on two cores
// (a test suite and a CLI, two servers, a busy host) spinning workers hold the cores the other
// process needs and a fork-join waits a scheduler slice for a descheduled thread: a decode step
// ran about 10x slower. Here an idle worker spins with `pause` for about 200 us, then sleeps on a
// condition variable; between the kernel calls of one decode step (microseconds apart) it is
// still spinning and starts at once. It never calls sched_yield: beside a busy process a yield
// hands the core over for a whole time slice.
//
// Why tasks are taken, not handed out: a call is cut into more tasks than threads and every
// thread, the caller included, takes the next untaken task until none is left. A worker the
// scheduler has not run yet (another process holds its core) takes nothing, and the caller does
// its share instead of waiting a time slice for it: with one busy process beside a 2-thread
// decode, fixed per-thread ranges made each of the ~120 kernel calls of a step wait ~4 ms (500
// ms a step); taken tasks bound the wait to one task a thread already started.
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
  // Run f(0..tasks-1), each exactly once, on up to `threads` threads (the caller is one of them);
  // returns when all are done. Which thread runs which task is not fixed. Calls are serialized.
  void run(int tasks, int threads, const std::function<void(int)>& f);
  static ThreadPool& instance();
  ~ThreadPool();

 private:
  void ensure(int workers);
  void worker_loop(uint64_t seen);
  void drain();

  std::mutex call_mutex_;  // one run() at a time
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<std::thread> threads_;
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};  // bumped per call: wakes the workers
  std::atomic<int> tasks_{0}, next_{0}, done_{0};
  std::atomic<bool> open_{false};  // job_ and tasks_ are valid and tasks may be taken
  std::atomic<int> inside_{0};     // workers between checking open_ and leaving the job
  std::atomic<int> sleepers_{0};
  bool stop_ = false;
};

// run(begin, end) over [0, n) cut into even ranges, a few per thread (threads <= 1 or n <= 1: the
// whole range here). Callers decide the thread count from their own work estimate.
void run_ranges(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& run);

}  // namespace mlxcel
