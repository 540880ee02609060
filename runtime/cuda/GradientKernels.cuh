// GradientKernels.cuh - CUDA kernels of the backward pass (the gradient ops
// of --parax-autodiff). Storage fp32 or bf16 (T), math in fp32. Attention's
// gradient is tiled (flash-style), on tensor cores in bf16; the experts'
// GEMMs go through cuBLAS (CudaExecutor.cu), around these kernels' row
// gathers and elementwise steps; see docs/cuda.md.

#ifndef PARAX_RUNTIME_CUDA_GRADIENTKERNELS_CUH
#define PARAX_RUNTIME_CUDA_GRADIENTKERNELS_CUH

#include "Kernels.cuh"

namespace parax::runtime {

namespace {

// One block per token: (softmax - onehot(label)) / tokens, the tokens
// `invTokens` or, with `count` (label_count's), 1 / count; an
// ignored label's row 0.
// Vocab-parallel (`part.lse`): exp(logits - lse) on this rank's columns,
// less 1 at the label where this rank holds it.
template <typename T>
__global__ void crossEntropyGradKernel(const T *logits, const int32_t *labels, T *d, int64_t V, float invTokens,
                                       int32_t *badToken, LabelRule rule, const float *count, VocabPart part) {
  __shared__ float partial[kThreads];
  const T *l = logits + blockIdx.x * V;
  T *dr = d + blockIdx.x * V;
  int32_t label = labels[blockIdx.x];
  if (rule.skips(label)) { // (the whole block: no barrier is left waiting)
    for (int64_t c = threadIdx.x; c < V; c += blockDim.x) st(dr, c, 0.0f);
    return;
  }
  SoftmaxStats stats{0.0f, 1.0f};
  if (part.lse) stats.max = part.lse[blockIdx.x]; // (the same for the whole block)
  else stats = softmaxStats(partial, l, V);
  const int64_t vocab = part.lse ? part.vocab : V, local = label - part.offset;
  if (threadIdx.x == 0 && (label < 0 || label >= vocab)) *badToken = static_cast<int32_t>(blockIdx.x);
  float scale = (count ? 1.0f / (*count > 0 ? *count : 1.0f) : invTokens) * rule.weight;
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x)
    st(dr, c, (expf(ld(l, c) - stats.max) / stats.sum - (c == local ? 1.0f : 0.0f)) * scale);
}

// One block per row. With x̂ = (x - mean)·r and g = dy·w:
// dx = r·(g - mean(g) - x̂·mean(g·x̂)) (RMSNorm: no mean).
template <typename T>
__global__ void normGradKernel(const T *x, const T *w, const T *dy, T *dx, int64_t h, float eps, bool centered,
                               float offset) {
  __shared__ float partial[kThreads];
  __shared__ double sums[kThreads];
  const T *xr = x + blockIdx.x * h, *dyr = dy + blockIdx.x * h;
  RowStats stats = rowStats(sums, xr, h, eps, centered);
  float sumG = 0, dot = 0;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    float g = ld(dyr, c) * (ld(w, c) + offset);
    sumG += g;
    dot += g * (ld(xr, c) - stats.mean) * stats.inv;
  }
  float meanG = centered ? blockReduce(partial, sumG, false) / h : 0.0f;
  dot = blockReduce(partial, dot, false) / h;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    float xhat = (ld(xr, c) - stats.mean) * stats.inv;
    st(dx + blockIdx.x * h, c, stats.inv * (ld(dyr, c) * (ld(w, c) + offset) - meanG - xhat * dot));
  }
}

