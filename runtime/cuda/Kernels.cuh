// Kernels.cuh - the CUDA backend's kernels, one (or a few) per op: fp32 math
// on fp32 or bf16 storage, flash-style attention on CUDA cores and on bf16
// tensor cores, MoE routing and exchanges. Included by CudaExecutor.cu only
// (one translation unit), which launches them.

#ifndef PARAX_RUNTIME_CUDA_KERNELS_CUH
#define PARAX_RUNTIME_CUDA_KERNELS_CUH

#include "CudaCommon.cuh"
#include "parax/runtime/ExpertChoice.h"

#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <cstdint>
#include <vector>

namespace parax::runtime {

//===----------------------------------------------------------------------===//
// Kernels
//===----------------------------------------------------------------------===//

namespace {

constexpr int kThreads = 256;
constexpr int kMaxRank = 8;

// Blocks for a grid-stride loop over n elements (at least one: a grid of
// zero blocks is an invalid launch).
int blocksFor(int64_t n) {
  return static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 65535));
}

struct Dims {
  int rank = 0;
  int64_t d[kMaxRank] = {};
};
Dims dimsOf(const std::vector<int64_t> &shape) {
  Dims d;
  d.rank = shape.size();
  for (size_t i = 0; i < shape.size() && i < kMaxRank; ++i) d.d[i] = shape[i];
  return d;
}

// 16 bytes loaded at once (8 bf16 or 4 fp32 values), from an address
// that is a multiple of 16.
struct alignas(16) Pack16 {
  uint32_t w[4];
};
__device__ __forceinline__ bool aligned16(const void *p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Floating-point storage: fp32 or bf16 (T); the math is fp32 either way.
// Data movement copies the bits (W: uint32_t or uint16_t, by element size).
__device__ __forceinline__ float ld(const float *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ld(const __nv_bfloat16 *p, int64_t i) { return __bfloat162float(p[i]); }

// Whether rows of `width` values `rowStride` apart from `base` can be read
// 16 bytes at a time (every row start 16-byte aligned).
template <typename T> __device__ bool packable(const T *base, int64_t rowStride, int64_t width) {
  constexpr int E = 16 / sizeof(T);
  return width % E == 0 && rowStride % E == 0 && aligned16(base);
}

// Rows 0 .. tileRows - 1 of a fp32 tile in shared memory: dst[r * ldd + c]
// = row(r)[c] for r < validRows, else 0 (c < width), row(r) giving row r's
// first value. 16 bytes a load where `packed` (see packable), one value at
// a time otherwise (each with its row's address worked out again: an H200
// read a KV cache so at 0.2 TB/s).
template <typename T, typename Row>
__device__ void loadFloatTile(float *dst, int ldd, Row row, int validRows, int tileRows, int width, bool packed) {
  constexpr int E = 16 / sizeof(T);
  if (packed) {
    const int packs = width / E;
    for (int i = threadIdx.x; i < tileRows * packs; i += blockDim.x) {
      int r = i / packs, c = i % packs * E;
      Pack16 pack = r < validRows ? *reinterpret_cast<const Pack16 *>(row(r) + c) : Pack16{};
      T values[E];
      std::memcpy(values, &pack, sizeof pack); // (the bytes as T: a cast would break C++'s aliasing rules)
      for (int e = 0; e < E; ++e) dst[r * ldd + c + e] = ld(values, e);
    }
    return;
  }
  for (int i = threadIdx.x; i < tileRows * width; i += blockDim.x) {
    int r = i / width, c = i % width;
    dst[r * ldd + c] = r < validRows ? ld(row(r), c) : 0.0f;
  }
}
__device__ __forceinline__ void st(float *p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__nv_bfloat16 *p, int64_t i, float v) { p[i] = __float2bfloat16(v); }

__device__ float siluF(float x) { return x / (1.0f + expf(-x)); }

#define PARAX_GRID_STRIDE(k, n)                                                                    \
  for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < (n);                        \
       k += (int64_t)gridDim.x * blockDim.x)

template <typename W>
__global__ void embeddingKernel(const int32_t *ids, const W *table, W *out, int64_t tokens, int64_t h,
                                int64_t rows, int64_t offset) {
  PARAX_GRID_STRIDE(k, tokens * h) {
    int64_t t = k / h, c = k % h, id = ids[t] - offset;
    out[k] = (id < 0 || id >= rows) ? W(0) : table[id * h + c]; // all-zero bits: 0.0 in fp32 and bf16
  }
}

__global__ void toBf16Kernel(const float *x, __nv_bfloat16 *y, int64_t n) {
  PARAX_GRID_STRIDE(i, n) y[i] = __float2bfloat16(x[i]);
}

// The block's maximum (takeMax) or sum of every thread's `v` (fp32 or
// double), returned to every thread; `partial` holds kThreads of them in
// shared memory.
template <typename V> __device__ V blockReduce(V *partial, V v, bool takeMax) {
  partial[threadIdx.x] = v;
  __syncthreads();
  for (int step = blockDim.x / 2; step > 0; step /= 2) {
    if (threadIdx.x < step)
      partial[threadIdx.x] = takeMax ? fmax(partial[threadIdx.x], partial[threadIdx.x + step])
                                     : partial[threadIdx.x] + partial[threadIdx.x + step];
    __syncthreads();
  }
  V out = partial[0];
  __syncthreads();
  return out;
}

struct RowStats {
  float mean, inv;
};

// A row's mean (0 unless centered: LayerNorm) and 1 / sqrt(variance + eps),
// on every thread of the block. Summed in double, as the CPU backend sums
// them: in fp32 the squares of a row of 1e20s overflowed, and the row was
// normalised to 0 where the CPU's was finite (parax-pxe-fuzz, a weight
// damaged to 7e36). (A norm reads its row once: the double sums cost
// nothing against the memory traffic.)
template <typename T>
__device__ RowStats rowStats(double *partial, const T *xr, int64_t h, float eps, bool centered) {
  double mean = 0;
  if (centered) {
    double s = 0;
    for (int64_t c = threadIdx.x; c < h; c += blockDim.x) s += ld(xr, c);
    mean = blockReduce(partial, s, false) / h;
  }
  double v = 0;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) v += (ld(xr, c) - mean) * (ld(xr, c) - mean);
  return RowStats{static_cast<float>(mean), static_cast<float>(1.0 / sqrt(blockReduce(partial, v, false) / h + eps))};
}

// One block per row.
template <typename T>
__global__ void normKernel(const T *x, const T *w, const T *b, T *y, int64_t h, float eps, bool layerNorm,
                           float offset) {
  __shared__ double partial[kThreads];
  const T *xr = x + blockIdx.x * h;
  T *yr = y + blockIdx.x * h;
  RowStats stats = rowStats(partial, xr, h, eps, layerNorm);
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x)
    st(yr, c, (ld(xr, c) - stats.mean) * stats.inv * (ld(w, c) + offset) + (layerNorm ? ld(b, c) : 0.0f));
}

// Angles in double, as the CPU backend computes them (float loses ~1e-4 rad
// at position 2048). Positions from `offset`, or from *position (a
// generation step's, on the device) when given.
template <typename T>
__global__ void ropeKernel(T *v, const double *invFreq, int64_t B, int64_t S, int64_t H, int64_t D, int64_t rot,
                           int64_t offset, int64_t stride, const int32_t *position, bool interleaved,
                           bool inverse, float factor) {
  int64_t half = rot / 2;
  if (position) offset = *position; // (stride 1 then)
  PARAX_GRID_STRIDE(k, B * S * H * half) {
    int64_t i = k % half, row = k / half, s = (row / H) % S;
    double angle = static_cast<double>(offset + s * stride) * invFreq[i];
    float c = static_cast<float>(factor * cos(angle)),
          sn = static_cast<float>(factor * (inverse ? -sin(angle) : sin(angle)));
    T *x = v + row * D;
    int64_t p = interleaved ? 2 * i : i, q = interleaved ? 2 * i + 1 : i + half;
    float x0 = ld(x, p), x1 = ld(x, q);
    st(x, p, x0 * c - x1 * sn);
    st(x, q, x1 * c + x0 * sn);
  }
}

// One key tile of the online softmax, for `rows` query rows whose scores
// against the tile's `cols` keys are in ps[rows][kTile] (-inf: masked):
// the scores become probabilities, each row's running max and sum are
// updated, and its unnormalised output os[rows][dv] is rescaled and gains
// the tile's P V (vs[kTile][dv]). Every thread of the block calls it; the
// exponentials are spread over all of them (a decode block has as few as
// one row per KV head).
__device__ __forceinline__ void onlineSoftmaxTile(float *ps, float *os, const float *vs, float *rowMax,
                                                  float *rowSum, float *rowScale, int rows, int kTile, int cols,
                                                  int dv) {
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    const float *pr = ps + r * kTile;
    float m = rowMax[r];
    for (int j = 0; j < cols; ++j) m = fmaxf(m, pr[j]);
    rowScale[r] = rowMax[r] == -INFINITY ? 0.0f : expf(rowMax[r] - m);
    rowMax[r] = m;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rows * kTile; i += blockDim.x) {
    int r = i / kTile, j = i % kTile;
    ps[i] = (j < cols && ps[i] != -INFINITY) ? expf(ps[i] - rowMax[r]) : 0.0f; // masked: 0
  }
  __syncthreads();
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    const float *pr = ps + r * kTile;
    float sum = 0.0f;
    for (int j = 0; j < kTile; ++j) sum += pr[j];
    rowSum[r] = rowSum[r] * rowScale[r] + sum;
  }
  for (int i = threadIdx.x; i < rows * dv; i += blockDim.x) {
    int r = i / dv, d = i % dv;
    const float *pr = ps + r * kTile;
    float a = os[i] * rowScale[r];
    for (int j = 0; j < cols; ++j) a += pr[j] * vs[j * dv + d];
    os[i] = a;
  }
  __syncthreads();
}

