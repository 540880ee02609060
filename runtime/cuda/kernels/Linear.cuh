// Linear.cuh - the CUDA executor's kernels of linear, head_linear and
// linear_weight_grad (cuBLAS, cuBLASLt): one CudaExecutor::State member an op
// or family, called through kKernels. A part of CudaExecutor.cu, which
// includes it (one translation unit, for nvcc and the SIMT emulator alike);
// not a header to include elsewhere.

namespace parax::runtime {

Status CudaExecutor::State::runLinear(const pxe::Instruction &inst) {
  const Attrs &a = inst.attrs();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  DeviceBuffer &x = in(0), &w = in(1), &y = out();
  int64_t k = x.shape.back(), n = y.shape.back(), m = x.numel() / k;
  if (w.elem == Elem::BF16 && x.elem == Elem::F32) {
    Status st = ensureScratch((m * k + 1) / 2);
    if (!st.isOk()) return st;
  }
  auto fused = geluInto.find(&inst);
  void *into = fused == geluInto.end() ? y.data : buffers[fused->second].data;
  return gemm(x.data, x.elem, m, k, w.data, w.elem, attrInt(a, "transpose_w") != 0, n, into, y.elem,
              reinterpret_cast<__nv_bfloat16 *>(scratch), inst.operands_size() == 3 ? in(2).data : nullptr,
              fused != geluInto.end());
}

Status CudaExecutor::State::runHeadLinear(const pxe::Instruction &inst) {
  const Attrs &a = inst.attrs();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  DeviceBuffer &x = in(0), &w = in(1), &y = out();
  int64_t g = x.shape[x.shape.size() - 2], k = x.shape.back(), n = y.shape.back(), m = x.numel() / (g * k);
  if (w.elem == Elem::BF16 && x.elem == Elem::F32) {
    Status st = ensureScratch((m * g * k + 1) / 2);
    if (!st.isOk()) return st;
  }
  return headGemm(x.data, x.elem, m, g, k, w.data, w.blockStride > 0 ? w.blockStride : k * n, w.elem,
                  attrInt(a, "transpose_w") != 0, n, y.data, y.elem, reinterpret_cast<__nv_bfloat16 *>(scratch));
}

Status CudaExecutor::State::runLinearWeightGrad(const pxe::Instruction &inst) {
  const Attrs &a = inst.attrs();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  DeviceBuffer &x = in(0), &dy = in(1), &dw = out();
  int64_t k = x.shape.back(), n = dy.shape.back(), m = x.numel() / k;
  // dW [k, n] = xᵀ · dy; with transpose_w, dW [n, k] = dyᵀ · x.
  if (attrInt(a, "transpose_w") != 0) return transposedProduct(dy.data, n, x.data, k, m, dw.data, x.elem);
  return transposedProduct(x.data, k, dy.data, n, m, dw.data, x.elem);
}

} // namespace parax::runtime
