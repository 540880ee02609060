// MoeKernels.cpp - CPU kernels of the router, the routed experts and their
// gradients.

#include "MoeKernels.h"
#include "Gemm.h"

#include "parax/runtime/ExpertChoice.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace parax::runtime {

namespace {

float sigmoidOf(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// One token's scores: the softmax or sigmoid of its logits.
void scoresOf(const float *logits, int64_t E, bool sigmoid, std::vector<double> &scores) {
  scores.assign(E, 0.0);
  if (sigmoid) {
    for (int64_t e = 0; e < E; ++e) scores[e] = 1.0 / (1.0 + std::exp(-logits[e]));
    return;
  }
  double m = *std::max_element(logits, logits + E), sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += (scores[e] = std::exp(logits[e] - m));
  for (double &s : scores) s /= sum;
}

// One token's scores and its chosen experts, best first: the top-k of
// scores + bias, within the kept groups (chooseExperts).
void route(const float *logits, int64_t E, const Tensor *bias, const Routing &r, std::vector<double> &scores,
           std::vector<int64_t> &chosen) {
  scoresOf(logits, E, r.sigmoid, scores);
  std::vector<double> choice(E);
  for (int64_t e = 0; e < E; ++e) choice[e] = scores[e] + (bias ? bias->f[e] : 0.0);
  chosen.resize(r.topK);
  chooseExperts(choice.data(), E, r.topK, r.groups, r.topkGroups, chosen.data());
}

// Every token's logits x · gateᵀ, [tokens, E].
std::vector<float> logitsOf(const Tensor &x, const Tensor &gate) {
  int64_t h = x.shape.back(), tokens = x.numel() / h, E = gate.shape[0];
  std::vector<float> logits(tokens * E);
  gemm(false, true, tokens, E, h, 1.0f, x.f.data(), h, gate.f.data(), h, 0.0f, logits.data(), E);
  return logits;
}

// The (token, choice) pairs each expert serves, in order; a choice outside
// 0 .. E-1 (an unused dispatch row) serves none.
std::vector<std::vector<int64_t>> pairsOfExperts(const Tensor &indices, int64_t E) {
  std::vector<std::vector<int64_t>> pairs(E);
  for (int64_t p = 0; p < indices.numel(); ++p) {
    int64_t e = indices.i[p];
    if (e >= 0 && e < E) pairs[e].push_back(p);
  }
  return pairs;
}

// One expert's rows of `x` (each pair's token), [n, h].
void gatherRows(const Tensor &x, const std::vector<int64_t> &pairs, int64_t K, std::vector<float> &rows) {
  int64_t h = x.shape.back(), n = static_cast<int64_t>(pairs.size());
  rows.resize(n * h);
  for (int64_t r = 0; r < n; ++r)
    std::copy(&x.f[pairs[r] / K * h], &x.f[(pairs[r] / K + 1) * h], &rows[r * h]);
}

} // namespace

void router(const Tensor &x, const Tensor &gate, const Tensor *bias, const Routing &routing, Tensor &weights,
            Tensor &indices) {
  int64_t E = gate.shape[0], K = routing.topK, tokens = x.numel() / x.shape.back();
  std::vector<float> logits = logitsOf(x, gate);
  std::vector<double> scores;
  std::vector<int64_t> chosen;
  for (int64_t t = 0; t < tokens; ++t) {
    route(&logits[t * E], E, bias, routing, scores, chosen);
    double sum = 0;
    for (int64_t e : chosen) sum += scores[e];
    for (int64_t j = 0; j < K; ++j) {
      double weight = scores[chosen[j]];
      if (routing.normalize) weight /= (sum + 1e-20);
      weights.f[t * K + j] = static_cast<float>(weight * routing.scaling);
      indices.i[t * K + j] = static_cast<int32_t>(chosen[j]);
    }
  }
}

void routerGrad(const Tensor &x, const Tensor &gate, const Tensor *bias, const Tensor &dweights,
                const Routing &routing, Tensor &dlogits) {
  int64_t E = gate.shape[0], K = routing.topK, tokens = x.numel() / x.shape.back();
  std::vector<float> logits = logitsOf(x, gate);
  std::vector<double> scores, dscores(E);
  std::vector<int64_t> chosen;
  for (int64_t t = 0; t < tokens; ++t) {
    route(&logits[t * E], E, bias, routing, scores, chosen);
    const float *dw = &dweights.f[t * K];
    // Through the normalisation and the scaling to the chosen scores.
    double sum = 1e-20, dot = 0;
    for (int64_t j = 0; j < K; ++j) {
      sum += scores[chosen[j]];
      dot += dw[j] * scores[chosen[j]];
    }
    std::fill(dscores.begin(), dscores.end(), 0.0);
    for (int64_t j = 0; j < K; ++j)
      dscores[chosen[j]] = routing.scaling * (routing.normalize ? dw[j] / sum - dot / (sum * sum) : dw[j]);
    // Through the scores to the logits.
    double mix = 0;
    for (int64_t e = 0; e < E; ++e) mix += dscores[e] * scores[e];
    for (int64_t e = 0; e < E; ++e) {
      double s = scores[e];
      dlogits.f[t * E + e] =
          static_cast<float>(routing.sigmoid ? dscores[e] * s * (1.0 - s) : s * (dscores[e] - mix));
    }
  }
}

void routerLoad(const Tensor &x, const Tensor &gate, const Tensor *bias, const Routing &routing, bool sumScores,
                Tensor &load) {
  int64_t E = gate.shape[0], tokens = x.numel() / x.shape.back();
  // Per sequence (load [B, E]): each sequence's tokens into its row, the
  // scores normalised.
  bool perSequence = load.shape.size() == 2;
  int64_t perRow = perSequence ? tokens / load.shape[0] : tokens;
  std::vector<float> logits = logitsOf(x, gate);
  std::vector<double> scores;
  std::vector<int64_t> chosen;
  std::vector<double> count(load.numel(), 0.0);
  for (int64_t t = 0; t < tokens; ++t) {
    double *row = &count[t / perRow * E];
    if (sumScores) {
      scoresOf(&logits[t * E], E, routing.sigmoid, scores);
      double sum = 0;
      for (double s : scores) sum += s;
      for (int64_t e = 0; e < E; ++e) row[e] += perSequence ? scores[e] / sum : scores[e];
      continue;
    }
    route(&logits[t * E], E, bias, routing, scores, chosen);
    for (int64_t e : chosen) row[e] += 1;
  }
  for (size_t e = 0; e < count.size(); ++e) load.f[e] = static_cast<float>(count[e]);
}

double balanceLoss(const Tensor &load, const Tensor &scores, double coefficient, int64_t tokens, int64_t sequences) {
  double T = static_cast<double>(tokens), sum = 0;
  for (size_t e = 0; e < load.f.size(); ++e) sum += static_cast<double>(load.f[e]) * scores.f[e];
  return coefficient * static_cast<double>(load.shape.back()) * sum / (T * T * static_cast<double>(sequences));
}

void routerAuxGrad(const Tensor &x, const Tensor &gate, const Tensor &load, bool sigmoid, double coefficient,
                   int64_t tokens, int64_t sequences, Tensor &dlogits) {
  int64_t E = gate.shape[0], rows = x.numel() / x.shape.back();
  bool perSequence = load.shape.size() == 2;
  int64_t perRow = perSequence ? rows / load.shape[0] : rows;
  std::vector<float> logits = logitsOf(x, gate);
  std::vector<double> g(load.numel()), scores;
  double T = static_cast<double>(tokens), scale = coefficient * E / (T * T * static_cast<double>(sequences));
  for (size_t e = 0; e < g.size(); ++e) g[e] = scale * load.f[e];
  for (int64_t t = 0; t < rows; ++t) {
    const double *gt = &g[t / perRow * E];
    scoresOf(&logits[t * E], E, sigmoid, scores);
    // Per sequence, through the normalisation s / Σ_j s_j first (a no-op
    // for softmax's scores, which sum to 1).
    double sum = 1, mix = 0;
    if (perSequence && sigmoid) {
      sum = 0;
      for (double s : scores) sum += s;
    }
    for (int64_t e = 0; e < E; ++e) mix += gt[e] * scores[e] / sum;
    for (int64_t e = 0; e < E; ++e) {
      double s = scores[e];
      double ds = perSequence && sigmoid ? (gt[e] - mix) / sum : gt[e];
      dlogits.f[t * E + e] = static_cast<float>(sigmoid ? ds * s * (1.0 - s) : s * (gt[e] - mix));
    }
  }
}

// Each expert's pairs at once: their rows gathered, the gate, up and down
// projections as three sgemms (each expert's weights read once, not once a
// pair), the results kept per pair; then each token sums its pairs'
// weighted rows in choice order.
void experts(const Tensor &x, const Tensor &weights, const Tensor &indices, const Tensor &wGate, const Tensor &wUp,
             const Tensor &wDown, Tensor &y) {
  int64_t h = x.shape.back(), tokens = x.numel() / h;
  int64_t K = indices.shape.back(), E = wGate.shape[0], F = wGate.shape[1];
  std::vector<std::vector<int64_t>> pairsOf = pairsOfExperts(indices, E);
  std::vector<float> rows, g, u, done(tokens * K * h, 0.0f);
  for (int64_t e = 0; e < E; ++e) {
    int64_t n = static_cast<int64_t>(pairsOf[e].size());
    if (n == 0) continue;
    gatherRows(x, pairsOf[e], K, rows);
    g.resize(n * F);
    u.resize(n * F);
    gemm(false, true, n, F, h, 1.0f, rows.data(), h, &wGate.f[e * F * h], h, 0.0f, g.data(), F);
    gemm(false, true, n, F, h, 1.0f, rows.data(), h, &wUp.f[e * F * h], h, 0.0f, u.data(), F);
    for (int64_t k = 0; k < n * F; ++k) g[k] = g[k] * sigmoidOf(g[k]) * u[k];
    gemm(false, true, n, h, F, 1.0f, g.data(), F, &wDown.f[e * h * F], F, 0.0f, rows.data(), h);
    for (int64_t r = 0; r < n; ++r) std::copy(&rows[r * h], &rows[(r + 1) * h], &done[pairsOf[e][r] * h]);
  }
  std::fill(y.f.begin(), y.f.end(), 0.0f);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < K; ++j) {
      int64_t e = indices.i[t * K + j];
      if (e < 0 || e >= E) continue;
      float weight = weights.f[t * K + j];
      for (int64_t c = 0; c < h; ++c) y.f[t * h + c] += weight * done[(t * K + j) * h + c];
    }
}

