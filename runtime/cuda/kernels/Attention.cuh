// Attention.cuh - the CUDA executor's kernels of rope, attention and
// attention_grad: one CudaExecutor::State member an op or family, called
// through kKernels. A part of CudaExecutor.cu, which includes it (one
// translation unit, for nvcc and the SIMT emulator alike); not a header to
// include elsewhere.

namespace parax::runtime {

Status CudaExecutor::State::runRope(const pxe::Instruction &inst) {
  const Attrs &a = inst.attrs();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  DeviceBuffer &x = in(0), &y = out();
  int64_t rot = attrInt(a, "rotary_dim");
  Status st = y.data == x.data ? Status::ok() : copy(y.data, x.data, x.numel(), x); // (rotated in y)
  if (!st.isOk()) return st;
  int64_t B = x.shape[0], S = x.shape[1], H = x.shape[2], D = x.shape[3];
  SequenceRows rows = rowsOf(a, S); // (unsplit with a run-time position)
  return withFloat(y, [&](auto t) {
    using T = decltype(t);
    PARAX_LAUNCH(ropeKernel<T>, blocksFor(B * S * H * rot / 2), kThreads, 0, stream)(
        y.as<T>(), ropeFrequencies.at(&inst), B, S, H, D, rot, attrInt(a, "position_offset") + rows.start,
        rows.stride, inst.operands_size() == 2 ? in(1).i() : nullptr, attrInt(a, "interleaved") != 0,
        attrInt(a, "inverse") != 0, static_cast<float>(ropeRotatedFactor(a)));
    return Status::ok();
  });
}

Status CudaExecutor::State::runAttention(const pxe::Instruction &inst) {
  if (ranCudnnAttention(inst)) return Status::ok();
  const Attrs &a = inst.attrs();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  DeviceBuffer &q = in(0), &k = in(1), &v = in(2), &y = out();
  int64_t B = q.shape[0], S = q.shape[1], H = q.shape[2], D = q.shape[3];
  // The values: v's first DV channels of its VW (all of them, unless value_dim).
  int64_t T = k.shape[1], KH = k.shape[2], DV = y.shape[3], VW = v.shape[3];
  std::vector<std::string> headAxes = attrStrings(a, "head_axes");
  int64_t headOffset = 0, totalHeads = H;
  if (!headAxes.empty()) {
    headOffset = groupIndex(headAxes) * H;
    totalHeads = H * groupSize(headAxes);
  }
  int64_t limit = sharedOptIn;
  bool causal = attrInt(a, "causal") != 0;
  // A generation step's run-time position (on the device), or none; then
  // query s sits at past + s * stride: past is T - S, or with the queries
  // split over N ranks (seq_axes) T - N * S plus the rank's first
  // position (a block: stride 1; dealt out cyclically: stride N1).
  const int32_t *position = inst.operands_size() == 4 ? in(3).i() : nullptr;
  SequenceRows rows = rowsOf(a, S); // query s at rows.position(s) of the whole
  int64_t past = T - S * rows.pieces + rows.start, stride = rows.stride;
  float scale = static_cast<float>(attrFloat(a, "scale"));
  int64_t window = attrInt(a, "window");                          // (0: none)
  float softcap = static_cast<float>(attrFloat(a, "softcap"));  // (0: none)
  bool ring = attrFlag(a, "ring"); // (k, v: a ring's window; see queryBase)
  // A few queries (a decode step: S = 1) over the keys: split over the
  // keys, every query head of a KV head in one block (unless
  // PARAX_ATTENTION=no-split).
  int64_t group = totalHeads / KH;
  if (auto decode = decodeKeyTiles.find(&inst); decode != decodeKeyTiles.end()) {
    int keyTile = decode->second.keys, blockRows = decode->second.rows;
    // Keys and values: one buffer, or a fused concat's two (the cache's
    // rows, then the new tokens').
    auto parts = [&](int operand, const DeviceBuffer &whole) {
      auto it = cacheParts.find({&inst, operand});
      if (it == cacheParts.end()) return std::make_tuple(whole.data, static_cast<void *>(nullptr), T);
      const DeviceBuffer &cache = buffers[it->second.first];
      return std::make_tuple(cache.data, buffers[it->second.second].data, cache.shape[1]);
    };
    void *kCache, *kNew, *vCache, *vNew; // (named, not bound: the lambda below captures them)
    int64_t cachedK, cachedV;
    std::tie(kCache, kNew, cachedK) = parts(1, k);
    std::tie(vCache, vNew, cachedV) = parts(2, v);
    // Chunks of whole key tiles, enough for two blocks per SM.
    auto ceilDiv = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
    // A KV head's rows on this rank, in blocks of blockRows.
    int64_t rows = std::min(group, H) * S, rowBlocks = ceilDiv(rows, blockRows);
    int64_t tilesOfKeys = ceilDiv(T, keyTile);
    int64_t wanted = std::min(tilesOfKeys, ceilDiv(2 * multiprocessors, B * KH * rowBlocks));
    int64_t chunkKeys = ceilDiv(tilesOfKeys, wanted) * keyTile;
    int64_t chunks = ceilDiv(T, chunkKeys);
    Status st = ensureScratch(B * KH * chunks * rows * DecodeTiles::perRow(DV));
    if (!st.isOk()) return st;
    int64_t sharedBytes = AttentionTiles::floats(blockRows, keyTile, D, DV) * 4;
    return withFloat(y, [&](auto t) {
      using E = decltype(t);
      PARAX_LAUNCH(decodeAttentionKernel<E>, B * KH * rowBlocks * chunks, 256, sharedBytes, stream)(
          q.as<E>(), static_cast<const E *>(kCache), static_cast<const E *>(kNew), cachedK,
          static_cast<const E *>(vCache), static_cast<const E *>(vNew), cachedV, scratch, S, H, D, T, KH, DV,
          VW, causal, scale, headOffset, group, chunks, chunkKeys, keyTile, blockRows, position, past, stride,
          window, softcap, ring);
      PARAX_LAUNCH(decodeCombineKernel<E>, blocksFor(y.numel()), kThreads, 0, stream)(
          scratch, y.as<E>(), B, S, H, KH, DV, headOffset, group, chunks);
      return Status::ok();
    });
  }
  // bf16 with head widths in 16s: tensor cores (unless PARAX_ATTENTION=cuda-cores).
  int64_t tcBytes = TensorCoreTiles::bytes(D, DV);
  if (tensorCoreAttention && y.elem == Elem::BF16 && D % 16 == 0 && DV % 16 == 0 && tcBytes <= limit) {
    int64_t blocks = B * H * ((S + TensorCoreTiles::kQueries - 1) / TensorCoreTiles::kQueries);
    PARAX_LAUNCH(attentionTensorCoreKernel, blocks, TensorCoreTiles::kThreads, tcBytes, stream)(
        q.as<__nv_bfloat16>(), k.as<__nv_bfloat16>(), v.as<__nv_bfloat16>(), y.as<__nv_bfloat16>(), B, S, H, D,
        T, KH, DV, VW, causal, scale, headOffset, group, position, past, stride, nullptr, nullptr, window,
        softcap, ring);
    return Status::ok();
  }
  // Otherwise CUDA cores, with tiles that fit the device's shared memory
  // (opt-in beyond 48 KiB).
  AttentionTiles tiles;
  while (AttentionTiles::floats(tiles.queries, tiles.keys, D, DV) * 4 > limit && tiles.keys > 16)
    tiles.keys /= 2;
  while (AttentionTiles::floats(tiles.queries, tiles.keys, D, DV) * 4 > limit && tiles.queries > 8)
    tiles.queries /= 2;
  int64_t sharedBytes = AttentionTiles::floats(tiles.queries, tiles.keys, D, DV) * 4;
  if (sharedBytes > limit)
    return Status::error("attention: head widths " + std::to_string(D) + "/" + std::to_string(DV) +
                         " need " + std::to_string(sharedBytes) + " bytes of shared memory; the device has " +
                         std::to_string(limit));
  int64_t blocks = B * H * ((S + tiles.queries - 1) / tiles.queries);
  return withFloat(y, [&](auto t) {
    using E = decltype(t);
    PARAX_LAUNCH(attentionKernel<E>, blocks, 256, sharedBytes, stream)(
        q.as<E>(), k.as<E>(), v.as<E>(), y.as<E>(), B, S, H, D, T, KH, DV, VW, causal, scale, headOffset,
        group, tiles.queries, tiles.keys, position, past, stride, window, softcap, ring);
    return Status::ok();
  });
}

Status CudaExecutor::State::runAttentionGrad(const pxe::Instruction &inst) {
  if (ranCudnnAttention(inst)) return Status::ok();
  const Attrs &a = inst.attrs();
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  DeviceBuffer &q = in(0), &k = in(1), &v = in(2), &dout = in(3);
  AttentionShape shape{q.shape[0], q.shape[1], q.shape[2], q.shape[3], k.shape[1], k.shape[2], v.shape[3],
                       attrInt(a, "causal") != 0, static_cast<float>(attrFloat(a, "scale")), 0, 1, 0, 1};
  std::vector<std::string> headAxes = attrStrings(a, "head_axes");
  int64_t totalHeads = shape.H;
  if (!headAxes.empty()) {
    shape.headOffset = groupIndex(headAxes) * shape.H;
    totalHeads = shape.H * groupSize(headAxes);
  }
  shape.group = totalHeads / shape.KH;
  SequenceRows rows = rowsOf(a, shape.S); // as attention's queries
  shape.past = shape.T - shape.S * rows.pieces + rows.start;
  shape.stride = rows.stride;
  shape.window = attrInt(a, "window");                          // (0: none)
  shape.softcap = static_cast<float>(attrFloat(a, "softcap"));  // (0: none)
  // Each query's log-sum-exp and D; where a KV head is read by other than
  // exactly one local query head (GQA; or none: KV heads replicated over
  // ranks of other query heads), each query head's dK and dV in fp32,
  // summed per KV head at the end.
  std::vector<int64_t> readers(shape.KH, 0);
  for (int64_t h = 0; h < shape.H; ++h) {
    int64_t kh = (shape.headOffset + h) / shape.group;
    if (kh < shape.KH) ++readers[kh];
  }
  const bool partials = std::any_of(readers.begin(), readers.end(), [](int64_t n) { return n != 1; });
  const int64_t statsFloats = 2 * shape.B * shape.S * shape.H;
  Status st = ensureScratch(statsFloats + (partials ? shape.B * shape.T * shape.H * (shape.D + shape.DV) : 0));
  if (!st.isOk()) return st;
  float *dkPart = partials ? scratch + statsFloats : nullptr;
  float *dvPart = partials ? dkPart + shape.B * shape.T * shape.H * shape.D : nullptr;
  auto sumParts = [&](auto t) {
    using T = decltype(t);
    if (!partials) return Status::ok();
    PARAX_LAUNCH(attentionGradSumHeadsKernel<T>, blocksFor(out(1).numel()), kThreads, 0, stream)(
        dkPart, out(1).as<T>(), shape.D, shape);
    PARAX_LAUNCH(attentionGradSumHeadsKernel<T>, blocksFor(out(2).numel()), kThreads, 0, stream)(
        dvPart, out(2).as<T>(), shape.DV, shape);
    return Status::ok();
  };
  // bf16 with head widths in 16s: tensor cores, where the tiles fit the
  // shared memory (unless PARAX_ATTENTION=cuda-cores).
  TensorCoreGradTiles tc{static_cast<int>(shape.D), static_cast<int>(shape.DV)};
  if (tensorCoreAttention && q.elem == Elem::BF16 && shape.D % 16 == 0 && shape.DV % 16 == 0 &&
      std::max({TensorCoreTiles::bytes(shape.D, shape.DV), tc.keyValueBytes(), tc.queryBytes()}) <= sharedOptIn) {
    const int64_t R = TensorCoreGradTiles::kRows, threads = 32 * TensorCoreGradTiles::kWarps;
    const int64_t queryBlocks = shape.B * shape.H * ((shape.S + R - 1) / R);
    using B16 = __nv_bfloat16;
    PARAX_LAUNCH(attentionTensorCoreKernel, queryBlocks, TensorCoreTiles::kThreads,
                 TensorCoreTiles::bytes(shape.D, shape.DV),
                 stream)(q.as<B16>(), k.as<B16>(), v.as<B16>(), nullptr, shape.B, shape.S, shape.H, shape.D,
                         shape.T, shape.KH, shape.DV, shape.DV, shape.causal, shape.scale, shape.headOffset,
                         shape.group, nullptr, shape.past, shape.stride, dout.as<B16>(), scratch,
                         shape.window, shape.softcap, false);
    PARAX_LAUNCH(attentionGradTensorCoreKeyValueKernel, shape.B * shape.H * ((shape.T + R - 1) / R), threads,
                 tc.keyValueBytes(), stream)(q.as<B16>(), k.as<B16>(), v.as<B16>(), dout.as<B16>(), scratch,
                                             out(1).as<B16>(), out(2).as<B16>(), dkPart, dvPart, shape, tc);
    st = sumParts(B16{});
    if (!st.isOk()) return st;
    PARAX_LAUNCH(attentionGradTensorCoreQueryKernel, queryBlocks, threads, tc.queryBytes(), stream)(
        q.as<B16>(), k.as<B16>(), v.as<B16>(), dout.as<B16>(), scratch, out(0).as<B16>(), shape, tc);
    return Status::ok();
  }
  // Otherwise CUDA cores in fp32: tiles of 32 rows (16 past head width
  // 128, or where 32 would not fit the shared memory a block may have).
  AttentionGradTiles g{shape.D <= 128 && shape.DV <= 128 ? 32 : 16, shape.D, shape.DV};
  auto largest = [&] { return 4 * std::max({g.statsFloats(), g.keyValueFloats(), g.queryFloats()}); };
  while (largest() > sharedOptIn && g.R > 8) g.R /= 2;
  if (largest() > sharedOptIn)
    return Status::error("attention_grad: head widths " + std::to_string(shape.D) + " and " +
                         std::to_string(shape.DV) + " need " + std::to_string(largest()) +
                         " bytes of shared memory a block; this GPU allows " + std::to_string(sharedOptIn));
  const int64_t queryTiles = (shape.S + g.R - 1) / g.R, keyTiles = (shape.T + g.R - 1) / g.R;
  return withFloat(q, [&](auto t) {
    using T = decltype(t);
    PARAX_LAUNCH(attentionGradStatsKernel<T>, shape.B * shape.H * queryTiles, kThreads, 4 * g.statsFloats(),
                 stream)(q.as<T>(), k.as<T>(), v.as<T>(), dout.as<T>(), scratch, shape, g);
    PARAX_LAUNCH(attentionGradKeyValueKernel<T>, shape.B * shape.H * keyTiles, kThreads, 4 * g.keyValueFloats(),
                 stream)(q.as<T>(), k.as<T>(), v.as<T>(), dout.as<T>(), scratch, out(1).as<T>(), out(2).as<T>(),
                         dkPart, dvPart, shape, g);
    Status summed = sumParts(t);
    if (!summed.isOk()) return summed;
    PARAX_LAUNCH(attentionGradQueryKernel<T>, shape.B * shape.H * queryTiles, kThreads, 4 * g.queryFloats(),
                 stream)(q.as<T>(), k.as<T>(), v.as<T>(), dout.as<T>(), scratch, out(0).as<T>(), shape, g);
    return Status::ok();
  });
}

} // namespace parax::runtime
