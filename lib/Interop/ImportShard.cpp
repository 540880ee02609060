//===- ImportShard.cpp - upstream shard annotations -> parax shardings ----===//

#include "parax/Dialect/Parax/IR/ParaxOps.h"
#include "parax/Interop/Passes.h"
#include "parax/Partition/Layout.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"

namespace parax {
#define GEN_PASS_DEF_PARAXIMPORTSHARDPASS
#include "parax/Interop/Passes.h.inc"
} // namespace parax

using namespace mlir;
using namespace parax;
using parax::partition::Layout;

namespace {

struct ParaxImportShardPass
    : public parax::impl::ParaxImportShardPassBase<ParaxImportShardPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    MLIRContext *context = module.getContext();
    OpBuilder b(context);
    llvm::StringMap<SmallVector<std::string>> axisNames; // grid -> names
    for (auto grid : llvm::make_early_inc_range(module.getOps<shard::GridOp>())) {
      ArrayRef<int64_t> shape = grid.getShape();
      if (!axes.empty() && axes.size() != shape.size()) {
        grid.emitError() << "import: " << axes.size() << " axis names for a grid of "
                         << shape.size() << " axes";
        return signalPassFailure();
      }
      SmallVector<std::string> names;
      for (size_t i = 0; i < shape.size(); ++i)
        names.push_back(axes.empty() ? "a" + std::to_string(i) : axes[i]);
      SmallVector<StringRef> refs(names.begin(), names.end());
      b.setInsertionPoint(grid);
      GridOp::create(b, grid.getLoc(), grid.getSymName(), b.getStrArrayAttr(refs),
                     b.getDenseI64ArrayAttr(shape), ArrayAttr());
      axisNames[grid.getSymName()] = names;
      grid.erase();
    }

    auto layoutOf = [&](shard::ShardingOp sharding, Operation *at) -> FailureOr<ShardingAttr> {
      auto names = axisNames.find(sharding.getGrid());
      if (names == axisNames.end())
        return at->emitError("import: unknown shard grid @") << sharding.getGrid();
      if (!sharding.getStaticHaloSizes().empty() ||
          !sharding.getStaticShardedDimsOffsets().empty())
        return at->emitError("import: halos and uneven shards are not supported");
      Layout layout;
      for (shard::GridAxesAttr axesAttr : sharding.getSplitAxes().getAxes()) {
        layout.dims.emplace_back();
        for (int16_t axis : axesAttr.asArrayRef())
          layout.dims.back().push_back(names->second[axis]);
      }
      return layout.toAttr(context, FlatSymbolRefAttr::get(context, sharding.getGrid()));
    };

    WalkResult walk = module.walk([&](shard::ShardOp op) -> WalkResult {
      auto shardingOp = op.getSharding().getDefiningOp<shard::ShardingOp>();
      if (!shardingOp)
        return op.emitError("import: the sharding must come from shard.sharding");
      FailureOr<ShardingAttr> attr = layoutOf(shardingOp, op);
      if (failed(attr))
        return WalkResult::interrupt();
      // Pad the per-dimension list to the tensor's rank.
      auto type = cast<RankedTensorType>(op.getSrc().getType());
      Layout layout = Layout::fromAttr(*attr);
      layout.dims.resize(type.getRank());
      ShardingAttr sharding = layout.toAttr(context, attr->getGrid());
      Value src = op.getSrc();
      auto function = op->getParentOfType<func::FuncOp>();
      if (auto arg = dyn_cast<BlockArgument>(src); arg && !op.getAnnotateForUsers()) {
        function.setArgAttr(arg.getArgNumber(), ParaxDialect::kShardingAttrName, sharding);
      } else if (op.getAnnotateForUsers()) {
        for (OpOperand &use : op.getResult().getUses())
          if (isa<func::ReturnOp>(use.getOwner()))
            function.setResultAttr(use.getOperandNumber(),
                                   ParaxDialect::kShardingAttrName, sharding);
      } else if (Operation *producer = src.getDefiningOp();
                 producer && isa<ParaxDialect>(producer->getDialect()) &&
                 producer->getNumResults() == 1) {
        producer->setAttr(ParaxDialect::kShardingsAttrName,
                          ArrayAttr::get(context, {sharding}));
      } else {
        return op.emitError("import: an annotation on neither an argument, a "
                            "returned value nor a parax op's result");
      }
      op.getResult().replaceAllUsesWith(src);
      op.erase();
      return WalkResult::advance();
    });
    if (walk.wasInterrupted())
      return signalPassFailure();
    module.walk([&](shard::ShardingOp op) {
      if (op->use_empty())
        op.erase();
    });
  }
};

} // namespace
