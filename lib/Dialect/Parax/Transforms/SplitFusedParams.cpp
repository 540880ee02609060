//===- SplitFusedParams.cpp - one parameter per slice of a fused weight ---===//

#include "parax/Dialect/Parax/IR/ParaxOps.h"
#include "parax/Dialect/Parax/Transforms/Passes.h"

#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/DenseMap.h"

#include <tuple>

namespace parax {
#define GEN_PASS_DEF_PARAXSPLITFUSEDPARAMSPASS
#include "parax/Dialect/Parax/Transforms/Passes.h.inc"
} // namespace parax

using namespace mlir;
using namespace parax;

namespace {

// Whether argument `index` is a parameter read only through slices that may
// become parameters of their own.
bool isFused(func::FuncOp function, unsigned index) {
  auto name = function.getArgAttrOfType<StringAttr>(index, ParaxDialect::kParamAttrName);
  if (!name || name.getValue().contains("{e}") ||
      function.getArgAttr(index, ParaxDialect::kShardingAttrName) ||
      function.getArgAttr(index, ParaxDialect::kGlobalShardingAttrName))
    return false;
  Value arg = function.getArgument(index);
  return !arg.use_empty() &&
         llvm::all_of(arg.getUsers(), [](Operation *user) { return isa<SliceOp>(user); });
}

} // namespace

unsigned parax::splitFusedParams(func::FuncOp function) {
  if (function.isExternal() ||
      !SymbolTable::symbolKnownUseEmpty(function, function->getParentOp()))
    return 0;
  MLIRContext *context = function.getContext();
  unsigned split = 0;
  // Backwards, so that inserting after argument `index` keeps the indices
  // still to visit valid.
  for (int index = static_cast<int>(function.getNumArguments()) - 1; index >= 0; --index) {
    if (!isFused(function, index))
      continue;
    Value fused = function.getArgument(index);
    auto type = cast<RankedTensorType>(fused.getType());
    ArrayRef<int64_t> shape = type.getShape();
    SmallVector<int64_t> offset(type.getRank(), 0), whole(shape.begin(), shape.end());
    if (auto o = function.getArgAttrOfType<DenseI64ArrayAttr>(index, ParaxDialect::kParamOffsetAttrName))
      offset.assign(o.asArrayRef().begin(), o.asArrayRef().end());
    if (auto w = function.getArgAttrOfType<DenseI64ArrayAttr>(index, ParaxDialect::kParamShapeAttrName))
      whole.assign(w.asArrayRef().begin(), w.asArrayRef().end());
    Attribute name = function.getArgAttr(index, ParaxDialect::kParamAttrName);

    // One new argument per distinct slice (dim, start, result type), in the
    // order the slices appear.
    llvm::DenseMap<std::tuple<int64_t, int64_t, Type>, unsigned> pieces;
    SmallVector<SliceOp> slices;
    for (Operation &op : function.getBody().front())
      if (auto slice = dyn_cast<SliceOp>(op); slice && slice.getX() == fused)
        slices.push_back(slice);
    unsigned next = index + 1;
    for (SliceOp slice : slices) {
      auto key = std::make_tuple(static_cast<int64_t>(slice.getDim()),
                                 static_cast<int64_t>(slice.getStart()), slice.getType());
      auto [it, added] = pieces.try_emplace(key, next);
      if (added) {
        SmallVector<int64_t> pieceOffset = offset;
        pieceOffset[slice.getDim()] += slice.getStart();
        NamedAttrList attrs;
        attrs.append(ParaxDialect::kParamAttrName, name);
        attrs.append(ParaxDialect::kParamOffsetAttrName, DenseI64ArrayAttr::get(context, pieceOffset));
        attrs.append(ParaxDialect::kParamShapeAttrName, DenseI64ArrayAttr::get(context, whole));
        // A planned slice's result layout is the piece's layout.
        if (auto layouts = slice->getAttrOfType<ArrayAttr>(ParaxDialect::kShardingsAttrName))
          attrs.append(ParaxDialect::kShardingAttrName, layouts[0]);
        (void)function.insertArgument(next, slice.getType(), attrs.getDictionary(context), slice.getLoc());
        ++next;
      }
      slice.getResult().replaceAllUsesWith(function.getArgument(it->second));
      slice.erase();
    }
    (void)function.eraseArgument(index);
    ++split;
  }
  return split;
}

namespace {

struct ParaxSplitFusedParamsPass
    : public parax::impl::ParaxSplitFusedParamsPassBase<ParaxSplitFusedParamsPass> {
  void runOnOperation() override {
    for (auto function : getOperation().getOps<func::FuncOp>())
      splitFusedParams(function);
  }
};

} // namespace
