//===- OpRules.cpp - how each op runs on local pieces ---------------------===//

#include "parax/Partition/OpRules.h"

#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace parax;
using namespace parax::partition;

using Axes = SmallVector<std::string, 2>;

static int64_t rankOf(Value v) {
  return cast<RankedTensorType>(v.getType()).getRank();
}
static ArrayRef<int64_t> shapeOf(Value v) {
  return cast<RankedTensorType>(v.getType()).getShape();
}

static InFlightDiagnostic unsupported(Operation *op, const Layout &layout) {
  return op->emitError() << "cannot partition this op with result layout "
                         << layout.str() << ": ";
}

// The same layout, with dims of size 1 in `value` replicated (broadcast);
// a scalar (a run-time position) is replicated.
static Layout forOperand(const Layout &layout, Value value) {
  if (rankOf(value) == 0)
    return Layout::replicated(0);
  Layout out = layout;
  ArrayRef<int64_t> shape = shapeOf(value);
  for (size_t d = 0; d < out.dims.size() && d < shape.size(); ++d)
    if (shape[d] == 1)
      out.dims[d].clear();
  return out;
}

// Maps a layout of `from`'s shape onto `to`'s shape through a reshape: a
// split dimension maps to the dimension of `to` starting at the same element
// offset; fails when none does.
static FailureOr<Layout> mapThroughReshape(const Layout &layout,
                                           ArrayRef<int64_t> from,
                                           ArrayRef<int64_t> to,
                                           const GridInfo &grid) {
  Layout out = Layout::replicated(to.size());
  out.partial = layout.partial;
  for (size_t d = 0; d < from.size(); ++d) {
    if (layout.dims[d].empty())
      continue;
    int64_t prefix = 1;
    for (size_t i = 0; i < d; ++i)
      prefix *= from[i];
    int64_t prefixTo = 1;
    bool found = false;
    for (size_t e = 0; e < to.size(); prefixTo *= to[e], ++e)
      if (prefixTo == prefix && to[e] % grid.product(layout.dims[d]) == 0) {
        out.dims[e] = layout.dims[d];
        found = true;
        break;
      }
    if (!found)
      return failure();
  }
  return out;
}

