// Simt.h - a CPU emulator of the CUDA subset the CUDA backend uses, so that
// CudaExecutor.cu compiles as plain C++ and its kernels, launches, cuBLAS
// calls and NCCL calls run (and are tested) on machines without a GPU.
//
// - Kernels: each block runs on the calling thread, its threads as fibers
//   (ucontext) switched at __syncthreads(). A barrier that some threads of a
//   block reach while others exit, a block of more than 1024 threads, a grid
//   over the hardware's limits or more than 48 KiB of dynamic shared memory
//   fail the launch (cudaGetLastError), as on a GPU (which would hang or
//   refuse). PARAX_SIMT_ORDER=reverse runs the threads between barriers in
//   reverse order, exposing missing barriers the forward order hides.
// - Memory: cudaMalloc'ed bytes start as 0xff (NaN floats, -1 integers), so
//   reading what was never written shows; copies and GEMM operands are
//   checked against their allocations.
// - cuBLAS: sgemm and bf16 GemmEx on oneDNN's sgemm (column-major, the same
//   argument checks as cuBLAS); cuBLASLt's matmul with the bias epilogue; NCCL
//   on MPI (the unique id must reach every rank, splits, collectives, grouped
//   send/recv); PARAX_SIMT_NCCL_FAULT injects an asynchronous error or a hang,
//   for the watchdog's tests. Like NCCL, a communicator with more ranks on a
//   node than GPUs is refused, unless the version (PARAX_SIMT_NCCL_VERSION,
//   NCCL's code, default 23000: 2.30.0) is 2.30 or newer and
//   NCCL_MULTI_RANK_GPU_ENABLE=1 (NCCL's init.cc).
// - Streams and events: work runs when it is issued, except on a lazy
//   stream (PARAX_SIMT_STREAMS=lazy: every stream created with
//   cudaStreamNonBlocking), whose work waits in a queue until something
//   waits for it (cudaStreamWaitEvent, an event query, a synchronisation):
//   the collectives' stream as slow as it can be, so that a missing wait
//   (reading a result too early, overwriting an operand too soon) shows.
//   PARAX_SIMT_DEVICES sets the device count (default 64).
//
// Include through the shim headers in include/ (cuda_runtime.h, ...), which
// take the place of the CUDA toolkit's.

#ifndef PARAX_SIMT_SIMT_H
#define PARAX_SIMT_SIMT_H

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1 // Open MPI's C++ bindings need a library we do not link
#endif
#include <math.h>
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

//===----------------------------------------------------------------------===//
// Kernel language
//===----------------------------------------------------------------------===//

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x = 1, unsigned y = 1, unsigned z = 1) : x(x), y(y), z(z) {}
};

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// Blocks run one after another, so one static copy per kernel serves as the
// block's shared memory.
#define __shared__ static

namespace parax::simt {
struct ThreadContext {
  uint3 thread, block; // threadIdx, blockIdx
  dim3 blockSize, gridSize; // blockDim, gridDim
};
/// The emulated thread now running.
const ThreadContext &current();
void syncthreads();
/// This block's dynamic shared memory (the launch's `shared` bytes).
void *dynamicShared();
} // namespace parax::simt

#define threadIdx (::parax::simt::current().thread)
#define blockIdx (::parax::simt::current().block)
#define blockDim (::parax::simt::current().blockSize)
#define gridDim (::parax::simt::current().gridSize)
#define __syncthreads() ::parax::simt::syncthreads()
#define PARAX_DYNAMIC_SHARED(T, name) T *name = static_cast<T *>(::parax::simt::dynamicShared())

inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
template <typename T> T min(T a, T b) { return b < a ? b : a; }
template <typename T> T max(T a, T b) { return a < b ? b : a; }
/// Fibers never run at once: a plain read-modify-write.
template <typename T> T atomicAdd(T *address, T value) {
  T old = *address;
  *address = old + value;
  return old;
}

struct __nv_bfloat16 {
  uint16_t bits;
};
__nv_bfloat16 __float2bfloat16(float x);
float __bfloat162float(__nv_bfloat16 x);

