//===- ParaxCost.cpp - FLOPs and bytes of every parax op -----------------===//
//
// Forward-pass counts for the shapes in the IR; the conventions (what a norm
// or an activation costs per element, how attention's causal mask and the
// experts' weight reads are counted) are written down in docs/cost-model.md.
//
//===----------------------------------------------------------------------===//

#include "parax/Dialect/Parax/IR/ParaxOps.h"

#include "parax/Dialect/Parax/IR/ParaxInterfaces.cpp.inc"

using namespace mlir;
using namespace parax;

uint64_t parax::getNumElements(Type type) {
  auto tensor = dyn_cast<RankedTensorType>(type);
  if (!tensor || !tensor.hasStaticShape())
    return 0;
  return tensor.getNumElements();
}

static uint64_t elementBytes(Type type) {
  Type element = cast<ShapedType>(type).getElementType();
  return (element.getIntOrFloatBitWidth() + 7) / 8;
}

uint64_t parax::getTensorBytes(Type type) {
  uint64_t elements = getNumElements(type);
  return elements ? elements * elementBytes(type) : 0;
}

static uint64_t numel(Value value) { return getNumElements(value.getType()); }
static uint64_t bytes(Value value) { return getTensorBytes(value.getType()); }
static int64_t lastDim(Value value) {
  return cast<RankedTensorType>(value.getType()).getShape().back();
}
static int64_t dimSize(Value value, unsigned dim) {
  return cast<RankedTensorType>(value.getType()).getDimSize(dim);
}

uint64_t parax::detail::defaultBytesRead(Operation *op) {
  uint64_t total = 0;
  for (Value operand : op->getOperands())
    total += bytes(operand);
  return total;
}

uint64_t parax::detail::defaultBytesWritten(Operation *op) {
  uint64_t total = 0;
  for (Value result : op->getResults())
    total += bytes(result);
  return total;
}

// Embeddings: gathers, no arithmetic; only the rows looked up are read.
uint64_t EmbeddingOp::getFlops() { return 0; }
uint64_t EmbeddingOp::getBytesRead() {
  return bytes(getIds()) + bytes(getResult());
}
uint64_t PositionEmbeddingOp::getFlops() { return 0; }
uint64_t PositionEmbeddingOp::getBytesRead() { return bytes(getResult()); }

// 2·M·in·out multiply-adds, plus one add per output for the bias.
uint64_t LinearOp::getFlops() {
  uint64_t in = getInFeatures(), out = getOutFeatures();
  uint64_t rows = numel(getX()) / in;
  return 2 * rows * in * out + (getBias() ? rows * out : 0);
}

// 2·M·in·out multiply-adds per head: 2·out per element of x.
uint64_t HeadLinearOp::getFlops() { return 2 * numel(getX()) * getOutFeatures(); }

// Per element: RMSNorm square, accumulate, scale, weight (4); LayerNorm adds
// the mean, subtraction and bias (8).
uint64_t RmsNormOp::getFlops() { return 4 * numel(getX()); }
uint64_t LayerNormOp::getFlops() { return 8 * numel(getX()); }

// Two multiplies and an add per rotated element.
uint64_t RopeOp::getFlops() {
  uint64_t rotated = numel(getX()) / dimSize(getX(), 3) * getRotaryDim();
  return 3 * rotated;
}

// The (query, key) pairs of attention or its gradient over every batch row
// and head: a causal mask keeps, for query i, keys 0 .. i + (Skv - S).
template <typename AttentionLike> static uint64_t attentionPairs(AttentionLike op) {
  uint64_t seq = dimSize(op.getQ(), 1), keys = dimSize(op.getK(), 1);
  uint64_t pairs = seq * keys;
  if (op.getCausal())
    pairs = seq * (keys - seq) + seq * (seq + 1) / 2;
  return dimSize(op.getQ(), 0) * op.getNumHeads() * pairs;
}

// Scores q·k (2·d per pair), softmax (5 per pair), p·v (2·Dv per pair).
uint64_t AttentionOp::getFlops() {
  return attentionPairs(*this) * (2 * getHeadDim() + 5 + 2 * getValueWidth());
}

