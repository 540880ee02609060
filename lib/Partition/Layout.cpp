//===- Layout.cpp - value layouts and resharding --------------------------===//

#include "parax/Partition/Layout.h"

#include "llvm/ADT/StringExtras.h"

using namespace mlir;
using namespace parax;
using namespace parax::partition;

Layout Layout::replicated(int64_t rank) {
  Layout layout;
  layout.dims.resize(rank);
  return layout;
}

Layout Layout::fromAttr(ShardingAttr sharding) {
  Layout layout;
  for (unsigned d = 0, e = sharding.getDims().size(); d < e; ++d) {
    layout.dims.emplace_back();
    for (StringRef axis : sharding.getSplitAxes(d))
      layout.dims.back().push_back(axis.str());
  }
  for (Attribute axis : sharding.getPartialAxes())
    layout.partial.push_back(cast<StringAttr>(axis).getValue().str());
  return layout;
}

ShardingAttr Layout::toAttr(MLIRContext *context, FlatSymbolRefAttr grid) const {
  Builder b(context);
  SmallVector<Attribute> dimAttrs;
  for (const auto &axes : dims) {
    SmallVector<Attribute> names;
    for (const std::string &axis : axes)
      names.push_back(b.getStringAttr(axis));
    dimAttrs.push_back(b.getArrayAttr(names));
  }
  SmallVector<Attribute> partialAttrs;
  for (const std::string &axis : partial)
    partialAttrs.push_back(b.getStringAttr(axis));
  return ShardingAttr::get(context, grid, b.getArrayAttr(dimAttrs),
                           b.getArrayAttr(partialAttrs));
}

bool Layout::isReplicated() const {
  return partial.empty() &&
         llvm::all_of(dims, [](const auto &axes) { return axes.empty(); });
}

bool Layout::slicesTo(const Layout &want) const {
  if (!partial.empty() || !want.partial.empty() || dims.size() != want.dims.size())
    return false;
  for (auto [axes, target] : llvm::zip(dims, want.dims))
    if (axes.size() > target.size() || !std::equal(axes.begin(), axes.end(), target.begin()))
      return false;
  return true;
}

std::string Layout::str() const {
  std::string text = "[";
  for (auto [i, axes] : llvm::enumerate(dims))
    text += (i ? ", {" : "{") + llvm::join(axes, ", ") + "}";
  text += "]";
  if (!partial.empty())
    text += ", partial = {" + llvm::join(partial, ", ") + "}";
  return text;
}

int64_t GridInfo::product(ArrayRef<std::string> axes) const {
  int64_t n = 1;
  for (const std::string &axis : axes)
    n *= sizes.lookup(axis);
  return n;
}

bool GridInfo::splitsCyclically(const Layout &layout) const {
  for (const auto &axes : layout.dims)
    for (const std::string &axis : axes)
      if (cyclic.contains(axis))
        return true;
  return false;
}

bool GridInfo::divides(const Layout &layout, ArrayRef<int64_t> shape) const {
  for (auto [d, axes] : llvm::enumerate(layout.dims))
    if (d < shape.size() && shape[d] % product(axes))
      return false;
  return true;
}

RankedTensorType parax::partition::localType(RankedTensorType type,
                                             const Layout &layout,
                                             const GridInfo &grid) {
  SmallVector<int64_t> shape(type.getShape());
  for (auto [d, axes] : llvm::enumerate(layout.dims))
    if (d < shape.size())
      shape[d] /= grid.product(axes);
  return RankedTensorType::get(shape, type.getElementType());
}

namespace {

// Builds the collectives one axis at a time, tracking the current layout.
struct Resharder {
  OpBuilder &b;
  Location loc;
  const GridInfo &grid;
  Value value;
  Layout cur;

  RankedTensorType type() const { return cast<RankedTensorType>(value.getType()); }
  ArrayAttr axes(StringRef axis) { return b.getStrArrayAttr({axis}); }

  RankedTensorType scaled(int64_t dim, int64_t num, int64_t den) {
    SmallVector<int64_t> shape(type().getShape());
    shape[dim] = shape[dim] * num / den;
    return RankedTensorType::get(shape, type().getElementType());
  }