// Per expert, its pairs' rows as one batch: the forward's g, u and a =
// silu(g)·u again; dy·w_down, whose dot with a is the router weight's
// gradient (= dy·o, o = a·w_downᵀ) and which scaled by the weight is da;
// do = weight·dy, dw_down = doᵀ·a, dg and du through swiglu, dw_gate =
// dgᵀ·x, dw_up = duᵀ·x, and dx = dg·w_gate + du·w_up added to each pair's
// token: eight GEMMs an expert.
void expertsGrad(const Tensor &x, const Tensor &weights, const Tensor &indices, const Tensor &wGate,
                 const Tensor &wUp, const Tensor &wDown, const Tensor &dy, Tensor &dx, Tensor &dweights,
                 Tensor &dwGate, Tensor &dwUp, Tensor &dwDown) {
  int64_t h = x.shape.back();
  int64_t K = indices.shape.back(), E = wGate.shape[0], F = wGate.shape[1];
  std::vector<std::vector<int64_t>> pairsOf = pairsOfExperts(indices, E);
  for (Tensor *t : {&dx, &dweights, &dwGate, &dwUp, &dwDown}) std::fill(t->f.begin(), t->f.end(), 0.0f);
  std::vector<float> rows, dyRows, g, u, a, o, da;
  for (int64_t e = 0; e < E; ++e) {
    const std::vector<int64_t> &pairs = pairsOf[e];
    int64_t n = static_cast<int64_t>(pairs.size());
    if (n == 0) continue;
    const float *wg = &wGate.f[e * F * h], *wu = &wUp.f[e * F * h], *wd = &wDown.f[e * h * F];
    gatherRows(x, pairs, K, rows);
    gatherRows(dy, pairs, K, dyRows);
    g.resize(n * F);
    u.resize(n * F);
    a.resize(n * F);
    o.resize(n * h);
    da.resize(n * F);
    gemm(false, true, n, F, h, 1.0f, rows.data(), h, wg, h, 0.0f, g.data(), F);
    gemm(false, true, n, F, h, 1.0f, rows.data(), h, wu, h, 0.0f, u.data(), F);
    for (int64_t k = 0; k < n * F; ++k) a[k] = g[k] * sigmoidOf(g[k]) * u[k];
    // dy · w_down [n, F]: the router weight's gradient is its dot with a
    // (dy · (a · w_downᵀ), without that product), and da is it scaled by
    // the pair's weight.
    gemm(false, false, n, F, h, 1.0f, dyRows.data(), h, wd, F, 0.0f, da.data(), F);
    for (int64_t r = 0; r < n; ++r) {
      double dot = 0;
      for (int64_t f = 0; f < F; ++f) dot += static_cast<double>(da[r * F + f]) * a[r * F + f];
      dweights.f[pairs[r]] = static_cast<float>(dot);
      float weight = weights.f[pairs[r]];
      for (int64_t f = 0; f < F; ++f) da[r * F + f] *= weight;
      for (int64_t c = 0; c < h; ++c) dyRows[r * h + c] *= weight; // now do
    }
    gemm(true, false, h, F, n, 1.0f, dyRows.data(), h, a.data(), F, 0.0f, &dwDown.f[e * h * F], F);
    for (int64_t k = 0; k < n * F; ++k) {
      float s = sigmoidOf(g[k]);
      float dg = da[k] * u[k] * (s + g[k] * s * (1.0f - s)), du = da[k] * g[k] * s;
      g[k] = dg; // g now dg, u now du
      u[k] = du;
    }
    gemm(true, false, F, h, n, 1.0f, g.data(), F, rows.data(), h, 0.0f, &dwGate.f[e * F * h], h);
    gemm(true, false, F, h, n, 1.0f, u.data(), F, rows.data(), h, 0.0f, &dwUp.f[e * F * h], h);
    gemm(false, false, n, h, F, 1.0f, g.data(), F, wg, h, 0.0f, o.data(), h);
    gemm(false, false, n, h, F, 1.0f, u.data(), F, wu, h, 1.0f, o.data(), h);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < h; ++c) dx.f[pairs[r] / K * h + c] += o[r * h + c];
  }
}

} // namespace parax::runtime
