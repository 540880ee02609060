// CudaCommon.cuh - what every part of the CUDA backend shares: error
// macros (a failed call returns a Status naming it), the launch macros the
// SIMT emulator replaces, and how a buffer is stored on the device.
// Included by CudaExecutor.cu only (one translation unit).

#ifndef PARAX_RUNTIME_CUDA_CUDACOMMON_CUH
#define PARAX_RUNTIME_CUDA_CUDACOMMON_CUH

#include "parax/runtime/Status.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <string>
#include <vector>

// Kernel launches and dynamic shared memory through macros, so that the SIMT
// emulator (simt/Simt.h: the backend compiled as plain C++) can run them.
#ifndef PARAX_LAUNCH
#define PARAX_LAUNCH(kernel, grid, block, shared, stream) kernel<<<grid, block, shared, stream>>>
#define PARAX_DYNAMIC_SHARED(T, name) extern __shared__ __align__(128) T name[]
#endif

#define PARAX_CUDA(x)                                                          \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess)                                                     \
      return Status::error(std::string(#x) + ": " + cudaGetErrorString(e_));   \
  } while (0)
#define PARAX_CUBLAS(x)                                                        \
  do {                                                                         \
    cublasStatus_t e_ = (x);                                                   \
    if (e_ != CUBLAS_STATUS_SUCCESS)                                           \
      return Status::error(std::string(#x) + ": cuBLAS status " +              \
                           std::to_string(static_cast<int>(e_)));             \
  } while (0)
#define PARAX_NCCL(x)                                                          \
  do {                                                                         \
    ncclResult_t e_ = (x);                                                     \
    if (e_ != ncclSuccess)                                                     \
      return Status::error(std::string(#x) + ": " + ncclGetErrorString(e_));   \
  } while (0)

namespace parax::runtime {

// How a buffer is stored on the device: as the executable declares it,
// except F16 held as F32 and I64 as I32 (as the CPU backend holds them).
enum class Elem { F32, BF16, I32 };
size_t elemBytes(Elem e) { return e == Elem::BF16 ? 2 : 4; }
ncclDataType_t ncclTypeOf(Elem e) {
  return e == Elem::BF16 ? ncclBfloat16 : e == Elem::I32 ? ncclInt32 : ncclFloat;
}

/// Host floats to `n` device elements of `e` (bf16 rounded to nearest even),
/// and back (bf16 widened exactly); both wait for the copy. bf16 passes
/// through a staging buffer of at most kStagingElems (a prefill's bf16
/// logits are half a gigabyte: no second copy of them on the host).
constexpr size_t kStagingElems = size_t(1) << 22;
/// step(staging, at, m) for each chunk of at most kStagingElems of n values.
template <typename Step> Status inStagedChunks(size_t n, Step step) {
  std::vector<__nv_bfloat16> staging(std::min(n, kStagingElems));
  for (size_t at = 0; at < n; at += staging.size()) {
    Status st = step(staging.data(), at, std::min(staging.size(), n - at));
    if (!st.isOk()) return st;
  }
  return Status::ok();
}
inline Status copyAndWait(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  PARAX_CUDA(cudaMemcpyAsync(dst, src, bytes, kind, stream));
  PARAX_CUDA(cudaStreamSynchronize(stream));
  return Status::ok();
}
inline Status copyToDevice(void *dst, const float *src, size_t n, Elem e, cudaStream_t stream) {
  if (e != Elem::BF16) return copyAndWait(dst, src, n * elemBytes(e), cudaMemcpyHostToDevice, stream);
  return inStagedChunks(n, [&](__nv_bfloat16 *narrow, size_t at, size_t m) {
    for (size_t i = 0; i < m; ++i) narrow[i] = __float2bfloat16(src[at + i]);
    // (waits: the staging buffer is written again next)
    return copyAndWait(static_cast<__nv_bfloat16 *>(dst) + at, narrow, m * sizeof(__nv_bfloat16),
                       cudaMemcpyHostToDevice, stream);
  });
}
inline Status copyToHost(float *dst, const void *src, size_t n, Elem e, cudaStream_t stream) {
  if (e != Elem::BF16) return copyAndWait(dst, src, n * elemBytes(e), cudaMemcpyDeviceToHost, stream);
  return inStagedChunks(n, [&](__nv_bfloat16 *narrow, size_t at, size_t m) {
    Status st = copyAndWait(narrow, static_cast<const __nv_bfloat16 *>(src) + at, m * sizeof(__nv_bfloat16),
                            cudaMemcpyDeviceToHost, stream);
    for (size_t i = 0; st.isOk() && i < m; ++i) dst[at + i] = __bfloat162float(narrow[i]);
    return st;
  });
}

} // namespace parax::runtime

#endif // PARAX_RUNTIME_CUDA_CUDACOMMON_CUH
