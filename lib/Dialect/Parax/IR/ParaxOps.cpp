//===- ParaxOps.cpp - parax op verifiers and custom syntax ---------------===//
//
// Verifier messages start with the constraint label of the op's description
// (C1, C2, ...), so a message leads to the rule it enforces.
//
//===----------------------------------------------------------------------===//

#include "parax/Dialect/Parax/IR/ParaxOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"

#include <cmath>

using namespace mlir;
using namespace parax;

static RankedTensorType tensorOf(Value value) {
  return cast<RankedTensorType>(value.getType());
}

static bool isIdentifier(StringRef name) {
  if (name.empty() || !(llvm::isAlpha(name.front()) || name.front() == '_'))
    return false;
  return llvm::all_of(name, [](char c) { return llvm::isAlnum(c) || c == '_'; });
}

//===----------------------------------------------------------------------===//
// GridOp
//===----------------------------------------------------------------------===//

// `(dp = 2, tp = 4)`
static ParseResult parseGridAxes(OpAsmParser &parser, ArrayAttr &names,
                                 DenseI64ArrayAttr &shape) {
  SmallVector<Attribute> nameList;
  SmallVector<int64_t> sizes;
  if (parser.parseCommaSeparatedList(OpAsmParser::Delimiter::Paren, [&] {
        StringRef name;
        int64_t size;
        if (parser.parseKeyword(&name) || parser.parseEqual() ||
            parser.parseInteger(size))
          return failure();
        nameList.push_back(parser.getBuilder().getStringAttr(name));
        sizes.push_back(size);
        return success();
      }))
    return failure();
  names = parser.getBuilder().getArrayAttr(nameList);
  shape = parser.getBuilder().getDenseI64ArrayAttr(sizes);
  return success();
}

static void printGridAxes(OpAsmPrinter &printer, GridOp, ArrayAttr names,
                          DenseI64ArrayAttr shape) {
  printer << '(';
  for (auto [i, name] : llvm::enumerate(names)) {
    if (i)
      printer << ", ";
    printer << cast<StringAttr>(name).getValue() << " = "
            << (i < shape.size() ? shape[i] : 0);
  }
  printer << ')';
}

LogicalResult GridOp::verify() {
  if (getAxisNames().empty())
    return emitOpError("C1: a grid needs at least one axis");
  if (getAxisNames().size() != getShape().size())
    return emitOpError("C1: ") << getAxisNames().size() << " axis names but "
                               << getShape().size() << " sizes";
  for (int64_t size : getShape())
    if (size <= 0)
      return emitOpError("C2: grid axis sizes must be positive, got ") << size;
  llvm::StringSet<> seen;
  for (Attribute attr : getAxisNames()) {
    StringRef name = cast<StringAttr>(attr).getValue();
    if (!isIdentifier(name))
      return emitOpError("C3: grid axis name '")
             << name << "' is not an identifier";
    if (!seen.insert(name).second)
      return emitOpError("C3: grid axis '") << name << "' is declared twice";
  }
  if (auto cyclic = getCyclicAxesAttr())
    for (Attribute attr : cyclic)
      if (!seen.contains(cast<StringAttr>(attr).getValue()))
        return emitOpError("C4: cyclic axis ") << attr << " is not an axis of the grid";
  return success();
}

std::optional<int64_t> GridOp::getAxisSize(StringRef name) {
  auto shape = getShape();
  for (auto [i, attr] : llvm::enumerate(getAxisNames()))
    if (cast<StringAttr>(attr).getValue() == name && i < shape.size())
      return shape[i];
  return std::nullopt;
}

int64_t GridOp::getNumDevices() {
  int64_t devices = 1;
  for (int64_t size : getShape())
    devices *= size;
  return devices;
}

//===----------------------------------------------------------------------===//
// Embeddings
//===----------------------------------------------------------------------===//

// An optional float attribute's value.
static std::optional<double> valueOf(FloatAttr attr) {
  return attr ? std::optional<double>(attr.getValueAsDouble()) : std::nullopt;
}

LogicalResult EmbeddingOp::verify() {
  RankedTensorType table = tensorOf(getTable()), ids = tensorOf(getIds()),
                   result = tensorOf(getResult());
  if (table.getRank() != 2)
    return emitOpError("C1: table must have rank 2, got ") << table.getRank();
  SmallVector<int64_t> expected(ids.getShape());
  expected.push_back(table.getDimSize(1));
  if (result.getShape() != ArrayRef<int64_t>(expected))
    return emitOpError("C2: result shape must be the ids shape + [")
           << table.getDimSize(1) << "]";
  if (result.getElementType() != table.getElementType())
    return emitOpError("C3: result element type must match the table's");
  if (bool(getVocabGrid()) != bool(getVocabAxes()))
    return emitOpError("C4: vocab_grid and vocab_axes come together");
  if (std::optional<double> scale = valueOf(getScaleAttr()); scale && !(std::isfinite(*scale) && *scale > 0))
    return emitOpError("C5: scale must be finite and positive, got ") << *scale;
  return success();
}

// The ranks a sequence is split over (context parallelism: `seq_grid` and
// `seq_axes`, rule `rule`), 1 without: the axes must name axes of the grid,
// and a run-time position does not come with them.
static FailureOr<int64_t> sequencePieces(Operation *op, StringRef rule,
                                         FlatSymbolRefAttr gridRef,
                                         ArrayAttr axes, bool position) {
  if (bool(gridRef) != bool(axes))
    return op->emitOpError(rule) << ": seq_grid and seq_axes come together";
  if (op->hasAttr("seq_cyclic") && !axes)
    return op->emitOpError(rule) << ": seq_cyclic needs seq_axes";
  if (!gridRef)
    return 1;
  if (position)
    return op->emitOpError(rule)
           << ": a sequence split over ranks takes no run-time position";
  auto grid = SymbolTable::lookupNearestSymbolFrom<GridOp>(op, gridRef);
  if (!grid)
    return op->emitOpError(rule) << ": unknown grid " << gridRef;
  int64_t pieces = 1;
  for (Attribute attr : axes) {
    std::optional<int64_t> size =
        grid.getAxisSize(cast<StringAttr>(attr).getValue());
    if (!size)
      return op->emitOpError(rule) << ": unknown grid axis " << attr;
    pieces *= *size;
  }
  return pieces;
}

LogicalResult PositionEmbeddingOp::verify() {
  RankedTensorType table = tensorOf(getTable()), result = tensorOf(getResult());
  if (table.getRank() != 2 || result.getRank() != 3 ||
      result.getDimSize(0) != 1 || result.getDimSize(2) != table.getDimSize(1) ||
      result.getElementType() != table.getElementType())
    return emitOpError("C1: expected a [P, H] table and a [1, S, H] result");
  FailureOr<int64_t> pieces = sequencePieces(
      *this, "C4", getSeqGridAttr(), getSeqAxesAttr(), bool(getPosition()));
  if (failed(pieces))
    return failure();
  int64_t offset = getOffset(), rows = *pieces * result.getDimSize(1);
  if (offset < 0 || offset + rows > table.getDimSize(0))
    return emitOpError("C2: positions ")
           << offset << " .. " << offset + rows - 1 << " exceed the table's "
           << table.getDimSize(0) << " rows";
  if (getPosition() && offset != 0)
    return emitOpError("C3: a position operand and a non-zero offset do not "
                       "come together");
  return success();
}

//===----------------------------------------------------------------------===//
// LinearOp
//===----------------------------------------------------------------------===//