  void allReduce(ArrayRef<std::string> names) { // (one collective over them all)
    SmallVector<StringRef> list(names.begin(), names.end());
    value = AllReduceOp::create(b, loc, type(), value, grid.ref, b.getStrArrayAttr(list));
  }
  // A cyclic axis of n ranks deals dimension `dim` out element by element:
  // viewed as [.., dim / n, n, ..], rank c holds index c of the new inner
  // dimension. `viewInner(dim, n)` reshapes to that view (n: the inner
  // size), `joinInner(dim)` back.
  void viewInner(int64_t dim, int64_t n) {
    SmallVector<int64_t> shape(type().getShape());
    shape[dim] /= n;
    shape.insert(shape.begin() + dim + 1, n);
    value = ReshapeOp::create(b, loc, RankedTensorType::get(shape, type().getElementType()), value);
  }
  void joinInner(int64_t dim) {
    SmallVector<int64_t> shape(type().getShape());
    shape[dim] *= shape[dim + 1];
    shape.erase(shape.begin() + dim + 1);
    value = ReshapeOp::create(b, loc, RankedTensorType::get(shape, type().getElementType()), value);
  }
  bool cyclic(StringRef axis) const { return grid.cyclic.contains(axis); }

  // Emits `collective(d)` along dimension `dim`, or, over a cyclic axis,
  // along the inner dimension of the view [.., dim / inner, inner, ..]
  // (`inner`: that dimension's size before the collective), then views the
  // result as one dimension again.
  template <typename Collective>
  void along(StringRef axis, int64_t dim, int64_t inner, Collective collective) {
    if (!cyclic(axis))
      return collective(dim);
    viewInner(dim, inner);
    collective(dim + 1);
    joinInner(dim);
  }
  void reduceScatter(StringRef axis, int64_t dim) {
    int64_t n = grid.sizes.lookup(axis);
    along(axis, dim, n, [&](int64_t d) {
      value = ReduceScatterOp::create(b, loc, scaled(d, 1, n), value, grid.ref,
                                      axes(axis), b.getI64IntegerAttr(d));
    });
  }
  void allGather(StringRef axis, int64_t dim) { // (cyclic: each rank's elements back in place)
    int64_t n = grid.sizes.lookup(axis);
    along(axis, dim, 1, [&](int64_t d) {
      value = AllGatherOp::create(b, loc, scaled(d, n, 1), value, grid.ref,
                                  axes(axis), b.getI64IntegerAttr(d));
    });
  }
  void allToAll(StringRef axis, int64_t split, int64_t concat) {
    int64_t n = grid.sizes.lookup(axis);
    SmallVector<int64_t> shape(type().getShape());
    shape[split] /= n;
    shape[concat] *= n;
    value = AllToAllOp::create(
        b, loc, RankedTensorType::get(shape, type().getElementType()), value,
        grid.ref, axes(axis), b.getI64IntegerAttr(split),
        b.getI64IntegerAttr(concat));
  }
  void shardSlice(StringRef axis, int64_t dim) { // (cyclic: every n-th element)
    int64_t n = grid.sizes.lookup(axis);
    along(axis, dim, n, [&](int64_t d) {
      value = ShardSliceOp::create(b, loc, scaled(d, 1, n), value, grid.ref,
                                   axes(axis), b.getI64IntegerAttr(d));
    });
  }
  void toPartial(StringRef axis) {
    value = ToPartialOp::create(b, loc, type(), value, grid.ref, axes(axis));
  }

  // Whether appending `axis` to the current split of `dim` moves toward
  // `want` (the current axes are a prefix of the wanted ones, followed by it).
  bool extends(const Layout &want, int64_t dim, StringRef axis) const {
    const auto &have = cur.dims[dim], &target = want.dims[dim];
    if (have.size() >= target.size() ||
        !std::equal(have.begin(), have.end(), target.begin()))
      return false;
    return target[have.size()] == axis;
  }
  bool isPrefix(const Layout &want, int64_t dim) const {
    const auto &have = cur.dims[dim], &target = want.dims[dim];
    return have.size() <= target.size() &&
           std::equal(have.begin(), have.end(), target.begin());
  }
  std::optional<int64_t> dimWanting(const Layout &want, StringRef axis) const {
    for (int64_t d = 0, e = cur.dims.size(); d < e; ++d)
      if (extends(want, d, axis))
        return d;
    return std::nullopt;
  }

