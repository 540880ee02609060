// The SIMT emulator (runtime/cuda/simt) behaves as a GPU does where the CUDA
// backend relies on it, and fails where a GPU would hang, refuse or compute
// garbage: that is what makes its runs of the CUDA backend worth having.

#include <cuda_bf16.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace {

__global__ void writeIds(int *out) {
  unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  unsigned perBlock = blockDim.x * blockDim.y * blockDim.z;
  out[b * perBlock + t] += static_cast<int>(b * perBlock + t) + 1;
}

TEST(Simt, EveryThreadOfEveryBlockRunsOnceWithItsIndices) {
  dim3 grid(3, 2, 2), block(4, 2, 3);
  int n = 12 * 24;
  int *d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, n * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d, 0, n * sizeof(int)), cudaSuccess);
  PARAX_LAUNCH(writeIds, grid, block, 0, nullptr)(d);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<int> h(n);
  ASSERT_EQ(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int i = 0; i < n; ++i)
    EXPECT_EQ(h[i], i + 1) << i;
  cudaFree(d);
}

__global__ void blockSum(const float *x, float *out) {
  __shared__ float partial[256];
  partial[threadIdx.x] = x[blockIdx.x * blockDim.x + threadIdx.x];
  __syncthreads();
  for (unsigned step = blockDim.x / 2; step > 0; step /= 2) {
    if (threadIdx.x < step)
      partial[threadIdx.x] += partial[threadIdx.x + step];
    __syncthreads();
  }
  if (threadIdx.x == 0)
    out[blockIdx.x] = partial[0];
}

TEST(Simt, BarriersOrderSharedMemoryInBothThreadOrders) {
  std::vector<float> h(2 * 256);
  for (size_t i = 0; i < h.size(); ++i)
    h[i] = static_cast<float>(i % 7);
  float *x = nullptr, *out = nullptr;
  cudaMalloc(&x, h.size() * 4);
  cudaMalloc(&out, 2 * 4);
  cudaMemcpy(x, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
  for (bool reverse : {false, true}) {
    parax::simt::setReverseOrder(reverse);
    PARAX_LAUNCH(blockSum, 2, 256, 0, nullptr)(x, out);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    float sums[2];
    cudaMemcpy(sums, out, 8, cudaMemcpyDeviceToHost);
    float want0 = 0, want1 = 0;
    for (int i = 0; i < 256; ++i)
      want0 += h[i], want1 += h[256 + i];
    EXPECT_EQ(sums[0], want0) << reverse;
    EXPECT_EQ(sums[1], want1) << reverse;
  }
  parax::simt::setReverseOrder(false);
  cudaFree(x);
  cudaFree(out);
}

// Each thread reads its neighbour's shared slot: right only with the barrier.
__global__ void neighbour(int *out, int salt, bool barrier) {
  __shared__ int slot[64];
  slot[threadIdx.x] = salt + static_cast<int>(threadIdx.x);
  if (barrier)
    __syncthreads();
  out[threadIdx.x] = slot[(threadIdx.x + 1) % blockDim.x];
}

TEST(Simt, AMissingBarrierGivesWrongResultsInEitherOrder) {
  int *d = nullptr;
  cudaMalloc(&d, 64 * sizeof(int));
  int salt = 1000;
  for (bool barrier : {true, false})
    for (bool reverse : {false, true}) {
      parax::simt::setReverseOrder(reverse);
      salt += 1000;
      PARAX_LAUNCH(neighbour, 1, 64, 0, nullptr)(d, salt, barrier);
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);
      std::vector<int> h(64);
      cudaMemcpy(h.data(), d, 64 * sizeof(int), cudaMemcpyDeviceToHost);
      int right = 0;
      for (int t = 0; t < 64; ++t)
        right += h[t] == salt + (t + 1) % 64;
      if (barrier)
        EXPECT_EQ(right, 64) << "reverse " << reverse;
      else
        EXPECT_LT(right, 64) << "reverse " << reverse;
    }
  parax::simt::setReverseOrder(false);
  cudaFree(d);
}

__global__ void divergentBarrier(float *x) {
  if (threadIdx.x == 0)
    return;
  __syncthreads();
  x[threadIdx.x] = 1;
}

TEST(Simt, ABarrierSomeThreadsSkipFailsTheLaunchAndSpoilsTheContext) {
  float *d = nullptr;
  cudaMalloc(&d, 32 * 4);
  PARAX_LAUNCH(divergentBarrier, 1, 32, 0, nullptr)(d);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  // As on a GPU, the failure sticks: later calls report it too.
  EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  parax::simt::clearErrors();
  cudaFree(d);
}