uint64_t AddOp::getFlops() { return numel(getResult()); }
uint64_t MulOp::getFlops() { return numel(getResult()); }
uint64_t SiluOp::getFlops() { return 4 * numel(getResult()); }
uint64_t SigmoidOp::getFlops() { return 3 * numel(getResult()); }
uint64_t SoftcapOp::getFlops() { return 4 * numel(getResult()); }
uint64_t GeluOp::getFlops() { return 8 * numel(getResult()); }
uint64_t SwigluOp::getFlops() { return 5 * numel(getResult()); }

// A reshape is a view of its operand: no kernel, no traffic.
uint64_t ReshapeOp::getFlops() { return 0; }
uint64_t ReshapeOp::getBytesRead() { return 0; }
uint64_t ReshapeOp::getBytesWritten() { return 0; }
uint64_t TransposeOp::getFlops() { return 0; }
uint64_t SliceOp::getFlops() { return 0; }
uint64_t SliceOp::getBytesRead() { return bytes(getResult()); }
uint64_t ConcatOp::getFlops() { return 0; }
uint64_t BroadcastOp::getFlops() { return 0; }
// Only the new rows move (the runtimes write them in place).
uint64_t CacheUpdateOp::getFlops() { return 0; }
uint64_t CacheUpdateOp::getBytesRead() { return bytes(getUpdate()); }
uint64_t CacheUpdateOp::getBytesWritten() { return bytes(getUpdate()); }
// The window copied out of the ring, the new rows written into it.
uint64_t RingCacheUpdateOp::getFlops() { return 0; }
uint64_t RingCacheUpdateOp::getBytesRead() { return bytes(getCache()) + bytes(getUpdate()); }
uint64_t RingCacheUpdateOp::getBytesWritten() { return bytes(getWindow()) + bytes(getUpdate()); }

// The gate GEMM, then per score: the activation (about 4) and selection (1).
uint64_t RouterOp::getFlops() {
  uint64_t hidden = lastDim(getX()), experts = getNumExperts();
  uint64_t tokens = numel(getX()) / hidden;
  return 2 * tokens * hidden * experts + 5 * tokens * experts;
}

// Per routed (token, expert) pair: three GEMVs (gate, up, down), swiglu, and
// the weighted accumulation into the output.
uint64_t ExpertsOp::getFlops() {
  uint64_t hidden = lastDim(getX()), ffn = getFfnDim(), k = getTopK();
  uint64_t pairs = numel(getX()) / hidden * k;
  return pairs * (3 * 2 * hidden * ffn + 5 * ffn + 2 * hidden);
}

// Only the experts that some token chose have their weights read: at most
// min(E, tokens · k) of them (all of them for any realistic batch).
uint64_t ExpertsOp::getBytesRead() {
  uint64_t experts = getNumExperts();
  uint64_t pairs = numel(getX()) / lastDim(getX()) * getTopK();
  uint64_t touched = std::min(experts, pairs);
  uint64_t weightBytes =
      bytes(getWGate()) + bytes(getWUp()) + bytes(getWDown());
  return bytes(getX()) + bytes(getWeights()) + bytes(getIndices()) +
         weightBytes / experts * touched;
}

// logsumexp (max, exp, sum, log ≈ 4 per logit) and the label pick.
uint64_t CrossEntropyOp::getFlops() { return 4 * numel(getLogits()); }
uint64_t LabelCountOp::getFlops() { return numel(getLabels()); }
uint64_t LogSumExpOp::getFlops() { return 4 * numel(getX()); }
uint64_t ShiftOp::getFlops() { return 0; } // a copy

// Gradients. Softmax and the label (about 5 per logit).
uint64_t CrossEntropyGradOp::getFlops() { return 5 * numel(getLogits()); }

// One GEMM, the forward's size: 2·tokens·in·out.
uint64_t LinearWeightGradOp::getFlops() {
  uint64_t tokens = numel(getX()) / lastDim(getX());
  return 2 * tokens * lastDim(getX()) * lastDim(getDy());
}

