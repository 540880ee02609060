// SimtLibraries.cpp - the SIMT emulator's cuBLAS (on oneDNN, Gemm.h) and NCCL
// (on MPI) subsets (see Simt.h). Arguments are checked as the libraries check
// them, and every buffer must lie inside device memory.

#include "Simt.h"

#include "../../src/Gemm.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using parax::simt::isDeviceRange;
using parax::simt::record;

namespace {

template <typename Result>
Result complain(Result result, const char *call, const std::string &what) {
  std::fprintf(stderr, "simt: %s: %s\n", call, what.c_str());
  return result;
}

//===----------------------------------------------------------------------===//
// cuBLAS
//===----------------------------------------------------------------------===//

// Elements a column-major operand of `rows` x `cols` with leading dimension
// `ld` spans.
size_t span(int rows, int cols, int ld) {
  return rows == 0 || cols == 0 ? 0 : size_t(cols - 1) * ld + rows;
}

cublasStatus_t checkGemm(const char *call, cublasHandle_t handle, cublasOperation_t ta,
                         cublasOperation_t tb, int m, int n, int k, const void *A, size_t aBytes,
                         int lda, const void *B, size_t bBytes, int ldb, const void *C, int ldc,
                         size_t cBytes = 4) {
  if (!handle)
    return complain(CUBLAS_STATUS_NOT_INITIALIZED, call, "no handle");
  if (m < 0 || n < 0 || k < 0)
    return complain(CUBLAS_STATUS_INVALID_VALUE, call, "negative m, n or k");
  int aRows = ta == CUBLAS_OP_N ? m : k, aCols = ta == CUBLAS_OP_N ? k : m;
  int bRows = tb == CUBLAS_OP_N ? k : n, bCols = tb == CUBLAS_OP_N ? n : k;
  if (lda < std::max(1, aRows) || ldb < std::max(1, bRows) || ldc < std::max(1, m))
    return complain(CUBLAS_STATUS_INVALID_VALUE, call,
                    "leading dimension below the rows (lda " + std::to_string(lda) + " for " +
                        std::to_string(aRows) + ", ldb " + std::to_string(ldb) + " for " +
                        std::to_string(bRows) + ", ldc " + std::to_string(ldc) + " for " +
                        std::to_string(m) + ")");
  auto inside = [&](const void *p, size_t elements, size_t bytes) {
    return elements == 0 || isDeviceRange(p, elements * bytes);
  };
  if (!inside(A, span(aRows, aCols, lda), aBytes))
    return complain(CUBLAS_STATUS_INVALID_VALUE, call, "A reaches outside its device allocation");
  if (!inside(B, span(bRows, bCols, ldb), bBytes))
    return complain(CUBLAS_STATUS_INVALID_VALUE, call, "B reaches outside its device allocation");
  if (!inside(C, span(m, n, ldc), cBytes))
    return complain(CUBLAS_STATUS_INVALID_VALUE, call, "C reaches outside its device allocation");
  return CUBLAS_STATUS_SUCCESS;
}

bool transposed(cublasOperation_t op) { return op != CUBLAS_OP_N; }

std::vector<float> widen(const void *bf16, size_t elements) {
  std::vector<float> out(elements);
  const auto *in = static_cast<const __nv_bfloat16 *>(bf16);
  for (size_t i = 0; i < elements; ++i)
    out[i] = __bfloat162float(in[i]);
  return out;
}

} // namespace

struct SimtBlas {
  cudaStream_t stream = nullptr;
};