int64_t LinearOp::getInFeatures() {
  return tensorOf(getWeight()).getDimSize(getTransposeW() ? 1 : 0);
}
int64_t LinearOp::getOutFeatures() {
  return tensorOf(getWeight()).getDimSize(getTransposeW() ? 0 : 1);
}

// C2, C4 and C5 of a linear and of a linear per head: x's last dimension is
// the weight's in features (`layout` names the weight's dimensions), the
// result x's shape with the out features last, one element type for every
// operand and the result.
template <typename LinearLike>
static LogicalResult verifyFeatures(LinearLike op, StringRef layout) {
  RankedTensorType x = tensorOf(op.getX()), result = tensorOf(op.getResult());
  int64_t in = op.getInFeatures(), out = op.getOutFeatures();
  if (x.getShape().back() != in)
    return op.emitOpError("C2: x's last dimension (")
           << x.getShape().back() << ") must equal the weight's in features ("
           << in << ", weight is " << layout << ")";
  SmallVector<int64_t> expected(x.getShape());
  expected.back() = out;
  if (result.getShape() != ArrayRef<int64_t>(expected))
    return op.emitOpError("C4: result shape must be x's with the last dimension ")
           << out;
  Type element = x.getElementType();
  if (result.getElementType() != element ||
      llvm::any_of(op->getOperands(), [&](Value v) {
        return tensorOf(v).getElementType() != element;
      }))
    return op.emitOpError("C5: operands and result must share one element type");
  return success();
}

LogicalResult LinearOp::verify() {
  RankedTensorType x = tensorOf(getX()), w = tensorOf(getWeight());
  if (x.getRank() < 1 || w.getRank() != 2)
    return emitOpError("C1: x needs rank >= 1 and the weight rank 2");
  if (getBias()) {
    RankedTensorType bias = tensorOf(getBias());
    if (bias.getRank() != 1 || bias.getDimSize(0) != getOutFeatures())
      return emitOpError("C3: bias must be [") << getOutFeatures() << "]";
  }
  return verifyFeatures(*this, getTransposeW() ? "[out, in]" : "[in, out]");
}

//===----------------------------------------------------------------------===//
// Norms and rope
//===----------------------------------------------------------------------===//

static LogicalResult verifyNorm(Operation *op, Value x, ValueRange params,
                                Value result, double eps) {
  RankedTensorType xType = tensorOf(x);
  if (xType.getRank() < 1)
    return op->emitOpError("C1: x needs rank >= 1");
  int64_t hidden = xType.getShape().back();
  for (Value param : params) {
    RankedTensorType type = tensorOf(param);
    if (type.getRank() != 1 || type.getDimSize(0) != hidden)
      return op->emitOpError("C1: norm parameters must be [") << hidden << "]";
  }
  if (result.getType() != xType)
    return op->emitOpError("C2: result type must equal x's type");
  if (!(eps > 0))
    return op->emitOpError("C3: eps must be positive");
  return success();
}

LogicalResult RmsNormOp::verify() {
  if (std::optional<double> offset = valueOf(getOffsetAttr()); offset && !std::isfinite(*offset))
    return emitOpError("C4: offset must be finite");
  return verifyNorm(*this, getX(), getWeight(), getResult(),
                    getEps().convertToDouble());
}

LogicalResult LayerNormOp::verify() {
  return verifyNorm(*this, getX(), {getWeight(), getBias()}, getResult(),
                    getEps().convertToDouble());
}

LogicalResult RopeOp::verify() {
  RankedTensorType x = tensorOf(getX());
  if (x.getRank() != 4 || getResult().getType() != x)
    return emitOpError("C1: x must be [B, S, heads, head_dim] and the result "
                       "of the same type");
  if (!(getTheta().convertToDouble() > 0))
    return emitOpError("C2: theta must be positive");
  int64_t rotary = getRotaryDim(), headDim = x.getDimSize(3);
  if (rotary <= 0 || rotary % 2 != 0 || rotary > headDim)
    return emitOpError("C3: rotary_dim must be positive, even and at most "
                       "head_dim (")
           << headDim << "), got " << rotary;
  if (static_cast<int64_t>(getPositionOffset()) < 0)
    return emitOpError("C4: position_offset must be >= 0");
  if (getPosition() && getPositionOffset() != 0)
    return emitOpError("C6: a position operand and a non-zero "
                       "position_offset do not come together");
  if (failed(sequencePieces(*this, "C7", getSeqGridAttr(), getSeqAxesAttr(),
                            bool(getPosition()))))
    return failure();
  if (auto scaling = getScalingAttr()) {
    auto type = scaling.getAs<StringAttr>("rope_type");
    if (!type || !llvm::is_contained(ArrayRef<StringRef>{"llama3", "yarn", "linear", "longrope"},
                                     type.getValue()))
      return emitOpError("C5: scaling needs rope_type = \"llama3\", \"yarn\", "
                         "\"linear\" or \"longrope\"");
    if (!scaling.getAs<FloatAttr>("factor"))
      return emitOpError("C5: scaling needs a float 'factor'");
    // The fields each kind's frequencies read (the runtimes'
    // ropeInverseFrequencies).
    SmallVector<StringRef> floats, ints;
    if (type.getValue() == "llama3") {
      floats = {"low_freq_factor", "high_freq_factor"};
      ints = {"original_max_position_embeddings"};
    } else if (type.getValue() == "yarn") {
      floats = {"beta_fast", "beta_slow"};
      ints = {"original_max_position_embeddings"};
    } else if (type.getValue() == "longrope") {
      auto factors = scaling.getAs<DenseF64ArrayAttr>("ext_factors");
      int64_t pairs = static_cast<int64_t>(getRotaryDim()) / 2;
      if (!factors || static_cast<int64_t>(factors.size()) != pairs)
        return emitOpError("C5: longrope scaling needs 'ext_factors', an array<f64> of ")
               << pairs << " factors (one a pair of rotated channels)";
      for (double factor : factors.asArrayRef())
        if (!std::isfinite(factor) || factor <= 0)
          return emitOpError("C5: longrope scaling's ext_factors must be finite and positive, got ")
                 << factor;
    }
    for (StringRef name : floats)
      if (!scaling.getAs<FloatAttr>(name))
        return emitOpError("C5: ") << type.getValue() << " scaling needs a float '" << name << "'";
    // (the rotated channels' factor: LongRoPE's on a partially rotated head)
    if (Attribute factor = scaling.get("attention_factor")) {
      auto value = dyn_cast<FloatAttr>(factor);
      if (!value || !std::isfinite(value.getValueAsDouble()) || value.getValueAsDouble() <= 0)
        return emitOpError("C5: scaling's 'attention_factor' must be a finite positive float");
    }
    for (StringRef name : ints) {
      auto value = scaling.getAs<IntegerAttr>(name);
      if (!value || value.getInt() <= 0)
        return emitOpError("C5: ") << type.getValue() << " scaling needs a positive integer '" << name
                                   << "'";
    }
  }
  return success();
}

//===----------------------------------------------------------------------===//
// HeadLinearOp
//===----------------------------------------------------------------------===//

int64_t HeadLinearOp::getInFeatures() {
  return tensorOf(getWeight()).getDimSize(getTransposeW() ? 2 : 1);
}
int64_t HeadLinearOp::getOutFeatures() {
  return tensorOf(getWeight()).getDimSize(getTransposeW() ? 1 : 2);
}

LogicalResult HeadLinearOp::verify() {
  RankedTensorType x = tensorOf(getX()), w = tensorOf(getWeight());
  if (x.getRank() < 2 || w.getRank() != 3)
    return emitOpError("C1: x needs rank >= 2 and the weight rank 3");
  int64_t heads = x.getDimSize(x.getRank() - 2);
  if (w.getDimSize(0) != heads)
    return emitOpError("C3: x's ")
           << heads
           << " heads (its dimension -2) need one weight each, the weight has "
           << w.getDimSize(0);
  return verifyFeatures(*this, getTransposeW() ? "[G, out, in]" : "[G, in, out]");
}