// Which keys a query sees (the CPU backend's AttentionGeometry): under a
// causal mask those up to its position p, else all T; under a sliding
// window of W (> 0) the last W of those; none before `floor` (a ring's
// window: its rows of negative position). `firstKey` is the first it sees.
__device__ __forceinline__ int64_t keysEndFor(bool causal, int64_t T, int64_t p) {
  return causal ? min(T, p + 1) : T;
}
__device__ __forceinline__ int64_t firstKey(bool causal, int64_t window, int64_t T, int64_t p,
                                            int64_t floor = 0) {
  return max(floor, window > 0 ? max((int64_t)0, keysEndFor(causal, T, p) - window) : (int64_t)0);
}
__device__ __forceinline__ bool keyVisible(bool causal, int64_t window, int64_t T, int64_t t, int64_t p,
                                           int64_t floor = 0) {
  return t < keysEndFor(causal, T, p) && t >= firstKey(causal, window, T, p, floor);
}
// A query's position: `past` (then its own offset), or a generation
// step's run-time *position; with `ring` (a ring_cache_update's window,
// whose row r holds position *position - past + r) the keys stay where
// they are and those of negative position are not seen: the floor.
__device__ __forceinline__ int64_t queryBase(const int32_t *position, bool ring, int64_t past, int64_t &floor) {
  floor = 0;
  if (!position) return past;
  if (ring) {
    floor = max((int64_t)0, past - (int64_t)*position);
    return past;
  }
  return *position;
}
// A scaled score soft-capped (Gemma 2: c tanh(s / c)); c <= 0: as it is.
__device__ __forceinline__ float capScore(float s, float cap) { return cap > 0 ? cap * tanhf(s / cap) : s; }

// Flash-style attention on CUDA cores: one block per (batch, head, tile of
// `qTile` queries). Key tiles of `kTile` keys pass through shared memory
// (fp32 whatever the storage); each query row keeps an online softmax
// (running max and sum), and the output tile accumulates in shared memory,
// each element owned by one thread. Nothing of size S x T is stored, and
// each key tile is read once per query tile (not once per query).
struct AttentionTiles {
  int queries = 32, keys = 64;
  // Floats of dynamic shared memory for head widths D (query/key), DV.
  static int64_t floats(int q, int k, int64_t D, int64_t DV) {
    return q * (D + 1) + k * (D + 1) + k * DV + q * k + q * DV + 3 * q;
  }
};

template <typename T>
__global__ void attentionKernel(const T *q, const T *k, const T *v, T *y, int64_t B, int64_t S, int64_t H,
                                int64_t D, int64_t T_, int64_t KH, int64_t DV, int64_t VW, bool causal, float scale,
                                int64_t headOffset, int64_t group, int qTile, int kTile,
                                const int32_t *position, int64_t past, int64_t stride, int64_t window,
                                float softcap, bool ring) {
  PARAX_DYNAMIC_SHARED(float, shared);
  const int ds = static_cast<int>(D) + 1; // padded rows: keys fall in different banks
  const int dv = static_cast<int>(DV), d0 = static_cast<int>(D);
  float *qs = shared;               // [qTile][D + 1]
  float *ks = qs + qTile * ds;      // [kTile][D + 1]
  float *vs = ks + kTile * ds;      // [kTile][DV]
  float *ps = vs + kTile * dv;      // [qTile][kTile]: scores, then probabilities
  float *os = ps + qTile * kTile;   // [qTile][DV]: the unnormalised output
  float *rowMax = os + qTile * dv, *rowSum = rowMax + qTile, *rowScale = rowSum + qTile;
  int64_t tiles = (S + qTile - 1) / qTile;
  int64_t qt = blockIdx.x % tiles, h = (blockIdx.x / tiles) % H, b = blockIdx.x / (tiles * H);
  int64_t q0 = qt * qTile;
  int rows = static_cast<int>(min((int64_t)qTile, S - q0));
  int64_t kh = (headOffset + h) / group;
  // Query s sits at position past + s * stride and sees the keys up to it:
  // past is T - S (the keys before the queries' own), or a rank's part of
  // queries split over ranks (context parallelism: in blocks, stride 1;
  // dealt out cyclically, stride the ranks), or (a generation step over a
  // cache) the run-time position.
  int64_t floor;
  past = queryBase(position, ring, past, floor);
  // Keys the tile's last query sees (causal), or all of them; from the
  // first its first query sees (a sliding window).
  int64_t keysEnd = causal ? min(T_, past + (q0 + rows - 1) * stride + 1) : T_;
  int64_t keysBegin = firstKey(causal, window, T_, past + q0 * stride, floor);
  const T *qTile0 = q + ((b * S + q0) * H + h) * D; // (the rows' padding columns are never read)
  loadFloatTile<T>(qs, ds, [&](int r) { return qTile0 + r * H * D; }, rows, qTile, d0, packable(qTile0, H * D, d0));
  for (int i = threadIdx.x; i < qTile * dv; i += blockDim.x) os[i] = 0.0f;
  for (int r = threadIdx.x; r < qTile; r += blockDim.x) {
    rowMax[r] = -INFINITY;
    rowSum[r] = 0.0f;
  }
  __syncthreads();
  const T *kHead = k + kh * D, *vHead = v + kh * VW; // (row t of batch b: + (b * T_ + t) * KH * width)
  const bool keysPacked = packable(kHead, KH * D, d0), valuesPacked = packable(vHead, KH * VW, dv);
  for (int64_t t0 = keysBegin; t0 < keysEnd; t0 += kTile) {
    int cols = static_cast<int>(min((int64_t)kTile, keysEnd - t0));
    loadFloatTile<T>(ks, ds, [&](int j) { return kHead + (b * T_ + t0 + j) * KH * D; }, cols, kTile, d0, keysPacked);
    loadFloatTile<T>(vs, dv, [&](int j) { return vHead + (b * T_ + t0 + j) * KH * VW; }, cols, kTile, dv,
                     valuesPacked);
    __syncthreads();
    for (int i = threadIdx.x; i < qTile * kTile; i += blockDim.x) {
      int r = i / kTile, j = i % kTile;
      float score = -INFINITY;
      if (r < rows && j < cols && keyVisible(causal, window, T_, t0 + j, past + (q0 + r) * stride)) {
        const float *qr = qs + r * ds, *kr = ks + j * ds;
        float dot = 0.0f;
        for (int d = 0; d < d0; ++d) dot += qr[d] * kr[d];
        score = capScore(dot * scale, softcap);
      }
      ps[i] = score;
    }
    __syncthreads();
    onlineSoftmaxTile(ps, os, vs, rowMax, rowSum, rowScale, qTile, kTile, cols, dv);
  }
  for (int i = threadIdx.x; i < rows * dv; i += blockDim.x) {
    int r = i / dv, d = i % dv;
    st(y, ((b * S + q0 + r) * H + h) * DV + d, os[i] / rowSum[r]);
  }
}

// Attention of a few queries over a long KV cache (decode: S = 1), split
// over the keys (flash-decoding): the kernels above give each query head
// its own block and walk all T keys in it, which at S = 1 leaves most SMs
// idle and reads each KV head once per query head. Here one block takes one
// (batch, KV head, chunk of keys) with every query row that reads that KV
// head (group x S rows), so a key is read from memory once; the chunks'
// partial results (unnormalised output, running max and sum per row, fp32)
// go to `partial`, and decodeCombineKernel merges them. Keys (and values)
// may come in two parts, the rows of a KV cache and then the new tokens'
// (`kCached` rows of `k`, the rest in `kNew`): a concat the kernel reads
// in place instead of a copy.
// Its shared memory is laid out as attentionKernel's, with the rows in
// place of the query tile (AttentionTiles::floats).
struct DecodeTiles {
  int keys = 64;
  /// Query rows (head, position) a block holds: a KV head's rows are cut
  /// into blocks of this many when they do not fit one (multi-head latent
  /// attention: 128 heads over one 576-wide latent head), each block
  /// reading the chunk's keys once.
  int rows = 64;
  /// Floats of `partial` per (batch, KV head, chunk) and row.
  static int64_t perRow(int64_t DV) { return DV + 2; }
};

// Row t of batch b, KV head kh, of keys or values stored in two parts.
template <typename T>
__device__ __forceinline__ const T *kvRow(const T *cached, const T *fresh, int64_t cachedRows, int64_t rows,
                                          int64_t b, int64_t t, int64_t KH, int64_t kh, int64_t width) {
  return t < cachedRows ? cached + ((b * cachedRows + t) * KH + kh) * width
                        : fresh + ((b * (rows - cachedRows) + t - cachedRows) * KH + kh) * width;
}

