// KvCache.cuh - the CUDA executor's kernels of cache_update and
// ring_cache_update: a generation step's KV caches: one CudaExecutor::State
// member an op or family, called through kKernels. A part of CudaExecutor.cu,
// which includes it (one translation unit, for nvcc and the SIMT emulator
// alike); not a header to include elsewhere.

namespace parax::runtime {

Status CudaExecutor::State::runCacheUpdate(const pxe::Instruction &inst) {
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  // In place when the result shares the cache's memory (see
  // aliasCacheUpdates); otherwise the cache is copied first.
  DeviceBuffer &cache = in(0), &update = in(1), &y = out();
  if (y.data != cache.data) {
    Status st = copy(y.data, cache.data, y.numel(), y);
    if (!st.isOk()) return st;
  }
  int64_t row = y.shape[2] * y.shape[3];
  return withBits(y, [&](auto w) {
    using W = decltype(w);
    PARAX_LAUNCH(cacheWriteKernel<W>, blocksFor(update.numel()), kThreads, 0, stream)(
        update.as<W>(), in(2).i(), y.as<W>(), y.shape[0], y.shape[1], update.shape[1], row);
    return Status::ok();
  });
}

// The window first (it reads the ring's rows the write replaces), then the
// write, in place as runCacheUpdate's.
Status CudaExecutor::State::runRingCacheUpdate(const pxe::Instruction &inst) {
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  DeviceBuffer &ring = in(0), &update = in(1), &window = out(0), &y = out(1);
  int64_t B = ring.shape[0], C = ring.shape[1], S = update.shape[1], row = ring.shape[2] * ring.shape[3];
  return withBits(y, [&](auto w) {
    using W = decltype(w);
    PARAX_LAUNCH(ringWindowKernel<W>, blocksFor(window.numel()), kThreads, 0, stream)(
        ring.as<W>(), update.as<W>(), in(2).i(), window.as<W>(), B, C, S, row);
    if (y.data != ring.data) {
      Status st = copy(y.data, ring.data, y.numel(), y);
      if (!st.isOk()) return st;
    }
    PARAX_LAUNCH(ringWriteKernel<W>, blocksFor(B * std::min(S, C) * row), kThreads, 0, stream)(
        update.as<W>(), in(2).i(), y.as<W>(), B, C, S, row);
    return Status::ok();
  });
}

} // namespace parax::runtime
