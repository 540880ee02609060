//===- TpOverlapPass.cpp - GEMMs split so their collectives overlap ------===//
//
// A tensor-parallel layer's GEMM and the collective that consumes its
// result run one after the other: the collective reads the whole result.
// Split into row chunks, chunk i's collective has only chunk i to wait for
// and travels while chunk i + 1 multiplies (the runtimes issue collectives
// on a stream of their own and wait where a result is read).
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

/// The first leading dimension of `type` (not its last: the GEMM's
/// features) other than `avoid` whose extent divides into `chunks` pieces.
std::optional<int64_t> chunkDim(RankedTensorType type, int64_t avoid, int64_t chunks) {
  for (int64_t d = 0; d + 1 < type.getRank(); ++d)
    if (d != avoid && !type.isDynamicDim(d) && type.getDimSize(d) >= chunks && type.getDimSize(d) % chunks == 0)
      return d;
  return std::nullopt;
}

RankedTensorType chunkOf(Type type, int64_t dim, int64_t chunks) {
  auto ranked = cast<RankedTensorType>(type);
  SmallVector<int64_t> shape(ranked.getShape());
  shape[dim] /= chunks;
  return RankedTensorType::get(shape, ranked.getElementType(), ranked.getEncoding());
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

  /// The gather in chunks, each chunk's GEMMs issued after the next
  /// chunk's gather: gather 0, gather 1, chunk 0's GEMMs, gather 2, chunk
  /// 1's GEMMs, ... (a gather travels while the chunk before it
  /// multiplies); each GEMM's chunks joined where the gather stood.
  void splitGather(AllGatherOp gather, ArrayRef<LinearOp> users) {
    auto xType = cast<RankedTensorType>(gather.getX().getType());
    std::optional<int64_t> dim = chunkDim(xType, gather.getDim(), chunks);
    if (!dim)
      return;
    OpBuilder b(gather);
    Location loc = gather.getLoc();
    int64_t rows = xType.getDimSize(*dim) / chunks;
    SmallVector<Value> gathered;
    SmallVector<SmallVector<Value>> products(users.size());
    auto multiply = [&](Value piece) {
      for (auto [k, user] : llvm::enumerate(users)) {
        LinearOp linear = user;
        Operation *gemm = b.clone(*linear);
        gemm->setOperand(0, piece);
        gemm->getResult(0).setType(chunkOf(linear.getType(), *dim, chunks));
        products[k].push_back(gemm->getResult(0));
      }
    };
    for (int64_t i = 0; i < chunks; ++i) {
      Value x = SliceOp::create(b, loc, chunkOf(xType, *dim, chunks), gather.getX(), *dim, i * rows);
      Operation *sent = b.clone(*gather);
      sent->setOperand(0, x);
      sent->getResult(0).setType(chunkOf(gather.getType(), *dim, chunks));
      gathered.push_back(sent->getResult(0));
      if (i > 0)
        multiply(gathered[i - 1]);
    }
    multiply(gathered.back());
    for (auto [k, user] : llvm::enumerate(users)) {
      LinearOp linear = user;
      Value joined = ConcatOp::create(b, linear.getLoc(), linear.getType(), products[k], *dim);
      linear.getResult().replaceAllUsesWith(joined);
      linear.erase();
    }
    gather.erase();
  }

  void runOnOperation() override {
    if (chunks < 2) {
      getOperation().emitError() << "parax-tp-overlap: chunks must be at least 2 (got " << static_cast<int64_t>(chunks) << ")";
      return signalPassFailure();
    }
    // A gather whose every use is a GEMM's input (the sequence-parallel
    // all-gather before the column-parallel projections).
    SmallVector<std::pair<AllGatherOp, SmallVector<LinearOp>>> gathers;
    getOperation().walk([&](AllGatherOp gather) {
      SmallVector<LinearOp> users;
      for (OpOperand &use : gather.getResult().getUses()) {
        auto linear = dyn_cast<LinearOp>(use.getOwner());
        if (!linear || use.getOperandNumber() != 0 || !everyOtherOperandBefore(linear, gather))
          return;
        users.push_back(linear);
      }
      llvm::sort(users, [](LinearOp a, LinearOp b) { return a->isBeforeInBlock(b); });
      if (!users.empty())
        gathers.push_back({gather, users});
    });
    for (auto &[gather, users] : gathers)
      splitGather(gather, users);
    // (after the gathers: a GEMM between a gather and another collective,
    // an output head's, is split on the gather's side)
    SmallVector<std::pair<LinearOp, Operation *>> found;
    getOperation().walk([&](LinearOp linear) {
      Value result = linear.getResult();
      if (!result.hasOneUse())
        return;
      Operation *user = *result.getUsers().begin();
      if (isa<AllReduceOp, ReduceScatterOp, AllGatherOp>(user))
        found.push_back({linear, user});
    });
    for (auto [linear, collective] : found) {
      auto xType = cast<RankedTensorType>(linear.getX().getType());
      std::optional<int64_t> dim = chunkDim(xType, collectiveDim(collective), chunks);
      if (!dim)
        continue;
      OpBuilder b(collective);
      Location loc = linear.getLoc();
      int64_t rows = xType.getDimSize(*dim) / chunks;
      SmallVector<Value> pieces;
      for (int64_t i = 0; i < chunks; ++i) {
        Value x = SliceOp::create(b, loc, chunkOf(xType, *dim, chunks), linear.getX(), *dim, i * rows);
        Operation *gemm = b.clone(*linear);
        gemm->setOperand(0, x);
        gemm->getResult(0).setType(chunkOf(linear.getType(), *dim, chunks));
        Operation *sent = b.clone(*collective);
        sent->setOperand(0, gemm->getResult(0));
        sent->getResult(0).setType(chunkOf(collective->getResult(0).getType(), *dim, chunks));
        pieces.push_back(sent->getResult(0));
      }
      Value joined = ConcatOp::create(b, loc, collective->getResult(0).getType(), pieces, *dim);
      collective->getResult(0).replaceAllUsesWith(joined);
      collective->erase();
      linear.erase();
    }
  }
};

} // namespace
