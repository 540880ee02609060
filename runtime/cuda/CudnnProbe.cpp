// parax-cudnn-probe - what the CUDA backend's cuDNN attention finds on
// this GPU, before any case runs (scripts/gpu-check.sh's first step): the
// cuDNN it loads, whether the SDPA graphs of the shapes the bench and the
// correctness cases use build here (forward, and forward + backward), their
// workspace, and, given a path, cuDNN's description of the device (JSON),
// which lets a machine without this GPU build plans for it later.
//
//   parax-cudnn-probe [DEVICE.json]
//
// Exit status: 0 every graph built, 1 one did not, 77 no GPU or no cuDNN.
#include "CudnnAttention.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <fstream>

using namespace parax::runtime;

int main(int argc, char **argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("parax-cudnn-probe: no GPU\n");
    return 77;
  }
  cudaStream_t stream = nullptr;
  if (cudaStreamCreate(&stream) != cudaSuccess) {
    std::printf("parax-cudnn-probe: cudaStreamCreate failed\n");
    return 1;
  }
  StatusOr<void *> handle = CudnnAttention::createHandle(stream);
  if (!handle.isOk()) {
    std::printf("parax-cudnn-probe: %s\n", handle.status().message().c_str());
    return 77;
  }
  std::printf("cuDNN %s\n", CudnnAttention::version().c_str());
  if (argc > 1) {
    StatusOr<std::string> json = CudnnAttention::deviceProperties(handle.value());
    if (json.isOk()) {
      std::ofstream(argv[1]) << json.value();
      std::printf("device properties: %zu bytes written to %s\n", json.value().size(), argv[1]);
    } else {
      std::printf("device properties: %s\n", json.status().message().c_str());
    }
  }
  // (B, S, H, D, T, KH, DV, causal, scale, bf16, window): the bench's
  // Llama-3-8B layer at two lengths, and the kinds the correctness cases
  // hold: GQA with values narrower than keys, queries the last S of T keys,
  // no mask, head width 256, a sliding window (Mistral's, Gemma 2's local
  // layers), over a whole sequence and as its last S queries.
  const CudnnAttentionShape shapes[] = {
      {1, 2048, 32, 128, 2048, 8, 128, true, 0.0884f, true},
      {1, 8192, 32, 128, 8192, 8, 128, true, 0.0884f, true},
      {2, 150, 6, 32, 150, 2, 16, true, 0.18f, true},
      {2, 5, 4, 8, 9, 4, 8, true, 0.35f, true},
      {2, 20, 2, 160, 37, 2, 96, false, 0.08f, true},
      {1, 20, 2, 256, 26, 1, 256, true, 0.06f, true},
      {2, 150, 6, 32, 150, 2, 32, true, 0.18f, true, 64},
      {2, 5, 4, 8, 9, 4, 8, true, 0.35f, true, 4},
  };
  int failed = 0;
  for (const CudnnAttentionShape &s : shapes)
    for (bool backward : {false, true}) {
      StatusOr<std::unique_ptr<CudnnAttention>> graphs = CudnnAttention::create(handle.value(), s, backward);
      std::printf("B%lld S%lld H%lld D%lld T%lld KH%lld DV%lld %s%s %s: %s", static_cast<long long>(s.B),
                  static_cast<long long>(s.S), static_cast<long long>(s.H), static_cast<long long>(s.D),
                  static_cast<long long>(s.T), static_cast<long long>(s.KH), static_cast<long long>(s.DV),
                  s.causal ? "causal" : "full",
                  s.window ? (" window " + std::to_string(s.window)).c_str() : "",
                  backward ? "forward+backward" : "forward",
                  graphs.isOk() ? "built" : graphs.status().message().c_str());
      if (graphs.isOk())
        std::printf(", workspace %lld bytes", static_cast<long long>(graphs.value()->workspaceBytes()));
      std::printf("\n");
      failed += !graphs.isOk();
    }
  CudnnAttention::destroyHandle(handle.value());
  cudaStreamDestroy(stream);
  return failed ? 1 : 0;
}
