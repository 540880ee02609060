// GradientKernels.cpp - CPU kernels of the backward pass. Semantics: the
// gradient ops of docs/dialect/ParaxDialect.md.

#include "GradientKernels.h"

#include "VectorMath.h"
#include "Gemm.h"

#include <algorithm>
#include <cmath>

namespace parax::runtime {

namespace {

// Rows of the leading dims and the last dim.
std::pair<int64_t, int64_t> rowsCols(const Tensor &t) {
  int64_t cols = t.shape.empty() ? 1 : t.shape.back();
  return {cols ? t.numel() / cols : 0, cols};
}

// A row's mean (0 unless centered) and 1 / sqrt(variance + eps).
std::pair<double, double> rowStats(const float *x, int64_t h, double eps, bool centered) {
  double mean = 0, var = 0;
  if (centered) {
    for (int64_t c = 0; c < h; ++c) mean += x[c];
    mean /= h;
  }
  for (int64_t c = 0; c < h; ++c) var += (x[c] - mean) * (x[c] - mean);
  return {mean, 1.0 / std::sqrt(var / h + eps)};
}

} // namespace

RowExp rowExp(const float *x, int64_t n) {
  float shift = largest(x, n);
  return RowExp{shift, expSum(x, n, shift)};
}

void crossEntropyGrad(const Tensor &logits, const Tensor &labels, double divisor, std::optional<int32_t> ignore,
                      Tensor &dlogits, const Tensor *lse, int64_t offset) {
  auto [rows, V] = rowsCols(logits);
  for (int64_t t = 0; t < rows; ++t) {
    const float *l = &logits.f[t * V];
    float *d = &dlogits.f[t * V];
    if (ignore && labels.i[t] == *ignore) { // a token the loss does not count
      std::fill(d, d + V, 0.0f);
      continue;
    }
    // softmax = exp(l - logsumexp): the row's own, or (vocab-parallel: this
    // rank's columns `offset ..` of the vocabulary) the whole row's.
    float shift = lse ? lse->f[t] : largest(l, V);
    std::copy(l, l + V, d);
    double sum = expShifted(d, V, shift); // exp(l - shift), in place
    float scale = static_cast<float>(1.0 / ((lse ? 1.0 : sum) * divisor));
    for (int64_t c = 0; c < V; ++c) d[c] *= scale;
    if (int64_t label = labels.i[t] - offset; label >= 0 && label < V) // (checked by the caller: in range)
      d[label] -= static_cast<float>(1.0 / divisor);
  }
}

void linearWeightGrad(const Tensor &x, const Tensor &dy, bool transposeW, Tensor &dw) {
  auto [m, k] = rowsCols(x);
  int64_t n = dy.shape.back();
  if (transposeW) // dW [n, k] = dyᵀ · x
    gemm(true, false, n, k, m, 1.0f, dy.f.data(), n, x.f.data(), k, 0.0f, dw.f.data(), k);
  else // dW [k, n] = xᵀ · dy
    gemm(true, false, k, n, m, 1.0f, x.f.data(), k, dy.f.data(), n, 0.0f, dw.f.data(), n);
}

// With x̂ = (x - mean)·r and g = dy·w: dx = r·(g - mean(g) - x̂·mean(g·x̂))
// (RMSNorm: no mean, and r·(g - x̂·mean(g·x̂)) is r·g - x·r³·mean(g·x)); w
// is the weight plus `offset` (Gemma's 1 + w).
void normGrad(const Tensor &x, const Tensor &w, const Tensor &dy, double eps, bool centered, Tensor &dx,
              double offset) {
  auto [rows, h] = rowsCols(x);
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = &x.f[r * h], *dyr = &dy.f[r * h];
    auto [mean, inv] = rowStats(xr, h, eps, centered);
    double meanG = 0, dot = 0;
    for (int64_t c = 0; c < h; ++c) {
      double g = double(dyr[c]) * (w.f[c] + offset);
      meanG += g;
      dot += g * (xr[c] - mean) * inv;
    }
    meanG = centered ? meanG / h : 0.0;
    dot /= h;
    for (int64_t c = 0; c < h; ++c)
      dx.f[r * h + c] =
          static_cast<float>(inv * (double(dyr[c]) * (w.f[c] + offset) - meanG - (xr[c] - mean) * inv * dot));
  }
}

void normWeightGrad(const Tensor &x, const Tensor &dy, double eps, bool centered, Tensor &dw) {
  auto [rows, h] = rowsCols(x);
  std::vector<double> sum(h, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = &x.f[r * h], *dyr = &dy.f[r * h];
    auto [mean, inv] = rowStats(xr, h, eps, centered);
    for (int64_t c = 0; c < h; ++c) sum[c] += double(dyr[c]) * (xr[c] - mean) * inv;
  }
  for (int64_t c = 0; c < h; ++c) dw.f[c] = static_cast<float>(sum[c]);
}

void sumTo(const Tensor &x, Tensor &y) {
  std::vector<double> sum(y.numel(), 0.0);
  for (int64_t k = 0; k < x.numel(); ++k) {
    int64_t index = 0, stride = 1, rest = k;
    for (int64_t d = static_cast<int64_t>(x.shape.size()) - 1; d >= 0; --d) {
      int64_t coord = rest % x.shape[d];
      rest /= x.shape[d];
      if (y.shape[d] != 1) index += coord * stride;
      stride *= y.shape[d];
    }
    sum[index] += x.f[k];
  }
  for (int64_t k = 0; k < y.numel(); ++k) y.f[k] = static_cast<float>(sum[k]);
}

