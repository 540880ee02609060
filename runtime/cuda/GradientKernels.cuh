// GradientKernels.cuh - CUDA kernels of the backward pass (the gradient ops
// of --parax-autodiff). Storage fp32 or bf16 (T), math in fp32. Written for
// correctness first: attention's gradient is one thread per query (then
// per key), not tiled; see docs/training.md.

#ifndef PARAX_RUNTIME_CUDA_GRADIENTKERNELS_CUH
#define PARAX_RUNTIME_CUDA_GRADIENTKERNELS_CUH

#include "Kernels.cuh"

namespace parax::runtime {

namespace {

// One block per token: (softmax - onehot(label)) / tokens.
template <typename T>
__global__ void crossEntropyGradKernel(const T *logits, const int32_t *labels, T *d, int64_t V, float invTokens,
                                       int32_t *badToken) {
  __shared__ float partial[kThreads];
  const T *l = logits + blockIdx.x * V;
  T *dr = d + blockIdx.x * V;
  SoftmaxStats stats = softmaxStats(partial, l, V);
  int32_t label = labels[blockIdx.x];
  if (threadIdx.x == 0 && (label < 0 || label >= V)) *badToken = static_cast<int32_t>(blockIdx.x);
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x)
    st(dr, c, (expf(ld(l, c) - stats.max) / stats.sum - (c == label ? 1.0f : 0.0f)) * invTokens);
}

struct RowStats {
  float mean, inv;
};

// A row's mean (0 unless centered: LayerNorm) and 1 / sqrt(variance + eps),
// on every thread of the block.
template <typename T>
__device__ RowStats rowStats(float *partial, const T *xr, int64_t h, float eps, bool centered) {
  float mean = 0;
  if (centered) {
    float s = 0;
    for (int64_t c = threadIdx.x; c < h; c += blockDim.x) s += ld(xr, c);
    mean = blockReduce(partial, s, false) / h;
  }
  float v = 0;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) v += (ld(xr, c) - mean) * (ld(xr, c) - mean);
  return RowStats{mean, rsqrtf(blockReduce(partial, v, false) / h + eps)};
}

// One block per row. With x̂ = (x - mean)·r and g = dy·w:
// dx = r·(g - mean(g) - x̂·mean(g·x̂)) (RMSNorm: no mean).
template <typename T>
__global__ void normGradKernel(const T *x, const T *w, const T *dy, T *dx, int64_t h, float eps, bool centered) {
  __shared__ float partial[kThreads];
  const T *xr = x + blockIdx.x * h, *dyr = dy + blockIdx.x * h;
  RowStats stats = rowStats(partial, xr, h, eps, centered);
  float sumG = 0, dot = 0;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    float g = ld(dyr, c) * ld(w, c);
    sumG += g;
    dot += g * (ld(xr, c) - stats.mean) * stats.inv;
  }
  float meanG = centered ? blockReduce(partial, sumG, false) / h : 0.0f;
  dot = blockReduce(partial, dot, false) / h;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    float xhat = (ld(xr, c) - stats.mean) * stats.inv;
    st(dx + blockIdx.x * h, c, stats.inv * (ld(dyr, c) * ld(w, c) - meanG - xhat * dot));
  }
}

// One block per row: its mean and 1/sqrt(variance + eps), for the weight's
// gradient.
template <typename T> __global__ void rowStatsKernel(const T *x, float *stats, int64_t h, float eps, bool centered) {
  __shared__ float partial[kThreads];
  RowStats s = rowStats(partial, x + blockIdx.x * h, h, eps, centered);
  if (threadIdx.x == 0) {
    stats[2 * blockIdx.x] = s.mean;
    stats[2 * blockIdx.x + 1] = s.inv;
  }
}

// One thread per feature: dw[c] = sum over rows of dy·x̂.
template <typename T>
__global__ void normWeightGradKernel(const T *x, const T *dy, const float *stats, T *dw, int64_t rows, int64_t h) {
  PARAX_GRID_STRIDE(c, h) {
    float sum = 0;
    for (int64_t row = 0; row < rows; ++row)
      sum += ld(dy, row * h + c) * (ld(x, row * h + c) - stats[2 * row]) * stats[2 * row + 1];
    st(dw, c, sum);
  }
}

