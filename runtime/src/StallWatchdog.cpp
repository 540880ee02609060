// StallWatchdog.cpp - see StallWatchdog.h.

#include "parax/runtime/StallWatchdog.h"

#include <cstdio>
#include <cstdlib>

namespace parax::runtime {

StallWatchdog::StallWatchdog(int rank, double timeoutSeconds)
    : rank_(rank), timeout_(timeoutSeconds), thread_([this] { loop(); }) {}

StallWatchdog::~StallWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

StallWatchdog::Scope StallWatchdog::watch(const char *operation) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    operation_ = operation;
    ++generation_;
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                    std::chrono::duration<double>(timeout_));
  }
  changed_.notify_all();
  return Scope(this);
}

void StallWatchdog::disarm() {
  std::lock_guard<std::mutex> lock(mutex_);
  operation_ = nullptr;
}

void StallWatchdog::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    if (!operation_) {
      changed_.wait(lock);
      continue;
    }
    unsigned long armed = generation_;
    auto deadline = deadline_;
    changed_.wait_until(lock, deadline, [&] { return stop_ || !operation_ || generation_ != armed; });
    if (!stop_ && operation_ && generation_ == armed && std::chrono::steady_clock::now() >= deadline) {
      std::fprintf(stderr,
                   "parax-run: rank %d: %s has not finished after %g s (a rank stalled or exited, or the "
                   "ranks do not pair their operations); ending the job\n",
                   rank_, operation_, timeout_);
      std::fflush(stderr);
      std::_Exit(1);
    }
  }
}

} // namespace parax::runtime
