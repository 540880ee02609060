//===- Autodiff.cpp - the backward pass of a model's loss -----------------===//
//
// Reverse-mode differentiation of a function returning one loss: the ops
// are visited last to first; each op whose result carries a gradient adds
// its operands' gradients (the vector-Jacobian products of its rule below).
//
//===----------------------------------------------------------------------===//

#include "parax/Dialect/Parax/IR/ParaxOps.h"
#include "parax/Train/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/ADT/TypeSwitch.h"

#include <type_traits>
#include <optional>

namespace parax {
#define GEN_PASS_DEF_PARAXAUTODIFFPASS
#include "parax/Train/Passes.h.inc"
} // namespace parax

using namespace mlir;
using namespace parax;

namespace {

class Differentiator {
public:
  Differentiator(func::FuncOp function, OpBuilder &b) : function(function), b(b) {}

  LogicalResult run();

private:
  func::FuncOp function;
  OpBuilder &b;
  DenseMap<Value, Value> grads; // d(loss) / d(value), summed over its readers

  Operation *current = nullptr; // the forward op being differentiated
  // Gradients of slices of a value (a fused weight's q, k, v), by value:
  // (dim, start, gradient, slice), joined by a concat once all are known.
  DenseMap<Value, SmallVector<std::tuple<int64_t, int64_t, Value, Operation *>>> slices;

  // `dy` summed to `type` (same rank; dimensions of size 1 summed).
  Value sumTo(Value dy, Type type) {
    if (dy.getType() == type)
      return dy;
    return tag(SumToOp::create(b, dy.getLoc(), type, dy), current);
  }
  // `dy` summed over every dimension but the last: a bias's gradient.
  Value sumToLast(Value dy, Type vector) {
    auto dyType = cast<RankedTensorType>(dy.getType());
    SmallVector<int64_t> ones(dyType.getRank(), 1);
    ones.back() = dyType.getShape().back();
    Value summed = sumTo(dy, RankedTensorType::get(ones, dyType.getElementType()));
    return tag(ReshapeOp::create(b, dy.getLoc(), vector, summed), current);
  }
  LogicalResult joinSlices(Value value);
  // A norm's input and weight gradients (its GradOp and WeightGradOp).
  template <typename GradOp, typename WeightGradOp, typename NormOp>
  void normGradients(NormOp norm, Value dy) {
    Location loc = norm.getLoc();
    GradOp dx;
    if constexpr (std::is_same_v<GradOp, RmsNormGradOp>)
      // (RMSNorm's weight offset, Gemma's 1 + w, enters dx alone: dw is
      // sum(dy * x-hat) whatever it is)
      dx = GradOp::create(b, loc, norm.getX().getType(), norm.getX(), norm.getWeight(), dy,
                          norm.getEpsAttr(), norm.getOffsetAttr());
    else
      dx = GradOp::create(b, loc, norm.getX().getType(), norm.getX(), norm.getWeight(), dy,
                          norm.getEpsAttr());
    accumulate(norm.getX(), tag(dx, norm));
    accumulate(norm.getWeight(), tag(WeightGradOp::create(b, loc, norm.getWeight().getType(),
                                                          norm.getX(), dy, norm.getEpsAttr()),
                                     norm));
  }