template <typename T>
__global__ void decodeAttentionKernel(const T *q, const T *k, const T *kNew, int64_t kCached, const T *v,
                                      const T *vNew, int64_t vCached, float *partial, int64_t S, int64_t H,
                                      int64_t D, int64_t T_, int64_t KH, int64_t DV, int64_t VW, bool causal,
                                      float scale, int64_t headOffset, int64_t group, int64_t chunks, int64_t chunkKeys,
                                      int kTile, int blockRows, const int32_t *position, int64_t past,
                                      int64_t stride, int64_t window, float softcap, bool ring) {
  PARAX_DYNAMIC_SHARED(float, shared);
  const int ds = static_cast<int>(D) + 1, dv = static_cast<int>(DV), d0 = static_cast<int>(D);
  // A KV head's rows on this rank (at most its group's heads, or the
  // rank's, times S) are `partial`'s rows; a block holds blockRows of them.
  const int maxRows = static_cast<int>(min(group, H) * S), R = blockRows;
  const int64_t rowBlocks = (maxRows + R - 1) / R;
  float *qs = shared;        // [R][D + 1]
  float *ks = qs + R * ds;   // [kTile][D + 1]
  float *vs = ks + kTile * ds; // [kTile][DV]
  float *ps = vs + kTile * dv; // [R][kTile]
  float *os = ps + R * kTile;  // [R][DV]
  float *rowMax = os + R * dv, *rowSum = rowMax + R, *rowScale = rowSum + R;
  int64_t c = blockIdx.x % chunks, g = (blockIdx.x / chunks) % rowBlocks;
  int64_t kh = (blockIdx.x / (chunks * rowBlocks)) % KH, b = blockIdx.x / (chunks * rowBlocks * KH);
  // This rank's query heads that read KV head kh: rows (head, position),
  // this block's from row0 on.
  int64_t hLo = max((int64_t)0, kh * group - headOffset), hHi = min(H, (kh + 1) * group - headOffset);
  int rows = hHi > hLo ? static_cast<int>((hHi - hLo) * S) : 0;
  const int row0 = static_cast<int>(g) * R;
  int here = max(0, min(R, rows - row0));
  int64_t floor;
  past = queryBase(position, ring, past, floor); // (as attentionKernel's)
  // A cache's rows beyond the last query's position are not read (a
  // generation step: the chunks past it only write empty partials).
  // (and under a sliding window, none before the first query's first)
  int64_t k0 = max(c * chunkKeys, firstKey(causal, window, T_, past, floor)),
          k1 = min(causal ? min(T_, past + (S - 1) * stride + 1) : T_, c * chunkKeys + chunkKeys);
  for (int i = threadIdx.x; i < R * ds; i += blockDim.x) {
    int r = i / ds, d = i % ds;
    int64_t h = hLo + (row0 + r) / S, pos = (row0 + r) % S;
    qs[i] = (r < here && d < d0) ? ld(q, ((b * S + pos) * H + h) * D + d) : 0.0f;
  }
  for (int i = threadIdx.x; i < R * dv; i += blockDim.x) os[i] = 0.0f;
  for (int r = threadIdx.x; r < R; r += blockDim.x) {
    rowMax[r] = -INFINITY;
    rowSum[r] = 0.0f;
  }
  __syncthreads();
  const bool keysPacked = packable(k, D, d0) && aligned16(kNew), valuesPacked = packable(v, VW, dv) && aligned16(vNew);
  for (int64_t t0 = k0; t0 < k1; t0 += kTile) {
    int cols = static_cast<int>(min((int64_t)kTile, k1 - t0));
    loadFloatTile<T>(ks, ds, [&](int j) { return kvRow(k, kNew, kCached, T_, b, t0 + j, KH, kh, D); }, cols, kTile,
                     d0, keysPacked);
    loadFloatTile<T>(vs, dv, [&](int j) { return kvRow(v, vNew, vCached, T_, b, t0 + j, KH, kh, VW); }, cols,
                     kTile, dv, valuesPacked);
    __syncthreads();
    for (int i = threadIdx.x; i < R * kTile; i += blockDim.x) {
      int r = i / kTile, j = i % kTile;
      float score = -INFINITY;
      if (r < here && j < cols && keyVisible(causal, window, T_, t0 + j, past + ((row0 + r) % S) * stride, floor)) {
        const float *qr = qs + r * ds, *kr = ks + j * ds;
        float dot = 0.0f;
        for (int d = 0; d < d0; ++d) dot += qr[d] * kr[d];
        score = capScore(dot * scale, softcap);
      }
      ps[i] = score;
    }
    __syncthreads();
    onlineSoftmaxTile(ps, os, vs, rowMax, rowSum, rowScale, R, kTile, cols, dv);
  }
  // partial[(b, kh, c)][row]: DV outputs, then the row's max and sum.
  float *out = partial + (((b * KH + kh) * chunks + c) * maxRows + row0) * (DV + 2);
  for (int i = threadIdx.x; i < here * (dv + 2); i += blockDim.x) {
    int r = i / (dv + 2), d = i % (dv + 2);
    out[i] = d < dv ? os[r * dv + d] : d == dv ? rowMax[r] : rowSum[r];
  }
}

// y[b, s, h, :] from the chunks' partial results of its row.
template <typename T>
__global__ void decodeCombineKernel(const float *partial, T *y, int64_t B, int64_t S, int64_t H, int64_t KH,
                                    int64_t DV, int64_t headOffset, int64_t group, int64_t chunks) {
  int64_t n = B * S * H * DV;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t d = i % DV, h = (i / DV) % H, pos = (i / (DV * H)) % S, b = i / (DV * H * S);
    int64_t kh = (headOffset + h) / group;
    int64_t hLo = max((int64_t)0, kh * group - headOffset);
    int64_t row = (h - hLo) * S + pos, maxRows = min(group, H) * S;
    const float *base = partial + (b * KH + kh) * chunks * maxRows * (DV + 2) + row * (DV + 2);
    float m = -INFINITY;
    for (int64_t c = 0; c < chunks; ++c) m = fmaxf(m, base[c * maxRows * (DV + 2) + DV]);
    float sum = 0.0f, acc = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) {
      const float *part = base + c * maxRows * (DV + 2);
      if (part[DV] == -INFINITY) continue; // every key of this chunk masked for the row
      float w = expf(part[DV] - m);
      sum += part[DV + 1] * w;
      acc += part[d] * w;
    }
    st(y, i, acc / sum);
  }
}

// Attention on bf16 tensor cores (WMMA 16x16x16, fp32 accumulation), for
// bf16 storage with head widths that are multiples of 16: one block of four
// warps per (batch, head, 64 queries), each warp owning 16 query rows.
// Per 64-key tile: S = Q K^T on tensor cores, the online softmax in fp32 by
// two threads a row (P rounded to bf16), then the fp32 output so far
// rescaled per row and P V added to it on tensor cores (no scratch tile:
// 112 KiB of shared memory at 128-wide heads, so two blocks share an SM;
// with a 33 KiB scratch tile an H200 held one). Shared memory rows are
// padded (8 bf16 / 4 fp32) to keep WMMA's 256-bit alignment and spread the
// banks. Given `stats` (and dO), it
// writes each query's log-sum-exp and D = rowsum(dO * O) there instead of
// O: the first step of the attention gradient (GradientKernels.cuh).
struct TensorCoreTiles {
  static constexpr int kQueries = 64, kKeys = 64, kWarps = 4, kThreads = 32 * kWarps;
  static_assert(kThreads == 2 * kQueries, "the softmax takes two threads a query row");
  // Bytes of dynamic shared memory for head widths D, DV.
  static int64_t bytes(int64_t D, int64_t DV) {
    return 2 * (kQueries * (D + 8) + kKeys * (D + 8) + kKeys * (DV + 8) + kQueries * (kKeys + 8)) +
           4 * (kQueries * (kKeys + 4) + kQueries * (DV + 4) + 3 * kQueries + 2 * kThreads);
  }
};

// One warp: out[16][16] (fp32, row-major) = a[16][k] . b[k][16] on tensor
// cores (+= what out holds, if `accumulate`); a is read as LayoutA and b as
// LayoutB, advancing `aStep` and `bStep` elements per 16 of k.
template <typename LayoutA, typename LayoutB>
__device__ void warpTileProduct(const __nv_bfloat16 *a, int lda, int aStep, const __nv_bfloat16 *b, int ldb,
                                int bStep, int k, float *out, int ldo, bool accumulate = false) {
  using namespace nvcuda;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  if (accumulate)
    wmma::load_matrix_sync(acc, out, ldo, wmma::mem_row_major);
  else
    wmma::fill_fragment(acc, 0.0f);
  for (int k0 = 0; k0 < k; k0 += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, LayoutA> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, LayoutB> fb;
    wmma::load_matrix_sync(fa, a + (k0 / 16) * aStep, lda);
    wmma::load_matrix_sync(fb, b + (k0 / 16) * bStep, ldb);
    wmma::mma_sync(acc, fa, fb, acc);
  }
  wmma::store_matrix_sync(out, acc, ldo, wmma::mem_row_major);
}

