// Collectives.cuh - the CUDA executor's kernels of all_reduce, shard_slice,
// to_partial, all_gather/reduce_scatter, send/recv and the expert exchange
// (NCCL): one CudaExecutor::State member an op or family, called through
// kKernels. A part of CudaExecutor.cu, which includes it (one translation
// unit, for nvcc and the SIMT emulator alike); not a header to include
// elsewhere.

namespace parax::runtime {

Status CudaExecutor::State::runAllReduce(const pxe::Instruction &inst) {
  StatusOr<CollectiveGroup> group = collectiveGroup(inst.attrs());
  if (!group.isOk()) return group.status();
  unsigned mask = group.value().mask;
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  Status st = copy(out().data, in(0).data, out().numel(), out());
  if (!st.isOk() || !comm) return st;
  st = comm->allReduce(out().data, out().numel(), out().elem, mask, stream);
  if (!st.isOk()) return st;
  return deferUntilNeeded({inst.results(0)}, nullptr);
}

Status CudaExecutor::State::runShardSlice(const pxe::Instruction &inst) {
  StatusOr<CollectiveGroup> group = collectiveGroup(inst.attrs());
  if (!group.isOk()) return group.status();
  const std::vector<std::string> &axes = group.value().axes;
  const Attrs &a = inst.attrs();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  int dim = static_cast<int>(attrInt(a, "dim"));
  auto [outer, inner] = around(in(0).shape, dim);
  int64_t chunk = out().shape[dim];
  return withBits(out(), [&, outer = outer, inner = inner](auto w) {
    using W = decltype(w);
    PARAX_LAUNCH(sliceKernel<W>, blocksFor(out().numel()), kThreads, 0, stream)(
        in(0).as<W>(), out().as<W>(), outer, in(0).shape[dim], chunk, groupIndex(axes) * chunk, inner);
    return Status::ok();
  });
}

Status CudaExecutor::State::runToPartial(const pxe::Instruction &inst) {
  StatusOr<CollectiveGroup> group = collectiveGroup(inst.attrs());
  if (!group.isOk()) return group.status();
  const std::vector<std::string> &axes = group.value().axes;
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  if (groupIndex(axes) == 0) return copy(out().data, in(0).data, out().numel(), out());
  PARAX_CUDA(cudaMemsetAsync(out().data, 0, out().bytes(), stream));
  return Status::ok();
}

Status CudaExecutor::State::runGatherScatter(const pxe::Instruction &inst) {
  StatusOr<CollectiveGroup> group = collectiveGroup(inst.attrs());
  if (!group.isOk()) return group.status();
  int64_t P = group.value().ranks;
  unsigned mask = group.value().mask;
  const Attrs &a = inst.attrs();
  const pxe::OpKind op = inst.kind();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  DeviceBuffer &x = in(0), &y = out();
  int64_t largest = std::max(x.numel(), y.numel());
  Status st = ensureCommScratch(largest * 2);
  if (!st.isOk()) return st;
  void *a0 = commScratch, *a1 = commScratch + largest;
  std::vector<int32_t> touched = {inst.operands(0), inst.results(0)};
  if (op == pxe::OP_ALL_GATHER) {
    int dim = static_cast<int>(attrInt(a, "dim"));
    if (!comm) return copy(y.data, x.data, y.numel(), y);
    st = comm->allGather(x.data, a0, x.numel(), x.elem, mask, stream);
    if (!st.isOk()) return st;
    return deferUntilNeeded(touched, [this, &y, dim, P, a0] { return pieces(true, y, dim, P, a0); });
  }
  if (op == pxe::OP_REDUCE_SCATTER) {
    int dim = static_cast<int>(attrInt(a, "dim"));
    st = pieces(false, x, dim, P, a0);
    if (!st.isOk()) return st;
    if (!comm) return copy(y.data, a0, y.numel(), y);
    st = comm->reduceScatter(a0, y.data, y.numel(), y.elem, mask, stream);
    if (!st.isOk()) return st;
    return deferUntilNeeded(touched, nullptr);
  }
  int split = static_cast<int>(attrInt(a, "split_dim")), concat = static_cast<int>(attrInt(a, "concat_dim"));
  st = pieces(false, x, split, P, a0);
  if (!st.isOk()) return st;
  if (!comm) return pieces(true, y, concat, P, a0);
  st = comm->allToAll(a0, a1, x.numel() / P, x.elem, mask, stream);
  if (!st.isOk()) return st;
  return deferUntilNeeded(touched, [this, &y, concat, P, a1] { return pieces(true, y, concat, P, a1); });
}

Status CudaExecutor::State::runSendRecv(const pxe::Instruction &inst) {
  StatusOr<CollectiveGroup> group = collectiveGroup(inst.attrs());
  if (!group.isOk()) return group.status();
  const Attrs &a = inst.attrs();
  const pxe::OpKind op = inst.kind();
  if (!comm)
    return Status::error("send/recv needs a communicator");
  Status st = comm->exchange({pointToPoint(inst, op == pxe::OP_SEND)}, stream);
  if (!st.isOk()) return st;
  return deferUntilNeeded({op == pxe::OP_SEND ? inst.operands(0) : inst.results(0)}, nullptr);
}

Status CudaExecutor::State::runExpertExchange(const pxe::Instruction &inst) {
  StatusOr<CollectiveGroup> group = collectiveGroup(inst.attrs());
  if (!group.isOk()) return group.status();
  const std::vector<std::string> &axes = group.value().axes;
  int64_t P = group.value().ranks;
  unsigned mask = group.value().mask;
  const Attrs &a = inst.attrs();
  const pxe::OpKind op = inst.kind();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  // As the CPU backend: this rank's pairs leave grouped by the member
  // owning their expert (moeSlotsKernel); the members' counts, all-gathered
  // and read by the host, size each block of one all-to-all of the routed
  // rows only, which arrive member after member at the top of the
  // dispatch's rows (the rest unused). Rows travel in their own storage;
  // the dispatch's [router weight, local expert] of each in fp32 beside
  // them. A group of one keeps its rows in place (no host synchronisation).
  int64_t E = attrInt(a, "num_experts"), local = E / P;
  DeviceBuffer &idx = in(op == pxe::OP_MOE_DISPATCH ? 2 : 1);
  DeviceBuffer &x = in(0); // the tokens, or the rows back
  const int64_t pairs = idx.numel(), K = idx.shape.back(), h = x.shape.back();
  const int64_t capacity = (op == pxe::OP_MOE_DISPATCH ? out(0) : x).shape[0];
  const Elem e = x.elem;
  const int64_t me = groupIndex(axes), ints = pairs + P + P * P;
  const int64_t rowFloats = (pairs * h * static_cast<int64_t>(elemBytes(e)) + 3) / 4;
  Status st = ensureCommScratch(ints + rowFloats + 2 * pairs + 2 * capacity);
  if (!st.isOk()) return st;
  auto *slot = reinterpret_cast<int32_t *>(commScratch);
  int32_t *counts = slot + pairs, *allCounts = counts + P;
  float *sendRows = commScratch + ints, *sendMeta = sendRows + rowFloats, *recvMeta = sendMeta + 2 * pairs;
  PARAX_CUDA(cudaMemsetAsync(slot, 0xff, pairs * 4, stream)); // -1: no slot
  PARAX_LAUNCH(moeSlotsKernel, 1, kThreads, 0, stream)(idx.i(), slot, counts, pairs, local, P);
  const bool travel = comm && P > 1;
  std::vector<int32_t> all; // the members' counts
  auto blocks = [&](int64_t width, bool toMembers) { return exchangeBlocks(all, P, me, width, toMembers); };
  if (travel) {
    st = comm->allGather(counts, allCounts, P, Elem::I32, mask, stream);
    if (st.isOk()) st = awaitIssued(); // (on the communication stream)
    if (!st.isOk()) return st;
    all.resize(P * P);
    PARAX_CUDA(cudaMemcpyAsync(all.data(), allCounts, P * P * 4, cudaMemcpyDeviceToHost, stream));
    st = sync();
    if (!st.isOk()) return st;
    if (op == pxe::OP_MOE_DISPATCH) expertLoad = std::max(expertLoad, busiestRankLoad(all, P, pairs));
    st = expertCapacityCheck(opName(inst), all, P, capacity);
    if (!st.isOk()) return st;
  }
  if (op == pxe::OP_MOE_DISPATCH) {
    // Filled in place (a group of one), or sent from the send side
    // straight into the result.
    DeviceBuffer &w = in(1), &rows = out(0), &weights = out(1), &experts = out(2);
    float *meta = recvMeta; // [weight, expert] of each of the result's rows
    st = withFloat(x, [&](auto t) {
      using T = decltype(t);
      PARAX_LAUNCH(moeClearKernel<T>, blocksFor(capacity * (h + 2)), kThreads, 0, stream)(rows.as<T>(), meta,
                                                                                          capacity, h);
      PARAX_LAUNCH(moeFillKernel<T>, blocksFor(pairs * (h + 2)), kThreads, 0, stream)(
          x.as<T>(), w.as<T>(), idx.i(), slot, travel ? reinterpret_cast<T *>(sendRows) : rows.as<T>(),
          travel ? sendMeta : meta, pairs, K, h, local);
      return Status::ok();
    });
    if (st.isOk() && travel) st = comm->allToAllv(sendRows, blocks(h, true), rows.data, blocks(h, false), e, mask, stream);
    if (st.isOk() && travel)
      st = comm->allToAllv(sendMeta, blocks(2, true), recvMeta, blocks(2, false), Elem::F32, mask, stream);
    if (st.isOk()) st = awaitIssued();
    if (!st.isOk()) return st;
    return withFloat(weights, [&](auto t) {
      using T = decltype(t);
      PARAX_LAUNCH(moeUnpackKernel<T>, blocksFor(capacity), kThreads, 0, stream)(meta, weights.as<T>(),
                                                                                 experts.i(), capacity);
      return Status::ok();
    });
  }
  DeviceBuffer &y = out();
  std::vector<int32_t> touched(inst.results().begin(), inst.results().end());
  if (travel) { // the rows that arrived, back to their members as they came
    st = comm->allToAllv(x.data, blocks(h, false), sendRows, blocks(h, true), e, mask, stream);
    if (!st.isOk()) return st;
    touched.push_back(inst.operands(0)); // read by the transfer
  }
  const void *back = travel ? static_cast<const void *>(sendRows) : x.data;
  int64_t per = attrInt(a, "per_choice") ? 1 : K; // pairs a result row sums
  return deferUntilNeeded(touched, [this, &y, back, slot, per, h] {
    return withFloat(y, [&](auto t) {
      using T = decltype(t);
      PARAX_LAUNCH(moeCombineKernel<T>, blocksFor(y.numel()), kThreads, 0, stream)(
          static_cast<const T *>(back), slot, y.as<T>(), y.numel() / h, per, h);
      return Status::ok();
    });
  });
}

} // namespace parax::runtime
