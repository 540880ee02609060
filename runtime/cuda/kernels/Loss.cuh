// Loss.cuh - the CUDA executor's kernels of cross_entropy, logsumexp and
// label_count: one CudaExecutor::State member an op or family, called through
// kKernels. A part of CudaExecutor.cu, which includes it (one translation
// unit, for nvcc and the SIMT emulator alike); not a header to include
// elsewhere.

namespace parax::runtime {

Status CudaExecutor::State::runCrossEntropy(const pxe::Instruction &inst) {
  const Attrs &a = inst.attrs();
  const pxe::OpKind op = inst.kind();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  DeviceBuffer &logits = in(0), &labels = in(1), &y = out();
  int64_t V = logits.shape.back(), tokens = logits.numel() / V;
  float invTokens = 1.0f / attrInt(a, "num_tokens", tokens); // (a rank's part of the mean)
  // After the labels: label_count's count (with ignore_index: its labels
  // skipped, the mean over it), then a vocab-parallel op's lse.
  const float *count = nullptr;
  VocabPart part;
  for (int k = 2; k < inst.operands_size(); ++k)
    (in(k).shape.empty() ? count : part.lse) = in(k).f();
  if (part.lse) {
    std::vector<std::string> axes = attrStrings(a, "vocab_axes");
    part.offset = groupIndex(axes) * V;
    part.vocab = V * groupSize(axes);
  }
  LabelRule rule;
  rule.ignores = count != nullptr;
  rule.ignore = static_cast<int32_t>(attrInt(a, "ignore_index"));
  rule.weight = static_cast<float>(attrFloat(a, "weight", 1.0));
  Status st = ensureScratch(1);
  if (!st.isOk()) return st;
  auto *badToken = reinterpret_cast<int32_t *>(scratch);
  PARAX_CUDA(cudaMemsetAsync(badToken, 0xff, 4, stream)); // -1: every label is valid
  if (op == pxe::OP_CROSS_ENTROPY) {
    PARAX_CUDA(cudaMemsetAsync(y.data, 0, 4, stream));
    st = withFloat(logits, [&](auto t) {
      using T = decltype(t);
      PARAX_LAUNCH(crossEntropyKernel<T>, tokens, kThreads, 0, stream)(logits.as<T>(), labels.i(), y.f(), V,
                                                                       badToken, rule, part);
      return Status::ok();
    });
    if (!st.isOk()) return st;
    if (count)
      PARAX_LAUNCH(divideByCountKernel, 1, 1, 0, stream)(y.f(), 1, count);
    if (!count || rule.weight != 1.0f)
      PARAX_LAUNCH(scaleKernel, 1, 1, 0, stream)(y.f(), 1, (count ? 1.0f : invTokens) * rule.weight);
  } else {
    st = withFloat(y, [&](auto t) {
      using T = decltype(t);
      PARAX_LAUNCH(crossEntropyGradKernel<T>, tokens, kThreads, 0, stream)(
          logits.as<T>(), labels.i(), y.as<T>(), V, invTokens, badToken, rule, count, part);
      return Status::ok();
    });
    if (!st.isOk()) return st;
  }
  return checkFlag(badToken, [&](int32_t bad) {
    return "label out of range at token " + std::to_string(bad) + " (vocabulary " +
           std::to_string(part.lse ? part.vocab : V) + ")";
  });
}

Status CudaExecutor::State::runLogsumexp(const pxe::Instruction &inst) {
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  DeviceBuffer &x = in(0);
  int64_t n = x.shape.back();
  return withFloat(x, [&](auto t) {
    using T = decltype(t);
    PARAX_LAUNCH(logSumExpKernel<T>, x.numel() / n, kThreads, 0, stream)(x.as<T>(), out().f(), n);
    return Status::ok();
  });
}

Status CudaExecutor::State::runLabelCount(const pxe::Instruction &inst) {
  const Attrs &a = inst.attrs();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  DeviceBuffer &labels = in(0), &count = out();
  if (labelCount) { // the step's count, set by parax-run --per-token-loss
    PARAX_LAUNCH(storeKernel, 1, 1, 0, stream)(count.f(), *labelCount);
    return Status::ok();
  }
  PARAX_CUDA(cudaMemsetAsync(count.data, 0, 4, stream));
  PARAX_LAUNCH(labelCountKernel, blocksFor(labels.numel()), kThreads, 0, stream)(
      labels.i(), labels.numel(), static_cast<int32_t>(attrInt(a, "ignore_index")), count.f());
  return Status::ok();
}

} // namespace parax::runtime