// Rows 0 .. tileRows - 1 of a bf16 tile in shared memory: dst[r * ldd + c]
// = src[r * rowStride + c] for r < validRows, else 0 (c < width). Eight
// values (16 bytes) a load where every row start is 16-byte aligned, one
// at a time otherwise.
__device__ void loadTile(__nv_bfloat16 *dst, int ldd, const __nv_bfloat16 *src, int64_t rowStride, int validRows,
                         int tileRows, int width) {
  bool packed = width % 8 == 0 && ldd % 8 == 0 && rowStride % 8 == 0 && aligned16(src) && aligned16(dst);
  if (packed) {
    const int packs = width / 8;
    for (int i = threadIdx.x; i < tileRows * packs; i += blockDim.x) {
      int r = i / packs, c = (i % packs) * 8;
      *reinterpret_cast<Pack16 *>(dst + r * ldd + c) =
          r < validRows ? *reinterpret_cast<const Pack16 *>(src + r * rowStride + c) : Pack16{};
    }
    return;
  }
  for (int i = threadIdx.x; i < tileRows * width; i += blockDim.x) {
    int r = i / width, c = i % width;
    dst[r * ldd + c] = r < validRows ? src[r * rowStride + c] : __float2bfloat16(0.0f);
  }
}

__global__ void attentionTensorCoreKernel(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                                          __nv_bfloat16 *y, int64_t B, int64_t S, int64_t H, int64_t D, int64_t T_,
                                          int64_t KH, int64_t DV, int64_t VW, bool causal, float scale,
                                          int64_t headOffset,
                                          int64_t group, const int32_t *position, int64_t past,
                                          int64_t stride, const __nv_bfloat16 *dout, float *stats,
                                          int64_t window, float softcap, bool ring) {
  using namespace nvcuda;
  constexpr int QT = TensorCoreTiles::kQueries, KT = TensorCoreTiles::kKeys;
  PARAX_DYNAMIC_SHARED(float, shared); // one name and type for every kernel's dynamic shared memory
  const int dq = static_cast<int>(D), dv = static_cast<int>(DV);
  const int ldq = dq + 8, ldv = dv + 8, ldp = KT + 8, lds = KT + 4, ldo = dv + 4;
  auto *qs = reinterpret_cast<__nv_bfloat16 *>(shared); // [QT][ldq]
  __nv_bfloat16 *ks = qs + QT * ldq;                    // [KT][ldq]
  __nv_bfloat16 *vs = ks + KT * ldq;                    // [KT][ldv]
  __nv_bfloat16 *ps = vs + KT * ldv;                    // [QT][ldp] probabilities
  auto *ss = reinterpret_cast<float *>(ps + QT * ldp);  // [QT][lds] scores
  float *os = ss + QT * lds;                            // [QT][ldo] the output so far
  float *rowMax = os + QT * ldo, *rowSum = rowMax + QT, *rowScale = rowSum + QT;
  float *partMax = rowScale + QT, *partSum = partMax + TensorCoreTiles::kThreads; // the softmax's halves
  // The last query tile first (under a causal mask the one that reads the
  // most keys: the longest blocks start first, the short ones fill in).
  int64_t tiles = (S + QT - 1) / QT;
  int64_t qt = tiles - 1 - blockIdx.x / (B * H), h = blockIdx.x % H, b = (blockIdx.x / H) % B;
  int64_t q0 = qt * QT;
  int rows = static_cast<int>(min((int64_t)QT, S - q0));
  int64_t kh = (headOffset + h) / group;
  int64_t floor;
  past = queryBase(position, ring, past, floor); // (as attentionKernel's)
  int64_t keysEnd = causal ? min(T_, past + (q0 + rows - 1) * stride + 1) : T_;
  int64_t keysBegin = firstKey(causal, window, T_, past + q0 * stride, floor);
  int warp = threadIdx.x / 32;
  loadTile(qs, ldq, q + ((b * S + q0) * H + h) * D, H * D, rows, QT, dq);
  for (int i = threadIdx.x; i < QT * ldo; i += blockDim.x) os[i] = 0.0f;
  for (int r = threadIdx.x; r < QT; r += blockDim.x) {
    rowMax[r] = -INFINITY;
    rowSum[r] = 0.0f;
  }
  __syncthreads();
  for (int64_t t0 = keysBegin; t0 < keysEnd; t0 += KT) {
    int cols = static_cast<int>(min((int64_t)KT, keysEnd - t0));
    loadTile(ks, ldq, k + ((b * T_ + t0) * KH + kh) * D, KH * D, cols, KT, dq);
    loadTile(vs, ldv, v + ((b * T_ + t0) * KH + kh) * VW, KH * VW, cols, KT, dv);
    __syncthreads();
    // S[16 warp rows][KT] = Q K^T (K^T read as a column-major matrix_b).
    for (int n0 = 0; n0 < KT; n0 += 16)
      warpTileProduct<wmma::row_major, wmma::col_major>(qs + warp * 16 * ldq, ldq, 16, ks + n0 * ldq, ldq, 16, dq,
                                                        ss + warp * 16 * lds + n0, lds);
    __syncthreads();
    { // The online softmax, two threads a row (every thread busy): thread
      // 2r + half takes row r's columns half, half + 2, ... (interleaved,
      // fewer bank conflicts); their maxima and sums meet in shared memory.
      const int r = threadIdx.x / 2, half = threadIdx.x % 2;
      float *sr = ss + r * lds;
      float m = -INFINITY;
      for (int j = half; j < cols; j += 2) {
        bool visible = r < rows && keyVisible(causal, window, T_, t0 + j, past + (q0 + r) * stride, floor);
        sr[j] = visible ? capScore(sr[j] * scale, softcap) : -INFINITY;
        m = fmaxf(m, sr[j]);
      }
      partMax[threadIdx.x] = m;
      __syncthreads();
      m = fmaxf(rowMax[r], fmaxf(partMax[2 * r], partMax[2 * r + 1]));
      float sum = 0.0f;
      for (int j = half; j < KT; j += 2) {
        float p = (j < cols && sr[j] != -INFINITY) ? expf(sr[j] - m) : 0.0f;
        __nv_bfloat16 pb = __float2bfloat16(p);
        ps[r * ldp + j] = pb;
        sum += __bfloat162float(pb); // the sum of what P V multiplies
      }
      partSum[threadIdx.x] = sum;
      __syncthreads();
      if (half == 0) {
        float rescale = rowMax[r] == -INFINITY ? 0.0f : expf(rowMax[r] - m);
        rowSum[r] = rowSum[r] * rescale + partSum[2 * r] + partSum[2 * r + 1];
        rowMax[r] = m;
        rowScale[r] = rescale;
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < QT * ldo; i += blockDim.x) os[i] *= rowScale[i / ldo];
    __syncthreads();
    // os[16 warp rows][DV] += P V.
    for (int n0 = 0; n0 < dv; n0 += 16)
      warpTileProduct<wmma::row_major, wmma::row_major>(ps + warp * 16 * ldp, ldp, 16, vs + n0, ldv, 16 * ldv, KT,
                                                        os + warp * 16 * ldo + n0, ldo, true);
    __syncthreads();
  }
  if (stats) { // for the gradient (attentionGradTensorCore*): each query's log-sum-exp and D = rowsum(dO * O)
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
      int64_t row = (b * S + q0 + r) * H + h;
      float dot = 0.0f;
      for (int d = 0; d < dv; ++d) dot += __bfloat162float(dout[row * DV + d]) * os[r * ldo + d];
      bool seen = rowSum[r] > 0;
      stats[2 * row] = seen ? rowMax[r] + logf(rowSum[r]) : INFINITY;
      stats[2 * row + 1] = seen ? dot / rowSum[r] : 0.0f;
    }
    return;
  }
  for (int i = threadIdx.x; i < rows * dv; i += blockDim.x) {
    int r = i / dv, d = i % dv;
    y[((b * S + q0 + r) * H + h) * DV + d] = __float2bfloat16(os[r * ldo + d] / rowSum[r]);
  }
}

__device__ int64_t broadcastIndex(const Dims &in, const Dims &out, int64_t k) {
  int64_t index = 0, stride = 1;
  for (int d = out.rank - 1; d >= 0; --d) {
    int64_t coord = k % out.d[d];
    k /= out.d[d];
    if (in.d[d] != 1) index += coord * stride;
    stride *= in.d[d];
  }
  return index;
}

// lWhole, rWhole: that operand has the output's shape, read at k (without
// broadcastIndex's 64-bit divisions: an H200 took 0.84 ms for the two
// residual adds of a 2048-token Llama-3-8B layer, 48 MB each).
template <typename T>
__global__ void binaryKernel(const T *l, const T *r, T *y, Dims ld_, Dims rd, Dims od, int64_t n, bool add,
                             bool lWhole, bool rWhole) {
  PARAX_GRID_STRIDE(k, n) {
    float a = ld(l, lWhole ? k : broadcastIndex(ld_, od, k)), b = ld(r, rWhole ? k : broadcastIndex(rd, od, k));
    st(y, k, add ? a + b : a * b);
  }
}

template <typename W> __global__ void broadcastKernel(const W *x, W *y, Dims xd, Dims od, int64_t n) {
  PARAX_GRID_STRIDE(k, n) y[k] = x[broadcastIndex(xd, od, k)];
}

