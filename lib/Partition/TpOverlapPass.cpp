//===- TpOverlapPass.cpp - GEMMs split so their collectives overlap ------===//
//
// A tensor-parallel layer's GEMM and the collective beside it run one after
// the other: the collective reads the GEMM's whole result, or the GEMM the
// collective's. Split into row chunks, each chunk with a collective of its
// own, chunk i's transfer runs while chunk i + 1 multiplies (the runtimes
// issue collectives on a stream of their own and wait where a result is
// read).
//
//===----------------------------------------------------------------------===//

#include "parax/Dialect/Parax/IR/ParaxOps.h"
#include "parax/Partition/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

namespace parax {
#define GEN_PASS_DEF_PARAXTPOVERLAPPASS
#include "parax/Partition/Passes.h.inc"
} // namespace parax

using namespace mlir;
using namespace parax;

namespace {

/// The dimension a collective works along (-1: none, an all-reduce).
int64_t collectiveDim(Operation *op) {
  if (auto scatter = dyn_cast<ReduceScatterOp>(op))
    return scatter.getDim();
  if (auto gather = dyn_cast<AllGatherOp>(op))
    return gather.getDim();
  return -1;
}

RankedTensorType withShape(Type like, ArrayRef<int64_t> shape) {
  auto ranked = cast<RankedTensorType>(like);
  return RankedTensorType::get(shape, ranked.getElementType(), ranked.getEncoding());
}

/// `type` with dimension `dim` scaled by num / den.
RankedTensorType scaled(Type type, int64_t dim, int64_t num, int64_t den) {
  SmallVector<int64_t> shape(cast<RankedTensorType>(type).getShape());
  shape[dim] = shape[dim] * num / den;
  return withShape(type, shape);
}

/// `type` with its last dimension `n` (a GEMM's result from its input).
RankedTensorType withLast(Type type, int64_t n) {
  SmallVector<int64_t> shape(cast<RankedTensorType>(type).getShape());
  shape.back() = n;
  return withShape(type, shape);
}

/// How the rows of a GEMM's input are cut into chunks beside a collective
/// along dimension `d`: along the first leading dimension (not the last,
/// the features) other than `d` that divides; where none does (a
/// sequence-parallel microbatch of one sequence: only the sequence, the
/// collective's own dimension, is left), along `d` itself viewed as
/// [outer, rows] (`view`): the ranks' pieces times each piece's rows, cut
/// alike in every piece, so each rank still keeps (or sends) one
/// contiguous piece — the view's outer extent the group's size before a
/// reduce-scatter, 1 before an all-gather.
struct Cut {
  int64_t dim = 0;     // the dimension of the (viewed) input cut into chunks
  bool view = false;   // `d` viewed as [outer, rows]: the cut dimension d + 1
  int64_t outer = 1;
};

std::optional<Cut> cutFor(RankedTensorType x, int64_t d, int64_t outer, int64_t chunks) {
  for (int64_t k = 0; k + 1 < x.getRank(); ++k)
    if (k != d && !x.isDynamicDim(k) && x.getDimSize(k) >= chunks && x.getDimSize(k) % chunks == 0)
      return Cut{k};
  if (d >= 0 && d + 1 < x.getRank() && !x.isDynamicDim(d) && x.getDimSize(d) % outer == 0 &&
      x.getDimSize(d) / outer >= chunks && (x.getDimSize(d) / outer) % chunks == 0)
    return Cut{d + 1, true, outer};
  return std::nullopt;
}

/// `x` as the cut sees it: reshaped to [.., outer, rows, ..] at `d` when
/// the cut views its dimension so.
Value viewed(OpBuilder &b, Location loc, Value x, const Cut &cut, int64_t d) {
  if (!cut.view)
    return x;
  SmallVector<int64_t> shape(cast<RankedTensorType>(x.getType()).getShape());
  shape[d] /= cut.outer;
  shape.insert(shape.begin() + d, cut.outer);
  return ReshapeOp::create(b, loc, withShape(x.getType(), shape), x);
}

/// Chunk i of `x` (viewed) along the cut.
Value chunk(OpBuilder &b, Location loc, Value x, const Cut &cut, int64_t i, int64_t chunks) {
  auto type = scaled(x.getType(), cut.dim, 1, chunks);
  return SliceOp::create(b, loc, type, x, cut.dim, i * type.getDimSize(cut.dim));
}

/// The chunks joined along the cut, then seen in `type` (the value they
/// stand for).
Value joined(OpBuilder &b, Location loc, ArrayRef<Value> pieces, const Cut &cut, int64_t chunks, Type type) {
  Value whole = ConcatOp::create(b, loc, scaled(pieces.front().getType(), cut.dim, chunks, 1), pieces, cut.dim);
  return cut.view ? ReshapeOp::create(b, loc, type, whole).getResult() : whole;
}

/// A copy of `op` on `operand` giving `type`.
Value cloneOn(OpBuilder &b, Operation *op, Value operand, Type type) {
  Operation *copy = b.clone(*op);
  copy->setOperand(0, operand);
  copy->getResult(0).setType(type);
  return copy->getResult(0);
}

/// Whether `linear`'s operands other than its input are defined before
/// `gather` (its chunks then move up to the gather).
bool everyOtherOperandBefore(LinearOp linear, AllGatherOp gather) {
  for (Value v : linear->getOperands().drop_front()) {
    Operation *def = v.getDefiningOp();
    if (def && (def->getBlock() != gather->getBlock() || !def->isBeforeInBlock(gather)))
      return false;
  }
  return linear->getBlock() == gather->getBlock();
}

struct TpOverlapPass : parax::impl::ParaxTpOverlapPassBase<TpOverlapPass> {
  using ParaxTpOverlapPassBase::ParaxTpOverlapPassBase;

