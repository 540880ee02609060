//===- ModelGraph.cpp - reading a parax model for the planner -------------===//

#include "parax/Plan/ModelGraph.h"
#include "parax/Dialect/Parax/IR/ParaxOps.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/raw_ostream.h"

#include <map>

using namespace mlir;
using namespace parax;
using namespace parax::plan;

double ModelGraph::kvCacheBytesPerToken(int64_t kvBytes) const {
  double total = 0;
  for (const LayerGraph &layer : layers)
    if (layer.hasAttention)
      total += (layer.cachedValues ? layer.cachedValues
                                   : layer.kvHeads * layer.cacheWidth) *
               kvBytes;
  return total;
}

static std::optional<OpClass> classify(Operation *op) {
  return llvm::TypeSwitch<Operation *, std::optional<OpClass>>(op)
      .Case<EmbeddingOp>([](auto) { return OpClass::Embedding; })
      .Case<PositionEmbeddingOp>([](auto) { return OpClass::PositionEmbedding; })
      .Case<LinearOp>([](auto) { return OpClass::Linear; })
      .Case<HeadLinearOp>([](auto) { return OpClass::HeadLinear; })
      .Case<RmsNormOp, LayerNormOp>([](auto) { return OpClass::Norm; })
      .Case<RopeOp>([](auto) { return OpClass::Rope; })
      .Case<AttentionOp>([](auto) { return OpClass::Attention; })
      .Case<SiluOp, SigmoidOp, GeluOp, SoftcapOp>([](auto) { return OpClass::Unary; })
      .Case<SwigluOp>([](auto) { return OpClass::Swiglu; })
      .Case<AddOp>([](auto) { return OpClass::Add; })
      .Case<MulOp>([](auto) { return OpClass::Mul; })
      .Case<ReshapeOp>([](auto) { return OpClass::Reshape; })
      .Case<TransposeOp>([](auto) { return OpClass::Transpose; })
      .Case<SliceOp>([](auto) { return OpClass::Slice; })
      .Case<ConcatOp>([](auto) { return OpClass::Concat; })
      .Case<CacheUpdateOp, RingCacheUpdateOp>([](auto) { return OpClass::CacheUpdate; })
      .Case<BroadcastOp>([](auto) { return OpClass::Broadcast; })
      .Case<RouterOp>([](auto) { return OpClass::Router; })
      .Case<ExpertsOp>([](auto) { return OpClass::Experts; })
      .Case<CrossEntropyOp>([](auto) { return OpClass::CrossEntropy; })
      .Case<LabelCountOp>([](auto) { return OpClass::LabelCount; })
      .Case<ShiftOp>([](auto) { return OpClass::Shift; })
      .Default([](Operation *) { return std::nullopt; });
}

// A stable text for "same layer structure": op names, attributes other than
// the layer index and annotations, types, and which value feeds which op.
static void appendSignature(std::string &signature, const OpNode &node) {
  llvm::raw_string_ostream os(signature);
  Operation *op = node.op;
  os << op->getName() << '(';
  for (int input : node.inputs)
    os << input << ',';
  os << ")";
  for (NamedAttribute attr : op->getAttrs()) {
    StringRef name = attr.getName().getValue();
    if (name == ParaxDialect::kLayerAttrName ||
        name == ParaxDialect::kShardingsAttrName || name.starts_with("parax."))
      continue;
    os << name << '=' << attr.getValue() << ';';
  }
  os << ':';
  for (Type type : op->getOperandTypes())
    os << type << ',';
  os << "->";
  for (Type type : op->getResultTypes())
    os << type << ',';
  os << '\n';
}

// The workload's name of an element type (bf16 where none fits).
static std::string dtypeName(Type type) {
  return type.isBF16() ? "bf16" : type.isF16() ? "f16" : type.isF32() ? "f32" : "bf16";
}

// A KV cache (a data argument) joined along the sequence with a step's new
// keys or values, read by attention only (as its k or v).
static bool joinsKvCache(func::FuncOp function, ConcatOp concat) {
  auto cache = dyn_cast<BlockArgument>(concat.getOperand(0));
  if (concat.getDim() != 1 || concat->getNumOperands() != 2 || !cache ||
      function.getArgAttr(cache.getArgNumber(), ParaxDialect::kParamAttrName) ||
      concat.getResult().use_empty())
    return false;
  return llvm::all_of(concat.getResult().getUses(), [](OpOperand &use) {
    return isa<AttentionOp>(use.getOwner()) && use.getOperandNumber() != 0;
  });
}

