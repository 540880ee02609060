//===- ExportShard.cpp - parax shardings -> upstream shard on linalg ------===//

#include "parax/Dialect/Parax/IR/ParaxOps.h"
#include "parax/Interop/Passes.h"
#include "parax/Partition/Layout.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/AffineMap.h"

namespace parax {
#define GEN_PASS_DEF_PARAXEXPORTSHARDPASS
#include "parax/Interop/Passes.h.inc"
} // namespace parax

using namespace mlir;
using namespace parax;
using parax::partition::Layout;

namespace {

struct Exporter {
  OpBuilder &b;
  FlatSymbolRefAttr grid;
  llvm::StringMap<int16_t> axisIndex;

  // shard.sharding for the split part of `layout` (partial sums are left to
  // upstream propagation).
  Value sharding(Location loc, const Layout &layout) {
    SmallVector<shard::GridAxesAttr> split;
    for (const auto &axes : layout.dims) {
      SmallVector<int16_t> indices;
      for (const std::string &axis : axes)
        indices.push_back(axisIndex.lookup(axis));
      split.push_back(b.getDenseI16ArrayAttr(indices));
    }
    return shard::ShardingOp::create(b, loc, grid, split);
  }

  Value annotate(Location loc, Value value, const Layout &layout,
                 bool forUsers = false) {
    auto op = shard::ShardOp::create(b, loc, value.getType(), value,
                                     sharding(loc, layout));
    if (forUsers)
      op.setAnnotateForUsers(true);
    return op;
  }

  Value zeros(Location loc, RankedTensorType type) {
    Value empty = tensor::EmptyOp::create(b, loc, type.getShape(),
                                          type.getElementType());
    Value zero = arith::ConstantOp::create(
        b, loc, b.getFloatAttr(type.getElementType(), 0.0));
    return linalg::FillOp::create(b, loc, zero, empty).getResult(0);
  }

  // out[...] += a[...] * b[...] over `dims` loops with the given maps.
  Value contraction(Location loc, Value lhs, Value rhs, RankedTensorType type,
                    unsigned dims, ArrayRef<AffineMap> maps,
                    ArrayRef<utils::IteratorType> iterators) {
    return linalg::GenericOp::create(
               b, loc, type, ValueRange{lhs, rhs}, ValueRange{zeros(loc, type)},
               maps, iterators,
               [](OpBuilder &nb, Location l, ValueRange args) {
                 Value product = arith::MulFOp::create(nb, l, args[0], args[1]);
                 Value sum = arith::AddFOp::create(nb, l, args[2], product);
                 linalg::YieldOp::create(nb, l, sum);
               })
        .getResult(0);
  }

  // An elementwise generic over `inputs` computing `body(args)`.
  Value elementwise(Location loc, ValueRange inputs, RankedTensorType type,
                    function_ref<Value(OpBuilder &, Location, ValueRange)> body) {
    unsigned rank = type.getRank();
    SmallVector<AffineMap> maps(inputs.size() + 1,
                                b.getMultiDimIdentityMap(rank));
    SmallVector<utils::IteratorType> iterators(rank, utils::IteratorType::parallel);
    Value init = tensor::EmptyOp::create(b, loc, type.getShape(),
                                         type.getElementType());
    return linalg::GenericOp::create(
               b, loc, type, inputs, ValueRange{init}, maps, iterators,
               [&](OpBuilder &nb, Location l, ValueRange args) {
                 linalg::YieldOp::create(nb, l, body(nb, l, args));
               })
        .getResult(0);
  }

  static Value silu(OpBuilder &nb, Location l, Value x) {
    Value negated = arith::NegFOp::create(nb, l, x);
    Value e = math::ExpOp::create(nb, l, negated);
    Value one = arith::ConstantOp::create(nb, l, nb.getFloatAttr(x.getType(), 1.0));
    Value denominator = arith::AddFOp::create(nb, l, one, e);
    return arith::DivFOp::create(nb, l, x, denominator);
  }