cublasStatus_t cublasCreate(cublasHandle_t *handle) {
  *handle = new SimtBlas;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (!handle)
    return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void *workspace, size_t bytes) {
  if (!handle)
    return CUBLAS_STATUS_NOT_INITIALIZED;
  if (bytes && !isDeviceRange(workspace, bytes))
    return complain(CUBLAS_STATUS_INVALID_VALUE, "cublasSetWorkspace", "the workspace is not device memory");
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const float *A, int lda, const float *B,
                           int ldb, const float *beta, float *C, int ldc) {
  cublasStatus_t st = checkGemm("cublasSgemm", handle, ta, tb, m, n, k, A, 4, lda, B, 4, ldb, C, ldc);
  if (st != CUBLAS_STATUS_SUCCESS || m == 0 || n == 0) return st;
  float a = *alpha, b = *beta; // host scalars: read when the call is made (or captured)
  auto run = [=] {
    parax::runtime::gemmColumnMajor(transposed(ta), transposed(tb), m, n, k, a, A, lda, B, ldb, b, C, ldc);
  };
  if (!record(run)) run();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType_t aType,
                            int lda, const void *B, cudaDataType_t bType, int ldb, const void *beta,
                            void *C, cudaDataType_t cType, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t) {
  if (aType != bType || compute != CUBLAS_COMPUTE_32F || (cType == CUDA_R_16BF && aType != CUDA_R_16BF))
    return complain(CUBLAS_STATUS_NOT_SUPPORTED, "cublasGemmEx",
                    "emulated for A and B of one type (fp32 or bf16), C fp32 (or bf16 with bf16 A, B), "
                    "fp32 compute");
  size_t width = aType == CUDA_R_16BF ? 2 : 4;
  cublasStatus_t st = checkGemm("cublasGemmEx", handle, ta, tb, m, n, k, A, width, lda, B, width, ldb, C,
                                ldc, cType == CUDA_R_16BF ? 2 : 4);
  if (st != CUBLAS_STATUS_SUCCESS || m == 0 || n == 0)
    return st;
  float alphaValue = *static_cast<const float *>(alpha), betaValue = *static_cast<const float *>(beta);
  auto run = [=] {
    const float *a = static_cast<const float *>(A), *b = static_cast<const float *>(B);
    std::vector<float> wideA, wideB;
    if (aType == CUDA_R_16BF) {
      wideA = widen(A, span(ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda));
      wideB = widen(B, span(tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb));
      a = wideA.data();
      b = wideB.data();
    }
    float *c = static_cast<float *>(C);
    std::vector<float> wideC;
    if (cType == CUDA_R_16BF) {
      wideC = widen(C, span(m, n, ldc));
      c = wideC.data();
    }
    parax::runtime::gemmColumnMajor(transposed(ta), transposed(tb), m, n, k, alphaValue, a, lda, b, ldb, betaValue, c,
                                    ldc);
    auto *narrow = static_cast<__nv_bfloat16 *>(C);
    for (size_t i = 0; i < wideC.size(); ++i)
      narrow[i] = __float2bfloat16(wideC[i]); // fp32 accumulation, rounded once on the way out
  };
  if (!record(run))
    run();
  return CUBLAS_STATUS_SUCCESS;
}

// Batch b is cublasGemmEx's product of A + b * strideA, B + b * strideB into
// C + b * strideC (each batch checked as one GEMM).
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb,
                                          int m, int n, int k, const void *alpha, const void *A,
                                          cudaDataType_t aType, int lda, long long strideA, const void *B,
                                          cudaDataType_t bType, int ldb, long long strideB, const void *beta,
                                          void *C, cudaDataType_t cType, int ldc, long long strideC,
                                          int batchCount, cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  if (batchCount < 0)
    return complain(CUBLAS_STATUS_INVALID_VALUE, "cublasGemmStridedBatchedEx", "a negative batch count");
  auto at = [](const void *p, long long stride, long long b, cudaDataType_t type) {
    return static_cast<const char *>(p) + stride * b * (type == CUDA_R_16BF ? 2 : 4);
  };
  for (long long b = 0; b < batchCount; ++b) {
    cublasStatus_t st = cublasGemmEx(handle, ta, tb, m, n, k, alpha, at(A, strideA, b, aType), aType, lda,
                                      at(B, strideB, b, bType), bType, ldb, beta,
                                      const_cast<char *>(at(C, strideC, b, cType)), cType, ldc, compute, algo);
    if (st != CUBLAS_STATUS_SUCCESS)
      return st;
  }
  return CUBLAS_STATUS_SUCCESS;
}

//===----------------------------------------------------------------------===//
// cuBLASLt
//===----------------------------------------------------------------------===//