//===----------------------------------------------------------------------===//
// WMMA (tensor-core fragments): every lane holds the whole tile, row-major,
// but computes and stores only the elements of the product it owns
// (element e: lane e mod 32), as a GPU's lanes each hold their part: the
// lanes run one after another, so a tile loaded into an accumulator, added
// to and stored back by a warp is added to once, not once a lane (and a
// product costs one lane's share). Loads and stores check the hardware's
// rules (256-bit aligned pointers, ldm a multiple of 16 bytes).
//===----------------------------------------------------------------------===//

namespace parax::simt {
/// A kernel broke a rule a GPU enforces: the launch fails when it ends.
void fault(const char *what);
/// Counts a warp-wide call (WMMA's *_sync) for the running lane: between
/// barriers, every lane of a warp must make the same number.
void warpSync();
/// The running thread's lane in its warp (a fault in a warp of fewer than
/// 32 threads: WMMA needs whole warps).
int warpLane();
} // namespace parax::simt

namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
  static constexpr int rows = std::is_same<Use, matrix_b>::value ? K : M;
  static constexpr int cols = std::is_same<Use, matrix_a>::value ? K : N;
  static constexpr int num_elements = rows * cols;
  T x[num_elements];
};

inline void checkTile(const void *p, unsigned ldm, size_t bytes) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0)
    ::parax::simt::fault("wmma: a tile pointer not 256-bit aligned");
  if ((ldm * bytes) % 16 != 0)
    ::parax::simt::fault("wmma: ldm not a multiple of 16 bytes");
}

template <typename Use, int M, int N, int K, typename T, typename Layout, typename E>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout> &f, const E *p, unsigned ldm) {
  static_assert(std::is_same<T, E>::value, "wmma: the pointer's type is the fragment's");
  using F = fragment<Use, M, N, K, T, Layout>;
  checkTile(p, ldm, sizeof(E));
  ::parax::simt::warpSync();
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c)
      f.x[r * F::cols + c] = std::is_same<Layout, row_major>::value ? p[r * ldm + c] : p[c * ldm + r];
}
template <int M, int N, int K>
void load_matrix_sync(fragment<accumulator, M, N, K, float> &f, const float *p, unsigned ldm, layout_t layout) {
  checkTile(p, ldm, sizeof(float));
  ::parax::simt::warpSync();
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c)
      f.x[r * N + c] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}
template <int M, int N, int K>
void store_matrix_sync(float *p, const fragment<accumulator, M, N, K, float> &f, unsigned ldm, layout_t layout) {
  checkTile(p, ldm, sizeof(float));
  ::parax::simt::warpSync();
  int lane = ::parax::simt::warpLane();
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c)
      if ((r * N + c) % 32 == lane)
        (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[r * N + c];
}
template <typename Use, int M, int N, int K, typename T, typename Layout, typename V>
void fill_fragment(fragment<Use, M, N, K, T, Layout> &f, V value) {
  for (T &e : f.x)
    e = static_cast<T>(value);
}
inline float widen(float x) { return x; }
inline float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
template <int M, int N, int K, typename T, typename LA, typename LB>
void mma_sync(fragment<accumulator, M, N, K, float> &d, const fragment<matrix_a, M, N, K, T, LA> &a,
              const fragment<matrix_b, M, N, K, T, LB> &b, const fragment<accumulator, M, N, K, float> &c) {
  ::parax::simt::warpSync();
  int lane = ::parax::simt::warpLane();
  fragment<accumulator, M, N, K, float> out = c;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      if ((i * N + j) % 32 != lane)
        continue; // (another lane's element: what it stores)
      float sum = c.x[i * N + j];
      for (int k = 0; k < K; ++k)
        sum += widen(a.x[i * K + k]) * widen(b.x[k * N + j]);
      out.x[i * N + j] = sum;
    }
  d = out;
}
} // namespace nvcuda::wmma

//===----------------------------------------------------------------------===//
// Runtime API
//===----------------------------------------------------------------------===//

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidDevice = 101,
  cudaErrorNoDevice = 100,
  cudaErrorNotReady = 600,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
