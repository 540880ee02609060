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
/// and back (bf16 widened exactly); both wait for the copy.
inline Status copyToDevice(void *dst, const float *src, size_t n, Elem e, cudaStream_t stream) {
  std::vector<__nv_bfloat16> narrow(e == Elem::BF16 ? n : 0);
  for (size_t i = 0; i < narrow.size(); ++i) narrow[i] = __float2bfloat16(src[i]);
  const void *from = e == Elem::BF16 ? static_cast<const void *>(narrow.data()) : src;
  PARAX_CUDA(cudaMemcpyAsync(dst, from, n * elemBytes(e), cudaMemcpyHostToDevice, stream));
  PARAX_CUDA(cudaStreamSynchronize(stream));
  return Status::ok();
}
inline Status copyToHost(float *dst, const void *src, size_t n, Elem e, cudaStream_t stream) {
  std::vector<__nv_bfloat16> narrow(e == Elem::BF16 ? n : 0);
  void *landing = e == Elem::BF16 ? static_cast<void *>(narrow.data()) : dst;
  PARAX_CUDA(cudaMemcpyAsync(landing, src, n * elemBytes(e), cudaMemcpyDeviceToHost, stream));
  PARAX_CUDA(cudaStreamSynchronize(stream));
  for (size_t i = 0; i < narrow.size(); ++i) dst[i] = __bfloat162float(narrow[i]);
  return Status::ok();
}

} // namespace parax::runtime

#endif // PARAX_RUNTIME_CUDA_CUDACOMMON_CUH
