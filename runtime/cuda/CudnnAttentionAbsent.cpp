// CudnnAttentionAbsent.cpp - CudnnAttention.h where the build has no cuDNN
// SDPA: the SIMT emulator (which has no cuDNN to stand in for), and a CUDA
// build that found no cuDNN or no cudnn-frontend headers. Every attention
// then runs the executor's own kernels.
#include "CudnnAttention.h"

namespace parax::runtime {

struct CudnnAttention::Graphs {};

CudnnAttention::CudnnAttention(std::unique_ptr<Graphs> graphs) : graphs_(std::move(graphs)) {}
CudnnAttention::~CudnnAttention() = default;

std::string CudnnAttention::version() { return ""; }

StatusOr<void *> CudnnAttention::createHandle(void *) {
  return Status::error("cuDNN attention is not in this build");
}
void CudnnAttention::destroyHandle(void *) {}
StatusOr<std::string> CudnnAttention::deviceProperties(void *) {
  return Status::error("cuDNN attention is not in this build");
}

StatusOr<std::unique_ptr<CudnnAttention>> CudnnAttention::create(void *, const CudnnAttentionShape &, bool) {
  return Status::error("cuDNN attention is not in this build");
}

int64_t CudnnAttention::workspaceBytes() const { return 0; }
int64_t CudnnAttention::outputBytes() const { return 0; }
int64_t CudnnAttention::statsBytes() const { return 0; }

Status CudnnAttention::forward(void *, const void *, const void *, const void *, void *, float *, void *) const {
  return Status::error("cuDNN attention is not in this build");
}

Status CudnnAttention::backward(void *, const void *, const void *, const void *, const void *, const float *,
                                const void *, void *, void *, void *, void *) const {
  return Status::error("cuDNN attention is not in this build");
}

} // namespace parax::runtime
