// Norms.cuh - the CUDA executor's kernels of the norms and their gradients:
// one CudaExecutor::State member an op or family, called through kKernels. A
// part of CudaExecutor.cu, which includes it (one translation unit, for nvcc
// and the SIMT emulator alike); not a header to include elsewhere.

namespace parax::runtime {

Status CudaExecutor::State::runNorm(const pxe::Instruction &inst) {
  const Attrs &a = inst.attrs();
  const pxe::OpKind op = inst.kind();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  DeviceBuffer &x = in(0), &y = out();
  int64_t h = x.shape.back(), rows = x.numel() / h;
  bool layer = op == pxe::OP_LAYER_NORM;
  return withFloat(y, [&](auto t) {
    using T = decltype(t);
    PARAX_LAUNCH(normKernel<T>, rows, kThreads, 0, stream)(
        x.as<T>(), in(1).as<T>(), layer ? in(2).as<T>() : nullptr, y.as<T>(), h,
        static_cast<float>(attrFloat(a, "eps")), layer, static_cast<float>(attrFloat(a, "offset")));
    return Status::ok();
  });
}

Status CudaExecutor::State::runNormGrad(const pxe::Instruction &inst) {
  const Attrs &a = inst.attrs();
  const pxe::OpKind op = inst.kind();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  DeviceBuffer &x = in(0), &y = out();
  int64_t h = x.shape.back(), rows = x.numel() / h;
  float eps = static_cast<float>(attrFloat(a, "eps"));
  bool centered = (op == pxe::OP_LAYER_NORM_GRAD || op == pxe::OP_LAYER_NORM_WEIGHT_GRAD), input = op == pxe::OP_RMS_NORM_GRAD || op == pxe::OP_LAYER_NORM_GRAD;
  if (!input) {
    Status st = ensureScratch(2 * rows);
    if (!st.isOk()) return st;
  }
  return withFloat(y, [&](auto t) {
    using T = decltype(t);
    if (input) {
      PARAX_LAUNCH(normGradKernel<T>, rows, kThreads, 0, stream)(x.as<T>(), in(1).as<T>(), in(2).as<T>(),
                                                                 y.as<T>(), h, eps, centered,
                                                                 static_cast<float>(attrFloat(a, "offset")));
    } else {
      PARAX_LAUNCH(rowStatsKernel<T>, rows, kThreads, 0, stream)(x.as<T>(), scratch, h, eps, centered);
      PARAX_LAUNCH(normWeightGradKernel<T>, blocksFor(h), kThreads, 0, stream)(x.as<T>(), in(1).as<T>(),
                                                                               scratch, y.as<T>(), rows, h);
    }
    return Status::ok();
  });
}

} // namespace parax::runtime
