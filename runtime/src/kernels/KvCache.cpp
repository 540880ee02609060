// KvCache.cpp - the CPU executor's kernels of cache_update and
// ring_cache_update: a generation step's KV caches, written in place (each an
// Executor::Impl member, called through Executor.cpp's kKernels).

#include "../ExecutorImpl.h"

namespace parax::runtime {

// cache_update
Status Executor::Impl::runCacheUpdate(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  // In place when the cache is an input only this reads (a generation
  // loop's state: the buffer then holds the updated cache), then copied.
  Tensor &cache = in(0), &update = in(1), &y = out();
  int64_t C = cache.shape[1], S = update.shape[1], at = in(2).i[0];
  if (at < 0 || at + S > C)
    return Status::error("position " + std::to_string(at) + ": " + std::to_string(S) +
                         " new row(s) do not fit the cache of " + std::to_string(C));
  Tensor &target = cacheTarget(inst, cache, y);
  int64_t row = cache.shape[2] * cache.shape[3];
  for (int64_t bb = 0; bb < cache.shape[0]; ++bb)
    std::copy(&update.f[bb * S * row], &update.f[(bb + 1) * S * row], &target.f[(bb * C + at) * row]);
  if (&target == &cache) lendCache(inst, cache, y, 0);
  return Status::ok();
}

Tensor &Executor::Impl::cacheTarget(const pxe::Instruction &inst, Tensor &cache, Tensor &y) {
  if (e.isCacheState(inst.operands(0))) return cache;
  y.f = cache.f;
  return y;
}

void Executor::Impl::lendCache(const pxe::Instruction &inst, Tensor &cache, Tensor &y, int result) {
  // The result takes the cache's storage for the rest of the run (no copy
  // of the whole cache a step); run() hands it back. A result the stage
  // outputs must outlive the run, so it gets a copy.
  const auto &outputs = e.stageProto_->outputs();
  if (std::find(outputs.begin(), outputs.end(), inst.results(result)) != outputs.end()) {
    y.f = cache.f;
  } else {
    std::swap(y.f, cache.f);
    lentCaches.emplace_back(inst.operands(0), inst.results(result));
  }
}

// ring_cache_update: the window (the ring's tokens at positions p - C ..
// p - 1, row t mod C holding position t, oldest first, then the update's
// rows), then the update written into the ring (its last C rows), in place
// as cache_update's.
Status Executor::Impl::runRingCacheUpdate(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &ring = in(0), &update = in(1), &window = out(0), &y = out(1);
  int64_t C = ring.shape[1], S = update.shape[1], at = in(2).i[0];
  if (at < 0) return Status::error("position " + std::to_string(at) + " is negative");
  int64_t row = ring.shape[2] * ring.shape[3];
  auto rowOf = [row](std::vector<float> &t, int64_t r) { return t.begin() + r * row; };
  for (int64_t bb = 0; bb < ring.shape[0]; ++bb) {
    for (int64_t r = 0; r < C; ++r) { // (negative positions: a row no query sees)
      int64_t slot = ((at - C + r) % C + C) % C;
      std::copy(rowOf(ring.f, bb * C + slot), rowOf(ring.f, bb * C + slot + 1), rowOf(window.f, bb * (C + S) + r));
    }
    std::copy(rowOf(update.f, bb * S), rowOf(update.f, (bb + 1) * S), rowOf(window.f, bb * (C + S) + C));
  }
  Tensor &target = cacheTarget(inst, ring, y);
  for (int64_t bb = 0; bb < ring.shape[0]; ++bb)
    for (int64_t i = std::max<int64_t>(0, S - C); i < S; ++i)
      std::copy(rowOf(update.f, bb * S + i), rowOf(update.f, bb * S + i + 1), rowOf(target.f, bb * C + (at + i) % C));
  if (&target == &ring) lendCache(inst, ring, y, 1);
  return Status::ok();
}

} // namespace parax::runtime
