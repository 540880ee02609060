//===- PlanPass.cpp - write the best plan onto the IR ---------------------===//

#include "parax/Dialect/Parax/IR/ParaxOps.h"
#include "parax/Dialect/Parax/Transforms/Passes.h"
#include "parax/Plan/Passes.h"
#include "parax/Plan/Planner.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

namespace parax {
#define GEN_PASS_DEF_PARAXPLANPASS
#include "parax/Plan/Passes.h.inc"
} // namespace parax

using namespace mlir;
using namespace parax;
using namespace parax::plan;

namespace {

// One sharding over the plan's grid: dims split over `tp` where the layout
// says so (plus `ep` on dimension 0 of expert weights and of the batch
// under expert parallelism, `cp` on the sequence under context
// parallelism, both outside `tp`), partial over `tp`.
ShardingAttr makeSharding(MLIRContext *context, FlatSymbolRefAttr grid,
                          int64_t rank, int8_t layout, int epDim = -1,
                          int cpDim = -1, ArrayRef<StringRef> partialAxes = {}) {
  Builder b(context);
  SmallVector<Attribute> dims;
  for (int64_t d = 0; d < rank; ++d) {
    SmallVector<Attribute> axes;
    if (d == epDim)
      axes.push_back(b.getStringAttr("ep"));
    if (d == cpDim)
      axes.push_back(b.getStringAttr("cp"));
    if (layout == d)
      axes.push_back(b.getStringAttr("tp"));
    dims.push_back(b.getArrayAttr(axes));
  }
  SmallVector<Attribute> partial;
  for (StringRef axis : partialAxes)
    partial.push_back(b.getStringAttr(axis));
  if (layout == kPartial)
    partial.push_back(b.getStringAttr("tp"));
  return ShardingAttr::get(context, grid, b.getArrayAttr(dims),
                           b.getArrayAttr(partial));
}

// Which dimension of a weight operand the op's strategy splits over tp.
int weightSplitDim(Operation *op, Value weight, StringRef strategy) {
  if (auto linear = dyn_cast<LinearOp>(op)) {
    if (weight != linear.getWeight())
      return strategy == "column" ? 0 : kReplicated; // bias follows the output
    bool t = linear.getTransposeW();
    if (strategy == "column")
      return t ? 0 : 1;
    if (strategy == "row")
      return t ? 1 : 0;
    return kReplicated;
  }
  if (isa<HeadLinearOp>(op))
    return strategy == "heads" ? 0 : kReplicated;
  if (isa<EmbeddingOp>(op))
    return strategy == "vocab" ? 0 : strategy == "hidden" ? 1 : kReplicated;
  if (isa<PositionEmbeddingOp>(op))
    return strategy == "split2" ? 1 : strategy == "split1" ? 0 : kReplicated;
  if (auto experts = dyn_cast<ExpertsOp>(op)) {
    if (strategy != "ffn")
      return kReplicated;
    return weight == experts.getWDown() ? 2 : 1;
  }
  return kReplicated;
}

struct ParaxPlanPass : public parax::impl::ParaxPlanPassBase<ParaxPlanPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    llvm::Expected<ClusterSpec> clusterSpec = resolveCluster(cluster);
    if (!clusterSpec) {
      mlir::emitError(module.getLoc()) << "parax-plan: " << llvm::toString(clusterSpec.takeError());
      return signalPassFailure();
    }
    llvm::Expected<Profile> stack = resolveProfile(profile);
    if (!stack) {
      mlir::emitError(module.getLoc()) << "parax-plan: " << llvm::toString(stack.takeError());
      return signalPassFailure();
    }
    clusterSpec->profile = *stack;
    llvm::Expected<Workload> work = parseWorkload(workload);
    if (!work) {
      mlir::emitError(module.getLoc()) << "parax-plan: " << llvm::toString(work.takeError());
      return signalPassFailure();
    }
    SmallVector<func::FuncOp> functions;
    for (auto function : module.getOps<func::FuncOp>())
      if (!function.isExternal() &&
          !function.getBody().getOps<EmbeddingOp>().empty())
        functions.push_back(function);
    for (func::FuncOp function : functions)
      if (failed(planFunction(module, function, *clusterSpec, *work)))
        return signalPassFailure();
  }

  LogicalResult planFunction(ModuleOp module, func::FuncOp function,
                             const ClusterSpec &clusterSpec,
                             const Workload &asked) {
    // Each slice of a fused weight gets a layout (and a box to load) of
    // its own.
    splitFusedParams(function);
    FailureOr<ModelGraph> model = analyzeModel(function);
    if (failed(model))
      return failure();
    const Workload work = resolveWorkload(asked, *model);
    PlanOptions options;
    options.lowering = true; // (what the partitioner and runtimes implement)
    options.topK = 1;
    // The program's batch is one microbatch of a data-parallel replica,
    // its sequences split over the replica's EP ranks (PlanPass's epDim):
    // a batch that ep does not divide is whole on every EP rank, each
    // computing it all -- not the plan costed. A searched ep divides it;
    // a pinned one that does not is refused for a training step (the
    // experts would add each copy's gradient) and warned of otherwise.
    options.epDivides = model->irBatch;
    if (work.ep && *work.ep > 1 && model->irBatch % *work.ep) {
      auto diag = work.kind == WorkloadKind::Train ? function.emitError() : function.emitWarning();
      diag << "parax-plan: ep=" << *work.ep << " does not divide the IR's batch (" << model->irBatch
           << "): each EP rank would compute the whole batch; build the IR with a batch of "
              "micro_batch x ep";
      if (work.kind == WorkloadKind::Train)
        return failure();
      options.epDivides = 0;
    }
    PlanResult result = searchPlans(*model, clusterSpec, work, options);
    if (result.plans.empty())
      return function.emitError() << "parax-plan: " << result.explanation;
    const Plan &plan = result.plans.front();
    MLIRContext *context = module.getContext();
    OpBuilder b(context);

    // The grid ([pp, dp, ep, cp, tp]; cp only under context parallelism).
    std::string gridName = ("plan_" + function.getSymName()).str();
    b.setInsertionPointToStart(module.getBody());
    SmallVector<StringRef> axes = {"pp", "dp", "ep", "tp"};
    SmallVector<int64_t> sizes = {plan.pp, plan.dp, plan.ep, plan.tp};
    if (plan.cp > 1) {
      axes.insert(axes.begin() + 3, "cp");
      sizes.insert(sizes.begin() + 3, plan.cp);
    }
    // Context parallelism deals each sequence out position by position
    // (cyclic): every cp rank holds early and late positions alike, so
    // causal attention is balanced over them.
    GridOp::create(b, function.getLoc(), gridName, b.getStrArrayAttr(axes),
                   b.getDenseI64ArrayAttr(sizes),
                   plan.cp > 1 ? b.getStrArrayAttr({"cp"}) : ArrayAttr());
    auto grid = FlatSymbolRefAttr::get(context, gridName);

    // Op layouts and stages.
    std::vector<LayerPlan> layers =
        layerPlansFor(*model, clusterSpec, work, plan);
    // Interleaved 1F1B with v chunks a device: virtual stage c (its
    // decoder layers from plan.chunkStart) on pipeline stage c % pp
    // (Megatron's layout); the prologue goes with the first, the epilogue
    // with the last. `parax.stage` is the virtual stage (the partitioner
    // maps it to the grid's pp axis).
    for (size_t l = 0; l < model->layers.size(); ++l) {
      int64_t stage = plan.stageOfLayer(l, model->layers[l].index);
      const LayerGraph &layer = model->layers[l];
      const LayerPlan &lp = layers[l];
      for (size_t i = 0; i < layer.ops.size(); ++i) {
        Operation *op = layer.ops[i].op;
        op->setAttr("parax.stage", b.getI64IntegerAttr(stage));
        SmallVector<Attribute> shardings;
        for (auto [k, result] : llvm::enumerate(op->getResults())) {
          auto type = cast<RankedTensorType>(result.getType());
          // Expert parallelism: the ep ranks of a replica hold their own
          // sequences (the batch dimension), exchanged only by the experts.
          // (Labels stay whole, shifted ones too: every rank counts them
          // all and the loss slices its own.)
          bool labels = isa<ShiftOp>(op) && llvm::any_of(result.getUsers(), [](Operation *user) {
                          return isa<LabelCountOp, CrossEntropyOp>(user);
                        });
          int epDim =
              plan.ep > 1 && type.getRank() >= 2 && type.getDimSize(0) % plan.ep == 0 && !labels ? 0 : -1;
          // Context parallelism: each cp rank its positions of every
          // sequence ([B, S, ...] values holding the whole sequence; a
          // slice of positions, the last for a prefill's logits, is
          // gathered), the embedding's result too: the token ids are read
          // whole (a rank loads a block of an input) and dealt out
          // cyclically in the program, each rank looking up its own.
          const ValueNode &value = layer.values[layer.ops[i].results[k]];
          int cpDim = plan.cp > 1 && type.getRank() >= 3 && type.getDimSize(1) == model->irSeq &&
                              !value.someSequence && !value.inKvCache
                          ? 1
                          : -1;
          // The loss where its tokens are: each ep and cp rank sums its
          // tokens' part, their logits never gathered (the labels loaded
          // split over ep, dealt out over cp in the program). Over ep only
          // where the logits' sequences are split (a batch that ep does not
          // divide is whole on every ep rank, and so is the loss).
          SmallVector<StringRef> tokenAxes;
          if (isa<CrossEntropyOp>(op)) {
            auto logits = cast<RankedTensorType>(op->getOperand(0).getType());
            if (plan.ep > 1 && logits.getDimSize(0) % plan.ep == 0)
              tokenAxes.push_back("ep");
            if (plan.cp > 1)
              tokenAxes.push_back("cp");
          }
          shardings.push_back(
              makeSharding(context, grid, type.getRank(), lp.layouts[i][k], epDim, cpDim, tokenAxes));
        }
        op->setAttr(ParaxDialect::kShardingsAttrName, b.getArrayAttr(shardings));
        // Parameters take the layout the op's strategy needs (the first
        // user decides for a tied weight).
        for (Value operand : op->getOperands()) {
          auto arg = dyn_cast<BlockArgument>(operand);
          if (!arg || !function.getArgAttr(arg.getArgNumber(),
                                           ParaxDialect::kParamAttrName) ||
              function.getArgAttr(arg.getArgNumber(),
                                  ParaxDialect::kShardingAttrName))
            continue;
          auto type = cast<RankedTensorType>(arg.getType());
          int split = weightSplitDim(op, arg, lp.strategy[i]);
          int epDim = isa<ExpertsOp>(op) && plan.ep > 1 ? 0 : -1;
          function.setArgAttr(arg.getArgNumber(), ParaxDialect::kShardingAttrName,
                              makeSharding(context, grid, type.getRank(), split, epDim));
        }
      }
    }

    // The plan, for the passes after this one (#parax.plan).
    FloatAttr capacity = work.expertCapacity && plan.ep > 1
                             ? b.getF64FloatAttr(*work.expertCapacity)
                             : FloatAttr();
    function->setAttr(
        ParaxDialect::kPlanAttrName,
        PlanAttr::get(context, clusterSpec.name, result.devices, work.toString(),
                      plan.pp, plan.dp, plan.ep, plan.tp, plan.cp,
                      b.getBoolAttr(plan.sequenceParallel), plan.microBatch,
                      plan.microBatches, toString(plan.schedule),
                      plan.schedule == Schedule::Interleaved ? plan.virtualStages : 1,
                      plan.zero, toString(plan.recompute), capacity,
                      b.getF64FloatAttr(plan.stepTime), b.getF64FloatAttr(plan.mfu),
                      b.getF64FloatAttr(std::round(plan.memory.total())), // (whole bytes: printed in decimal)
                      b.getF64FloatAttr(plan.tpComm + plan.ppComm + plan.dpComm +
                                        plan.epComm + plan.cpComm)));
    return success();
  }
};

} // namespace