typedef struct SimtStream *cudaStream_t;
typedef struct SimtEvent *cudaEvent_t;
constexpr unsigned cudaStreamNonBlocking = 1;
constexpr unsigned cudaEventDisableTiming = 2;

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaMalloc(void **ptr, size_t bytes);
template <typename T> cudaError_t cudaMalloc(T **ptr, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void **>(ptr), bytes);
}
cudaError_t cudaFree(void *ptr);
// Free and total bytes of the device: PARAX_SIMT_DEVICE_MEMORY bytes when
// set (cudaMalloc fails past it, as on a full GPU), else an H200's 141 GiB.
cudaError_t cudaMemGetInfo(size_t *free, size_t *total);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t stream = nullptr);
cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags);
cudaError_t cudaEventCreate(cudaEvent_t *event);
constexpr unsigned cudaEventRecordExternal = 1;
/// cudaEventRecordExternal inside a capture: a node that records the event
/// at each replay (without the flag: as cudaEventRecord).
cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned flags);
/// Host time between the two records (the emulator's work runs when issued).
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
/// Shared memory beyond 48 KiB needs this per kernel, up to the opt-in
/// limit (227 KiB, as on H100/H200).
cudaError_t cudaFuncSetAttribute(const void *kernel, cudaFuncAttribute attribute, int value);
template <typename Kernel>
cudaError_t cudaFuncSetAttribute(Kernel *kernel, cudaFuncAttribute attribute, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void *>(kernel), attribute, value);
}
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attribute, int device);
cudaError_t cudaGetLastError();
const char *cudaGetErrorString(cudaError_t error);

// CUDA graphs by stream capture: while a capture is open, stream work
// (launches, device-to-device copies, memsets, cuBLAS, cuBLASLt, NCCL) on
// any stream is recorded instead of run, and replays in issue order (event
// records and waits inside a capture are then no-ops); host
// synchronisation, event queries, copies to or from host memory and
// allocation are refused and spoil the capture, as on a GPU.
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
typedef struct SimtGraph *cudaGraph_t;
typedef struct SimtGraph *cudaGraphExec_t;
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);

namespace parax::simt {
/// Runs `body` once per thread of every block (see the file comment); a
/// failed launch sets the error cudaGetLastError returns.
void launch(const void *function, const char *kernel, dim3 grid, dim3 block, size_t shared,
            cudaStream_t stream, std::function<void()> body);
/// During a capture: keeps `work` for the graph and returns true; otherwise
/// false (the caller runs it now).
bool record(std::function<void()> work);
/// True when [ptr, ptr + bytes) lies inside one cudaMalloc allocation.
bool isDeviceRange(const void *ptr, size_t bytes);
/// Fault injection for watchdog tests (PARAX_SIMT_NCCL_FAULT): "error" makes
/// every NCCL operation skip its transfer and its communicator report
/// ncclRemoteError; "hang" makes them never finish (events recorded after
/// them stay not ready). PARAX_SIMT_NCCL_FAULT_AFTER=N spares the first N
/// operations. Called once per NCCL operation.
const char *ncclFault();
void markHung();
/// Lazy non-blocking streams (default: PARAX_SIMT_STREAMS=lazy); applies to
/// streams created afterwards.
void setLazyStreams(bool lazy);
/// On a lazy stream (not now running its queue): queues `work` and returns
/// true; otherwise false (the caller runs it now).
bool defer(cudaStream_t stream, std::function<void()> work);
/// Runs every lazy stream's queue (what waiting for the device does).
void runLazyStreams();
/// Threads between barriers in reverse order (default: PARAX_SIMT_ORDER).
void setReverseOrder(bool reverse);
/// Forgets a failed kernel (which otherwise spoils every later call, as on
/// a GPU): for tests that fail launches on purpose.
void clearErrors();

template <typename Kernel> struct Launch;
template <typename... Params> struct Launch<void (*)(Params...)> {
  void (*kernel)(Params...);
  const char *name;
  dim3 grid, block;
  size_t shared;
  cudaStream_t stream;
  template <typename... Args> void operator()(Args &&...args) const {
    // Converted once, as a kernel launch converts its arguments; each thread
    // then gets its own copy of the parameters.
    auto params = std::make_shared<std::tuple<std::decay_t<Params>...>>(std::forward<Args>(args)...);
    auto k = kernel;
    launch(reinterpret_cast<const void *>(kernel), name, grid, block, shared, stream,
           [k, params] { std::apply(k, *params); });
  }
};
} // namespace parax::simt

