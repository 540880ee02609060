//===- PartitionPass.cpp - annotated model -> per-stage SPMD programs -----===//

#include "parax/Partition/OpRules.h"
#include "parax/Partition/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SetVector.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>

namespace parax {
#define GEN_PASS_DEF_PARAXPARTITIONPASS
#include "parax/Partition/Passes.h.inc"
} // namespace parax

using namespace mlir;
using namespace parax;
using namespace parax::partition;

namespace {

constexpr StringLiteral kPipelineAxis = "pp";

int64_t stageOf(Operation *op) {
  if (auto stage = op->getAttrOfType<IntegerAttr>(ParaxDialect::kStageAttrName))
    return stage.getInt();
  return 0;
}

// The grid every sharding of `function` names (there must be one).
FailureOr<GridInfo> findGrid(ModuleOp module, func::FuncOp function) {
  FlatSymbolRefAttr ref;
  bool conflict = false;
  auto note = [&](Attribute attr) {
    if (auto sharding = dyn_cast_or_null<ShardingAttr>(attr)) {
      if (ref && ref != sharding.getGrid())
        conflict = true;
      ref = sharding.getGrid();
    }
  };
  for (unsigned i = 0; i < function.getNumArguments(); ++i)
    note(function.getArgAttr(i, ParaxDialect::kShardingAttrName));
  for (unsigned i = 0; i < function.getNumResults(); ++i)
    note(function.getResultAttr(i, ParaxDialect::kShardingAttrName));
  function.walk([&](Operation *op) {
    if (auto list = op->getAttrOfType<ArrayAttr>(ParaxDialect::kShardingsAttrName))
      for (Attribute attr : list)
        note(attr);
  });
  if (conflict) {
    function.emitError("shardings of one function name different grids");
    return failure();
  }
  GridOp grid;
  if (ref) {
    grid = SymbolTable::lookupNearestSymbolFrom<GridOp>(function, ref);
  } else {
    auto grids = module.getOps<GridOp>();
    if (std::distance(grids.begin(), grids.end()) == 1)
      grid = *grids.begin();
  }
  if (!grid) {
    function.emitError("nothing says how to partition this function: annotate "
                       "shardings (or run --parax-plan) over a parax.grid");
    return failure();
  }
  GridInfo info;
  info.ref = FlatSymbolRefAttr::get(grid.getSymNameAttr());
  for (auto [name, size] : llvm::zip(grid.getAxisNames(), grid.getShape())) {
    info.sizes[cast<StringAttr>(name).getValue()] = size;
    info.order.push_back(cast<StringAttr>(name).getValue().str());
  }
  if (ArrayAttr cyclic = grid.getCyclicAxesAttr())
    for (Attribute axis : cyclic)
      info.cyclic.insert(cast<StringAttr>(axis).getValue());
  return info;
}

struct Local {
  Value value;
  Layout layout;
};

class FunctionPartitioner {
public:
  FunctionPartitioner(ModuleOp module, func::FuncOp function, GridInfo grid, bool vocabParallel)
      : module(module), function(function), grid(std::move(grid)),
        builder(module.getContext()), vocabParallel(vocabParallel) {}

  LogicalResult run();

private:
  ModuleOp module;
  func::FuncOp function;
  GridInfo grid;
  OpBuilder builder;
  bool vocabParallel; // logits split on the vocabulary stay so for the loss
  DenseMap<Value, Layout> layouts; // global layout of every original value
  // Results an op computes in another layout than `layouts` holds them in:
  // resharded right after it (attention's dk and dv, reduce-scattered to
  // the layout of the keys and values they are the gradients of).
  DenseMap<Value, Layout> computedIn;
  // A norm gradient's x as its forward norm read it (normRows), by op.
  DenseMap<Operation *, Layout> normInput;
  // The results each stage returns, in order: the model's results from the
  // last stage; a training step's gradient of a parameter from every stage
  // that holds the parameter, in its layout (gradParam: result -> argument).
  std::map<int64_t, SmallVector<unsigned>> returnsOf;
  DenseMap<unsigned, unsigned> gradParam;
  // Interleaved 1F1B: each pipeline stage runs `chunks` model chunks,
  // virtual stages c * stages + stage (an op's `parax.stage` names its
  // virtual stage; virtualOf keeps it for every original value and op).
  int64_t chunks = 1;
  DenseMap<Value, int64_t> virtualOf;
  // A gradient of a weight that several stages read (a tied embedding and
  // head): result -> (stage -> that stage's part, which it returns).
  DenseMap<unsigned, std::map<int64_t, Value>> stageParts;