// One thread per element of y: the sum of x's elements that broadcast from
// it (x and y of one rank; y's dimensions of size 1 summed).
template <typename T> __global__ void sumToKernel(const T *x, T *y, Dims xd, Dims yd, int64_t n, int64_t count) {
  PARAX_GRID_STRIDE(k, n) {
    float sum = 0;
    for (int64_t j = 0; j < count; ++j) {
      // Element j of the summed block: y's coordinates where y is whole,
      // j's digits over the summed dimensions.
      int64_t index = 0, restK = k, restJ = j;
      for (int d = xd.rank - 1, stride = 1; d >= 0; --d) {
        int64_t coord;
        if (yd.d[d] == 1) {
          coord = restJ % xd.d[d];
          restJ /= xd.d[d];
        } else {
          coord = restK % yd.d[d];
          restK /= yd.d[d];
        }
        index += coord * stride;
        stride *= static_cast<int>(xd.d[d]);
      }
      sum += ld(x, index);
    }
    st(y, k, sum);
  }
}

template <typename T> __global__ void geluGradKernel(const T *x, const T *dy, T *dx, int64_t n, bool tanhApprox) {
  PARAX_GRID_STRIDE(k, n) {
    float v = ld(x, k), d;
    if (tanhApprox) {
      float c = 0.7978845608028654f, t = tanhf(c * (v + 0.044715f * v * v * v));
      d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * c * (1.0f + 3.0f * 0.044715f * v * v);
    } else {
      d = 0.5f * (1.0f + erff(v * 0.7071067811865476f)) + v * expf(-0.5f * v * v) * 0.3989422804014327f;
    }
    st(dx, k, ld(dy, k) * d);
  }
}

// The table's gradient: row first + i·stride gets dy's row i (the table
// zeroed first).
template <typename W>
__global__ void positionGradRowsKernel(const W *dy, W *table, int64_t n, int64_t h, int64_t first, int64_t stride) {
  PARAX_GRID_STRIDE(k, n) table[(first + (k / h) * stride) * h + k % h] = dy[k];
}

template <typename T>
__global__ void swigluGradKernel(const T *g, const T *u, const T *dy, T *d, int64_t n, int operand) {
  PARAX_GRID_STRIDE(k, n) {
    float gate = ld(g, k), s = 1.0f / (1.0f + expf(-gate));
    st(d, k, operand == 0 ? ld(dy, k) * ld(u, k) * (s + gate * s * (1.0f - s)) : ld(dy, k) * gate * s);
  }
}

template <typename T>
__global__ void sigmoidGradKernel(const T *x, const T *dy, T *dx, int64_t n) {
  PARAX_GRID_STRIDE(k, n) {
    float s = 1.0f / (1.0f + expf(-ld(x, k)));
    st(dx, k, ld(dy, k) * s * (1.0f - s));
  }
}

// One thread per token: the router's choice made again (routeToken), then
// the gradient through the normalisation and scaling to the chosen scores,
// and through the softmax or sigmoid to the logits. `scratch`: 2E floats a
// token.
template <typename T>
__global__ void routerGradKernel(const float *logits, const T *bias, const T *dweights, float *scratch, T *dlogits,
                                 int64_t tokens, int64_t E, int64_t K, bool sigmoidScores, bool normalize,
                                 float scaling, int64_t groups, int64_t topkGroups) {
  int64_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  float *scores = scratch + t * 2 * E, *ds = scores + E;
  int32_t chosen[64];
  routeToken(logits + t * E, bias, scores, ds, E, K, sigmoidScores, groups, topkGroups, chosen);
  float sum = 1e-20f, dot = 0;
  for (int64_t j = 0; j < K; ++j) {
    sum += scores[chosen[j]];
    dot += ld(dweights, t * K + j) * scores[chosen[j]];
  }
  for (int64_t e = 0; e < E; ++e) ds[e] = 0.0f;
  for (int64_t j = 0; j < K; ++j) {
    float dw = ld(dweights, t * K + j);
    ds[chosen[j]] = scaling * (normalize ? dw / sum - dot / (sum * sum) : dw);
  }
  float mix = 0;
  for (int64_t e = 0; e < E; ++e) mix += ds[e] * scores[e];
  for (int64_t e = 0; e < E; ++e) {
    float s = scores[e];
    st(dlogits, t * E + e, sigmoidScores ? ds[e] * s * (1.0f - s) : s * (ds[e] - mix));
  }
}

// One thread per token: its chosen experts counted (routeToken), into
// `load` [E] (fp32 counts, zeroed first).
template <typename T>
__global__ void routerLoadKernel(const float *logits, const T *bias, float *scratch, float *load, int64_t tokens,
                                 int64_t E, int64_t K, bool sigmoidScores, int64_t groups, int64_t topkGroups) {
  int64_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  float *scores = scratch + t * 2 * E;
  int32_t chosen[64];
  routeToken(logits + t * E, bias, scores, scores + E, E, K, sigmoidScores, groups, topkGroups, chosen);
  for (int64_t j = 0; j < K; ++j) atomicAdd(&load[chosen[j]], 1.0f);
}

