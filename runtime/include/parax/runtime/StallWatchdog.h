// StallWatchdog.h - ends the job when a blocking MPI operation never
// returns (a rank stalled, exited early, or an executable whose ranks do not
// pair their sends and receives), instead of hanging forever.

#ifndef PARAX_RUNTIME_STALLWATCHDOG_H
#define PARAX_RUNTIME_STALLWATCHDOG_H

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace parax::runtime {

/// A background thread that, while armed for longer than the timeout,
/// prints "parax-run: rank R: <operation> has not finished after S s" and
/// ends the process with status 1 (mpirun then ends the whole job). Armed
/// around each blocking operation through `watch`: two atomic stores, no
/// wake-up (the thread looks every 100 ms, or a quarter of the timeout).
class StallWatchdog {
public:
  StallWatchdog(int rank, double timeoutSeconds);
  ~StallWatchdog();
  StallWatchdog(const StallWatchdog &) = delete;
  StallWatchdog &operator=(const StallWatchdog &) = delete;

  /// Armed until the returned scope ends. `operation` must outlive it.
  class Scope {
  public:
    explicit Scope(StallWatchdog *w) : w_(w) {}
    Scope(Scope &&other) noexcept : w_(other.w_) { other.w_ = nullptr; }
    ~Scope() {
      if (w_)
        w_->operation_.store(nullptr, std::memory_order_release);
    }

  private:
    StallWatchdog *w_;
  };
  Scope watch(const char *operation);

private:
  void loop();

  int rank_;
  double timeout_;
  std::atomic<int64_t> deadline_{0};               // steady-clock nanoseconds
  std::atomic<const char *> operation_{nullptr};   // armed while set
  std::mutex mutex_;
  std::condition_variable stopping_;
  bool stop_ = false;
  std::thread thread_; // last: starts once the rest is ready
};

} // namespace parax::runtime

#endif // PARAX_RUNTIME_STALLWATCHDOG_H