// kind: 0 silu, 1 sigmoid, 2 gelu tanh, 3 gelu erf
// kind: 0 silu, 1 sigmoid, 2 gelu (tanh), 3 gelu (exact), 4 softcap (cap tanh(x / cap): Gemma 2's logits).
template <typename T> __global__ void unaryKernel(const T *x, T *y, int64_t n, int kind, float cap) {
  PARAX_GRID_STRIDE(k, n) {
    float v = ld(x, k), r;
    if (kind == 0) r = siluF(v);
    else if (kind == 1) r = 1.0f / (1.0f + expf(-v));
    else if (kind == 2) r = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    else if (kind == 3) r = 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
    else r = capScore(v, cap);
    st(y, k, r);
  }
}

template <typename T> __global__ void swigluKernel(const T *g, const T *u, T *y, int64_t n) {
  PARAX_GRID_STRIDE(k, n) st(y, k, siluF(ld(g, k)) * ld(u, k));
}

template <typename W> __global__ void transposeKernel(const W *x, W *y, Dims xd, Dims yd, Dims perm, int64_t n) {
  PARAX_GRID_STRIDE(k, n) {
    int64_t rem = k, offset = 0;
    int64_t xs[kMaxRank];
    xs[xd.rank - 1] = 1;
    for (int d = xd.rank - 2; d >= 0; --d) xs[d] = xs[d + 1] * xd.d[d + 1];
    for (int d = yd.rank - 1; d >= 0; --d) {
      int64_t coord = rem % yd.d[d];
      rem /= yd.d[d];
      offset += coord * xs[perm.d[d]];
    }
    y[k] = x[offset];
  }
}

// y[o, j, i] = x[o, start + j, i] for j < ny (x has nx along the middle).
template <typename W>
__global__ void sliceKernel(const W *x, W *y, int64_t outer, int64_t nx, int64_t ny, int64_t start, int64_t inner) {
  PARAX_GRID_STRIDE(k, outer * ny * inner) {
    int64_t i = k % inner, j = (k / inner) % ny, o = k / (inner * ny);
    y[k] = x[(o * nx + start + j) * inner + i];
  }
}

// The inverse: place x (ny along the middle) at `start` of y (nx).
template <typename W>
__global__ void placeKernel(const W *x, W *y, int64_t outer, int64_t nx, int64_t ny, int64_t start, int64_t inner) {
  PARAX_GRID_STRIDE(k, outer * ny * inner) {
    int64_t i = k % inner, j = (k / inner) % ny, o = k / (inner * ny);
    y[(o * nx + start + j) * inner + i] = x[k];
  }
}

// Rows first, first + stride, .. of a [P, h] table (n = S * h elements):
// a rank's positions of a sequence dealt out over ranks.
template <typename W>
__global__ void strideRowsKernel(const W *table, W *y, int64_t n, int64_t h, int64_t first, int64_t stride) {
  PARAX_GRID_STRIDE(k, n) y[k] = table[(first + (k / h) * stride) * h + k % h];
}

// Rows *position .. + S - 1 of a [P, h] table (n = S * h elements).
template <typename W>
__global__ void positionRowsKernel(const W *table, const int32_t *position, W *y, int64_t n, int64_t h) {
  PARAX_GRID_STRIDE(k, n) y[k] = table[*position * h + k];
}

// A ring's window [B, C + S, row]: the ring's rows of positions *position -
// C .. *position - 1 (position t in row t mod C), then the step's rows.
template <typename W>
__global__ void ringWindowKernel(const W *ring, const W *update, const int32_t *position, W *window, int64_t B,
                                 int64_t C, int64_t S, int64_t row) {
  int64_t at = *position;
  PARAX_GRID_STRIDE(k, B * (C + S) * row) {
    int64_t i = k % row, r = (k / row) % (C + S), b = k / (row * (C + S));
    window[k] = r < C ? ring[(b * C + ((at - C + r) % C + C) % C) * row + i] : update[(b * S + r - C) * row + i];
  }
}

// A step's rows [B, S, row] written into a ring [B, C, row]: row i at
// (*position + i) mod C, the last C of them.
template <typename W>
__global__ void ringWriteKernel(const W *update, const int32_t *position, W *ring, int64_t B, int64_t C, int64_t S,
                                int64_t row) {
  int64_t at = *position, first = S > C ? S - C : 0;
  if (at < 0) return;
  PARAX_GRID_STRIDE(k, B * (S - first) * row) {
    int64_t i = k % row, s = first + (k / row) % (S - first), b = k / (row * (S - first));
    ring[(b * C + (at + s) % C) * row + i] = update[(b * S + s) * row + i];
  }
}

// A step's rows [B, S, row] written into a cache [B, C, row] at *position
// (checked on the host; a position out of range writes nothing).
template <typename W>
__global__ void cacheWriteKernel(const W *update, const int32_t *position, W *cache, int64_t B, int64_t C, int64_t S,
                                 int64_t row) {
  int64_t at = *position;
  if (at < 0 || at + S > C) return;
  PARAX_GRID_STRIDE(k, B * S * row) {
    int64_t i = k % row, s = (k / row) % S, b = k / (row * S);
    cache[(b * C + at + s) * row + i] = update[k];
  }
}

// Each row's index of its largest value, the first of equal ones (as
// std::max_element on the host): greedy decoding's next token, so that a
// generation step copies one index a row to the host, not its logits.
template <typename T> __global__ void argmaxRowsKernel(const T *x, int32_t *index, int64_t V) {
  __shared__ float best[kThreads];
  __shared__ int64_t where[kThreads];
  const T *row = x + blockIdx.x * V;
  float b = -INFINITY;
  int64_t w = -1;
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x) {
    float v = ld(row, c);
    if (w < 0 || v > b) b = v, w = c;
  }
  best[threadIdx.x] = b;
  where[threadIdx.x] = w;
  __syncthreads();
  for (int step = blockDim.x / 2; step > 0; step /= 2) {
    if (threadIdx.x < step) {
      int i = threadIdx.x, j = threadIdx.x + step;
      if (where[j] >= 0 && (where[i] < 0 || best[j] > best[i] || (best[j] == best[i] && where[j] < where[i])))
        best[i] = best[j], where[i] = where[j];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) index[blockIdx.x] = static_cast<int32_t>(where[0]);
}

// One token's scores (softmax or sigmoid of its logits `l`) and its top-k
// experts, best first (`chosen`, K <= 64): the largest scores + bias within
// the kept groups, as the CPU backend chooses them (chooseExperts). `choice`
// is E floats of scratch.
template <typename T>
__device__ void routeToken(const float *l, const T *bias, float *scores, float *choice, int64_t E, int64_t K,
                           bool sigmoidScores, int64_t groups, int64_t topkGroups, int32_t *chosen) {
  float m = -INFINITY, sum = 0;
  for (int64_t e = 0; e < E; ++e) m = fmaxf(m, l[e]);
  for (int64_t e = 0; e < E; ++e) {
    scores[e] = sigmoidScores ? 1.0f / (1.0f + expf(-l[e])) : expf(l[e] - m);
    sum += scores[e];
  }
  if (!sigmoidScores) for (int64_t e = 0; e < E; ++e) scores[e] /= sum;
  for (int64_t e = 0; e < E; ++e) choice[e] = scores[e] + (bias ? ld(bias, e) : 0.0f);
  chooseExperts(choice, E, K, groups, topkGroups, chosen);
}

// One thread per token: scores, choice (+bias, groups), top-k weights/indices.
// The logits come from a GEMM in fp32; bias and weights have the storage T.
template <typename T>
__global__ void routerKernel(const float *logits, const T *bias, float *scratch, T *weights, int32_t *indices,
                             int64_t tokens, int64_t E, int64_t K, bool sigmoidScores, bool normalize,
                             float scaling, int64_t groups, int64_t topkGroups) {
  int64_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  float *scores = scratch + t * 2 * E;
  int32_t chosen[64];
  routeToken(logits + t * E, bias, scores, scores + E, E, K, sigmoidScores, groups, topkGroups, chosen);
  float total = 0;
  for (int64_t j = 0; j < K; ++j) total += scores[chosen[j]];
  for (int64_t j = 0; j < K; ++j) {
    indices[t * K + j] = chosen[j];
    float w = scores[chosen[j]];
    if (normalize) w /= (total + 1e-20f);
    st(weights, t * K + j, w * scaling);
  }
}

// Experts as GEMMs: the pairs (token, choice) grouped by expert -- perm
// lists them expert by expert, and pos is the inverse -- so that each
// expert's rows run through cuBLAS together. One thread per pair, with
// atomics: the order within an expert is arbitrary, which changes nothing
// (each row's GEMM result depends on its own row only, and every token
// reads its rows back through pos in its own order).
__global__ void expertCountKernel(const int32_t *idx, int32_t *count, int64_t pairs, int64_t E) {
  PARAX_GRID_STRIDE(k, pairs) {
    int32_t e = idx[k];
    if (e >= 0 && e < E) atomicAdd(&count[e], 1); // e < 0: an unused dispatch row
  }
}

// `cursor` starts at each expert's first row and ends past its last.
__global__ void expertOrderKernel(const int32_t *idx, int32_t *cursor, int32_t *perm, int32_t *pos, int64_t pairs,
                                  int64_t E) {
  PARAX_GRID_STRIDE(k, pairs) {
    int32_t e = idx[k];
    if (e < 0 || e >= E) continue;
    int32_t row = atomicAdd(&cursor[e], 1);
    perm[row] = static_cast<int32_t>(k);
    pos[k] = row;
  }
}

