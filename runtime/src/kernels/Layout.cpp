// Layout.cpp - the CPU executor's kernels of reshape, transpose, slice and
// shift: data moved, nothing computed (each an Executor::Impl member, called
// through Executor.cpp's kKernels).

#include "../ExecutorImpl.h"

namespace parax::runtime {

// reshape (its operand's storage taken where the operand is read last
// here: Executor::markReshapesInPlace; the operand gets the result's, of
// the same size, for its writer's next run)
Status Executor::Impl::runReshape(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &x = in(0), &y = out();
  const auto takes = static_cast<size_t>(inst.results(0));
  if (takes < e.reshapeTakes_.size() && e.reshapeTakes_[takes]) {
    std::swap(y.f, x.f);
    std::swap(y.i, x.i);
    if (x.isInt ? x.i.size() != static_cast<size_t>(x.numel()) : x.f.size() != static_cast<size_t>(x.numel())) {
      x.f.assign(x.isInt ? 0 : x.numel(), 0.0f); // (the result held nothing yet)
      x.i.assign(x.isInt ? x.numel() : 0, 0);
    }
    return Status::ok();
  }
  y.f = x.f;
  y.i = x.i;
  return Status::ok();
}

// transpose
Status Executor::Impl::runTranspose(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &x = in(0), &y = out();
  auto it = a.find("permutation");
  if (it == a.end()) return Status::error("transpose without permutation");
  std::vector<int64_t> perm(it->second.ints().values().begin(), it->second.ints().values().end());
  int rank = x.shape.size();
  std::vector<int64_t> xs(rank, 1);
  for (int d = rank - 2; d >= 0; --d) xs[d] = xs[d + 1] * x.shape[d + 1];
  std::vector<int64_t> index(rank, 0);
  for (int64_t k = 0; k < y.numel(); ++k) {
    int64_t offset = 0;
    for (int d = 0; d < rank; ++d) offset += index[d] * xs[perm[d]];
    y.f[k] = x.f[offset];
    for (int d = rank - 1; d >= 0; --d) {
      if (++index[d] < y.shape[d]) break;
      index[d] = 0;
    }
  }
  return Status::ok();
}

// slice, concat, broadcast
Status Executor::Impl::runSlice(const pxe::Instruction &inst, int variant) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &y = out();
  if (variant == 2) {
    Tensor &x = in(0);
    for (int64_t k = 0; k < y.numel(); ++k) y.f[k] = x.f[broadcastIndex(x, y, k)];
    return Status::ok();
  }
  int dim = static_cast<int>(attrInt(a, "dim"));
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d) outer *= y.shape[d];
  for (size_t d = dim + 1; d < y.shape.size(); ++d) inner *= y.shape[d];
  if (variant == 0) {
    Tensor &x = in(0);
    int64_t start = attrInt(a, "start"), len = x.shape[dim], n = y.shape[dim];
    for (int64_t o = 0; o < outer; ++o)
      std::copy(&x.f[(o * len + start) * inner], &x.f[(o * len + start + n) * inner],
                &y.f[o * n * inner]);
    return Status::ok();
  }
  int64_t total = y.shape[dim], at = 0;
  for (int k = 0; k < inst.operands_size(); ++k) {
    Tensor &x = in(k);
    int64_t n = x.shape[dim];
    for (int64_t o = 0; o < outer; ++o)
      std::copy(&x.f[o * n * inner], &x.f[(o + 1) * n * inner], &y.f[(o * total + at) * inner]);
    at += n;
  }
  return Status::ok();
}

// shift
Status Executor::Impl::runShift(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  const Tensor &x = in(0);
  int64_t S = x.shape[1], shift = attrInt(a, "shift");
  auto fill = static_cast<int32_t>(attrInt(a, "fill"));
  Tensor &y = out();
  for (int64_t r = 0; r < x.shape[0]; ++r)
    for (int64_t s = 0; s < S; ++s)
      y.i[r * S + s] = s + shift < S ? x.i[r * S + s + shift] : fill;
  return Status::ok();
}

} // namespace parax::runtime