struct SimtLt {};
struct SimtLtMatmulDesc {
  cublasOperation_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void *bias = nullptr;
};
struct SimtLtLayout {
  cudaDataType_t type;
  int64_t rows, cols, ld;
};
struct SimtLtPreference {
  size_t workspace = 0;
};

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle) {
  *handle = new SimtLt;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F)
    return complain(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulDescCreate", "emulated for fp32 compute and scale");
  *desc = new SimtLtMatmulDesc;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                                              const void *value, size_t bytes) {
  if (!desc)
    return CUBLAS_STATUS_NOT_INITIALIZED;
  auto read = [&](auto &field) {
    if (bytes != sizeof(field))
      return complain(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescSetAttribute", "wrong attribute size");
    std::memcpy(&field, value, bytes);
    return CUBLAS_STATUS_SUCCESS;
  };
  switch (attribute) {
  case CUBLASLT_MATMUL_DESC_TRANSA: { int32_t op; cublasStatus_t st = read(op); desc->transa = cublasOperation_t(op); return st; }
  case CUBLASLT_MATMUL_DESC_TRANSB: { int32_t op; cublasStatus_t st = read(op); desc->transb = cublasOperation_t(op); return st; }
  case CUBLASLT_MATMUL_DESC_EPILOGUE: { uint32_t e; cublasStatus_t st = read(e); desc->epilogue = cublasLtEpilogue_t(e); return st; }
  case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return read(desc->bias);
  }
  return complain(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulDescSetAttribute", "attribute not emulated");
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType_t type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  if (type != CUDA_R_32F && type != CUDA_R_16BF)
    return complain(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatrixLayoutCreate", "emulated for fp32 and bf16");
  if (ld < std::max<int64_t>(1, rows))
    return complain(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate", "leading dimension below the rows");
  *layout = new SimtLtLayout{type, int64_t(rows), int64_t(cols), ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *preference) {
  *preference = new SimtLtPreference;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t preference) {
  delete preference;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t preference,
                                                    cublasLtMatmulPreferenceAttributes_t attribute,
                                                    const void *value, size_t bytes) {
  if (attribute != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES || bytes != sizeof(uint64_t))
    return complain(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulPreferenceSetAttribute", "attribute not emulated");
  uint64_t workspace;
  std::memcpy(&workspace, value, bytes);
  preference->workspace = workspace;
  return CUBLAS_STATUS_SUCCESS;
}

namespace {
// The shapes must chain: op(A) [m, k], op(B) [k, n], C and D [m, n].
cublasStatus_t checkLt(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                       cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, int64_t &m, int64_t &n, int64_t &k) {
  if (!desc || !a || !b || !c || !d)
    return complain(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtMatmul", "a missing descriptor");
  bool ta = desc->transa != CUBLAS_OP_N, tb = desc->transb != CUBLAS_OP_N;
  m = ta ? a->cols : a->rows;
  k = ta ? a->rows : a->cols;
  n = tb ? b->rows : b->cols;
  int64_t kb = tb ? b->cols : b->rows;
  if (kb != k || d->rows != m || d->cols != n || c->rows != m || c->cols != n)
    return complain(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul",
                    "layouts do not chain: op(A) " + std::to_string(m) + "x" + std::to_string(k) + ", op(B) " +
                        std::to_string(kb) + "x" + std::to_string(n) + ", D " + std::to_string(d->rows) + "x" +
                        std::to_string(d->cols));
  if (a->type != b->type || (d->type == CUDA_R_16BF && a->type != CUDA_R_16BF))
    return complain(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmul",
                    "emulated for A and B of one type, D fp32 (or bf16 with bf16 A, B)");
  return CUBLAS_STATUS_SUCCESS;
}
size_t widthOf(cudaDataType_t type) { return type == CUDA_R_16BF ? 2 : 4; }
bool inside(const void *p, const SimtLtLayout &l) {
  return l.rows == 0 || l.cols == 0 || isDeviceRange(p, span(l.rows, l.cols, l.ld) * widthOf(l.type));
}
std::vector<float> asFloats(const void *p, const SimtLtLayout &l) {
  size_t n = span(l.rows, l.cols, l.ld);
  if (l.type == CUDA_R_16BF)
    return widen(p, n);
  const float *f = static_cast<const float *>(p);
  return std::vector<float>(f, f + n);
}
} // namespace

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t preference, int requested,
                                              cublasLtMatmulHeuristicResult_t *results, int *returned) {
  int64_t m, n, k;
  if (!handle || !preference)
    return CUBLAS_STATUS_NOT_INITIALIZED;
  cublasStatus_t st = checkLt(desc, a, b, c, d, m, n, k);
  if (st != CUBLAS_STATUS_SUCCESS)
    return st;
  *returned = requested > 0 ? 1 : 0;
  if (requested > 0)
    results[0] = cublasLtMatmulHeuristicResult_t{{{0}}, 0, CUBLAS_STATUS_SUCCESS, 1.0f, {0, 0, 0, 0}};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t a, const void *B, cublasLtMatrixLayout_t b,
                              const void *beta, const void *C, cublasLtMatrixLayout_t c, void *D,
                              cublasLtMatrixLayout_t d, const cublasLtMatmulAlgo_t *algo, void *, size_t,
                              cudaStream_t) {
  int64_t m, n, k;
  if (!handle || !algo)
    return complain(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtMatmul", "no handle or no algorithm");
  cublasStatus_t st = checkLt(desc, a, b, c, d, m, n, k);
  if (st != CUBLAS_STATUS_SUCCESS)
    return st;
  if (!inside(A, *a) || !inside(B, *b) || !inside(C, *c) || !inside(D, *d))
    return complain(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul", "an operand reaches outside its allocation");
  bool gelu = desc->epilogue == CUBLASLT_EPILOGUE_GELU_BIAS;
  bool bias = desc->epilogue == CUBLASLT_EPILOGUE_BIAS || gelu;
  const char *form = std::getenv("PARAX_SIMT_LT_GELU");
  bool erfForm = form && std::string(form) == "erf";
  if (bias && (!desc->bias || !isDeviceRange(desc->bias, m * widthOf(d->type))))
    return complain(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul", "the bias is not m elements of device memory");
  if (m == 0 || n == 0)
    return CUBLAS_STATUS_SUCCESS;
  // Descriptors and host scalars as they are now (a graph keeps them).
  SimtLtLayout la = *a, lb = *b, lc = *c, ld = *d;
  SimtLtMatmulDesc ldesc = *desc;
  float alphaValue = *static_cast<const float *>(alpha), betaValue = *static_cast<const float *>(beta);
  auto run = [=] {
    std::vector<float> fa = asFloats(A, la), fb = asFloats(B, lb), fd = asFloats(C, lc);
    parax::runtime::gemmColumnMajor(transposed(ldesc.transa), transposed(ldesc.transb), m, n, k, alphaValue, fa.data(),
                                    int(la.ld), fb.data(), int(lb.ld), betaValue, fd.data(), int(lc.ld));
    if (bias) { // the bias (D's type) broadcast along D's columns
      std::vector<float> fbias = ld.type == CUDA_R_16BF ? widen(ldesc.bias, m)
                                                        : std::vector<float>(static_cast<const float *>(ldesc.bias),
                                                                             static_cast<const float *>(ldesc.bias) + m);
      for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < m; ++i)
          fd[j * lc.ld + i] += fbias[i];
    }
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) {
        float v = fd[j * lc.ld + i];
        if (gelu)
          v = erfForm ? 0.5f * v * (1.0f + std::erf(v * 0.7071067811865476f))
                      : 0.5f * v * (1.0f + std::tanh(0.7978845608028654f * (v + 0.044715f * v * v * v)));
        if (ld.type == CUDA_R_16BF)
          static_cast<__nv_bfloat16 *>(D)[j * ld.ld + i] = __float2bfloat16(v);
        else
          static_cast<float *>(D)[j * ld.ld + i] = v;
      }
  };
  if (!record(run))
    run();
  return CUBLAS_STATUS_SUCCESS;
}

//===----------------------------------------------------------------------===//
// NCCL
//===----------------------------------------------------------------------===//

struct SimtNcclComm {
  MPI_Comm mpi = MPI_COMM_NULL;
  int rank = 0, size = 1;
  ncclResult_t asyncError = ncclSuccess;
  // False once destroyed: work still queued on a lazy stream then does nothing.
  std::shared_ptr<bool> alive = std::make_shared<bool>(true);
};

namespace {

struct PendingP2P {
  bool send;
  void *buf;
  size_t count; // bytes
  int peer;
  ncclComm_t comm;
  cudaStream_t stream;
};
int groupDepth = 0;
std::vector<PendingP2P> pending;

bool mpiAlive() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return !finalized;
}

size_t bytesOf(ncclDataType_t type) { return type == ncclBfloat16 ? 2 : 4; }

ncclResult_t checkBuffer(const char *call, const void *p, size_t count, ncclDataType_t type) {
  if (type != ncclFloat && type != ncclBfloat16 && type != ncclInt32)
    return complain(ncclInvalidArgument, call, "emulated for ncclFloat, ncclBfloat16 and ncclInt32");
  if (count && !isDeviceRange(p, count * bytesOf(type)))
    return complain(ncclInvalidArgument, call,
                    "buffer of " + std::to_string(count) + " elements is not device memory");
  return ncclSuccess;
}

// Sums in fp32 for bf16 (MPI has no bf16), rounding once at the end.
void narrowInto(void *p, const std::vector<float> &v) {
  auto *out = static_cast<__nv_bfloat16 *>(p);
  for (size_t i = 0; i < v.size(); ++i)
    out[i] = __float2bfloat16(v[i]);
}
MPI_Datatype mpiTypeOf(ncclDataType_t type) { return type == ncclInt32 ? MPI_INT : MPI_FLOAT; }

ncclResult_t checkComm(const char *call, ncclComm_t comm) {
  if (!comm || comm->mpi == MPI_COMM_NULL)
    return complain(ncclInvalidArgument, call, "no communicator");
  return ncclSuccess;
}

// An injected fault (parax::simt::ncclFault): true when the operation must
// not transfer anything.
bool faulted(ncclComm_t comm) {
  std::string fault = parax::simt::ncclFault();
  if (fault == "error")
    comm->asyncError = ncclRemoteError;
  else if (fault == "hang")
    parax::simt::markHung();
  return !fault.empty();
}

ncclResult_t mpiResult(int code) { return code == MPI_SUCCESS ? ncclSuccess : ncclSystemError; }

// An operation's transfer: now, recorded in a graph being captured, or on a
// lazy stream when the stream gets to it (a failure, when not now, becomes
// the communicator's asynchronous error).
ncclResult_t transfer(cudaStream_t stream, ncclComm_t comm, std::function<ncclResult_t()> body) {
  std::shared_ptr<bool> alive = comm->alive;
  auto later = [comm, alive, body] {
    if (!*alive)
      return;
    ncclResult_t r = body();
    if (r != ncclSuccess)
      comm->asyncError = r;
  };
  if (parax::simt::record(later) || parax::simt::defer(stream, later))
    return ncclSuccess;
  return body();
}

#define SIMT_TRY(x)                                                                               \
  do {                                                                                            \
    ncclResult_t r_ = (x);                                                                        \
    if (r_ != ncclSuccess)                                                                        \
      return r_;                                                                                  \
  } while (0)

} // namespace

const char *ncclGetErrorString(ncclResult_t result) {
  switch (result) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error";
  case ncclSystemError: return "unhandled system error";
  case ncclInternalError: return "internal error";
  case ncclInvalidArgument: return "invalid argument";
  case ncclInvalidUsage: return "invalid usage";
  case ncclRemoteError: return "remote process exited or there was a network error";
  case ncclInProgress: return "NCCL operation in progress";
  }
  return "unknown result code";
}

ncclResult_t ncclGetVersion(int *version) {
  if (!version)
    return complain(ncclInvalidArgument, "ncclGetVersion", "null version pointer");
  const char *env = std::getenv("PARAX_SIMT_NCCL_VERSION");
  *version = env ? std::atoi(env) : 23000;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  std::random_device random;
  for (char &c : id->internal)
    c = static_cast<char>(random());
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  int worldSize = 0, worldRank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &worldSize);
  MPI_Comm_rank(MPI_COMM_WORLD, &worldRank);
  if (nranks != worldSize || rank != worldRank)
    return complain(ncclInvalidArgument, "ncclCommInitRank",
                    "emulated for the MPI world's ranks only (rank " + std::to_string(rank) + " of " +
                        std::to_string(nranks) + ")");
  // Every rank must hold the same id: NCCL would hang otherwise.
  uint64_t hash = 1469598103934665603ull;
  for (char c : id.internal)
    hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  uint64_t lo = hash, hi = hash;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  if (lo != hi)
    return complain(ncclInvalidUsage, "ncclCommInitRank",
                    "the ranks hold different unique ids (a real NCCL hangs here)");
  // More ranks on this node than GPUs: NCCL before 2.30 refuses ("Duplicate
  // GPU detected"), 2.30 and later unless NCCL_MULTI_RANK_GPU_ENABLE=1.
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, worldRank, MPI_INFO_NULL, &node);
  int onNode = 1, devices = 0;
  MPI_Comm_size(node, &onNode);
  MPI_Comm_free(&node);
  cudaGetDeviceCount(&devices);
  if (onNode > devices) {
    int version = 0;
    ncclGetVersion(&version);
    const char *enable = std::getenv("NCCL_MULTI_RANK_GPU_ENABLE");
    if (version < 23000)
      return complain(ncclInvalidUsage, "ncclCommInitRank",
                      "Duplicate GPU detected: " + std::to_string(onNode) + " ranks on " + std::to_string(devices) +
                          " GPU(s) (NCCL " + std::to_string(version) + " runs one rank a GPU)");
    if (!enable || std::string(enable) != "1")
      return complain(ncclInvalidUsage, "ncclCommInitRank",
                      "Multiple Ranks are using the same GPU: set NCCL_MULTI_RANK_GPU_ENABLE=1");
  }
  auto *c = new SimtNcclComm;
  MPI_Comm_dup(MPI_COMM_WORLD, &c->mpi);
  c->rank = rank;
  c->size = nranks;
  *comm = c;
  return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *) {
  SIMT_TRY(checkComm("ncclCommSplit", comm));
  MPI_Comm split = MPI_COMM_NULL;
  SIMT_TRY(mpiResult(MPI_Comm_split(comm->mpi, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color,
                                    key, &split)));
  *newcomm = nullptr;
  if (split == MPI_COMM_NULL)
    return ncclSuccess;
  auto *c = new SimtNcclComm;
  c->mpi = split;
  MPI_Comm_rank(split, &c->rank);
  MPI_Comm_size(split, &c->size);
  *newcomm = c;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm)
    *comm->alive = false;
  if (comm && comm->mpi != MPI_COMM_NULL && mpiAlive())
    MPI_Comm_free(&comm->mpi);
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *error) {
  SIMT_TRY(checkComm("ncclCommGetAsyncError", comm));
  *error = comm->asyncError;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t, ncclComm_t comm, cudaStream_t stream) {
  SIMT_TRY(checkComm("ncclAllReduce", comm));
  SIMT_TRY(checkBuffer("ncclAllReduce", send, count, type));
  SIMT_TRY(checkBuffer("ncclAllReduce", recv, count, type));
  if (faulted(comm))
    return ncclSuccess;
  return transfer(stream, comm, [=] {
    if (type == ncclBfloat16) {
      std::vector<float> v = widen(send, count);
      ncclResult_t r = mpiResult(MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(count), MPI_FLOAT,
                                               MPI_SUM, comm->mpi));
      narrowInto(recv, v);
      return r;
    }
    return mpiResult(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, static_cast<int>(count),
                                   mpiTypeOf(type), MPI_SUM, comm->mpi));
  });
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendCount, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  SIMT_TRY(checkComm("ncclAllGather", comm));
  SIMT_TRY(checkBuffer("ncclAllGather", send, sendCount, type));
  SIMT_TRY(checkBuffer("ncclAllGather", recv, sendCount * comm->size, type));
  if (faulted(comm))
    return ncclSuccess;
  int bytes = static_cast<int>(sendCount * bytesOf(type));
  const char *own = static_cast<const char *>(recv) + size_t(bytes) * comm->rank;
  return transfer(stream, comm, [=] {
    return mpiResult(MPI_Allgather(send == own ? MPI_IN_PLACE : send, bytes, MPI_BYTE, recv, bytes, MPI_BYTE,
                                   comm->mpi));
  });
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvCount, ncclDataType_t type,
                               ncclRedOp_t, ncclComm_t comm, cudaStream_t stream) {
  SIMT_TRY(checkComm("ncclReduceScatter", comm));
  SIMT_TRY(checkBuffer("ncclReduceScatter", send, recvCount * comm->size, type));
  SIMT_TRY(checkBuffer("ncclReduceScatter", recv, recvCount, type));
  if (faulted(comm))
    return ncclSuccess;
  // NCCL's in place: recv is this rank's piece of send. Any other overlap
  // is undefined there, and refused here.
  size_t bytes = recvCount * bytesOf(type);
  const char *from = static_cast<const char *>(send), *to = static_cast<const char *>(recv);
  bool inPlace = to == from + bytes * comm->rank;
  if (!inPlace && to < from + bytes * comm->size && from < to + bytes)
    return complain(ncclInvalidArgument, "ncclReduceScatter", "recv overlaps send other than in place");
  return transfer(stream, comm, [=] {
    std::vector<int> counts(comm->size, static_cast<int>(recvCount));
    if (type == ncclBfloat16) {
      std::vector<float> all = widen(send, recvCount * comm->size), mine(recvCount);
      ncclResult_t r = mpiResult(MPI_Reduce_scatter(all.data(), mine.data(), counts.data(), MPI_FLOAT, MPI_SUM,
                                                    comm->mpi));
      narrowInto(recv, mine);
      return r;
    }
    // (MPI forbids aliased buffers: in place reads a copy of send)
    std::vector<char> copy(inPlace ? bytes * comm->size : 0);
    if (inPlace) std::memcpy(copy.data(), send, copy.size());
    return mpiResult(MPI_Reduce_scatter(inPlace ? copy.data() : send, recv, counts.data(), mpiTypeOf(type), MPI_SUM,
                                        comm->mpi));
  });
}