//===----------------------------------------------------------------------===//
// AttentionOp
//===----------------------------------------------------------------------===//

// Rules C1-C9 of attention, for `parax.attention` and its gradient
// (`out`: the result, or the gradient flowing into it).
template <typename AttentionLike>
static LogicalResult verifyAttention(AttentionLike op, Value out,
                                     bool hasPosition) {
  if (std::optional<uint64_t> window = op.getWindow())
    if (static_cast<int64_t>(*window) <= 0 || !op.getCausal())
      return op.emitOpError("C11: a window must be positive and come with causal");
  if (FloatAttr cap = op.getSoftcapAttr())
    if (!(std::isfinite(cap.getValueAsDouble()) && cap.getValueAsDouble() > 0))
      return op.emitOpError("C12: softcap must be finite and positive");
  RankedTensorType q = tensorOf(op.getQ()), k = tensorOf(op.getK()),
                   v = tensorOf(op.getV()), result = tensorOf(out);
  if (q.getRank() != 4 || k.getRank() != 4 || v.getRank() != 4 ||
      result.getRank() != 4)
    return op.emitOpError("C1: q, k, v and the result must have rank 4 "
                          "[B, S, heads, head_dim]");
  int64_t heads = op.getNumHeads(), kvHeads = op.getNumKvHeads(),
          headDim = op.getHeadDim();
  if (heads <= 0 || kvHeads <= 0 || headDim <= 0)
    return op.emitOpError("C2: num_heads, num_kv_heads and head_dim must be "
                          "positive");
  if (q.getDimSize(2) != heads || q.getDimSize(3) != headDim)
    return op.emitOpError("C2: q must have ")
           << heads << " heads of " << headDim << ", got [" << q.getDimSize(2)
           << ", " << q.getDimSize(3) << "]";
  if (k.getDimSize(2) != kvHeads || k.getDimSize(3) != headDim)
    return op.emitOpError("C2: k must have ")
           << kvHeads << " heads of " << headDim << ", got ["
           << k.getDimSize(2) << ", " << k.getDimSize(3) << "]";
  if (v.getDimSize(2) != kvHeads)
    return op.emitOpError("C2: v must have ") << kvHeads << " heads";
  if (bool(op.getHeadGrid()) != bool(op.getHeadAxes()))
    return op.emitOpError("C7: head_grid and head_axes come together");
  if (heads % kvHeads != 0 && !op.getHeadAxes())
    return op.emitOpError("C3: num_kv_heads (")
           << kvHeads << ") must divide num_heads (" << heads << ")";
  if (k.getDimSize(0) != q.getDimSize(0) || v.getDimSize(0) != q.getDimSize(0) ||
      k.getDimSize(1) != v.getDimSize(1))
    return op.emitOpError("C4: batch sizes must agree and k, v must share a "
                          "sequence length");
  int64_t valueWidth = v.getDimSize(3);
  if constexpr (std::is_same_v<AttentionLike, AttentionOp>) {
    if (std::optional<uint64_t> width = op.getValueDim()) {
      if (*width < 1 || static_cast<int64_t>(*width) > v.getDimSize(3))
        return op.emitOpError("C10: value_dim (")
               << *width << ") must be in [1, " << v.getDimSize(3)
               << "], v's channels";
      valueWidth = *width;
    }
  }
  SmallVector<int64_t> expected = {q.getDimSize(0), q.getDimSize(1), heads,
                                   valueWidth};
  if (result.getShape() != ArrayRef<int64_t>(expected) ||
      result.getElementType() != q.getElementType())
    return op.emitOpError("C4: result must be [B, S, num_heads, Dv] of q's "
                          "element type");
  if (!(op.getScale().convertToDouble() > 0))
    return op.emitOpError("C5: scale must be positive");
  FailureOr<int64_t> pieces = sequencePieces(
      op, "C9", op.getSeqGridAttr(), op.getSeqAxesAttr(), hasPosition);
  if (failed(pieces))
    return failure();
  if (op.getCausal() && k.getDimSize(1) < *pieces * q.getDimSize(1))
    return op.emitOpError("C6: causal attention needs at least as many keys "
                          "as queries (")
           << *pieces * q.getDimSize(1) << "), got " << k.getDimSize(1);
  return success();
}

int64_t AttentionOp::getValueWidth() {
  if (std::optional<uint64_t> width = getValueDim())
    return *width;
  return tensorOf(getV()).getDimSize(3);
}

LogicalResult AttentionOp::verify() {
  if (failed(verifyAttention(*this, getResult(), bool(getPosition()))))
    return failure();
  if (getPosition() && !getCausal())
    return emitOpError("C8: attention over a KV cache at a run-time position "
                       "must be causal");
  if (getRing()) {
    if (!getPosition() || !getWindow())
      return emitOpError("C13: ring needs a position operand and a window");
    int64_t cached = tensorOf(getK()).getDimSize(1) - tensorOf(getQ()).getDimSize(1);
    if (cached < static_cast<int64_t>(*getWindow()) - 1)
      return emitOpError("C13: a ring's ")
             << cached << " cached rows cannot hold the " << *getWindow() - 1
             << " earlier keys a window of " << *getWindow() << " sees";
  }
  return success();
}

//===----------------------------------------------------------------------===//
// CacheUpdateOp
//===----------------------------------------------------------------------===//

LogicalResult CacheUpdateOp::verify() {
  RankedTensorType cache = tensorOf(getCache()), update = tensorOf(getUpdate());
  if (cache.getRank() != 4 || update.getRank() != 4 ||
      cache.getElementType() != update.getElementType() ||
      getResult().getType() != cache)
    return emitOpError("C1: cache and update must be rank-4 tensors of one "
                       "element type, and the result of the cache's type");
  for (int64_t d : {0, 2, 3})
    if (cache.getDimSize(d) != update.getDimSize(d))
      return emitOpError("C2: cache and update must agree outside dimension "
                         "1, got ")
             << cache << " and " << update;
  if (update.getDimSize(1) > cache.getDimSize(1))
    return emitOpError("C2: ")
           << update.getDimSize(1) << " new rows do not fit a cache of "
           << cache.getDimSize(1);
  return success();
}

//===----------------------------------------------------------------------===//
// RingCacheUpdateOp
//===----------------------------------------------------------------------===//

LogicalResult RingCacheUpdateOp::verify() {
  RankedTensorType cache = tensorOf(getCache()), update = tensorOf(getUpdate()),
                   result = tensorOf(getWindow());
  bool agree = cache.getRank() == 4 && update.getRank() == 4 &&
               cache.getElementType() == update.getElementType();
  for (int64_t d : {0, 2, 3})
    agree = agree && cache.getDimSize(d) == update.getDimSize(d);
  SmallVector<int64_t> expected;
  if (agree)
    expected = {cache.getDimSize(0), cache.getDimSize(1) + update.getDimSize(1),
                cache.getDimSize(2), cache.getDimSize(3)};
  if (!agree || result.getShape() != ArrayRef<int64_t>(expected) ||
      result.getElementType() != cache.getElementType() ||
      getResult().getType() != cache)
    return emitOpError("C1: cache and update must be rank-4 tensors of one "
                       "element type that agree outside dimension 1, the "
                       "window [B, C + S, heads, D] of that type and the "
                       "result the cache's type, got ")
           << cache << ", " << update << " and " << result;
  return success();
}

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