  LogicalResult run(const Layout &want) {
    int64_t rank = cur.dims.size();
    // Every wanted split divides its dimension (else some rank would hold
    // nothing, or a ragged piece).
    for (int64_t d = 0; d < rank && d < type().getRank(); ++d) {
      int64_t size = type().getDimSize(d) * grid.product(cur.dims[d]), parts = grid.product(want.dims[d]);
      if (size % parts)
        return emitError(loc) << "cannot reshard to " << want.str() << ": dimension " << d << " of size "
                              << size << " does not split over " << parts << " ranks";
    }
    // A cyclic axis deals a dimension out before any other axis splits it
    // (it comes first), and is never moved to another dimension.
    for (const Layout *layout : {static_cast<const Layout *>(&cur), &want})
      for (const auto &axes : layout->dims)
        for (size_t k = 1; k < axes.size(); ++k)
          if (cyclic(axes[k]))
            return emitError(loc) << "the cyclic axis '" << axes[k]
                                  << "' must come first among its dimension's axes in "
                                  << layout->str();
    // 1. Pending sums that are not wanted: reduce-scattered where a
    //    dimension wants the axis next, then the others all-reduced
    //    together, in one collective (over the scattered, smaller value).
    SmallVector<std::string, 2> reduced;
    for (std::string axis : SmallVector<std::string, 2>(cur.partial)) {
      if (llvm::is_contained(want.partial, axis))
        continue;
      if (std::optional<int64_t> d = dimWanting(want, axis)) {
        reduceScatter(axis, *d);
        cur.dims[*d].push_back(axis);
      } else {
        reduced.push_back(axis);
      }
      llvm::erase(cur.partial, axis);
    }
    if (!reduced.empty()) {
      llvm::sort(reduced, [&](const std::string &a, const std::string &b) {
        return llvm::find(grid.order, a) < llvm::find(grid.order, b);
      });
      allReduce(reduced);
    }
    // 2. Splits that are not wanted, minor axis first: move them to the
    //    dimension that wants them (all_to_all) or gather them.
    for (int64_t d = 0; d < rank; ++d)
      while (!isPrefix(want, d)) {
        std::string axis = cur.dims[d].back();
        cur.dims[d].pop_back();
        std::optional<int64_t> e = dimWanting(want, axis);
        if (e && *e != d && !cyclic(axis)) {
          allToAll(axis, *e, d);
          cur.dims[*e].push_back(axis);
        } else {
          allGather(axis, d);
        }
      }
    // 3. Splits still missing: take this rank's piece.
    for (int64_t d = 0; d < rank; ++d)
      while (cur.dims[d].size() < want.dims[d].size()) {
        std::string axis = want.dims[d][cur.dims[d].size()];
        if (llvm::is_contained(cur.partial, axis) ||
            llvm::any_of(cur.dims, [&](const auto &axes) {
              return llvm::is_contained(axes, axis);
            }))
          return emitError(loc) << "cannot reshard " << cur.str() << " to "
                                << want.str() << ": axis '" << axis
                                << "' is still in use";
        shardSlice(axis, d);
        cur.dims[d].push_back(axis);
      }
    // 4. Sums that are wanted but not pending: a replicated value viewed as a
    //    partial sum.
    for (const std::string &axis : want.partial)
      if (!llvm::is_contained(cur.partial, axis)) {
        if (llvm::any_of(cur.dims, [&](const auto &axes) {
              return llvm::is_contained(axes, axis);
            }))
          return emitError(loc) << "cannot make a value split over '" << axis
                                << "' a partial sum over it";
        toPartial(axis);
        cur.partial.push_back(axis);
      }
    if (cur != want)
      return emitError(loc) << "cannot reshard to " << want.str()
                            << " (reached " << cur.str() << ")";
    return success();
  }
};

} // namespace

FailureOr<Value> parax::partition::reshard(OpBuilder &builder, Location loc,
                                           Value value, const Layout &have,
                                           const Layout &want,
                                           const GridInfo &grid) {
  if (have == want)
    return value;
  Resharder r{builder, loc, grid, value, have};
  if (failed(r.run(want)))
    return failure();
  return r.value;
}
