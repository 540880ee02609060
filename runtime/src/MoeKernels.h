// MoeKernels.h - CPU kernels of mixture-of-experts ops: the router, the
// routed experts, and their gradients, fp32 (sgemm per expert) with double
// sums for the router's scores. Internal to the CPU executor. Semantics:
// parax.router, parax.experts, parax.router_grad, parax.experts_grad in
// docs/dialect/ParaxDialect.md.

#ifndef PARAX_RUNTIME_MOEKERNELS_H
#define PARAX_RUNTIME_MOEKERNELS_H

#include "parax/runtime/Tensor.h"

namespace parax::runtime {

/// A router's attributes: how it scores and chooses experts.
struct Routing {
  int64_t topK = 1, groups = 1, topkGroups = 1;
  bool sigmoid = false, normalize = false;
  double scaling = 1;
};

/// The router: weights and indices [tokens, K] (bias may be null).
void router(const Tensor &x, const Tensor &gate, const Tensor *bias, const Routing &routing, Tensor &weights,
            Tensor &indices);
/// The gradient by the router's logits [tokens, E], given dweights.
void routerGrad(const Tensor &x, const Tensor &gate, const Tensor *bias, const Tensor &dweights,
                const Routing &routing, Tensor &dlogits);
/// How many (token, choice) pairs each expert receives: load [E]; with
/// `scores`, the sum of each expert's scores over the tokens instead. A
/// load [B, E] (x [B, S, H]) counts each sequence's tokens apart, and
/// with `scores` sums their normalised scores s_e / Σ_j s_j.
void routerLoad(const Tensor &x, const Tensor &gate, const Tensor *bias, const Routing &routing, bool scores,
                Tensor &load);
/// The load-balancing loss coefficient · E · Σ_e (load_e / T) · (scores_e / T);
/// per sequence (load [B, E]) the sum of each row's, over `sequences`.
double balanceLoss(const Tensor &load, const Tensor &scores, double coefficient, int64_t tokens, int64_t sequences);
/// The load-balancing loss's gradient by the logits [tokens, E]: with
/// g_e = coefficient · E · load_e / T², s_t · (g - g·s_t) (softmax) or
/// g · s_t · (1 - s_t) (sigmoid); T = `tokens`, the whole's count. Per
/// sequence (load [B, E]): g_be = coefficient · E · load_be / (T² ·
/// sequences), through the normalised scores s / Σ_j s_j.
void routerAuxGrad(const Tensor &x, const Tensor &gate, const Tensor &load, bool sigmoid, double coefficient,
                   int64_t tokens, int64_t sequences, Tensor &dlogits);
/// The routed experts' output (a choice outside 0 .. E-1 adds nothing).
void experts(const Tensor &x, const Tensor &weights, const Tensor &indices, const Tensor &wGate, const Tensor &wUp,
             const Tensor &wDown, Tensor &y);
/// Their gradients by x, the router's weights and the three stacks.
void expertsGrad(const Tensor &x, const Tensor &weights, const Tensor &indices, const Tensor &wGate,
                 const Tensor &wUp, const Tensor &wDown, const Tensor &dy, Tensor &dx, Tensor &dweights,
                 Tensor &dwGate, Tensor &dwUp, Tensor &dwDown);

} // namespace parax::runtime

#endif