static LogicalResult verifyBroadcastBinary(Operation *op) {
  RankedTensorType lhs = tensorOf(op->getOperand(0)),
                   rhs = tensorOf(op->getOperand(1)),
                   result = tensorOf(op->getResult(0));
  if (lhs.getRank() != rhs.getRank() ||
      lhs.getElementType() != rhs.getElementType())
    return op->emitOpError("C1: operands must have equal ranks and element "
                           "types");
  SmallVector<int64_t> shape;
  for (auto [a, b] : llvm::zip(lhs.getShape(), rhs.getShape())) {
    if (a != b && a != 1 && b != 1)
      return op->emitOpError("C2: dimensions ")
             << a << " and " << b << " do not broadcast";
    shape.push_back(a == 1 ? b : a);
  }
  if (result.getShape() != ArrayRef<int64_t>(shape) ||
      result.getElementType() != lhs.getElementType())
    return op->emitOpError("C3: result must have the broadcast shape");
  return success();
}

LogicalResult AddOp::verify() { return verifyBroadcastBinary(*this); }
LogicalResult MulOp::verify() { return verifyBroadcastBinary(*this); }

static LogicalResult verifySameType(Operation *op) {
  Type type = op->getOperand(0).getType();
  for (Value value : llvm::concat<Value>(op->getOperands(), op->getResults()))
    if (value.getType() != type)
      return op->emitOpError("C1: operands and result must have one type");
  return success();
}

LogicalResult SiluOp::verify() { return verifySameType(*this); }
LogicalResult SigmoidOp::verify() { return verifySameType(*this); }

LogicalResult SoftcapOp::verify() {
  if (!(std::isfinite(getCap().convertToDouble()) && getCap().convertToDouble() > 0))
    return emitOpError("C2: cap must be finite and positive");
  return verifySameType(*this);
}
LogicalResult GeluOp::verify() { return verifySameType(*this); }
LogicalResult SwigluOp::verify() { return verifySameType(*this); }

//===----------------------------------------------------------------------===//
// Shape manipulation
//===----------------------------------------------------------------------===//

LogicalResult ReshapeOp::verify() {
  RankedTensorType x = tensorOf(getX()), result = tensorOf(getResult());
  if (x.getNumElements() != result.getNumElements() ||
      x.getElementType() != result.getElementType())
    return emitOpError("C1: reshape must keep the element count (")
           << x.getNumElements() << " vs " << result.getNumElements()
           << ") and the element type";
  return success();
}

LogicalResult TransposeOp::verify() {
  RankedTensorType x = tensorOf(getX()), result = tensorOf(getResult());
  ArrayRef<int64_t> perm = getPermutation();
  SmallVector<bool> seen(x.getRank(), false);
  if (static_cast<int64_t>(perm.size()) != x.getRank())
    return emitOpError("C1: permutation must have ") << x.getRank() << " entries";
  for (int64_t p : perm) {
    if (p < 0 || p >= x.getRank() || seen[p])
      return emitOpError("C1: permutation is not a permutation of 0 .. ")
             << x.getRank() - 1;
    seen[p] = true;
  }
  for (auto [i, p] : llvm::enumerate(perm))
    if (result.getRank() != x.getRank() ||
        result.getDimSize(i) != x.getDimSize(p))
      return emitOpError("C2: result shape does not follow the permutation");
  if (result.getElementType() != x.getElementType())
    return emitOpError("C2: element types must agree");
  return success();
}

LogicalResult SliceOp::verify() {
  RankedTensorType x = tensorOf(getX()), result = tensorOf(getResult());
  int64_t dim = getDim(), start = getStart();
  if (dim < 0 || dim >= x.getRank())
    return emitOpError("C1: dim must be in [0, ") << x.getRank() << ")";
  if (result.getRank() != x.getRank() ||
      result.getElementType() != x.getElementType())
    return emitOpError("C2: result must have x's rank and element type");
  for (int64_t d = 0; d < x.getRank(); ++d)
    if (d != dim && result.getDimSize(d) != x.getDimSize(d))
      return emitOpError("C2: result must equal x outside dimension ") << dim;
  if (start < 0 || start + result.getDimSize(dim) > x.getDimSize(dim))
    return emitOpError("C3: slice [")
           << start << ", " << start + result.getDimSize(dim)
           << ") lies outside dimension " << dim << " of size "
           << x.getDimSize(dim);
  return success();
}

LogicalResult ConcatOp::verify() {
  if (getInputs().empty())
    return emitOpError("C1: needs at least one input");
  RankedTensorType first = tensorOf(getInputs().front()),
                   result = tensorOf(getResult());
  int64_t dim = getDim();
  if (dim < 0 || dim >= first.getRank())
    return emitOpError("C1: dim must be in [0, ") << first.getRank() << ")";
  int64_t total = 0;
  for (Value input : getInputs()) {
    RankedTensorType type = tensorOf(input);
    if (type.getRank() != first.getRank() ||
        type.getElementType() != first.getElementType())
      return emitOpError("C1: inputs must share rank and element type");
    for (int64_t d = 0; d < type.getRank(); ++d)
      if (d != dim && type.getDimSize(d) != first.getDimSize(d))
        return emitOpError("C2: inputs must agree outside dimension ") << dim;
    total += type.getDimSize(dim);
  }
  SmallVector<int64_t> expected(first.getShape());
  expected[dim] = total;
  if (result.getShape() != ArrayRef<int64_t>(expected) ||
      result.getElementType() != first.getElementType())
    return emitOpError("C2: result extent along dimension ")
           << dim << " must be " << total;
  return success();
}

LogicalResult BroadcastOp::verify() {
  RankedTensorType x = tensorOf(getX()), result = tensorOf(getResult());
  if (x.getRank() != result.getRank() ||
      x.getElementType() != result.getElementType())
    return emitOpError("C1: operand and result must have equal ranks and "
                       "element types");
  for (auto [a, b] : llvm::zip(x.getShape(), result.getShape()))
    if (a != b && a != 1)
      return emitOpError("C1: dimension of size ")
             << a << " cannot broadcast to " << b;
  return success();
}

//===----------------------------------------------------------------------===//
// Mixture of experts
//===----------------------------------------------------------------------===//

static LogicalResult verifyRoutedShape(Operation *op, RankedTensorType x,
                                       RankedTensorType routed, int64_t k,
                                       StringRef label, StringRef what) {
  SmallVector<int64_t> expected(x.getShape());
  expected.back() = k;
  if (routed.getShape() != ArrayRef<int64_t>(expected))
    return op->emitOpError(label)
           << ": " << what << " must have x's shape with the last dimension "
           << k;
  return success();
}

// An expert load of `x`'s tokens: [experts], or [B, experts] per sequence
// of x [B, S, H]; f32.
static bool isExpertLoad(RankedTensorType load, RankedTensorType x,
                         int64_t experts) {
  if (!load.getElementType().isF32() || load.getRank() < 1 ||
      load.getShape().back() != experts)
    return false;
  return load.getRank() == 1 || (load.getRank() == 2 && x.getRank() == 3 &&
                                 load.getDimSize(0) == x.getDimSize(0));
}