FailureOr<SmallVector<Layout>>
parax::partition::operandLayouts(Operation *op, ArrayRef<Layout> results,
                                 const GridInfo &grid) {
  const Layout &out = results.empty() ? Layout() : results.front();
  auto same = [&]() -> FailureOr<SmallVector<Layout>> {
    SmallVector<Layout> layouts;
    for (Value operand : op->getOperands())
      layouts.push_back(forOperand(out, operand));
    return layouts;
  };
  auto noPartial = [&]() -> LogicalResult {
    if (!out.partial.empty())
      return unsupported(op, out) << "it is not linear, its result cannot be "
                                     "a partial sum";
    return success();
  };
  auto wholeDim = [&](int64_t dim, StringRef why) -> LogicalResult {
    if (dim >= 0 && dim < static_cast<int64_t>(out.dims.size()) &&
        !out.dims[dim].empty())
      return unsupported(op, out) << why;
    return success();
  };

  return llvm::TypeSwitch<Operation *, FailureOr<SmallVector<Layout>>>(op)
      .Case<LinearOp>([&](LinearOp linear) -> FailureOr<SmallVector<Layout>> {
        int64_t r = rankOf(linear.getResult());
        Layout x = out;
        x.partial.clear();
        x.dims[r - 1] = out.partial; // row-parallel: the input is split
        Layout w = Layout::replicated(2);
        int64_t inDim = linear.getTransposeW() ? 1 : 0;
        w.dims[inDim] = out.partial;
        w.dims[1 - inDim] = out.dims[r - 1]; // column-parallel: output split
        SmallVector<Layout> layouts = {x, w};
        if (linear.getBias()) {
          Layout bias = Layout::replicated(1);
          bias.dims[0] = out.dims[r - 1];
          bias.partial = out.partial; // added once: on one rank of the sum
          layouts.push_back(bias);
        }
        return layouts;
      })
      .Case<EmbeddingOp>([&](EmbeddingOp embedding) -> FailureOr<SmallVector<Layout>> {
        int64_t r = rankOf(embedding.getResult());
        Layout ids = Layout::replicated(r - 1);
        for (int64_t d = 0; d < r - 1; ++d)
          ids.dims[d] = out.dims[d];
        Layout table = Layout::replicated(2);
        table.dims[0] = out.partial;    // vocab-parallel: rows split
        table.dims[1] = out.dims[r - 1]; // hidden split
        return SmallVector<Layout>{ids, table};
      })
      .Case<PositionEmbeddingOp>([&](PositionEmbeddingOp embedding) -> FailureOr<SmallVector<Layout>> {
        // Positions split over ranks (context parallelism): each rank its
        // rows of the table (seq_axes, localizeAttributes).
        if (failed(noPartial()) ||
            (embedding.getPosition() &&
             failed(wholeDim(1, "positions at a run-time position cannot be "
                                "split over ranks"))))
          return failure();
        Layout table = Layout::replicated(2);
        table.dims[1] = out.dims[2];
        SmallVector<Layout> layouts = {table};
        if (op->getNumOperands() == 2)
          layouts.push_back(Layout::replicated(0)); // the position
        return layouts;
      })
      .Case<RmsNormOp, LayerNormOp>([&](Operation *) -> FailureOr<SmallVector<Layout>> {
        if (failed(noPartial()) ||
            failed(wholeDim(out.dims.size() - 1,
                            "a norm needs its whole last dimension")))
          return failure();
        SmallVector<Layout> layouts = {out};
        for (unsigned i = 1; i < op->getNumOperands(); ++i)
          layouts.push_back(Layout::replicated(1));
        return layouts;
      })
      .Case<RopeOp>([&](RopeOp rope) -> FailureOr<SmallVector<Layout>> {
        if (failed(wholeDim(3, "rotary pairs need the whole head dimension")) ||
            (rope.getPosition() &&
             failed(wholeDim(1, "positions at a run-time position cannot be "
                                "split over ranks"))))
          return failure();
        return same();
      })
      .Case<SiluOp, SigmoidOp, GeluOp, SwigluOp>([&](Operation *) -> FailureOr<SmallVector<Layout>> {
        if (failed(noPartial()))
          return failure();
        return same();
      })
      .Case<AddOp>([&](auto) { return same(); })
      .Case<MulOp>([&](auto) -> FailureOr<SmallVector<Layout>> {
        if (failed(noPartial()))
          return failure();
        return same();
      })
      .Case<ReshapeOp>([&](ReshapeOp reshape) -> FailureOr<SmallVector<Layout>> {
        FailureOr<Layout> in = mapThroughReshape(
            out, shapeOf(reshape.getResult()), shapeOf(reshape.getX()), grid);
        if (failed(in))
          return unsupported(op, out) << "no dimension of the operand carries "
                                         "the split";
        return SmallVector<Layout>{*in};
      })
      .Case<TransposeOp>([&](TransposeOp transpose) -> FailureOr<SmallVector<Layout>> {
        Layout in = out;
        for (auto [e, d] : llvm::enumerate(transpose.getPermutation()))
          in.dims[d] = out.dims[e];
        return SmallVector<Layout>{in};
      })
      .Case<SliceOp>([&](SliceOp slice) -> FailureOr<SmallVector<Layout>> {
        if (failed(wholeDim(slice.getDim(), "the sliced dimension must be whole")))
          return failure();
        return same();
      })
      .Case<ConcatOp>([&](ConcatOp concat) -> FailureOr<SmallVector<Layout>> {
        if (failed(wholeDim(concat.getDim(),
                            "the concatenated dimension must be whole")))
          return failure();
        return same();
      })
      .Case<BroadcastOp>([&](auto) { return same(); })
      .Case<AttentionOp>([&](AttentionOp attention) -> FailureOr<SmallVector<Layout>> {
        if (failed(noPartial()) ||
            (attention.getPosition() &&
             failed(wholeDim(1, "attention over a KV cache at a run-time "
                                "position cannot split its queries over ranks"))) ||
            failed(wholeDim(3, "attention needs whole heads")))
          return failure();
        int64_t parts = grid.product(out.dims[2]);
        int64_t kvHeads = attention.getNumKvHeads();
        // Queries split on the sequence (context parallelism): every rank
        // keeps its queries and sees every key and value (gathered).
        Layout kv = out;
        kv.dims[1].clear();
        // Fewer KV heads than ranks: every rank keeps all KV heads (Megatron
        // replicates them), its query heads pick theirs.
        if (kvHeads % parts != 0) {
          if (parts % kvHeads)
            return unsupported(op, out)
                   << kvHeads << " KV heads neither split over nor evenly serve "
                   << parts << " ranks";
          kv.dims[2].clear();
        }
        SmallVector<Layout> layouts = {out, kv, kv};
        if (attention.getPosition())
          layouts.push_back(Layout::replicated(0));
        return layouts;
      })
      .Case<CacheUpdateOp>([&](auto) -> FailureOr<SmallVector<Layout>> {
        if (failed(noPartial()) ||
            failed(wholeDim(1, "a KV cache written at a run-time position "
                               "needs its whole sequence")))
          return failure();
        return same();
      })
      .Case<RouterOp>([&](RouterOp router) -> FailureOr<SmallVector<Layout>> {
        if (failed(noPartial()) ||
            failed(wholeDim(out.dims.size() - 1, "top-k needs every expert")))
          return failure();
        SmallVector<Layout> layouts = {out, Layout::replicated(2)};
        if (router.getBias())
          layouts.push_back(Layout::replicated(1));
        return layouts;
      })
      .Case<ExpertsOp>([&](ExpertsOp) -> FailureOr<SmallVector<Layout>> {
        if (failed(wholeDim(out.dims.size() - 1,
                            "experts need the whole hidden dimension")))
          return failure();
        Layout x = out;
        x.partial.clear();
        Layout gateUp = Layout::replicated(3), down = Layout::replicated(3);
        gateUp.dims[1] = out.partial; // every expert's FFN split
        down.dims[2] = out.partial;
        return SmallVector<Layout>{x, x, x, gateUp, gateUp, down};
      })
      .Case<CrossEntropyOp>([&](CrossEntropyOp ce) -> FailureOr<SmallVector<Layout>> {
        if (failed(noPartial()))
          return failure();
        return SmallVector<Layout>{Layout::replicated(rankOf(ce.getLogits())),
                                   Layout::replicated(rankOf(ce.getLabels()))};
      })
      .Default([&](Operation *) -> FailureOr<SmallVector<Layout>> {
        return op->emitError("the partitioner has no rule for this op");
      });
}