// One thread per token: the load-balancing loss's gradient by its logits,
// g_e = coefficient · E · load_e / T², through the softmax or sigmoid.
template <typename T>
__global__ void routerAuxGradKernel(const float *logits, const float *load, T *dlogits, int64_t tokens, int64_t E,
                                    bool sigmoidScores, float coefficient, float wholeTokens) {
  int64_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  const float *l = logits + t * E;
  float scale = coefficient * E / (wholeTokens * wholeTokens);
  if (sigmoidScores) {
    for (int64_t e = 0; e < E; ++e) {
      float s = 1.0f / (1.0f + expf(-l[e]));
      st(dlogits, t * E + e, scale * ld(load, e) * s * (1.0f - s));
    }
    return;
  }
  float m = -INFINITY, sum = 0, mix = 0;
  for (int64_t e = 0; e < E; ++e) m = fmaxf(m, l[e]);
  for (int64_t e = 0; e < E; ++e) sum += expf(l[e] - m);
  for (int64_t e = 0; e < E; ++e) mix += scale * ld(load, e) * expf(l[e] - m) / sum;
  for (int64_t e = 0; e < E; ++e) {
    float s = expf(l[e] - m) / sum;
    st(dlogits, t * E + e, s * (scale * ld(load, e) - mix));
  }
}

// The experts' gradients, one thread per output element with fp32 sums
// (not tiled: a GEMM's flops without a GEMM's reuse; see docs/training.md).
// Pairs p = (token p / K, choice p % K), expert e = idx[p] (outside 0 .. E-1:
// none); perm lists the pairs expert by expert (offset, count on the device,
// as the forward's expertOrderKernel leaves them).
struct ExpertsGradShape {
  int64_t pairs, K, E, H, F;
};

// g, u = x · W_gateᵀ, x · W_upᵀ per pair and f; a = silu(g) · u.
template <typename T>
__global__ void expertsGateUpKernel(const T *x, const int32_t *idx, const T *wg, const T *wu, float *g, float *u,
                                    float *act, ExpertsGradShape s) {
  PARAX_GRID_STRIDE(i, s.pairs * s.F) {
    int64_t p = i / s.F, f = i % s.F, e = idx[p];
    float gs = 0, us = 0;
    if (e >= 0 && e < s.E) {
      const T *xr = x + (p / s.K) * s.H, *gr = wg + (e * s.F + f) * s.H, *ur = wu + (e * s.F + f) * s.H;
      for (int64_t h = 0; h < s.H; ++h) {
        float xv = ld(xr, h);
        gs += xv * ld(gr, h);
        us += xv * ld(ur, h);
      }
    }
    g[i] = gs;
    u[i] = us;
    act[i] = gs / (1.0f + expf(-gs)) * us;
  }
}

// dyDown[p, f] = dy[token] · W_down[e][:, f], per pair and f.
template <typename T>
__global__ void expertsDyDownKernel(const T *dy, const int32_t *idx, const T *wd, float *dyDown,
                                    ExpertsGradShape s) {
  PARAX_GRID_STRIDE(i, s.pairs * s.F) {
    int64_t p = i / s.F, f = i % s.F, e = idx[p];
    float sum = 0;
    if (e >= 0 && e < s.E) {
      const T *dyr = dy + (p / s.K) * s.H;
      for (int64_t c = 0; c < s.H; ++c) sum += ld(dyr, c) * ld(wd, (e * s.H + c) * s.F + f);
    }
    dyDown[i] = sum;
  }
}

// dweights[p] = dyDown[p] · a[p] (= dy · (a · W_downᵀ)), one thread per pair.
template <typename T>
__global__ void expertsWeightGradKernel(const float *dyDown, const float *act, T *dweights, ExpertsGradShape s) {
  PARAX_GRID_STRIDE(p, s.pairs) {
    float dot = 0;
    for (int64_t f = 0; f < s.F; ++f) dot += dyDown[p * s.F + f] * act[p * s.F + f];
    st(dweights, p, dot);
  }
}