  /// A gather in chunks, each chunk's GEMMs issued after the next chunk's
  /// gather: gather 0, gather 1, chunk 0's GEMMs, gather 2, chunk 1's
  /// GEMMs, ... (a gather travels while the chunk before it multiplies);
  /// each GEMM's chunks joined where the gather stood, and the gathered
  /// chunks too where something else reads the gathered value.
  void splitGather(AllGatherOp gather, ArrayRef<LinearOp> users) {
    auto xType = cast<RankedTensorType>(gather.getX().getType());
    int64_t d = gather.getDim();
    int64_t ranks = gather.getType().getDimSize(d) / xType.getDimSize(d);
    std::optional<Cut> cut = cutFor(xType, d, /*outer=*/1, chunks);
    if (!cut)
      return;
    OpBuilder b(gather);
    Location loc = gather.getLoc();
    Value x = viewed(b, loc, gather.getX(), *cut, d);
    SmallVector<Value> gathered;
    SmallVector<SmallVector<Value>> products(users.size());
    auto multiply = [&](Value piece) {
      for (auto [k, user] : llvm::enumerate(users)) {
        LinearOp linear = user;
        products[k].push_back(cloneOn(b, linear, piece, withLast(piece.getType(), linear.getType().getShape().back())));
      }
    };
    for (int64_t i = 0; i < chunks; ++i) {
      Value piece = chunk(b, loc, x, *cut, i, chunks);
      gathered.push_back(cloneOn(b, gather, piece, scaled(piece.getType(), d, ranks, 1)));
      if (i > 0)
        multiply(gathered[i - 1]);
    }
    multiply(gathered.back());
    for (auto [k, user] : llvm::enumerate(users)) {
      LinearOp linear = user;
      linear.getResult().replaceAllUsesWith(joined(b, linear.getLoc(), products[k], *cut, chunks, linear.getType()));
      linear.erase();
    }
    // What else reads the gathered value (a weight's gradient) gets the
    // gathered chunks joined.
    if (!gather.getResult().use_empty())
      gather.getResult().replaceAllUsesWith(joined(b, loc, gathered, *cut, chunks, gather.getType()));
    gather.erase();
  }

  /// A GEMM whose result one collective reads: each chunk multiplied and
  /// sent alone, the results joined.
  void splitGemm(LinearOp linear, Operation *collective) {
    auto xType = cast<RankedTensorType>(linear.getX().getType());
    auto in = cast<RankedTensorType>(collective->getOperand(0).getType());
    auto out = cast<RankedTensorType>(collective->getResult(0).getType());
    int64_t d = collectiveDim(collective);
    // (the group's size: a reduce-scatter divides its dimension by it, a
    // gather multiplies it)
    int64_t num = d >= 0 ? out.getDimSize(d) : 1, den = d >= 0 ? in.getDimSize(d) : 1;
    std::optional<Cut> cut = cutFor(xType, d, /*outer=*/den > num ? den / num : 1, chunks);
    if (!cut)
      return;
    OpBuilder b(collective);
    Location loc = linear.getLoc();
    Value x = viewed(b, loc, linear.getX(), *cut, d);
    int64_t n = linear.getType().getShape().back();
    SmallVector<Value> pieces;
    for (int64_t i = 0; i < chunks; ++i) {
      Value product = cloneOn(b, linear, chunk(b, loc, x, *cut, i, chunks), withLast(scaled(x.getType(), cut->dim, 1, chunks), n));
      pieces.push_back(cloneOn(b, collective, product, d >= 0 ? scaled(product.getType(), d, num, den) : product.getType()));
    }
    collective->getResult(0).replaceAllUsesWith(joined(b, loc, pieces, *cut, chunks, out));
    collective->erase();
    linear.erase();
  }

  void runOnOperation() override {
    if (chunks < 2) {
      getOperation().emitError() << "parax-tp-overlap: chunks must be at least 2 (got "
                                 << static_cast<int64_t>(chunks) << ")";
      return signalPassFailure();
    }
    // A gather that GEMMs read (the sequence-parallel all-gather before the
    // column-parallel projections; a training step's weight gradients read
    // it too, and get the gathered chunks joined).
    SmallVector<std::pair<AllGatherOp, SmallVector<LinearOp>>> gathers;
    getOperation().walk([&](AllGatherOp gather) {
      SmallVector<LinearOp> users;
      for (OpOperand &use : gather.getResult().getUses()) {
        auto linear = dyn_cast<LinearOp>(use.getOwner());
        if (linear && use.getOperandNumber() == 0 && everyOtherOperandBefore(linear, gather) &&
            !llvm::is_contained(users, linear))
          users.push_back(linear);
      }
      llvm::sort(users, [](LinearOp a, LinearOp b) { return a->isBeforeInBlock(b); });
      if (!users.empty())
        gathers.push_back({gather, users});
    });
    for (auto &[gather, users] : gathers)
      splitGather(gather, users);
    // Then a GEMM whose one use is a collective (after the gathers: a GEMM
    // between a gather and another collective, an output head's, is split
    // on the gather's side).
    SmallVector<std::pair<LinearOp, Operation *>> found;
    getOperation().walk([&](LinearOp linear) {
      Value result = linear.getResult();
      if (!result.hasOneUse())
        return;
      Operation *user = *result.getUsers().begin();
      if (isa<AllReduceOp, ReduceScatterOp, AllGatherOp>(user))
        found.push_back({linear, user});
    });
    for (auto [linear, collective] : found)
      splitGemm(linear, collective);
  }
};

} // namespace
