// Elementwise.cpp - the CPU executor's kernels of add/mul/sub, the
// activations, softcap, swiglu, sum_to and their gradients (each an
// Executor::Impl member, called through Executor.cpp's kKernels).

#include "../ExecutorImpl.h"

namespace parax::runtime {

// add, mul
Status Executor::Impl::runAdd(const pxe::Instruction &inst, int variant) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &l = in(0), &r = in(1), &y = out();
  bool add = variant == 0;
  int64_t n = y.numel();
  float *to = y.f.data();
  // Operands of the result's shape (a residual add, SwiGLU's product) or
  // holding its trailing dimensions (a bias) read by a flat index; any
  // other broadcast through broadcastIndex.
  auto trailing = [&](const Tensor &t) { // 1s, then the result's dimensions
    if (t.shape.size() != y.shape.size() || t.numel() == 0)
      return false;
    size_t d = 0;
    while (d < t.shape.size() && t.shape[d] == 1)
      ++d;
    return std::equal(t.shape.begin() + d, t.shape.end(), y.shape.begin() + d);
  };
  if (trailing(l) && trailing(r)) {
    const float *x = l.f.data(), *z = r.f.data();
    int64_t nx = l.numel(), nz = r.numel();
    if (nx == n && nz == n) {
      if (add) for (int64_t k = 0; k < n; ++k) to[k] = x[k] + z[k];
      else for (int64_t k = 0; k < n; ++k) to[k] = x[k] * z[k];
    } else {
      for (int64_t base = 0; base < n; base += std::min(nx, nz)) { // rows of the smaller one
        int64_t row = std::min(nx, nz);
        const float *xr = x + (nx == n ? base : base % nx), *zr = z + (nz == n ? base : base % nz);
        if (add) for (int64_t k = 0; k < row; ++k) to[base + k] = xr[k] + zr[k];
        else for (int64_t k = 0; k < row; ++k) to[base + k] = xr[k] * zr[k];
      }
    }
    return Status::ok();
  }
  for (int64_t k = 0; k < n; ++k) {
    float x = l.f[broadcastIndex(l, y, k)], z = r.f[broadcastIndex(r, y, k)];
    to[k] = add ? x + z : x * z;
  }
  return Status::ok();
}

// silu, sigmoid, gelu
Status Executor::Impl::runSilu(const pxe::Instruction &inst, int variant) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &x = in(0), &y = out();
  if (variant == 0) { // silu
    siluTimes(x.f.data(), nullptr, y.f.data(), x.numel());
    return Status::ok();
  }
  bool tanhApprox = attrString(a, "approximate") == "tanh";
  for (int64_t k = 0; k < x.numel(); ++k) {
    float v = x.f[k];
    if (variant == 1)
      y.f[k] = 1.0f / (1.0f + std::exp(-v));
    else if (tanhApprox)
      y.f[k] = 0.5f * v * (1.0f + std::tanh(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    else
      y.f[k] = 0.5f * v * (1.0f + std::erf(v * 0.7071067811865476f));
  }
  return Status::ok();
}

// softcap
Status Executor::Impl::runSoftcap(const pxe::Instruction &inst, int) {
  // cap · tanh(x / cap) (Gemma 2's logits)
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &x = in(0), &y = out();
  double cap = attrFloat(a, "cap");
  for (int64_t k = 0; k < x.numel(); ++k) y.f[k] = static_cast<float>(cap * std::tanh(x.f[k] / cap));
  return Status::ok();
}

// swiglu
Status Executor::Impl::runSwiglu(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &g = in(0), &u = in(1), &y = out();
  siluTimes(g.f.data(), u.f.data(), y.f.data(), g.numel());
  return Status::ok();
}

// sum_to
Status Executor::Impl::runSumTo(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  sumTo(in(0), out());
  return Status::ok();
}

// softcap_grad
Status Executor::Impl::runSoftcapGrad(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &x = in(0), &dy = in(1), &dx = out();
  double cap = attrFloat(a, "cap");
  for (int64_t k = 0; k < x.numel(); ++k) {
    double t = std::tanh(x.f[k] / cap);
    dx.f[k] = static_cast<float>(dy.f[k] * (1 - t * t));
  }
  return Status::ok();
}

// sigmoid_grad
Status Executor::Impl::runSigmoidGrad(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &x = in(0), &dy = in(1), &dx = out();
  for (int64_t k = 0; k < x.numel(); ++k) {
    float s = 1.0f / (1.0f + std::exp(-x.f[k]));
    dx.f[k] = dy.f[k] * s * (1.0f - s);
  }
  return Status::ok();
}

// gelu_grad
Status Executor::Impl::runGeluGrad(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  geluGrad(in(0), in(1), attrString(a, "approximate") == "tanh", out());
  return Status::ok();
}

// swiglu_grad
Status Executor::Impl::runSwigluGrad(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  swigluGrad(in(0), in(1), in(2), static_cast<int>(attrInt(a, "operand")), out());
  return Status::ok();
}

} // namespace parax::runtime
