// Linear.cpp - the CPU executor's kernels of linear, head_linear and
// linear_weight_grad: Gemm.h's products (each an Executor::Impl member,
// called through Executor.cpp's kKernels).

#include "../ExecutorImpl.h"

namespace parax::runtime {

// linear
Status Executor::Impl::runLinear(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &x = in(0), &w = in(1), &y = out();
  bool t = attrFlag(a, "transpose_w");
  auto [m, k] = rowsCols(x);
  int64_t n = y.shape.back();
  gemm(false, t, m, n, k, 1.0f, x.f.data(), k, w.f.data(), t ? k : n, 0.0f, y.f.data(), n);
  if (inst.operands_size() == 3) {
    Tensor &bias = in(2);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c)
        y.f[r * n + c] += bias.f[c];
  }
  return Status::ok();
}

// head_linear
Status Executor::Impl::runHeadLinear(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  // Head g of every row through W[g]: one GEMM a head, its rows G * in apart.
  Tensor &x = in(0), &w = in(1), &y = out();
  bool t = attrFlag(a, "transpose_w");
  int64_t g = x.shape[x.shape.size() - 2], k = x.shape.back(), n = y.shape.back(), m = x.numel() / (g * k);
  for (int64_t h = 0; h < g; ++h)
    gemm(false, t, m, n, k, 1.0f, x.f.data() + h * k, g * k, w.f.data() + h * k * n, t ? k : n, 0.0f,
         y.f.data() + h * n, g * n);
  return Status::ok();
}

// linear_weight_grad
Status Executor::Impl::runLinearWeightGrad(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  linearWeightGrad(in(0), in(1), attrFlag(a, "transpose_w"), out());
  return Status::ok();
}

} // namespace parax::runtime