// C1-C3 and C5 of the router and its gradient (same operands, same
// attributes); C4 of the router's weights and indices.
template <typename RouterLikeOp>
static LogicalResult verifyRouting(RouterLikeOp op) {
  RankedTensorType x = tensorOf(op.getX()), gate = tensorOf(op.getGate());
  int64_t experts = op.getNumExperts(), k = op.getTopK();
  if (x.getRank() < 1 || gate.getRank() != 2 || gate.getDimSize(0) != experts ||
      gate.getDimSize(1) != x.getShape().back())
    return op.emitOpError("C1: gate must be [num_experts, H] = [")
           << experts << ", " << (x.getRank() ? x.getShape().back() : 0) << "]";
  if (op.getBias()) {
    RankedTensorType bias = tensorOf(op.getBias());
    if (bias.getRank() != 1 || bias.getDimSize(0) != experts)
      return op.emitOpError("C1: bias must be [") << experts << "]";
  }
  if (k <= 0 || k > experts)
    return op.emitOpError("C2: top_k must be in [1, num_experts], got ") << k;
  int64_t groups = op.getNumGroups(), topkGroups = op.getTopkGroups();
  if (groups <= 0 || experts % groups != 0)
    return op.emitOpError("C3: num_groups (")
           << groups << ") must divide num_experts (" << experts << ")";
  // The runtimes keep the chosen groups as a 64-bit mask (kMaxExpertGroups,
  // runtime/include/parax/runtime/ExpertChoice.h).
  constexpr int64_t maxGroups = 64;
  if (groups > maxGroups)
    return op.emitOpError("C3: num_groups (")
           << groups << ") must be at most " << maxGroups;
  if (topkGroups <= 0 || topkGroups > groups)
    return op.emitOpError("C3: topk_groups must be in [1, num_groups]");
  if (topkGroups * (experts / groups) < k)
    return op.emitOpError("C3: the ")
           << topkGroups << " allowed groups hold fewer than top_k experts";
  if (!(op.getScalingFactor().convertToDouble() > 0))
    return op.emitOpError("C5: scaling_factor must be positive");
  return success();
}

LogicalResult RouterOp::verify() {
  if (failed(verifyRouting(*this)))
    return failure();
  if (!(getAuxLossCoef().convertToDouble() >= 0))
    return emitOpError("C6: aux_loss_coef must not be negative");
  RankedTensorType x = tensorOf(getX());
  if (getSequenceAux() && x.getRank() != 3)
    return emitOpError(
               "C7: sequence_aux needs x of rank 3 ([B, S, H]), got rank ")
           << x.getRank();
  int64_t k = getTopK();
  if (failed(verifyRoutedShape(*this, x, tensorOf(getWeights()), k, "C4",
                               "weights")) ||
      failed(verifyRoutedShape(*this, x, tensorOf(getIndices()), k, "C4",
                               "indices")))
    return failure();
  if (tensorOf(getWeights()).getElementType() != x.getElementType())
    return emitOpError("C4: weights must have x's element type");
  return success();
}

LogicalResult RouterLoadOp::verify() {
  if (failed(verifyRouting(*this)))
    return failure();
  RankedTensorType result = tensorOf(getResult());
  if (!isExpertLoad(result, tensorOf(getX()), getNumExperts()))
    return emitOpError("C4: the result must be [")
           << getNumExperts() << "] or [B, " << getNumExperts()
           << "] (x [B, S, H]) of f32";
  return success();
}

LogicalResult RouterAuxGradOp::verify() {
  RankedTensorType x = tensorOf(getX()), gate = tensorOf(getGate()),
                   load = tensorOf(getLoad()), result = tensorOf(getResult());
  int64_t experts = getNumExperts();
  if (x.getRank() < 1 || gate.getRank() != 2 || gate.getDimSize(0) != experts ||
      gate.getDimSize(1) != x.getShape().back() ||
      !isExpertLoad(load, x, experts))
    return emitOpError("C1: gate must be [num_experts, H] and load "
                       "[num_experts] or [B, num_experts] (x [B, S, H]), "
                       "num_experts = ")
           << experts;
  if (failed(verifyRoutedShape(*this, x, result, experts, "C2", "the result")))
    return failure();
  if (result.getElementType() != x.getElementType())
    return emitOpError("C2: the result must have x's element type");
  if (!(getCoefficient().convertToDouble() >= 0) || getNumTokens() <= 0 ||
      getNumSequences() <= 0)
    return emitOpError("C3: coefficient must not be negative and num_tokens "
                       "and num_sequences must be positive");
  return success();
}

LogicalResult BalanceLossOp::verify() {
  int64_t experts = getNumExperts();
  RankedTensorType load = tensorOf(getLoad());
  if ((load.getRank() != 1 && load.getRank() != 2) ||
      load.getShape().back() != experts ||
      tensorOf(getScores()).getShape() != load.getShape())
    return emitOpError("C1: load and scores must be [num_experts] or "
                       "[B, num_experts] alike, of f32, num_experts = ")
           << experts;
  if (tensorOf(getResult()).getRank() != 0)
    return emitOpError("C2: the result must be a rank-0 f32 tensor");
  if (!(getCoefficient().convertToDouble() >= 0) || getNumTokens() <= 0 ||
      getNumSequences() <= 0)
    return emitOpError("C3: coefficient must not be negative and num_tokens "
                       "and num_sequences must be positive");
  return success();
}

LogicalResult RouterGradOp::verify() {
  if (failed(verifyRouting(*this)))
    return failure();
  RankedTensorType x = tensorOf(getX()), result = tensorOf(getResult());
  if (failed(verifyRoutedShape(*this, x, tensorOf(getDweights()), getTopK(),
                               "C4", "dweights")) ||
      failed(verifyRoutedShape(*this, x, result, getNumExperts(), "C4",
                               "the result")))
    return failure();
  if (result.getElementType() != x.getElementType())
    return emitOpError("C4: the result must have x's element type");
  return success();
}

int64_t ExpertsOp::getNumExperts() { return tensorOf(getWGate()).getDimSize(0); }
int64_t ExpertsOp::getFfnDim() { return tensorOf(getWGate()).getDimSize(1); }
int64_t ExpertsOp::getTopK() {
  return tensorOf(getIndices()).getShape().back();
}

// C1 and C2 of the experts and their gradient.
template <typename ExpertsLikeOp>
static LogicalResult verifyExperts(ExpertsLikeOp op) {
  RankedTensorType x = tensorOf(op.getX()), gate = tensorOf(op.getWGate()),
                   up = tensorOf(op.getWUp()), down = tensorOf(op.getWDown());
  if (x.getRank() < 1 || gate.getRank() != 3)
    return op.emitOpError("C1: w_gate must be [E, F, H]");
  int64_t e = gate.getDimSize(0), f = gate.getDimSize(1),
          h = x.getShape().back();
  if (gate.getDimSize(2) != h)
    return op.emitOpError("C1: w_gate must be [E, F, H] with H = ") << h;
  if (up.getShape() != gate.getShape())
    return op.emitOpError("C1: w_up must have w_gate's shape [")
           << e << ", " << f << ", " << h << "]";
  if (down.getRank() != 3 || down.getDimSize(0) != e ||
      down.getDimSize(1) != h || down.getDimSize(2) != f)
    return op.emitOpError("C1: w_down must be [E, H, F] = [")
           << e << ", " << h << ", " << f << "]";
  RankedTensorType weights = tensorOf(op.getWeights());
  int64_t k = weights.getRank() ? weights.getShape().back() : 0;
  if (failed(verifyRoutedShape(op, x, weights, k, "C2", "weights")) ||
      failed(verifyRoutedShape(op, x, tensorOf(op.getIndices()), k, "C2",
                               "indices")))
    return failure();
  return success();
}

LogicalResult ExpertsOp::verify() {
  if (failed(verifyExperts(*this)))
    return failure();
  if (getResult().getType() != getX().getType())
    return emitOpError("C3: result must have x's type");
  return success();
}