// xg[r, :] = x[token of pair perm[r], :]; zero where perm[r] < 0 (rows past
// the last expert's, when unused dispatch rows leave them empty).
template <typename W>
__global__ void gatherRowsKernel(const W *x, const int32_t *perm, W *xg, int64_t rows, int64_t K, int64_t h) {
  PARAX_GRID_STRIDE(i, rows * h) {
    int32_t pair = perm[i / h];
    xg[i] = pair < 0 ? W(0) : x[(pair / K) * h + i % h];
  }
}

// Each expert's first row (and a cursor for expertOrderKernel): an
// exclusive scan of the counts, on the device (no host round trip).
__global__ void expertOffsetsKernel(const int32_t *count, int32_t *offset, int32_t *cursor, int64_t E) {
  int32_t total = 0;
  for (int64_t e = 0; e < E; ++e) {
    offset[e] = cursor[e] = total;
    total += count[e];
  }
}

//===----------------------------------------------------------------------===//
// Few-row linears (a decode step's: m <= FewRows::kMaxRows rows), y[m, n] =
// x[m, k] . W: a GEMM's tiles of 64-128 rows would hold mostly nothing,
// where these read each byte of W once, 16 bytes a load; one kernel for
// each way W is stored.
//===----------------------------------------------------------------------===//

struct FewRows {
  static constexpr int kMaxRows = 8, kWarps = 8, kThreads = 32 * kWarps;
  /// W stored [n, k]: the columns (rows of W) a warp computes.
  static constexpr int kWarpColumns = 4;
  /// Columns a block covers (32 lanes of 16 bytes of W each).
  static constexpr int64_t columns(int64_t wBytes) { return 32 * (16 / wBytes); }
  /// The k splits for an [m, k] x [k, n] product on `sms` multiprocessors:
  /// enough blocks for about 4 a multiprocessor, each warp at least 16 rows
  /// of k, the partials (splits x m x n floats) at most 1/16 of W's bytes.
  static int64_t splits(int64_t m, int64_t k, int64_t n, int64_t wBytes, int64_t sms) {
    int64_t tiles = (n + columns(wBytes) - 1) / columns(wBytes);
    int64_t wanted = (4 * sms + tiles - 1) / tiles;
    int64_t rowsCap = std::max<int64_t>(1, k / (16 * kWarps));
    int64_t bytesCap = std::max<int64_t>(1, k * wBytes / (16 * 4 * m));
    return std::max<int64_t>(1, std::min({wanted, rowsCap, bytesCap}));
  }
  /// Whether W ([k, n], or `transposed` [n, k]) can be read 16 bytes at a
  /// time: its rows' length a multiple of 16 bytes, its start aligned.
  static bool fits(int64_t m, int64_t k, int64_t n, bool transposed, int64_t wBytes, const void *w) {
    return m >= 1 && m <= kMaxRows && (transposed ? k : n) % (16 / wBytes) == 0 &&
           reinterpret_cast<uintptr_t>(w) % 16 == 0;
  }
};

// The rows (R) and the x, W and y storage types of one few-row kernel.
template <int Rows, typename X, typename W, typename Y = float> struct FewRowsShape {
  static constexpr int R = Rows;
  using TX = X;
  using TW = W;
  using TY = Y;
};

// x[r, kk] as the product takes it: in bf16 for a bf16 W, as the GEMMs'
// tensor cores do.
template <typename TW, typename TX> __device__ __forceinline__ float fewRowsX(const TX *x, int64_t i) {
  return sizeof(TW) == 2 ? __bfloat162float(__float2bfloat16(ld(x, i))) : ld(x, i);
}

// W stored [n, k] (transpose_w: a Hugging Face projection's layout): this
// warp's FewRows::kWarpColumns neighbouring columns of y from col0, over
// the whole of k, for `rows` (at most R) rows of x; its lanes read each
// column's row of W 16 bytes at a time (32 lanes, 512 bytes a step) and the
// matching V values of each x row once for all the warp's columns; the
// lanes' sums meet in `sums` (the warp's own) and one lane a (column, row)
// writes y (+ bias). Every warp of the block calls it (a barrier inside).
template <typename Shape>
__device__ __forceinline__ void fewRowsTransposedColumns(const typename Shape::TX *x, const typename Shape::TW *w,
                                                         const typename Shape::TY *bias, typename Shape::TY *y,
                                                         int64_t k, int64_t n, int rows, int64_t col0,
                                                         float (*sums)[33]) {
  using TW = typename Shape::TW;
  constexpr int R = Shape::R, V = 16 / sizeof(TW), C = FewRows::kWarpColumns;
  const int lane = threadIdx.x % 32;
  float acc[C][R];
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) acc[c][r] = 0.0f;
  using TX = typename Shape::TX;
  // x's V values a row a step in whole 16-byte loads where its rows allow
  // (every row start aligned; else one value at a time: a view of x that
  // does not start on 16 bytes).
  constexpr int XE = 16 / sizeof(TX);
  static_assert(V % XE == 0, "an fp32 W takes fp32 x");
  const bool xPacked = aligned16(x) && (k * sizeof(TX)) % 16 == 0;
  for (int64_t kk = (int64_t)lane * V; kk < k; kk += 32 * V) {
    float xs[R][V];
    for (int r = 0; r < R; ++r) {
      if (r >= rows) {
        for (int e = 0; e < V; ++e) xs[r][e] = 0.0f;
      } else if (xPacked) {
        for (int e0 = 0; e0 < V; e0 += XE) {
          Pack16 pack = *reinterpret_cast<const Pack16 *>(x + r * k + kk + e0);
          TX part[XE];
          std::memcpy(part, &pack, sizeof pack);
          for (int e = 0; e < XE; ++e) xs[r][e0 + e] = fewRowsX<TW>(part, e);
        }
      } else {
        for (int e = 0; e < V; ++e) xs[r][e] = fewRowsX<TW>(x, r * k + kk + e);
      }
    }
    for (int c = 0; c < C; ++c) {
      if (col0 + c >= n) break;
      Pack16 pack = *reinterpret_cast<const Pack16 *>(w + (col0 + c) * k + kk);
      TW values[V];
      std::memcpy(values, &pack, sizeof pack);
      for (int r = 0; r < R; ++r)
        for (int e = 0; e < V; ++e) acc[c][r] += xs[r][e] * ld(values, e);
    }
  }
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) sums[c * R + r][lane] = acc[c][r];
  __syncthreads();
  if (lane < C * R) {
    const int c = lane / R, r = lane % R;
    const int64_t col = col0 + c;
    if (col < n && r < rows) {
      float sum = 0.0f;
      for (int l = 0; l < 32; ++l) sum += sums[lane][l];
      if (bias) sum += ld(bias, col);
      st(y, r * n + col, sum);
    }
  }
}

// Each warp kWarpColumns columns of y for x's R rows (fewRowsTransposedColumns).
// No splits, no scratch.
template <typename Shape>
__global__ void fewRowsLinearTransposedKernel(const typename Shape::TX *x, const typename Shape::TW *w,
                                              const typename Shape::TY *bias, typename Shape::TY *y, int64_t k,
                                              int64_t n) {
  __shared__ float sums[FewRows::kWarps][FewRows::kWarpColumns * Shape::R][33]; // (33: a lane's words in different banks)
  const int warp = threadIdx.x / 32;
  const int64_t col0 = ((int64_t)blockIdx.x * FewRows::kWarps + warp) * FewRows::kWarpColumns;
  fewRowsTransposedColumns<Shape>(x, w, bias, y, k, n, Shape::R, col0, sums[warp]);
}

// The experts' projections at decode size (experts' weights stacked [E, n,
// k]): block (column tile, expert e) reads e's row count and first row
// from the device (no host synchronisation) and runs its rows R at a time
// through fewRowsTransposedColumns, so each expert's weights are read once
// for every R of its rows, an expert without rows not at all.
template <typename Shape>
__global__ void groupedFewRowsKernel(const typename Shape::TX *x, const typename Shape::TW *w, typename Shape::TY *y,
                                     const int32_t *count, const int32_t *offset, int64_t n, int64_t k) {
  constexpr int R = Shape::R;
  __shared__ float sums[FewRows::kWarps][FewRows::kWarpColumns * R][33];
  const int64_t e = blockIdx.y;
  const int64_t m = count[e], first = offset[e]; // (the same for the whole block)
  const int warp = threadIdx.x / 32;
  const int64_t col0 = ((int64_t)blockIdx.x * FewRows::kWarps + warp) * FewRows::kWarpColumns;
  const typename Shape::TW *weights = w + e * n * k;
  for (int64_t r0 = 0; r0 < m; r0 += R) {
    fewRowsTransposedColumns<Shape>(x + (first + r0) * k, weights, nullptr, y + (first + r0) * n, k, n,
                                    static_cast<int>(m - r0 < R ? m - r0 : R), col0, sums[warp]);
    __syncthreads(); // (the next rows' sums overwrite these)
  }
}

