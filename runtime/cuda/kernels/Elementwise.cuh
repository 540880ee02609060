// Elementwise.cuh - the CUDA executor's kernels of the binary and unary
// elementwise ops, swiglu, sum_to and their gradients: one CudaExecutor::State
// member an op or family, called through kKernels. A part of CudaExecutor.cu,
// which includes it (one translation unit, for nvcc and the SIMT emulator
// alike); not a header to include elsewhere.

namespace parax::runtime {

Status CudaExecutor::State::runBinary(const pxe::Instruction &inst) {
  const pxe::OpKind op = inst.kind();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  DeviceBuffer &l = in(0), &r = in(1), &y = out();
  return withFloat(y, [&](auto t) {
    using T = decltype(t);
    PARAX_LAUNCH(binaryKernel<T>, blocksFor(y.numel()), kThreads, 0, stream)(
        l.as<T>(), r.as<T>(), y.as<T>(), dimsOf(l.shape), dimsOf(r.shape), dimsOf(y.shape), y.numel(),
        op == pxe::OP_ADD, l.shape == y.shape, r.shape == y.shape);
    return Status::ok();
  });
}

Status CudaExecutor::State::runUnary(const pxe::Instruction &inst) {
  const Attrs &a = inst.attrs();
  const pxe::OpKind op = inst.kind();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  int kind = op == pxe::OP_SILU ? 0 : op == pxe::OP_SIGMOID ? 1 : op == pxe::OP_SOFTCAP ? 4 : attrString(a, "approximate") == "tanh" ? 2 : 3;
  float cap = op == pxe::OP_SOFTCAP ? static_cast<float>(attrFloat(a, "cap")) : 0.0f;
  return withFloat(out(), [&](auto t) {
    using T = decltype(t);
    PARAX_LAUNCH(unaryKernel<T>, blocksFor(out().numel()), kThreads, 0, stream)(in(0).as<T>(), out().as<T>(),
                                                                               out().numel(), kind, cap);
    return Status::ok();
  });
}

Status CudaExecutor::State::runSwiglu(const pxe::Instruction &inst) {
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  return withFloat(out(), [&](auto t) {
    using T = decltype(t);
    PARAX_LAUNCH(swigluKernel<T>, blocksFor(out().numel()), kThreads, 0, stream)(
        in(0).as<T>(), in(1).as<T>(), out().as<T>(), out().numel());
    return Status::ok();
  });
}

Status CudaExecutor::State::runSumTo(const pxe::Instruction &inst) {
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  DeviceBuffer &x = in(0), &y = out();
  return withFloat(y, [&](auto t) {
    using T = decltype(t);
    PARAX_LAUNCH(sumToKernel<T>, blocksFor(y.numel()), kThreads, 0, stream)(
        x.as<T>(), y.as<T>(), dimsOf(x.shape), dimsOf(y.shape), y.numel(), x.numel() / std::max<int64_t>(1, y.numel()));
    return Status::ok();
  });
}

Status CudaExecutor::State::runSigmoidGrad(const pxe::Instruction &inst) {
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  return withFloat(out(), [&](auto t) {
    using T = decltype(t);
    PARAX_LAUNCH(sigmoidGradKernel<T>, blocksFor(out().numel()), kThreads, 0, stream)(
        in(0).as<T>(), in(1).as<T>(), out().as<T>(), out().numel());
    return Status::ok();
  });
}

Status CudaExecutor::State::runSoftcapGrad(const pxe::Instruction &inst) {
  const Attrs &a = inst.attrs();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  return withFloat(out(), [&](auto t) {
    using T = decltype(t);
    PARAX_LAUNCH(softcapGradKernel<T>, blocksFor(out().numel()), kThreads, 0, stream)(
        in(0).as<T>(), in(1).as<T>(), out().as<T>(), out().numel(), static_cast<float>(attrFloat(a, "cap")));
    return Status::ok();
  });
}

Status CudaExecutor::State::runGeluGrad(const pxe::Instruction &inst) {
  const Attrs &a = inst.attrs();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  return withFloat(out(), [&](auto t) {
    using T = decltype(t);
    PARAX_LAUNCH(geluGradKernel<T>, blocksFor(out().numel()), kThreads, 0, stream)(
        in(0).as<T>(), in(1).as<T>(), out().as<T>(), out().numel(), attrString(a, "approximate") == "tanh");
    return Status::ok();
  });
}

Status CudaExecutor::State::runSwigluGrad(const pxe::Instruction &inst) {
  const Attrs &a = inst.attrs();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  return withFloat(out(), [&](auto t) {
    using T = decltype(t);
    PARAX_LAUNCH(swigluGradKernel<T>, blocksFor(out().numel()), kThreads, 0, stream)(
        in(0).as<T>(), in(1).as<T>(), in(2).as<T>(), out().as<T>(), out().numel(),
        static_cast<int>(attrInt(a, "operand")));
    return Status::ok();
  });
}

} // namespace parax::runtime
