// Embedding.cuh - the CUDA executor's kernels of embedding and
// position_embedding, forward and backward: one CudaExecutor::State member an
// op or family, called through kKernels. A part of CudaExecutor.cu, which
// includes it (one translation unit, for nvcc and the SIMT emulator alike);
// not a header to include elsewhere.

namespace parax::runtime {

Status CudaExecutor::State::runEmbedding(const pxe::Instruction &inst) {
  const Attrs &a = inst.attrs();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  DeviceBuffer &ids = in(0), &table = in(1), &y = out();
  std::vector<std::string> axes = attrStrings(a, "vocab_axes");
  int64_t rows = table.shape[0], h = table.shape[1];
  int64_t offset = axes.empty() ? 0 : groupIndex(axes) * rows;
  Status st = withBits(y, [&](auto w) {
    using W = decltype(w);
    PARAX_LAUNCH(embeddingKernel<W>, blocksFor(y.numel()), kThreads, 0, stream)(
        ids.i(), table.as<W>(), y.as<W>(), ids.numel(), h, rows, offset);
    return Status::ok();
  });
  if (!st.isOk()) return st;
  float scale = static_cast<float>(attrFloat(a, "scale", 1.0)); // (Gemma's sqrt(hidden))
  if (scale == 1.0f) return Status::ok();
  return withFloat(y, [&](auto t) {
    using T = decltype(t);
    PARAX_LAUNCH(scaleValuesKernel<T>, blocksFor(y.numel()), kThreads, 0, stream)(y.as<T>(), y.numel(), scale);
    return Status::ok();
  });
}

Status CudaExecutor::State::runPositionEmbedding(const pxe::Instruction &inst) {
  const Attrs &a = inst.attrs();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  DeviceBuffer &table = in(0), &y = out();
  int64_t h = y.shape[2];
  if (inst.operands_size() == 1) { // a rank's positions of the sequence: a block, or dealt out
    SequenceRows rows = rowsOf(a, y.shape[1]);
    int64_t first = attrInt(a, "offset") + rows.start;
    if (rows.stride == 1) return copy(y.data, offsetOf(table, first * h), y.numel(), y);
    return withBits(y, [&](auto w) {
      using W = decltype(w);
      PARAX_LAUNCH(strideRowsKernel<W>, blocksFor(y.numel()), kThreads, 0, stream)(
          table.as<W>(), y.as<W>(), y.numel(), h, first, rows.stride);
      return Status::ok();
    });
  }
  return withBits(y, [&](auto w) { // rows from a run-time position
    using W = decltype(w);
    PARAX_LAUNCH(positionRowsKernel<W>, blocksFor(y.numel()), kThreads, 0, stream)(table.as<W>(), in(1).i(),
                                                                                  y.as<W>(), y.numel(), h);
    return Status::ok();
  });
}

Status CudaExecutor::State::runPositionEmbeddingGrad(const pxe::Instruction &inst) {
  const Attrs &a = inst.attrs();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  DeviceBuffer &dy = in(0), &table = out();
  SequenceRows rows = rowsOf(a, dy.shape[1]);
  PARAX_CUDA(cudaMemsetAsync(table.data, 0, table.numel() * elemBytes(table.elem), stream));
  return withBits(table, [&](auto w) {
    using W = decltype(w);
    PARAX_LAUNCH(positionGradRowsKernel<W>, blocksFor(dy.numel()), kThreads, 0, stream)(
        dy.as<W>(), table.as<W>(), dy.numel(), dy.shape[2], attrInt(a, "offset") + rows.start, rows.stride);
    return Status::ok();
  });
}

Status CudaExecutor::State::runEmbeddingGrad(const pxe::Instruction &inst) {
  const Attrs &a = inst.attrs();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  DeviceBuffer &ids = in(0), &dy = in(1), &table = out();
  std::vector<std::string> axes = attrStrings(a, "vocab_axes");
  int64_t rows = table.shape[0], h = table.shape[1];
  int64_t offset = axes.empty() ? 0 : groupIndex(axes) * rows;
  Status st = ensureScratch(rows * h + 1);
  if (!st.isOk()) return st;
  auto *badToken = reinterpret_cast<int32_t *>(scratch + rows * h);
  PARAX_CUDA(cudaMemsetAsync(scratch, 0, rows * h * sizeof(float), stream));
  PARAX_CUDA(cudaMemsetAsync(badToken, 0xff, 4, stream));
  st = withFloat(table, [&](auto t) {
    using T = decltype(t);
    PARAX_LAUNCH(embeddingGradKernel<T>, blocksFor(dy.numel()), kThreads, 0, stream)(
        ids.i(), dy.as<T>(), scratch, ids.numel(), h, rows, offset, !axes.empty(), badToken);
    if (float scale = static_cast<float>(attrFloat(a, "scale", 1.0)); scale != 1.0f)
      PARAX_LAUNCH(scaleKernel, blocksFor(rows * h), kThreads, 0, stream)(scratch, rows * h, scale);
    PARAX_LAUNCH(fromFloatKernel<T>, blocksFor(rows * h), kThreads, 0, stream)(scratch, table.as<T>(), rows * h);
    return Status::ok();
  });
  if (!st.isOk()) return st;
  return checkFlag(badToken, [&](int32_t bad) {
    return "token id at " + std::to_string(bad) + " is outside the vocabulary of " + std::to_string(rows);
  });
}

} // namespace parax::runtime