// W stored [k, n]: block (column tile c, k split p), each lane owning
// V = 16 / sizeof(W) neighbouring columns of the tile's 32 V, each of the
// kWarps warps every kWarps-th row of the split's k range, every x value
// read by a whole warp at one address; the warps' sums meet in shared
// memory and partial[p][r][col] gets the block's. fewRowsCombineKernel
// adds the splits (and the bias) into y. The splits give the device
// enough blocks (about 4 a multiprocessor) while the partials stay small
// against W.
template <typename Shape>
__global__ void fewRowsLinearKernel(const typename Shape::TX *x, const typename Shape::TW *w, float *partial,
                                    int64_t k, int64_t n, int64_t kPerSplit) {
  using TW = typename Shape::TW;
  constexpr int R = Shape::R, V = 16 / sizeof(TW), C = 32 * V;
  __shared__ float sums[R * C]; // [r][e][lane]: a warp's lanes add to 32 neighbouring words
  for (int i = threadIdx.x; i < R * C; i += blockDim.x) sums[i] = 0.0f;
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t col = blockIdx.x * (int64_t)C + lane * V;
  const int64_t k0 = blockIdx.y * kPerSplit, k1 = min(k, k0 + kPerSplit);
  float acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int e = 0; e < V; ++e) acc[r][e] = 0.0f;
  if (col < n) {
    for (int64_t kk = k0 + warp; kk < k1; kk += FewRows::kWarps) {
      Pack16 pack = *reinterpret_cast<const Pack16 *>(w + kk * n + col);
      TW values[V];
      std::memcpy(values, &pack, sizeof pack);
      for (int r = 0; r < R; ++r) {
        float xr = fewRowsX<TW>(x, r * k + kk);
        for (int e = 0; e < V; ++e) acc[r][e] += xr * ld(values, e);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int e = 0; e < V; ++e) atomicAdd(&sums[(r * V + e) * 32 + lane], acc[r][e]);
  __syncthreads();
  const int64_t base = blockIdx.x * (int64_t)C;
  for (int i = threadIdx.x; i < R * C; i += blockDim.x) {
    int r = i / C, c = i % C;
    if (base + c < n) partial[((int64_t)blockIdx.y * R + r) * n + base + c] = sums[(r * V + c % V) * 32 + c / V];
  }
}

// y[r, col] = the splits' partials summed (+ bias[col]).
template <typename TY>
__global__ void fewRowsCombineKernel(const float *partial, const TY *bias, TY *y, int64_t m, int64_t n,
                                     int64_t splits) {
  PARAX_GRID_STRIDE(i, m * n) {
    float sum = 0.0f;
    for (int64_t p = 0; p < splits; ++p) sum += partial[p * m * n + i];
    if (bias) sum += ld(bias, i % n);
    st(y, i, sum);
  }
}

//===----------------------------------------------------------------------===//
// Grouped expert GEMM: y[r, :] = x[r, :] . W_e^T for every row r of every
// expert e (rows offset[e] .. offset[e] + count[e], sizes on the device),
// W stacked [E, N, K], x [rows, K], y [rows, N] fp32. One launch for all
// experts and no host synchronisation (so it can be captured in a graph).
// Blocks tile (expert, 64 rows) x 64 columns; blockIdx.x counts the tiles
// of every expert in turn, the grid holding ceil(rows / 64) + E of them
// (an upper bound); blocks past the last tile exit.
//===----------------------------------------------------------------------===//

struct GroupedTiles {
  static constexpr int kRows = 64, kCols = 64, kDepth = 32, kThreads = 128;
  // Dynamic shared memory bytes: x and W tiles (bf16, rows padded by 8)
  // and the output tile (fp32, padded by 4); the fp32 kernel's tiles fit.
  static constexpr int kPadded = kDepth + 8, kOutLd = kCols + 4;
  static constexpr size_t bytes() { return 2 * 2 * kRows * kPadded + 4 * kRows * kOutLd; }
  static int64_t blocks(int64_t rows, int64_t E) { return (rows + kRows - 1) / kRows + E; }
};

// The expert and row tile of block `tile`, or expert -1 (to be called by
// one thread; O(E)).
__device__ void findExpertTile(const int32_t *count, int64_t E, int64_t tile, int64_t *expert, int64_t *rowTile) {
  *expert = -1;
  for (int64_t e = 0; e < E; ++e) {
    int64_t tiles = (count[e] + GroupedTiles::kRows - 1) / GroupedTiles::kRows;
    if (tile < tiles) {
      *expert = e;
      *rowTile = tile;
      return;
    }
    tile -= tiles;
  }
}

// bf16 x and W on tensor cores (WMMA 16x16x16, fp32 accumulation): each of
// the 4 warps computes 16 rows x 64 columns.
__global__ void groupedGemmTensorCoreKernel(const __nv_bfloat16 *x, const __nv_bfloat16 *w, float *y,
                                            const int32_t *count, const int32_t *offset, int64_t E, int64_t N,
                                            int64_t K) {
  using namespace nvcuda;
  constexpr int BM = GroupedTiles::kRows, BN = GroupedTiles::kCols, BK = GroupedTiles::kDepth;
  constexpr int LD = GroupedTiles::kPadded, LDO = GroupedTiles::kOutLd;
  PARAX_DYNAMIC_SHARED(float, shared);
  auto *xs = reinterpret_cast<__nv_bfloat16 *>(shared); // [BM][LD]
  __nv_bfloat16 *ws = xs + BM * LD;                     // [BN][LD]: W rows are output columns
  auto *os = reinterpret_cast<float *>(ws + BN * LD);  // [BM][LDO]
  __shared__ int64_t where[2];
  if (threadIdx.x == 0) findExpertTile(count, E, blockIdx.x, &where[0], &where[1]);
  __syncthreads();
  int64_t e = where[0];
  if (e < 0) return; // the whole block: past the last tile
  int64_t first = where[1] * BM, rows = min((int64_t)BM, (int64_t)count[e] - first);
  int64_t row0 = offset[e] + first, n0 = blockIdx.y * (int64_t)BN;
  int64_t cols = min((int64_t)BN, N - n0);
  const __nv_bfloat16 *we = w + e * N * K;
  int warp = threadIdx.x / 32;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[BN / 16];
  for (auto &a : acc) wmma::fill_fragment(a, 0.0f);
  const __nv_bfloat16 zero = __float2bfloat16(0.0f);
  for (int64_t k0 = 0; k0 < K; k0 += BK) {
    for (int i = threadIdx.x; i < BM * BK; i += blockDim.x) {
      int r = i / BK, c = i % BK;
      bool inside = r < rows && k0 + c < K;
      xs[r * LD + c] = inside ? x[(row0 + r) * K + k0 + c] : zero;
    }
    for (int i = threadIdx.x; i < BN * BK; i += blockDim.x) {
      int n = i / BK, c = i % BK;
      bool inside = n < cols && k0 + c < K;
      ws[n * LD + c] = inside ? we[(n0 + n) * K + k0 + c] : zero;
    }
    __syncthreads();
    for (int kk = 0; kk < BK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
      wmma::load_matrix_sync(fa, xs + warp * 16 * LD + kk, LD);
      for (int j = 0; j < BN / 16; ++j) {
        // W^T as a column-major k x n matrix: element (k, n) at ws[n * LD + k].
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
        wmma::load_matrix_sync(fb, ws + j * 16 * LD + kk, LD);
        wmma::mma_sync(acc[j], fa, fb, acc[j]);
      }
    }
    __syncthreads();
  }
  for (int j = 0; j < BN / 16; ++j)
    wmma::store_matrix_sync(os + warp * 16 * LDO + j * 16, acc[j], LDO, wmma::mem_row_major);
  __syncthreads();
  for (int i = threadIdx.x; i < BM * BN; i += blockDim.x) {
    int r = i / BN, c = i % BN;
    if (r < rows && c < cols) y[(row0 + r) * N + n0 + c] = os[r * LDO + c];
  }
}

// fp32 x and W on CUDA cores (fp32 programs keep fp32 math): each thread
// computes 4 rows x 8 columns of the tile.
__global__ void groupedGemmKernel(const float *x, const float *w, float *y, const int32_t *count,
                                  const int32_t *offset, int64_t E, int64_t N, int64_t K) {
  constexpr int BM = GroupedTiles::kRows, BN = GroupedTiles::kCols, BK = GroupedTiles::kDepth;
  constexpr int LD = BK + 1; // odd: columns of a tile fall in different banks
  PARAX_DYNAMIC_SHARED(float, shared);
  float *xs = shared, *ws = shared + BM * LD; // [BM][LD], [BN][LD]
  __shared__ int64_t where[2];
  if (threadIdx.x == 0) findExpertTile(count, E, blockIdx.x, &where[0], &where[1]);
  __syncthreads();
  int64_t e = where[0];
  if (e < 0) return;
  int64_t first = where[1] * BM, rows = min((int64_t)BM, (int64_t)count[e] - first);
  int64_t row0 = offset[e] + first, n0 = blockIdx.y * (int64_t)BN;
  int64_t cols = min((int64_t)BN, N - n0);
  const float *we = w + e * N * K;
  int tr = threadIdx.x / 8, tc = threadIdx.x % 8; // rows tr*4.., columns tc*8..
  float acc[4][8] = {};
  for (int64_t k0 = 0; k0 < K; k0 += BK) {
    for (int i = threadIdx.x; i < BM * BK; i += blockDim.x) {
      int r = i / BK, c = i % BK;
      xs[r * LD + c] = r < rows && k0 + c < K ? x[(row0 + r) * K + k0 + c] : 0.0f;
    }
    for (int i = threadIdx.x; i < BN * BK; i += blockDim.x) {
      int n = i / BK, c = i % BK;
      ws[n * LD + c] = n < cols && k0 + c < K ? we[(n0 + n) * K + k0 + c] : 0.0f;
    }
    __syncthreads();
    for (int c = 0; c < BK; ++c)
      for (int i = 0; i < 4; ++i) {
        float a = xs[(tr * 4 + i) * LD + c];
        for (int j = 0; j < 8; ++j) acc[i][j] += a * ws[(tc * 8 + j) * LD + c];
      }
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 8; ++j) {
      int r = tr * 4 + i, c = tc * 8 + j;
      if (r < rows && c < cols) y[(row0 + r) * N + n0 + c] = acc[i][j];
    }
}

// y[t, :] = sum over token t's pairs j (in order) of w[t, j] * down[pos[t, j], :]
template <typename T>
__global__ void expertsCombineKernel(const float *down, const T *w, const int32_t *pos, T *y, int64_t tokens,
                                     int64_t K, int64_t h) {
  PARAX_GRID_STRIDE(i, tokens * h) {
    int64_t t = i / h, c = i % h;
    float a = 0.0f;
    for (int64_t j = 0; j < K; ++j) {
      int32_t r = pos[t * K + j];
      float weight = w ? ld(w, t * K + j) : 1.0f; // (no weights: the rows' sum, the experts' dx)
      if (r >= 0) a += weight * down[r * h + c]; // r < 0: an unused dispatch row
    }
    st(y, i, a);
  }
}

// MoE exchanges (the CPU backend's layout): this rank's pairs leave grouped
// by the member owning their expert (dest = idx[k] / local), in order: pair
// k's row is slot[k] = (the pairs for members before dest) + (its order
// among dest's); counts[dest] of them. A row is [x row | weight | local
// expert, -1 when empty], the last two in fp32 whatever the storage. One
// block; a thread per destination walks the pairs.
__global__ void moeSlotsKernel(const int32_t *idx, int32_t *slot, int32_t *counts, int64_t pairs, int64_t local,
                               int64_t P) {
  for (int64_t dest = threadIdx.x; dest < P; dest += blockDim.x) {
    int64_t n = 0;
    for (int64_t k = 0; k < pairs; ++k)
      if (idx[k] >= 0 && idx[k] / local == dest) ++n;
    counts[dest] = static_cast<int32_t>(n);
  }
  __syncthreads();
  for (int64_t dest = threadIdx.x; dest < P; dest += blockDim.x) {
    int64_t fill = 0;
    for (int64_t d = 0; d < dest; ++d) fill += counts[d];
    for (int64_t k = 0; k < pairs; ++k)
      if (idx[k] >= 0 && idx[k] / local == dest) slot[k] = static_cast<int32_t>(fill++);
  }
}

// `slots` rows empty: zero, [weight 0, expert -1].
template <typename T> __global__ void moeClearKernel(T *rows, float *meta, int64_t slots, int64_t h) {
  PARAX_GRID_STRIDE(i, slots * (h + 2)) {
    if (i < slots * h) st(rows, i, 0.0f);
    else meta[i - slots * h] = (i - slots * h) % 2 == 1 ? -1.0f : 0.0f;
  }
}

// Each routed pair's row of x (its token's) into its slot, and the slot's
// [router weight, local expert].
template <typename T>
__global__ void moeFillKernel(const T *x, const T *w, const int32_t *idx, const int32_t *slot, T *rows, float *meta,
                              int64_t pairs, int64_t K, int64_t h, int64_t local) {
  PARAX_GRID_STRIDE(i, pairs * (h + 2)) {
    int64_t k = i / (h + 2), c = i % (h + 2);
    int64_t s = slot[k];
    if (s < 0) continue;
    if (c < h) rows[s * h + c] = x[(k / K) * h + c];
    else if (c == h) meta[s * 2] = ld(w, k);
    else meta[s * 2 + 1] = static_cast<float>(idx[k] % local);
  }
}

// The rows' [weight, expert] into the dispatch's results.
template <typename T>
__global__ void moeUnpackKernel(const float *meta, T *weights, int32_t *experts, int64_t slots) {
  PARAX_GRID_STRIDE(r, slots) {
    st(weights, r, meta[r * 2]);
    experts[r] = static_cast<int32_t>(meta[r * 2 + 1]);
  }
}

// y[t, c] = the sum over token t's pairs (in order) of their returned rows
// (`back`, row slot[k] for pair k): each of the `rows` result rows sums
// the `per` pairs it holds (a token's K choices; one with per_choice).
template <typename T>
__global__ void moeCombineKernel(const T *back, const int32_t *slot, T *y, int64_t rows, int64_t per, int64_t h) {
  PARAX_GRID_STRIDE(i, rows * h) {
    int64_t t = i / h, c = i % h;
    float a = 0.0f;
    for (int64_t j = 0; j < per; ++j) {
      int64_t s = slot[t * per + j];
      if (s >= 0) a += ld(back, s * h + c);
    }
    st(y, i, a);
  }
}

// A row of logits' maximum and sum of exp(l - max), on every thread.
struct SoftmaxStats {
  float max, sum;
};
template <typename T> __device__ SoftmaxStats softmaxStats(float *partial, const T *l, int64_t V) {
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x) m = fmaxf(m, ld(l, c));
  m = blockReduce(partial, m, true);
  float s = 0;
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x) s += expf(ld(l, c) - m);
  return SoftmaxStats{m, blockReduce(partial, s, false)};
}

