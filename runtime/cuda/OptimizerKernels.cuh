// OptimizerKernels.cuh - the kernels of the optimizer on the device
// (CudaExecutor::bindOptimizer and what follows it): gradients summed over
// microbatches, their squares, and the SGD and AdamW updates of fp32 master
// copies rounded into the parameters' storage. The arithmetic is parax-run's
// host optimizer's (Training::apply), in the same precision: fp32 storage,
// double for each element's update.
// Included by CudaExecutor.cu only (one translation unit).

#ifndef PARAX_RUNTIME_CUDA_OPTIMIZERKERNELS_CUH
#define PARAX_RUNTIME_CUDA_OPTIMIZERKERNELS_CUH

#include "Kernels.cuh"

namespace parax::runtime {

namespace {

// A microbatch's gradient (stored as T) added to the step's fp32 sums; the
// step's first replaces them.
template <typename T> __global__ void accumulateKernel(const T *grad, float *sum, int64_t n, int first) {
  PARAX_GRID_STRIDE(k, n) sum[k] = first ? ld(grad, k) : sum[k] + ld(grad, k);
}

// ZeRO-2's staging of one part of a reduce-scatter: `rows` blocks of
// `width` fp32 values, block r from the gradient's (n values, stored as T,
// zero past n) values [r * stride + offset, + width): each rank's piece
// of its chunk, side by side, as a reduce-scatter takes them. With `sum`,
// block `own` also gets this rank's running sums [offset, + width).
template <typename T>
__global__ void stagePartKernel(const T *grad, int64_t n, float *staged, int64_t rows, int64_t stride, int64_t offset,
                                int64_t width, const float *sum, int64_t own) {
  PARAX_GRID_STRIDE(k, rows * width) {
    int64_t r = k / width, c = k - r * width, at = r * stride + offset + c;
    float v = at < n ? ld(grad, at) : 0.0f;
    staged[k] = sum && r == own ? v + sum[offset + c] : v;
  }
}

// A gradient's parts from `pieces` stages added in stage order into
// `mine` (stage `at`'s; `others` holds the rest, n values each, in stage
// order): every stage computes the same sum.
__global__ void sumPartsKernel(float *mine, const float *others, int64_t n, int pieces, int at) {
  PARAX_GRID_STRIDE(k, n) {
    float sum = 0.0f;
    for (int j = 0; j < pieces; ++j) sum += j == at ? mine[k] : others[(j < at ? j : j - 1) * n + k];
    mine[k] = sum;
  }
}

// Adds the sum of the squares of x's n values to *total (in double, as the
// host's global norm sums them).
__global__ void sumOfSquaresKernel(const float *x, int64_t n, double *total) {
  __shared__ double partial[kThreads];
  double s = 0;
  PARAX_GRID_STRIDE(k, n) s += static_cast<double>(x[k]) * x[k];
  partial[threadIdx.x] = s;
  __syncthreads();
  for (int step = blockDim.x / 2; step > 0; step /= 2) {
    if (threadIdx.x < step) partial[threadIdx.x] += partial[threadIdx.x + step];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(total, partial[0]);
}

struct UpdateArgs {
  double lr, beta1, beta2, eps, decay, clip, correction1, correction2;
};

// AdamW with decoupled weight decay, element k: the moments and the master
// in fp32, the arithmetic in double; the new value rounded into the
// parameter's storage (T) too.
template <typename T>
__device__ void adamwElement(float *master, float *m, float *v, const float *grad, T *param, int64_t k,
                             const UpdateArgs &a) {
  double g = a.clip * grad[k];
  double mk = a.beta1 * m[k] + (1 - a.beta1) * g;
  double vk = a.beta2 * v[k] + (1 - a.beta2) * g * g;
  m[k] = static_cast<float>(mk);
  v[k] = static_cast<float>(vk);
  double value = master[k] * (1 - a.lr * a.decay);
  value -= a.lr * (mk / a.correction1) / (sqrt(vk / a.correction2) + a.eps);
  master[k] = static_cast<float>(value);
  st(param, k, master[k]);
}

// SGD with L2 weight decay, element k.
template <typename T>
__device__ void sgdElement(float *master, const float *grad, T *param, int64_t k, const UpdateArgs &a) {
  double g = a.clip * grad[k] + a.decay * master[k];
  master[k] = static_cast<float>(master[k] - a.lr * g);
  st(param, k, master[k]);
}

// One box's update.
template <typename T>
__global__ void adamwKernel(float *master, float *m, float *v, const float *grad, T *param, int64_t n,
                            UpdateArgs a) {
  PARAX_GRID_STRIDE(k, n) adamwElement(master, m, v, grad, param, k, a);
}
template <typename T> __global__ void sgdKernel(float *master, const float *grad, T *param, int64_t n, UpdateArgs a) {
  PARAX_GRID_STRIDE(k, n) sgdElement(master, grad, param, k, a);
}

// Many boxes' updates in one launch (as Apex's multi-tensor apply): box i
// takes blocks [firstBlock, next box's), kUpdateChunk values a block.
constexpr int64_t kUpdateChunk = 8 * kThreads;
template <typename T> struct UpdateBox {
  float *master, *m, *v; // (m, v: AdamW)
  const float *grad;
  T *param;
  int64_t n, firstBlock;
  double decay;
};
template <typename T>
__global__ void multiUpdateKernel(const UpdateBox<T> *boxes, int count, UpdateArgs a, bool adamw) {
  int lo = 0, hi = count - 1; // the last box whose first block is at most this one
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (boxes[mid].firstBlock <= static_cast<int64_t>(blockIdx.x))
      lo = mid;
    else
      hi = mid - 1;
  }
  const UpdateBox<T> b = boxes[lo];
  UpdateArgs args = a;
  args.decay = b.decay;
  const int64_t begin = (blockIdx.x - b.firstBlock) * kUpdateChunk, end = min(b.n, begin + kUpdateChunk);
  for (int64_t k = begin + threadIdx.x; k < end; k += blockDim.x) {
    if (adamw)
      adamwElement(b.master, b.m, b.v, b.grad, b.param, k, args);
    else
      sgdElement(b.master, b.grad, b.param, k, args);
  }
}

} // namespace

} // namespace parax::runtime

#endif // PARAX_RUNTIME_CUDA_OPTIMIZERKERNELS_CUH
