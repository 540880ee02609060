// Embedding.cpp - the CPU executor's kernels of embedding and
// position_embedding, forward and backward (each an Executor::Impl member,
// called through Executor.cpp's kKernels).

#include "../ExecutorImpl.h"

namespace parax::runtime {

// embedding
Status Executor::Impl::runEmbedding(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &ids = in(0), &table = in(1), &y = out();
  int64_t h = table.shape[1], rows = table.shape[0], offset = 0;
  float scale = static_cast<float>(attrFloat(a, "scale", 1.0)); // (Gemma's sqrt(hidden))
  std::vector<std::string> axes = attrStrings(a, "vocab_axes");
  if (!axes.empty())
    offset = groupIndex(axes) * rows;
  for (int64_t t = 0; t < ids.numel(); ++t) {
    int64_t id = ids.i[t] - offset;
    if (!axes.empty() && (id < 0 || id >= rows)) {
      std::fill(&y.f[t * h], &y.f[t * h] + h, 0.0f);
      continue;
    }
    if (id < 0 || id >= rows)
      return Status::error("token id " + std::to_string(ids.i[t]) + " is outside the vocabulary of " + std::to_string(rows));
    std::copy(&table.f[id * h], &table.f[id * h] + h, &y.f[t * h]);
    if (scale != 1.0f)
      for (int64_t c = 0; c < h; ++c) y.f[t * h + c] *= scale;
  }
  return Status::ok();
}

// position_embedding
Status Executor::Impl::runPositionEmbedding(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &table = in(0), &y = out();
  int64_t s = y.shape[1], h = y.shape[2];
  // Rows offset + position(i) (a rank's positions of the sequence), or
  // from a run-time position.
  SequenceRows rows = inst.operands_size() == 2 ? SequenceRows{in(1).i[0], 1, 1} : rowsOf(a, s);
  int64_t offset = inst.operands_size() == 2 ? 0 : attrInt(a, "offset");
  int64_t last = offset + rows.position(s - 1);
  if (offset + rows.start < 0 || last >= table.shape[0])
    return Status::error("positions " + std::to_string(offset + rows.start) + " .. " + std::to_string(last) +
                         " exceed the table's " + std::to_string(table.shape[0]) + " rows");
  for (int64_t i = 0; i < s; ++i)
    std::copy(&table.f[(offset + rows.position(i)) * h], &table.f[(offset + rows.position(i) + 1) * h],
              &y.f[i * h]);
  return Status::ok();
}

// position_embedding_grad
Status Executor::Impl::runPositionEmbeddingGrad(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &dy = in(0), &table = out();
  int64_t s = dy.shape[1], h = dy.shape[2];
  SequenceRows rows = rowsOf(a, s); // (the validator keeps them inside the table)
  int64_t offset = attrInt(a, "offset");
  std::fill(table.f.begin(), table.f.end(), 0.0f);
  for (int64_t i = 0; i < s; ++i)
    std::copy(&dy.f[i * h], &dy.f[(i + 1) * h], &table.f[(offset + rows.position(i)) * h]);
  return Status::ok();
}

// embedding_grad
Status Executor::Impl::runEmbeddingGrad(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &ids = in(0), &table = out();
  std::vector<std::string> axes = attrStrings(a, "vocab_axes");
  int64_t offset = axes.empty() ? 0 : groupIndex(axes) * table.shape[0];
  if (axes.empty())
    for (int32_t id : ids.i)
      if (id < 0 || id >= table.shape[0])
        return Status::error("token id " + std::to_string(id) + " is outside the vocabulary of " +
                             std::to_string(table.shape[0]));
  embeddingGrad(ids, in(1), offset, table, static_cast<float>(attrFloat(a, "scale", 1.0)));
  return Status::ok();
}

} // namespace parax::runtime