// da = weight · dyDown, then g becomes dg = da · u · silu'(g) and u
// becomes du = da · silu(g), per pair and f.
template <typename T>
__global__ void expertsSwigluGradKernel(const float *dyDown, const T *weights, float *g, float *u,
                                        ExpertsGradShape s) {
  PARAX_GRID_STRIDE(i, s.pairs * s.F) {
    float da = dyDown[i] * ld(weights, i / s.F);
    float gate = g[i], sig = 1.0f / (1.0f + expf(-gate));
    g[i] = da * u[i] * (sig + gate * sig * (1.0f - sig));
    u[i] = da * gate * sig;
  }
}

// The stacks' gradients, one thread per element, each summing over its
// expert's pairs: dw_down[e, c, f] = Σ weight · dy[c] · a[f];
// dw_gate[e, f, h] = Σ dg[f] · x[h]; dw_up likewise with du.
template <typename T>
__global__ void expertsStackGradKernel(const T *x, const T *dy, const T *weights, const int32_t *perm,
                                       const int32_t *offset, const int32_t *count, const float *dg,
                                       const float *du, const float *act, T *dwg, T *dwu, T *dwd,
                                       ExpertsGradShape s) {
  int64_t each = s.F * s.H;
  PARAX_GRID_STRIDE(i, 3 * s.E * each) {
    int64_t which = i / (s.E * each), r = i % (s.E * each), e = r / each, at = r % each;
    float sum = 0;
    for (int64_t q = offset[e]; q < offset[e] + count[e]; ++q) {
      int64_t p = perm[q], token = p / s.K;
      if (which == 2) { // down [E, H, F]
        int64_t c = at / s.F, f = at % s.F;
        sum += ld(weights, p) * ld(dy, token * s.H + c) * act[p * s.F + f];
      } else { // gate / up [E, F, H]
        int64_t f = at / s.H, h = at % s.H;
        sum += (which == 0 ? dg : du)[p * s.F + f] * ld(x, token * s.H + h);
      }
    }
    st(which == 0 ? dwg : which == 1 ? dwu : dwd, r, sum);
  }
}

// dx[t, h] = Σ over token t's pairs of dg · W_gate[e][:, h] + du · W_up[e][:, h].
template <typename T>
__global__ void expertsInputGradKernel(const int32_t *idx, const T *wg, const T *wu, const float *dg,
                                       const float *du, T *dx, ExpertsGradShape s) {
  int64_t tokens = s.pairs / s.K;
  PARAX_GRID_STRIDE(i, tokens * s.H) {
    int64_t t = i / s.H, h = i % s.H;
    float sum = 0;
    for (int64_t j = 0; j < s.K; ++j) {
      int64_t p = t * s.K + j, e = idx[p];
      if (e < 0 || e >= s.E) continue;
      for (int64_t f = 0; f < s.F; ++f)
        sum += dg[p * s.F + f] * ld(wg, (e * s.F + f) * s.H + h) + du[p * s.F + f] * ld(wu, (e * s.F + f) * s.H + h);
    }
    st(dx, i, sum);
  }
}

// Where attention's queries sit (as attentionKernel's: query s at past + s
// · stride, seeing keys up to it when causal) and which KV head each local
// query head reads.
constexpr int64_t kMaxGradHead = 256; // head widths the gradient kernels accumulate in registers

struct AttentionShape {
  int64_t B, S, H, D, T, KH, DV;
  bool causal;
  float scale;
  int64_t headOffset, group, past, stride;
  __device__ int64_t visible(int64_t s) const { return causal ? min(T, past + s * stride + 1) : T; }
  __device__ int64_t kvHead(int64_t h) const { return (headOffset + h) / group; }
};

template <typename T>
__device__ float rowDot(const T *a, const T *b, int64_t n) {
  float sum = 0;
  for (int64_t d = 0; d < n; ++d) sum += ld(a, d) * ld(b, d);
  return sum;
}