LogicalResult ExpertsGradOp::verify() {
  if (failed(verifyExperts(*this)))
    return failure();
  if (getDy().getType() != getX().getType() ||
      getDx().getType() != getX().getType() ||
      getDweights().getType() != getWeights().getType() ||
      getDwGate().getType() != getWGate().getType() ||
      getDwUp().getType() != getWUp().getType() ||
      getDwDown().getType() != getWDown().getType())
    return emitOpError("C3: dy must have x's type, and the results the types "
                       "of x, weights, w_gate, w_up and w_down");
  return success();
}

//===----------------------------------------------------------------------===//
// Loss
//===----------------------------------------------------------------------===//

static LogicalResult verifyLabels(Operation *op, Value logitsValue,
                                  Value labelsValue) {
  RankedTensorType logits = tensorOf(logitsValue),
                   labels = tensorOf(labelsValue);
  if (logits.getRank() < 1 ||
      labels.getShape() != logits.getShape().drop_back())
    return op->emitOpError("C1: labels must have the logits' shape without "
                           "the last dimension");
  return success();
}

// C3 of the cross-entropy and its gradient.
static LogicalResult verifyNumTokens(Operation *op, Value logitsValue,
                                     std::optional<uint64_t> numTokens) {
  RankedTensorType logits = tensorOf(logitsValue);
  int64_t tokens =
      logits.getNumElements() / std::max<int64_t>(1, logits.getShape().back());
  if (numTokens && static_cast<int64_t>(*numTokens) < tokens)
    return op->emitOpError("C3: num_tokens (")
           << *numTokens << ") must be at least the " << tokens
           << " tokens of the logits";
  return success();
}

// C4 of the cross-entropy and its gradient: `count` with `ignore_index`.
template <typename CrossEntropyLikeOp>
static LogicalResult verifyIgnoredLabels(CrossEntropyLikeOp op) {
  if (bool(op.getCount()) != op.getIgnoreIndex().has_value())
    return op.emitOpError("C4: the count of labels (parax.label_count) must be "
                          "given with ignore_index and only then");
  if (std::optional<APFloat> weight = op.getWeight()) {
    double w = weight->convertToDouble();
    if (!(w > 0) || !std::isfinite(w))
      return op.emitOpError("C5: weight must be a positive finite number, got ") << w;
  }
  // C6: a count, then an lse, each at most once; the lse of a
  // vocab-parallel op only, one logsumexp a token.
  auto extras = op.getExtras();
  bool counted = op.getCount() != nullptr, vocab = op.getLse() != nullptr;
  if (extras.size() != unsigned(counted) + unsigned(vocab) ||
      (extras.size() == 2 && tensorOf(extras[0]).getRank() != 0))
    return op.emitOpError("C6: after the labels come at most a count (rank 0) and an lse, "
                          "in that order, got ")
           << extras.size() << " operand(s)";
  if (bool(op.getVocabGrid()) != bool(op.getVocabAxes()) || bool(op.getVocabGrid()) != vocab)
    return op.emitOpError("C6: an lse is given with vocab_grid and vocab_axes, and only then");
  if (vocab) {
    SmallVector<int64_t> shape(tensorOf(op.getLogits()).getShape());
    shape.back() = 1;
    if (tensorOf(op.getLse()).getShape() != ArrayRef<int64_t>(shape))
      return op.emitOpError("C6: lse must have the logits' shape with a last dimension of 1, got ")
             << op.getLse().getType();
  }
  return success();
}

LogicalResult CrossEntropyOp::verify() {
  if (failed(verifyLabels(*this, getLogits(), getLabels())) ||
      failed(verifyIgnoredLabels(*this)))
    return failure();
  return verifyNumTokens(*this, getLogits(), getNumTokens());
}

// C1 holds by the result's type constraint.
LogicalResult LabelCountOp::verify() { return success(); }

LogicalResult LogSumExpOp::verify() {
  RankedTensorType x = tensorOf(getX());
  SmallVector<int64_t> shape(x.getShape());
  if (!shape.empty())
    shape.back() = 1;
  if (x.getRank() < 1 || tensorOf(getResult()).getShape() != ArrayRef<int64_t>(shape))
    return emitOpError("C1: the result must have x's shape with a last dimension of 1, got ")
           << x << " -> " << getResult().getType();
  return success();
}

LogicalResult ShiftOp::verify() {
  RankedTensorType x = tensorOf(getX());
  if (x.getRank() != 2 || getResult().getType() != x)
    return emitOpError("C1: x must be [batch, sequence] and the result of its type, got ")
           << x << " -> " << getResult().getType();
  if (getShift() <= 0 || getShift() >= x.getDimSize(1))
    return emitOpError("C2: shift must be in (0, ") << x.getDimSize(1) << "), the sequence, got "
                                                     << getShift();
  return success();
}

//===----------------------------------------------------------------------===//
// Gradients
//===----------------------------------------------------------------------===//

LogicalResult CrossEntropyGradOp::verify() {
  if (failed(verifyLabels(*this, getLogits(), getLabels())) ||
      failed(verifyIgnoredLabels(*this)))
    return failure();
  if (getResult().getType() != getLogits().getType())
    return emitOpError("C2: the result must have the logits' type");
  return verifyNumTokens(*this, getLogits(), getNumTokens());
}

LogicalResult LinearWeightGradOp::verify() {
  RankedTensorType x = tensorOf(getX()), dy = tensorOf(getDy()),
                   dw = tensorOf(getResult());
  if (x.getRank() < 2 || dy.getRank() != x.getRank() ||
      x.getShape().drop_back() != dy.getShape().drop_back())
    return emitOpError("C1: x and dy must have one rank (at least 2) and "
                       "agree on every dimension but the last, got ")
           << x << " and " << dy;
  int64_t in = x.getShape().back(), out = dy.getShape().back();
  SmallVector<int64_t> expected = getTransposeW() ? SmallVector<int64_t>{out, in}
                                                  : SmallVector<int64_t>{in, out};
  if (dw.getShape() != ArrayRef<int64_t>(expected) ||
      dw.getElementType() != x.getElementType())
    return emitOpError("C2: the result must be [")
           << expected[0] << ", " << expected[1] << "] of x's element type";
  return success();
}

// A norm's input gradient: the norm's rules, and dy of x's type (C2).
static LogicalResult verifyNormGrad(Operation *op, Value x, Value weight,
                                    Value dy, Value result, double eps) {
  if (failed(verifyNorm(op, x, weight, result, eps)))
    return failure();
  if (dy.getType() != x.getType())
    return op->emitOpError("C2: dy must have x's type");
  return success();
}

// A norm's weight gradient: dy of x's type (C1), [H] (C2), eps > 0 (C3).
static LogicalResult verifyNormWeightGrad(Operation *op, Value xValue,
                                          Value dy, Value result, double eps) {
  RankedTensorType x = tensorOf(xValue), dw = tensorOf(result);
  if (dy.getType() != x)
    return op->emitOpError("C1: dy must have x's type");
  if (x.getRank() < 1 || dw.getRank() != 1 ||
      dw.getDimSize(0) != x.getShape().back() ||
      dw.getElementType() != x.getElementType())
    return op->emitOpError("C2: the result must be [")
           << (x.getRank() ? x.getShape().back() : 0)
           << "] of x's element type";
  if (!(eps > 0))
    return op->emitOpError("C3: eps must be positive");
  return success();
}

LogicalResult RmsNormGradOp::verify() {
  if (std::optional<double> offset = valueOf(getOffsetAttr()); offset && !std::isfinite(*offset))
    return emitOpError("C4: offset must be finite");
  return verifyNormGrad(*this, getX(), getWeight(), getDy(), getResult(),
                        getEps().convertToDouble());
}