#define PARAX_LAUNCH(kernel, grid, block, shared, stream)                                          \
  ::parax::simt::Launch<decltype(&kernel)>{&kernel, #kernel, dim3(grid), dim3(block),                 \
                                            static_cast<size_t>(shared), stream}

//===----------------------------------------------------------------------===//
// cuBLAS
//===----------------------------------------------------------------------===//

enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16BF = 14 };
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };
typedef struct SimtBlas *cublasHandle_t;

cublasStatus_t cublasCreate(cublasHandle_t *handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void *workspace, size_t bytes);
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                           int m, int n, int k, const float *alpha, const float *A, int lda,
                           const float *B, int ldb, const float *beta, float *C, int ldc);
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                            int m, int n, int k, const void *alpha, const void *A, cudaDataType_t Atype,
                            int lda, const void *B, cudaDataType_t Btype, int ldb, const void *beta,
                            void *C, cudaDataType_t Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo);
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k, const void *alpha,
                                          const void *A, cudaDataType_t Atype, int lda, long long strideA,
                                          const void *B, cudaDataType_t Btype, int ldb, long long strideB,
                                          const void *beta, void *C, cudaDataType_t Ctype, int ldc,
                                          long long strideC, int batchCount, cublasComputeType_t computeType,
                                          cublasGemmAlgo_t algo);

//===----------------------------------------------------------------------===//
// cuBLASLt: matmul with the bias epilogue
//===----------------------------------------------------------------------===//

typedef struct SimtLt *cublasLtHandle_t;
typedef struct SimtLtMatmulDesc *cublasLtMatmulDesc_t;
typedef struct SimtLtLayout *cublasLtMatrixLayout_t;
typedef struct SimtLtPreference *cublasLtMatmulPreference_t;
typedef struct {
  uint64_t data[8];
} cublasLtMatmulAlgo_t;
typedef struct {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
} cublasLtMatmulHeuristicResult_t;
enum cublasLtMatmulDescAttributes_t {
  CUBLASLT_MATMUL_DESC_TRANSA = 3,
  CUBLASLT_MATMUL_DESC_TRANSB = 4,
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
  CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
};
// GELU_BIAS: gelu(x + bias), in the tanh approximation (PARAX_SIMT_LT_GELU=erf:
// the erf form), since the GPU's form is measured, not assumed (GeluEpilogue.cuh).
enum cublasLtEpilogue_t { CUBLASLT_EPILOGUE_DEFAULT = 1, CUBLASLT_EPILOGUE_BIAS = 4, CUBLASLT_EPILOGUE_GELU_BIAS = 36 };
enum cublasLtMatmulPreferenceAttributes_t { CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1 };

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute,
                                        cudaDataType_t scale);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                                              const void *value, size_t bytes);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType_t type, uint64_t rows,
                                          uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *preference);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t preference);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t preference,
                                                    cublasLtMatmulPreferenceAttributes_t attribute,
                                                    const void *value, size_t bytes);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t preference, int requested,
                                              cublasLtMatmulHeuristicResult_t *results, int *returned);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t a, const void *B, cublasLtMatrixLayout_t b,
                              const void *beta, const void *C, cublasLtMatrixLayout_t c, void *D,
                              cublasLtMatrixLayout_t d, const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspaceBytes, cudaStream_t stream);

//===----------------------------------------------------------------------===//
// NCCL (on MPI)
//===----------------------------------------------------------------------===//

enum ncclResult_t {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
};
enum ncclDataType_t { ncclInt32 = 2, ncclFloat32 = 7, ncclFloat = 7, ncclBfloat16 = 9 };
enum ncclRedOp_t { ncclSum = 0 };
typedef struct {
  char internal[128];
} ncclUniqueId;
typedef struct SimtNcclComm *ncclComm_t;
typedef struct SimtNcclConfig ncclConfig_t;
#define NCCL_SPLIT_NOCOLOR -1

const char *ncclGetErrorString(ncclResult_t result);
ncclResult_t ncclGetVersion(int *version);
ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *error);
ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendCount, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvCount, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();

#endif // PARAX_SIMT_SIMT_H
