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

// The same layout, with dims of size 1 in `value` replicated (broadcast).
static Layout forOperand(const Layout &layout, Value value) {
  if (rankOf(value) == 0) {
    // A float scalar (a loss term) carries the pending sum too; a run-time
    // position is whole.
    Layout scalar = Layout::replicated(0);
    if (isa<FloatType>(cast<RankedTensorType>(value.getType()).getElementType()))
      scalar.partial = layout.partial;
    return scalar;
  }
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

// The layouts of attention's q, k and v for a result (or its gradient) in
// `out`: heads split alike, unless fewer KV heads than ranks (every rank
// keeps them all, Megatron's replication); queries split on the sequence
// (context parallelism) see every key and value.
static FailureOr<SmallVector<Layout>> attentionOperands(Operation *op,
                                                        const Layout &out,
                                                        int64_t kvHeads,
                                                        const GridInfo &grid) {
  int64_t parts = grid.product(out.dims[2]);
  Layout kv = out;
  kv.dims[1].clear();
  if (kvHeads % parts != 0) {
    if (parts % kvHeads)
      return unsupported(op, out)
             << kvHeads << " KV heads neither split over nor evenly serve "
             << parts << " ranks";
    kv.dims[2].clear();
  }
  return SmallVector<Layout>{out, kv, kv};
}

// The gradient of a KV operand read in `kv` by queries in `q`: a partial sum
// over every axis that splits the queries (their sequence or heads) but not
// the keys.
static Layout keyGradient(const Layout &q, const Layout &kv) {
  Layout grad = kv;
  for (int64_t d : {1, 2})
    for (const std::string &axis : q.dims[d])
      if (!llvm::is_contained(kv.dims[1], axis) &&
          !llvm::is_contained(kv.dims[2], axis))
        grad.partial.push_back(axis);
  return grad;
}

// For a gradient summed over tokens (a weight's): the leading (token)
// dimensions of an operand of `rank`, split over the result's partial
// `axes` where `current` already splits them, else on dimension 0.
static Layout tokensSplit(ArrayRef<std::string> axes, int64_t rank,
                          const Layout *current) {
  Layout tokens = Layout::replicated(rank);
  if (axes.empty())
    return tokens;
  if (current && static_cast<int64_t>(current->dims.size()) == rank) {
    SmallVector<std::string> seen;
    for (int64_t d = 0; d + 1 < rank; ++d)
      for (const std::string &axis : current->dims[d])
        if (llvm::is_contained(axes, axis)) {
          tokens.dims[d].push_back(axis);
          seen.push_back(axis);
        }
    if (seen.size() == axes.size())
      return tokens;
    tokens = Layout::replicated(rank);
  }
  tokens.dims[0].assign(axes.begin(), axes.end());
  return tokens;
}

bool parax::partition::slicesTo(const Layout &have, const Layout &want) {
  if (!have.partial.empty() || !want.partial.empty() || have.dims.size() != want.dims.size())
    return false;
  for (auto [h, w] : llvm::zip(have.dims, want.dims))
    if (h.size() > w.size() || !std::equal(h.begin(), h.end(), w.begin()))
      return false;
  return true;
}

bool parax::partition::reduceScattersTo(const Layout &have, const Layout &want) {
  if (have == want || have.dims.size() != want.dims.size())
    return false;
  SmallVector<std::string> scattered;
  for (auto [h, w] : llvm::zip(have.dims, want.dims)) {
    if (h.size() > w.size() || !std::equal(h.begin(), h.end(), w.begin()))
      return false;
    scattered.append(w.begin() + h.size(), w.end());
  }
  auto in = [](ArrayRef<std::string> axes) {
    return [axes](const std::string &axis) { return llvm::is_contained(axes, axis); };
  };
  return llvm::all_of(scattered, in(have.partial)) && llvm::all_of(want.partial, in(have.partial)) &&
         llvm::none_of(scattered, in(want.partial)) &&
         scattered.size() + want.partial.size() == have.partial.size();
}

// The layout of labels for logits in `logits`: their tokens split alike
// (the vocabulary is gathered whole for the loss), if the labels in `have`
// are that or become it by a slice; else `have`.
static Layout labelsFor(const Layout &logits, const Layout &have) {
  if (logits.dims.size() != have.dims.size() + 1)
    return have;
  Layout tokens = logits;
  tokens.partial.clear();
  tokens.dims.pop_back();
  return slicesTo(have, tokens) ? tokens : have;
}

// The layout of logits whose tokens are split as `labels` are (the
// vocabulary whole).
static Layout logitsOf(const Layout &labels) {
  Layout logits = labels;
  logits.partial.clear();
  logits.dims.push_back({});
  return logits;
}

// The axes splitting the leading (token) dimensions of `layout`, outer
// dimension first, except those in `taken`.
static Layout::Axes tokenAxes(const Layout &layout, ArrayRef<std::string> taken) {
  Layout::Axes axes;
  for (size_t d = 0; d + 1 < layout.dims.size(); ++d)
    for (const std::string &axis : layout.dims[d])
      if (!llvm::is_contained(taken, axis))
        axes.push_back(axis);
  return axes;
}

// The axes splitting labels in `layout` (every dimension a token's),
// outer dimension first.
static Layout::Axes labelAxes(const Layout &layout) {
  Layout::Axes axes;
  for (const Layout::Axes &dim : layout.dims)
    axes.append(dim.begin(), dim.end());
  return axes;
}

FailureOr<SmallVector<Layout>>
parax::partition::operandLayouts(Operation *op, ArrayRef<Layout> results,
                                 const GridInfo &grid, ArrayRef<Layout> current) {
  auto currentOf = [&](unsigned i) -> const Layout * {
    return i < current.size() ? &current[i] : nullptr;
  };
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
      .Case<HeadLinearOp>([&](HeadLinearOp linear) -> FailureOr<SmallVector<Layout>> {
        // A linear per head: the heads split with their weights, then as
        // a linear (output features split, or input features with a
        // partial-sum result).
        int64_t r = rankOf(linear.getResult());
        Layout x = out;
        x.partial.clear();
        x.dims[r - 1] = out.partial;
        Layout w = Layout::replicated(3);
        int64_t inDim = linear.getTransposeW() ? 2 : 1;
        w.dims[0] = out.dims[r - 2];
        w.dims[inDim] = out.partial;
        w.dims[3 - inDim] = out.dims[r - 1];
        return SmallVector<Layout>{x, w};
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
      .Case<SiluOp, SigmoidOp, GeluOp, SoftcapOp, SwigluOp>([&](Operation *) -> FailureOr<SmallVector<Layout>> {
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
        FailureOr<SmallVector<Layout>> layouts =
            attentionOperands(op, out, attention.getNumKvHeads(), grid);
        if (succeeded(layouts) && attention.getPosition())
          layouts->push_back(Layout::replicated(0));
        return layouts;
      })
      .Case<AttentionGradOp>([&](AttentionGradOp grad) -> FailureOr<SmallVector<Layout>> {
        if (failed(noPartial()) ||
            failed(wholeDim(3, "attention needs whole heads")))
          return failure();
        FailureOr<SmallVector<Layout>> layouts =
            attentionOperands(op, out, grad.getNumKvHeads(), grid);
        if (failed(layouts))
          return failure();
        for (unsigned i : {1, 2})
          if (results[i] != keyGradient(out, (*layouts)[i]))
            return unsupported(op, results[i])
                   << "the gradient of "
                   << (i == 1 ? "the keys" : "the values") << " must be "
                   << keyGradient(out, (*layouts)[i]).str()
                   << " for queries in " << out.str();
        layouts->push_back(out); // the gradient of the output
        return layouts;
      })
      .Case<CrossEntropyGradOp>([&](CrossEntropyGradOp ce) -> FailureOr<SmallVector<Layout>> {
        // Each rank its tokens' rows (num_tokens: the whole mean's count),
        // split as the labels are (integers are never resharded); its
        // vocabulary's columns where the logits split it (vocab-parallel:
        // the partitioner gives the local op every token's logsumexp).
        if (failed(noPartial()))
          return failure();
        Layout labels = out;
        labels.dims.pop_back();
        if (const Layout *have = currentOf(1); have && !slicesTo(*have, labels))
          return unsupported(op, out) << "its tokens must be split as its labels "
                                      << have->str() << " are";
        SmallVector<Layout> layouts = {out, labels};
        if (ce.getCount()) // every rank's count, whole
          layouts.push_back(Layout::replicated(0));
        return layouts;
      })
      .Case<LinearWeightGradOp>([&](LinearWeightGradOp grad) -> FailureOr<SmallVector<Layout>> {
        int64_t r = rankOf(grad.getX());
        int64_t inDim = grad.getTransposeW() ? 1 : 0;
        Layout x = tokensSplit(out.partial, r, currentOf(1));
        Layout dy = x;
        x.dims[r - 1] = out.dims[inDim];
        dy.dims[r - 1] = out.dims[1 - inDim];
        return SmallVector<Layout>{x, dy};
      })
      .Case<SumToOp>([&](SumToOp sum) -> FailureOr<SmallVector<Layout>> {
        // The summed dimensions' split becomes the partial sum: each axis
        // where the operand already splits a summed dimension (or holds a
        // partial sum), else on the first summed dimension.
        ArrayRef<int64_t> from = shapeOf(sum.getX()), to = shapeOf(sum.getResult());
        Layout x = Layout::replicated(from.size());
        SmallVector<int64_t> summed;
        for (size_t d = 0; d < from.size(); ++d) {
          if (to[d] == 1 && from[d] != 1)
            summed.push_back(d);
          else
            x.dims[d] = out.dims[d];
        }
        const Layout *have = currentOf(0);
        for (const std::string &axis : out.partial) {
          bool placed = false;
          for (int64_t d : summed)
            if (have && llvm::is_contained(have->dims[d], axis)) {
              x.dims[d].push_back(axis);
              placed = true;
            }
          if (!placed && have && llvm::is_contained(have->partial, axis)) {
            x.partial.push_back(axis);
            placed = true;
          }
          if (!placed) {
            if (summed.empty())
              return unsupported(op, out) << "nothing is summed over '" << axis << "'";
            x.dims[summed.front()].push_back(axis);
          }
        }
        return SmallVector<Layout>{x};
      })
      .Case<GeluGradOp, SigmoidGradOp, SoftcapGradOp>([&](Operation *) -> FailureOr<SmallVector<Layout>> {
        if (failed(noPartial()))
          return failure();
        return same();
      })
      .Case<PositionEmbeddingGradOp>([&](Operation *) -> FailureOr<SmallVector<Layout>> {
        // A rank's positions (split over the partial's axes) write their rows.
        if (failed(wholeDim(0, "the table's rows are written by position")))
          return failure();
        Layout dy = Layout::replicated(3);
        dy.dims[1].assign(out.partial.begin(), out.partial.end());
        dy.dims[2] = out.dims[1];
        return SmallVector<Layout>{dy};
      })
      .Case<RmsNormGradOp, LayerNormGradOp>([&](Operation *) -> FailureOr<SmallVector<Layout>> {
        if (failed(noPartial()) ||
            failed(wholeDim(out.dims.size() - 1,
                            "a norm needs its whole last dimension")))
          return failure();
        return SmallVector<Layout>{out, Layout::replicated(1), out};
      })
      .Case<RmsNormWeightGradOp, LayerNormWeightGradOp>([&](Operation *) -> FailureOr<SmallVector<Layout>> {
        if (failed(wholeDim(0, "a norm needs its whole last dimension")))
          return failure();
        Layout x = tokensSplit(out.partial, rankOf(op->getOperand(0)), currentOf(0));
        return SmallVector<Layout>{x, x};
      })
      .Case<SwigluGradOp>([&](Operation *) -> FailureOr<SmallVector<Layout>> {
        if (failed(noPartial()))
          return failure();
        return same();
      })
      .Case<EmbeddingGradOp>([&](EmbeddingGradOp grad) -> FailureOr<SmallVector<Layout>> {
        // The token ids keep their split (integers are never gathered,
        // moved or summed), or are sliced to dy's tokens over the partial
        // sum's axes where that is how dy arrives (context parallelism: each
        // rank its positions' rows, not dy gathered): dy follows them.
        int64_t r = rankOf(grad.getDy());
        Layout ids = Layout::replicated(r - 1);
        if (const Layout *have = currentOf(0)) {
          ids = *have;
          ids.partial.clear();
        }
        if (const Layout *dyHave = currentOf(1);
            dyHave && static_cast<int64_t>(dyHave->dims.size()) == r &&
            labelAxes(ids) != Layout::Axes(out.partial.begin(), out.partial.end())) {
          Layout sliced = Layout::replicated(r - 1);
          for (int64_t d = 0; d < r - 1; ++d)
            for (const std::string &axis : dyHave->dims[d])
              if (llvm::is_contained(out.partial, axis))
                sliced.dims[d].push_back(axis);
          if (slicesTo(ids, sliced))
            ids = sliced;
        }
        Layout dy = Layout::replicated(r);
        for (int64_t d = 0; d < r - 1; ++d)
          dy.dims[d] = ids.dims[d];
        dy.dims[r - 1] = out.dims[1];
        if (tokenAxes(dy, out.dims[1]) != Layout::Axes(out.partial.begin(), out.partial.end()))
          return unsupported(op, out) << "its partial sum must be over the axes "
                                         "that split the token ids";
        return SmallVector<Layout>{ids, dy};
      })
      .Case<CacheUpdateOp, RingCacheUpdateOp>([&](auto) -> FailureOr<SmallVector<Layout>> {
        if (failed(noPartial()) ||
            failed(wholeDim(1, "a KV cache written at a run-time position "
                               "needs its whole sequence")))
          return failure();
        return same();
      })
      .Case<RouterOp, RouterGradOp, RouterAuxGradOp>([&](Operation *) -> FailureOr<SmallVector<Layout>> {
        if (failed(noPartial()) ||
            failed(wholeDim(out.dims.size() - 1, "top-k needs every expert")))
          return failure();
        // x, the gate, (the gradient's dweights: x's tokens; the load: every
        // token's, whole), (the bias).
        SmallVector<Layout> layouts = {out, Layout::replicated(2)};
        if (isa<RouterGradOp>(op))
          layouts.push_back(out);
        if (auto aux = dyn_cast<RouterAuxGradOp>(op)) {
          // Per sequence: the rank's sequences' loads, each whole.
          Layout load = Layout::replicated(rankOf(aux.getLoad()));
          if (rankOf(aux.getLoad()) == 2)
            load.dims[0] = out.dims[0];
          layouts.push_back(load);
        }
        if (layouts.size() < op->getNumOperands())
          layouts.push_back(Layout::replicated(1));
        return layouts;
      })
      .Case<RouterLoadOp>([&](RouterLoadOp load) -> FailureOr<SmallVector<Layout>> {
        // Summed over the tokens: a partial sum over the axes splitting them.
        int64_t experts = rankOf(load.getResult()) - 1;
        if (failed(wholeDim(experts, "the load counts every expert")))
          return failure();
        Layout x = tokensSplit(out.partial, rankOf(load.getX()), currentOf(0));
        if (experts == 1) { // per sequence: the rank's sequences, split over the partial sum's axes
          x = Layout::replicated(3);
          x.dims[0] = out.dims[0];
          x.dims[1].assign(out.partial.begin(), out.partial.end());
        }
        SmallVector<Layout> layouts = {x, Layout::replicated(2)};
        if (load.getBias())
          layouts.push_back(Layout::replicated(1));
        return layouts;
      })
      .Case<ExpertsOp, ExpertsGradOp>([&](Operation *) -> FailureOr<SmallVector<Layout>> {
        // Each expert's FFN split over the partial sum's axes (a gradient's
        // by x and by the router's weights are partial sums over them too);
        // the stacks split on experts by the partitioner; dy as x.
        if (failed(wholeDim(out.dims.size() - 1,
                            "experts need the whole hidden dimension")))
          return failure();
        Layout x = out;
        x.partial.clear();
        Layout gateUp = Layout::replicated(3), down = Layout::replicated(3);
        gateUp.dims[1] = out.partial;
        down.dims[2] = out.partial;
        SmallVector<Layout> layouts = {x, x, x, gateUp, gateUp, down};
        if (isa<ExpertsGradOp>(op))
          layouts.push_back(x);
        return layouts;
      })
      .Case<BalanceLossOp>([&](BalanceLossOp loss) -> FailureOr<SmallVector<Layout>> {
        // Every row's load and scores (partial sums all-reduced), a whole
        // scalar; per sequence, the sequences split over the partial sum's
        // axes (each rank's sum of its sequences' losses).
        if (rankOf(loss.getLoad()) == 2) {
          Layout rows = Layout::replicated(2);
          rows.dims[0].assign(out.partial.begin(), out.partial.end());
          return SmallVector<Layout>{rows, rows};
        }
        if (failed(noPartial()))
          return failure();
        return SmallVector<Layout>{Layout::replicated(1), Layout::replicated(1)};
      })
      .Case<CrossEntropyOp>([&](CrossEntropyOp ce) -> FailureOr<SmallVector<Layout>> {
        // The tokens split as the labels are, or as the logits are where
        // the labels become that by a slice (integers are never gathered,
        // moved or summed); labels not yet placed (a program input, then
        // loaded so) over the axes of the partial sum, on dimension 0.
        // Vocab-parallel: the partial sum's axes that split the logits'
        // vocabulary (as they arrive) split it for the loss too, each rank
        // adding the terms of the labels it holds.
        Layout::Axes vocab, tokens;
        const Layout *logitsHave = currentOf(0);
        for (const std::string &axis : out.partial) {
          bool splitsVocab = logitsHave && !logitsHave->dims.empty() &&
                             llvm::is_contained(logitsHave->dims.back(), axis);
          (splitsVocab ? vocab : tokens).push_back(axis);
        }
        Layout labels = tokensSplit(tokens, rankOf(ce.getLabels()), nullptr);
        if (const Layout *have = currentOf(1)) {
          labels = *have;
          if (logitsHave && tokenAxes(logitsOf(labels), {}) != tokens)
            labels = labelsFor(*logitsHave, *have);
        }
        Layout logits = logitsOf(labels);
        if (tokenAxes(logits, {}) != tokens || !labels.partial.empty())
          return unsupported(op, out) << "its partial sum must be over the axes "
                                         "that split its labels, "
                                      << labels.str() << (vocab.empty() ? "" : ", and its vocabulary");
        logits.dims.back() = vocab;
        SmallVector<Layout> layouts = {logits, labels};
        if (ce.getCount()) // every rank's count, whole
          layouts.push_back(Layout::replicated(0));
        return layouts;
      })
      .Case<LabelCountOp>([&](LabelCountOp count) -> FailureOr<SmallVector<Layout>> {
        // Each rank counts the labels it holds: a partial sum over the axes
        // splitting them; a whole count of whole labels (the planner's: the
        // labels then load whole, the loss slicing its own). Integers are
        // never resharded: the labels as they are.
        Layout labels = Layout::replicated(rankOf(count.getLabels()));
        if (const Layout *have = currentOf(0))
          labels = *have;
        if (labelAxes(labels) != Layout::Axes(out.partial.begin(), out.partial.end()))
          return unsupported(op, out) << "its partial sum must be over the axes "
                                         "that split its labels, "
                                      << labels.str();
        return SmallVector<Layout>{labels};
      })
      .Case<ShiftOp>([&](ShiftOp) -> FailureOr<SmallVector<Layout>> {
        // Each row moved within itself: rows split as they are, the
        // sequence whole (a split one would need its neighbour's first
        // tokens).
        if (failed(noPartial()) ||
            failed(wholeDim(1, "a shift needs its whole sequence (no context "
                               "parallelism with multi-token prediction)")))
          return failure();
        return SmallVector<Layout>{out};
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
  if (auto grad = dyn_cast<AttentionGradOp>(op); grad && operands.size() == 4) {
    // The queries' batch, sequence and heads, as attention's.
    Layout dq = operands[0];
    dq.partial.clear();
    dq.dims[3].clear();
    FailureOr<SmallVector<Layout>> wanted;
    {
      ScopedDiagnosticHandler quiet(op->getContext(),
                                    [](Diagnostic &) { return success(); });
      wanted = attentionOperands(op, dq, grad.getNumKvHeads(), grid);
    }
    if (failed(wanted))
      return replicated();
    return {dq, keyGradient(dq, (*wanted)[1]), keyGradient(dq, (*wanted)[2])};
  }
  if (isa<ExpertsGradOp>(op) && operands.size() == 7) {
    // dx and dweights: the tokens, partial sums over the axes splitting
    // the experts' FFN; the stacks' gradients: split as the stacks, summed
    // over the tokens' axes (but those that split the experts: dispatch
    // brings an expert every token routed to it).
    // The tokens split as the indices are (integers are never resharded).
    const Layout &wg = operands[3];
    Layout::Axes ffn = wg.dims[1];
    Layout dx = operands[2];
    dx.partial.assign(ffn.begin(), ffn.end());
    dx.dims.back().clear();
    Layout dweights = dx;
    SmallVector<std::string> taken(wg.dims[0].begin(), wg.dims[0].end());
    taken.append(ffn.begin(), ffn.end());
    Layout::Axes tokens = tokenAxes(operands[2], taken);
    Layout gateUp = Layout::replicated(3), down = Layout::replicated(3);
    gateUp.dims[0] = down.dims[0] = wg.dims[0];
    gateUp.dims[1] = down.dims[2] = ffn;
    gateUp.partial = down.partial = tokens;
    return {dx, dweights, gateUp, gateUp, down};
  }
  if (isa<RingCacheUpdateOp>(op) && !operands.empty() && operands[0].partial.empty() &&
      operands[0].dims.size() == 4 && operands[0].dims[1].empty()) // (the window, the ring: as the ring)
    return {operands[0], operands[0]};
  if (operands.empty() || op->getNumResults() != 1)
    return replicated();
  const Layout &in = operands.front();
  Value result = op->getResult(0);
  // A partial sum plus a split value: in the split, the sum
  // reduce-scattered to it, not the split value gathered and made a
  // partial sum (an MoE layer's backward: the experts' dx, partial over
  // tp, and the router's, split on the sequence). A partial sum plus a
  // value split alike: a partial sum (the other kept on one rank), left
  // for its reader to reduce as it needs (MLA's backward: the
  // column-parallel query down projection's dx plus the replicated key
  // one's, reduce-scattered for the norm, not all-reduced and sliced).
  if (isa<AddOp>(op) && operands.size() == 2 && rankOf(op->getOperand(0)) == rankOf(result) &&
      rankOf(op->getOperand(1)) == rankOf(result))
    for (int k : {0, 1}) {
      if (operands[k].partial.empty() || !operands[1 - k].partial.empty())
        continue;
      if (reduceScattersTo(operands[k], operands[1 - k])) {
        results.push_back(operands[1 - k]);
        return results;
      }
      if (operands[1 - k].dims == operands[k].dims) {
        results.push_back(operands[k]);
        return results;
      }
    }
  if (isa<SiluOp, SigmoidOp, GeluOp, SoftcapOp, SwigluOp, AddOp, MulOp, RopeOp, RmsNormOp,
          LayerNormOp, BroadcastOp, CacheUpdateOp, ShiftOp>(op) &&
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
  if (auto slice = dyn_cast<SliceOp>(op)) { // (a partial sum sliced is one)
    if (in.dims[slice.getDim()].empty()) {
      results.push_back(in);
      return results;
    }
    return replicated();
  }
  if (auto concat = dyn_cast<ConcatOp>(op)) {
    // The operands' common split (a whole operand is cut locally), the
    // joined dimension whole: the backward of a concat of slices (MLA's
    // heads' gradients) stays split by heads.
    std::optional<Layout> common;
    for (const Layout &part : operands) {
      if (!part.partial.empty())
        return replicated();
      if (part.isReplicated())
        continue;
      if (common && !(*common == part))
        return replicated();
      common = part;
    }
    if (!common || !common->dims[concat.getDim()].empty())
      return replicated();
    results.push_back(*common);
    return results;
  }
  if (auto reshape = dyn_cast<ReshapeOp>(op)) { // (a partial sum reshaped is one)
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
    // partial sum) when W's in features are split and x is split alike or
    // whole (then cut, locally).
    const Layout &w = operands[1];
    int64_t inDim = linear.getTransposeW() ? 1 : 0;
    Layout out = in;
    out.partial.clear();
    out.dims.back() = w.dims[1 - inDim];
    if (!w.dims[inDim].empty() &&
        (in.dims.back() == w.dims[inDim] || in.dims.back().empty()))
      out.partial = w.dims[inDim];
    // An axis that now splits the features or the sum cannot also split
    // the tokens: those are gathered (as a column-parallel linear after
    // sequence parallelism gathers its input).
    for (size_t d = 0; d + 1 < out.dims.size(); ++d)
      llvm::erase_if(out.dims[d], [&](const std::string &axis) {
        return llvm::is_contained(out.dims.back(), axis) ||
               llvm::is_contained(out.partial, axis);
      });
    results.push_back(out);
    return results;
  }
  if (auto linear = dyn_cast<HeadLinearOp>(op); linear && operands.size() == 2) {
    // The heads as x's (or the weights') are split; then as a linear.
    const Layout &w = operands[1];
    int64_t inDim = linear.getTransposeW() ? 2 : 1;
    Layout out = in;
    out.partial.clear();
    size_t heads = out.dims.size() - 2;
    if (out.dims[heads].empty())
      out.dims[heads] = w.dims[0];
    out.dims.back() = w.dims[3 - inDim];
    if (!w.dims[inDim].empty() &&
        (in.dims.back() == w.dims[inDim] || in.dims.back().empty()))
      out.partial = w.dims[inDim];
    for (size_t d = 0; d < heads; ++d)
      llvm::erase_if(out.dims[d], [&](const std::string &axis) {
        return llvm::is_contained(out.dims[heads], axis) ||
               llvm::is_contained(out.dims.back(), axis) ||
               llvm::is_contained(out.partial, axis);
      });
    results.push_back(out);
    return results;
  }
  if (auto grad = dyn_cast<LinearWeightGradOp>(op); grad && operands.size() == 2) {
    // Summed over the gradient's tokens: a partial sum over their split.
    int64_t inDim = grad.getTransposeW() ? 1 : 0;
    const Layout &x = operands[0], &dy = operands[1];
    Layout out = Layout::replicated(2);
    out.dims[inDim] = x.dims.back();
    out.dims[1 - inDim] = dy.dims.back();
    if (out.dims[0] == out.dims[1] && !out.dims[0].empty())
      out.dims[1 - inDim].clear();
    SmallVector<std::string> taken(out.dims[0].begin(), out.dims[0].end());
    taken.append(out.dims[1].begin(), out.dims[1].end());
    out.partial = tokenAxes(dy, taken);
    results.push_back(out);
    return results;
  }
  if (auto sum = dyn_cast<SumToOp>(op)) { // summed dimensions' axes: a partial sum
    ArrayRef<int64_t> from = shapeOf(sum.getX()), to = shapeOf(result);
    Layout out = Layout::replicated(to.size());
    out.partial = in.partial;
    for (size_t d = 0; d < from.size(); ++d) {
      if (to[d] == 1 && from[d] != 1)
        out.partial.append(in.dims[d].begin(), in.dims[d].end());
      else
        out.dims[d] = in.dims[d];
    }
    results.push_back(out);
    return results;
  }
  if (isa<PositionEmbeddingGradOp>(op)) { // the positions' split: a partial sum
    Layout out = Layout::replicated(2);
    out.dims[1] = in.dims[2];
    out.partial.assign(in.dims[1].begin(), in.dims[1].end());
    results.push_back(out);
    return results;
  }
  if (isa<RouterLoadOp>(op) && rankOf(result) == 2 && in.dims.size() == 3) {
    // Per sequence: the sequences split as x's, a partial sum over the
    // axes splitting each.
    Layout out = Layout::replicated(2);
    out.dims[0] = in.dims[0];
    out.partial.assign(in.dims[1].begin(), in.dims[1].end());
    results.push_back(out);
    return results;
  }
  if (isa<BalanceLossOp>(op) && in.dims.size() == 2 && in.partial.empty()) {
    // Per sequence: each rank's sequences' sum, a partial sum over them.
    Layout out = Layout::replicated(0);
    out.partial.assign(in.dims[0].begin(), in.dims[0].end());
    results.push_back(out);
    return results;
  }
  if (isa<RmsNormWeightGradOp, LayerNormWeightGradOp, RouterLoadOp>(op)) {
    Layout out = Layout::replicated(1);
    out.partial = tokenAxes(in, {});
    results.push_back(out);
    return results;
  }
  if (isa<EmbeddingGradOp>(op) && operands.size() == 2) {
    // Summed over the token ids' split (dy follows the ids).
    Layout ids = operands[0];
    ids.dims.push_back(operands[1].dims.back());
    Layout out = Layout::replicated(2);
    out.dims[1] = operands[1].dims.back();
    out.partial = tokenAxes(ids, out.dims[1]);
    results.push_back(out);
    return results;
  }
  if (isa<LabelCountOp>(op)) { // a partial sum over the labels' split
    Layout out = Layout::replicated(0);
    out.partial = labelAxes(in);
    results.push_back(out);
    return results;
  }
  if (isa<CrossEntropyOp, CrossEntropyGradOp>(op) && operands.size() >= 2) {
    // The labels' tokens (or the logits', where the labels become that by
    // a slice): the loss a partial sum over them, its gradient split alike;
    // logits split on the vocabulary stay so (vocab-parallel: the loss a
    // partial sum over those axes too).
    Layout logits = logitsOf(labelsFor(operands[0], operands[1]));
    if (!operands[0].dims.empty() && operands[0].partial.empty())
      for (const std::string &axis : operands[0].dims.back())
        if (llvm::none_of(logits.dims, [&](const Layout::Axes &axes) { return llvm::is_contained(axes, axis); }))
          logits.dims.back().push_back(axis);
    Layout out = Layout::replicated(0);
    out.partial = tokenAxes(logits, {});
    out.partial.append(logits.dims.back().begin(), logits.dims.back().end());
    results.push_back(isa<CrossEntropyOp>(op) ? out : logits);
    return results;
  }
  if (isa<RmsNormGradOp, LayerNormGradOp, SwigluGradOp, GeluGradOp,
          SigmoidGradOp, SoftcapGradOp, RouterGradOp, RouterAuxGradOp>(op) &&
      rankOf(op->getOperand(0)) == rankOf(result)) {
    // The activation's layout (the gradient is resharded to it); a norm's
    // rows and the router's logits whole.
    Layout out = in;
    out.partial.clear();
    if (isa<RmsNormGradOp, LayerNormGradOp, RouterGradOp, RouterAuxGradOp>(op))
      out.dims.back().clear();
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
  if (isa<PositionEmbeddingGradOp>(local) && !results.front().partial.empty()) {
    SmallVector<StringRef> axes(results.front().partial.begin(), results.front().partial.end());
    local->setAttr("seq_grid", grid.ref);
    local->setAttr("seq_axes", b.getStrArrayAttr(axes));
    if (grid.cyclic.contains(axes.front()))
      local->setAttr("seq_cyclic", b.getUnitAttr());
  }
  if (isa<AttentionOp, AttentionGradOp, RopeOp, PositionEmbeddingOp>(local) &&
      !results.front().dims[1].empty()) {
    SmallVector<StringRef> axes(results.front().dims[1].begin(),
                                results.front().dims[1].end());
    local->setAttr("seq_grid", grid.ref);
    local->setAttr("seq_axes", b.getStrArrayAttr(axes));
    if (grid.cyclic.contains(axes.front()))
      local->setAttr("seq_cyclic", b.getUnitAttr());
  }
  if (isa<AttentionOp, AttentionGradOp>(local)) {
    const auto &headAxes = results.front().dims[2];
    int64_t parts = grid.product(headAxes);
    int64_t heads = cast<IntegerAttr>(local->getAttr("num_heads")).getInt();
    int64_t kvHeads = cast<IntegerAttr>(local->getAttr("num_kv_heads")).getInt();
    local->setAttr("num_heads", b.getI64IntegerAttr(heads / parts));
    if (kvHeads % parts == 0) {
      local->setAttr("num_kv_heads", b.getI64IntegerAttr(kvHeads / parts));
    } else {
      SmallVector<StringRef> axes(headAxes.begin(), headAxes.end());
      local->setAttr("head_grid", grid.ref);
      local->setAttr("head_axes", b.getStrArrayAttr(axes));
    }
  } else if (isa<CrossEntropyOp, CrossEntropyGradOp>(local)) {
    // Tokens split over ranks: the mean's count is the whole's (the
    // vocabulary's split, vocab_axes, is not the tokens').
    auto labels = cast<RankedTensorType>(local->getOperand(1).getType());
    const Layout &out = results.front();
    int64_t parts = grid.product(out.partial);
    for (size_t d = 0; d + 1 < out.dims.size(); ++d)
      parts *= grid.product(out.dims[d]);
    if (auto vocab = local->getAttrOfType<ArrayAttr>("vocab_axes"); vocab && isa<CrossEntropyOp>(local))
      for (StringRef axis : vocab.getAsValueRange<StringAttr>())
        parts /= grid.sizes.lookup(axis);
    if (parts > 1)
      local->setAttr("num_tokens", b.getI64IntegerAttr(labels.getNumElements() * parts));
  } else if (auto grad = dyn_cast<EmbeddingGradOp>(local)) {
    if (!results.front().dims[0].empty()) {
      SmallVector<StringRef> axes(results.front().dims[0].begin(),
                                  results.front().dims[0].end());
      grad.setVocabGridAttr(grid.ref);
      grad.setVocabAxesAttr(b.getStrArrayAttr(axes));
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