LogicalResult RmsNormWeightGradOp::verify() {
  return verifyNormWeightGrad(*this, getX(), getDy(), getResult(),
                              getEps().convertToDouble());
}

LogicalResult SwigluGradOp::verify() {
  if (failed(verifySameType(*this)))
    return failure();
  if (getOperand() != 0 && getOperand() != 1)
    return emitOpError("C2: operand must be 0 (gate) or 1 (up), got ")
           << getOperand();
  return success();
}

LogicalResult AttentionGradOp::verify() {
  if (failed(verifyAttention(*this, getDout(), /*hasPosition=*/false)))
    return failure();
  if (getDq().getType() != getQ().getType() ||
      getDk().getType() != getK().getType() ||
      getDv().getType() != getV().getType())
    return emitOpError("C10: dq, dk and dv must have q's, k's and v's types");
  return success();
}

LogicalResult SumToOp::verify() {
  RankedTensorType x = tensorOf(getX()), result = tensorOf(getResult());
  bool fits = x.getRank() == result.getRank() &&
              x.getElementType() == result.getElementType();
  for (int64_t d = 0; fits && d < x.getRank(); ++d)
    fits = result.getDimSize(d) == x.getDimSize(d) || result.getDimSize(d) == 1;
  if (!fits)
    return emitOpError("C1: the result must have x's rank and element type, "
                       "each dimension x's or 1, got ")
           << x << " -> " << result;
  return success();
}

LogicalResult GeluGradOp::verify() { return verifySameType(*this); }
LogicalResult SigmoidGradOp::verify() { return verifySameType(*this); }

LogicalResult SoftcapGradOp::verify() {
  if (!(std::isfinite(getCap().convertToDouble()) && getCap().convertToDouble() > 0))
    return emitOpError("C2: cap must be finite and positive");
  return verifySameType(*this);
}

LogicalResult LayerNormGradOp::verify() {
  return verifyNormGrad(*this, getX(), getWeight(), getDy(), getResult(),
                        getEps().convertToDouble());
}

LogicalResult LayerNormWeightGradOp::verify() {
  return verifyNormWeightGrad(*this, getX(), getDy(), getResult(),
                              getEps().convertToDouble());
}

LogicalResult PositionEmbeddingGradOp::verify() {
  RankedTensorType dy = tensorOf(getDy()), table = tensorOf(getResult());
  if (table.getRank() != 2 || dy.getRank() != 3 || dy.getDimSize(0) != 1 ||
      dy.getDimSize(2) != table.getDimSize(1) ||
      dy.getElementType() != table.getElementType())
    return emitOpError("C1: expected a [1, S, H] dy and a [P, H] result");
  FailureOr<int64_t> pieces = sequencePieces(
      *this, "C3", getSeqGridAttr(), getSeqAxesAttr(), /*hasPosition=*/false);
  if (failed(pieces))
    return failure();
  int64_t offset = getOffset(), rows = *pieces * dy.getDimSize(1);
  if (offset < 0 || offset + rows > table.getDimSize(0))
    return emitOpError("C2: positions ")
           << offset << " .. " << offset + rows - 1 << " exceed the table's "
           << table.getDimSize(0) << " rows";
  return success();
}

LogicalResult EmbeddingGradOp::verify() {
  RankedTensorType ids = tensorOf(getIds()), dy = tensorOf(getDy()),
                   table = tensorOf(getResult());
  if (table.getRank() != 2 || dy.getRank() != ids.getRank() + 1 ||
      dy.getShape().drop_back() != ids.getShape() ||
      dy.getShape().back() != table.getDimSize(1))
    return emitOpError("C1: the result must be [V, H] and dy ids' shape with "
                       "H appended, got ")
           << dy << " and " << table;
  if (bool(getVocabGrid()) != bool(getVocabAxes()))
    return emitOpError("C2: vocab_grid and vocab_axes come together");
  if (std::optional<double> scale = valueOf(getScaleAttr()); scale && !(std::isfinite(*scale) && *scale > 0))
    return emitOpError("C3: scale must be finite and positive, got ") << *scale;
  return success();
}

//===----------------------------------------------------------------------===//
// Communication
//===----------------------------------------------------------------------===//

// The grid and the product of the sizes of `axes`, after checking that the
// axes are distinct axes of the grid, in its order (C1).
static FailureOr<int64_t> groupSize(Operation *op, FlatSymbolRefAttr gridRef,
                                    ArrayAttr axes,
                                    SymbolTableCollection &symbols) {
  auto grid = symbols.lookupNearestSymbolFrom<GridOp>(op, gridRef);
  if (!grid)
    return op->emitOpError("C1: unknown grid ") << gridRef;
  if (axes.empty())
    return op->emitOpError("C1: needs at least one grid axis");
  llvm::StringSet<> seen;
  int64_t size = 1, last = -1;
  ArrayRef<Attribute> names = grid.getAxisNames().getValue();
  for (Attribute attr : axes) {
    StringRef axis = cast<StringAttr>(attr).getValue();
    std::optional<int64_t> axisSize = grid.getAxisSize(axis);
    if (!axisSize)
      return op->emitOpError("C1: unknown grid axis '")
             << axis << "' (grid " << gridRef << " has axes "
             << grid.getAxisNames() << ")";
    if (!seen.insert(axis).second)
      return op->emitOpError("C1: grid axis '") << axis << "' is named twice";
    int64_t index = llvm::find(names, attr) - names.begin();
    if (index < last)
      return op->emitOpError("C1: axes must follow the grid's order (grid ")
             << gridRef << " has axes " << grid.getAxisNames() << ")";
    last = index;
    size *= *axisSize;
  }
  return size;
}

// `result` equals `x` except along `dim`, scaled by `num / den`.
static LogicalResult checkScaledDim(Operation *op, Value x, Value result,
                                    int64_t dim, int64_t num, int64_t den) {
  auto in = cast<RankedTensorType>(x.getType());
  auto out = cast<RankedTensorType>(result.getType());
  if (dim < 0 || dim >= in.getRank())
    return op->emitOpError("C2: dim ") << dim << " is out of range";
  if (in.getDimSize(dim) * num % den != 0)
    return op->emitOpError("C2: dimension ")
           << dim << " of size " << in.getDimSize(dim)
           << " does not divide by " << den;
  SmallVector<int64_t> expected(in.getShape());
  expected[dim] = in.getDimSize(dim) * num / den;
  if (out.getShape() != ArrayRef<int64_t>(expected) ||
      out.getElementType() != in.getElementType())
    return op->emitOpError("C2: expected result ")
           << RankedTensorType::get(expected, in.getElementType());
  return success();
}

#define PARAX_GROUP_SIZE(Op)                                                   \
  int64_t Op::getGroupSize(SymbolTableCollection &symbols) {                   \
    FailureOr<int64_t> size = groupSize(*this, getGridAttr(), getAxes(), symbols); \
    return failed(size) ? 0 : *size;                                           \
  }                                                                            \
  uint64_t Op::getFlops() { return 0; }
PARAX_GROUP_SIZE(AllReduceOp)
PARAX_GROUP_SIZE(AllGatherOp)
PARAX_GROUP_SIZE(ReduceScatterOp)
PARAX_GROUP_SIZE(AllToAllOp)
PARAX_GROUP_SIZE(ShardSliceOp)
PARAX_GROUP_SIZE(ToPartialOp)
PARAX_GROUP_SIZE(MoeDispatchOp)
PARAX_GROUP_SIZE(MoeCombineOp)
PARAX_GROUP_SIZE(SendOp)
PARAX_GROUP_SIZE(RecvOp)
#undef PARAX_GROUP_SIZE