// Such a join read by one attention of at most 4 queries: what the CUDA
// backend's decode attention reads in place.
static bool readInPlace(ConcatOp join) {
  if (!join.getResult().hasOneUse())
    return false;
  auto attention = cast<AttentionOp>(*join.getResult().getUsers().begin());
  return cast<RankedTensorType>(attention.getQ().getType()).getDimSize(1) <= 4;
}

// Whether a tensor holds more than 2^53 elements: no device holds it, and
// its element count (a product of its dimensions, uint64_t in the cost
// interface) would wrap or lose exactness in the planner's doubles.
static bool holdsTooMany(Type type) {
  auto tensor = dyn_cast<RankedTensorType>(type);
  if (!tensor || !tensor.hasStaticShape())
    return false;
  constexpr uint64_t kLimit = uint64_t(1) << 53;
  uint64_t n = 1;
  for (int64_t d : tensor.getShape()) {
    if (d > 0 && n > kLimit / uint64_t(d))
      return true;
    n *= uint64_t(d);
  }
  return n > kLimit;
}

FailureOr<ModelGraph> parax::plan::analyzeModel(func::FuncOp function) {
  ModelGraph model;
  Block &body = function.getBody().front();
  for (BlockArgument arg : body.getArguments())
    if (holdsTooMany(arg.getType())) {
      function.emitError() << "argument #" << arg.getArgNumber() << " (" << arg.getType()
                           << ") has more than 2^53 elements: no device holds it";
      return failure();
    }
  for (Operation &op : body)
    for (Value result : op.getResults())
      if (holdsTooMany(result.getType())) {
        op.emitError() << "its result " << result.getType() << " has more than 2^53 elements: no device holds it";
        return failure();
      }

  // Parameters and the token input.
  DenseSet<Value> weights;
  for (BlockArgument arg : body.getArguments()) {
    if (function.getArgAttr(arg.getArgNumber(), ParaxDialect::kParamAttrName)) {
      weights.insert(arg);
      model.params += getNumElements(arg.getType());
      model.paramBytes += getTensorBytes(arg.getType());
      auto type = cast<RankedTensorType>(arg.getType());
      model.elementBytes = (type.getElementTypeBitWidth() + 7) / 8;
      model.dtype = dtypeName(type.getElementType());
    } else if (!model.irBatch) {
      auto type = dyn_cast<RankedTensorType>(arg.getType());
      if (type && type.getRank() == 2 && type.getElementType().isInteger()) {
        model.irBatch = type.getDimSize(0);
        model.irSeq = type.getDimSize(1);
      }
    }
  }
  if (!model.irBatch) {
    function.emitError("the planner needs a token input: an integer "
                       "[batch, sequence] argument that is not a parameter");
    return failure();
  }
  double irTokens = double(model.irBatch) * model.irSeq;

  // Group ops by layer, in program order.
  std::map<int64_t, SmallVector<Operation *>> byLayer;
  for (Operation &op : body.without_terminator()) {
    std::optional<int64_t> layer = getLayer(&op);
    if (!layer) {
      op.emitError("the planner needs every op's 'parax.layer'");
      return failure();
    }
    // Ops computing only on parameters (GPT-2's slices of the fused qkv
    // weight) are part of their consumers' weights.
    if (op.getNumOperands() &&
        llvm::all_of(op.getOperands(), [&](Value v) { return weights.contains(v); })) {
      for (Value result : op.getResults())
        weights.insert(result);
      continue;
    }
    byLayer[*layer].push_back(&op);
  }

  DenseMap<Value, int64_t> layerOf;
  for (auto &[index, ops] : byLayer)
    for (Operation *op : ops)
      for (Value result : op->getResults())
        layerOf[result] = index;

  // Each parameter belongs to the first layer that reads it (tied weights
  // count once).
  DenseMap<int64_t, double> paramsOf, paramBytesOf, expertParamsOf;
  DenseSet<Value> tiedWeights; // a tied parameter and the weights made of it
  for (BlockArgument arg : body.getArguments()) {
    if (!function.getArgAttr(arg.getArgNumber(), ParaxDialect::kParamAttrName))
      continue;
    std::optional<int64_t> first, last;
    bool expert = false;
    SmallVector<Value> frontier = {arg}, reached = {arg};
    while (!frontier.empty()) {
      Value v = frontier.pop_back_val();
      for (Operation *user : v.getUsers()) {
        if (std::optional<int64_t> layer = getLayer(user)) {
          first = first ? std::min(*first, *layer) : *layer;
          last = last ? std::max(*last, *layer) : *layer;
        }
        expert |= isa<ExpertsOp>(user);
        if (weights.contains(user->getResult(0))) {
          frontier.push_back(user->getResult(0));
          reached.push_back(user->getResult(0));
        }
      }
    }
    if (!first)
      continue;
    if (!byLayer.empty() && *first == byLayer.begin()->first && *last == byLayer.rbegin()->first &&
        *first != *last) {
      model.tiedParams += getNumElements(arg.getType());
      tiedWeights.insert(reached.begin(), reached.end());
    }
    paramsOf[*first] += getNumElements(arg.getType());
    paramBytesOf[*first] += getTensorBytes(arg.getType());
    if (expert)
      expertParamsOf[*first] += getNumElements(arg.getType());
  }

  uint64_t totalFlops = 0;
  for (auto &[index, ops] : byLayer) {
    LayerGraph layer;
    layer.index = index;
    layer.params = paramsOf.lookup(index);
    layer.paramBytes = paramBytesOf.lookup(index);
    layer.expertParams = expertParamsOf.lookup(index);
    DenseMap<Value, int> ids;
    auto valueId = [&](Value v, bool external) {
      auto [it, inserted] = ids.try_emplace(v, layer.values.size());
      if (inserted) {
        ValueNode node;
        auto type = cast<RankedTensorType>(v.getType());
        node.shape.assign(type.getShape().begin(), type.getShape().end());
        node.bytesPerToken = getTensorBytes(type) / irTokens;
        node.someSequence = node.shape.size() >= 3 && node.shape[1] != model.irSeq;
        layer.values.push_back(node);
        if (external)
          layer.inputs.push_back(it->second);
      }
      return it->second;
    };
    for (Operation *op : ops) {
      std::optional<OpClass> kind = classify(op);
      auto cost = dyn_cast<CostOpInterface>(op);
      if (!kind || !cost) {
        op->emitError("the planner has no rule for this op");
        return failure();
      }
      OpNode node;
      node.kind = *kind;
      node.op = op;
      for (Value operand : op->getOperands()) {
        // A run-time position (a scalar every rank holds) is no activation.
        if (cast<RankedTensorType>(operand.getType()).getRank() == 0)
          continue;
        if (weights.contains(operand)) {
          node.weightBytes += getTensorBytes(operand.getType());
          node.weightParams += getNumElements(operand.getType());
          node.largestWeight = std::max<double>(node.largestWeight, getNumElements(operand.getType()));
          node.weightTensors.push_back(getNumElements(operand.getType()));
          if (tiedWeights.contains(operand))
            node.tiedParams += getNumElements(operand.getType());
          continue;
        }
        auto defining = layerOf.find(operand);
        bool external = defining == layerOf.end() || defining->second != index;
        node.inputs.push_back(valueId(operand, external));
      }
      for (Value result : op->getResults())
        node.results.push_back(valueId(result, false));
      uint64_t flops = cost.getFlops();
      totalFlops += flops;
      node.flopsPerToken = flops / irTokens;
      if (auto attention = dyn_cast<AttentionOp>(op)) {
        node.heads = attention.getNumHeads();
        node.kvHeads = attention.getNumKvHeads();
        node.headDim = attention.getHeadDim();
        node.valueDim = attention.getValueWidth();
        node.cacheWidth = node.headDim + (attention.getV() == attention.getK() ? 0 : node.valueDim);
        node.causal = attention.getCausal();
        node.window = attention.getWindow().value_or(0);
        node.flopsPerToken = 0; // computed from the context by the planner
        layer.hasAttention = true;
        layer.kvHeads = node.kvHeads;
        layer.cacheWidth = node.cacheWidth;
      } else if (auto linear = dyn_cast<LinearOp>(op)) {
        node.in = linear.getInFeatures();
        node.out = linear.getOutFeatures();
        node.outputHead = llvm::any_of(linear->getUsers(), [](Operation *user) {
          return isa<CrossEntropyOp, func::ReturnOp>(user);
        });
      } else if (auto experts = dyn_cast<ExpertsOp>(op)) {
        node.numExperts = experts.getNumExperts();
        node.ffn = experts.getFfnDim();
        node.topK = experts.getTopK();
        layer.hasExperts = true;
      } else if (auto slice = dyn_cast<SliceOp>(op)) {
        node.dim = slice.getDim();
      } else if (auto concat = dyn_cast<ConcatOp>(op)) {
        node.dim = concat.getDim();
        bool joins = joinsKvCache(function, concat);
        if (joins) {
          auto cache = cast<RankedTensorType>(concat.getOperand(0).getType());
          model.cachedTokens = cache.getDimSize(1);
          model.cacheDtype = dtypeName(cache.getElementType());
        }
        node.cacheView = joins && readInPlace(concat);
        if (node.cacheView)
          layer.values[node.inputs[0]].inKvCache = layer.values[node.results[0]].inKvCache = true;
      } else if (isa<CacheUpdateOp, RingCacheUpdateOp>(op)) {
        node.dim = 1;
        node.cacheView = true;
        // A ring: its window (a copy of its rows and the step's), then the
        // ring itself.
        node.ring = isa<RingCacheUpdateOp>(op);
        auto cache = cast<RankedTensorType>(op->getOperand(0).getType());
        if (node.ring)
          model.ringCaches = true;
        else
          model.cacheCapacity = cache.getDimSize(1);
        model.cachedTokens = std::max(model.cachedTokens, cache.getDimSize(1));
        model.cacheDtype = dtypeName(cache.getElementType());
        layer.cachedValues += cache.getDimSize(2) * cache.getDimSize(3);
        layer.values[node.inputs[0]].inKvCache = layer.values[node.results.back()].inKvCache = true;
      } else if (auto transpose = dyn_cast<TransposeOp>(op)) {
        node.permutation.assign(transpose.getPermutation().begin(),
                                transpose.getPermutation().end());
      } else if (auto router = dyn_cast<RouterOp>(op)) {
        node.numExperts = router.getNumExperts();
        node.topK = router.getTopK();
        node.numGroups = router.getNumGroups();
        node.topkGroups = router.getTopkGroups();
      }
      appendSignature(layer.signature, node);
      layer.ops.push_back(std::move(node));
    }
    // Outputs: values used by another layer or returned.
    for (auto &[value, id] : ids) {
      if (llvm::is_contained(layer.inputs, id))
        continue;
      layer.values[id].returned = llvm::any_of(value.getUsers(), [](Operation *user) {
        return isa<func::ReturnOp>(user);
      });
      for (Operation *user : value.getUsers()) {
        std::optional<int64_t> userLayer = getLayer(user);
        if (!userLayer || *userLayer != index) {
          layer.outputs.push_back(id);
          break;
        }
      }
    }
    llvm::sort(layer.outputs);
    model.layers.push_back(std::move(layer));
  }

  for (const LayerGraph &layer : model.layers) {
    if (layer.index >= 0 && layer.hasAttention)
      ++model.numDecoderLayers;
    double routed = layer.expertParams;
    double active = routed;
    for (const OpNode &op : layer.ops)
      if (op.kind == OpClass::Experts)
        active = routed * op.topK / op.numExperts;
    model.activeParams += layer.params - routed + active;
  }
  for (const LayerGraph &layer : model.layers)
    for (const OpNode &op : layer.ops)
      if (op.kind == OpClass::Linear && !model.hidden)
        model.hidden = op.in;
  model.forwardFlopsPerToken = totalFlops / irTokens;
  return model;
}

double parax::plan::OpNode::attentionPairs(double q, double c) const {
  if (!causal)
    return q * c;
  // Query i sees x = c - q + 1 + i keys (x from a to c), at most `window`.
  double a = c - q + 1, w = window > 0 ? static_cast<double>(window) : c;
  if (c <= w)
    return (a + c) * q / 2;
  if (a >= w)
    return q * w;
  return (a + w) * (w - a + 1) / 2 + (c - w) * w;
}
