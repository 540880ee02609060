// StallWatchdog.cpp - see StallWatchdog.h.

#include "parax/runtime/StallWatchdog.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace parax::runtime {

namespace {
int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
} // namespace

StallWatchdog::StallWatchdog(int rank, double timeoutSeconds)
    : rank_(rank), timeout_(timeoutSeconds), thread_([this] { loop(); }) {}

StallWatchdog::~StallWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  stopping_.notify_all();
  thread_.join();
}

StallWatchdog::Scope StallWatchdog::watch(const char *operation) {
  deadline_.store(nowNs() + static_cast<int64_t>(timeout_ * 1e9), std::memory_order_relaxed);
  operation_.store(operation, std::memory_order_release); // publishes the deadline
  return Scope(this);
}

void StallWatchdog::loop() {
  auto period = std::chrono::duration<double>(std::min(0.1, timeout_ / 4));
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_.wait_for(lock, period, [&] { return stop_; })) {
    const char *operation = operation_.load(std::memory_order_acquire);
    if (operation && nowNs() > deadline_.load(std::memory_order_relaxed)) {
      std::fprintf(stderr,
                   "parax-run: rank %d: %s has not finished after %g s (a rank stalled or exited, or the "
                   "ranks do not pair their operations); ending the job\n",
                   rank_, operation, timeout_);
      std::fflush(stderr);
      std::_Exit(1);
    }
  }
}

} // namespace parax::runtime
