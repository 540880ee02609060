// Norms.cpp - the CPU executor's kernels of rms_norm and layer_norm, and their
// gradients (each an Executor::Impl member, called through Executor.cpp's
// kKernels).

#include "../ExecutorImpl.h"

namespace parax::runtime {

// rms_norm, layer_norm
Status Executor::Impl::runRmsNorm(const pxe::Instruction &inst, int variant) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &x = in(0), &w = in(1), &y = out();
  auto [rows, h] = rowsCols(x);
  double eps = attrFloat(a, "eps");
  float offset = static_cast<float>(attrFloat(a, "offset")); // (Gemma's 1 + w)
  bool layer = variant == 1;
  const float *bias = layer ? in(2).f.data() : nullptr;
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = &x.f[r * h];
    float *yr = &y.f[r * h];
    double mean = 0, var = 0;
    if (layer) {
      for (int64_t c = 0; c < h; ++c) mean += xr[c];
      mean /= h;
    }
    for (int64_t c = 0; c < h; ++c) var += (xr[c] - mean) * (xr[c] - mean);
    var /= h;
    float inv = static_cast<float>(1.0 / std::sqrt(var + eps));
    float centre = static_cast<float>(mean);
    for (int64_t c = 0; c < h; ++c)
      yr[c] = (xr[c] - centre) * inv * (w.f[c] + offset) + (bias ? bias[c] : 0.0f);
  }
  return Status::ok();
}

// rms_norm_grad, layer_norm_grad
Status Executor::Impl::runRmsNormGrad(const pxe::Instruction &inst, int variant) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  normGrad(in(0), in(1), in(2), attrFloat(a, "eps"), variant == 1, out(), attrFloat(a, "offset"));
  return Status::ok();
}

// rms_norm_weight_grad, layer_norm_weight_grad
Status Executor::Impl::runRmsNormWeightGrad(const pxe::Instruction &inst, int variant) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  normWeightGrad(in(0), in(1), attrFloat(a, "eps"), variant == 1, out());
  return Status::ok();
}

} // namespace parax::runtime
