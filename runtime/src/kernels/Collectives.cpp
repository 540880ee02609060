// Collectives.cpp - the CPU executor's kernels of all_reduce,
// all_gather/reduce_scatter (shard_slice), all_to_all, to_partial, send and
// recv (each an Executor::Impl member, called through Executor.cpp's
// kKernels).

#include "../ExecutorImpl.h"

namespace parax::runtime {

// all_reduce
Status Executor::Impl::runAllReduce(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Group g;
  if (Status s = groupOf(a, true, g); !s.isOk())
    return s;
  out().f = in(0).f;
  return g.size == 1 ? Status::ok() : e.comm_->allReduce(out().f.data(), out().f.size(), g.mask);
}

// shard_slice, all_gather, reduce_scatter
Status Executor::Impl::runShardSlice(const pxe::Instruction &inst, int variant) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  // (shard_slice only needs this rank's place in the group)
  Group g;
  if (Status s = groupOf(a, variant != 0, g); !s.isOk())
    return s;
  int dim = static_cast<int>(attrInt(a, "dim"));
  Tensor &x = in(0), &y = out();
  if (variant == 0) {
    int64_t index = groupIndex(g.axes), n = y.numel();
    auto keep = [&](const auto &values, auto &into) {
      auto pieces = piecesAlong(x, values, dim, g.size);
      std::copy(pieces.begin() + index * n, pieces.begin() + (index + 1) * n, into.begin());
    };
    if (x.isInt)
      keep(x.i, y.i); // (labels dealt out)
    else
      keep(x.f, y.f);
    return Status::ok();
  }
  if (variant == 1) {
    // Straight into the result's layout: along an inner dimension each
    // rank's piece is `rows` runs of the result's rows (a prefill's
    // logits gathered over the vocabulary: 512 runs of 16,000 values).
    if (g.size == 1) {
      y.f = x.f;
      return Status::ok();
    }
    int64_t rows = 1;
    for (int d = 0; d < dim; ++d) rows *= y.shape[d];
    y.f.resize(x.numel() * g.size);
    if (e.resultsOnHoldersOnly_ && e.gathersToFirst_[inst.results(0)])
      return e.comm_->gatherRuns(x.f.data(), rows, x.numel() / rows, y.f.data(), g.mask);
    return e.comm_->allGatherRuns(x.f.data(), rows, x.numel() / rows, y.f.data(), g.mask);
  }
  if (g.size == 1) {
    y.f = piecesAlong(x, x.f, dim, g.size);
    return Status::ok();
  }
  // (likewise: along the outermost dimension not 1, x is its pieces)
  if (std::all_of(x.shape.begin(), x.shape.begin() + dim, [](int64_t d) { return d == 1; }))
    return e.comm_->reduceScatter(x.f.data(), y.f.data(), y.numel(), g.mask);
  std::vector<float> pieces = piecesAlong(x, x.f, dim, g.size);
  return e.comm_->reduceScatter(pieces.data(), y.f.data(), y.numel(), g.mask);
}

// all_to_all
Status Executor::Impl::runAllToAll(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Group g;
  if (Status s = groupOf(a, true, g); !s.isOk())
    return s;
  int split = static_cast<int>(attrInt(a, "split_dim")), concat = static_cast<int>(attrInt(a, "concat_dim"));
  Tensor &x = in(0), &y = out();
  std::vector<float> pieces = piecesAlong(x, x.f, split, g.size), received(pieces.size());
  Status s = g.size == 1 ? (received = pieces, Status::ok())
                    : e.comm_->allToAll(pieces.data(), received.data(), x.numel() / g.size, g.mask);
  if (!s.isOk()) return s;
  joinAlong(received, concat, g.size, y);
  return Status::ok();
}

// to_partial
Status Executor::Impl::runToPartial(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Group g;
  if (Status s = groupOf(a, false, g); !s.isOk())
    return s;
  out().f = in(0).f;
  if (groupIndex(g.axes) != 0) std::fill(out().f.begin(), out().f.end(), 0.0f);
  return Status::ok();
}

// send
Status Executor::Impl::runSend(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Group g;
  if (Status s = groupOf(a, true, g); !s.isOk())
    return s;
  return e.comm_->send(in(0).f.data(), in(0).numel(), peerRank(g.axes.at(0), attrInt(a, "peer")));
}

// recv
Status Executor::Impl::runRecv(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Group g;
  if (Status s = groupOf(a, true, g); !s.isOk())
    return s;
  return e.comm_->recv(out().f.data(), out().numel(), peerRank(g.axes.at(0), attrInt(a, "peer")));
}

} // namespace parax::runtime