// One thread per (batch, query, head): the softmax's max and sum over the
// keys it sees, D = sum P·dP, then dq = scale · sum P·(dP - D)·k; the
// statistics (max, sum, D) kept for the keys' kernel.
template <typename T>
__global__ void attentionGradQueryKernel(const T *q, const T *k, const T *v, const T *dout, T *dq, float *stats,
                                         AttentionShape a) {
  PARAX_GRID_STRIDE(row, a.B * a.S * a.H) {
    int64_t h = row % a.H, s = (row / a.H) % a.S, b = row / (a.S * a.H), kh = a.kvHead(h);
    const T *qr = q + row * a.D, *dor = dout + row * a.DV;
    int64_t seen = a.visible(s);
    float m = -INFINITY, l = 0;
    for (int64_t t = 0; t < seen; ++t) {
      float score = a.scale * rowDot(qr, k + ((b * a.T + t) * a.KH + kh) * a.D, a.D);
      float grown = fmaxf(m, score);
      l = l * expf(m - grown) + expf(score - grown);
      m = grown;
    }
    float dotSum = 0;
    for (int64_t t = 0; t < seen; ++t) {
      float p = expf(a.scale * rowDot(qr, k + ((b * a.T + t) * a.KH + kh) * a.D, a.D) - m) / l;
      dotSum += p * rowDot(dor, v + ((b * a.T + t) * a.KH + kh) * a.DV, a.DV);
    }
    float acc[kMaxGradHead];
    for (int64_t d = 0; d < a.D; ++d) acc[d] = 0.0f;
    for (int64_t t = 0; t < seen; ++t) {
      const T *kt = k + ((b * a.T + t) * a.KH + kh) * a.D;
      float p = expf(a.scale * rowDot(qr, kt, a.D) - m) / l;
      float ds = p * (rowDot(dor, v + ((b * a.T + t) * a.KH + kh) * a.DV, a.DV) - dotSum) * a.scale;
      for (int64_t d = 0; d < a.D; ++d) acc[d] += ds * ld(kt, d);
    }
    for (int64_t d = 0; d < a.D; ++d) st(dq + row * a.D, d, acc[d]);
    stats[3 * row] = m;
    stats[3 * row + 1] = l;
    stats[3 * row + 2] = dotSum;
  }
}

// One thread per (batch, key, KV head): over the local query heads that
// read it and the queries that see it, dv += P·do and dk += scale·P·(dP -
// D)·q (no atomics: each thread owns its key's rows).
template <typename T>
__global__ void attentionGradKeyKernel(const T *q, const T *k, const T *v, const T *dout, const float *stats, T *dk,
                                       T *dv, AttentionShape a) {
  PARAX_GRID_STRIDE(row, a.B * a.T * a.KH) {
    int64_t kh = row % a.KH, t = (row / a.KH) % a.T, b = row / (a.T * a.KH);
    const T *kt = k + row * a.D, *vt = v + row * a.DV;
    float dkAcc[kMaxGradHead], dvAcc[kMaxGradHead];
    for (int64_t d = 0; d < a.D; ++d) dkAcc[d] = 0.0f;
    for (int64_t d = 0; d < a.DV; ++d) dvAcc[d] = 0.0f;
    for (int64_t h = 0; h < a.H; ++h) {
      if (a.kvHead(h) != kh) continue;
      for (int64_t s = 0; s < a.S; ++s) {
        if (t >= a.visible(s)) continue;
        int64_t qrow = (b * a.S + s) * a.H + h;
        const T *qr = q + qrow * a.D, *dor = dout + qrow * a.DV;
        float p = expf(a.scale * rowDot(qr, kt, a.D) - stats[3 * qrow]) / stats[3 * qrow + 1];
        float ds = p * (rowDot(dor, vt, a.DV) - stats[3 * qrow + 2]) * a.scale;
        for (int64_t d = 0; d < a.DV; ++d) dvAcc[d] += p * ld(dor, d);
        for (int64_t d = 0; d < a.D; ++d) dkAcc[d] += ds * ld(qr, d);
      }
    }
    for (int64_t d = 0; d < a.D; ++d) st(dk + row * a.D, d, dkAcc[d]);
    for (int64_t d = 0; d < a.DV; ++d) st(dv + row * a.DV, d, dvAcc[d]);
  }
}

// dtable (fp32, zeroed) += dy's rows at their ids (ids outside the rank's
// rows add nothing; outside the whole vocabulary: badToken, unless the
// rows are one rank's part).
template <typename T>
__global__ void embeddingGradKernel(const int32_t *ids, const T *dy, float *dtable, int64_t tokens, int64_t h,
                                    int64_t rows, int64_t offset, bool split, int32_t *badToken) {
  PARAX_GRID_STRIDE(k, tokens * h) {
    int64_t token = k / h, c = k % h;
    int64_t id = ids[token] - offset;
    if (id < 0 || id >= rows) {
      if (!split && c == 0) *badToken = static_cast<int32_t>(token);
      continue;
    }
    atomicAdd(dtable + id * h + c, ld(dy, k));
  }
}

template <typename T> __global__ void fromFloatKernel(const float *x, T *y, int64_t n) {
  PARAX_GRID_STRIDE(k, n) st(y, k, x[k]);
}

} // namespace

} // namespace parax::runtime

#endif // PARAX_RUNTIME_CUDA_GRADIENTKERNELS_CUH
