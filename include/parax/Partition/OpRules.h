//===- OpRules.h - how each op runs on local pieces -------------*- C++ -*-===//
//
// For an op whose results have given layouts, the layouts its operands must
// have for the op to compute its local piece from local operands (weights
// included), and the attribute changes of the local op. Ops with no such
// layout (an attention split on its sequence, a norm split on its hidden
// dimension) are errors at the op, never silently replicated.
//
//===----------------------------------------------------------------------===//

#ifndef PARAX_PARTITION_OPRULES_H
#define PARAX_PARTITION_OPRULES_H

#include "parax/Partition/Layout.h"

namespace parax::partition {

/// Operand layouts for `op` given its result layouts; emits an error at the
/// op and fails when the op cannot run in those layouts. `current` (when
/// known) holds the layouts the operands have: a gradient that sums over
/// tokens (a weight's) keeps their token split where it already is.
mlir::FailureOr<llvm::SmallVector<Layout>>
operandLayouts(mlir::Operation *op, llvm::ArrayRef<Layout> results,
               const GridInfo &grid, llvm::ArrayRef<Layout> current = {});

/// Result layouts for an op nobody annotated, from its operands' layouts:
/// layout-preserving ops follow their first activation operand (a reshape
/// where a dimension of its result carries the split, attention its
/// queries' batch, sequence and heads), everything else is replicated.
llvm::SmallVector<Layout> propagateLayouts(mlir::Operation *op,
                                           llvm::ArrayRef<Layout> operands,
                                           const GridInfo &grid);

/// Whether integers (token ids, labels) in layout `have` become `want` by
/// each rank taking its part (shard_slice) alone: integers are never
/// gathered, moved or summed.
bool slicesTo(const Layout &have, const Layout &want);

/// Whether `want` is `have` with some of its pending sums reduce-scattered
/// (each such axis appended to a dimension's split) and nothing else.
bool reduceScattersTo(const Layout &have, const Layout &want);

/// Adjusts the attributes of the local copy `local` of an op partitioned with
/// `results` layouts (head counts of attention, vocab axes of an embedding).
void localizeAttributes(mlir::Operation *local, llvm::ArrayRef<Layout> results,
                        const GridInfo &grid);

} // namespace parax::partition

#endif // PARAX_PARTITION_OPRULES_H