// C1 and "the result type equals the operand type" (C2).
template <typename OpT>
static LogicalResult verifyTypePreserving(OpT op, SymbolTableCollection &symbols) {
  if (failed(groupSize(op, op.getGridAttr(), op.getAxes(), symbols)))
    return failure();
  if (op.getX().getType() != op.getResult().getType())
    return op.emitOpError("C2: the result type must equal the operand type");
  return success();
}

LogicalResult AllReduceOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyTypePreserving(*this, symbols);
}

LogicalResult ToPartialOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyTypePreserving(*this, symbols);
}

LogicalResult AllGatherOp::verifySymbolUses(SymbolTableCollection &symbols) {
  FailureOr<int64_t> size = groupSize(*this, getGridAttr(), getAxes(), symbols);
  if (failed(size))
    return failure();
  return checkScaledDim(*this, getX(), getResult(), getDim(), *size, 1);
}

LogicalResult ReduceScatterOp::verifySymbolUses(SymbolTableCollection &symbols) {
  FailureOr<int64_t> size = groupSize(*this, getGridAttr(), getAxes(), symbols);
  if (failed(size))
    return failure();
  return checkScaledDim(*this, getX(), getResult(), getDim(), 1, *size);
}

LogicalResult ShardSliceOp::verifySymbolUses(SymbolTableCollection &symbols) {
  FailureOr<int64_t> size = groupSize(*this, getGridAttr(), getAxes(), symbols);
  if (failed(size))
    return failure();
  return checkScaledDim(*this, getX(), getResult(), getDim(), 1, *size);
}

LogicalResult AllToAllOp::verifySymbolUses(SymbolTableCollection &symbols) {
  FailureOr<int64_t> size = groupSize(*this, getGridAttr(), getAxes(), symbols);
  if (failed(size))
    return failure();
  int64_t split = getSplitDim(), concat = getConcatDim();
  auto in = cast<RankedTensorType>(getX().getType());
  auto out = cast<RankedTensorType>(getResult().getType());
  if (split == concat || split < 0 || concat < 0 || split >= in.getRank() ||
      concat >= in.getRank())
    return emitOpError("C2: split and concat must be distinct dimensions");
  if (in.getDimSize(split) % *size)
    return emitOpError("C2: dimension ") << split << " does not divide by " << *size;
  SmallVector<int64_t> expected(in.getShape());
  expected[split] /= *size;
  expected[concat] *= *size;
  if (out.getShape() != ArrayRef<int64_t>(expected) ||
      out.getElementType() != in.getElementType())
    return emitOpError("C2: expected result ")
           << RankedTensorType::get(expected, in.getElementType());
  return success();
}

// Tokens and choices of a [..., k] routing tensor.
static std::pair<int64_t, int64_t> tokensAndChoices(Value indices) {
  auto type = cast<RankedTensorType>(indices.getType());
  int64_t k = type.getRank() ? type.getShape().back() : 1;
  return {type.getNumElements() / std::max<int64_t>(k, 1), k};
}

// C2 of moe_dispatch and moe_combine: the size of the group over `axes`,
// which must divide the experts.
template <typename MoeExchangeOp>
static FailureOr<int64_t> expertGroupSize(MoeExchangeOp op,
                                          SymbolTableCollection &symbols) {
  FailureOr<int64_t> size =
      groupSize(op, op.getGridAttr(), op.getAxes(), symbols);
  if (failed(size))
    return failure();
  int64_t experts = op.getNumExperts();
  if (experts <= 0 || experts % *size)
    return op.emitOpError("C2: ")
           << experts << " experts do not divide over " << *size << " ranks";
  return size;
}

LogicalResult MoeDispatchOp::verifySymbolUses(SymbolTableCollection &symbols) {
  FailureOr<int64_t> size = expertGroupSize(*this, symbols);
  if (failed(size))
    return failure();
  auto x = cast<RankedTensorType>(getX().getType());
  auto [tokens, k] = tokensAndChoices(getIndices());
  ArrayRef<int64_t> lead = x.getShape().drop_back();
  auto w = cast<RankedTensorType>(getWeights().getType());
  auto i = cast<RankedTensorType>(getIndices().getType());
  if (w.getShape() != i.getShape() || i.getShape().drop_back() != lead)
    return emitOpError("C3: weights and indices must have x's leading shape "
                       "and one k");
  int64_t hidden = x.getShape().back();
  auto rowsType = cast<RankedTensorType>(getRows().getType());
  auto rowWeights = cast<RankedTensorType>(getRowWeights().getType());
  auto rowExperts = cast<RankedTensorType>(getRowExperts().getType());
  int64_t rows = rowsType.getRank() == 2 ? rowsType.getDimSize(0) : -1;
  if (rowsType.getRank() != 2 || rowsType.getDimSize(1) != hidden ||
      rowWeights.getShape() != ArrayRef<int64_t>{rows, 1} ||
      rowExperts.getShape() != ArrayRef<int64_t>{rows, 1} ||
      rowsType.getElementType() != x.getElementType() ||
      rowWeights.getElementType() != x.getElementType())
    return emitOpError("C3: expected results [R, ")
           << hidden
           << "], [R, 1], [R, 1] in x's element type (R rows, i32 experts)";
  if (rows < tokens * k || rows > *size * tokens * k)
    return emitOpError("C3: ")
           << rows << " rows: a rank holds from its " << tokens * k
           << " (token, choice) pairs to every rank's, " << *size * tokens * k;
  return success();
}

LogicalResult MoeCombineOp::verifySymbolUses(SymbolTableCollection &symbols) {
  FailureOr<int64_t> size = expertGroupSize(*this, symbols);
  if (failed(size))
    return failure();
  auto [tokens, k] = tokensAndChoices(getIndices());
  auto rows = cast<RankedTensorType>(getRows().getType());
  auto i = cast<RankedTensorType>(getIndices().getType());
  auto result = cast<RankedTensorType>(getResult().getType());
  int64_t hidden = rows.getRank() == 2 ? rows.getDimSize(1) : -1;
  SmallVector<int64_t> expected(getPerChoice() ? i.getShape()
                                               : i.getShape().drop_back());
  expected.push_back(hidden);
  if (rows.getRank() != 2 || rows.getDimSize(0) < tokens * k ||
      rows.getDimSize(0) > *size * tokens * k ||
      result.getShape() != ArrayRef<int64_t>(expected) ||
      result.getElementType() != rows.getElementType())
    return emitOpError("C3: expected rows [R, H], R from ")
           << tokens * k << " to " << *size * tokens * k
           << " (as the dispatch's), and a result of indices' "
           << (getPerChoice() ? "" : "leading ") << "shape with H appended";
  return success();
}

static LogicalResult verifyPeer(Operation *op, FlatSymbolRefAttr grid,
                                ArrayAttr axes, int64_t peer,
                                SymbolTableCollection &symbols) {
  FailureOr<int64_t> size = groupSize(op, grid, axes, symbols);
  if (failed(size))
    return failure();
  if (axes.size() != 1)
    return op->emitOpError("C1: point-to-point needs exactly one axis");
  if (peer < 0 || peer >= *size)
    return op->emitOpError("C2: peer ")
           << peer << " is outside the axis (size " << *size << ")";
  return success();
}

LogicalResult SendOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyPeer(*this, getGridAttr(), getAxes(),
                    static_cast<int64_t>(getPeer()), symbols);
}

LogicalResult RecvOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyPeer(*this, getGridAttr(), getAxes(),
                    static_cast<int64_t>(getPeer()), symbols);
}

#define GET_OP_CLASSES
#include "parax/Dialect/Parax/IR/ParaxOps.cpp.inc"
