//===- Layout.h - value layouts and resharding ------------------*- C++ -*-===//
//
// A Layout is a #parax.sharding without its grid: for each tensor dimension
// the grid axes it is split over (major to minor), and the partial-sum axes.
// `reshard` emits the communication that turns a value of one layout into
// another (DESIGN §4): partial -> replicated all_reduce, partial -> split
// reduce_scatter, split -> replicated all_gather, split on one dim -> split on
// another all_to_all, replicated -> split shard_slice, replicated -> partial
// to_partial.
//
//===----------------------------------------------------------------------===//

#ifndef PARAX_PARTITION_LAYOUT_H
#define PARAX_PARTITION_LAYOUT_H

#include "parax/Dialect/Parax/IR/ParaxOps.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"

#include <string>

namespace parax::partition {

struct Layout {
  using Axes = llvm::SmallVector<std::string, 2>;
  llvm::SmallVector<Axes> dims;
  llvm::SmallVector<std::string, 2> partial;

  static Layout replicated(int64_t rank);
  static Layout fromAttr(ShardingAttr sharding);
  ShardingAttr toAttr(mlir::MLIRContext *context, mlir::FlatSymbolRefAttr grid) const;
  bool operator==(const Layout &other) const {
    return dims == other.dims && partial == other.partial;
  }
  bool operator!=(const Layout &other) const { return !(*this == other); }
  bool isReplicated() const;
  /// Whether `want` is this layout sliced locally: no partial sum, and
  /// each dimension's axes a prefix of `want`'s.
  bool slicesTo(const Layout &want) const;
  std::string str() const;
};

/// The grid a partitioned function runs on.
struct GridInfo {
  mlir::FlatSymbolRefAttr ref;
  llvm::StringMap<int64_t> sizes;
  /// The axes in the grid's order (a collective names its axes so).
  llvm::SmallVector<std::string> order;
  /// Axes that split a dimension element by element (the grid's
  /// cyclic_axes), not in blocks.
  llvm::StringSet<> cyclic;
  int64_t product(llvm::ArrayRef<std::string> axes) const;
  /// Whether `layout` splits some dimension over a cyclic axis.
  bool splitsCyclically(const Layout &layout) const;
  /// Whether each split of `layout` divides its dimension of `shape`.
  bool divides(const Layout &layout, llvm::ArrayRef<int64_t> shape) const;
};

/// The local (per-rank) type of a value of global type `type` in `layout`.
mlir::RankedTensorType localType(mlir::RankedTensorType type,
                                 const Layout &layout, const GridInfo &grid);

/// Emits the ops that turn `value` (local, in layout `have`) into layout
/// `want`; returns the new local value, or failure with an error at `loc`
/// when no sequence of collectives does it.
mlir::FailureOr<mlir::Value> reshard(mlir::OpBuilder &builder,
                                     mlir::Location loc, mlir::Value value,
                                     const Layout &have, const Layout &want,
                                     const GridInfo &grid);

} // namespace parax::partition

#endif // PARAX_PARTITION_LAYOUT_H