// One block per row: its mean and 1/sqrt(variance + eps), for the weight's
// gradient.
template <typename T> __global__ void rowStatsKernel(const T *x, float *stats, int64_t h, float eps, bool centered) {
  __shared__ double sums[kThreads];
  RowStats s = rowStats(sums, x + blockIdx.x * h, h, eps, centered);
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
      // Where tanh has saturated (|v| above ~10), sech^2 is 0 and so is the
      // second term: not 0 * inf, which made NaN of a 4e37 (v^2 overflows
      // fp32; the CPU, in double, got 1: parax-pxe-fuzz on a damaged weight).
      float c = 0.7978845608028654f, t = tanhf(c * (v + 0.044715f * v * v * v)), sech2 = 1.0f - t * t;
      d = 0.5f * (1.0f + t) + (sech2 > 0.0f ? 0.5f * v * sech2 * c * (1.0f + 3.0f * 0.044715f * v * v) : 0.0f);
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

// The gradient of cap tanh(x / cap) (Gemma 2's logits): dy (1 - tanh(x / cap)^2).
template <typename T>
__global__ void softcapGradKernel(const T *x, const T *dy, T *dx, int64_t n, float cap) {
  PARAX_GRID_STRIDE(k, n) {
    float t = tanhf(ld(x, k) / cap);
    st(dx, k, ld(dy, k) * (1.0f - t * t));
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
// `load` [E] (fp32 counts, zeroed first); per sequence (`perRow` tokens a
// sequence, 0: all together) into its sequence's row of `load` [B, E],
// the scores normalised (s_e / Σ_j s_j).
template <typename T>
__global__ void routerLoadKernel(const float *logits, const T *bias, float *scratch, float *load, int64_t tokens,
                                 int64_t E, int64_t K, bool sigmoidScores, int64_t groups, int64_t topkGroups,
                                 bool sumScores, int64_t perRow) {
  int64_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  float *row = load + (perRow ? t / perRow * E : 0);
  if (sumScores) { // each expert's score (softmax or sigmoid of the logits), not the choice
    const float *l = logits + t * E;
    float top = -INFINITY, sum = 0, sigmoids = 0;
    for (int64_t e = 0; e < E; ++e) top = fmaxf(top, l[e]);
    for (int64_t e = 0; e < E; ++e) sum += expf(l[e] - top);
    for (int64_t e = 0; e < E; ++e) sigmoids += 1.0f / (1.0f + expf(-l[e]));
    float norm = perRow ? sigmoids : 1.0f;
    for (int64_t e = 0; e < E; ++e)
      atomicAdd(&row[e], sigmoidScores ? 1.0f / (1.0f + expf(-l[e])) / norm : expf(l[e] - top) / sum);
    return;
  }
  float *scores = scratch + t * 2 * E;
  int32_t chosen[64];
  routeToken(logits + t * E, bias, scores, scores + E, E, K, sigmoidScores, groups, topkGroups, chosen);
  for (int64_t j = 0; j < K; ++j) atomicAdd(&row[chosen[j]], 1.0f);
}

// The load-balancing loss's value: scale · Σ load · scores over the n
// values (one thread).
__global__ void balanceLossKernel(const float *load, const float *scores, float *loss, int64_t n, double scale) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double sum = 0;
  for (int64_t e = 0; e < n; ++e) sum += static_cast<double>(load[e]) * scores[e];
  *loss = static_cast<float>(scale * sum);
}

// One thread per token: the load-balancing loss's gradient by its logits,
// g_e = scale · load_e (scale = coefficient · E / T², over the sequences
// too per sequence), through the softmax or sigmoid; per sequence
// (`perRow` tokens a row of load [B, E]) the sigmoid's scores normalised
// first (s / Σ_j s_j; softmax's already are).
template <typename T>
__global__ void routerAuxGradKernel(const float *logits, const float *load, T *dlogits, int64_t tokens, int64_t E,
                                    bool sigmoidScores, float scale, int64_t perRow) {
  int64_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  const float *l = logits + t * E, *g = load + (perRow ? t / perRow * E : 0);
  if (sigmoidScores) {
    float sum = 1, mix = 0;
    if (perRow) {
      sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += 1.0f / (1.0f + expf(-l[e]));
      for (int64_t e = 0; e < E; ++e) mix += scale * ld(g, e) / (1.0f + expf(-l[e])) / sum;
    }
    for (int64_t e = 0; e < E; ++e) {
      float s = 1.0f / (1.0f + expf(-l[e]));
      st(dlogits, t * E + e, (scale * ld(g, e) - mix) / sum * s * (1.0f - s));
    }
    return;
  }
  float m = -INFINITY, sum = 0, mix = 0;
  for (int64_t e = 0; e < E; ++e) m = fmaxf(m, l[e]);
  for (int64_t e = 0; e < E; ++e) sum += expf(l[e] - m);
  for (int64_t e = 0; e < E; ++e) mix += scale * ld(g, e) * expf(l[e] - m) / sum;
  for (int64_t e = 0; e < E; ++e) {
    float s = expf(l[e] - m) / sum;
    st(dlogits, t * E + e, s * (scale * ld(g, e) - mix));
  }
}

// The experts' gradients as GEMMs per expert (cuBLAS, sized by the host
// as the forward's per-expert path is): the pairs' rows gathered in expert
// order (perm, pos as the forward's expertOrderKernel leaves them), in
// fp32. Per expert e with rows X (x's) and DY (dy's): G = X W_gateᵀ,
// U = X W_upᵀ, DYW = DY W_down; then per row the router weight's gradient
// dy · (a W_downᵀ) = DYW · a with a = silu(G) U, and (below) dG, dU and
// w · a; then dW_down = DYᵀ (w a), dW_gate = dGᵀ X, dW_up = dUᵀ X, and the
// rows' dX = dG W_gate + dU W_up summed back per token.

// rows[r, :] = x[token of pair perm[r], :] widened to fp32 (zero where
// perm[r] < 0).
template <typename T>
__global__ void gatherRowsFloatKernel(const T *x, const int32_t *perm, float *rows, int64_t n, int64_t K, int64_t h) {
  PARAX_GRID_STRIDE(i, n * h) {
    int32_t pair = perm[i / h];
    rows[i] = pair < 0 ? 0.0f : ld(x, (pair / K) * h + i % h);
  }
}

// dweights[pair of row r] = DYW[r] · silu(G[r]) U[r], one block per row.
template <typename T>
__global__ void expertsWeightGradKernel(const int32_t *perm, const float *g, const float *u, const float *dyw,
                                        T *dweights, int64_t F) {
  __shared__ float partial[kThreads];
  const int64_t r = blockIdx.x;
  float dot = 0;
  for (int64_t f = threadIdx.x; f < F; f += blockDim.x)
    dot += dyw[r * F + f] * siluF(g[r * F + f]) * u[r * F + f];
  dot = blockReduce(partial, dot, false);
  if (threadIdx.x == 0 && perm[r] >= 0) st(dweights, perm[r], dot);
}

// Per row r (pair p = perm[r], router weight w) and f: with da = w · DYW,
// G becomes dG = da · U · silu'(G), U becomes dU = da · silu(G), and
// DYW becomes w · a (what dW_down sums).
template <typename T>
__global__ void expertsSwigluGradKernel(const int32_t *perm, const T *weights, float *g, float *u, float *dyw,
                                        int64_t n, int64_t F) {
  PARAX_GRID_STRIDE(i, n * F) {
    int32_t pair = perm[i / F];
    float w = pair < 0 ? 0.0f : ld(weights, pair);
    float gate = g[i], up = u[i], sig = 1.0f / (1.0f + expf(-gate)), da = w * dyw[i];
    g[i] = da * up * (sig + gate * sig * (1.0f - sig));
    u[i] = da * gate * sig;
    dyw[i] = w * gate * sig * up;
  }
}

// Where attention's queries sit (as attentionKernel's: query s at past + s
// · stride, seeing keys up to it when causal) and which KV head each local
// query head reads.
struct AttentionShape {
  int64_t B, S, H, D, T, KH, DV;
  bool causal;
  float scale;
  int64_t headOffset, group, past, stride;
  int64_t window = 0; // a sliding window: each query's last `window` keys (0: all it sees)
  float softcap = 0;  // scores capped at c tanh(s / c) (0: not)
  __device__ int64_t visible(int64_t s) const { return causal ? min(T, past + s * stride + 1) : T; }
  /// The first key query s sees (a sliding window), and whether it sees key t.
  __device__ int64_t first(int64_t s) const { return window > 0 ? max((int64_t)0, visible(s) - window) : 0; }
  __device__ bool sees(int64_t s, int64_t t) const { return t < visible(s) && t >= first(s); }
  /// A score from the dot product of its query and key (scaled, capped),
  /// and what a gradient through the cap is multiplied by (1 - (score / c)^2).
  __device__ float score(float dot) const { return capScore(scale * dot, softcap); }
  __device__ float capSlope(float capped) const {
    return softcap > 0 ? 1.0f - (capped / softcap) * (capped / softcap) : 1.0f;
  }
  __device__ int64_t kvHead(int64_t h) const { return (headOffset + h) / group; }
  /// The running block's tile (of `tiles`), batch and head, blocks numbered
  /// tile-major (every batch and head of a tile before the next tile):
  /// the last tile first if `lastFirst` (under a causal mask, the query
  /// tile that reads the most keys), else the first (the key tile read by
  /// the most queries) — the longest blocks start first.
  __device__ void place(int64_t tiles, bool lastFirst, int64_t &tile, int64_t &b, int64_t &h) const {
    int64_t major = blockIdx.x / (B * H);
    tile = lastFirst ? tiles - 1 - major : major;
    b = (blockIdx.x / H) % B;
    h = blockIdx.x % H;
  }
};

// The attention gradient, flash-style (as FlashAttention-2's backward pass,
// on CUDA cores in fp32): tiles of R queries and R keys in shared memory,
// never the S x T score matrix. Three kernels:
//  1. per (batch, head, query tile): the softmax's log-sum-exp and
//     D = rowsum(dO * O) of each query, O made again from the key tiles
//     (the forward's online softmax);
//  2. per (batch, query head, key tile): dV += P^T dO and dK += dS^T Q over
//     the query tiles that see the keys, with P = exp(S - lse) and
//     dS = scale P (dP - D), dP = dO V^T (the block owns its keys' rows: no
//     atomics); where several query heads read a KV head, into fp32 parts
//     that attentionGradSumHeadsKernel sums per KV head;
//  3. per (batch, head, query tile): dQ += dS K over the key tiles.
// Blocks go heaviest first under a causal mask (the last query tiles in 1
// and 3, the first key tiles in 2), as the tensor-core kernels below.
// Tiles are stored with rows padded to width + 1 floats (no bank conflicts
// when threads read different rows at one column).
struct AttentionGradTiles {
  int64_t R, D, DV; // rows a tile; head widths
  __host__ __device__ int64_t q() const { return R * (D + 1); }
  __host__ __device__ int64_t o() const { return R * (DV + 1); }
  // shared floats of each kernel
  __host__ __device__ int64_t statsFloats() const { return 2 * q() + 2 * o() + R * R + 3 * R; }
  __host__ __device__ int64_t keyValueFloats() const { return 3 * q() + 3 * o() + 2 * R * R + 2 * R; }
  __host__ __device__ int64_t queryFloats() const { return 3 * q() + 2 * o() + R * R + 2 * R; }
};

// tile[r][c] (row stride width + 1) = row first + r of `base` (rows
// `rowStride` apart), zeros past `limit` rows.
template <typename T>
__device__ void loadGradTile(float *tile, const T *base, int64_t first, int64_t limit, int64_t rowStride,
                             int64_t width, int64_t R) {
  const T *rows = base + first * rowStride;
  int valid = static_cast<int>(max(static_cast<int64_t>(0), min(R, limit - first)));
  loadFloatTile<T>(tile, static_cast<int>(width) + 1, [&](int r) { return rows + r * rowStride; }, valid,
                   static_cast<int>(R), static_cast<int>(width), packable(rows, rowStride, width));
}

// C[r][d] (its rows first scaled by scale[r], if given) += Σ_x A[r][x] ·
// B[x][d] over the tile's R rows x, A an R x R tile (transposed: A[x][r]),
// B and C of `width` columns (row stride width + 1).
__device__ void tileProductAdd(float *C, const float *A, bool transposeA, const float *B, int64_t R, int64_t width,
                               const float *scale = nullptr) {
  for (int64_t e = threadIdx.x; e < R * width; e += blockDim.x) {
    int64_t r = e / width, d = e % width;
    float acc = scale ? C[r * (width + 1) + d] * scale[r] : C[r * (width + 1) + d];
    for (int64_t x = 0; x < R; ++x) acc += (transposeA ? A[x * R + r] : A[r * R + x]) * B[x * (width + 1) + d];
    C[r * (width + 1) + d] = acc;
  }
}

// Rows first .. first + count - 1 of `out` (rows `rowStride` apart) from
// the tile.
template <typename T>
__device__ void storeGradTile(T *out, const float *tile, int64_t first, int64_t count, int64_t rowStride,
                              int64_t width) {
  for (int64_t e = threadIdx.x; e < count * width; e += blockDim.x) {
    int64_t r = e / width, d = e % width;
    st(out, (first + r) * rowStride + d, tile[r * (width + 1) + d]);
  }
}

__device__ float tileDot(const float *a, const float *b, int64_t n) {
  float sum = 0;
  for (int64_t d = 0; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

// Kernel 1: stats[2 row] = log-sum-exp of the query's scores (+inf when it
// sees no key), stats[2 row + 1] = D.
template <typename T>
__global__ void attentionGradStatsKernel(const T *q, const T *k, const T *v, const T *dout, float *stats,
                                         AttentionShape a, AttentionGradTiles g) {
  PARAX_DYNAMIC_SHARED(float, smem);
  const int64_t R = g.R;
  int64_t tile, b, h;
  a.place((a.S + R - 1) / R, true, tile, b, h);
  const int64_t kh = a.kvHead(h);
  float *Qs = smem, *Ks = Qs + g.q(), *Vs = Ks + g.q(), *Os = Vs + g.o(), *Ss = Os + g.o();
  float *m = Ss + R * R, *l = m + R, *alpha = l + R;
  const int64_t s0 = tile * R, rows = min(R, a.S - s0);
  loadGradTile(Qs, q + (b * a.S * a.H + h) * a.D, s0, a.S, a.H * a.D, a.D, R);
  for (int64_t e = threadIdx.x; e < g.o(); e += blockDim.x) Os[e] = 0.0f;
  if (threadIdx.x < R) {
    m[threadIdx.x] = -INFINITY;
    l[threadIdx.x] = 0.0f;
  }
  const T *kb = k + (b * a.T * a.KH + kh) * a.D, *vb = v + (b * a.T * a.KH + kh) * a.DV;
  const int64_t keys = a.visible(s0 + rows - 1); // the tile's last query sees the most
  for (int64_t t0 = a.first(s0); t0 < keys; t0 += R) { // (from the first its first query sees)
    __syncthreads();
    loadGradTile(Ks, kb, t0, a.T, a.KH * a.D, a.D, R);
    loadGradTile(Vs, vb, t0, a.T, a.KH * a.DV, a.DV, R);
    __syncthreads();
    for (int64_t e = threadIdx.x; e < R * R; e += blockDim.x) {
      int64_t i = e / R, j = e % R;
      Ss[e] = i < rows && a.sees(s0 + i, t0 + j) ? a.score(tileDot(Qs + i * (a.D + 1), Ks + j * (a.D + 1), a.D))
                                                 : -INFINITY;
    }
    __syncthreads();
    if (threadIdx.x < R) { // the row's online softmax: P in place of S
      int64_t i = threadIdx.x;
      float grown = m[i];
      for (int64_t j = 0; j < R; ++j) grown = fmaxf(grown, Ss[i * R + j]);
      float scaleOld = grown == -INFINITY ? 1.0f : expf(m[i] - grown), sum = 0;
      for (int64_t j = 0; j < R; ++j) {
        float p = grown == -INFINITY ? 0.0f : expf(Ss[i * R + j] - grown);
        Ss[i * R + j] = p;
        sum += p;
      }
      l[i] = l[i] * scaleOld + sum;
      m[i] = grown;
      alpha[i] = scaleOld;
    }
    __syncthreads();
    tileProductAdd(Os, Ss, false, Vs, R, a.DV, alpha);
  }
  __syncthreads();
  if (threadIdx.x < rows) {
    int64_t i = threadIdx.x, row = (b * a.S + s0 + i) * a.H + h;
    bool seen = l[i] > 0;
    float dot = 0;
    for (int64_t d = 0; d < a.DV; ++d) dot += ld(dout, row * a.DV + d) * Os[i * (a.DV + 1) + d];
    stats[2 * row] = seen ? m[i] + logf(l[i]) : INFINITY;
    stats[2 * row + 1] = seen ? dot / l[i] : 0.0f;
  }
}

// P and dS of query i, key j of the tiles (0 where the query does not see
// the key, or either lies past its tensor's end).
__device__ void attentionGradScores(const float *Qs, const float *dOs, const float *Ks, const float *Vs,
                                    const float *lse, const float *Dr, float *P, float *dS, int64_t s0,
                                    int64_t rows, int64_t t0, int64_t keys, const AttentionShape &a,
                                    const AttentionGradTiles &g) {
  const int64_t R = g.R;
  for (int64_t e = threadIdx.x; e < R * R; e += blockDim.x) {
    int64_t i = e / R, j = e % R;
    float p = 0, ds = 0;
    if (i < rows && j < keys && a.sees(s0 + i, t0 + j)) {
      float score = a.score(tileDot(Qs + i * (a.D + 1), Ks + j * (a.D + 1), a.D));
      p = expf(score - lse[i]);
      ds = p * (tileDot(dOs + i * (a.DV + 1), Vs + j * (a.DV + 1), a.DV) - Dr[i]) * a.capSlope(score) * a.scale;
    }
    if (P) P[e] = p;
    dS[e] = ds;
  }
}

// Kernel 2: query head h's part of dK and dV of a key tile: into dk, dv
// when h alone reads its KV head, else into the fp32 parts [B, T, H, D]
// and [B, T, H, DV].
template <typename T>
__global__ void attentionGradKeyValueKernel(const T *q, const T *k, const T *v, const T *dout, const float *stats,
                                            T *dk, T *dv, float *dkPart, float *dvPart, AttentionShape a,
                                            AttentionGradTiles g) {
  PARAX_DYNAMIC_SHARED(float, smem);
  const int64_t R = g.R;
  int64_t tile, b, h;
  a.place((a.T + R - 1) / R, false, tile, b, h);
  const int64_t kh = a.kvHead(h);
  float *Ks = smem, *Qs = Ks + g.q(), *dK = Qs + g.q(), *Vs = dK + g.q(), *dOs = Vs + g.o(), *dV = dOs + g.o();
  float *P = dV + g.o(), *dS = P + R * R, *lse = dS + R * R, *Dr = lse + R;
  const int64_t t0 = tile * R, keys = min(R, a.T - t0);
  loadGradTile(Ks, k + (b * a.T * a.KH + kh) * a.D, t0, a.T, a.KH * a.D, a.D, R);
  loadGradTile(Vs, v + (b * a.T * a.KH + kh) * a.DV, t0, a.T, a.KH * a.DV, a.DV, R);
  for (int64_t e = threadIdx.x; e < g.q(); e += blockDim.x) dK[e] = 0.0f;
  for (int64_t e = threadIdx.x; e < g.o(); e += blockDim.x) dV[e] = 0.0f;
  for (int64_t s0 = 0; s0 < a.S; s0 += R) {
    int64_t rows = min(R, a.S - s0);
    if (a.visible(s0 + rows - 1) <= t0 || a.first(s0) >= t0 + keys)
      continue; // no query of the tile sees these keys (before them, or windowed past them)
    __syncthreads();
    loadGradTile(Qs, q + (b * a.S * a.H + h) * a.D, s0, a.S, a.H * a.D, a.D, R);
    loadGradTile(dOs, dout + (b * a.S * a.H + h) * a.DV, s0, a.S, a.H * a.DV, a.DV, R);
    if (threadIdx.x < rows) {
      int64_t row = (b * a.S + s0 + threadIdx.x) * a.H + h;
      lse[threadIdx.x] = stats[2 * row];
      Dr[threadIdx.x] = stats[2 * row + 1];
    }
    __syncthreads();
    attentionGradScores(Qs, dOs, Ks, Vs, lse, Dr, P, dS, s0, rows, t0, keys, a, g);
    __syncthreads();
    tileProductAdd(dV, P, true, dOs, R, a.DV);
    tileProductAdd(dK, dS, true, Qs, R, a.D);
  }
  __syncthreads();
  if (dkPart) {
    storeGradTile(dkPart + (b * a.T * a.H + h) * a.D, dK, t0, keys, a.H * a.D, a.D);
    storeGradTile(dvPart + (b * a.T * a.H + h) * a.DV, dV, t0, keys, a.H * a.DV, a.DV);
  } else {
    storeGradTile(dk + (b * a.T * a.KH + kh) * a.D, dK, t0, keys, a.KH * a.D, a.D);
    storeGradTile(dv + (b * a.T * a.KH + kh) * a.DV, dV, t0, keys, a.KH * a.DV, a.DV);
  }
}

// Kernel 3: dQ of a query tile.
template <typename T>
__global__ void attentionGradQueryKernel(const T *q, const T *k, const T *v, const T *dout, const float *stats,
                                         T *dq, AttentionShape a, AttentionGradTiles g) {
  PARAX_DYNAMIC_SHARED(float, smem);
  const int64_t R = g.R;
  int64_t tile, b, h;
  a.place((a.S + R - 1) / R, true, tile, b, h);
  const int64_t kh = a.kvHead(h);
  float *Qs = smem, *Ks = Qs + g.q(), *dQ = Ks + g.q(), *dOs = dQ + g.q(), *Vs = dOs + g.o();
  float *dS = Vs + g.o(), *lse = dS + R * R, *Dr = lse + R;
  const int64_t s0 = tile * R, rows = min(R, a.S - s0);
  loadGradTile(Qs, q + (b * a.S * a.H + h) * a.D, s0, a.S, a.H * a.D, a.D, R);
  loadGradTile(dOs, dout + (b * a.S * a.H + h) * a.DV, s0, a.S, a.H * a.DV, a.DV, R);
  for (int64_t e = threadIdx.x; e < g.q(); e += blockDim.x) dQ[e] = 0.0f;
  if (threadIdx.x < rows) {
    int64_t row = (b * a.S + s0 + threadIdx.x) * a.H + h;
    lse[threadIdx.x] = stats[2 * row];
    Dr[threadIdx.x] = stats[2 * row + 1];
  }
  const T *kb = k + (b * a.T * a.KH + kh) * a.D, *vb = v + (b * a.T * a.KH + kh) * a.DV;
  const int64_t seen = a.visible(s0 + rows - 1);
  for (int64_t t0 = a.first(s0); t0 < seen; t0 += R) {
    __syncthreads();
    loadGradTile(Ks, kb, t0, a.T, a.KH * a.D, a.D, R);
    loadGradTile(Vs, vb, t0, a.T, a.KH * a.DV, a.DV, R);
    __syncthreads();
    attentionGradScores(Qs, dOs, Ks, Vs, lse, Dr, nullptr, dS, s0, rows, t0, min(R, a.T - t0), a, g);
    __syncthreads();
    tileProductAdd(dQ, dS, false, Ks, R, a.D);
  }
  __syncthreads();
  storeGradTile(dq + (b * a.S * a.H + h) * a.D, dQ, s0, rows, a.H * a.D, a.D);
}

// The attention gradient on bf16 tensor cores (WMMA 16x16x16, fp32
// accumulation), for bf16 storage with head widths in multiples of 16: the
// three kernels above with 64-row tiles and four warps a block, each warp
// owning 16 rows of a tile. Kernel 1 is attentionTensorCoreKernel given dO
// and `stats` (it writes each query's log-sum-exp and D instead of O, from
// the forward's own arithmetic: P rounded to bf16 for P V). Per pair of a
// query tile and a key tile, S = Q K^T and dP = dO V^T on tensor cores,
// then P = exp(S - lse) and dS = scale P (dP - D) in fp32, each rounded to
// bf16 for the products that read them: dV += P^T dO and dK += dS^T Q
// (kernel 2, per query head and key tile), dQ += dS K (kernel 3, per query
// tile), the sums kept in fp32 shared memory. Where several query heads
// read a KV head, kernel 2 writes each head's dK and dV in fp32 and a
// fourth kernel sums them per KV head (as FlashAttention-2 does for GQA):
// a block per query head keeps every SM busy where a block per KV head
// would leave a Llama-3-8B layer (8 KV heads) 256 blocks of very unequal
// length. Blocks go heaviest first under a causal mask (the first key
// tiles, the last query tiles). Rows padded as TensorCoreTiles'.
struct TensorCoreGradTiles {
  static constexpr int kRows = 64, kWarps = 4; // queries or keys a tile; 16 rows a warp
  int D, DV;
  // leading dimensions: bf16 tiles of width D, DV and kRows; fp32 of kRows, D, DV
  __host__ __device__ int ldq() const { return D + 8; }
  __host__ __device__ int ldv() const { return DV + 8; }
  __host__ __device__ int ldp() const { return kRows + 8; }
  __host__ __device__ int lds() const { return kRows + 4; }
  __host__ __device__ int ldk() const { return D + 4; }
  __host__ __device__ int ldo() const { return DV + 4; }
  // Bytes of each kernel's dynamic shared memory (every part a multiple of
  // 32 bytes: WMMA's alignment).
  __host__ __device__ int64_t common() const { // Q, K, dO, V, dS (bf16); S, dP, lse, D (fp32)
    return 2 * kRows * (2 * ldq() + 2 * ldv() + ldp()) + 4 * kRows * (2 * lds() + 2);
  }
  __host__ __device__ int64_t keyValueBytes() const {
    return common() + 2 * kRows * ldp() + 4 * kRows * (ldk() + ldo());
  }
  __host__ __device__ int64_t queryBytes() const { return common() + 4 * kRows * ldk(); }
};

// A kRows-row tile of `base` (rows `rowStride` apart) from row `first` into
// shared bf16 rows `ld` apart; zeros past `limit` rows (loadTile: 16 bytes
// a load where rows are aligned).
__device__ void loadTensorCoreTile(__nv_bfloat16 *tile, int ld, const __nv_bfloat16 *base, int64_t first,
                                   int64_t limit, int64_t rowStride, int width) {
  const int R = TensorCoreGradTiles::kRows;
  int valid = static_cast<int>(max(static_cast<int64_t>(0), min(static_cast<int64_t>(R), limit - first)));
  loadTile(tile, ld, base + first * rowStride, rowStride, valid, R, width);
}

// The parts of shared memory both kernels use, laid out by one function.
struct TensorCoreGradShared {
  __nv_bfloat16 *qs, *ks, *dos, *vs, *dss; // [kRows][ldq / ldv / ldp]
  float *ss, *dps, *lse, *Dr;              // [kRows][lds] twice; [kRows] twice
  char *rest;                              // the kernel's own parts
  __device__ TensorCoreGradShared(char *smem, const TensorCoreGradTiles &g) {
    const int R = TensorCoreGradTiles::kRows;
    qs = reinterpret_cast<__nv_bfloat16 *>(smem);
    ks = qs + R * g.ldq();
    dos = ks + R * g.ldq();
    vs = dos + R * g.ldv();
    dss = vs + R * g.ldv();
    ss = reinterpret_cast<float *>(dss + R * g.ldp());
    dps = ss + R * g.lds();
    lse = dps + R * g.lds();
    Dr = lse + R;
    rest = smem + g.common();
  }
};

// Loads the query tile's rows of Q, dO and their stats.
__device__ void loadTensorCoreQueries(TensorCoreGradShared &m, const __nv_bfloat16 *q, const __nv_bfloat16 *dout,
                                      const float *stats, int64_t b, int64_t h, int64_t s0, const AttentionShape &a,
                                      const TensorCoreGradTiles &g) {
  loadTensorCoreTile(m.qs, g.ldq(), q + (b * a.S * a.H + h) * a.D, s0, a.S, a.H * a.D, g.D);
  loadTensorCoreTile(m.dos, g.ldv(), dout + (b * a.S * a.H + h) * a.DV, s0, a.S, a.H * a.DV, g.DV);
  for (int i = threadIdx.x; i < TensorCoreGradTiles::kRows; i += blockDim.x) {
    int64_t row = (b * a.S + s0 + i) * a.H + h;
    bool inside = s0 + i < a.S;
    m.lse[i] = inside ? stats[2 * row] : INFINITY;
    m.Dr[i] = inside ? stats[2 * row + 1] : 0.0f;
  }
}

// Loads the key tile's rows of K and V.
__device__ void loadTensorCoreKeys(TensorCoreGradShared &m, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                                   int64_t b, int64_t kh, int64_t t0, const AttentionShape &a,
                                   const TensorCoreGradTiles &g) {
  loadTensorCoreTile(m.ks, g.ldq(), k + (b * a.T * a.KH + kh) * a.D, t0, a.T, a.KH * a.D, g.D);
  loadTensorCoreTile(m.vs, g.ldv(), v + (b * a.T * a.KH + kh) * a.DV, t0, a.T, a.KH * a.DV, g.DV);
}

// dS (and P, if `ps`) of the loaded query tile (queries s0..) and key tile
// (keys t0..), in bf16: zero where the query does not see the key or
// either lies past its tensor's end. Ends with a barrier.
__device__ void tensorCoreGradScores(TensorCoreGradShared &m, __nv_bfloat16 *ps, int64_t s0, int64_t t0,
                                     const AttentionShape &a, const TensorCoreGradTiles &g) {
  using namespace nvcuda;
  const int R = TensorCoreGradTiles::kRows, warp = threadIdx.x / 32, lds = g.lds(), ldp = g.ldp();
  for (int n0 = 0; n0 < R; n0 += 16) { // S = Q K^T, dP = dO V^T (K^T, V^T read as column-major)
    warpTileProduct<wmma::row_major, wmma::col_major>(m.qs + warp * 16 * g.ldq(), g.ldq(), 16,
                                                      m.ks + n0 * g.ldq(), g.ldq(), 16, g.D,
                                                      m.ss + warp * 16 * lds + n0, lds);
    warpTileProduct<wmma::row_major, wmma::col_major>(m.dos + warp * 16 * g.ldv(), g.ldv(), 16,
                                                      m.vs + n0 * g.ldv(), g.ldv(), 16, g.DV,
                                                      m.dps + warp * 16 * lds + n0, lds);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < R * R; e += blockDim.x) {
    int i = e / R, j = e % R;
    float p = 0.0f, ds = 0.0f;
    if (s0 + i < a.S && a.sees(s0 + i, t0 + j)) { // (visible <= T)
      float score = a.score(m.ss[i * lds + j]);
      p = expf(score - m.lse[i]);
      ds = p * (m.dps[i * lds + j] - m.Dr[i]) * a.capSlope(score) * a.scale;
    }
    if (ps) ps[i * ldp + j] = __float2bfloat16(p);
    m.dss[i * ldp + j] = __float2bfloat16(ds);
  }
  __syncthreads();
}

// Rows first.. (at most kRows, fewer past `limit`) of `out` (bf16 or fp32,
// rows `rowStride` apart) from a fp32 tile with rows `ld` apart.
template <typename T>
__device__ void storeTensorCoreTile(T *out, const float *tile, int ld, int64_t first, int64_t limit,
                                    int64_t rowStride, int width) {
  int rows = static_cast<int>(min(static_cast<int64_t>(TensorCoreGradTiles::kRows), limit - first));
  for (int e = threadIdx.x; e < rows * width; e += blockDim.x) {
    int r = e / width, c = e % width;
    st(out, (first + r) * rowStride + c, tile[r * ld + c]);
  }
}

// Kernel 2: query head h's part of dK and dV of a key tile, over the
// query tiles that see its keys: into dk, dv (bf16) when h alone reads its
// KV head, else into the fp32 partials [B, T, H, D] and [B, T, H, DV] (no
// atomics).
__global__ void attentionGradTensorCoreKeyValueKernel(const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                                                      const __nv_bfloat16 *v, const __nv_bfloat16 *dout,
                                                      const float *stats, __nv_bfloat16 *dk, __nv_bfloat16 *dv,
                                                      float *dkPart, float *dvPart, AttentionShape a,
                                                      TensorCoreGradTiles g) {
  using namespace nvcuda;
  PARAX_DYNAMIC_SHARED(float, shared);
  const int R = TensorCoreGradTiles::kRows, warp = threadIdx.x / 32;
  TensorCoreGradShared m(reinterpret_cast<char *>(shared), g);
  auto *ps = reinterpret_cast<__nv_bfloat16 *>(m.rest); // [R][ldp]
  auto *dK = reinterpret_cast<float *>(ps + R * g.ldp()); // [R][ldk]
  float *dV = dK + R * g.ldk();                          // [R][ldo]
  int64_t tile, b, h;
  a.place((a.T + R - 1) / R, false, tile, b, h);
  const int64_t t0 = tile * R, kh = a.kvHead(h);
  loadTensorCoreKeys(m, k, v, b, kh, t0, a, g);
  for (int e = threadIdx.x; e < R * g.ldk(); e += blockDim.x) dK[e] = 0.0f;
  for (int e = threadIdx.x; e < R * g.ldo(); e += blockDim.x) dV[e] = 0.0f;
  for (int64_t s0 = 0; s0 < a.S; s0 += R) {
    if (a.visible(min(a.S, s0 + R) - 1) <= t0 || a.first(s0) >= min(a.T, t0 + R))
      continue; // no query of the tile sees these keys (before them, or windowed past them)
    __syncthreads();
    loadTensorCoreQueries(m, q, dout, stats, b, h, s0, a, g);
    __syncthreads();
    tensorCoreGradScores(m, ps, s0, t0, a, g);
    // dV[keys][DV] += P^T dO, dK[keys][D] += dS^T Q: P^T and dS^T read
    // as column-major, each warp its 16 keys.
    for (int n0 = 0; n0 < g.DV; n0 += 16)
      warpTileProduct<wmma::col_major, wmma::row_major>(ps + warp * 16, g.ldp(), 16 * g.ldp(), m.dos + n0,
                                                        g.ldv(), 16 * g.ldv(), R, dV + warp * 16 * g.ldo() + n0,
                                                        g.ldo(), true);
    for (int n0 = 0; n0 < g.D; n0 += 16)
      warpTileProduct<wmma::col_major, wmma::row_major>(m.dss + warp * 16, g.ldp(), 16 * g.ldp(), m.qs + n0,
                                                        g.ldq(), 16 * g.ldq(), R, dK + warp * 16 * g.ldk() + n0,
                                                        g.ldk(), true);
  }
  __syncthreads();
  if (dkPart) {
    storeTensorCoreTile(dkPart + (b * a.T * a.H + h) * a.D, dK, g.ldk(), t0, a.T, a.H * a.D, g.D);
    storeTensorCoreTile(dvPart + (b * a.T * a.H + h) * a.DV, dV, g.ldo(), t0, a.T, a.H * a.DV, g.DV);
  } else {
    storeTensorCoreTile(dk + (b * a.T * a.KH + kh) * a.D, dK, g.ldk(), t0, a.T, a.KH * a.D, g.D);
    storeTensorCoreTile(dv + (b * a.T * a.KH + kh) * a.DV, dV, g.ldo(), t0, a.T, a.KH * a.DV, g.DV);
  }
}

// Kernel 4 (several query heads a KV head): dk[b][t][kh] = the sum of the
// partials of the local query heads that read KV head kh (zero where none
// does: KV heads replicated over ranks of other query heads), one thread an
// element; dv likewise.
template <typename T>
__global__ void attentionGradSumHeadsKernel(const float *part, T *out, int64_t width, AttentionShape a) {
  int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= a.B * a.T * a.KH * width) return;
  int64_t c = e % width, kh = e / width % a.KH, bt = e / (width * a.KH);
  float sum = 0.0f;
  for (int64_t h = 0; h < a.H; ++h)
    if (a.kvHead(h) == kh) sum += part[(bt * a.H + h) * width + c];
  st(out, e, sum);
}

// Kernel 3: dQ of a query tile, over the key tiles its queries see.
__global__ void attentionGradTensorCoreQueryKernel(const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                                                   const __nv_bfloat16 *v, const __nv_bfloat16 *dout,
                                                   const float *stats, __nv_bfloat16 *dq, AttentionShape a,
                                                   TensorCoreGradTiles g) {
  using namespace nvcuda;
  PARAX_DYNAMIC_SHARED(float, shared);
  const int R = TensorCoreGradTiles::kRows, warp = threadIdx.x / 32;
  TensorCoreGradShared m(reinterpret_cast<char *>(shared), g);
  auto *dQ = reinterpret_cast<float *>(m.rest); // [R][ldk]
  int64_t tile, b, h;
  a.place((a.S + R - 1) / R, true, tile, b, h);
  const int64_t s0 = tile * R, kh = a.kvHead(h);
  loadTensorCoreQueries(m, q, dout, stats, b, h, s0, a, g);
  for (int e = threadIdx.x; e < R * g.ldk(); e += blockDim.x) dQ[e] = 0.0f;
  const int64_t seen = a.visible(min(a.S, s0 + R) - 1);
  for (int64_t t0 = a.first(s0); t0 < seen; t0 += R) {
    __syncthreads();
    loadTensorCoreKeys(m, k, v, b, kh, t0, a, g);
    __syncthreads();
    tensorCoreGradScores(m, nullptr, s0, t0, a, g);
    // dQ[queries][D] += dS K, each warp its 16 queries.
    for (int n0 = 0; n0 < g.D; n0 += 16)
      warpTileProduct<wmma::row_major, wmma::row_major>(m.dss + warp * 16 * g.ldp(), g.ldp(), 16, m.ks + n0,
                                                        g.ldq(), 16 * g.ldq(), R, dQ + warp * 16 * g.ldk() + n0,
                                                        g.ldk(), true);
  }
  __syncthreads();
  storeTensorCoreTile(dq + (b * a.S * a.H + h) * a.D, dQ, g.ldk(), s0, a.S, a.H * a.D, g.D);
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
