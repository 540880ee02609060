// Moe.cpp - the CPU executor's kernels of router, experts, moe_dispatch and
// the load-balancing loss (each an Executor::Impl member, called through
// Executor.cpp's kKernels).

#include "../ExecutorImpl.h"

namespace parax::runtime {

// router, router_grad, router_load
Status Executor::Impl::runRouter(const pxe::Instruction &inst, int variant) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Routing routing;
  routing.topK = attrInt(a, "top_k");
  routing.groups = attrInt(a, "num_groups", 1);
  routing.topkGroups = attrInt(a, "topk_groups", 1);
  routing.sigmoid = attrString(a, "score_func") == "sigmoid";
  routing.normalize = attrFlag(a, "normalize");
  routing.scaling = attrFloat(a, "scaling_factor", 1.0);
  if (variant == 0) {
    router(in(0), in(1), inst.operands_size() == 3 ? &in(2) : nullptr, routing, out(0), out(1));
    if (inst.operands_size() == 3) { // a correction bias: its experts' choices counted
      std::vector<double> &counts = e.expertCounts_[inst.operands(2)];
      counts.resize(in(2).numel());
      for (int32_t expert : out(1).i)
        if (expert >= 0 && expert < static_cast<int32_t>(counts.size())) counts[expert] += 1;
    }
  }
  else if (variant == 2)
    routerLoad(in(0), in(1), inst.operands_size() == 3 ? &in(2) : nullptr, routing, attrFlag(a, "scores"), out());
  else
    routerGrad(in(0), in(1), inst.operands_size() == 4 ? &in(3) : nullptr, in(2), routing, out());
  return Status::ok();
}

// experts
Status Executor::Impl::runExperts(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  experts(in(0), in(1), in(2), in(3), in(4), in(5), out());
  return Status::ok();
}

// experts_grad
Status Executor::Impl::runExpertsGrad(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  expertsGrad(in(0), in(1), in(2), in(3), in(4), in(5), in(6), out(0), out(1), out(2), out(3), out(4));
  return Status::ok();
}

// moe_dispatch, moe_combine
Status Executor::Impl::runMoeDispatch(const pxe::Instruction &inst, int variant) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  const std::string &op = opName(inst); // (for messages)
  Group g;
  if (Status s = groupOf(a, true, g); !s.isOk())
    return s;
  int64_t E = attrInt(a, "num_experts"), local = E / g.size;
  Tensor &idx = in(variant == 0 ? 2 : 1);
  int64_t pairs = idx.numel(), K = idx.shape.back();
  // This rank's (token, choice) pairs leave grouped by the member owning
  // their expert, in order; the members' counts, all-gathered, size each
  // block (an all-to-all of the routed rows only).
  if (pairs >= (int64_t(1) << 24)) // (the counts travel as floats)
    return Status::error(op + ": more than 2^24 (token, choice) pairs on a rank");
  std::vector<float> counts(g.size, 0.0f), all(g.size * g.size);
  for (int64_t k = 0; k < pairs; ++k) {
    if (idx.i[k] < 0 || idx.i[k] >= E)
      return Status::error(op + ": (token, choice) pair " + std::to_string(k) + " chose expert " +
                           std::to_string(idx.i[k]) + ", outside the " + std::to_string(E) + " experts");
    counts[idx.i[k] / local] += 1;
  }
  Status s = g.size == 1 ? (all = counts, Status::ok()) : e.comm_->allGather(counts.data(), g.size, all.data(), g.mask);
  if (!s.isOk()) return s;
  const int64_t me = groupIndex(g.axes);
  const int64_t capacity = (variant == 0 ? out(0) : in(0)).shape[0];
  if (g.size > 1 && variant == 0)
    e.busiestExpertLoad_ = std::max(e.busiestExpertLoad_, busiestRankLoad(all, g.size, pairs));
  if (Status full = expertCapacityCheck(op, all, g.size, capacity); !full.isOk()) return full;
  // Where each of this rank's pairs sits among the rows it sends.
  std::vector<int64_t> sendAt(g.size, 0), at(pairs);
  for (int64_t d = 1; d < g.size; ++d) sendAt[d] = sendAt[d - 1] + static_cast<int64_t>(all[me * g.size + d - 1]);
  for (int64_t k = 0; k < pairs; ++k) at[k] = sendAt[idx.i[k] / local]++;
  auto sizes = [&](int64_t width, bool toMembers) { return exchangeBlocks(all, g.size, me, width, toMembers); };
  const int64_t received = routedTo(all, g.size, me); // rows that arrive here
  if (variant == 0) {
    // Rows [h features, weight, local expert] go out; they arrive block
    // after block (member 0's first) at the top of the results, the rest
    // unused (expert -1).
    Tensor &x = in(0), &w = in(1), &rows = out(0), &rw = out(1), &re = out(2);
    int64_t h = x.shape.back(), width = h + 2;
    std::vector<float> sendBuf(pairs * width), recvBuf(received * width);
    for (int64_t k = 0; k < pairs; ++k) {
      float *row = &sendBuf[at[k] * width];
      std::copy(&x.f[(k / K) * h], &x.f[(k / K) * h] + h, row);
      row[h] = w.f[k];
      row[h + 1] = static_cast<float>(idx.i[k] % local);
    }
    s = g.size == 1 ? (recvBuf = sendBuf, Status::ok())
               : e.comm_->allToAllv(sendBuf.data(), sizes(width, true), recvBuf.data(), sizes(width, false), g.mask);
    if (!s.isOk()) return s;
    std::fill(rows.f.begin(), rows.f.end(), 0.0f);
    std::fill(rw.f.begin(), rw.f.end(), 0.0f);
    std::fill(re.i.begin(), re.i.end(), -1);
    for (int64_t r = 0; r < received; ++r) {
      const float *row = &recvBuf[r * width];
      std::copy(row, row + h, &rows.f[r * h]);
      rw.f[r] = row[h];
      re.i[r] = static_cast<int32_t>(row[h + 1]);
    }
    return Status::ok();
  }
  // The rows that arrived go back to their members, as they came.
  Tensor &rows = in(0), &y = out();
  int64_t h = rows.shape.back();
  std::vector<float> back(pairs * h);
  s = g.size == 1 ? (std::copy(rows.f.begin(), rows.f.begin() + received * h, back.begin()), Status::ok())
             : e.comm_->allToAllv(rows.f.data(), sizes(h, false), back.data(), sizes(h, true), g.mask);
  if (!s.isOk()) return s;
  // Each pair's row back in its place, summed per token (or, per_choice,
  // kept per pair).
  std::fill(y.f.begin(), y.f.end(), 0.0f);
  int64_t perRow = attrFlag(a, "per_choice") ? 1 : K;
  for (int64_t k = 0; k < pairs; ++k)
    for (int64_t c = 0; c < h; ++c) y.f[(k / perRow) * h + c] += back[at[k] * h + c];
  return Status::ok();
}

// balance_loss
Status Executor::Impl::runBalanceLoss(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  out().f.assign(1, static_cast<float>(
                        balanceLoss(in(0), in(1), attrFloat(a, "coefficient"), attrInt(a, "num_tokens"),
                                    attrInt(a, "num_sequences", 1))));
  return Status::ok();
}

// router_aux_grad
Status Executor::Impl::runRouterAuxGrad(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  routerAuxGrad(in(0), in(1), in(2), attrString(a, "score_func") == "sigmoid", attrFloat(a, "coefficient"),
                attrInt(a, "num_tokens"), attrInt(a, "num_sequences", 1), out());
  return Status::ok();
}

} // namespace parax::runtime