namespace {
ncclResult_t pointToPoint(const char *call, bool send, void *buf, size_t count, ncclDataType_t type,
                          int peer, ncclComm_t comm, cudaStream_t stream) {
  SIMT_TRY(checkComm(call, comm));
  SIMT_TRY(checkBuffer(call, buf, count, type));
  if (peer < 0 || peer >= comm->size)
    return complain(ncclInvalidArgument, call,
                    "peer " + std::to_string(peer) + " of " + std::to_string(comm->size));
  if (faulted(comm))
    return ncclSuccess;
  size_t bytes = count * bytesOf(type);
  if (groupDepth > 0) {
    pending.push_back({send, buf, bytes, peer, comm, stream});
    return ncclSuccess;
  }
  // Synchronous sends (MPI_Ssend, MPI_Issend below): an NCCL send may wait
  // until its peer posts the receive, whatever its size, so a schedule
  // that deadlocks there must deadlock here too (MPI's eager sends of
  // small messages would hide it).
  int n = static_cast<int>(bytes);
  return transfer(stream, comm, [=] {
    return mpiResult(send ? MPI_Ssend(buf, n, MPI_BYTE, peer, 0, comm->mpi)
                          : MPI_Recv(buf, n, MPI_BYTE, peer, 0, comm->mpi, MPI_STATUS_IGNORE));
  });
}
} // namespace

ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return pointToPoint("ncclSend", true, const_cast<void *>(send), count, type, peer, comm, stream);
}
ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return pointToPoint("ncclRecv", false, recv, count, type, peer, comm, stream);
}

ncclResult_t ncclGroupStart() {
  ++groupDepth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (groupDepth == 0)
    return complain(ncclInvalidUsage, "ncclGroupEnd", "without ncclGroupStart");
  if (--groupDepth > 0)
    return ncclSuccess;
  std::vector<PendingP2P> group;
  group.swap(pending);
  if (group.empty())
    return ncclSuccess;
  // Receives first, then sends: every pairing completes, whatever the order.
  return transfer(group.front().stream, group.front().comm, [group] {
    std::vector<MPI_Request> requests;
    for (bool sends : {false, true})
      for (const PendingP2P &p : group)
        if (p.send == sends) {
          requests.emplace_back();
          int n = static_cast<int>(p.count);
          if (p.send)
            MPI_Issend(p.buf, n, MPI_BYTE, p.peer, 0, p.comm->mpi, &requests.back());
          else
            MPI_Irecv(p.buf, n, MPI_BYTE, p.peer, 0, p.comm->mpi, &requests.back());
        }
    return mpiResult(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE));
  });
}
