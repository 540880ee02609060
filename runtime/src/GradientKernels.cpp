// GradientKernels.cpp - CPU kernels of the backward pass. Semantics: the
// gradient ops of docs/dialect/ParaxDialect.md.

#include "GradientKernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

namespace parax::runtime {

namespace {

// Rows of the leading dims and the last dim.
std::pair<int64_t, int64_t> rowsCols(const Tensor &t) {
  int64_t cols = t.shape.empty() ? 1 : t.shape.back();
  return {cols ? t.numel() / cols : 0, cols};
}

double inverseRms(const float *x, int64_t h, double eps) {
  double sum = 0;
  for (int64_t c = 0; c < h; ++c) sum += double(x[c]) * x[c];
  return 1.0 / std::sqrt(sum / h + eps);
}

} // namespace

void crossEntropyGrad(const Tensor &logits, const Tensor &labels, int64_t tokens, Tensor &dlogits) {
  auto [rows, V] = rowsCols(logits);
  for (int64_t t = 0; t < rows; ++t) {
    const float *l = &logits.f[t * V];
    float *d = &dlogits.f[t * V];
    double m = *std::max_element(l, l + V), sum = 0;
    for (int64_t c = 0; c < V; ++c) sum += std::exp(l[c] - m);
    for (int64_t c = 0; c < V; ++c) d[c] = static_cast<float>(std::exp(l[c] - m) / sum / tokens);
    d[labels.i[t]] -= 1.0f / tokens; // (labels checked by the forward's rule: in range)
  }
}

void linearWeightGrad(const Tensor &x, const Tensor &dy, bool transposeW, Tensor &dw) {
  auto [m, k] = rowsCols(x);
  int64_t n = dy.shape.back();
  if (transposeW) // dW [n, k] = dyᵀ · x
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, k, m, 1.0f, dy.f.data(), n, x.f.data(), k, 0.0f,
                dw.f.data(), k);
  else // dW [k, n] = xᵀ · dy
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, k, n, m, 1.0f, x.f.data(), k, dy.f.data(), n, 0.0f,
                dw.f.data(), n);
}

void rmsNormGrad(const Tensor &x, const Tensor &w, const Tensor &dy, double eps, Tensor &dx) {
  auto [rows, h] = rowsCols(x);
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = &x.f[r * h], *dyr = &dy.f[r * h];
    double inv = inverseRms(xr, h, eps), dot = 0;
    for (int64_t c = 0; c < h; ++c) dot += double(dyr[c]) * w.f[c] * xr[c];
    dot /= h;
    for (int64_t c = 0; c < h; ++c)
      dx.f[r * h + c] = static_cast<float>(inv * dyr[c] * w.f[c] - xr[c] * inv * inv * inv * dot);
  }
}

void rmsNormWeightGrad(const Tensor &x, const Tensor &dy, double eps, Tensor &dw) {
  auto [rows, h] = rowsCols(x);
  std::vector<double> sum(h, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = &x.f[r * h], *dyr = &dy.f[r * h];
    double inv = inverseRms(xr, h, eps);
    for (int64_t c = 0; c < h; ++c) sum[c] += double(dyr[c]) * xr[c] * inv;
  }
  for (int64_t c = 0; c < h; ++c) dw.f[c] = static_cast<float>(sum[c]);
}

void swigluGrad(const Tensor &gate, const Tensor &up, const Tensor &dy, int operand, Tensor &d) {
  for (int64_t k = 0; k < gate.numel(); ++k) {
    float g = gate.f[k], s = 1.0f / (1.0f + std::exp(-g));
    d.f[k] = operand == 0 ? dy.f[k] * up.f[k] * (s + g * s * (1.0f - s)) : dy.f[k] * g * s;
  }
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
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, block, seen, D, geometry.scale, qBlock, H * D, keys,
                    KH * D, 0.0f, p.data(), seen);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, block, seen, DV, 1.0f, doBlock, H * DV, values,
                    KH * DV, 0.0f, dp.data(), seen);
        for (int64_t r = 0; r < block; ++r) {
          float *row = &p[r * seen], *drow = &dp[r * seen];
          int64_t visible = geometry.visible(s0 + r);
          float maxScore = -INFINITY;
          for (int64_t t = 0; t < visible; ++t) maxScore = std::max(maxScore, row[t]);
          double sum = 0;
          for (int64_t t = 0; t < visible; ++t) sum += row[t] = std::exp(row[t] - maxScore);
          double dot = 0;
          for (int64_t t = 0; t < visible; ++t) {
            row[t] = static_cast<float>(row[t] / sum);
            dot += double(row[t]) * drow[t];
          }
          for (int64_t t = 0; t < visible; ++t) drow[t] = static_cast<float>(row[t] * (drow[t] - dot));
          std::fill(row + visible, row + seen, 0.0f);
          std::fill(drow + visible, drow + seen, 0.0f);
        }
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, seen, DV, block, 1.0f, p.data(), seen, doBlock, H * DV,
                    1.0f, dvalues, KH * DV);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, block, D, seen, geometry.scale, dp.data(), seen, keys,
                    KH * D, 0.0f, dqBlock, H * D);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, seen, D, block, geometry.scale, dp.data(), seen, qBlock,
                    H * D, 1.0f, dkeys, KH * D);
      }
    }
}

void embeddingGrad(const Tensor &ids, const Tensor &dy, int64_t offset, Tensor &dtable) {
  int64_t rows = dtable.shape[0], h = dtable.shape[1];
  std::fill(dtable.f.begin(), dtable.f.end(), 0.0f);
  for (int64_t t = 0; t < ids.numel(); ++t) {
    int64_t id = ids.i[t] - offset;
    if (id < 0 || id >= rows) continue;
    for (int64_t c = 0; c < h; ++c) dtable.f[id * h + c] += dy.f[t * h + c];
  }
}

} // namespace parax::runtime
