//===- Recompute.h - what selective recomputation makes again ---*- C++ -*-===//
//
// One rule for --parax-recompute (lib/Train/Recompute.cpp) and for the
// planner's `selective` (lib/Plan/LayerSolver.cpp), which costs what the
// pass does.
//
//===----------------------------------------------------------------------===//

#ifndef PARAX_TRAIN_RECOMPUTE_H
#define PARAX_TRAIN_RECOMPUTE_H

#include <cstdint>

namespace mlir {
class Operation;
} // namespace mlir

namespace parax {

/// A linear whose result is more than this many times as wide as its input
/// is made again by selective recomputation.
constexpr int64_t kRecomputedExpansion = 4;

/// Whether selective recomputation makes `op` again in the backward pass
/// (the views of what it makes again aside, which follow their operand):
/// the ops whose results are large next to the time they take -- norms,
/// activations, SwiGLU, rope, products, broadcasts, concats and attention
/// (Korthikanti et al. 2022) -- and a linear whose result is more than
/// kRecomputedExpansion times as wide as its input, a low-rank latent's
/// up-projection (DeepSeek-V3's MLA: q_b_proj 16x, kv_b_proj 64x,
/// recomputed as DeepSeek does, report §3.2.3; an MLP's up-projection is
/// 4x at most, and the lm head sits in the layer holding the loss, which is
/// never recomputed).
bool isSelectivelyRecomputed(mlir::Operation *op);

} // namespace parax

#endif // PARAX_TRAIN_RECOMPUTE_H
