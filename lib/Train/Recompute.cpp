//===- Recompute.cpp - activations made again in the backward pass -------===//
//
// For each transformer layer of a training step (after --parax-autodiff),
// the layer's forward ops (all of them, or the cheap ones) are cloned, each
// just before its first reader among the layer's gradient ops, which read
// the clones: the forward values die at their last forward use.
//
//===----------------------------------------------------------------------===//

#include "parax/Train/Recompute.h"
#include "parax/Dialect/Parax/IR/ParaxOps.h"
#include "parax/Train/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

#include <map>
#include <set>

namespace parax {
#define GEN_PASS_DEF_PARAXRECOMPUTEPASS
#include "parax/Train/Passes.h.inc"
} // namespace parax

using namespace mlir;
using namespace parax;

namespace {

std::optional<int64_t> layerOf(Operation *op) {
  if (auto layer = op->getAttrOfType<IntegerAttr>(ParaxDialect::kLayerAttrName))
    return layer.getInt();
  return std::nullopt;
}

bool view(Operation *op) { return isa<ReshapeOp, SliceOp, TransposeOp>(op); }

} // namespace

bool parax::isSelectivelyRecomputed(Operation *op) {
  if (auto linear = dyn_cast<LinearOp>(op))
    return cast<ShapedType>(linear.getResult().getType()).getShape().back() >
           kRecomputedExpansion *
               cast<ShapedType>(linear.getX().getType()).getShape().back();
  return isa<RmsNormOp, LayerNormOp, SiluOp, SigmoidOp, GeluOp, SwigluOp,
             RopeOp, MulOp, BroadcastOp, ConcatOp, AttentionOp>(op);
}

namespace {

LogicalResult recompute(func::FuncOp function, StringRef mode) {
  Block &body = function.getBody().front();
  // The forward pass: the ops before the loss's gradient (--parax-autodiff
  // appends the backward pass after them).
  Operation *backwardStart = nullptr;
  for (Operation &op : body)
    if (isa<CrossEntropyGradOp>(op)) {
      backwardStart = &op;
      break;
    }
  if (!backwardStart)
    return function.emitError("--parax-recompute needs a training step: run "
                              "--parax-autodiff first");
  std::map<int64_t, SmallVector<Operation *>> forwardOf;
  std::set<int64_t> head; // the layer holding the loss: its backward comes first
  for (Operation &op : body) {
    if (&op == backwardStart)
      break;
    std::optional<int64_t> layer = layerOf(&op);
    if (!layer || *layer < 0)
      continue;
    if (isa<CrossEntropyOp>(op))
      head.insert(*layer);
    forwardOf[*layer].push_back(&op);
  }
  OpBuilder b(function.getContext());
  for (auto &[layer, forward] : forwardOf) {
    if (head.count(layer))
      continue;
    // The layer's first gradient op: the clones go just before it.
    Operation *first = nullptr;
    for (Operation *op = backwardStart; op && !first; op = op->getNextNode())
      if (layerOf(op) == layer)
        first = op;
    if (!first)
      continue;
    b.setInsertionPoint(first);
    IRMapping again;
    SmallVector<Operation *> clones;
    for (Operation *op : forward) {
      bool recomputed = mode == "full" || isSelectivelyRecomputed(op) ||
                        (view(op) && again.contains(op->getOperand(0)));
      if (recomputed)
        clones.push_back(b.clone(*op, again));
    }
    // The layer's gradient ops (from `first` on) read the recomputed values.
    for (Operation *op : forward)
      for (Value result : op->getResults())
        if (Value copy = again.lookupOrNull(result))
          result.replaceUsesWithIf(copy, [&](OpOperand &use) {
            return !use.getOwner()->isBeforeInBlock(first);
          });
    // Clones no gradient op reads: dropped; the others moved down to just
    // before their first reader, last first (so that a value is made again
    // only when the backward pass reaches it, and a pipeline stage receives
    // its gradient before it recomputes).
    for (Operation *clone : llvm::reverse(clones)) {
      if (clone->use_empty()) {
        clone->erase();
        continue;
      }
      Operation *reader = nullptr;
      for (Operation *user : clone->getUsers())
        if (!reader || user->isBeforeInBlock(reader))
          reader = user;
      clone->moveBefore(reader);
    }
  }
  return success();
}

struct RecomputePass : parax::impl::ParaxRecomputePassBase<RecomputePass> {
  using ParaxRecomputePassBase::ParaxRecomputePassBase;
  void runOnOperation() override {
    if (mode != "plan" && mode != "none" && mode != "selective" && mode != "full") {
      emitError(getOperation().getLoc())
          << "--parax-recompute: mode must be none, selective, full or plan, got '"
          << mode << "'";
      return signalPassFailure();
    }
    for (auto function : getOperation().getOps<func::FuncOp>()) {
      if (function.isExternal())
        continue;
      std::string chosen = mode;
      if (chosen == "plan") {
        auto plan = function->getAttrOfType<PlanAttr>(ParaxDialect::kPlanAttrName);
        chosen = plan ? plan.getRecompute().str() : "none";
      }
      if (chosen == "none")
        continue;
      if (failed(recompute(function, chosen)))
        return signalPassFailure();
    }
  }
};

} // namespace