__global__ void nothing() {}

TEST(Simt, LaunchesOverTheHardwareLimitsAreRefused) {
  PARAX_LAUNCH(nothing, 1, 1025, 0, nullptr)();
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  PARAX_LAUNCH(nothing, dim3(1, 65536), 32, 0, nullptr)();
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  PARAX_LAUNCH(nothing, 0, 32, 0, nullptr)();
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  PARAX_LAUNCH(nothing, 1, 32, 48 * 1024 + 4, nullptr)();
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  // Not sticky: the next launch works and the error is read once.
  PARAX_LAUNCH(nothing, 1, 32, 48 * 1024, nullptr)();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  // More shared memory after opting in, up to the device's limit.
  int optIn = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&optIn, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0), cudaSuccess);
  EXPECT_EQ(cudaFuncSetAttribute(nothing, cudaFuncAttributeMaxDynamicSharedMemorySize, optIn + 1),
            cudaErrorInvalidValue);
  ASSERT_EQ(cudaFuncSetAttribute(nothing, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024),
            cudaSuccess);
  PARAX_LAUNCH(nothing, 1, 32, 100 * 1024, nullptr)();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  PARAX_LAUNCH(nothing, 1, 32, 100 * 1024 + 4, nullptr)();
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
}

__global__ void reverseThroughDynamicShared(const float *x, float *y) {
  PARAX_DYNAMIC_SHARED(float, buffer);
  buffer[threadIdx.x] = x[threadIdx.x];
  __syncthreads();
  y[threadIdx.x] = buffer[blockDim.x - 1 - threadIdx.x];
}

TEST(Simt, DynamicSharedMemoryIsTheLaunchsBytes) {
  std::vector<float> h(100);
  for (int i = 0; i < 100; ++i)
    h[i] = static_cast<float>(i);
  float *x = nullptr, *y = nullptr;
  cudaMalloc(&x, 400);
  cudaMalloc(&y, 400);
  cudaMemcpy(x, h.data(), 400, cudaMemcpyHostToDevice);
  PARAX_LAUNCH(reverseThroughDynamicShared, 1, 100, 400, nullptr)(x, y);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  cudaMemcpy(h.data(), y, 400, cudaMemcpyDeviceToHost);
  for (int i = 0; i < 100; ++i)
    EXPECT_EQ(h[i], 99 - i);
  cudaFree(x);
  cudaFree(y);
}

TEST(Simt, FreshMemoryReadsAsNaNAndCopiesStayInsideAllocations) {
  float *d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 10 * 4), cudaSuccess);
  std::vector<float> h(11, 0.0f);
  ASSERT_EQ(cudaMemcpy(h.data(), d, 10 * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int i = 0; i < 10; ++i)
    EXPECT_TRUE(std::isnan(h[i]));
  EXPECT_EQ(cudaMemcpy(d, h.data(), 11 * 4, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(h.data(), d + 5, 6 * 4, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d, d + 1, 4, cudaMemcpyHostToDevice), cudaErrorInvalidValue); // a device source
  EXPECT_EQ(cudaMemcpy(h.data(), h.data() + 1, 4, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemsetAsync(d + 8, 0, 3 * 4), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(d + 1), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
}

// Column-major C[m, n] = op(A) op(B), by the definition.
std::vector<float> naiveGemm(bool ta, bool tb, int m, int n, int k, const std::vector<float> &a, int lda,
                             const std::vector<float> &b, int ldb) {
  std::vector<float> c(m * n, 0.0f);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j)
      for (int p = 0; p < k; ++p)
        c[j * m + i] += (ta ? a[i * lda + p] : a[p * lda + i]) * (tb ? b[p * ldb + j] : b[j * ldb + p]);
  return c;
}

TEST(Simt, SgemmComputesColumnMajorProductsAndChecksItsArguments) {
  int m = 3, n = 5, k = 4;
  cublasHandle_t blas = nullptr;
  ASSERT_EQ(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
  std::vector<float> a(20), b(20);
  for (int i = 0; i < 20; ++i)
    a[i] = 0.5f * i - 3, b[i] = 1.0f - 0.25f * i;
  float *da, *db, *dc;
  cudaMalloc(&da, 80);
  cudaMalloc(&db, 80);
  cudaMalloc(&dc, m * n * 4);
  cudaMemcpy(da, a.data(), 80, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), 80, cudaMemcpyHostToDevice);
  const float one = 1, zero = 0;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      int lda = ta ? k : m, ldb = tb ? n : k;
      ASSERT_EQ(cublasSgemm(blas, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
                            &one, da, lda, db, ldb, &zero, dc, m),
                CUBLAS_STATUS_SUCCESS);
      std::vector<float> c(m * n);
      cudaMemcpy(c.data(), dc, c.size() * 4, cudaMemcpyDeviceToHost);
      std::vector<float> want = naiveGemm(ta, tb, m, n, k, a, lda, b, ldb);
      for (int i = 0; i < m * n; ++i)
        EXPECT_FLOAT_EQ(c[i], want[i]) << ta << tb << i;
    }
  // A leading dimension below the rows, and an operand past its allocation.
  EXPECT_EQ(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, da, m - 1, db, k, &zero, dc, m),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, da, m, db, k + 1, &zero, dc, m),
            CUBLAS_STATUS_INVALID_VALUE);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  cublasDestroy(blas);
}

