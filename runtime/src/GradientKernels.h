// GradientKernels.h - CPU kernels of the backward pass (--parax-autodiff's
// gradient ops), fp32 with double sums. Internal to the CPU executor.

#ifndef PARAX_RUNTIME_GRADIENTKERNELS_H
#define PARAX_RUNTIME_GRADIENTKERNELS_H

#include "parax/runtime/Tensor.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>

namespace parax::runtime {

/// Which keys a query sees and which KV head a query head reads: what
/// attention and its gradient share.
struct AttentionGeometry {
  float scale = 1;
  /// Keys query `s` sees: first(s) .. visible(s) - 1 (first: `floor`,
  /// the first key of non-negative position in a ring's window, or later
  /// under a sliding window of the last `window` keys).
  std::function<int64_t(int64_t)> visible;
  int64_t window = 0, floor = 0;
  int64_t first(int64_t s) const {
    return std::max<int64_t>(floor, window > 0 ? visible(s) - window : 0);
  }
  /// Soft-capping of the scaled scores, c · tanh(s / c) (0: none).
  double softcap = 0;
  void capScores(float *scores, int64_t n) const {
    if (softcap > 0)
      for (int64_t t = 0; t < n; ++t) scores[t] = static_cast<float>(softcap * std::tanh(scores[t] / softcap));
  }
  int64_t headOffset = 0; // this rank's first query head
  int64_t group = 1;      // query heads per KV head
};

/// A row's maximum and the sum of exp(x - max) over it, in double: its
/// softmax is exp(x - max) / sum, its logsumexp max + log(sum).
struct RowExp {
  double max = 0, sum = 1;
  double logSumExp() const { return max + std::log(sum); }
};
RowExp rowExp(const float *x, int64_t n);

/// `divisor`: the count of the mean (this rank's rows may be a part of it);
/// a token labelled `ignore` gets a row of zeros.
void crossEntropyGrad(const Tensor &logits, const Tensor &labels, double divisor, std::optional<int32_t> ignore,
                      Tensor &dlogits, const Tensor *lse = nullptr, int64_t offset = 0);
void linearWeightGrad(const Tensor &x, const Tensor &dy, bool transposeW, Tensor &dw);
/// RMSNorm's gradients, or LayerNorm's (`centered`: x less its mean).
void normGrad(const Tensor &x, const Tensor &w, const Tensor &dy, double eps, bool centered, Tensor &dx,
              double offset = 0);
void normWeightGrad(const Tensor &x, const Tensor &dy, double eps, bool centered, Tensor &dw);
/// x summed over the dimensions where `y` (of x's rank) has size 1.
void sumTo(const Tensor &x, Tensor &y);
void geluGrad(const Tensor &x, const Tensor &dy, bool tanhApprox, Tensor &dx);
void swigluGrad(const Tensor &gate, const Tensor &up, const Tensor &dy, int operand, Tensor &d);
void attentionGrad(const Tensor &q, const Tensor &k, const Tensor &v, const Tensor &dout,
                   const AttentionGeometry &geometry, Tensor &dq, Tensor &dk, Tensor &dv);
/// Rows `offset ..` of the table's gradient; ids outside add nothing.
void embeddingGrad(const Tensor &ids, const Tensor &dy, int64_t offset, Tensor &dtable, float scale = 1);

} // namespace parax::runtime

#endif // PARAX_RUNTIME_GRADIENTKERNELS_H