SmallVector<Layout> parax::partition::propagateLayouts(Operation *op,
                                                       ArrayRef<Layout> operands,
                                                       const GridInfo &grid) {
  SmallVector<Layout> results;
  auto replicated = [&]() {
    for (Value result : op->getResults())
      results.push_back(Layout::replicated(rankOf(result)));
    return results;
  };
  if (operands.empty() || op->getNumResults() != 1)
    return replicated();
  const Layout &in = operands.front();
  Value result = op->getResult(0);
  if (isa<SiluOp, SigmoidOp, GeluOp, SwigluOp, AddOp, MulOp, RopeOp, RmsNormOp,
          LayerNormOp, BroadcastOp, CacheUpdateOp>(op) &&
      rankOf(op->getOperand(0)) == rankOf(result)) {
    Layout out = in;
    if (isa<RmsNormOp, LayerNormOp>(op))
      out.dims.back().clear();
    if (isa<RopeOp>(op))
      out.dims[3].clear();
    if (!isa<AddOp>(op))
      out.partial.clear();
    results.push_back(out);
    return results;
  }
  if (auto reshape = dyn_cast<ReshapeOp>(op); reshape && in.partial.empty()) {
    FailureOr<Layout> out = mapThroughReshape(in, shapeOf(reshape.getX()),
                                              shapeOf(result), grid);
    if (succeeded(out)) {
      results.push_back(*out);
      return results;
    }
    return replicated();
  }
  if (isa<AttentionOp>(op) && in.partial.empty()) {
    Layout out = in; // the queries' batch, sequence and heads
    out.dims[3].clear();
    results.push_back(out);
    return results;
  }
  if (auto linear = dyn_cast<LinearOp>(op); linear && operands.size() >= 2) {
    // Column-parallel when W's out features are split; row-parallel (a
    // partial sum) when x and W agree on a split of the in features.
    const Layout &w = operands[1];
    int64_t inDim = linear.getTransposeW() ? 1 : 0;
    Layout out = in;
    out.partial.clear();
    out.dims.back() = w.dims[1 - inDim];
    if (!w.dims[inDim].empty() && in.dims.back() == w.dims[inDim])
      out.partial = w.dims[inDim];
    results.push_back(out);
    return results;
  }
  return replicated();
}

void parax::partition::localizeAttributes(Operation *local,
                                          ArrayRef<Layout> results,
                                          const GridInfo &grid) {
  Builder b(local->getContext());
  // A sequence split over ranks (context parallelism): the op's rows are
  // the rank's piece, which it needs to know to place them.
  if (isa<AttentionOp, RopeOp, PositionEmbeddingOp>(local) &&
      !results.front().dims[1].empty()) {
    SmallVector<StringRef> axes(results.front().dims[1].begin(),
                                results.front().dims[1].end());
    local->setAttr("seq_grid", grid.ref);
    local->setAttr("seq_axes", b.getStrArrayAttr(axes));
    if (grid.cyclic.contains(axes.front()))
      local->setAttr("seq_cyclic", b.getUnitAttr());
  }
  if (auto attention = dyn_cast<AttentionOp>(local)) {
    const auto &headAxes = results.front().dims[2];
    int64_t parts = grid.product(headAxes);
    attention.setNumHeadsAttr(b.getI64IntegerAttr(attention.getNumHeads() / parts));
    if (attention.getNumKvHeads() % parts == 0) {
      attention.setNumKvHeadsAttr(
          b.getI64IntegerAttr(attention.getNumKvHeads() / parts));
    } else {
      SmallVector<StringRef> axes(headAxes.begin(), headAxes.end());
      attention.setHeadGridAttr(grid.ref);
      attention.setHeadAxesAttr(b.getStrArrayAttr(axes));
    }
  } else if (auto embedding = dyn_cast<EmbeddingOp>(local)) {
    if (!results.front().partial.empty()) {
      SmallVector<StringRef> axes(results.front().partial.begin(),
                                  results.front().partial.end());
      embedding.setVocabGridAttr(grid.ref);
      embedding.setVocabAxesAttr(b.getStrArrayAttr(axes));
    }
  }
}