TEST(Simt, Bf16RoundsToNearestEvenAndGemmExUsesTheRoundedValues) {
  EXPECT_EQ(__bfloat162float(__float2bfloat16(1.00390625f)), 1.0f);      // a tie: to even
  EXPECT_EQ(__bfloat162float(__float2bfloat16(1.01171875f)), 1.015625f); // a tie: to even
  EXPECT_EQ(__bfloat162float(__float2bfloat16(std::nextafter(1.00390625f, 2.0f))), 1.0078125f);
  EXPECT_TRUE(std::isnan(__bfloat162float(__float2bfloat16(NAN))));
  int m = 2, n = 3, k = 4;
  std::vector<float> a(m * k), b(k * n);
  std::vector<__nv_bfloat16> ah(a.size()), bh(b.size());
  for (size_t i = 0; i < a.size(); ++i)
    a[i] = 1.0f + 0.001f * i, ah[i] = __float2bfloat16(a[i]), a[i] = __bfloat162float(ah[i]);
  for (size_t i = 0; i < b.size(); ++i)
    b[i] = 0.3f * i - 1, bh[i] = __float2bfloat16(b[i]), b[i] = __bfloat162float(bh[i]);
  void *da, *db;
  float *dc;
  cudaMalloc(&da, ah.size() * 2);
  cudaMalloc(&db, bh.size() * 2);
  cudaMalloc(&dc, m * n * 4);
  cudaMemcpy(da, ah.data(), ah.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(db, bh.data(), bh.size() * 2, cudaMemcpyHostToDevice);
  cublasHandle_t blas = nullptr;
  cublasCreate(&blas);
  const float one = 1, zero = 0;
  ASSERT_EQ(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, da, CUDA_R_16BF, m, db, CUDA_R_16BF,
                         k, &zero, dc, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  std::vector<float> c(m * n);
  cudaMemcpy(c.data(), dc, c.size() * 4, cudaMemcpyDeviceToHost);
  std::vector<float> want = naiveGemm(false, false, m, n, k, a, m, b, k);
  for (int i = 0; i < m * n; ++i)
    EXPECT_FLOAT_EQ(c[i], want[i]) << i;
  cublasDestroy(blas);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
}

TEST(Simt, LtMatmulAddsTheBiasAlongDsRowsAndChecksTheLayoutsChain) {
  int m = 3, n = 4, k = 5;
  std::vector<float> a(m * k), b(k * n), bias(m);
  for (int i = 0; i < m * k; ++i) a[i] = 0.25f * i - 1;
  for (int i = 0; i < k * n; ++i) b[i] = 0.5f - 0.125f * i;
  for (int i = 0; i < m; ++i) bias[i] = 10.0f * (i + 1);
  float *da, *db, *dd, *dbias;
  cudaMalloc(&da, a.size() * 4);
  cudaMalloc(&db, b.size() * 4);
  cudaMalloc(&dd, m * n * 4);
  cudaMalloc(&dbias, m * 4);
  cudaMemcpy(da, a.data(), a.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), b.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dbias, bias.data(), m * 4, cudaMemcpyHostToDevice);
  cublasLtHandle_t lt;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, ld, wrong;
  cublasLtMatmulPreference_t pref;
  ASSERT_EQ(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  uint32_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  const void *biasPointer = dbias;
  ASSERT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &biasPointer, sizeof(biasPointer)),
            CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, m, k, m);
  cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, k, n, k);
  cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, m);
  cublasLtMatrixLayoutCreate(&wrong, CUDA_R_32F, m + 1, n, m + 1);
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulHeuristicResult_t best;
  int found = 0;
  ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &best, &found), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(found, 1);
  const float one = 1, zero = 0;
  ASSERT_EQ(cublasLtMatmul(lt, op, &one, da, la, db, lb, &zero, dd, ld, dd, ld, &best.algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_SUCCESS);
  std::vector<float> d(m * n);
  cudaMemcpy(d.data(), dd, d.size() * 4, cudaMemcpyDeviceToHost);
  std::vector<float> want = naiveGemm(false, false, m, n, k, a, m, b, k);
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i)
      EXPECT_FLOAT_EQ(d[j * m + i], want[j * m + i] + bias[i]) << i << "," << j;
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, wrong, wrong, pref, 1, &best, &found),
            CUBLAS_STATUS_INVALID_VALUE);
  for (cublasLtMatrixLayout_t l : {la, lb, ld, wrong}) cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(lt);
  for (float *p : {da, db, dd, dbias}) cudaFree(p);
}

