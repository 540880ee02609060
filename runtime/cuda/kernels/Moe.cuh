// Moe.cuh - the CUDA executor's kernels of router, experts and the load-
// balancing loss: one CudaExecutor::State member an op or family, called
// through kKernels. A part of CudaExecutor.cu, which includes it (one
// translation unit, for nvcc and the SIMT emulator alike); not a header to
// include elsewhere.

namespace parax::runtime {

Status CudaExecutor::State::runRouter(const pxe::Instruction &inst) {
  const Attrs &a = inst.attrs();
  const pxe::OpKind op = inst.kind();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  DeviceBuffer &x = in(0), &gate = in(1);
  int64_t h = x.shape.back(), tokens = x.numel() / h, E = gate.shape[0], K = attrInt(a, "top_k");
  if (K > 64) return Status::error(opName(inst) + ": top_k above 64");
  // Logits [tokens, E] in fp32 = x . gate^T, then scores and choice (2E per token).
  Status st = ensureScratch(tokens * E * 3 + (tokens * h + 1) / 2);
  if (!st.isOk()) return st;
  float *logits = scratch, *choice = scratch + tokens * E;
  auto *xb = reinterpret_cast<__nv_bfloat16 *>(scratch + tokens * E * 3);
  st = gemm(x.data, x.elem, tokens, h, gate.data, gate.elem, true, E, logits, Elem::F32, xb);
  if (!st.isOk()) return st;
  bool sigmoidScores = attrString(a, "score_func") == "sigmoid", normalize = attrInt(a, "normalize") != 0;
  float scaling = static_cast<float>(attrFloat(a, "scaling_factor", 1.0));
  int64_t groups = attrInt(a, "num_groups", 1), topkGroups = attrInt(a, "topk_groups", 1);
  if (op == pxe::OP_ROUTER_AUX_GRAD) {
    // Per sequence: a row of the load [B, E] for each sequence's tokens.
    DeviceBuffer &load = in(2), &dl = out();
    int64_t perRow = load.shape.size() == 2 ? tokens / load.shape[0] : 0;
    double T = static_cast<double>(attrInt(a, "num_tokens"));
    double scale = attrFloat(a, "coefficient") * E / (T * T * static_cast<double>(attrInt(a, "num_sequences", 1)));
    return withFloat(dl, [&](auto t) {
      using T = decltype(t);
      PARAX_LAUNCH(routerAuxGradKernel<T>, blocksFor(tokens), kThreads, 0, stream)(
          logits, load.f(), dl.as<T>(), tokens, E, sigmoidScores, static_cast<float>(scale), perRow);
      return Status::ok();
    });
  }
  if (op == pxe::OP_ROUTER_LOAD) {
    DeviceBuffer &load = out();
    int64_t perRow = load.shape.size() == 2 ? tokens / load.shape[0] : 0;
    PARAX_CUDA(cudaMemsetAsync(load.data, 0, load.numel() * 4, stream));
    return withFloat(x, [&](auto t) {
      using T = decltype(t);
      PARAX_LAUNCH(routerLoadKernel<T>, blocksFor(tokens), kThreads, 0, stream)(
          logits, inst.operands_size() == 3 ? in(2).as<T>() : nullptr, choice, load.f(), tokens, E, K,
          sigmoidScores, groups, topkGroups, attrInt(a, "scores") != 0, perRow);
      return Status::ok();
    });
  }
  if (op == pxe::OP_ROUTER_GRAD) {
    DeviceBuffer &dw = in(2), &dl = out();
    return withFloat(dl, [&](auto t) {
      using T = decltype(t);
      PARAX_LAUNCH(routerGradKernel<T>, blocksFor(tokens), kThreads, 0, stream)(
          logits, inst.operands_size() == 4 ? in(3).as<T>() : nullptr, dw.as<T>(), choice, dl.as<T>(), tokens,
          E, K, sigmoidScores, normalize, scaling, groups, topkGroups);
      return Status::ok();
    });
  }
  DeviceBuffer &w = out(0), &idx = out(1);
  st = withFloat(w, [&](auto t) {
    using T = decltype(t);
    PARAX_LAUNCH(routerKernel<T>, blocksFor(tokens), kThreads, 0, stream)(
        logits, inst.operands_size() == 3 ? in(2).as<T>() : nullptr, choice, w.as<T>(), idx.i(), tokens, E, K,
        sigmoidScores, normalize, scaling, groups, topkGroups);
    return Status::ok();
  });
  if (st.isOk() && inst.operands_size() == 3) { // a correction bias: its experts' choices counted
    int32_t *&counts = expertCounts[inst.operands(2)];
    if (!counts) { // (the first run allocates: a captured step is never the first)
      st = allocate(&counts, E * 4, "a router's expert counts");
      if (!st.isOk()) return st;
      PARAX_CUDA(cudaMemsetAsync(counts, 0, E * 4, stream));
    }
    PARAX_LAUNCH(expertCountKernel, blocksFor(tokens * K), kThreads, 0, stream)(idx.i(), counts, tokens * K, E);
  }
  return st;
}

Status CudaExecutor::State::runExperts(const pxe::Instruction &inst) {
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  DeviceBuffer &x = in(0), &w = in(1), &idx = in(2), &wg = in(3), &wu = in(4), &wd = in(5), &y = out();
  int64_t H = x.shape.back(), K = idx.shape.back(), pairs = idx.numel(), E = wg.shape[0], F = wg.shape[1];
  // Scratch: count, offset, cursor [E]; perm, pos [pairs] (ints); rows
  // [pairs, H] (x's storage); gate, up [pairs, F]; down [pairs, H] (fp32);
  // bf16 activations for the GEMMs.
  int64_t ints = 3 * E + 2 * pairs, widest = std::max(H, F);
  Status st = ensureScratch(ints + pairs * (2 * H + 2 * F) + (pairs * widest + 1) / 2);
  if (!st.isOk()) return st;
  auto *count = reinterpret_cast<int32_t *>(scratch);
  int32_t *offset = count + E, *cursor = offset + E, *perm = cursor + E, *pos = perm + pairs;
  float *rowsAt = scratch + ints, *gate = rowsAt + pairs * H, *up = gate + pairs * F, *down = up + pairs * F;
  auto *xb = reinterpret_cast<__nv_bfloat16 *>(down + pairs * H);
  auto rows = [&](int64_t r) { return reinterpret_cast<char *>(rowsAt) + r * H * elemBytes(x.elem); };
  PARAX_CUDA(cudaMemsetAsync(count, 0, E * 4, stream));
  PARAX_LAUNCH(expertCountKernel, blocksFor(pairs), kThreads, 0, stream)(idx.i(), count, pairs, E);
  bool grouped = groupedExperts(inst);
  // Rows in expert order: every pair's row (grouped: the host never
  // learns how many are used) or the used ones.
  int64_t gathered = pairs;
  std::vector<int32_t> counts(E), offsets(E);
  if (grouped) {
    PARAX_LAUNCH(expertOffsetsKernel, 1, 1, 0, stream)(count, offset, cursor, E);
  } else {
    // The host sizes each expert's GEMMs.
    PARAX_CUDA(cudaMemcpyAsync(counts.data(), count, E * 4, cudaMemcpyDeviceToHost, stream));
    st = sync();
    if (!st.isOk()) return st;
    int32_t total = 0;
    for (int64_t e = 0; e < E; ++e) {
      offsets[e] = total;
      total += counts[e];
    }
    gathered = total;
    PARAX_CUDA(cudaMemcpyAsync(cursor, offsets.data(), E * 4, cudaMemcpyHostToDevice, stream));
  }
  PARAX_CUDA(cudaMemsetAsync(perm, 0xff, pairs * 4, stream)); // -1: no pair (rows past the last used one)
  PARAX_CUDA(cudaMemsetAsync(pos, 0xff, pairs * 4, stream));  // -1: an unused dispatch row
  PARAX_LAUNCH(expertOrderKernel, blocksFor(pairs), kThreads, 0, stream)(idx.i(), cursor, perm, pos, pairs, E);
  st = withBits(x, [&](auto b) {
    using W = decltype(b);
    PARAX_LAUNCH(gatherRowsKernel<W>, blocksFor(gathered * H), kThreads, 0, stream)(
        x.as<W>(), perm, reinterpret_cast<W *>(rowsAt), gathered, K, H);
    return Status::ok();
  });
  if (!st.isOk()) return st;
  if (grouped) {
    // x . W_e^T for every expert's rows, gate/up [E, F, H] and down [E, H, F].
    auto project = [&](const void *in, Elem inElem, int64_t width, const DeviceBuffer &weights, int64_t n,
                       float *result) -> Status {
      if (weights.elem == Elem::F32 && inElem != Elem::F32)
        return Status::error("experts: fp32 weights need fp32 activations");
      if (fewRowExperts(pairs, E) && FewRows::fits(1, width, n, true, elemBytes(weights.elem), weights.data)) {
        // At most 8 rows an expert on average (decode): each expert's
        // weights read once for every 8 of its rows.
        const int64_t columns = FewRows::kWarps * FewRows::kWarpColumns;
        dim3 few(static_cast<unsigned>((n + columns - 1) / columns), static_cast<unsigned>(E));
        auto launch = [&](auto xs, auto ws) {
          using Shape = FewRowsShape<FewRows::kMaxRows, decltype(xs), decltype(ws)>;
          PARAX_LAUNCH(groupedFewRowsKernel<Shape>, few, FewRows::kThreads, 0, stream)(
              static_cast<const typename Shape::TX *>(in), static_cast<const typename Shape::TW *>(weights.data),
              result, count, offset, n, width);
        };
        if (weights.elem == Elem::F32) launch(float{}, float{});
        else if (inElem == Elem::F32) launch(float{}, __nv_bfloat16{});
        else launch(__nv_bfloat16{}, __nv_bfloat16{});
        return Status::ok();
      }
      dim3 grid(GroupedTiles::blocks(pairs, E), (n + GroupedTiles::kCols - 1) / GroupedTiles::kCols);
      if (weights.elem == Elem::F32) {
        PARAX_LAUNCH(groupedGemmKernel, grid, GroupedTiles::kThreads, GroupedTiles::bytes(), stream)(
            static_cast<const float *>(in), weights.f(), result, count, offset, E, n, width);
        return Status::ok();
      }
      if (inElem == Elem::F32) {
        PARAX_LAUNCH(toBf16Kernel, blocksFor(pairs * width), kThreads, 0, stream)(static_cast<const float *>(in),
                                                                                 xb, pairs * width);
        in = xb;
      }
      PARAX_LAUNCH(groupedGemmTensorCoreKernel, grid, GroupedTiles::kThreads, GroupedTiles::bytes(), stream)(
          static_cast<const __nv_bfloat16 *>(in), weights.as<__nv_bfloat16>(), result, count, offset, E, n,
          width);
      return Status::ok();
    };
    st = project(rowsAt, x.elem, H, wg, F, gate);
    if (st.isOk()) st = project(rowsAt, x.elem, H, wu, F, up);
    if (!st.isOk()) return st;
    PARAX_LAUNCH(swigluKernel<float>, blocksFor(pairs * F), kThreads, 0, stream)(gate, up, gate, pairs * F);
    st = project(gate, Elem::F32, F, wd, H, down);
    if (!st.isOk()) return st;
  } else {
    for (int64_t e = 0; e < E && st.isOk(); ++e) {
      if (counts[e] == 0) continue;
      int64_t r = offsets[e], m = counts[e];
      // gate/up stacks are [E, F, H] and down [E, H, F]: x . W^T each.
      st = gemm(rows(r), x.elem, m, H, offsetOf(wg, e * F * H), wg.elem, true, F, gate + r * F, Elem::F32, xb);
      if (st.isOk())
        st = gemm(rows(r), x.elem, m, H, offsetOf(wu, e * F * H), wu.elem, true, F, up + r * F, Elem::F32, xb);
    }
    if (!st.isOk()) return st;
    PARAX_LAUNCH(swigluKernel<float>, blocksFor(gathered * F), kThreads, 0, stream)(gate, up, gate, gathered * F);
    for (int64_t e = 0; e < E && st.isOk(); ++e) {
      if (counts[e] == 0) continue;
      int64_t r = offsets[e], m = counts[e];
      st = gemm(gate + r * F, Elem::F32, m, F, offsetOf(wd, e * H * F), wd.elem, true, H, down + r * H,
                Elem::F32, xb);
    }
    if (!st.isOk()) return st;
  }
  return withFloat(y, [&](auto t) {
    using T = decltype(t);
    PARAX_LAUNCH(expertsCombineKernel<T>, blocksFor(y.numel()), kThreads, 0, stream)(
        down, w.as<T>(), pos, y.as<T>(), y.numel() / H, K, H);
    return Status::ok();
  });
}

Status CudaExecutor::State::runExpertsGrad(const pxe::Instruction &inst) {
  const Attrs &a = inst.attrs();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  DeviceBuffer &x = in(0), &w = in(1), &idx = in(2), &wg = in(3), &wu = in(4), &wd = in(5), &dy = in(6);
  const int64_t pairs = idx.numel(), K = idx.shape.back(), E = wg.shape[0], H = x.shape.back(), F = wg.shape[1];
  // Scratch: count, offset, cursor [E]; perm, pos [pairs] (ints); rows of
  // x and dy [pairs, H] (later dX's two halves); G, U, DYW [pairs, F]; one
  // expert's stack gradient [F, H]; bf16 activations for the GEMMs.
  int64_t ints = 3 * E + 2 * pairs;
  Status st = ensureScratch(ints + 2 * pairs * H + 3 * pairs * F + F * H + (pairs * std::max(H, F) + 1) / 2);
  if (!st.isOk()) return st;
  auto *count = reinterpret_cast<int32_t *>(scratch);
  int32_t *offset = count + E, *cursor = offset + E, *perm = cursor + E, *pos = perm + pairs;
  float *X = scratch + ints, *DY = X + pairs * H, *G = DY + pairs * H, *U = G + pairs * F, *DYW = U + pairs * F;
  float *stackGrad = DYW + pairs * F;
  auto *xb = reinterpret_cast<__nv_bfloat16 *>(stackGrad + F * H);
  // The host sizes each expert's GEMMs.
  PARAX_CUDA(cudaMemsetAsync(count, 0, E * 4, stream));
  PARAX_LAUNCH(expertCountKernel, blocksFor(pairs), kThreads, 0, stream)(idx.i(), count, pairs, E);
  std::vector<int32_t> counts(E), offsets(E);
  PARAX_CUDA(cudaMemcpyAsync(counts.data(), count, E * 4, cudaMemcpyDeviceToHost, stream));
  st = sync();
  if (!st.isOk()) return st;
  int32_t n = 0; // rows of used pairs
  for (int64_t e = 0; e < E; ++e) {
    offsets[e] = n;
    n += counts[e];
  }
  PARAX_CUDA(cudaMemcpyAsync(cursor, offsets.data(), E * 4, cudaMemcpyHostToDevice, stream));
  PARAX_CUDA(cudaMemsetAsync(perm, 0xff, pairs * 4, stream));
  PARAX_CUDA(cudaMemsetAsync(pos, 0xff, pairs * 4, stream)); // -1: an unused dispatch row
  PARAX_LAUNCH(expertOrderKernel, blocksFor(pairs), kThreads, 0, stream)(idx.i(), cursor, perm, pos, pairs, E);
  // The router weights of unused pairs, and the stacks of experts no pair
  // chose, are zero.
  for (int k = 1; k < 5; ++k) PARAX_CUDA(cudaMemsetAsync(out(k).data, 0, out(k).bytes(), stream));
  // fp32 Aᵀ·B [k, n] of row-major A [m, k] and B [m, n] (a weight's gradient).
  return withFloat(x, [&](auto t) {
    using T = decltype(t);
    if (n > 0) {
      PARAX_LAUNCH(gatherRowsFloatKernel<T>, blocksFor(n * H), kThreads, 0, stream)(x.as<T>(), perm, X, n, K, H);
      PARAX_LAUNCH(gatherRowsFloatKernel<T>, blocksFor(n * H), kThreads, 0, stream)(dy.as<T>(), perm, DY, n, K, H);
    }
    Status s = Status::ok();
    for (int64_t e = 0; e < E && s.isOk(); ++e) {
      if (counts[e] == 0) continue;
      int64_t r = offsets[e], m = counts[e];
      // gate/up stacks are [E, F, H], down [E, H, F]: G = X W_gateᵀ, DYW = DY W_down.
      s = gemm(X + r * H, Elem::F32, m, H, offsetOf(wg, e * F * H), wg.elem, true, F, G + r * F, Elem::F32, xb);
      if (s.isOk())
        s = gemm(X + r * H, Elem::F32, m, H, offsetOf(wu, e * F * H), wu.elem, true, F, U + r * F, Elem::F32, xb);
      if (s.isOk())
        s = gemm(DY + r * H, Elem::F32, m, H, offsetOf(wd, e * H * F), wd.elem, false, F, DYW + r * F, Elem::F32,
                 xb);
    }
    if (!s.isOk()) return s;
    if (n == 0) { // no pair chose an expert of this rank: every gradient is zero
      PARAX_CUDA(cudaMemsetAsync(out(0).data, 0, out(0).bytes(), stream));
      return Status::ok();
    }
    PARAX_LAUNCH(expertsWeightGradKernel<T>, n, kThreads, 0, stream)(perm, G, U, DYW, out(1).as<T>(), F);
    PARAX_LAUNCH(expertsSwigluGradKernel<T>, blocksFor(n * F), kThreads, 0, stream)(perm, w.as<T>(), G, U, DYW, n,
                                                                                  F);
    // Each expert's three stack gradients (through fp32 scratch when stored as bf16).
    for (int64_t e = 0; e < E && s.isOk(); ++e) {
      if (counts[e] == 0) continue;
      int64_t r = offsets[e], m = counts[e];
      const std::pair<const float *, const float *> products[3] = {{G, X}, {U, X}, {DY, DYW}};
      const int64_t widths[3][2] = {{F, H}, {F, H}, {H, F}};
      for (int which = 0; which < 3 && s.isOk(); ++which) {
        int64_t k = widths[which][0], cols = widths[which][1];
        const float *A = products[which].first + r * k, *B = products[which].second + r * cols;
        T *into = out(2 + which).as<T>() + e * F * H;
        float *C = std::is_same<T, float>::value ? reinterpret_cast<float *>(into) : stackGrad;
        s = transposedProduct(A, k, B, cols, m, C, Elem::F32);
        if (s.isOk() && C == stackGrad)
          PARAX_LAUNCH(fromFloatKernel<T>, blocksFor(F * H), kThreads, 0, stream)(stackGrad, into, F * H);
      }
    }
    // dX = dG W_gate + dU W_up per row, in X's memory (read by now), then
    // each token's rows summed.
    for (int64_t e = 0; e < E && s.isOk(); ++e) {
      if (counts[e] == 0) continue;
      int64_t r = offsets[e], m = counts[e];
      s = gemm(G + r * F, Elem::F32, m, F, offsetOf(wg, e * F * H), wg.elem, false, H, X + r * H, Elem::F32, xb);
      if (s.isOk())
        s = gemm(U + r * F, Elem::F32, m, F, offsetOf(wu, e * F * H), wu.elem, false, H, X + r * H, Elem::F32, xb,
                 nullptr, false, /*accumulate=*/true);
    }
    if (!s.isOk()) return s;
    PARAX_LAUNCH(expertsCombineKernel<T>, blocksFor(x.numel()), kThreads, 0, stream)(
        X, static_cast<const T *>(nullptr), pos, out(0).as<T>(), x.numel() / H, K, H);
    return Status::ok();
  });
}

Status CudaExecutor::State::runBalanceLoss(const pxe::Instruction &inst) {
  const Attrs &a = inst.attrs();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  DeviceBuffer &load = in(0), &scores = in(1), &loss = out();
  double T = static_cast<double>(attrInt(a, "num_tokens")), E = static_cast<double>(load.shape.back());
  double sequences = static_cast<double>(attrInt(a, "num_sequences", 1));
  PARAX_LAUNCH(balanceLossKernel, 1, 1, 0, stream)(load.f(), scores.f(), loss.f(), load.numel(),
                                                   attrFloat(a, "coefficient") * E / (T * T * sequences));
  return Status::ok();
}

} // namespace parax::runtime