// A label the cross-entropy counts: any but `ignore` (ignore_index) where
// `ignores` is set.
struct LabelRule {
  bool ignores = false;
  int32_t ignore = 0;
  float weight = 1; // the loss's weight (a multi-token prediction depth's share)
  __device__ bool skips(int32_t label) const { return ignores && label == ignore; }
};

// Vocab-parallel cross-entropy: this rank's logits are the vocabulary's
// columns `offset .. offset + V - 1` of `vocab`, and `lse` every token's
// logsumexp over all of them; without `lse`, the whole vocabulary is here.
struct VocabPart {
  const float *lse = nullptr;
  int64_t offset = 0;
  int64_t vocab = 0;
};

// One block per row: y[row] = log(sum(exp(x[row, :]))).
template <typename T> __global__ void logSumExpKernel(const T *x, float *y, int64_t n) {
  __shared__ float partial[kThreads];
  SoftmaxStats stats = softmaxStats(partial, x + blockIdx.x * n, n);
  if (threadIdx.x == 0) y[blockIdx.x] = isinf(stats.max) ? stats.max : stats.max + logf(stats.sum);
}

// One block per token; a label outside the vocabulary is reported through
// `badToken` (the host turns it into an error, as the CPU backend does);
// an ignored one adds nothing. Vocab-parallel: the term of a label this
// rank holds, lse - logit.
template <typename T>
__global__ void crossEntropyKernel(const T *logits, const int32_t *labels, float *total, int64_t V,
                                   int32_t *badToken, LabelRule rule, VocabPart part) {
  __shared__ float partial[kThreads];
  const T *l = logits + blockIdx.x * V;
  int32_t label = labels[blockIdx.x];
  if (rule.skips(label)) return; // (the whole block: no barrier is left waiting)
  if (part.lse) {
    if (threadIdx.x != 0) return;
    if (label < 0 || label >= part.vocab) *badToken = static_cast<int32_t>(blockIdx.x);
    else if (label >= part.offset && label < part.offset + V)
      atomicAdd(total, part.lse[blockIdx.x] - ld(l, label - part.offset));
    return;
  }
  SoftmaxStats stats = softmaxStats(partial, l, V);
  if (threadIdx.x == 0) {
    if (label < 0 || label >= V) *badToken = static_cast<int32_t>(blockIdx.x);
    else atomicAdd(total, logf(stats.sum) + stats.max - ld(l, label));
  }
}

__global__ void scaleKernel(float *x, int64_t n, float factor) {
  PARAX_GRID_STRIDE(k, n) x[k] *= factor;
}

// x *= factor in fp32 math, stored in T (Gemma's scaled embeddings).
template <typename T> __global__ void scaleValuesKernel(T *x, int64_t n, float factor) {
  PARAX_GRID_STRIDE(k, n) st(x, k, ld(x, k) * factor);
}

// x / count: the mean over the counted labels (label_count's; none
// counted: x, a sum of nothing, stays 0).
__global__ void divideByCountKernel(float *x, int64_t n, const float *count) {
  PARAX_GRID_STRIDE(k, n) x[k] /= *count > 0 ? *count : 1.0f;
}

// One thread per element of [rows, S] ids: y[r, s] = x[r, s + shift], or
// `fill` past the sequence.
__global__ void shiftKernel(const int32_t *x, int32_t *y, int64_t n, int64_t S, int64_t shift, int32_t fill) {
  PARAX_GRID_STRIDE(k, n) y[k] = k % S + shift < S ? x[k + shift] : fill;
}

// *x = value (one thread).
__global__ void storeKernel(float *x, float value) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *x = value;
}

// One thread per label: the labels not ignored, counted into `count`
// (zeroed first).
__global__ void labelCountKernel(const int32_t *labels, int64_t n, int32_t ignore, float *count) {
  PARAX_GRID_STRIDE(k, n) if (labels[k] != ignore) atomicAdd(count, 1.0f);
}

} // namespace

} // namespace parax::runtime

#endif // PARAX_RUNTIME_CUDA_KERNELS_CUH