  // Adds `grad` to the gradient of `value` (a float tensor); a sum belongs
  // to the layer and stage of the op whose gradient it adds.
  void accumulate(Value value, Value grad) {
    Value &sum = grads[value];
    sum = sum ? tag(AddOp::create(b, grad.getLoc(), value.getType(), sum, grad), current).getResult()
              : grad;
  }
  // A gradient op for `forward`: its layer and stage, no sharding.
  template <typename OpT> OpT tag(OpT op, Operation *forward) {
    for (StringRef name : {ParaxDialect::kLayerAttrName, ParaxDialect::kStageAttrName})
      if (Attribute attr = forward->getAttr(name))
        op->setAttr(name, attr);
    return op;
  }
  // An op named `name` (by default `forward`'s own: a linear of the
  // gradient, a rope turning back) on other operands and result types, with
  // `forward`'s attributes but the sharding.
  Operation *copyOf(Operation *forward, ValueRange operands, TypeRange types,
                    std::optional<OperationName> name = std::nullopt) {
    OperationState state(forward->getLoc(), name.value_or(forward->getName()));
    state.addOperands(operands);
    state.addTypes(types);
    for (NamedAttribute attr : forward->getAttrs())
      if (attr.getName() != ParaxDialect::kShardingsAttrName)
        state.addAttribute(attr.getName(), attr.getValue());
    return b.create(state);
  }
  // `op` with its unit attribute `name` set if it was not, removed if it was.
  static void flip(Operation *op, StringRef name) {
    if (op->removeAttr(name) == nullptr)
      op->setAttr(name, UnitAttr::get(op->getContext()));
  }
  LogicalResult differentiate(Operation *op, Value dy);

  // The load-balancing loss (Mixtral's and Qwen2-MoE's in transformers):
  // coef · E · Σ_e f_e · P_e over every balanced router's tokens together
  // (all layers), f_e the share of choices routed to e and P_e the mean
  // score. Each router's logits then get coef · E · f_e / N per score,
  // N = layers × tokens: the routers' loads summed (made once, at the first
  // router differentiated) and N.
  Value balanceLoad;
  int64_t balanceRows = 0;
  RouterOp balanced; // the last balanced router
  // Every balanced router's router_load (`scores`: of the scores), summed.
  Value sumOverRouters(bool scores) {
    Value sum;
    balanceRows = 0;
    for (Operation &op : function.getBody().front().without_terminator()) {
      auto router = dyn_cast<RouterOp>(&op);
      if (!router || router.getAuxLossCoef().convertToDouble() <= 0 ||
          router.getSequenceAux())
        continue;
      auto x = cast<RankedTensorType>(router.getX().getType());
      balanceRows += x.getNumElements() / x.getShape().back();
      balanced = router;
      Value mine = loadOf(router, /*perSequence=*/false, scores);
      sum = sum ? Value(tag(AddOp::create(b, router.getLoc(), mine.getType(), sum, mine), router)) : mine;
    }
    return sum;
  }
  // `router`'s router_load: [E], or [B, E] per sequence; of the (normalised)
  // scores with `scores`.
  Value loadOf(RouterOp router, bool perSequence, bool scores) {
    SmallVector<Value> routed = {router.getX(), router.getGate()};
    if (Value bias = router.getBias())
      routed.push_back(bias);
    auto x = cast<RankedTensorType>(router.getX().getType());
    SmallVector<int64_t> shape = {static_cast<int64_t>(router.getNumExperts())};
    if (perSequence)
      shape.insert(shape.begin(), x.getDimSize(0));
    Operation *load = copyOf(
        router, routed, TypeRange{RankedTensorType::get(shape, b.getF32Type())},
        OperationName(RouterLoadOp::getOperationName(), b.getContext()));
    load->removeAttr("aux_loss_coef");
    load->removeAttr("sequence_aux");
    if (scores)
      load->setAttr("scores", b.getUnitAttr());
    return load->getResult(0);
  }

