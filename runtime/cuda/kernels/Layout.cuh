// Layout.cuh - the CUDA executor's kernels of reshape, transpose, broadcast,
// slice, concat and shift: one CudaExecutor::State member an op or family,
// called through kKernels. A part of CudaExecutor.cu, which includes it (one
// translation unit, for nvcc and the SIMT emulator alike); not a header to
// include elsewhere.

namespace parax::runtime {

Status CudaExecutor::State::runReshape(const pxe::Instruction &inst) {
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  // (nothing to move when the result is in its operand's memory)
  return out().data == in(0).data ? Status::ok() : copy(out().data, in(0).data, out().numel(), out());
}

Status CudaExecutor::State::runTranspose(const pxe::Instruction &inst) {
  const Attrs &a = inst.attrs();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  auto it = a.find("permutation");
  if (it == a.end()) return Status::error("transpose without permutation");
  std::vector<int64_t> perm(it->second.ints().values().begin(), it->second.ints().values().end());
  return withBits(out(), [&](auto w) {
    using W = decltype(w);
    PARAX_LAUNCH(transposeKernel<W>, blocksFor(out().numel()), kThreads, 0, stream)(
        in(0).as<W>(), out().as<W>(), dimsOf(in(0).shape), dimsOf(out().shape), dimsOf(perm), out().numel());
    return Status::ok();
  });
}

Status CudaExecutor::State::runBroadcast(const pxe::Instruction &inst) {
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  return withBits(out(), [&](auto w) {
    using W = decltype(w);
    PARAX_LAUNCH(broadcastKernel<W>, blocksFor(out().numel()), kThreads, 0, stream)(
        in(0).as<W>(), out().as<W>(), dimsOf(in(0).shape), dimsOf(out().shape), out().numel());
    return Status::ok();
  });
}

Status CudaExecutor::State::runSlice(const pxe::Instruction &inst) {
  const Attrs &a = inst.attrs();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  int dim = static_cast<int>(attrInt(a, "dim"));
  auto [outer, inner] = around(out().shape, dim);
  return withBits(out(), [&, outer = outer, inner = inner](auto w) {
    using W = decltype(w);
    PARAX_LAUNCH(sliceKernel<W>, blocksFor(out().numel()), kThreads, 0, stream)(
        in(0).as<W>(), out().as<W>(), outer, in(0).shape[dim], out().shape[dim], attrInt(a, "start"), inner);
    return Status::ok();
  });
}

Status CudaExecutor::State::runConcat(const pxe::Instruction &inst) {
  const Attrs &a = inst.attrs();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  int dim = static_cast<int>(attrInt(a, "dim"));
  auto [outer, inner] = around(out().shape, dim);
  return withBits(out(), [&, outer = outer, inner = inner](auto w) {
    using W = decltype(w);
    int64_t at = 0;
    for (int k = 0; k < inst.operands_size(); ++k) {
      PARAX_LAUNCH(placeKernel<W>, blocksFor(in(k).numel()), kThreads, 0, stream)(
          in(k).as<W>(), out().as<W>(), outer, out().shape[dim], in(k).shape[dim], at, inner);
      at += in(k).shape[dim];
    }
    return Status::ok();
  });
}

Status CudaExecutor::State::runShift(const pxe::Instruction &inst) {
  const Attrs &a = inst.attrs();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  DeviceBuffer &x = in(0), &y = out();
  PARAX_LAUNCH(shiftKernel, blocksFor(x.numel()), kThreads, 0, stream)(
      x.i(), y.i(), x.numel(), x.shape[1], attrInt(a, "shift"), static_cast<int32_t>(attrInt(a, "fill")));
  return Status::ok();
}

} // namespace parax::runtime