__global__ void addOne(float *x, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    x[i] += 1.0f;
}

TEST(Simt, ACaptureRecordsStreamWorkForEachLaunchOfTheGraphAndRefusesHostSynchronisation) {
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  float *d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 8 * 4), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d, 0, 8 * 4, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  PARAX_LAUNCH(addOne, 1, 32, 0, stream)(d, 8);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  std::vector<float> h(8);
  cudaMemcpy(h.data(), d, 32, cudaMemcpyDeviceToHost);
  EXPECT_EQ(h[0], 0.0f); // captured, not run
  for (int launch = 1; launch <= 2; ++launch) {
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    cudaMemcpy(h.data(), d, 32, cudaMemcpyDeviceToHost);
    for (float v : h)
      EXPECT_EQ(v, static_cast<float>(launch));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  // Synchronising, copying from pageable host memory or allocating inside a
  // capture is refused and spoils it.
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaMemcpyAsync(d, h.data(), 4, cudaMemcpyHostToDevice, stream), cudaErrorStreamCaptureUnsupported);
  float *more = nullptr;
  EXPECT_EQ(cudaMalloc(&more, 4), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(graph, nullptr);
  cudaFree(d);
  cudaStreamDestroy(stream);
}

TEST(Simt, ALazyStreamRunsItsWorkOnlyWhenSomethingWaitsForIt) {
  parax::simt::setLazyStreams(true);
  cudaStream_t compute, lazy;
  cudaStreamCreate(&compute);
  cudaStreamCreateWithFlags(&lazy, cudaStreamNonBlocking);
  parax::simt::setLazyStreams(false);
  cudaEvent_t copied;
  cudaEventCreateWithFlags(&copied, cudaEventDisableTiming);
  float *d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 16 * 4), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d, 0, 16 * 4, compute), cudaSuccess);
  // Lazy: d[8..16) = d[0..8) + 1 waits in the queue.
  PARAX_LAUNCH(addOne, 1, 32, 0, lazy)(d, 8);
  ASSERT_EQ(cudaMemcpyAsync(d + 8, d, 8 * 4, cudaMemcpyDeviceToDevice, lazy), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(copied, lazy), cudaSuccess);
  PARAX_LAUNCH(addOne, 1, 32, 0, lazy)(d, 8); // after the event
  std::vector<float> h(16);
  cudaMemcpy(h.data(), d, 64, cudaMemcpyDeviceToHost);
  EXPECT_EQ(h[0], 0.0f); // not run: nothing waited
  EXPECT_EQ(h[8], 0.0f);
  // The compute stream waits for the event: the work before it runs, the
  // work after it still waits.
  ASSERT_EQ(cudaStreamWaitEvent(compute, copied, 0), cudaSuccess);
  cudaMemcpy(h.data(), d, 64, cudaMemcpyDeviceToHost);
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[8], 1.0f);
  ASSERT_EQ(cudaStreamSynchronize(lazy), cudaSuccess);
  cudaMemcpy(h.data(), d, 64, cudaMemcpyDeviceToHost);
  EXPECT_EQ(h[0], 2.0f);
  EXPECT_EQ(h[8], 1.0f);
  // An event recorded on a stream that runs at once is complete.
  ASSERT_EQ(cudaEventRecord(copied, compute), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(copied), cudaSuccess);
  cudaEventDestroy(copied);
  cudaFree(d);
  cudaStreamDestroy(lazy);
  cudaStreamDestroy(compute);
}

