// CudnnAttention.h - attention through cuDNN's fused scaled-dot-product
// attention (SDPA) graphs, built with the header-only cudnn-frontend: a
// prefill or training step's causal or full attention, GQA, bf16 or fp16,
// forward and backward. The CUDA executor plans one an attention op when
// its prepare runs (outside any CUDA graph capture) and runs the op's own
// kernels where cuDNN is absent or refuses the shape (State::planCudnn in
// CudaExecutor.cu); the choice is logged once a run.
//
// Plain C++ with no CUDA or cuDNN type in it, so that CudaExecutor.cu
// includes it whether nvcc or the SIMT emulator compiles it:
// CudnnAttention.cpp implements it (a CUDA build with cuDNN and the
// frontend's headers), CudnnAttentionAbsent.cpp otherwise.
#pragma once

#include "parax/runtime/Status.h"

#include <cstdint>
#include <memory>
#include <string>

struct cudnnContext; // (cuDNN's handle type, cudnnHandle_t, is a pointer to it)

namespace parax::runtime {

// One attention's shape as cuDNN takes it. Tensors are parax's row-major
// [B, S, H, D] (queries, output, their gradients), [B, T, KH, D] (keys) and
// [B, T, KH, DV] (values); query head h reads key/value head h / (H / KH).
struct CudnnAttentionShape {
  int64_t B = 0, S = 0, H = 0, D = 0, T = 0, KH = 0, DV = 0;
  bool causal = false; // each query sees the keys up to its own position, the
                       // last query the last key (bottom-right where S < T)
  float scale = 1;
  bool bf16 = true;    // else fp16
  int64_t window = 0;  // causal: only the last `window` of those (a sliding
                       // window: key t for query p where p - t < window); 0: all
};

class CudnnAttention {
public:
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention &) = delete;
  CudnnAttention &operator=(const CudnnAttention &) = delete;

  // Which cuDNN this build runs ("" if none; a build without cuDNN's SDPA
  // says so when a handle is asked for).
  static std::string version();

  // cuDNN's description of the handle's device (its JSON serialisation,
  // cuDNN 9.8 or later): what a machine without the GPU needs to build and
  // check execution plans for it (the frontend's deviceless build).
  static StatusOr<std::string> deviceProperties(void *handle);

  // A cuDNN handle on `stream` (a cudaStream_t); destroyHandle frees it.
  static StatusOr<void *> createHandle(void *stream);
  static void destroyHandle(void *handle);

  // The forward graph and, with `backward`, the backward's (which reads the
  // forward's output and its per-row log-sum-exp: `forward` writes them
  // when given stats). An error carries cuDNN's reason (an unsupported
  // shape, a missing engine): the caller runs its own kernels then.
  static StatusOr<std::unique_ptr<CudnnAttention>> create(void *handle, const CudnnAttentionShape &shape,
                                                          bool backward);

  // Device memory each call needs beside its tensors: the larger graph's
  // workspace, in bytes.
  int64_t workspaceBytes() const;
  // The backward's extra tensors, in bytes: the forward's output (B·S·H·DV
  // elements) and its statistics (B·H·S floats).
  int64_t outputBytes() const;
  int64_t statsBytes() const;

  // y = attention(q, k, v); `stats` (B·H·S floats, or null without a
  // backward graph) receives each query row's log-sum-exp for `backward`.
  Status forward(void *handle, const void *q, const void *k, const void *v, void *y, float *stats,
                 void *workspace) const;
  // dq, dk, dv from the forward's q, k, v, its output y and stats, and dy.
  Status backward(void *handle, const void *q, const void *k, const void *v, const void *y,
                  const float *stats, const void *dy, void *dq, void *dk, void *dv, void *workspace) const;

private:
  struct Graphs;
  explicit CudnnAttention(std::unique_ptr<Graphs> graphs);
  static StatusOr<std::unique_ptr<CudnnAttention>> build(::cudnnContext *handle,
                                                         const CudnnAttentionShape &shape, bool backward);
  std::unique_ptr<Graphs> graphs_;
};

} // namespace parax::runtime
