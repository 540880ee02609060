// cuda_bench - figures of the CUDA backend on one GPU (not a test):
//
//   parax-cuda-bench
//
// 1. GEMM: the backend's `linear` instruction (fp32, cuBLAS) against
//    cublasSgemm alone on the same device buffers and shapes (Llama-3-8B's
//    projections at 2048 tokens), with TF32 and bf16 cublasGemmEx as the
//    ceilings the fp32 path leaves on the table;
// 2. HBM: device-to-device copy bandwidth (bytes read + written), the
//    denominator of the decode lower bound (weight bytes / bandwidth);
// 3. which GELU cuBLASLt's GELU_BIAS epilogue computes (tanh or erf form);
// 4. few-row linears (a decode step's, bf16): the backend's few-row kernel
//    against the same program on cuBLAS (PARAX_FEW_ROWS=0), wall clock a
//    step (one CUDA graph launch), and cublasGemmEx alone (device time),
//    each as the weight bytes it streams a second, the few-row kernel's
//    against the copy's traffic (issue 47's bar: 0.8).
// Medians of repeated runs, timed with CUDA events (the backend: wall clock
// around run(), which returns when the GPU is done). Correctness of the
// linear output against cublasSgemm is checked in the same run.

#define OMPI_SKIP_MPICXX 1
#include "parax/runtime/Checkpoint.h"
#include "parax/runtime/CudaExecutor.h"
#include "BenchUtil.h"
#include "../runtime/cuda/GeluEpilogue.cuh"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <tuple>
#include <vector>

using namespace parax::runtime;
using namespace parax::bench;

namespace {

#define CHECK(x)                                                               \
  do {                                                                         \
    auto e_ = (x);                                                             \
    if (static_cast<int>(e_) != 0) {                                           \
      std::fprintf(stderr, "%s failed (%d) at line %d\n", #x,                 \
                   static_cast<int>(e_), __LINE__);                            \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)


// Seconds per call of `f` (GPU work on stream 0), median of `reps`.
double gpuTime(const std::function<void()> &f, int reps) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  f(); // warm-up
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    CHECK(cudaEventRecord(a));
    f();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms / 1e3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(t);
}



__global__ void toBf16(const float *x, __nv_bfloat16 *y, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16(x[i]);
}

void gemms() {
  auto ckpt = Checkpoint::open(emptyCheckpoint("/tmp/parax-cuda-bench-empty.safetensors"));
  if (!ckpt.isOk()) { std::printf("%s\n", ckpt.status().message().c_str()); std::exit(1); }
  cublasHandle_t blas;
  CHECK(cublasCreate(&blas));
  std::printf("GEMM TFLOP/s (median of 20; x[m,k] @ w[k,n]):\n"
              "  %-22s %9s %9s %7s %9s %9s %10s\n", "m x k x n", "linear", "sgemm", "ratio",
              "tf32", "bf16", "max diff");
  for (const auto &mkn : std::vector<std::tuple<int, int, int>>{
           {2048, 4096, 4096}, {2048, 4096, 1024}, {2048, 4096, 14336}, {2048, 14336, 4096},
           {2048, 4096, 128256}, {1, 4096, 14336}}) {
    const int m = std::get<0>(mkn), k = std::get<1>(mkn), n = std::get<2>(mkn);
    parax::pxe::Executable exe = linearProgram(m, k, n);
    Tensor x = Tensor::floats({m, k}), w = Tensor::floats({k, n});
    for (size_t i = 0; i < x.f.size(); ++i) x.f[i] = std::sin(0.001 * i);
    for (size_t i = 0; i < w.f.size(); ++i) w.f[i] = 0.01f * std::cos(0.001 * i);
    CudaExecutor ex;
    Status st = ex.prepare(exe, 0, nullptr, *ckpt.value(), {x, w}, 0);
    if (!st.isOk()) { std::printf("prepare: %s\n", st.message().c_str()); std::exit(1); }
    double tLinear = timeIt([&] { (void)ex.run(); }, 20);

    // The same product through cuBLAS alone (row-major: C^T = W^T X^T).
    float *dx, *dw, *dy;
    __nv_bfloat16 *bx, *bw;
    size_t nx = size_t(m) * k, nw = size_t(k) * n, ny = size_t(m) * n;
    CHECK(cudaMalloc(&dx, nx * 4));
    CHECK(cudaMalloc(&dw, nw * 4));
    CHECK(cudaMalloc(&dy, ny * 4));
    CHECK(cudaMalloc(&bx, nx * 2));
    CHECK(cudaMalloc(&bw, nw * 2));
    CHECK(cudaMemcpy(dx, x.f.data(), nx * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dw, w.f.data(), nw * 4, cudaMemcpyHostToDevice));
    toBf16<<<1024, 256>>>(dx, bx, nx);
    toBf16<<<1024, 256>>>(dw, bw, nw);
    const float one = 1, zero = 0;
    auto sgemm = [&] {
      CHECK(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, dw, n, dx, k, &zero, dy, n));
    };
    double tSgemm = gpuTime(sgemm, 20);
    std::vector<float> want(ny);
    CHECK(cudaMemcpy(want.data(), dy, ny * 4, cudaMemcpyDeviceToHost));
    Tensor got = ex.outputs()[0];
    float diff = 0;
    for (size_t i = 0; i < ny; ++i) diff = std::max(diff, std::fabs(got.f[i] - want[i]));
    double tTf32 = gpuTime([&] {
      CHECK(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, dw, CUDA_R_32F, n, dx,
                         CUDA_R_32F, k, &zero, dy, CUDA_R_32F, n, CUBLAS_COMPUTE_32F_FAST_TF32,
                         CUBLAS_GEMM_DEFAULT));
    }, 20);
    double tBf16 = gpuTime([&] {
      CHECK(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, bw, CUDA_R_16BF, n, bx,
                         CUDA_R_16BF, k, &zero, dy, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT));
    }, 20);
    double flops = 2.0 * m * k * n;
    char shape[64];
    std::snprintf(shape, sizeof shape, "%d x %d x %d", m, k, n);
    std::printf("  %-22s %9.1f %9.1f %6.1f%% %9.1f %9.1f %10.1e\n", shape, flops / tLinear / 1e12,
                flops / tSgemm / 1e12, 100 * tSgemm / tLinear, flops / tTf32 / 1e12,
                flops / tBf16 / 1e12, diff);
    cudaFree(dx); cudaFree(dw); cudaFree(dy); cudaFree(bx); cudaFree(bw);
  }
  cublasDestroy(blas);
}