  // DeepSeek-V3's sequence-wise balance loss (`sequence_aux`): each
  // router's own, per sequence of x [B, S, H]: α · Σ_e f_e · P_e with f_e =
  // E / (K · S) · the sequence's choices of e and P_e the mean normalised
  // score, averaged over the B sequences; balance_loss's per-sequence form
  // with coefficient α / K. The routers differentiated, each with its
  // choices per sequence.
  SmallVector<std::pair<RouterOp, Value>> sequenceBalanced;
  // balance_loss's and router_aux_grad's attributes for `router`: the
  // coefficient, the tokens per sequence, the sequences.
  static std::tuple<double, int64_t, int64_t> sequenceTerms(RouterOp router) {
    auto x = cast<RankedTensorType>(router.getX().getType());
    return {router.getAuxLossCoef().convertToDouble() /
                static_cast<double>(router.getTopK()),
            x.getDimSize(1), x.getDimSize(0)};
  }
  Value totalLoad() {
    if (!balanceLoad)
      balanceLoad = sumOverRouters(/*scores=*/false);
    return balanceLoad;
  }
  // The sum of the balance losses' values (null without any): a result of
  // its own too, after the gradients, for logging.
  Value balanceSum;
  Value addTerm(Value sum, Value term, Operation *at) {
    return sum ? Value(tag(AddOp::create(b, term.getLoc(), term.getType(), sum, term), at)) : term;
  }
  // Adds the value of a balance loss over `load` and `scores` to balanceSum
  // (in the loss's layer and stage, `ce`'s).
  void addBalanceValue(Value load, Value scores, IntegerAttr experts, double coefficient, int64_t tokens,
                       int64_t sequences, Operation *ce) {
    Value value = tag(BalanceLossOp::create(b, ce->getLoc(), ce->getResult(0).getType(), load, scores, experts,
                                            b.getF64FloatAttr(coefficient), b.getI64IntegerAttr(tokens),
                                            b.getI64IntegerAttr(sequences)),
                      ce);
    balanceSum = addTerm(balanceSum, value, ce);
  }
  // The loss returned: the cross-entropy plus the load-balancing losses'
  // values, when routers are balanced.
  Value withBalanceLoss(Value loss) {
    Operation *ce = loss.getDefiningOp();
    for (auto [router, load] : sequenceBalanced) {
      auto [coefficient, tokens, sequences] = sequenceTerms(router);
      addBalanceValue(load, loadOf(router, /*perSequence=*/true, /*scores=*/true), router.getNumExpertsAttr(),
                      coefficient, tokens, sequences, ce);
    }
    if (balanceLoad)
      addBalanceValue(balanceLoad, sumOverRouters(/*scores=*/true), balanced.getNumExpertsAttr(),
                      balanced.getAuxLossCoef().convertToDouble(), balanceRows, /*sequences=*/1, ce);
    return balanceSum ? addTerm(loss, balanceSum, ce) : loss;
  }
};

// An op of a step at a run-time position (a generation step's): it reads
// the position, a scalar integer.
static bool readsRunTimePosition(Operation *op) {
  return isa<AttentionOp, RopeOp, PositionEmbeddingOp>(op) &&
         llvm::any_of(op->getOperands(), [](Value operand) {
           auto type = cast<RankedTensorType>(operand.getType());
           return type.getRank() == 0 && type.getElementType().isInteger();
         });
}

LogicalResult Differentiator::differentiate(Operation *op, Value dy) {
  Location loc = op->getLoc();
  if (readsRunTimePosition(op))
    return op->emitError("--parax-autodiff has no gradient for a step at "
                         "a run-time position");
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case<CrossEntropyOp>([&](CrossEntropyOp ce) {
        // The loss is the root: its gradient is 1, not `dy`.
        accumulate(ce.getLogits(),
                   tag(CrossEntropyGradOp::create(b, loc, ce.getLogits().getType(),
                                                  ce.getLogits(), ce.getLabels(), ce.getExtras(),
                                                  /*num_tokens=*/nullptr, ce.getIgnoreIndexAttr(),
                                                  ce.getWeightAttr(), ce.getVocabGridAttr(),
                                                  ce.getVocabAxesAttr()),
                       op));
        return success();
      })
      .Case<LinearOp>([&](LinearOp linear) -> LogicalResult {
        if (Value bias = linear.getBias())
          accumulate(bias, sumToLast(dy, bias.getType()));
        Operation *dx = copyOf(op, ValueRange{dy, linear.getWeight()}, TypeRange{linear.getX().getType()});
        flip(dx, "transpose_w");
        accumulate(linear.getX(), dx->getResult(0));
        accumulate(linear.getWeight(),
                   tag(LinearWeightGradOp::create(b, loc, linear.getWeight().getType(),
                                                  linear.getX(), dy,
                                                  linear.getTransposeW()),
                       op));
        return success();
      })
      .Case<RmsNormOp>([&](RmsNormOp norm) {
        normGradients<RmsNormGradOp, RmsNormWeightGradOp>(norm, dy);
        return success();
      })
      .Case<LayerNormOp>([&](LayerNormOp norm) {
        normGradients<LayerNormGradOp, LayerNormWeightGradOp>(norm, dy);
        accumulate(norm.getBias(), sumToLast(dy, norm.getBias().getType()));
        return success();
      })
      .Case<GeluOp>([&](GeluOp gelu) {
        accumulate(gelu.getX(),
                   tag(GeluGradOp::create(b, loc, gelu.getX().getType(), gelu.getX(), dy,
                                          gelu.getApproximateAttr()),
                       op));
        return success();
      })
      .Case<PositionEmbeddingOp>([&](PositionEmbeddingOp position) {
        accumulate(position.getTable(),
                   tag(PositionEmbeddingGradOp::create(
                           b, loc, position.getTable().getType(), dy,
                           position.getOffsetAttr(), /*seq_grid=*/nullptr,
                           /*seq_axes=*/nullptr, /*seq_cyclic=*/nullptr),
                       op));
        return success();
      })
      .Case<SliceOp>([&](SliceOp slice) {
        slices[slice.getX()].emplace_back(slice.getDim(), slice.getStart(), dy, op);
        return success();
      })
      .Case<RopeOp>([&](RopeOp rope) {
        Operation *back = copyOf(op, ValueRange{dy}, TypeRange{rope.getX().getType()});
        flip(back, "inverse");
        accumulate(rope.getX(), back->getResult(0));
        return success();
      })
      .Case<ReshapeOp>([&](ReshapeOp reshape) {
        accumulate(reshape.getX(),
                   tag(ReshapeOp::create(b, loc, reshape.getX().getType(), dy), op));
        return success();
      })
      .Case<AttentionOp>([&](AttentionOp attention) -> LogicalResult {
        if (attention.getValueDim())
          return attention.emitOpError(
              "with value_dim (values inside v's channels) has no gradient "
              "rule; train the model with separate keys and values");
        Operation *back = copyOf(
            op, ValueRange{attention.getQ(), attention.getK(), attention.getV(), dy},
            TypeRange{attention.getQ().getType(), attention.getK().getType(),
                      attention.getV().getType()},
            OperationName(AttentionGradOp::getOperationName(), b.getContext()));
        accumulate(attention.getQ(), back->getResult(0));
        accumulate(attention.getK(), back->getResult(1));
        accumulate(attention.getV(), back->getResult(2));
        return success();
      })
      .Case<AddOp>([&](AddOp add) {
        // A broadcast operand's gradient: summed over what it was broadcast over.
        accumulate(add.getLhs(), sumTo(dy, add.getLhs().getType()));
        accumulate(add.getRhs(), sumTo(dy, add.getRhs().getType()));
        return success();
      })
      .Case<SwigluOp>([&](SwigluOp swiglu) {
        for (int64_t operand : {0, 1})
          accumulate(op->getOperand(operand),
                     tag(SwigluGradOp::create(b, loc, swiglu.getResult().getType(),
                                              swiglu.getGate(), swiglu.getUp(), dy,
                                              b.getI64IntegerAttr(operand)),
                         op));
        return success();
      })
      .Case<EmbeddingOp>([&](EmbeddingOp embedding) {
        accumulate(embedding.getTable(),
                   tag(EmbeddingGradOp::create(b, loc, embedding.getTable().getType(),
                                               embedding.getIds(), dy,
                                               /*vocab_grid=*/nullptr,
                                               /*vocab_axes=*/nullptr, embedding.getScaleAttr()),
                       op));
        return success();
      })
      .Case<ConcatOp>([&](ConcatOp concat) {
        // Each input's gradient: its slice of dy.
        int64_t dim = concat.getDim(), start = 0;
        for (Value input : concat.getInputs()) {
          accumulate(input, tag(SliceOp::create(b, loc, input.getType(), dy,
                                                b.getI64IntegerAttr(dim),
                                                b.getI64IntegerAttr(start)),
                                op));
          start += cast<RankedTensorType>(input.getType()).getDimSize(dim);
        }
        return success();
      })
      .Case<BroadcastOp>([&](BroadcastOp broadcast) {
        accumulate(broadcast.getX(), sumTo(dy, broadcast.getX().getType()));
        return success();
      })
      .Case<SoftcapOp>([&](SoftcapOp softcap) {
        accumulate(softcap.getX(),
                   tag(SoftcapGradOp::create(b, loc, softcap.getX().getType(), softcap.getX(), dy,
                                             softcap.getCapAttr()),
                       op));
        return success();
      })
      .Case<SigmoidOp>([&](SigmoidOp sigmoid) {
        accumulate(sigmoid.getX(),
                   tag(SigmoidGradOp::create(b, loc, sigmoid.getX().getType(),
                                             sigmoid.getX(), dy),
                       op));
        return success();
      })
      .Case<MulOp>([&](MulOp mul) {
        // Each operand's: dy times the other, summed back to a broadcast
        // operand's shape.
        for (auto [self, other] : {std::pair(mul.getLhs(), mul.getRhs()),
                                   std::pair(mul.getRhs(), mul.getLhs())})
          accumulate(self, sumTo(tag(MulOp::create(b, loc, dy.getType(), dy, other), op),
                                 self.getType()));
        return success();
      })
      .Case<RouterOp>([&](RouterOp router) {
        // The gradient by the logits x · gateᵀ (the choice made again), then
        // through that product as a linear's.
        SmallVector<Value> operands = {router.getX(), router.getGate(), dy};
        if (Value bias = router.getBias())
          operands.push_back(bias);
        auto x = cast<RankedTensorType>(router.getX().getType());
        SmallVector<int64_t> shape(x.getShape());
        shape.back() = router.getNumExperts();
        Value logits = copyOf(op, operands, TypeRange{x.clone(shape)},
                              OperationName(RouterGradOp::getOperationName(), b.getContext()))
                           ->getResult(0);
        double coef = router.getAuxLossCoef().convertToDouble();
        if (coef > 0) {
          // The load-balancing loss's gradient, then by the logits: per
          // sequence (sequence_aux), this router's choices per sequence
          // (partial sums over the ranks splitting a sequence); else every
          // layer's and token's load (sums, all-reduced when the tokens
          // are split).
          Value load;
          double coefficient = coef;
          int64_t tokens, sequences = 1;
          if (router.getSequenceAux()) {
            load = loadOf(router, /*perSequence=*/true, /*scores=*/false);
            sequenceBalanced.push_back({router, load});
            std::tie(coefficient, tokens, sequences) = sequenceTerms(router);
          } else {
            load = totalLoad();
            tokens = balanceRows;
          }
          Value aux = tag(RouterAuxGradOp::create(b, loc, x.clone(shape), router.getX(), router.getGate(), load,
                                                  router.getScoreFuncAttr(), router.getNumExpertsAttr(),
                                                  b.getF64FloatAttr(coefficient), b.getI64IntegerAttr(tokens),
                                                  b.getI64IntegerAttr(sequences)),
                          op);
          logits = tag(AddOp::create(b, loc, logits.getType(), logits, aux), op);
        }
        accumulate(router.getX(),
                   tag(LinearOp::create(b, loc, x, logits, router.getGate(), Value()), op));
        accumulate(router.getGate(),
                   tag(LinearWeightGradOp::create(b, loc, router.getGate().getType(),
                                                  router.getX(), logits,
                                                  /*transpose_w=*/true),
                       op));
        return success();
      })
      .Case<ExpertsOp>([&](ExpertsOp experts) {
        // Gradients by x, the router's weights and the three stacks (not
        // the indices).
        static constexpr unsigned kDifferentiable[] = {0, 1, 3, 4, 5};
        SmallVector<Value> operands(op->getOperands());
        operands.push_back(dy);
        SmallVector<Type> types;
        for (unsigned i : kDifferentiable)
          types.push_back(op->getOperand(i).getType());
        Operation *back = copyOf(op, operands, types,
                                 OperationName(ExpertsGradOp::getOperationName(), b.getContext()));
        for (auto [i, grad] : llvm::zip(kDifferentiable, back->getResults()))
          accumulate(op->getOperand(i), grad);
        return success();
      })
      .Default([&](Operation *) {
        return op->emitError() << "--parax-autodiff has no gradient for '"
                               << op->getName()
                               << "' yet (covered: the ops of Llama, GPT-2, "
                                  "Mixtral, Qwen2-MoE and DeepSeek-V3 models)";
      });
}

// The gradients of a value's slices, joined: slices along one dimension
// that tile it (a fused weight's q, k and v) give their concat.
LogicalResult Differentiator::joinSlices(Value value) {
  auto it = slices.find(value);
  if (it == slices.end())
    return success();
  auto parts = it->second;
  llvm::sort(parts, [](const auto &x, const auto &y) { return std::get<1>(x) < std::get<1>(y); });
  auto type = cast<RankedTensorType>(value.getType());
  int64_t dim = std::get<0>(parts.front()), next = 0;
  SmallVector<Value> pieces;
  for (auto [d, start, grad, slice] : parts) {
    if (d != dim || start != next)
      break;
    pieces.push_back(grad);
    next += cast<RankedTensorType>(grad.getType()).getDimSize(dim);
  }
  if (pieces.size() != parts.size() || next != type.getDimSize(dim)) {
    Location loc = isa<BlockArgument>(value) ? function.getLoc() : value.getDefiningOp()->getLoc();
    return emitError(loc) << "--parax-autodiff: slices of a value that do not "
                             "tile one of its dimensions have no gradient yet";
  }
  current = std::get<3>(parts.front()); // (the concat joins the slices' layer and stage)
  Value joined = pieces.size() == 1
                     ? pieces.front()
                     : tag(ConcatOp::create(b, value.getLoc(), type, pieces, b.getI64IntegerAttr(dim)),
                           current)
                           .getResult();
  slices.erase(it);
  accumulate(value, joined);
  return success();
}

LogicalResult Differentiator::run() {
  Block &body = function.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  Value loss = ret.getNumOperands() == 1 ? ret.getOperand(0) : Value();
  // The loss: a cross-entropy, or a sum of them (multi-token prediction's
  // depths after the main loss, each with its weight): each is a root, its
  // gradient 1; the sums take none.
  SmallVector<Value> pending = {loss};
  llvm::SmallPtrSet<Operation *, 4> roots, sums;
  while (loss && !pending.empty()) {
    Value term = pending.pop_back_val();
    if (auto ce = term.getDefiningOp<CrossEntropyOp>()) {
      roots.insert(ce);
    } else if (auto add = term.getDefiningOp<AddOp>();
               add && cast<RankedTensorType>(add.getType()).getRank() == 0) {
      sums.insert(add);
      pending.append({add.getLhs(), add.getRhs()});
    } else {
      roots.clear();
      break;
    }
  }
  if (roots.empty())
    return ret.emitError("--parax-autodiff needs a function returning one "
                         "loss (a parax.cross_entropy result or a sum of them), got ")
           << ret.getNumOperands() << " result(s)"
           << (ret.getNumOperands() == 1 ? " that is neither" : "");

  b.setInsertionPoint(ret);
  SmallVector<Operation *> forward;
  for (Operation &op : body.without_terminator())
    forward.push_back(&op);
  for (Operation *op : llvm::reverse(forward)) {
    for (Value result : op->getResults())
      if (failed(joinSlices(result)))
        return failure();
    if (sums.contains(op))
      continue; // (its terms are roots)
    bool reaches = roots.contains(op);
    Value dy;
    // (A router's second result, its indices, has no gradient.)
    if (op->getNumResults() >= 1 && grads.count(op->getResult(0)))
      dy = grads.lookup(op->getResult(0));
    if (!reaches && !dy)
      continue; // the loss does not depend on it (or it is a gradient op)
    current = op;
    if (failed(differentiate(op, dy)))
      return failure();
  }

  for (BlockArgument arg : function.getArguments())
    if (failed(joinSlices(arg)))
      return failure();

  SmallVector<Value> results = {withBalanceLoss(loss)};
  SmallVector<Type> types = {loss.getType()};
  SmallVector<Attribute> resultAttrs = {function.getResultAttrDict(0)
                                            ? Attribute(function.getResultAttrDict(0))
                                            : b.getDictionaryAttr({})};
  for (BlockArgument arg : function.getArguments()) {
    auto name = function.getArgAttrOfType<StringAttr>(arg.getArgNumber(),
                                                      ParaxDialect::kParamAttrName);
    if (!name)
      continue;
    Value grad = grads.lookup(arg);
    // A router's correction bias (DeepSeek-V3's) only chooses experts: it
    // has no gradient (training updates it by the experts' load).
    if (!grad && !arg.use_empty() && llvm::all_of(arg.getUses(), [](OpOperand &use) {
          Operation *user = use.getOwner();
          if (auto router = dyn_cast<RouterOp>(user))
            return router.getBias() == use.get();
          if (auto grad = dyn_cast<RouterGradOp>(user))
            return grad.getBias() == use.get();
          // (the balance loss's choices)
          if (auto load = dyn_cast<RouterLoadOp>(user))
            return load.getBias() == use.get();
          return false;
        }))
      continue;
    if (!grad)
      return function.emitError("--parax-autodiff: the loss does not depend on "
                                "parameter '")
             << name.getValue() << "' (argument #" << arg.getArgNumber() << ")";
    results.push_back(grad);
    types.push_back(grad.getType());
    // A piece of a fused checkpoint tensor (--parax-split-fused-params):
    // its gradient names the box too.
    NamedAttrList attrs;
    attrs.append(ParaxDialect::kGradAttrName, name);
    for (StringRef box : {ParaxDialect::kParamOffsetAttrName, ParaxDialect::kParamShapeAttrName})
      if (Attribute value = function.getArgAttr(arg.getArgNumber(), box))
        attrs.append(box, value);
    resultAttrs.push_back(attrs.getDictionary(b.getContext()));
  }
  // Multi-token prediction's weighted losses (the roots with a weight),
  // summed: a term of the loss too.
  Value mtpSum;
  for (Operation *op : forward) // (in program order)
    if (roots.contains(op) && cast<CrossEntropyOp>(op).getWeight())
      mtpSum = addTerm(mtpSum, op->getResult(0), loss.getDefiningOp());
  // The terms apart, after the gradients.
  for (auto [sum, term] : {std::pair(balanceSum, "balance"), std::pair(mtpSum, "mtp")}) {
    if (!sum)
      continue;
    results.push_back(sum);
    types.push_back(sum.getType());
    resultAttrs.push_back(
        b.getDictionaryAttr(b.getNamedAttr(ParaxDialect::kLossTermAttrName, b.getStringAttr(term))));
  }
  func::ReturnOp::create(b, ret.getLoc(), results);
  ret.erase();
  // Gradients nobody reads (of the token ids' embedding input, of a data
  // input): dropped, last first.
  SmallVector<Operation *> backward;
  for (Operation &op : body.without_terminator())
    if (!llvm::is_contained(forward, &op))
      backward.push_back(&op);
  for (Operation *op : llvm::reverse(backward))
    if (op->use_empty())
      op->erase();
  function.setType(b.getFunctionType(function.getArgumentTypes(), types));
  function.setAllResultAttrs(resultAttrs);
  return success();
}

struct AutodiffPass : parax::impl::ParaxAutodiffPassBase<AutodiffPass> {
  void runOnOperation() override {
    OpBuilder b(&getContext());
    for (auto function : getOperation().getOps<func::FuncOp>()) {
      if (function.isExternal())
        continue;
      if (failed(Differentiator(function, b).run()))
        return signalPassFailure();
    }
  }
};

} // namespace
