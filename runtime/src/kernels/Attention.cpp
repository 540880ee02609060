// Attention.cpp - the CPU executor's kernels of rope, attention and
// attention_grad (each an Executor::Impl member, called through Executor.cpp's
// kKernels).

#include "../ExecutorImpl.h"

namespace parax::runtime {

// rope
Status Executor::Impl::runRope(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &x = in(0), &y = out();
  int64_t B = x.shape[0], S = x.shape[1], H = x.shape[2], D = x.shape[3];
  int64_t rot = attrInt(a, "rotary_dim");
  // Row s at position offset + position(s) (a rank's positions of the
  // sequence), or from a run-time position.
  SequenceRows rows = inst.operands_size() == 2 ? SequenceRows{in(1).i[0], 1, 1} : rowsOf(a, S);
  int64_t offset = inst.operands_size() == 2 ? 0 : attrInt(a, "position_offset");
  bool interleaved = attrFlag(a, "interleaved"), inverse = attrFlag(a, "inverse");
  StatusOr<std::vector<double>> frequencies = ropeInverseFrequencies(a);
  if (!frequencies.isOk())
    return frequencies.status();
  const std::vector<double> &invFreq = frequencies.value();
  double factor = ropeRotatedFactor(a); // (the rotated channels', LongRoPE's on a partial rotary)
  y.f = x.f;
  // A position's cos and sin, computed once for its heads (and rows).
  std::vector<float> cosines(rot / 2), sines(rot / 2);
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t i = 0; i < rot / 2; ++i) {
      double angle = static_cast<double>(offset + rows.position(s)) * invFreq[i];
      cosines[i] = static_cast<float>(factor * std::cos(angle));
      sines[i] = static_cast<float>(factor * (inverse ? -std::sin(angle) : std::sin(angle)));
    }
    for (int64_t bb = 0; bb < B; ++bb)
      for (int64_t h = 0; h < H; ++h) {
        float *v = &y.f[((bb * S + s) * H + h) * D];
        for (int64_t i = 0; i < rot / 2; ++i) {
          int64_t p = interleaved ? 2 * i : i, q = interleaved ? 2 * i + 1 : i + rot / 2;
          float x0 = v[p], x1 = v[q], c = cosines[i], sn = sines[i];
          v[p] = x0 * c - x1 * sn;
          v[q] = x1 * c + x0 * sn;
        }
      }
  }
  return Status::ok();
}

// attention
Status Executor::Impl::runAttention(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &q = in(0), &k = in(1), &v = in(2), &y = out();
  int64_t B = q.shape[0], S = q.shape[1], H = q.shape[2], D = q.shape[3];
  // The values: v's first DV channels of its VW (all of them, unless value_dim).
  int64_t T = k.shape[1], KH = k.shape[2], DV = y.shape[3], VW = v.shape[3];
  StatusOr<AttentionGeometry> geometry = attentionGeometry(inst, q, k);
  if (!geometry.isOk())
    return geometry.status();
  const AttentionGeometry &geo = geometry.value();
  float scale = geo.scale;
  const auto &visibleOf = geo.visible;
  int64_t headOffset = geo.headOffset, group = geo.group;
  // Blocks of a head's queries: scores = scale * Q K^T over the keys the
  // block's last query sees (sgemm), masked and normalised row by row
  // (sums in double), then Y = P V (sgemm). Rows of q and y are strided
  // by the heads, those of k and v by the KV heads.
  constexpr int64_t kBlock = 64;
  // (a decode step's: a KV head's group of query heads; else a block of a
  // head's queries)
  std::vector<float> scores((S == 1 ? H : std::min(kBlock, S)) * T);
  // A row of scores over the `seen` keys: those from `first` to `visible`
  // capped and normalised, the others 0.
  auto normalise = [&](float *row, int64_t first, int64_t visible, int64_t seen) {
    geo.capScores(row + first, visible - first);
    if (visible > first) softmax(row + first, visible - first);
    std::fill(row, row + first, 0.0f);
    std::fill(row + visible, row + seen, 0.0f);
  };
  if (S == 1) {
    // A decode step: the query heads that share a KV head (a row of q
    // each, D apart) as the rows of one product, so that the head's keys
    // and values are read once for the group, not once a query head.
    int64_t seen = visibleOf(0), first = geo.first(0);
    for (int64_t bb = 0; bb < B; ++bb)
      for (int64_t h = 0; h < H;) {
        int64_t kh = (headOffset + h) / group, n = 1;
        while (h + n < H && (headOffset + h + n) / group == kh) ++n;
        float *yGroup = &y.f[(bb * H + h) * DV];
        if (seen <= 0) {
          std::fill(yGroup, yGroup + n * DV, 0.0f);
        } else {
          gemm(false, true, n, seen, D, scale, &q.f[(bb * H + h) * D], D, &k.f[(bb * T * KH + kh) * D], KH * D,
               0.0f, scores.data(), seen);
          for (int64_t r = 0; r < n; ++r) normalise(&scores[r * seen], first, seen, seen);
          gemm(false, false, n, DV, seen, 1.0f, scores.data(), seen, &v.f[(bb * T * KH + kh) * VW], KH * VW, 0.0f,
               yGroup, DV);
        }
        h += n;
      }
    return Status::ok();
  }
  for (int64_t bb = 0; bb < B; ++bb)
    for (int64_t h = 0; h < H; ++h) {
      int64_t kh = (headOffset + h) / group;
      const float *keys = &k.f[(bb * T * KH + kh) * D], *values = &v.f[(bb * T * KH + kh) * VW];
      for (int64_t s0 = 0; s0 < S; s0 += kBlock) {
        int64_t block = std::min(kBlock, S - s0);
        int64_t seen = visibleOf(s0 + block - 1); // by the block's last query
        float *yBlock = &y.f[((bb * S + s0) * H + h) * DV];
        if (seen <= 0) { // (no key: a program the validator lets through has one)
          for (int64_t r = 0; r < block; ++r) std::fill(yBlock + r * H * DV, yBlock + r * H * DV + DV, 0.0f);
          continue;
        }
        gemm(false, true, block, seen, D, scale, &q.f[((bb * S + s0) * H + h) * D], H * D, keys, KH * D, 0.0f,
             scores.data(), seen);
        for (int64_t r = 0; r < block; ++r)
          normalise(&scores[r * seen], geo.first(s0 + r), visibleOf(s0 + r), seen);
        gemm(false, false, block, DV, seen, 1.0f, scores.data(), seen, values, KH * VW, 0.0f, yBlock, H * DV);
      }
    }
  return Status::ok();
}

// attention_grad
Status Executor::Impl::runAttentionGrad(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  StatusOr<AttentionGeometry> geometry = attentionGeometry(inst, in(0), in(1));
  if (!geometry.isOk())
    return geometry.status();
  attentionGrad(in(0), in(1), in(2), in(3), geometry.value(), out(0), out(1), out(2));
  return Status::ok();
}

} // namespace parax::runtime