// The norm's statistics again, the weighted gradient and its dot with x.
uint64_t RmsNormGradOp::getFlops() { return 8 * numel(getX()); }
uint64_t RmsNormWeightGradOp::getFlops() { return 4 * numel(getX()); }

// The sigmoid, then the product rule (about 8 per element).
uint64_t SwigluGradOp::getFlops() { return 8 * numel(getResult()); }

// The scores again (recomputed, as flash attention's backward does), then
// four products per pair: dv, dP, dq, dk (2·d each) and the softmax's
// gradient (about 5): 2.5x the forward for equal head and value sizes.
uint64_t AttentionGradOp::getFlops() {
  uint64_t headDim = getHeadDim(), valueDim = dimSize(getV(), 3);
  return attentionPairs(*this) *
         (2 * headDim + 5 + 2 * valueDim + 2 * valueDim + 5 + 4 * headDim);
}

// A scatter-add: one add per element of dy.
uint64_t EmbeddingGradOp::getFlops() { return numel(getDy()); }

// One add per element summed.
uint64_t SumToOp::getFlops() { return numel(getX()); }
// The derivative (about 12 per element for tanh's) and the product.
uint64_t GeluGradOp::getFlops() { return 14 * numel(getX()); }
// The statistics again, the weighted gradient and two means.
uint64_t LayerNormGradOp::getFlops() { return 12 * numel(getX()); }
uint64_t LayerNormWeightGradOp::getFlops() { return 8 * numel(getX()); }
// Rows copied: no arithmetic.
uint64_t PositionEmbeddingGradOp::getFlops() { return 0; }
// The sigmoid again and the product (about 5 per element).
uint64_t SigmoidGradOp::getFlops() { return 5 * numel(getX()); }
// The tanh again, its square and the product.
uint64_t SoftcapGradOp::getFlops() { return 6 * numel(getX()); }
// The gate GEMM and the choice again (the scores are recomputed), then the
// normalisation's and the scores' gradients (about 5 per logit).
uint64_t RouterGradOp::getFlops() {
  uint64_t hidden = lastDim(getX()), experts = getNumExperts();
  uint64_t tokens = numel(getX()) / hidden;
  return 2 * tokens * hidden * experts + 10 * tokens * experts;
}
// A product and a sum per expert.
uint64_t BalanceLossOp::getFlops() { return 2 * numel(getLoad()) + 4; }
// The gate GEMM and the choice again, then a count per choice.
uint64_t RouterLoadOp::getFlops() {
  uint64_t hidden = lastDim(getX()), experts = getNumExperts();
  uint64_t tokens = numel(getX()) / hidden;
  return 2 * tokens * hidden * experts + 5 * tokens * experts;
}
// The gate GEMM and the scores again, then the scores' gradient (about 5
// per logit).
uint64_t RouterAuxGradOp::getFlops() {
  uint64_t hidden = lastDim(getX()), experts = getNumExperts();
  uint64_t tokens = numel(getX()) / hidden;
  return 2 * tokens * hidden * experts + 10 * tokens * experts;
}
// Per routed pair: the gate, up and down GEMVs again (down for the router
// weight's gradient), then six more of the same size (dw_down, da,
// dw_gate, dw_up, and dx through gate and up): 3x the forward's GEMVs.
uint64_t ExpertsGradOp::getFlops() {
  uint64_t hidden = lastDim(getX()), ffn = dimSize(getWGate(), 1);
  uint64_t k = lastDim(getIndices());
  uint64_t pairs = numel(getX()) / hidden * k;
  return pairs * (9 * 2 * hidden * ffn + 10 * ffn + 4 * hidden);
}
// As the forward's (the chosen experts' weights), and dy.
uint64_t ExpertsGradOp::getBytesRead() {
  uint64_t experts = dimSize(getWGate(), 0);
  uint64_t pairs = numel(getX()) / lastDim(getX()) *
                   lastDim(getIndices());
  uint64_t touched = std::min(experts, pairs);
  uint64_t weightBytes =
      bytes(getWGate()) + bytes(getWUp()) + bytes(getWDown());
  return bytes(getX()) + bytes(getDy()) + bytes(getWeights()) +
         bytes(getIndices()) + weightBytes / experts * touched;
}