  RankedTensorType globalType(Value v) {
    return cast<RankedTensorType>(v.getType());
  }
  LogicalResult assignLayouts();
  std::optional<unsigned> parameterOf(unsigned result);
  std::optional<Layout> returnedParameterLayout(Value value);
  static Layout splitLikeParameter(Layout gradient, const Layout &param);
  std::optional<Layout> tableGradientLayout(EmbeddingGradOp grad, const Layout &param);
  std::optional<Layout> normRows(Value x);
  LogicalResult splitTiedGradients(int64_t stages);
  /// What `stage` returns as result i: its part of a tied weight's
  /// gradient, else the function's result.
  Value returnedBy(int64_t stage, unsigned i) {
    auto parts = stageParts.find(i);
    if (parts != stageParts.end() && parts->second.count(stage))
      return parts->second.at(stage);
    return function.getBody().front().getTerminator()->getOperand(i);
  }
  LogicalResult placeResults(int64_t stages,
                             const std::map<int64_t, SmallVector<Operation *>> &byStage);
  LogicalResult buildStage(int64_t stage, int64_t stages,
                           const std::map<int64_t, SmallVector<Operation *>> &ops,
                           DenseMap<Value, int64_t> &definedIn);
};

// The layout a planned op reads `operand` in (none when the op is not
// annotated, or cannot run in its annotated layouts: its own partitioning
// then reports that).
static std::optional<Layout> layoutReadBy(Operation *op, Value operand,
                                          const GridInfo &grid) {
  auto list = op->getAttrOfType<ArrayAttr>(ParaxDialect::kShardingsAttrName);
  if (!list)
    return std::nullopt;
  SmallVector<Layout> results;
  for (Attribute attr : list)
    results.push_back(Layout::fromAttr(cast<ShardingAttr>(attr)));
  ScopedDiagnosticHandler quiet(op->getContext(),
                                [](Diagnostic &) { return success(); });
  FailureOr<SmallVector<Layout>> wanted = operandLayouts(op, results, grid);
  if (failed(wanted))
    return std::nullopt;
  for (OpOperand &use : op->getOpOperands())
    if (use.get() == operand)
      return (*wanted)[use.getOperandNumber()];
  return std::nullopt;
}

// The parameter whose gradient result `i` is: the argument with its name
// (and, for one of several parts of a parameter, its offset).
std::optional<unsigned> FunctionPartitioner::parameterOf(unsigned i) {
  auto grad = function.getResultAttrOfType<StringAttr>(i, ParaxDialect::kGradAttrName);
  if (!grad)
    return std::nullopt;
  auto offset = function.getResultAttr(i, ParaxDialect::kParamOffsetAttrName);
  std::optional<unsigned> param;
  for (BlockArgument arg : function.getArguments())
    if (function.getArgAttr(arg.getArgNumber(), ParaxDialect::kParamAttrName) == grad &&
        function.getArgAttr(arg.getArgNumber(), ParaxDialect::kParamOffsetAttrName) == offset)
      param = arg.getArgNumber();
  return param;
}

// The layout of the parameter whose gradient `value` is (returned as it
// is, or through adds of its contributions, each read once), if any.
std::optional<Layout> FunctionPartitioner::returnedParameterLayout(Value value) {
  while (value.hasOneUse() && isa<AddOp>(*value.getUsers().begin()))
    value = value.getUsers().begin()->getResult(0);
  if (!value.hasOneUse())
    return std::nullopt;
  OpOperand &use = *value.getUses().begin();
  if (!isa<func::ReturnOp>(use.getOwner()))
    return std::nullopt;
  std::optional<unsigned> param = parameterOf(use.getOperandNumber());
  if (!param)
    return std::nullopt;
  return layouts.lookup(function.getArgument(*param));
}

// A weight's gradient computed whole on a dimension its parameter splits
// (the LM head's from a whole dlogits, a table's from a whole dy) is
// computed split so instead: each rank slices its operands, which costs no
// transfer, and computes and holds only its box, where it computed the
// whole gradient and then sliced it on the way out.
Layout FunctionPartitioner::splitLikeParameter(Layout gradient, const Layout &param) {
  auto used = [&](const std::string &axis) {
    return llvm::is_contained(gradient.partial, axis) ||
           llvm::any_of(gradient.dims, [&](const Layout::Axes &axes) {
             return llvm::is_contained(axes, axis);
           });
  };
  for (auto [have, want] : llvm::zip(gradient.dims, param.dims))
    if (have.empty() && !want.empty() && llvm::none_of(want, used))
      have = want;
  return gradient;
}

// A table's gradient whose dy arrives split over positions on axes that do
// not split the table (context parallelism): the ids (whole: the embedding
// reads them so) are sliced to dy's positions, and the gradient, in the
// table's split, is a partial sum over those axes (returned so, summed by
// the runtime's reduction with the other gradients' cp sums) where dy was
// gathered whole over them and every rank summed every position.
std::optional<Layout> FunctionPartitioner::tableGradientLayout(EmbeddingGradOp grad, const Layout &param) {
  const Layout &ids = layouts[grad.getIds()], &dy = layouts[grad.getDy()];
  if (!dy.partial.empty() || dy.dims.size() != ids.dims.size() + 1 || param.dims.size() != 2)
    return std::nullopt;
  Layout out = param, sliced = Layout::replicated(ids.dims.size());
  out.partial.clear();
  for (size_t d = 0; d < sliced.dims.size(); ++d)
    for (const std::string &axis : dy.dims[d])
      if (llvm::none_of(param.dims, [&](const Layout::Axes &axes) { return llvm::is_contained(axes, axis); })) {
        sliced.dims[d].push_back(axis);
        out.partial.push_back(axis);
      }
  if (out.partial.empty() || !slicesTo(ids, sliced))
    return std::nullopt;
  return out;
}

// The layout the norms reading `x` read it in, if they agree: a norm's
// gradients take x so, the rows their forward norm ran on. x's own layout
// may split its last dimension (an embedding's result split on the
// hidden size, all-to-all'd to the norm's rows under sequence
// parallelism), which would have the gradients gather x whole and
// all-reduce dy, where they now reuse the forward's copy of x and
// reduce-scatter dy.
std::optional<Layout> FunctionPartitioner::normRows(Value x) {
  std::optional<Layout> rows;
  for (Operation *user : x.getUsers()) {
    if (!isa<RmsNormOp, LayerNormOp>(user))
      continue;
    std::optional<Layout> read = layoutReadBy(user, x, grid);
    if (!read || (rows && *rows != *read))
      return std::nullopt;
    rows = read;
  }
  return rows;
}

LogicalResult FunctionPartitioner::assignLayouts() {
  for (BlockArgument arg : function.getArguments()) {
    auto type = dyn_cast<RankedTensorType>(arg.getType());
    if (!type)
      return function.emitError("argument #")
             << arg.getArgNumber() << " is not a ranked tensor";
    unsigned n = arg.getArgNumber();
    if (auto sharding = function.getArgAttrOfType<ShardingAttr>(
            n, ParaxDialect::kShardingAttrName)) {
      layouts[arg] = Layout::fromAttr(sharding);
      if (grid.splitsCyclically(layouts[arg]))
        return function.emitError("argument #")
               << n << " is split over a cyclic axis: a rank loads a block of "
               << "an argument; leave it unannotated (it is then loaded whole "
               << "and dealt out in the program)";
      continue;
    }
    layouts[arg] = Layout::replicated(type.getRank());
    // A data input (tokens, a KV cache) arrives in the layout its first
    // reader wants: each rank loads only the box it computes with (its
    // batch rows, its KV heads) instead of all of it and a shard_slice.
    if (function.getArgAttr(n, ParaxDialect::kParamAttrName) || arg.use_empty())
      continue;
    Operation *first = *llvm::min_element(arg.getUsers(), [](Operation *a, Operation *b) {
      return a->isBeforeInBlock(b);
    });
    std::optional<Layout> wanted = layoutReadBy(first, arg, grid);
    if (!wanted || !wanted->partial.empty() || grid.splitsCyclically(*wanted) ||
        !grid.divides(*wanted, type.getShape()))
      continue; // (a cyclic split is dealt out in the program: loads are blocks;
                // a split that does not divide is its reader's to refuse)
    layouts[arg] = *wanted;
    function.setArgAttr(n, ParaxDialect::kShardingAttrName,
                        wanted->toAttr(function.getContext(), grid.ref));
  }
  for (Operation &op : function.getBody().front().without_terminator()) {
    if (isa<AllReduceOp, AllGatherOp, ReduceScatterOp, AllToAllOp, ShardSliceOp,
            ToPartialOp, SendOp, RecvOp>(op))
      return op.emitError("this function is already partitioned");
    SmallVector<Layout> results;
    if (auto list = op.getAttrOfType<ArrayAttr>(ParaxDialect::kShardingsAttrName)) {
      for (Attribute attr : list)
        results.push_back(Layout::fromAttr(cast<ShardingAttr>(attr)));
    } else {
      SmallVector<Layout> operands;
      for (Value operand : op.getOperands())
        operands.push_back(layouts.lookup(operand));
      if (isa<RmsNormGradOp, LayerNormGradOp, RmsNormWeightGradOp, LayerNormWeightGradOp>(op))
        if (std::optional<Layout> rows = normRows(op.getOperand(0)))
          operands[0] = normInput[&op] = *rows;
      results = propagateLayouts(&op, operands, grid);
      // Under context parallelism attention's dk and dv are partial sums
      // over the keys' whole sequence (each rank's queries saw every key):
      // reduce-scattered to the keys' own layout (each rank its positions,
      // Megatron-LM's ring passes them back to their owners), the K and V
      // projections' backward then runs on a rank's positions, where they
      // were all-reduced and every rank ran it on the whole sequence.
      if (isa<AttentionGradOp>(op))
        for (unsigned i : {1, 2}) {
          const Layout &primal = layouts[op.getOperand(i)];
          if (reduceScattersTo(results[i], primal)) {
            computedIn[op.getResult(i)] = results[i];
            results[i] = primal;
          }
        }
      if (isa<LinearWeightGradOp, EmbeddingGradOp>(op))
        if (std::optional<Layout> param = returnedParameterLayout(op.getResult(0))) {
          std::optional<Layout> table;
          if (auto grad = dyn_cast<EmbeddingGradOp>(op))
            table = tableGradientLayout(grad, *param);
          results.front() = table ? *table : splitLikeParameter(results.front(), *param);
        }
    }
    // Vocab-parallel cross-entropy: logits split on the vocabulary stay
    // so, the loss a partial sum over those axes too (the plan's layout
    // names the tokens' axes only); or (vocab-parallel=false) gathered.
    if (isa<CrossEntropyOp, CrossEntropyGradOp>(op)) {
      const Layout &logits = layouts[op.getOperand(0)];
      Layout &out = results.front();
      if (!logits.dims.empty() && logits.partial.empty())
        for (const std::string &axis : logits.dims.back()) {
          if (!vocabParallel)
            llvm::erase(isa<CrossEntropyOp>(op) ? out.partial : out.dims.back(), axis);
          else if (isa<CrossEntropyOp>(op) && !llvm::is_contained(out.partial, axis))
            out.partial.push_back(axis);
        }
    }
    for (auto [result, layout] : llvm::zip(op.getResults(), results))
      layouts[result] = layout;
  }
  return success();
}

// Every token's logsumexp over the whole vocabulary of `logits`, this
// rank's columns of it split over `vocab`: each rank's logsumexp over its
// own, all-gathered ([..., P]), and the logsumexp of those; one a logits
// value (`cache`), for the loss and its gradient alike.
static Value logSumExp(OpBuilder &b, Location loc, Value logits, const Layout::Axes &vocab,
                       const GridInfo &grid, DenseMap<Value, Value> &cache) {
  if (Value known = cache.lookup(logits))
    return known;
  auto type = cast<RankedTensorType>(logits.getType());
  SmallVector<int64_t> shape(type.getShape());
  shape.back() = 1;
  auto one = RankedTensorType::get(shape, b.getF32Type()); // [..., 1] a token
  Value part = LogSumExpOp::create(b, loc, one, logits);
  SmallVector<StringRef> axes(vocab.begin(), vocab.end());
  shape.back() = grid.product(vocab); // every rank's
  Value parts = AllGatherOp::create(b, loc, RankedTensorType::get(shape, b.getF32Type()), part, grid.ref,
                                    b.getStrArrayAttr(axes), b.getI64IntegerAttr(type.getRank() - 1));
  return cache[logits] = LogSumExpOp::create(b, loc, one, parts);
}

// The all-to-all exchanges of a stage, by the local (tokens, router
// weights, indices) they send: the backward pass's experts reuse the rows
// their forward pass received.
using DispatchCache = std::map<std::tuple<void *, void *, void *>, MoeDispatchOp>;

// Expert parallelism (the stacks split on experts over `expertAxes`): every
// routed token dispatched to its expert's rank, the local experts run on
// what arrives, and the rows sent back. `experts`: the results summed per
// token. `experts_grad`: dy dispatched as the tokens were, the local
// gradients computed on the rows; dx returned summed per token, the router
// weights' gradients per choice (moe_combine per_choice), the stacks'
// gradients kept (each expert's whole: it saw every token routed to it).
static LogicalResult partitionRoutedExperts(OpBuilder &b, Operation *op,
                                            ArrayRef<Value> operands,
                                            ArrayRef<Layout> results,
                                            const Layout::Axes &expertAxes,
                                            const GridInfo &grid,
                                            DispatchCache &dispatched,
                                            DenseMap<Value, Local> &local) {
  Location loc = op->getLoc();
  auto indices = cast<RankedTensorType>(operands[2].getType());
  int64_t numExperts = cast<RankedTensorType>(op->getOperand(3).getType()).getDimSize(0);
  int64_t parts = grid.product(expertAxes);
  if (numExperts % parts)
    return op->emitError() << numExperts << " experts do not divide over "
                           << parts << " expert-parallel ranks";
  SmallVector<StringRef> axisNames(expertAxes.begin(), expertAxes.end());
  ArrayAttr axes = b.getStrArrayAttr(axisNames);
  IntegerAttr experts = b.getI64IntegerAttr(numExperts);
  // The rows a rank's dispatch holds: every rank's pairs (any routing), or
  // the plan's expert capacity times its own (the runtime stops a step that
  // routes more to a rank).
  int64_t pairs = indices.getNumElements(), rows = parts * pairs;
  auto function = op->getParentOfType<func::FuncOp>();
  if (auto plan = function->getAttrOfType<PlanAttr>(ParaxDialect::kPlanAttrName))
    if (FloatAttr capacity = plan.getExpertCapacity()) { // (>= 1: the verifier's)
      rows = std::clamp<int64_t>(
          static_cast<int64_t>(std::ceil(capacity.getValueAsDouble() * pairs)),
          pairs, rows);
    }
  auto dispatch = [&](Value x) {
    auto key = std::make_tuple(x.getAsOpaquePointer(), operands[1].getAsOpaquePointer(),
                               operands[2].getAsOpaquePointer());
    auto it = dispatched.find(key);
    if (it != dispatched.end())
      return it->second;
    auto type = cast<RankedTensorType>(x.getType());
    Type elem = type.getElementType();
    auto sent = MoeDispatchOp::create(
        b, loc, RankedTensorType::get({rows, type.getShape().back()}, elem),
        RankedTensorType::get({rows, 1}, elem),
        RankedTensorType::get({rows, 1}, b.getI32Type()), x, operands[1],
        operands[2], grid.ref, axes, experts);
    dispatched[key] = sent;
    return sent;
  };
  auto localOp = [&](Operation *created) {
    created->setAttrs(op->getDiscardableAttrDictionary());
    created->removeAttr(ParaxDialect::kShardingsAttrName);
    created->removeAttr(ParaxDialect::kStageAttrName);
    return created;
  };
  auto combine = [&](Value rowsIn, Type type, bool perChoice) -> Value {
    return MoeCombineOp::create(b, loc, type, rowsIn, operands[2], grid.ref, axes,
                                experts, perChoice ? b.getUnitAttr() : UnitAttr())
        .getResult();
  };
  auto localTypeOf = [&](unsigned result) {
    return localType(cast<RankedTensorType>(op->getResult(result).getType()),
                     results[result], grid);
  };
  MoeDispatchOp in = dispatch(operands[0]);
  if (isa<ExpertsOp>(op)) {
    Operation *run = localOp(ExpertsOp::create(
        b, loc, in.getRows().getType(), in.getRows(), in.getRowWeights(),
        in.getRowExperts(), operands[3], operands[4], operands[5]));
    local[op->getResult(0)] = Local{combine(run->getResult(0), localTypeOf(0), false),
                                    results[0]};
    return success();
  }
  Value dyRows = dispatch(operands[6]).getRows();
  Operation *grad = localOp(ExpertsGradOp::create(
      b, loc,
      TypeRange{in.getRows().getType(), in.getRowWeights().getType(),
                operands[3].getType(), operands[4].getType(), operands[5].getType()},
      in.getRows(), in.getRowWeights(), in.getRowExperts(), operands[3],
      operands[4], operands[5], dyRows));
  local[op->getResult(0)] = Local{combine(grad->getResult(0), localTypeOf(0), false),
                                  results[0]};
  SmallVector<int64_t> perChoice(indices.getShape());
  perChoice.push_back(1);
  Value dweights = combine(
      grad->getResult(1),
      RankedTensorType::get(perChoice, in.getRowWeights().getType().getElementType()),
      true);
  local[op->getResult(1)] = Local{ReshapeOp::create(b, loc, localTypeOf(1), dweights),
                                  results[1]};
  for (unsigned i : {2, 3, 4})
    local[op->getResult(i)] = Local{grad->getResult(i), results[i]};
  return success();
}

LogicalResult FunctionPartitioner::buildStage(
    int64_t stage, int64_t stages,
    const std::map<int64_t, SmallVector<Operation *>> &byStage,
    DenseMap<Value, int64_t> &definedIn) {
  MLIRContext *context = module.getContext();
  const SmallVector<Operation *> &ops = byStage.at(stage);
  Operation *terminator = function.getBody().front().getTerminator();

  // Arguments this stage reads, in the original order.
  llvm::SetVector<unsigned> argNumbers;
  llvm::SetVector<Value> received; // values from earlier stages
  for (Operation *op : ops)
    for (Value operand : op->getOperands()) {
      if (auto arg = dyn_cast<BlockArgument>(operand))
        argNumbers.insert(arg.getArgNumber());
      else if (definedIn.lookup(operand) != stage)
        received.insert(operand);
    }
  for (unsigned i : returnsOf[stage]) {
    Value result = returnedBy(stage, i);
    if (auto arg = dyn_cast<BlockArgument>(result))
      argNumbers.insert(arg.getArgNumber());
    else if (definedIn.lookup(result) != stage)
      received.insert(result);
  }
  SmallVector<unsigned> argList(argNumbers.begin(), argNumbers.end());
  llvm::sort(argList);

  std::string name = stages == 1 ? function.getSymName().str()
                                 : (function.getSymName() + "_stage" +
                                    std::to_string(stage)).str();
  SmallVector<Type> argTypes;
  for (unsigned a : argList)
    argTypes.push_back(localType(globalType(function.getArgument(a)),
                                 layouts[function.getArgument(a)], grid));
  builder.setInsertionPoint(function);
  auto stageFunction = func::FuncOp::create(
      builder, function.getLoc(), name, builder.getFunctionType(argTypes, {}));
  Block *entry = stageFunction.addEntryBlock();
  // Parameters keep their checkpoint name; data arguments record which
  // program input they are (a stage may read only some of them).
  for (auto [i, a] : llvm::enumerate(argList)) {
    if (auto param = function.getArgAttr(a, ParaxDialect::kParamAttrName)) {
      stageFunction.setArgAttr(i, ParaxDialect::kParamAttrName, param);
      for (StringRef box : {ParaxDialect::kParamOffsetAttrName, ParaxDialect::kParamShapeAttrName})
        if (Attribute value = function.getArgAttr(a, box))
          stageFunction.setArgAttr(i, box, value);
      continue;
    }
    int64_t input = 0;
    for (unsigned earlier = 0; earlier < a; ++earlier)
      if (!function.getArgAttr(earlier, ParaxDialect::kParamAttrName))
        ++input;
    stageFunction.setArgAttr(i, ParaxDialect::kInputAttrName,
                             builder.getI64IntegerAttr(input));
  }
  // Where each argument's slice comes from, for the loader: its sharding.
  for (auto [i, a] : llvm::enumerate(argList))
    if (auto sharding = function.getArgAttr(a, ParaxDialect::kShardingAttrName))
      stageFunction.setArgAttr(i, "parax.global_sharding", sharding);

  OpBuilder b = OpBuilder::atBlockBegin(entry);
  DenseMap<Value, Local> local;
  for (auto [i, a] : llvm::enumerate(argList))
    local[function.getArgument(a)] = {entry->getArgument(i),
                                      layouts[function.getArgument(a)]};
  // Transfers between stages: each value leaves its stage by send right
  // after the op that makes it, and a stage receives, from each other
  // stage, in the order the values are made there, each one when it is
  // first needed (and the ones made before it then). So sends and receives
  // pair up in order, and a stage whose backward pass waits for a later
  // stage's gradients has sent that stage its activations first.
  std::map<int64_t, SmallVector<Value>> incoming; // by stage, in the order made
  std::map<int64_t, size_t> nextIncoming;
  for (const auto &[from, fromOps] : byStage)
    for (Operation *op : fromOps)
      for (Value result : op->getResults())
        if (received.contains(result))
          incoming[from].push_back(result);
  // Interleaved chunks: the runtime runs a stage's program in ranges, each
  // one chunk's forward or backward pass for one microbatch (a last
  // stage's last chunk: both), in Megatron's order; a range begins at its
  // first receive, marked `range_start` (the first chunk's forward begins
  // the program). A value may only cross to the next virtual stage
  // (activations) or the one before (gradients), received in the range
  // that reads it, so that ranges pair up with their peers' in order.
  std::set<std::pair<int64_t, bool>> rangesBegun; // (virtual stage, backward)
  // Sends to a stage that is not a neighbour (an earlier stage's new keys
  // and values, which the last returns; until tied weights' gradients
  // became stage parts, the last stage's part of one) wait for this
  // stage's next receive or its end, after the sends to its neighbours
  // made meanwhile: sent at once, a stage could wait for a far stage to
  // take it while that stage waits for its neighbour, which waits for
  // this stage's next send (with rendezvous sends, forever).
  SmallVector<std::pair<Value, int64_t>> farSends;
  Operation *lastTransfer = nullptr; // the send or receive made last
  auto sendFar = [&]() {
    for (auto [value, to] : farSends)
      lastTransfer = SendOp::create(b, value.getLoc(), local[value].value, grid.ref,
                                    b.getStrArrayAttr({kPipelineAxis}), b.getI64IntegerAttr(to));
    farSends.clear();
  };
  auto receive = [&](Value value, Operation *reader) -> LogicalResult {
    if (isa<BlockArgument>(value) || local.count(value))
      return success();
    int64_t from = definedIn.lookup(value);
    sendFar();
    while (!local.count(value)) {
      Value next = incoming[from][nextIncoming[from]++];
      Type type = localType(globalType(next), layouts[next], grid);
      // ... and are received right after the transfer made last (with it,
      // in the group of receives the CUDA backend issues together):
      // received later, on its own, a stage would wait there while the far
      // stage, whose sends wait for their receives in one group with its
      // next microbatch's, waits for it (seen under 1F1B on the CUDA
      // backend with a tied weight's gradient sent to the first stage).
      OpBuilder::InsertionGuard guard(b);
      if (chunks == 1 && std::abs(from - stage) > 1 && lastTransfer && isa<RecvOp>(lastTransfer))
        b.setInsertionPointAfter(lastTransfer);
      auto recv = RecvOp::create(b, next.getLoc(), type, grid.ref,
                                 b.getStrArrayAttr({kPipelineAxis}),
                                 b.getI64IntegerAttr(from));
      lastTransfer = recv;
      local[next] = {recv, layouts[next]};
      if (chunks == 1)
        continue;
      if (!reader)
        return function.emitError("interleaved pipeline: result ")
               << "made on virtual stage " << virtualOf.lookup(next)
               << " is returned by another stage; results must be made where they are returned";
      int64_t sender = virtualOf.lookup(next), to = stageOf(reader);
      if (next != value)
        return reader->emitError("interleaved pipeline: a value of virtual stage ")
               << sender << " would be received before this op (virtual stage " << to
               << ") needs it: chunks must read their peers' values in the order they are made";
      if (std::abs(sender - to) != 1)
        return reader->emitError("interleaved pipeline: this op on virtual stage ")
               << to << " reads a value of virtual stage " << sender
               << "; chunks may only exchange with the next and the previous virtual stage";
      bool backward = sender > to;
      if (rangesBegun.insert({to, backward}).second && (backward || to >= stages))
        recv->setAttr("range_start", b.getUnitAttr());
    }
    return success();
  };
  // The other stages each value made here goes to.
  DenseMap<Value, SmallVector<int64_t>> sendTo;
  for (const auto &[other, otherOps] : byStage) {
    if (other == stage)
      continue;
    llvm::SetVector<Value> needed;
    for (Operation *op : otherOps)
      for (Value operand : op->getOperands())
        needed.insert(operand);
    for (unsigned i : returnsOf[other])
      needed.insert(returnedBy(other, i));
    for (Value value : needed)
      if (!isa<BlockArgument>(value) && definedIn.lookup(value) == stage)
        sendTo[value].push_back(other);
  }
  auto sendResults = [&](Operation *op) {
    for (Value result : op->getResults())
      for (int64_t to : sendTo.lookup(result)) {
        if (chunks == 1 && std::abs(to - stage) > 1) {
          farSends.push_back({result, to});
          continue;
        }
        lastTransfer = SendOp::create(b, result.getLoc(), local[result].value, grid.ref,
                                      b.getStrArrayAttr({kPipelineAxis}), b.getI64IntegerAttr(to));
      }
  };

  // Resharded copies are shared by the consumers that want the same layout.
  std::map<std::pair<void *, std::string>, std::pair<Layout, Value>> resharded;
  std::function<FailureOr<Value>(Value, const Layout &, Location)> get =
      [&](Value value, const Layout &want, Location loc) -> FailureOr<Value> {
    const Local &have = local[value];
    if (have.layout == want)
      return have.value;
    void *id = value.getAsOpaquePointer();
    auto key = std::make_pair(id, want.str());
    auto it = resharded.find(key);
    if (it != resharded.end())
      return it->second.second;
    // A partial sum made of a value that is none: from its copy in that
    // layout without the sum (shared: a gathered copy another reader made
    // is not gathered again), kept on one rank.
    Layout summed = want;
    summed.partial.clear();
    if (!want.partial.empty() && have.layout.partial.empty() && !(summed == have.layout)) {
      FailureOr<Value> base = get(value, summed, loc);
      if (failed(base))
        return failure();
      FailureOr<Value> out = reshard(b, loc, *base, summed, want, grid);
      if (succeeded(out))
        resharded[key] = {want, *out};
      return out;
    }
    // A copy another reader had gathered (or summed) gives every layout
    // it slices to locally: no second collective (the planner costs it
    // so, heldAfter).
    Value from = have.value;
    Layout fromLayout = have.layout;
    for (auto copy = resharded.lower_bound({id, ""}); copy != resharded.end() && copy->first.first == id;
         ++copy)
      if (copy->second.first.slicesTo(want)) {
        std::tie(fromLayout, from) = copy->second;
        break;
      }
    FailureOr<Value> out = reshard(b, loc, from, fromLayout, want, grid);
    if (succeeded(out))
      resharded[key] = {want, *out};
    return out;
  };

  DispatchCache dispatched;
  DenseMap<Value, Value> lse; // vocab-parallel logits -> their logsumexp
  for (Operation *op : ops) {
    for (Value operand : op->getOperands())
      if (failed(receive(operand, op)))
        return failure();
    // Two partial sums over the same ranks, added where the result is
    // wanted summed: added as they are, the sum reduced once (a loss of
    // several cross-entropies, each a partial sum over the tokens' and the
    // vocabulary's ranks: one all-reduce of the scalar, not one each).
    if (isa<AddOp>(op) && !computedIn.count(op->getResult(0))) {
      const Layout &lhs = local[op->getOperand(0)].layout, &rhs = local[op->getOperand(1)].layout;
      const Layout &wanted = layouts[op->getResult(0)];
      if (!lhs.partial.empty() && lhs == rhs && wanted.partial.empty() && lhs.dims == wanted.dims &&
          globalType(op->getOperand(0)) == globalType(op->getResult(0)) &&
          globalType(op->getOperand(1)) == globalType(op->getResult(0)))
        computedIn[op->getResult(0)] = lhs;
    }
    SmallVector<Layout> results;
    for (Value result : op->getResults())
      results.push_back(computedIn.count(result) ? computedIn[result] : layouts[result]);
    SmallVector<Layout> current;
    for (Value operand : op->getOperands())
      current.push_back(local[operand].layout);
    if (auto rows = normInput.find(op); rows != normInput.end())
      current[0] = rows->second; // (the forward norm's copy, shared)
    FailureOr<SmallVector<Layout>> wanted =
        operandLayouts(op, results, grid, current);
    if (failed(wanted))
      return failure();
    // Expert parallelism: the experts' stacked weights split on dimension 0.
    Layout::Axes expertAxes;
    bool routed = isa<ExpertsOp, ExpertsGradOp>(op);
    if (routed) {
      expertAxes = layouts[op->getOperand(3)].dims[0];
      for (unsigned i = 3; i < 6; ++i)
        (*wanted)[i].dims[0] = expertAxes;
    }
    SmallVector<Value> operands;
    for (auto [operand, want] : llvm::zip(op->getOperands(), *wanted)) {
      FailureOr<Value> value = get(operand, want, op->getLoc());
      if (failed(value))
        return op->emitError("while partitioning this op");
      operands.push_back(*value);
    }
    if (routed && !expertAxes.empty()) {
      // The same tokens on several expert-parallel ranks would each reach
      // the experts: harmless forward (each rank combines its own copy),
      // but their gradients would be added to the experts' once a copy.
      const Layout &tokens = (*wanted)[0];
      for (const std::string &axis : expertAxes)
        if (isa<ExpertsGradOp>(op) &&
            llvm::none_of(ArrayRef(tokens.dims).drop_back(),
                          [&](const Layout::Axes &axes) { return llvm::is_contained(axes, axis); }))
          return op->emitError("expert parallelism in a training step needs each rank over '")
                 << axis << "' to hold its own tokens (a share of the batch), but they are "
                 << tokens.str() << ", the same on its " << grid.sizes.lookup(axis)
                 << " ranks, whose experts' gradients would count every token that many times "
                    "(give the model a batch that the expert-parallel ranks divide)";
      if (failed(partitionRoutedExperts(b, op, operands, results, expertAxes,
                                        grid, dispatched, local)))
        return failure();
      sendResults(op);
      continue;
    }
    OperationState state(op->getLoc(), op->getName());
    if (isa<CrossEntropyOp, CrossEntropyGradOp>(op) && !(*wanted)[0].dims.back().empty()) {
      // Vocab-parallel: every token's logsumexp over the whole vocabulary
      // (each rank's over its logits, gathered, taken again), shared by
      // the loss and its gradient; the local op names the vocabulary's axes.
      const Layout::Axes &vocab = (*wanted)[0].dims.back();
      operands.push_back(logSumExp(b, op->getLoc(), operands[0], vocab, grid, lse));
      SmallVector<StringRef> axes(vocab.begin(), vocab.end());
      state.addAttribute("vocab_grid", grid.ref);
      state.addAttribute("vocab_axes", b.getStrArrayAttr(axes));
    }
    state.addOperands(operands);
    for (auto [result, layout] : llvm::zip(op->getResults(), results))
      state.addTypes(localType(globalType(result), layout, grid));
    for (NamedAttribute attr : op->getAttrs())
      if (attr.getName() != ParaxDialect::kShardingsAttrName &&
          attr.getName() != ParaxDialect::kStageAttrName)
        state.addAttribute(attr.getName(), attr.getValue());
    Operation *copy = b.create(state);
    localizeAttributes(copy, results, grid);
    for (auto [result, newResult, layout] :
         llvm::zip(op->getResults(), copy->getResults(), results))
      local[result] = {newResult, layout};
    for (Value result : op->getResults())
      if (computedIn.count(result)) {
        FailureOr<Value> held = get(result, layouts[result], op->getLoc());
        if (failed(held))
          return op->emitError("while partitioning this op");
        local[result] = {*held, layouts[result]};
      }
    sendResults(op);
  }

  // The stage's results (placeResults): the model's replicated; a
  // gradient in its parameter's layout.
  SmallVector<Value> returns;
  SmallVector<Layout> returnLayouts;
  for (unsigned i : returnsOf[stage])
    if (failed(receive(returnedBy(stage, i), nullptr)))
      return failure();
  sendFar();
  for (unsigned i : returnsOf[stage]) {
    Value result = returnedBy(stage, i);
    auto param = gradParam.find(i);
    Layout want = param != gradParam.end()
                      ? layouts[function.getArgument(param->second)]
                      : Layout::replicated(globalType(result).getRank());
    // A gradient still a partial sum (over cp, over ep for a dense weight,
    // over tp for a sequence-split norm) is returned so, in its
    // parameter's split (a slice of a partial sum is one; an axis that
    // splits the parameter is reduce-scattered): the runtime adds the
    // partial axes into its data-parallel reduction, once a step over the
    // summed microbatches (Megatron-LM reduces over dp x cp likewise),
    // instead of an all-reduce each microbatch that holds the gradient to
    // the program's end.
    const Layout &have = local[result].layout;
    if (param != gradParam.end() && want.partial.empty())
      for (const std::string &axis : have.partial)
        if (llvm::none_of(want.dims, [&](const auto &axes) { return llvm::is_contained(axes, axis); }))
          want.partial.push_back(axis);
    FailureOr<Value> value = get(result, want, terminator->getLoc());
    if (failed(value))
      return failure();
    returns.push_back(*value);
    returnLayouts.push_back(want);
  }
  func::ReturnOp::create(b, terminator->getLoc(), returns);
  stageFunction.setType(builder.getFunctionType(
      argTypes, ValueRange(returns).getTypes()));
  // Which original result each is, where its box lies in the whole
  // tensor, and a training step's gradients marked (the runtime averages
  // them over microbatches and data-parallel replicas, and the optimizer
  // updates each parameter's box with its gradient's).
  for (auto [k, i] : llvm::enumerate(returnsOf[stage])) {
    stageFunction.setResultAttr(k, ParaxDialect::kResultAttrName,
                                builder.getI64IntegerAttr(i));
    if (!returnLayouts[k].isReplicated())
      stageFunction.setResultAttr(
          k, ParaxDialect::kGlobalShardingAttrName,
          returnLayouts[k].toAttr(context, grid.ref));
    for (StringRef name : {ParaxDialect::kGradAttrName, ParaxDialect::kParamOffsetAttrName,
                           ParaxDialect::kParamShapeAttrName, ParaxDialect::kLossTermAttrName})
      if (Attribute value = function.getResultAttr(i, name))
        stageFunction.setResultAttr(k, name, value);
    if (stageParts.count(i))
      stageFunction.setResultAttr(k, ParaxDialect::kStagePartAttrName, builder.getUnitAttr());
  }

  // The schedule, for the runtime: the plan's (or, unplanned, one
  // microbatch, 1F1B, no ZeRO).
  auto plan = function->getAttrOfType<PlanAttr>(ParaxDialect::kPlanAttrName);
  if (plan)
    stageFunction->setAttr(ParaxDialect::kPlanAttrName, plan);
  stageFunction->setAttr(
      ParaxDialect::kPipelineAttrName,
      PipelineAttr::get(context, stage, stages, chunks,
                        plan ? plan.getSchedule() : StringRef("1f1b"),
                        plan ? plan.getMicroBatches() : 1, plan ? plan.getZero() : 0));
  return success();
}

LogicalResult FunctionPartitioner::placeResults(
    int64_t stages, const std::map<int64_t, SmallVector<Operation *>> &byStage) {
  for (unsigned i = 0; i < function.getNumResults(); ++i) {
    auto grad = function.getResultAttrOfType<StringAttr>(i, ParaxDialect::kGradAttrName);
    std::optional<unsigned> param = parameterOf(i);
    SmallVector<int64_t> holders; // the stages that read the parameter
    if (param)
      for (const auto &[stage, ops] : byStage)
        if (llvm::any_of(ops, [&](Operation *op) {
              return llvm::is_contained(op->getOperands(), function.getArgument(*param));
            }))
          holders.push_back(stage);
    // A tied weight's parts: the stages holding it make them, one each (a
    // copy left without its gradient would drift from the others; a part
    // made elsewhere would be returned by no stage).
    auto parts = stageParts.find(i);
    if (parts != stageParts.end()) {
      for (int64_t stage : holders)
        if (!parts->second.count(stage))
          return function.emitError("pipeline stage ")
                 << stage << " reads parameter " << grad
                 << " but makes no part of its gradient, which other stages make: its copy would not be updated";
      for (const auto &part : parts->second)
        if (!llvm::is_contained(holders, part.first))
          return function.emitError("pipeline stage ")
                 << part.first << " makes a part of the gradient of " << grad
                 << " but does not read the parameter: no stage would return that part";
    }
    if (holders.empty()) { // not a gradient, or of a parameter nothing reads
      returnsOf[stages - 1].push_back(i);
      continue;
    }
    gradParam[i] = *param;
    for (int64_t stage : holders)
      returnsOf[stage].push_back(i);
  }
  return success();
}

// A weight that several stages read (GPT-2's embedding and head, multi-
// token prediction's embedding): each of them returns its part of the
// gradient, the sum of the contributions made there, and the runtime adds
// the parts once a step, after the microbatches (Megatron-LM's all-reduce
// of the embedding group's gradients). Until 2026-12-02 the last stage
// sent its part to the first every microbatch and received the sum back,
// transfers that interleaved 1F1B could not order.
LogicalResult FunctionPartitioner::splitTiedGradients(int64_t stages) {
  if (stages <= 1)
    return success();
  Operation *terminator = function.getBody().front().getTerminator();
  for (unsigned i = 0; i < function.getNumResults(); ++i) {
    if (!function.getResultAttr(i, ParaxDialect::kGradAttrName))
      continue;
    // The contributions: what the adds summing them (each read once) add.
    Value root = terminator->getOperand(i);
    SmallVector<Value> leaves, stack = {root};
    SmallVector<Operation *> adds;
    while (!stack.empty()) {
      Value v = stack.pop_back_val();
      auto add = v.getDefiningOp<AddOp>();
      if (add && v.hasOneUse() && add.getLhs().getType() == v.getType() &&
          add.getRhs().getType() == v.getType()) {
        adds.push_back(add);
        stack.push_back(add.getRhs());
        stack.push_back(add.getLhs());
        continue;
      }
      leaves.push_back(v);
    }
    std::map<int64_t, SmallVector<Value>> byStage;
    for (Value leaf : leaves) {
      if (isa<BlockArgument>(leaf))
        return function.emitError("the gradient of '")
               << function.getResultAttr(i, ParaxDialect::kGradAttrName)
               << "' adds an argument: a gradient is made by ops";
      byStage[stageOf(leaf.getDefiningOp()) % stages].push_back(leaf);
    }
    if (byStage.size() < 2)
      continue;
    // Each stage's part: its contributions summed, in their order, after
    // the last of them (in its virtual stage).
    for (auto &[stage, terms] : byStage) {
      Value part = terms[0];
      Operation *last = terms[0].getDefiningOp();
      for (Value term : terms)
        if (last->isBeforeInBlock(term.getDefiningOp()))
          last = term.getDefiningOp();
      OpBuilder b(last->getContext());
      b.setInsertionPointAfter(last);
      for (Value term : ArrayRef<Value>(terms).drop_front()) {
        auto add = AddOp::create(b, root.getLoc(), root.getType(), part, term);
        for (StringRef name : {ParaxDialect::kStageAttrName, ParaxDialect::kLayerAttrName})
          if (Attribute value = last->getAttr(name))
            add->setAttr(name, value);
        part = add;
      }
      stageParts[i][stage] = part;
    }
    terminator->setOperand(i, stageParts[i].begin()->second);
    for (Operation *add : adds) // each read by the one before it (the first: by the return)
      add->erase();
  }
  return success();
}

LogicalResult FunctionPartitioner::run() {
  // Stages.
  std::map<int64_t, SmallVector<Operation *>> byStage;
  DenseMap<Value, int64_t> definedIn;
  std::set<int64_t> named; // virtual stages
  for (Operation &op : function.getBody().front().without_terminator())
    named.insert(stageOf(&op));
  int64_t virtualStages = named.empty() ? 1 : *named.rbegin() + 1;
  int64_t stages = virtualStages;
  if (virtualStages > 1) {
    int64_t axis = grid.sizes.lookup(kPipelineAxis);
    if (axis < 1 || virtualStages % axis != 0)
      return function.emitError("ops name ")
             << virtualStages << " pipeline stages but the grid's '" << kPipelineAxis
             << "' axis has size " << axis
             << " (interleaved chunks: a multiple of it)";
    for (int64_t s = 0; s < virtualStages; ++s)
      if (!named.count(s))
        return function.emitError("pipeline stage ") << s << " has no ops";
    stages = axis;
    chunks = virtualStages / axis;
  }
  if (failed(splitTiedGradients(stages)) || failed(assignLayouts()))
    return failure();
  for (Operation &op : function.getBody().front().without_terminator()) {
    int64_t stage = stageOf(&op) % stages;
    byStage[stage].push_back(&op);
    for (Value result : op.getResults()) {
      definedIn[result] = stage;
      virtualOf[result] = stageOf(&op);
    }
  }
  if (stages > 1) {
    // Results of earlier stages (a layer's new keys and values) travel to
    // the last stage, which returns them all.
  } else if (byStage.empty()) {
    byStage[0] = {};
  }
  if (failed(placeResults(stages, byStage)))
    return failure();
  for (int64_t s = 0; s < stages; ++s)
    if (failed(buildStage(s, stages, byStage, definedIn)))
      return failure();
  function.erase();
  return success();
}

struct ParaxPartitionPass
    : public parax::impl::ParaxPartitionPassBase<ParaxPartitionPass> {
  using ParaxPartitionPassBase::ParaxPartitionPassBase;
  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<func::FuncOp> functions;
    for (auto function : module.getOps<func::FuncOp>())
      if (!function.isExternal() &&
          llvm::any_of(function.getBody().front(), [](Operation &op) {
            return isa<ParaxDialect>(op.getDialect());
          }))
        functions.push_back(function);
    for (func::FuncOp function : functions) {
      FailureOr<GridInfo> grid = findGrid(module, function);
      if (failed(grid))
        return signalPassFailure();
      if (failed(FunctionPartitioner(module, function, *grid, vocabParallel).run()))
        return signalPassFailure();
    }
  }
};

} // namespace
