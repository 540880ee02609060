// Loss.cpp - the CPU executor's kernels of cross_entropy, logsumexp and
// label_count (each an Executor::Impl member, called through Executor.cpp's
// kKernels).

#include "../ExecutorImpl.h"

namespace parax::runtime {

// cross_entropy, cross_entropy_grad
Status Executor::Impl::runCrossEntropy(const pxe::Instruction &inst, int variant) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  const std::string &op = opName(inst); // (for messages)
  // After the labels: label_count's count (rank 0), then a vocab-parallel
  // op's lse (this rank's logits the vocabulary's columns offset ..).
  Tensor &logits = in(0), &labels = in(1);
  const Tensor *count = nullptr, *lse = nullptr;
  for (int k = 2; k < inst.operands_size(); ++k)
    (in(k).shape.empty() ? count : lse) = &in(k);
  std::vector<std::string> vocabAxes = attrStrings(a, "vocab_axes");
  auto [tokens, V] = rowsCols(logits);
  int64_t offset = lse ? groupIndex(vocabAxes) * V : 0;
  CountedLabels counted = countedLabels(a, labels, count);
  if (Status st = counted.check(lse ? V * groupSizeOf(vocabAxes) : V); !st.isOk()) return st;
  if (variant == 1) {
    crossEntropyGrad(logits, labels, counted.divisor, counted.ignore, out(), lse, offset);
    return Status::ok();
  }
  double total = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    int64_t label = labels.i[t];
    if (counted.ignore && label == *counted.ignore) continue;
    const float *l = &logits.f[t * V];
    if (lse) { // the term of a label this rank holds
      if (label >= offset && label < offset + V) total += lse->f[t] - l[label - offset];
      continue;
    }
    total += rowExp(l, V).logSumExp() - l[label];
  }
  out().f[0] = static_cast<float>(total / counted.divisor); // (a rank's part of the mean)
  return Status::ok();
}

// logsumexp
Status Executor::Impl::runLogsumexp(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  auto [rows, n] = rowsCols(in(0));
  for (int64_t r = 0; r < rows; ++r) {
    RowExp row = rowExp(&in(0).f[r * n], n);
    out().f[r] = static_cast<float>(std::isinf(row.max) ? row.max : row.logSumExp());
  }
  return Status::ok();
}

// label_count
Status Executor::Impl::runLabelCount(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  int32_t ignore = static_cast<int32_t>(attrInt(a, "ignore_index"));
  out().f.assign(1, e.labelCount_ ? *e.labelCount_
                                  : static_cast<float>(std::count_if(in(0).i.begin(), in(0).i.end(),
                                                                     [&](int32_t label) { return label != ignore; })));
  return Status::ok();
}

} // namespace parax::runtime