  FailureOr<Value> convert(Operation *op, ArrayRef<Value> operands) {
    Location loc = op->getLoc();
    auto type = cast<RankedTensorType>(op->getResult(0).getType());
    MLIRContext *ctx = b.getContext();
    auto par = utils::IteratorType::parallel, red = utils::IteratorType::reduction;
    if (auto linear = dyn_cast<LinearOp>(op)) {
      if (linear.getBias() || type.getRank() != 2)
        return op->emitError("export: only linears on 2-D inputs without bias");
      AffineExpr m, n, k;
      bindDims(ctx, m, n, k);
      AffineMap w = linear.getTransposeW() ? AffineMap::get(3, 0, {n, k}, ctx)
                                           : AffineMap::get(3, 0, {k, n}, ctx);
      return contraction(loc, operands[0], operands[1], type, 3,
                         {AffineMap::get(3, 0, {m, k}, ctx), w,
                          AffineMap::get(3, 0, {m, n}, ctx)},
                         {par, par, red});
    }
    if (auto attention = dyn_cast<AttentionOp>(op)) {
      if (attention.getNumHeads() != attention.getNumKvHeads())
        return op->emitError("export: attention with one KV head per head only");
      if (attention.getValueDim())
        return op->emitError("export: attention with value_dim (values inside "
                             "v's channels) has no linalg form yet");
      auto q = cast<RankedTensorType>(operands[0].getType());
      auto k = cast<RankedTensorType>(operands[1].getType());
      int64_t batch = q.getDimSize(0), seq = q.getDimSize(1),
              heads = q.getDimSize(2), keys = k.getDimSize(1);
      AffineExpr bb, h, s, t, d;
      bindDims(ctx, bb, h, s, t, d);
      auto scoresType = RankedTensorType::get({batch, heads, seq, keys},
                                              q.getElementType());
      Value scores = contraction(
          loc, operands[0], operands[1], scoresType, 5,
          {AffineMap::get(5, 0, {bb, s, h, d}, ctx),
           AffineMap::get(5, 0, {bb, t, h, d}, ctx),
           AffineMap::get(5, 0, {bb, h, s, t}, ctx)},
          {par, par, par, par, red});
      // out[b, s, h, d] = sum_t scores[b, h, s, t] * v[b, t, h, d]
      return contraction(loc, scores, operands[2], type, 5,
                         {AffineMap::get(5, 0, {bb, h, s, t}, ctx),
                          AffineMap::get(5, 0, {bb, t, h, d}, ctx),
                          AffineMap::get(5, 0, {bb, s, h, d}, ctx)},
                         {par, par, par, red, par});
    }
    if (isa<SiluOp>(op))
      return elementwise(loc, operands, type,
                         [](OpBuilder &nb, Location l, ValueRange a) {
                           return silu(nb, l, a[0]);
                         });
    if (isa<SwigluOp>(op))
      return elementwise(loc, operands, type,
                         [](OpBuilder &nb, Location l, ValueRange a) {
                           return arith::MulFOp::create(nb, l, silu(nb, l, a[0]), a[1])
                               .getResult();
                         });
    if (auto add = dyn_cast<AddOp>(op)) {
      if (add.getLhs().getType() != add.getRhs().getType())
        return op->emitError("export: add without broadcasting only");
      return elementwise(loc, operands, type,
                         [](OpBuilder &nb, Location l, ValueRange a) {
                           return arith::AddFOp::create(nb, l, a[0], a[1]).getResult();
                         });
    }
    return op->emitError("export: no linalg form for '")
           << op->getName() << "' (the export covers 2-D linear, silu, swiglu, "
              "add and attention's two contractions: a whole model's "
              "embedding, norms and rope are refused here, the first of them "
              "by name)";
  }
};

struct ParaxExportShardPass
    : public parax::impl::ParaxExportShardPassBase<ParaxExportShardPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto grids = module.getOps<GridOp>();
    if (std::distance(grids.begin(), grids.end()) != 1) {
      mlir::emitError(module.getLoc()) << "export: needs exactly one parax.grid";
      return signalPassFailure();
    }
    GridOp grid = *grids.begin();
    if (grid.getCyclicAxesAttr()) { // upstream splits in blocks only
      grid.emitError() << "export: upstream shard has no cyclic split (cyclic_axes "
                       << grid.getCyclicAxesAttr() << ")";
      return signalPassFailure();
    }
    OpBuilder b(module.getContext());
    b.setInsertionPoint(grid);
    shard::GridOp::create(b, grid.getLoc(), grid.getSymName(), grid.getShape());
    Exporter exporter{b, FlatSymbolRefAttr::get(grid.getSymNameAttr()), {}};
    for (auto [i, name] : llvm::enumerate(grid.getAxisNames()))
      exporter.axisIndex[cast<StringAttr>(name).getValue()] = i;
    grid.erase();

    for (auto function : module.getOps<func::FuncOp>()) {
      if (function.isExternal())
        continue;
      Block &body = function.getBody().front();
      b.setInsertionPointToStart(&body);
      IRMapping mapping;
      for (BlockArgument arg : function.getArguments()) {
        auto sharding = function.getArgAttrOfType<ShardingAttr>(
            arg.getArgNumber(), ParaxDialect::kShardingAttrName);
        if (sharding) {
          mapping.map(arg, exporter.annotate(arg.getLoc(), arg,
                                             Layout::fromAttr(sharding)));
          function.removeArgAttr(arg.getArgNumber(), ParaxDialect::kShardingAttrName);
        }
      }
      SmallVector<Operation *> toErase;
      for (Operation &op : llvm::make_early_inc_range(body.without_terminator())) {
        if (!isa<ParaxDialect>(op.getDialect()))
          continue;
        b.setInsertionPoint(&op);
        SmallVector<Value> operands;
        for (Value operand : op.getOperands())
          operands.push_back(mapping.lookupOrDefault(operand));
        FailureOr<Value> converted = exporter.convert(&op, operands);
        if (failed(converted))
          return signalPassFailure();
        Value result = *converted;
        if (auto list = op.getAttrOfType<ArrayAttr>(ParaxDialect::kShardingsAttrName)) {
          Layout layout = Layout::fromAttr(cast<ShardingAttr>(list[0]));
          if (layout.partial.empty())
            result = exporter.annotate(op.getLoc(), result, layout);
        }
        mapping.map(op.getResult(0), result);
        toErase.push_back(&op);
      }
      // Results are wanted replicated.
      Operation *terminator = body.getTerminator();
      b.setInsertionPoint(terminator);
      for (OpOperand &operand : terminator->getOpOperands()) {
        Value value = mapping.lookupOrDefault(operand.get());
        auto type = cast<RankedTensorType>(value.getType());
        operand.set(exporter.annotate(terminator->getLoc(), value,
                                      Layout::replicated(type.getRank()),
                                      /*forUsers=*/true));
      }
      for (Operation *op : llvm::reverse(toErase))
        op->erase();
    }
  }
};

} // namespace