void fewRowLinears(double copyBandwidth) {
  auto ckpt = Checkpoint::open(emptyCheckpoint("/tmp/parax-cuda-bench-empty.safetensors"));
  if (!ckpt.isOk()) { std::printf("%s\n", ckpt.status().message().c_str()); std::exit(1); }
  cublasHandle_t blas;
  CHECK(cublasCreate(&blas));
  std::printf("few-row linears, bf16, the weight's bytes a second in TB/s (median of 50; copy %.2f TB/s;\n"
              "W [n, k]: every model's projections; W [k, n]: GPT-2's):\n"
              "  %-28s %10s %10s %10s %10s %10s\n", copyBandwidth / 1e12, "m x k x n, W", "few-row", "cuBLAS",
              "cublasEx", "vs copy", "max diff");
  for (const auto &mknt : std::vector<std::tuple<int, int, int, bool>>{
           {1, 4096, 4096, true}, {1, 4096, 14336, true}, {1, 14336, 4096, true}, {8, 4096, 4096, true},
           {8, 4096, 14336, true}, {8, 14336, 4096, true}, {1, 4096, 14336, false}, {8, 4096, 14336, false}}) {
    const int m = std::get<0>(mknt), k = std::get<1>(mknt), n = std::get<2>(mknt);
    const bool transposed = std::get<3>(mknt);
    parax::pxe::Executable exe = linearProgram(m, k, n, transposed, parax::pxe::BF16);
    Tensor x = Tensor::floats({m, k}), w = Tensor::floats(transposed ? std::vector<int64_t>{n, k}
                                                                     : std::vector<int64_t>{k, n});
    for (size_t i = 0; i < x.f.size(); ++i) x.f[i] = std::sin(0.001 * i);
    for (size_t i = 0; i < w.f.size(); ++i) w.f[i] = 0.01f * std::cos(0.001 * i);
    auto timed = [&](const char *fewRows, std::vector<float> &out) {
      setenv("PARAX_FEW_ROWS", fewRows, 1); // (read at prepare)
      CudaExecutor ex;
      Status st = ex.prepare(exe, 0, nullptr, *ckpt.value(), {x, w}, 0);
      if (!st.isOk()) { std::printf("prepare: %s\n", st.message().c_str()); std::exit(1); }
      double t = timeIt([&] { (void)ex.run(); }, 50);
      out = ex.outputs()[0].f;
      return t;
    };
    std::vector<float> few, blasOut;
    double tFew = timed("1", few), tBlas = timed("0", blasOut);
    unsetenv("PARAX_FEW_ROWS");
    float diff = 0;
    for (size_t i = 0; i < few.size(); ++i) diff = std::max(diff, std::fabs(few[i] - blasOut[i]));
    __nv_bfloat16 *bx, *bw;
    float *dy, *fx, *fw;
    size_t nx = size_t(m) * k, nw = size_t(k) * n;
    CHECK(cudaMalloc(&fx, nx * 4));
    CHECK(cudaMalloc(&fw, nw * 4));
    CHECK(cudaMalloc(&bx, nx * 2));
    CHECK(cudaMalloc(&bw, nw * 2));
    CHECK(cudaMalloc(&dy, size_t(m) * n * 4));
    CHECK(cudaMemcpy(fx, x.f.data(), nx * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(fw, w.f.data(), nw * 4, cudaMemcpyHostToDevice));
    toBf16<<<1024, 256>>>(fx, bx, nx);
    toBf16<<<1024, 256>>>(fw, bw, nw);
    const float one = 1, zero = 0;
    double tEx = gpuTime([&] {
      CHECK(cublasGemmEx(blas, transposed ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, bw,
                         CUDA_R_16BF, transposed ? k : n, bx, CUDA_R_16BF, k, &zero, dy, CUDA_R_32F, n,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }, 50);
    cudaFree(fx); cudaFree(fw); cudaFree(bx); cudaFree(bw); cudaFree(dy);
    const double bytes = 2.0 * k * n;
    char shape[64];
    std::snprintf(shape, sizeof shape, "%d x %d x %d, %s", m, k, n, transposed ? "[n, k]" : "[k, n]");
    std::printf("  %-28s %10.2f %10.2f %10.2f %9.0f%% %10.1e\n", shape, bytes / tFew / 1e12, bytes / tBlas / 1e12,
                bytes / tEx / 1e12, 100 * bytes / tFew / copyBandwidth, diff);
  }
  cublasDestroy(blas);
}

// Which GELU cuBLASLt's GELU_BIAS epilogue computes (its documentation does
// not say; the backend fuses a gelu into it only for the form found).
void geluEpilogueProbe() {
  cublasLtHandle_t lt;
  CHECK(cublasLtCreate(&lt));
  parax::runtime::GeluProbe probe = parax::runtime::probeGeluEpilogue(lt);
  cublasLtDestroy(lt);
  if (probe.vsTanh < 0) {
    std::printf("cuBLASLt GELU_BIAS epilogue: no algorithm or an error\n");
    return;
  }
  const char *form = probe.form == parax::runtime::GeluForm::Tanh  ? "the tanh approximation"
                     : probe.form == parax::runtime::GeluForm::Erf ? "the erf form"
                                                                   : "neither form (no fusion)";
  std::printf("cuBLASLt GELU_BIAS epilogue: max |diff| %.2e vs the tanh approximation, %.2e vs erf "
              "(the forms differ by up to 4.7e-4): %s\n", probe.vsTanh, probe.vsErf, form);
}

/// Device-to-device copy bandwidth (bytes read + written a second).
double bandwidth() {
  size_t bytes = size_t(4) << 30;
  void *a, *b;
  CHECK(cudaMalloc(&a, bytes));
  CHECK(cudaMalloc(&b, bytes));
  CHECK(cudaMemset(a, 1, bytes));
  double t = gpuTime([&] { CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }, 10);
  std::printf("HBM: device-to-device copy of 4 GiB, %.2f TB/s (read + written, median of 10)\n",
              2.0 * bytes / t / 1e12);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / t;
}

} // namespace

int main() {
  if (cudaDeviceCount() == 0) {
    std::printf("parax-cuda-bench: no CUDA device\n");
    return 77;
  }
  CHECK(cudaSetDevice(0));
  cudaDeviceProp p;
  CHECK(cudaGetDeviceProperties(&p, 0));
  std::printf("device: %s, %d SMs\n", p.name, p.multiProcessorCount);
  gemms();
  double copy = bandwidth();
  geluEpilogueProbe();
  fewRowLinears(copy);
  return 0;
}
