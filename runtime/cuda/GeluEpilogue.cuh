// GeluEpilogue.cuh - which GELU cuBLASLt's GELU_BIAS epilogue computes. Its
// documentation does not say whether it is the tanh approximation or the
// erf form (they differ by up to 4.7e-4, too much to swap under a model's
// weights), so it is measured: D = gelu(x + 0) for x in [-4, 4] against
// both forms. The CUDA backend fuses a `gelu` into the preceding biased
// `linear` only for the form this finds; parax-cuda-bench reports it.

#ifndef PARAX_RUNTIME_CUDA_GELUEPILOGUE_CUH
#define PARAX_RUNTIME_CUDA_GELUEPILOGUE_CUH

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace parax::runtime {

enum class GeluForm { None, Tanh, Erf };

struct GeluProbe {
  GeluForm form = GeluForm::None; // None: no algorithm, an error, or neither form within 1e-5
  double vsTanh = -1, vsErf = -1;  // largest |difference| from each form (-1: not measured)
};

inline double geluTanh(double v) { return 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))); }
inline double geluErf(double v) { return 0.5 * v * (1 + std::erf(v * 0.7071067811865476)); }

/// Runs the probe on the current device (synchronously).
inline GeluProbe probeGeluEpilogue(cublasLtHandle_t lt) {
  GeluProbe probe;
  const int m = 81;
  std::vector<float> x(m), zeros(m, 0.0f);
  for (int i = 0; i < m; ++i) x[i] = -4.0f + 0.1f * i;
  float one = 1.0f, zero = 0.0f;
  float *dx = nullptr, *dones = nullptr, *dd = nullptr, *dbias = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulHeuristicResult_t best;
  int found = 0;
  std::vector<float> d(m);
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_GELU_BIAS;
  bool ok = cudaMalloc(&dx, m * 4) == cudaSuccess && cudaMalloc(&dones, 4) == cudaSuccess &&
            cudaMalloc(&dd, m * 4) == cudaSuccess && cudaMalloc(&dbias, m * 4) == cudaSuccess &&
            cudaMemcpy(dx, x.data(), m * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
            cudaMemcpy(dones, &one, 4, cudaMemcpyHostToDevice) == cudaSuccess &&
            cudaMemcpy(dbias, zeros.data(), m * 4, cudaMemcpyHostToDevice) == cudaSuccess;
  const void *biasPointer = dbias;
  ok = ok && cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
       cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)) ==
           CUBLAS_STATUS_SUCCESS &&
       cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &biasPointer, sizeof(biasPointer)) ==
           CUBLAS_STATUS_SUCCESS &&
       cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, m, 1, m) == CUBLAS_STATUS_SUCCESS &&
       cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, 1, 1, 1) == CUBLAS_STATUS_SUCCESS &&
       cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, 1, m) == CUBLAS_STATUS_SUCCESS &&
       cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
       cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &best, &found) == CUBLAS_STATUS_SUCCESS &&
       found > 0 &&
       cublasLtMatmul(lt, op, &one, dx, la, dones, lb, &zero, dd, ld, dd, ld, &best.algo, nullptr, 0, nullptr) ==
           CUBLAS_STATUS_SUCCESS &&
       cudaMemcpy(d.data(), dd, m * 4, cudaMemcpyDeviceToHost) == cudaSuccess;
  if (ok) {
    probe.vsTanh = probe.vsErf = 0;
    for (int i = 0; i < m; ++i) {
      probe.vsTanh = std::max(probe.vsTanh, std::fabs(d[i] - geluTanh(x[i])));
      probe.vsErf = std::max(probe.vsErf, std::fabs(d[i] - geluErf(x[i])));
    }
    // fp32 rounding is ~1e-6 here; the forms differ by up to 4.7e-4.
    if (probe.vsTanh < 1e-5 && probe.vsErf > 1e-4) probe.form = GeluForm::Tanh;
    if (probe.vsErf < 1e-5 && probe.vsTanh > 1e-4) probe.form = GeluForm::Erf;
  }
  (void)cudaGetLastError();
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (ld) cublasLtMatrixLayoutDestroy(ld);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (op) cublasLtMatmulDescDestroy(op);
  for (float *p : {dx, dones, dd, dbias})
    if (p) cudaFree(p);
  return probe;
}

} // namespace parax::runtime

#endif // PARAX_RUNTIME_CUDA_GELUEPILOGUE_CUH
