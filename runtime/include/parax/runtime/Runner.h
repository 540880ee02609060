// Runner.h - a prepared program, whichever backend runs it (what the
// generation loop, Generator.h, and parax-run's steps ask of it).

#ifndef PARAX_RUNTIME_RUNNER_H
#define PARAX_RUNTIME_RUNNER_H

#include "parax/runtime/Executor.h"

#include <functional>
#include <vector>

namespace parax::runtime {

/// What the loops ask of a prepared program.
struct Runner {
  std::function<Status(const std::vector<Tensor> &)> setInputs;
  std::function<Status()> run;
  std::function<std::vector<Tensor>()> outputs;
  std::function<StatusOr<std::vector<int32_t>>()> greedyTokens;
};

template <typename E> Runner runnerOf(E &executor) {
  return {[&executor](const std::vector<Tensor> &in) { return executor.setInputs(in); },
          [&executor] { return executor.run(); }, [&executor] { return executor.outputs(); },
          [&executor] { return executor.greedyTokens(); }};
}

/// The CPU executor running one microbatch of a generation loop: each run
/// takes that microbatch's KV caches and gives them back.
inline Runner runnerWithCaches(Executor &executor, Executor::CacheSet &caches) {
  Runner runner = runnerOf(executor);
  runner.run = [&executor, &caches] {
    Status s = executor.swapCacheState(caches);
    if (!s.isOk()) return s;
    s = executor.run();
    Status back = executor.swapCacheState(caches);
    return s.isOk() ? back : s;
  };
  return runner;
}

} // namespace parax::runtime

#endif // PARAX_RUNTIME_RUNNER_H