// One 16x16x16 product per warp; lane `skip` of warp 0 leaves out its mma.
__global__ void wmmaProduct(const __nv_bfloat16 *a, const __nv_bfloat16 *b, float *c, int skip) {
  using namespace nvcuda;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 0.0f);
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  if (static_cast<int>(threadIdx.x) != skip)
    wmma::mma_sync(acc, fa, fb, acc);
  wmma::store_matrix_sync(c, acc, 16, wmma::mem_row_major);
}

/// Two 16 x 16 bf16 tiles a and b and `tiles` fp32 tiles c on the device.
struct WmmaTiles {
  __nv_bfloat16 *a = nullptr, *b = nullptr;
  float *c = nullptr;
  WmmaTiles(const std::vector<__nv_bfloat16> &ha, const std::vector<__nv_bfloat16> &hb, int tiles) {
    EXPECT_EQ(cudaMalloc(&a, 256 * 2), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&b, 256 * 2), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&c, tiles * 256 * 4), cudaSuccess);
    cudaMemcpy(a, ha.data(), 512, cudaMemcpyHostToDevice);
    cudaMemcpy(b, hb.data(), 512, cudaMemcpyHostToDevice);
  }
  ~WmmaTiles() {
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
  }
};

TEST(Simt, WmmaCallsMustBeWarpUniform) {
  std::vector<__nv_bfloat16> ones(256, __float2bfloat16(1.0f));
  WmmaTiles t(ones, ones, 1);
  __nv_bfloat16 *a = t.a, *b = t.b;
  float *c = t.c;
  PARAX_LAUNCH(wmmaProduct, 1, 32, 0, nullptr)(a, b, c, -1);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<float> h(256);
  cudaMemcpy(h.data(), c, 1024, cudaMemcpyDeviceToHost);
  EXPECT_EQ(h[0], 16.0f);
  EXPECT_EQ(h[255], 16.0f);
  // One lane skipping a warp-wide call: undefined on a GPU, a failed launch here.
  PARAX_LAUNCH(wmmaProduct, 1, 64, 0, nullptr)(a, b, c, 5);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  parax::simt::clearErrors();
}

// c (16 x 16) += a . b by every warp of the block, each its own tile of c:
// an accumulator loaded from memory and stored back.
__global__ void wmmaAccumulate(const __nv_bfloat16 *a, const __nv_bfloat16 *b, float *c) {
  using namespace nvcuda;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  float *tile = c + threadIdx.x / 32 * 256;
  wmma::load_matrix_sync(acc, tile, 16, wmma::mem_row_major);
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::mma_sync(acc, fa, fb, acc);
  wmma::store_matrix_sync(tile, acc, 16, wmma::mem_row_major);
}

TEST(Simt, AWarpAddsToAnAccumulatorInMemoryOnceInEitherOrder) {
  // a: row i all i; b (column-major): column j all 1 -> (a . b)[i][j] = 16 i.
  std::vector<__nv_bfloat16> ha(256), hb(256, __float2bfloat16(1.0f));
  for (int i = 0; i < 256; ++i)
    ha[i] = __float2bfloat16(static_cast<float>(i / 16));
  WmmaTiles t(ha, hb, 2);
  __nv_bfloat16 *a = t.a, *b = t.b;
  float *c = t.c;
  for (bool reverse : {false, true}) {
    parax::simt::setReverseOrder(reverse);
    std::vector<float> h(2 * 256);
    for (int e = 0; e < 2 * 256; ++e)
      h[e] = static_cast<float>(e % 5);
    cudaMemcpy(c, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
    PARAX_LAUNCH(wmmaAccumulate, 1, 64, 0, nullptr)(a, b, c);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    std::vector<float> got(2 * 256);
    cudaMemcpy(got.data(), c, got.size() * 4, cudaMemcpyDeviceToHost);
    for (int e = 0; e < 2 * 256; ++e)
      ASSERT_EQ(got[e], h[e] + 16.0f * (e % 256 / 16)) << "element " << e << (reverse ? " (reverse)" : "");
  }
  parax::simt::setReverseOrder(false);
  // A warp of 16 threads: WMMA needs whole warps.
  PARAX_LAUNCH(wmmaAccumulate, 1, 48, 0, nullptr)(a, b, c);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  parax::simt::clearErrors();
}

} // namespace