void geluGrad(const Tensor &x, const Tensor &dy, bool tanhApprox, Tensor &dx) {
  for (int64_t k = 0; k < x.numel(); ++k) {
    double v = x.f[k], d;
    if (tanhApprox) {
      double c = 0.7978845608028654, t = std::tanh(c * (v + 0.044715 * v * v * v));
      d = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * c * (1 + 3 * 0.044715 * v * v);
    } else {
      d = 0.5 * (1 + std::erf(v * 0.7071067811865476)) + v * std::exp(-0.5 * v * v) * 0.3989422804014327;
    }
    dx.f[k] = static_cast<float>(dy.f[k] * d);
  }
}

void swigluGrad(const Tensor &gate, const Tensor &up, const Tensor &dy, int operand, Tensor &d) {
  swigluGradient(gate.f.data(), up.f.data(), dy.f.data(), operand, d.f.data(), gate.numel());
}

// Per batch and query head, blocks of queries: the scores and their softmax
// P again (as the forward computes them), then dv += Pᵀ·do, dP = do·vᵀ,
// dS = P ∘ (dP - rowsum(P ∘ dP)), dq = scale·dS·k, dk += scale·dSᵀ·q
// (sgemm each; every query head adds into its KV head's dk, dv).
void attentionGrad(const Tensor &q, const Tensor &k, const Tensor &v, const Tensor &dout,
                   const AttentionGeometry &geometry, Tensor &dq, Tensor &dk, Tensor &dv) {
  int64_t B = q.shape[0], S = q.shape[1], H = q.shape[2], D = q.shape[3];
  int64_t T = k.shape[1], KH = k.shape[2], DV = v.shape[3];
  std::fill(dk.f.begin(), dk.f.end(), 0.0f);
  std::fill(dv.f.begin(), dv.f.end(), 0.0f);
  constexpr int64_t kBlock = 64;
  std::vector<float> p(std::min(kBlock, S) * T), dp(std::min(kBlock, S) * T);
  std::vector<float> capped(geometry.softcap > 0 ? T : 0); // a row's capped scores
  for (int64_t bb = 0; bb < B; ++bb)
    for (int64_t h = 0; h < H; ++h) {
      int64_t kh = (geometry.headOffset + h) / geometry.group;
      const float *keys = &k.f[(bb * T * KH + kh) * D], *values = &v.f[(bb * T * KH + kh) * DV];
      float *dkeys = &dk.f[(bb * T * KH + kh) * D], *dvalues = &dv.f[(bb * T * KH + kh) * DV];
      for (int64_t s0 = 0; s0 < S; s0 += kBlock) {
        int64_t block = std::min(kBlock, S - s0);
        int64_t seen = geometry.visible(s0 + block - 1);
        const float *qBlock = &q.f[((bb * S + s0) * H + h) * D], *doBlock = &dout.f[((bb * S + s0) * H + h) * DV];
        float *dqBlock = &dq.f[((bb * S + s0) * H + h) * D];
        if (seen <= 0) {
          for (int64_t r = 0; r < block; ++r) std::fill(dqBlock + r * H * D, dqBlock + r * H * D + D, 0.0f);
          continue;
        }
        gemm(false, true, block, seen, D, geometry.scale, qBlock, H * D, keys, KH * D, 0.0f, p.data(), seen);
        gemm(false, true, block, seen, DV, 1.0f, doBlock, H * DV, values, KH * DV, 0.0f, dp.data(), seen);
        for (int64_t r = 0; r < block; ++r) {
          float *row = &p[r * seen], *drow = &dp[r * seen];
          int64_t visible = geometry.visible(s0 + r), first = geometry.first(s0 + r);
          geometry.capScores(row + first, visible - first);
          if (geometry.softcap > 0)
            std::copy(row + first, row + visible, capped.begin() + first);
          float maxScore = -INFINITY;
          for (int64_t t = first; t < visible; ++t) maxScore = std::max(maxScore, row[t]);
          double sum = 0;
          for (int64_t t = first; t < visible; ++t) sum += row[t] = std::exp(row[t] - maxScore);
          double dot = 0;
          for (int64_t t = first; t < visible; ++t) {
            row[t] = static_cast<float>(row[t] / sum);
            dot += double(row[t]) * drow[t];
          }
          for (int64_t t = first; t < visible; ++t) drow[t] = static_cast<float>(row[t] * (drow[t] - dot));
          // Soft-capped: the capped score's gradient times 1 - (capped / c)^2.
          if (geometry.softcap > 0)
            for (int64_t t = first; t < visible; ++t) {
              double c = capped[t] / geometry.softcap;
              drow[t] = static_cast<float>(drow[t] * (1 - c * c));
            }
          std::fill(row, row + first, 0.0f);
          std::fill(drow, drow + first, 0.0f);
          std::fill(row + visible, row + seen, 0.0f);
          std::fill(drow + visible, drow + seen, 0.0f);
        }
        gemm(true, false, seen, DV, block, 1.0f, p.data(), seen, doBlock, H * DV, 1.0f, dvalues, KH * DV);
        gemm(false, false, block, D, seen, geometry.scale, dp.data(), seen, keys, KH * D, 0.0f, dqBlock, H * D);
        gemm(true, false, seen, D, block, geometry.scale, dp.data(), seen, qBlock, H * D, 1.0f, dkeys, KH * D);
      }
    }
}

void embeddingGrad(const Tensor &ids, const Tensor &dy, int64_t offset, Tensor &dtable, float scale) {
  int64_t rows = dtable.shape[0], h = dtable.shape[1];
  std::fill(dtable.f.begin(), dtable.f.end(), 0.0f);
  for (int64_t t = 0; t < ids.numel(); ++t) {
    int64_t id = ids.i[t] - offset;
    if (id < 0 || id >= rows) continue;
    for (int64_t c = 0; c < h; ++c) dtable.f[id * h + c] += dy.f[t * h + c] * scale;
  }
}

} // namespace parax::runtime
