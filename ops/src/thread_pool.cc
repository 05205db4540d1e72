// A small thread pool for the C ABI (default_parallel_for).
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels.h"

namespace onnxq {

namespace {

class Pool {
 public:
  explicit Pool(int n) {
    for (int i = 0; i < n; ++i) workers_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return static_cast<int>(workers_.size()); }
  // Runs task(i) for i in [0, n) on the workers and the caller; returns when all are done.
  void run(int64_t n, const std::function<void(int64_t)>& task) {
    std::unique_lock<std::mutex> run_lock(run_mu_);  // one job at a time
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    auto body = [&] {
      for (int64_t i; (i = next.fetch_add(1)) < n;) {
        task(i);
        done.fetch_add(1);
      }
    };
    {
      std::lock_guard<std::mutex> lk(mu_);
      job_ = body;
      gen_++;
    }
    cv_.notify_all();
    body();
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return active_ == 0 && done.load() == n; });
    job_ = nullptr;
  }

 private:
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || (gen_ != seen && job_); });
        if (stop_) return;
        seen = gen_;
        job = job_;
        active_++;
      }
      job();
      {
        std::lock_guard<std::mutex> lk(mu_);
        active_--;
      }
      done_cv_.notify_all();
    }
  }
  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_, done_cv_;
  std::function<void()> job_;
  uint64_t gen_ = 0;
  int active_ = 0;
  bool stop_ = false;
};

Pool& pool() {
  static Pool p(std::max(0, static_cast<int>(std::thread::hardware_concurrency()) - 1));
  return p;
}

}  // namespace

ParallelFor default_parallel_for(int nthreads) {
  return [nthreads](int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    int workers = nthreads > 0 ? nthreads : pool().size() + 1;
    if (workers <= 1 || n == 1) {
      fn(0, n);
      return;
    }
    int64_t tasks = std::min<int64_t>(n, static_cast<int64_t>(workers) * 8);
    pool().run(tasks, [&](int64_t i) {
      int64_t b = n * i / tasks, e = n * (i + 1) / tasks;
      if (b < e) fn(b, e);
    });
  };
}

}  // namespace onnxq
