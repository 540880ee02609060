// CudaExecutor.cu - the CUDA backend: device buffers (fp32; bf16 GEMM
// weights in bf16 programs), cuBLAS GEMMs, one CUDA kernel per op,
// flash-style attention (no S x S matrix: each block streams key tiles
// through shared memory with an online softmax), NCCL collectives on their
// own stream with a watchdog (MPI host-staged when ranks share a GPU).
// Weights and inputs are loaded by the CPU backend's loader and uploaded.

#define OMPI_SKIP_MPICXX 1
#include "parax/runtime/CudaExecutor.h"
#include "parax/runtime/Communicator.h"
#include "parax/runtime/Executable.h"
#include "parax/runtime/Executor.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <thread>

// Kernel launches and dynamic shared memory through macros, so that the SIMT
// emulator (simt/Simt.h: this file compiled as plain C++) can run them.
#ifndef PARAX_LAUNCH
#define PARAX_LAUNCH(kernel, grid, block, shared, stream) kernel<<<grid, block, shared, stream>>>
#define PARAX_DYNAMIC_SHARED(T, name) extern __shared__ __align__(128) T name[]
#endif

namespace parax::runtime {

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

int cudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

// How a buffer is stored on the device: as the executable declares it,
// except F16 held as F32 and I64 as I32 (as the CPU backend holds them).
enum class Elem { F32, BF16, I32 };
size_t elemBytes(Elem e) { return e == Elem::BF16 ? 2 : 4; }
ncclDataType_t ncclTypeOf(Elem e) {
  return e == Elem::BF16 ? ncclBfloat16 : e == Elem::I32 ? ncclInt32 : ncclFloat;
}

//===----------------------------------------------------------------------===//
// NCCL
//===----------------------------------------------------------------------===//

class NcclCommunicator {
public:
  std::vector<int64_t> shape;
  int rank = 0, size = 1;
  double timeout = 300;
  // Host-staged: several ranks share one GPU (NCCL refuses a communicator
  // with two ranks on one device), so collectives copy to the host and go
  // through MPI. Slower, same results; it lets a one-GPU machine run every
  // sharded program.
  bool staged = false;
  ncclComm_t world = nullptr;
  std::vector<ncclComm_t> comms; // per axis mask (NCCL)
  std::vector<MPI_Comm> mpiComms; // per axis mask (host-staged)
  std::vector<int> sizes;
  // NCCL work runs on its own stream, ordered after the compute stream's
  // work so far by `ready`; the compute stream continues after it by the
  // collective's own event. The host does not wait: `drain` (at every host
  // synchronisation) watches the collectives in flight, oldest first.
  cudaStream_t commStream = nullptr;
  cudaEvent_t ready = nullptr;
  struct InFlight {
    cudaEvent_t done;
    std::string op;
  };
  std::deque<InFlight> inFlight;
  std::vector<cudaEvent_t> spareEvents;
  std::string issuer; // the instruction now running, for the watchdog's reports

  Status onCommStream(cudaStream_t compute, const std::string &op,
                      const std::function<ncclResult_t(cudaStream_t)> &issue) {
    PARAX_CUDA(cudaEventRecord(ready, compute));
    PARAX_CUDA(cudaStreamWaitEvent(commStream, ready, 0));
    ncclResult_t e = issue(commStream);
    if (e != ncclSuccess)
      return Status::error("rank " + std::to_string(rank) + ": " + op + ": " + ncclGetErrorString(e));
    cudaEvent_t done = nullptr;
    if (spareEvents.empty()) {
      PARAX_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    } else {
      done = spareEvents.back();
      spareEvents.pop_back();
    }
    PARAX_CUDA(cudaEventRecord(done, commStream));
    PARAX_CUDA(cudaStreamWaitEvent(compute, done, 0));
    inFlight.push_back({done, op + " (" + issuer + ")"});
    return Status::ok();
  }

  /// Waits until every collective issued so far has finished, polling NCCL
  /// for asynchronous errors; on an error, or when one collective has not
  /// finished after `timeout` seconds, aborts every communicator and names
  /// this rank and that collective (with the instruction that issued it).
  Status drain() {
    while (!inFlight.empty()) {
      InFlight &front = inFlight.front();
      auto start = std::chrono::steady_clock::now();
      while (true) {
        for (ncclComm_t c : comms) {
          if (!c)
            continue;
          ncclResult_t async = ncclSuccess;
          ncclCommGetAsyncError(c, &async);
          if (async != ncclSuccess && async != ncclInProgress) {
            abortAll();
            return Status::error("rank " + std::to_string(rank) + ": " + front.op + ": NCCL error " +
                                 ncclGetErrorString(async));
          }
        }
        cudaError_t q = cudaEventQuery(front.done);
        if (q == cudaSuccess)
          break;
        if (q != cudaErrorNotReady)
          return Status::error("rank " + std::to_string(rank) + ": " + front.op + ": " + cudaGetErrorString(q));
        double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (elapsed > timeout) {
          abortAll();
          return Status::error("rank " + std::to_string(rank) + ": " + front.op + " timed out after " +
                               std::to_string(static_cast<int>(timeout)) + " s");
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      spareEvents.push_back(front.done);
      inFlight.pop_front();
    }
    return Status::ok();
  }

  // Every operation takes device buffers of `n` elements of `e`. The
  // host-staged path moves them as floats (bf16 widened exactly; integers
  // as their bits, never reduced).
  Status allReduce(void *buf, size_t n, Elem e, unsigned mask, cudaStream_t stream) {
    if (!staged) {
      return onCommStream(stream, "all_reduce", [&](cudaStream_t c) {
        return ncclAllReduce(buf, buf, n, ncclTypeOf(e), ncclSum, comms[mask], c);
      });
    }
    std::vector<float> h;
    Status st = toHost(h, buf, n, e, stream);
    if (!st.isOk()) return st;
    MPI_Allreduce(MPI_IN_PLACE, h.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, mpiComms[mask]);
    return toDevice(buf, h, e, stream);
  }
  /// `out` holds sizes[mask] pieces of `n`, in group order.
  Status allGather(const void *in, void *out, size_t n, Elem e, unsigned mask, cudaStream_t stream) {
    if (!staged) {
      return onCommStream(stream, "all_gather", [&](cudaStream_t c) {
        return ncclAllGather(in, out, n, ncclTypeOf(e), comms[mask], c);
      });
    }
    std::vector<float> a, b(n * sizes[mask]);
    Status st = toHost(a, in, n, e, stream);
    if (!st.isOk()) return st;
    MPI_Allgather(a.data(), static_cast<int>(n), MPI_FLOAT, b.data(), static_cast<int>(n), MPI_FLOAT,
                  mpiComms[mask]);
    return toDevice(out, b, e, stream);
  }
  /// `in` holds sizes[mask] pieces of `n`; `out` gets the sum of this rank's.
  Status reduceScatter(const void *in, void *out, size_t n, Elem e, unsigned mask, cudaStream_t stream) {
    if (!staged) {
      return onCommStream(stream, "reduce_scatter", [&](cudaStream_t c) {
        return ncclReduceScatter(in, out, n, ncclTypeOf(e), ncclSum, comms[mask], c);
      });
    }
    std::vector<float> a, b(n);
    Status st = toHost(a, in, n * sizes[mask], e, stream);
    if (!st.isOk()) return st;
    std::vector<int> counts(sizes[mask], static_cast<int>(n));
    MPI_Reduce_scatter(a.data(), b.data(), counts.data(), MPI_FLOAT, MPI_SUM, mpiComms[mask]);
    return toDevice(out, b, e, stream);
  }
  /// Piece p of `in` (n elements each) goes to group member p.
  Status allToAll(const void *in, void *out, size_t n, Elem e, unsigned mask, cudaStream_t stream) {
    if (!staged) {
      // Grouped send/recv: ncclAlltoAll would raise the NCCL floor from
      // 2.18 (ncclCommSplit) to 2.28.
      size_t piece = n * elemBytes(e);
      return onCommStream(stream, "all_to_all", [&](cudaStream_t c) {
        ncclResult_t r = ncclGroupStart();
        for (int p = 0; r == ncclSuccess && p < sizes[mask]; ++p) {
          r = ncclSend(static_cast<const char *>(in) + p * piece, n, ncclTypeOf(e), p, comms[mask], c);
          if (r == ncclSuccess)
            r = ncclRecv(static_cast<char *>(out) + p * piece, n, ncclTypeOf(e), p, comms[mask], c);
        }
        ncclResult_t end = ncclGroupEnd();
        return r != ncclSuccess ? r : end;
      });
    }
    std::vector<float> a, b(n * sizes[mask]);
    Status st = toHost(a, in, b.size(), e, stream);
    if (!st.isOk()) return st;
    MPI_Alltoall(a.data(), static_cast<int>(n), MPI_FLOAT, b.data(), static_cast<int>(n), MPI_FLOAT,
                 mpiComms[mask]);
    return toDevice(out, b, e, stream);
  }
  Status send(const void *buf, size_t n, Elem e, int peer, cudaStream_t stream) {
    if (!staged) {
      return onCommStream(stream, "send", [&](cudaStream_t c) {
        return ncclSend(buf, n, ncclTypeOf(e), peer, world, c);
      });
    }
    std::vector<float> h;
    Status st = toHost(h, buf, n, e, stream);
    if (!st.isOk()) return st;
    MPI_Send(h.data(), static_cast<int>(n), MPI_FLOAT, peer, 0, MPI_COMM_WORLD);
    return Status::ok();
  }
  Status recv(void *buf, size_t n, Elem e, int peer, cudaStream_t stream) {
    if (!staged) {
      return onCommStream(stream, "recv", [&](cudaStream_t c) {
        return ncclRecv(buf, n, ncclTypeOf(e), peer, world, c);
      });
    }
    std::vector<float> h(n);
    MPI_Recv(h.data(), static_cast<int>(n), MPI_FLOAT, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    return toDevice(buf, h, e, stream);
  }

  void abortAll() {
    for (ncclComm_t &c : comms)
      if (c) { ncclCommAbort(c); c = nullptr; }
    if (world) { ncclCommAbort(world); world = nullptr; }
  }
  ~NcclCommunicator() {
    for (ncclComm_t c : comms)
      if (c) ncclCommDestroy(c);
    if (world) ncclCommDestroy(world);
    for (MPI_Comm &c : mpiComms)
      if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
    if (ready) cudaEventDestroy(ready);
    for (InFlight &f : inFlight) cudaEventDestroy(f.done);
    for (cudaEvent_t e : spareEvents) cudaEventDestroy(e);
    if (commStream) cudaStreamDestroy(commStream);
  }

private:
  static Status toHost(std::vector<float> &dst, const void *src, size_t n, Elem e, cudaStream_t stream) {
    dst.resize(n);
    std::vector<__nv_bfloat16> narrow(e == Elem::BF16 ? n : 0);
    void *landing = e == Elem::BF16 ? static_cast<void *>(narrow.data()) : dst.data();
    PARAX_CUDA(cudaMemcpyAsync(landing, src, n * elemBytes(e), cudaMemcpyDeviceToHost, stream));
    PARAX_CUDA(cudaStreamSynchronize(stream));
    for (size_t i = 0; i < narrow.size(); ++i) dst[i] = __bfloat162float(narrow[i]);
    return Status::ok();
  }
  static Status toDevice(void *dst, const std::vector<float> &src, Elem e, cudaStream_t stream) {
    std::vector<__nv_bfloat16> narrow(e == Elem::BF16 ? src.size() : 0);
    for (size_t i = 0; i < narrow.size(); ++i) narrow[i] = __float2bfloat16(src[i]);
    const void *from = e == Elem::BF16 ? static_cast<const void *>(narrow.data()) : src.data();
    PARAX_CUDA(cudaMemcpyAsync(dst, from, src.size() * elemBytes(e), cudaMemcpyHostToDevice, stream));
    PARAX_CUDA(cudaStreamSynchronize(stream));
    return Status::ok();
  }
};

bool isHostStaged(const NcclCommunicator *comm) { return comm && comm->staged; }

StatusOr<NcclCommunicator *>
createNcclCommunicator(const std::vector<int64_t> &shape, int rank, int size, int device,
                       double timeoutSeconds) {
  PARAX_CUDA(cudaSetDevice(device));
  auto comm = std::make_unique<NcclCommunicator>();
  comm->shape = shape;
  comm->rank = rank;
  comm->size = size;
  comm->timeout = timeoutSeconds;
  // Ranks on this node against GPUs on this node, agreed by every rank.
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int onNode = 1;
  MPI_Comm_size(node, &onNode);
  MPI_Comm_free(&node);
  const char *forced = std::getenv("PARAX_COLLECTIVES");
  int staged = (onNode > cudaDeviceCount()) || (forced && std::string(forced) == "mpi");
  MPI_Allreduce(MPI_IN_PLACE, &staged, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  comm->staged = staged != 0;
  if (!comm->staged) {
    ncclUniqueId id;
    if (rank == 0)
      PARAX_NCCL(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
    PARAX_NCCL(ncclCommInitRank(&comm->world, size, id, rank));
    PARAX_CUDA(cudaStreamCreateWithFlags(&comm->commStream, cudaStreamNonBlocking));
    PARAX_CUDA(cudaEventCreateWithFlags(&comm->ready, cudaEventDisableTiming));
  }
  unsigned axes = shape.size();
  comm->comms.assign(1u << axes, nullptr);
  comm->mpiComms.assign(1u << axes, MPI_COMM_NULL);
  comm->sizes.assign(1u << axes, 1);
  // Every rank splits for every mask in the same order (the splits are
  // collective over the parent); every rank belongs to one group per mask.
  for (unsigned mask = 1; mask < (1u << axes); ++mask) {
    GroupSplit g = groupSplit(shape, rank, mask);
    if (comm->staged)
      MPI_Comm_split(MPI_COMM_WORLD, static_cast<int>(g.color), static_cast<int>(g.key),
                     &comm->mpiComms[mask]);
    else
      PARAX_NCCL(ncclCommSplit(comm->world, static_cast<int>(g.color), static_cast<int>(g.key),
                               &comm->comms[mask], nullptr));
    comm->sizes[mask] = static_cast<int>(g.members);
  }
  return comm.release();
}

void destroyNcclCommunicator(NcclCommunicator *comm) { delete comm; }

//===----------------------------------------------------------------------===//
// Kernels
//===----------------------------------------------------------------------===//

namespace {

constexpr int kThreads = 256;
constexpr size_t kLtWorkspace = 32u << 20; // cuBLASLt's workspace (32 MiB suits Hopper)
constexpr int kMaxRank = 8;

// Blocks for a grid-stride loop over n elements (at least one: a grid of
// zero blocks is an invalid launch).
int blocksFor(int64_t n) {
  return static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 65535));
}

struct Dims {
  int rank = 0;
  int64_t d[kMaxRank] = {};
};
Dims dimsOf(const std::vector<int64_t> &shape) {
  Dims d;
  d.rank = shape.size();
  for (size_t i = 0; i < shape.size() && i < kMaxRank; ++i) d.d[i] = shape[i];
  return d;
}

// Floating-point storage: fp32 or bf16 (T); the math is fp32 either way.
// Data movement copies the bits (W: uint32_t or uint16_t, by element size).
__device__ __forceinline__ float ld(const float *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ld(const __nv_bfloat16 *p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(float *p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__nv_bfloat16 *p, int64_t i, float v) { p[i] = __float2bfloat16(v); }

__device__ float siluF(float x) { return x / (1.0f + expf(-x)); }

#define PARAX_GRID_STRIDE(k, n)                                                                    \
  for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < (n);                        \
       k += (int64_t)gridDim.x * blockDim.x)

template <typename W>
__global__ void embeddingKernel(const int32_t *ids, const W *table, W *out, int64_t tokens, int64_t h,
                                int64_t rows, int64_t offset) {
  PARAX_GRID_STRIDE(k, tokens * h) {
    int64_t t = k / h, c = k % h, id = ids[t] - offset;
    out[k] = (id < 0 || id >= rows) ? W(0) : table[id * h + c]; // all-zero bits: 0.0 in fp32 and bf16
  }
}

__global__ void toBf16Kernel(const float *x, __nv_bfloat16 *y, int64_t n) {
  PARAX_GRID_STRIDE(i, n) y[i] = __float2bfloat16(x[i]);
}

// One block per row.
template <typename T>
__global__ void normKernel(const T *x, const T *w, const T *b, T *y, int64_t h, float eps, bool layerNorm) {
  __shared__ float partial[kThreads];
  const T *xr = x + blockIdx.x * h;
  T *yr = y + blockIdx.x * h;
  float mean = 0;
  if (layerNorm) {
    float s = 0;
    for (int64_t c = threadIdx.x; c < h; c += blockDim.x) s += ld(xr, c);
    partial[threadIdx.x] = s;
    __syncthreads();
    for (int step = blockDim.x / 2; step > 0; step /= 2) {
      if (threadIdx.x < step) partial[threadIdx.x] += partial[threadIdx.x + step];
      __syncthreads();
    }
    mean = partial[0] / h;
    __syncthreads();
  }
  float s = 0;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) s += (ld(xr, c) - mean) * (ld(xr, c) - mean);
  partial[threadIdx.x] = s;
  __syncthreads();
  for (int step = blockDim.x / 2; step > 0; step /= 2) {
    if (threadIdx.x < step) partial[threadIdx.x] += partial[threadIdx.x + step];
    __syncthreads();
  }
  float inv = rsqrtf(partial[0] / h + eps);
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x)
    st(yr, c, (ld(xr, c) - mean) * inv * ld(w, c) + (layerNorm ? ld(b, c) : 0.0f));
}

// Angles in double, as the CPU backend computes them (float loses ~1e-4 rad
// at position 2048).
template <typename T>
__global__ void ropeKernel(T *v, const double *invFreq, int64_t B, int64_t S, int64_t H, int64_t D, int64_t rot,
                           int64_t offset, bool interleaved) {
  int64_t half = rot / 2;
  PARAX_GRID_STRIDE(k, B * S * H * half) {
    int64_t i = k % half, row = k / half, s = (row / H) % S;
    double angle = (offset + s) * invFreq[i];
    float c = static_cast<float>(cos(angle)), sn = static_cast<float>(sin(angle));
    T *x = v + row * D;
    int64_t p = interleaved ? 2 * i : i, q = interleaved ? 2 * i + 1 : i + half;
    float x0 = ld(x, p), x1 = ld(x, q);
    st(x, p, x0 * c - x1 * sn);
    st(x, q, x1 * c + x0 * sn);
  }
}

// Flash-style attention on CUDA cores: one block per (batch, head, tile of
// `qTile` queries). Key tiles of `kTile` keys pass through shared memory
// (fp32 whatever the storage); each query row keeps an online softmax
// (running max and sum), and the output tile accumulates in shared memory,
// each element owned by one thread. Nothing of size S x T is stored, and
// each key tile is read once per query tile (not once per query).
struct AttentionTiles {
  int queries = 32, keys = 64;
  // Floats of dynamic shared memory for head widths D (query/key), DV.
  static int64_t floats(int q, int k, int64_t D, int64_t DV) {
    return q * (D + 1) + k * (D + 1) + k * DV + q * k + q * DV + 3 * q;
  }
};

template <typename T>
__global__ void attentionKernel(const T *q, const T *k, const T *v, T *y, int64_t B, int64_t S, int64_t H,
                                int64_t D, int64_t T_, int64_t KH, int64_t DV, bool causal, float scale,
                                int64_t headOffset, int64_t group, int qTile, int kTile) {
  PARAX_DYNAMIC_SHARED(float, shared);
  const int ds = static_cast<int>(D) + 1; // padded rows: keys fall in different banks
  const int dv = static_cast<int>(DV), d0 = static_cast<int>(D);
  float *qs = shared;               // [qTile][D + 1]
  float *ks = qs + qTile * ds;      // [kTile][D + 1]
  float *vs = ks + kTile * ds;      // [kTile][DV]
  float *ps = vs + kTile * dv;      // [qTile][kTile]: scores, then probabilities
  float *os = ps + qTile * kTile;   // [qTile][DV]: the unnormalised output
  float *rowMax = os + qTile * dv, *rowSum = rowMax + qTile, *rowScale = rowSum + qTile;
  int64_t tiles = (S + qTile - 1) / qTile;
  int64_t qt = blockIdx.x % tiles, h = (blockIdx.x / tiles) % H, b = blockIdx.x / (tiles * H);
  int64_t q0 = qt * qTile;
  int rows = static_cast<int>(min((int64_t)qTile, S - q0));
  int64_t kh = (headOffset + h) / group;
  int64_t past = T_ - S; // keys before the first query's position
  // Keys the tile's last query sees (causal), or all of them.
  int64_t keysEnd = causal ? min(T_, q0 + rows + past) : T_;
  for (int i = threadIdx.x; i < qTile * ds; i += blockDim.x) {
    int r = i / ds, d = i % ds;
    qs[i] = (r < rows && d < d0) ? ld(q, ((b * S + q0 + r) * H + h) * D + d) : 0.0f;
  }
  for (int i = threadIdx.x; i < qTile * dv; i += blockDim.x) os[i] = 0.0f;
  for (int r = threadIdx.x; r < qTile; r += blockDim.x) {
    rowMax[r] = -INFINITY;
    rowSum[r] = 0.0f;
  }
  __syncthreads();
  for (int64_t t0 = 0; t0 < keysEnd; t0 += kTile) {
    int cols = static_cast<int>(min((int64_t)kTile, keysEnd - t0));
    for (int i = threadIdx.x; i < kTile * ds; i += blockDim.x) {
      int j = i / ds, d = i % ds;
      ks[i] = (j < cols && d < d0) ? ld(k, ((b * T_ + t0 + j) * KH + kh) * D + d) : 0.0f;
    }
    for (int i = threadIdx.x; i < kTile * dv; i += blockDim.x) {
      int j = i / dv, d = i % dv;
      vs[i] = j < cols ? ld(v, ((b * T_ + t0 + j) * KH + kh) * DV + d) : 0.0f;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < qTile * kTile; i += blockDim.x) {
      int r = i / kTile, j = i % kTile;
      float score = -INFINITY;
      if (r < rows && j < cols && (!causal || t0 + j <= q0 + r + past)) {
        const float *qr = qs + r * ds, *kr = ks + j * ds;
        float dot = 0.0f;
        for (int d = 0; d < d0; ++d) dot += qr[d] * kr[d];
        score = dot * scale;
      }
      ps[i] = score;
    }
    __syncthreads();
    for (int r = threadIdx.x; r < qTile; r += blockDim.x) {
      float *pr = ps + r * kTile;
      float m = rowMax[r];
      for (int j = 0; j < cols; ++j) m = fmaxf(m, pr[j]);
      float sum = 0.0f;
      for (int j = 0; j < kTile; ++j) {
        float p = (j < cols && pr[j] != -INFINITY) ? expf(pr[j] - m) : 0.0f; // masked: 0
        pr[j] = p;
        sum += p;
      }
      float rescale = rowMax[r] == -INFINITY ? 0.0f : expf(rowMax[r] - m);
      rowSum[r] = rowSum[r] * rescale + sum;
      rowMax[r] = m;
      rowScale[r] = rescale;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < qTile * dv; i += blockDim.x) {
      int r = i / dv, d = i % dv;
      const float *pr = ps + r * kTile;
      float a = os[i] * rowScale[r];
      for (int j = 0; j < cols; ++j) a += pr[j] * vs[j * dv + d];
      os[i] = a;
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < rows * dv; i += blockDim.x) {
    int r = i / dv, d = i % dv;
    st(y, ((b * S + q0 + r) * H + h) * DV + d, os[i] / rowSum[r]);
  }
}

// Attention on bf16 tensor cores (WMMA 16x16x16, fp32 accumulation), for
// bf16 storage with head widths that are multiples of 16: one block of four
// warps per (batch, head, 64 queries), each warp owning 16 query rows.
// Per 64-key tile: S = Q K^T on tensor cores, the online softmax in fp32 by
// one thread per row (P rounded to bf16), then P V on tensor cores into a
// scratch tile that the block folds into the fp32 output (rescaled per
// row). Shared memory rows are padded (8 bf16 / 4 fp32) to keep WMMA's
// 256-bit alignment and spread the banks.
struct TensorCoreTiles {
  static constexpr int kQueries = 64, kKeys = 64, kWarps = 4;
  // Bytes of dynamic shared memory for head widths D, DV.
  static int64_t bytes(int64_t D, int64_t DV) {
    return 2 * (kQueries * (D + 8) + kKeys * (D + 8) + kKeys * (DV + 8) + kQueries * (kKeys + 8)) +
           4 * (kQueries * (kKeys + 4) + kQueries * (DV + 4) + kQueries * DV + 3 * kQueries);
  }
};

// One warp: out[16][16] (fp32, row-major) = a[16][k] . b[k][16] on tensor
// cores; a is row-major, b is read as LayoutB and advances `bStep` elements
// per 16 of k.
template <typename LayoutB>
__device__ void warpTileProduct(const __nv_bfloat16 *a, int lda, const __nv_bfloat16 *b, int ldb, int bStep, int k,
                                float *out, int ldo) {
  using namespace nvcuda;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 0.0f);
  for (int k0 = 0; k0 < k; k0 += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, LayoutB> fb;
    wmma::load_matrix_sync(fa, a + k0, lda);
    wmma::load_matrix_sync(fb, b + (k0 / 16) * bStep, ldb);
    wmma::mma_sync(acc, fa, fb, acc);
  }
  wmma::store_matrix_sync(out, acc, ldo, wmma::mem_row_major);
}

__global__ void attentionTensorCoreKernel(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                                          __nv_bfloat16 *y, int64_t B, int64_t S, int64_t H, int64_t D, int64_t T_,
                                          int64_t KH, int64_t DV, bool causal, float scale, int64_t headOffset,
                                          int64_t group) {
  using namespace nvcuda;
  constexpr int QT = TensorCoreTiles::kQueries, KT = TensorCoreTiles::kKeys;
  PARAX_DYNAMIC_SHARED(float, shared); // one name and type for every kernel's dynamic shared memory
  const int dq = static_cast<int>(D), dv = static_cast<int>(DV);
  const int ldq = dq + 8, ldv = dv + 8, ldp = KT + 8, lds = KT + 4, ldo = dv + 4;
  auto *qs = reinterpret_cast<__nv_bfloat16 *>(shared); // [QT][ldq]
  __nv_bfloat16 *ks = qs + QT * ldq;                    // [KT][ldq]
  __nv_bfloat16 *vs = ks + KT * ldq;                    // [KT][ldv]
  __nv_bfloat16 *ps = vs + KT * ldv;                    // [QT][ldp] probabilities
  auto *ss = reinterpret_cast<float *>(ps + QT * ldp);  // [QT][lds] scores
  float *ot = ss + QT * lds;                            // [QT][ldo] this tile's P V
  float *os = ot + QT * ldo;                            // [QT][dv] the output so far
  float *rowMax = os + QT * dv, *rowSum = rowMax + QT, *rowScale = rowSum + QT;
  int64_t tiles = (S + QT - 1) / QT;
  int64_t qt = blockIdx.x % tiles, h = (blockIdx.x / tiles) % H, b = blockIdx.x / (tiles * H);
  int64_t q0 = qt * QT;
  int rows = static_cast<int>(min((int64_t)QT, S - q0));
  int64_t kh = (headOffset + h) / group, past = T_ - S;
  int64_t keysEnd = causal ? min(T_, q0 + rows + past) : T_;
  int warp = threadIdx.x / 32;
  for (int i = threadIdx.x; i < QT * dq; i += blockDim.x) {
    int r = i / dq, d = i % dq;
    qs[r * ldq + d] = r < rows ? q[((b * S + q0 + r) * H + h) * D + d] : __float2bfloat16(0.0f);
  }
  for (int i = threadIdx.x; i < QT * dv; i += blockDim.x) os[i] = 0.0f;
  for (int r = threadIdx.x; r < QT; r += blockDim.x) {
    rowMax[r] = -INFINITY;
    rowSum[r] = 0.0f;
  }
  __syncthreads();
  for (int64_t t0 = 0; t0 < keysEnd; t0 += KT) {
    int cols = static_cast<int>(min((int64_t)KT, keysEnd - t0));
    for (int i = threadIdx.x; i < KT * dq; i += blockDim.x) {
      int j = i / dq, d = i % dq;
      ks[j * ldq + d] = j < cols ? k[((b * T_ + t0 + j) * KH + kh) * D + d] : __float2bfloat16(0.0f);
    }
    for (int i = threadIdx.x; i < KT * dv; i += blockDim.x) {
      int j = i / dv, d = i % dv;
      vs[j * ldv + d] = j < cols ? v[((b * T_ + t0 + j) * KH + kh) * DV + d] : __float2bfloat16(0.0f);
    }
    __syncthreads();
    // S[16 warp rows][KT] = Q K^T (K^T read as a column-major matrix_b).
    for (int n0 = 0; n0 < KT; n0 += 16)
      warpTileProduct<wmma::col_major>(qs + warp * 16 * ldq, ldq, ks + n0 * ldq, ldq, 16, dq,
                                       ss + warp * 16 * lds + n0, lds);
    __syncthreads();
    for (int r = threadIdx.x; r < QT; r += blockDim.x) {
      float *sr = ss + r * lds;
      float m = rowMax[r];
      for (int j = 0; j < cols; ++j) {
        bool visible = r < rows && (!causal || t0 + j <= q0 + r + past);
        sr[j] = visible ? sr[j] * scale : -INFINITY;
        m = fmaxf(m, sr[j]);
      }
      float sum = 0.0f;
      for (int j = 0; j < KT; ++j) {
        float p = (j < cols && sr[j] != -INFINITY) ? expf(sr[j] - m) : 0.0f;
        __nv_bfloat16 pb = __float2bfloat16(p);
        ps[r * ldp + j] = pb;
        sum += __bfloat162float(pb); // the sum of what P V multiplies
      }
      float rescale = rowMax[r] == -INFINITY ? 0.0f : expf(rowMax[r] - m);
      rowSum[r] = rowSum[r] * rescale + sum;
      rowMax[r] = m;
      rowScale[r] = rescale;
    }
    __syncthreads();
    // ot[16 warp rows][DV] = P V.
    for (int n0 = 0; n0 < dv; n0 += 16)
      warpTileProduct<wmma::row_major>(ps + warp * 16 * ldp, ldp, vs + n0, ldv, 16 * ldv, KT,
                                       ot + warp * 16 * ldo + n0, ldo);
    __syncthreads();
    for (int i = threadIdx.x; i < QT * dv; i += blockDim.x) {
      int r = i / dv, d = i % dv;
      os[i] = os[i] * rowScale[r] + ot[r * ldo + d];
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < rows * dv; i += blockDim.x) {
    int r = i / dv, d = i % dv;
    y[((b * S + q0 + r) * H + h) * DV + d] = __float2bfloat16(os[i] / rowSum[r]);
  }
}

__device__ int64_t broadcastIndex(const Dims &in, const Dims &out, int64_t k) {
  int64_t index = 0, stride = 1;
  for (int d = out.rank - 1; d >= 0; --d) {
    int64_t coord = k % out.d[d];
    k /= out.d[d];
    if (in.d[d] != 1) index += coord * stride;
    stride *= in.d[d];
  }
  return index;
}

template <typename T>
__global__ void binaryKernel(const T *l, const T *r, T *y, Dims ld_, Dims rd, Dims od, int64_t n, bool add) {
  PARAX_GRID_STRIDE(k, n) {
    float a = ld(l, broadcastIndex(ld_, od, k)), b = ld(r, broadcastIndex(rd, od, k));
    st(y, k, add ? a + b : a * b);
  }
}

template <typename W> __global__ void broadcastKernel(const W *x, W *y, Dims xd, Dims od, int64_t n) {
  PARAX_GRID_STRIDE(k, n) y[k] = x[broadcastIndex(xd, od, k)];
}

// kind: 0 silu, 1 sigmoid, 2 gelu tanh, 3 gelu erf
template <typename T> __global__ void unaryKernel(const T *x, T *y, int64_t n, int kind) {
  PARAX_GRID_STRIDE(k, n) {
    float v = ld(x, k), r;
    if (kind == 0) r = siluF(v);
    else if (kind == 1) r = 1.0f / (1.0f + expf(-v));
    else if (kind == 2) r = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    else r = 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
    st(y, k, r);
  }
}

template <typename T> __global__ void swigluKernel(const T *g, const T *u, T *y, int64_t n) {
  PARAX_GRID_STRIDE(k, n) st(y, k, siluF(ld(g, k)) * ld(u, k));
}

template <typename W> __global__ void transposeKernel(const W *x, W *y, Dims xd, Dims yd, Dims perm, int64_t n) {
  PARAX_GRID_STRIDE(k, n) {
    int64_t rem = k, offset = 0;
    int64_t xs[kMaxRank];
    xs[xd.rank - 1] = 1;
    for (int d = xd.rank - 2; d >= 0; --d) xs[d] = xs[d + 1] * xd.d[d + 1];
    for (int d = yd.rank - 1; d >= 0; --d) {
      int64_t coord = rem % yd.d[d];
      rem /= yd.d[d];
      offset += coord * xs[perm.d[d]];
    }
    y[k] = x[offset];
  }
}

// y[o, j, i] = x[o, start + j, i] for j < ny (x has nx along the middle).
template <typename W>
__global__ void sliceKernel(const W *x, W *y, int64_t outer, int64_t nx, int64_t ny, int64_t start, int64_t inner) {
  PARAX_GRID_STRIDE(k, outer * ny * inner) {
    int64_t i = k % inner, j = (k / inner) % ny, o = k / (inner * ny);
    y[k] = x[(o * nx + start + j) * inner + i];
  }
}

// The inverse: place x (ny along the middle) at `start` of y (nx).
template <typename W>
__global__ void placeKernel(const W *x, W *y, int64_t outer, int64_t nx, int64_t ny, int64_t start, int64_t inner) {
  PARAX_GRID_STRIDE(k, outer * ny * inner) {
    int64_t i = k % inner, j = (k / inner) % ny, o = k / (inner * ny);
    y[(o * nx + start + j) * inner + i] = x[k];
  }
}

// One thread per token: scores, choice (+bias, groups), top-k weights/indices.
// The logits come from a GEMM in fp32; bias and weights have the storage T.
template <typename T>
__global__ void routerKernel(const float *logits, const T *bias, float *scratch, T *weights, int32_t *indices,
                             int64_t tokens, int64_t E, int64_t K, bool sigmoidScores, bool normalize,
                             float scaling, int64_t groups, int64_t topkGroups) {
  int64_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  const float *l = logits + t * E;
  float *scores = scratch + t * 2 * E, *choice = scores + E;
  float m = -INFINITY, sum = 0;
  for (int64_t e = 0; e < E; ++e) m = fmaxf(m, l[e]);
  for (int64_t e = 0; e < E; ++e) {
    scores[e] = sigmoidScores ? 1.0f / (1.0f + expf(-l[e])) : expf(l[e] - m);
    sum += scores[e];
  }
  if (!sigmoidScores) for (int64_t e = 0; e < E; ++e) scores[e] /= sum;
  for (int64_t e = 0; e < E; ++e) choice[e] = scores[e] + (bias ? ld(bias, e) : 0.0f);
  if (groups > 1) {
    int64_t per = E / groups;
    for (int64_t kept = 0; kept < groups - topkGroups; ++kept) {
      // Drop the group with the lowest top-2 sum among those still allowed.
      int64_t worst = -1;
      float worstScore = INFINITY;
      for (int64_t g = 0; g < groups; ++g) {
        float a = -INFINITY, b = -INFINITY;
        for (int64_t e = g * per; e < (g + 1) * per; ++e) {
          float c = choice[e];
          if (c > a) { b = a; a = c; } else if (c > b) { b = c; }
        }
        if (a == -INFINITY) continue; // already dropped
        float gs = a + (per > 1 ? b : 0.0f);
        if (gs < worstScore || (gs == worstScore && g > worst)) { worstScore = gs; worst = g; }
      }
      for (int64_t e = worst * per; e < (worst + 1) * per; ++e) choice[e] = -INFINITY;
    }
  }
  float total = 0;
  float chosen[64];
  for (int64_t j = 0; j < K; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e)
      if (best < 0 || choice[e] > choice[best]) best = e;
    indices[t * K + j] = static_cast<int32_t>(best);
    chosen[j] = scores[best];
    total += scores[best];
    choice[best] = -INFINITY;
  }
  for (int64_t j = 0; j < K; ++j) {
    float w = chosen[j];
    if (normalize) w /= (total + 1e-20f);
    st(weights, t * K + j, w * scaling);
  }
}

// Experts as GEMMs: the pairs (token, choice) grouped by expert -- perm
// lists them expert by expert, each in token order, and pos is the inverse
// -- so that each expert's rows run through cuBLAS together.
// One thread per expert walks the pairs.
__global__ void expertCountKernel(const int32_t *idx, int32_t *count, int64_t pairs, int64_t E) {
  int64_t e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= E) return;
  int32_t n = 0;
  for (int64_t k = 0; k < pairs; ++k) n += idx[k] == e;
  count[e] = n;
}

__global__ void expertOrderKernel(const int32_t *idx, const int32_t *offset, int32_t *perm, int32_t *pos,
                                  int64_t pairs, int64_t E) {
  int64_t e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= E) return;
  int32_t n = offset[e];
  for (int64_t k = 0; k < pairs; ++k)
    if (idx[k] == e) {
      perm[n] = static_cast<int32_t>(k);
      pos[k] = n++;
    }
}

// xg[r, :] = x[token of pair perm[r], :]
template <typename W>
__global__ void gatherRowsKernel(const W *x, const int32_t *perm, W *xg, int64_t rows, int64_t K, int64_t h) {
  PARAX_GRID_STRIDE(i, rows * h) xg[i] = x[(perm[i / h] / K) * h + i % h];
}

// y[t, :] = sum over token t's pairs j (in order) of w[t, j] * down[pos[t, j], :]
template <typename T>
__global__ void expertsCombineKernel(const float *down, const T *w, const int32_t *pos, T *y, int64_t tokens,
                                     int64_t K, int64_t h) {
  PARAX_GRID_STRIDE(i, tokens * h) {
    int64_t t = i / h, c = i % h;
    float a = 0.0f;
    for (int64_t j = 0; j < K; ++j) {
      int32_t r = pos[t * K + j];
      if (r >= 0) a += ld(w, t * K + j) * down[r * h + c]; // r < 0: an unused dispatch row
    }
    st(y, i, a);
  }
}

// MoE exchanges (the CPU backend's layout): pair k goes to rank
// dest = idx[k] / local, into slot dest * pairs + (its order among the pairs
// for dest); a slot row is [x row | weight | local expert, -1 when empty],
// in fp32 whatever the storage. One thread per destination walks the pairs.
__global__ void moeSlotsKernel(const int32_t *idx, int32_t *slot, int64_t pairs, int64_t local, int64_t P) {
  int64_t dest = blockIdx.x * blockDim.x + threadIdx.x;
  if (dest >= P) return;
  int64_t fill = 0;
  for (int64_t k = 0; k < pairs; ++k)
    if (idx[k] >= 0 && idx[k] / local == dest) slot[k] = static_cast<int32_t>(dest * pairs + fill++);
}

__global__ void moeClearKernel(float *send, int64_t slots, int64_t h) {
  int64_t width = h + 2;
  PARAX_GRID_STRIDE(i, slots * width) send[i] = i % width == h + 1 ? -1.0f : 0.0f; // every slot empty first
}

template <typename T>
__global__ void moeFillKernel(const T *x, const T *w, const int32_t *idx, const int32_t *slot, float *send,
                              int64_t pairs, int64_t K, int64_t h, int64_t local) {
  int64_t width = h + 2;
  PARAX_GRID_STRIDE(i, pairs * width) {
    int64_t k = i / width, c = i % width;
    int64_t s = slot[k];
    if (s < 0) continue;
    send[s * width + c] = c < h    ? ld(x, (k / K) * h + c)
                          : c == h ? ld(w, k)
                                   : static_cast<float>(idx[k] - (s / pairs) * local);
  }
}

template <typename T>
__global__ void moeUnpackKernel(const float *recv, T *rows, T *weights, int32_t *experts, int64_t slots, int64_t h) {
  int64_t width = h + 2;
  PARAX_GRID_STRIDE(i, slots * width) {
    int64_t r = i / width, c = i % width;
    if (c < h) st(rows, r * h + c, recv[i]);
    else if (c == h) st(weights, r, recv[i]);
    else experts[r] = static_cast<int32_t>(recv[i]);
  }
}

// y[t, c] = the sum over token t's pairs (in order) of their returned rows.
template <typename T>
__global__ void moeCombineKernel(const T *back, const int32_t *slot, T *y, int64_t tokens, int64_t K, int64_t h) {
  PARAX_GRID_STRIDE(i, tokens * h) {
    int64_t t = i / h, c = i % h;
    float a = 0.0f;
    for (int64_t j = 0; j < K; ++j) {
      int64_t s = slot[t * K + j];
      if (s >= 0) a += ld(back, s * h + c);
    }
    st(y, i, a);
  }
}

// One block per token; a label outside the vocabulary is reported through
// `badToken` (the host turns it into an error, as the CPU backend does).
template <typename T>
__global__ void crossEntropyKernel(const T *logits, const int32_t *labels, float *total, int64_t V,
                                   int32_t *badToken) {
  __shared__ float partial[kThreads];
  const T *l = logits + blockIdx.x * V;
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x) m = fmaxf(m, ld(l, c));
  partial[threadIdx.x] = m;
  __syncthreads();
  for (int step = blockDim.x / 2; step > 0; step /= 2) {
    if (threadIdx.x < step) partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + step]);
    __syncthreads();
  }
  m = partial[0];
  __syncthreads();
  float s = 0;
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x) s += expf(ld(l, c) - m);
  partial[threadIdx.x] = s;
  __syncthreads();
  for (int step = blockDim.x / 2; step > 0; step /= 2) {
    if (threadIdx.x < step) partial[threadIdx.x] += partial[threadIdx.x + step];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    int32_t label = labels[blockIdx.x];
    if (label < 0 || label >= V) *badToken = static_cast<int32_t>(blockIdx.x);
    else atomicAdd(total, logf(partial[0]) + m - ld(l, label));
  }
}

__global__ void scaleKernel(float *x, int64_t n, float factor) {
  PARAX_GRID_STRIDE(k, n) x[k] *= factor;
}

} // namespace

//===----------------------------------------------------------------------===//
// Executor
//===----------------------------------------------------------------------===//

struct DeviceBuffer {
  std::vector<int64_t> shape;
  Elem elem = Elem::F32;
  void *data = nullptr;
  int64_t numel() const { return numelOf(shape); }
  size_t bytes() const { return std::max<int64_t>(numel(), 1) * elemBytes(elem); }
  float *f() const { return static_cast<float *>(data); }
  int32_t *i() const { return static_cast<int32_t *>(data); }
  template <typename T> T *as() const { return static_cast<T *>(data); }
};

Elem elemOf(pxe::DType dtype) {
  return dtype == pxe::BF16 ? Elem::BF16 : (dtype == pxe::I32 || dtype == pxe::I64) ? Elem::I32 : Elem::F32;
}

// Calls f with a value of the floating-point storage type of `b` (float or
// __nv_bfloat16), so that one launch site instantiates the kernel for both.
template <typename F> Status withFloat(const DeviceBuffer &b, F &&f) {
  if (b.elem == Elem::BF16) return f(__nv_bfloat16{});
  return f(float{});
}
// The same with the bit-width type (uint16_t or uint32_t) for data movement,
// which works for integers too.
template <typename F> Status withBits(const DeviceBuffer &b, F &&f) {
  if (elemBytes(b.elem) == 2) return f(uint16_t{});
  return f(uint32_t{});
}

struct CudaExecutor::State {
  Executor host; // loads weights and inputs, holds the program
  const pxe::Executable *exe = nullptr;
  NcclCommunicator *comm = nullptr;
  std::vector<DeviceBuffer> buffers;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  void *ltWorkspace = nullptr; // kLtWorkspace bytes for cuBLASLt's algorithms
  float *scratch = nullptr;
  size_t scratchSize = 0;
  int sharedOptIn = 48 * 1024; // bytes of shared memory a block may opt into

  ~State() {
    for (DeviceBuffer &b : buffers)
      if (b.data) cudaFree(b.data);
    if (scratch) cudaFree(scratch);
    for (auto &[inst, frequencies] : ropeFrequencies) cudaFree(frequencies);
    if (blas) cublasDestroy(blas);
    if (lt) cublasLtDestroy(lt);
    if (ltWorkspace) cudaFree(ltWorkspace);
    if (stream) cudaStreamDestroy(stream);
  }

  // RoPE's inverse frequencies per instruction, computed (in double) and
  // uploaded once by prepare.
  std::map<const pxe::Instruction *, double *> ropeFrequencies;

  /// Waits for the GPU: for the collectives in flight first (the watchdog),
  /// then for the compute stream. Every host synchronisation goes here.
  Status sync() {
    if (comm) {
      Status st = comm->drain();
      if (!st.isOk()) return st;
    }
    PARAX_CUDA(cudaStreamSynchronize(stream));
    return Status::ok();
  }

  Status ensureScratch(size_t floats) {
    if (floats <= scratchSize) return Status::ok();
    if (scratch) {
      Status st = sync(); // cudaFree waits for the device anyway
      if (!st.isOk()) return st;
      PARAX_CUDA(cudaFree(scratch));
    }
    PARAX_CUDA(cudaMalloc(&scratch, floats * sizeof(float)));
    scratchSize = floats;
    return Status::ok();
  }

  Status upload(int id) {
    const Tensor &t = host.hostBuffers()[id];
    DeviceBuffer &d = buffers[id];
    size_t bytes = t.numel() * 4;
    if (bytes == 0) return Status::ok();
    if (d.elem == Elem::BF16) {
      std::vector<__nv_bfloat16> half(t.numel());
      for (size_t i = 0; i < half.size(); ++i) half[i] = __float2bfloat16(t.f[i]); // to nearest even
      PARAX_CUDA(cudaMemcpy(d.data, half.data(), half.size() * 2, cudaMemcpyHostToDevice));
      return Status::ok();
    }
    PARAX_CUDA(cudaMemcpyAsync(d.data, t.isInt ? (const void *)t.i.data() : (const void *)t.f.data(),
                               bytes, cudaMemcpyHostToDevice, stream));
    return Status::ok();
  }

  int64_t groupIndex(const std::vector<std::string> &axes) {
    int64_t index = 0;
    for (const std::string &axis : axes)
      for (int i = 0; i < exe->grid().axis_names_size(); ++i)
        if (exe->grid().axis_names(i) == axis)
          index = index * exe->grid().shape(i) + host.coordinates()[i];
    return index;
  }
  unsigned maskOf(const std::vector<std::string> &axes) {
    unsigned mask = 0;
    for (const std::string &axis : axes)
      for (int i = 0; i < exe->grid().axis_names_size(); ++i)
        if (exe->grid().axis_names(i) == axis) mask |= 1u << i;
    return mask;
  }
  int64_t groupSize(const std::vector<std::string> &axes) {
    int64_t n = 1;
    for (const std::string &axis : axes) n *= axisSize(*exe, axis);
    return n;
  }
  int peerRank(const std::string &axis, int64_t peer) {
    int64_t rank = 0;
    for (int i = 0; i < exe->grid().axis_names_size(); ++i) {
      int64_t c = exe->grid().axis_names(i) == axis ? peer : host.coordinates()[i];
      rank = rank * exe->grid().shape(i) + c;
    }
    return static_cast<int>(rank);
  }

  Status run(const pxe::Instruction &inst);

  /// Row-major y[m, n] = x[m, k] . W (+ bias[n]), W stored [k, n] or,
  /// `transposeW`, [n, k]. Each of x, W, y is fp32 or bf16 (their `Elem`);
  /// a bf16 W runs on bf16 tensor cores with fp32 accumulation, an fp32 x
  /// then rounded to bf16 into `xb` (m * k elements) first. An fp32 W needs
  /// an fp32 x. With a bias (y's type), cuBLASLt adds it in its epilogue.
  Status gemm(const void *x, Elem xe, int64_t m, int64_t k, const void *w, Elem we, bool transposeW, int64_t n,
              void *y, Elem ye, __nv_bfloat16 *xb, const void *bias = nullptr) {
    const float one = 1.0f, zero = 0.0f;
    // Column-major: y^T[n, m] = op(W^T) x^T.
    cublasOperation_t op = transposeW ? CUBLAS_OP_T : CUBLAS_OP_N;
    int ldw = static_cast<int>(transposeW ? k : n);
    if (we == Elem::F32 && (xe != Elem::F32 || ye != Elem::F32))
      return Status::error("a GEMM with fp32 weights needs fp32 activations");
    if (we == Elem::BF16 && xe == Elem::F32) {
      PARAX_LAUNCH(toBf16Kernel, blocksFor(m * k), kThreads, 0, stream)(static_cast<const float *>(x), xb, m * k);
      x = xb;
    }
    cudaDataType_t wType = we == Elem::BF16 ? CUDA_R_16BF : CUDA_R_32F;
    cudaDataType_t yType = ye == Elem::BF16 ? CUDA_R_16BF : CUDA_R_32F;
    if (bias)
      return gemmWithBias(x, m, k, w, wType, op, ldw, n, y, yType, bias);
    if (we == Elem::BF16) {
      PARAX_CUBLAS(cublasGemmEx(blas, op, CUBLAS_OP_N, n, m, k, &one, w, CUDA_R_16BF, ldw, x, CUDA_R_16BF, k,
                                &zero, y, yType, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      return Status::ok();
    }
    PARAX_CUBLAS(cublasSgemm(blas, op, CUBLAS_OP_N, n, m, k, &one, static_cast<const float *>(w), ldw,
                             static_cast<const float *>(x), k, &zero, static_cast<float *>(y), n));
    return Status::ok();
  }

  /// gemm's column-major product through cuBLASLt with the bias epilogue
  /// (x has W's type here; the bias has y's).
  Status gemmWithBias(const void *x, int64_t m, int64_t k, const void *w, cudaDataType_t wType,
                      cublasOperation_t op, int ldw, int64_t n, void *y, cudaDataType_t yType, const void *bias) {
    struct Descriptors {
      cublasLtMatmulDesc_t op = nullptr;
      cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
      cublasLtMatmulPreference_t preference = nullptr;
      ~Descriptors() {
        if (preference) cublasLtMatmulPreferenceDestroy(preference);
        if (d) cublasLtMatrixLayoutDestroy(d);
        if (b) cublasLtMatrixLayoutDestroy(b);
        if (a) cublasLtMatrixLayoutDestroy(a);
        if (this->op) cublasLtMatmulDescDestroy(this->op);
      }
    } desc;
    PARAX_CUBLAS(cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    int32_t transa = op, transb = CUBLAS_OP_N;
    uint32_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    PARAX_CUBLAS(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)));
    PARAX_CUBLAS(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)));
    PARAX_CUBLAS(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    PARAX_CUBLAS(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    bool t = op != CUBLAS_OP_N;
    PARAX_CUBLAS(cublasLtMatrixLayoutCreate(&desc.a, wType, t ? k : n, t ? n : k, ldw));
    PARAX_CUBLAS(cublasLtMatrixLayoutCreate(&desc.b, wType, k, m, k));
    PARAX_CUBLAS(cublasLtMatrixLayoutCreate(&desc.d, yType, n, m, n));
    PARAX_CUBLAS(cublasLtMatmulPreferenceCreate(&desc.preference));
    uint64_t workspace = kLtWorkspace;
    PARAX_CUBLAS(cublasLtMatmulPreferenceSetAttribute(desc.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &workspace, sizeof(workspace)));
    cublasLtMatmulHeuristicResult_t best;
    int found = 0;
    PARAX_CUBLAS(cublasLtMatmulAlgoGetHeuristic(lt, desc.op, desc.a, desc.b, desc.d, desc.d, desc.preference, 1,
                                                &best, &found));
    if (found == 0)
      return Status::error("cuBLASLt has no algorithm for a " + std::to_string(m) + "x" + std::to_string(k) + "x" +
                           std::to_string(n) + " GEMM with a bias");
    const float one = 1.0f, zero = 0.0f;
    PARAX_CUBLAS(cublasLtMatmul(lt, desc.op, &one, w, desc.a, x, desc.b, &zero, y, desc.d, y, desc.d, &best.algo,
                                ltWorkspace, kLtWorkspace, stream));
    return Status::ok();
  }
};

CudaExecutor::CudaExecutor() : s_(std::make_unique<State>()) {}
CudaExecutor::~CudaExecutor() = default;
int CudaExecutor::stage() const { return s_->host.stage(); }
size_t CudaExecutor::instructionCount() const { return s_->host.instructionCount(); }

Status CudaExecutor::prepare(const pxe::Executable &exe, int rank, NcclCommunicator *comm,
                             const Checkpoint &weights, const std::vector<Tensor> &inputs,
                             int device) {
  if (cudaDeviceCount() == 0)
    return Status::error("no CUDA device");
  PARAX_CUDA(cudaSetDevice(device));
  State &s = *s_;
  PARAX_CUDA(cudaDeviceGetAttribute(&s.sharedOptIn, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  s.exe = &exe;
  s.comm = comm;
  Status st = s.host.prepare(exe, rank, nullptr, weights, inputs);
  if (!st.isOk()) return st;
  PARAX_CUDA(cudaStreamCreate(&s.stream));
  PARAX_CUBLAS(cublasCreate(&s.blas));
  PARAX_CUBLAS(cublasSetStream(s.blas, s.stream));
  PARAX_CUBLAS(cublasLtCreate(&s.lt));
  PARAX_CUDA(cudaMalloc(&s.ltWorkspace, kLtWorkspace));
  const std::vector<Tensor> &hostBuffers = s.host.hostBuffers();
  s.buffers.resize(hostBuffers.size());
  for (size_t id = 0; id < hostBuffers.size(); ++id) {
    DeviceBuffer &d = s.buffers[id];
    const pxe::Buffer &proto = s.host.stageProgram().buffers(id);
    d.shape = hostBuffers[id].shape;
    d.elem = hostBuffers[id].isInt ? Elem::I32 : elemOf(proto.dtype());
    PARAX_CUDA(cudaMalloc(&d.data, d.bytes()));
    if (proto.role() != pxe::TEMPORARY) {
      st = s.upload(id);
      if (!st.isOk()) return st;
    }
  }
  for (const pxe::Instruction &inst : s.host.stageProgram().instructions()) {
    if (inst.op() != "rope") continue;
    StatusOr<std::vector<double>> frequencies = ropeInverseFrequencies(inst.attrs());
    if (!frequencies.isOk()) return frequencies.status();
    double *device = nullptr;
    PARAX_CUDA(cudaMalloc(&device, frequencies.value().size() * sizeof(double)));
    s.ropeFrequencies[&inst] = device;
    PARAX_CUDA(cudaMemcpy(device, frequencies.value().data(), frequencies.value().size() * sizeof(double),
                          cudaMemcpyHostToDevice));
  }
  PARAX_CUDA(cudaStreamSynchronize(s.stream));
  return Status::ok();
}

Status CudaExecutor::setInputs(const std::vector<Tensor> &inputs) {
  State &s = *s_;
  Status st = s.host.setInputs(inputs);
  if (!st.isOk()) return st;
  for (const pxe::Buffer &b : s.host.stageProgram().buffers())
    if (b.role() == pxe::INPUT) {
      st = s.upload(b.id());
      if (!st.isOk()) return st;
    }
  return Status::ok();
}

std::vector<Tensor> CudaExecutor::outputs() const {
  std::vector<Tensor> out;
  for (int32_t id : s_->host.stageProgram().outputs()) {
    const DeviceBuffer &d = s_->buffers[id];
    Tensor t = d.elem == Elem::I32 ? Tensor::ints(d.shape) : Tensor::floats(d.shape);
    if (d.elem == Elem::BF16) {
      std::vector<__nv_bfloat16> half(d.numel());
      cudaMemcpy(half.data(), d.data, half.size() * 2, cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < half.size(); ++i) t.f[i] = __bfloat162float(half[i]);
    } else {
      cudaMemcpy(d.elem == Elem::I32 ? (void *)t.i.data() : (void *)t.f.data(), d.data, d.numel() * 4,
                 cudaMemcpyDeviceToHost);
    }
    out.push_back(std::move(t));
  }
  return out;
}

Status CudaExecutor::run() {
  State &s = *s_;
  const pxe::Stage &stage = s.host.stageProgram();
  for (int k = 0; k < stage.instructions_size(); ++k) {
    if (s.comm)
      s.comm->issuer = "stage " + std::to_string(s.host.stage()) + " instruction " + std::to_string(k);
    Status st = s.run(stage.instructions(k));
    if (st.isOk()) {
      cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) st = Status::error(cudaGetErrorString(e));
    }
    if (!st.isOk())
      return Status::error("stage " + std::to_string(s.host.stage()) + " instruction " +
                           std::to_string(k) + " (" + stage.instructions(k).op() + ") on the GPU: " +
                           st.message());
  }
  return s.sync();
}

namespace {
// Outer (before dim), inner (after dim) extents.
std::pair<int64_t, int64_t> around(const std::vector<int64_t> &shape, int dim) {
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d) outer *= shape[d];
  for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  return {outer, inner};
}
} // namespace


Status CudaExecutor::State::run(const pxe::Instruction &inst) {
  const Attrs &a = inst.attrs();
  const std::string &op = inst.op();
  auto in = [&](int k) -> DeviceBuffer & { return buffers[inst.operands(k)]; };
  auto out = [&](int k = 0) -> DeviceBuffer & { return buffers[inst.results(k)]; };
  // Copies n elements of `like`'s storage.
  auto copy = [&](void *dst, const void *src, int64_t n, const DeviceBuffer &like) -> Status {
    PARAX_CUDA(cudaMemcpyAsync(dst, src, n * elemBytes(like.elem), cudaMemcpyDeviceToDevice, stream));
    return Status::ok();
  };
  auto offsetOf = [](const DeviceBuffer &b, int64_t elements) {
    return static_cast<char *>(b.data) + elements * elemBytes(b.elem);
  };

  if (op == "embedding") {
    DeviceBuffer &ids = in(0), &table = in(1), &y = out();
    std::vector<std::string> axes = attrStrings(a, "vocab_axes");
    int64_t rows = table.shape[0], h = table.shape[1];
    int64_t offset = axes.empty() ? 0 : groupIndex(axes) * rows;
    return withBits(y, [&](auto w) {
      using W = decltype(w);
      PARAX_LAUNCH(embeddingKernel<W>, blocksFor(y.numel()), kThreads, 0, stream)(
          ids.i(), table.as<W>(), y.as<W>(), ids.numel(), h, rows, offset);
      return Status::ok();
    });
  }
  if (op == "position_embedding") {
    DeviceBuffer &table = in(0), &y = out();
    int64_t h = y.shape[2];
    return copy(y.data, offsetOf(table, attrInt(a, "offset") * h), y.numel(), y);
  }
  if (op == "linear") {
    DeviceBuffer &x = in(0), &w = in(1), &y = out();
    int64_t k = x.shape.back(), n = y.shape.back(), m = x.numel() / k;
    if (w.elem == Elem::BF16 && x.elem == Elem::F32) {
      Status st = ensureScratch((m * k + 1) / 2);
      if (!st.isOk()) return st;
    }
    if (inst.operands_size() == 3 && in(2).elem != y.elem)
      return Status::error("linear: the bias must have the result's element type");
    return gemm(x.data, x.elem, m, k, w.data, w.elem, attrInt(a, "transpose_w") != 0, n, y.data, y.elem,
                reinterpret_cast<__nv_bfloat16 *>(scratch), inst.operands_size() == 3 ? in(2).data : nullptr);
  }
  if (op == "rms_norm" || op == "layer_norm") {
    DeviceBuffer &x = in(0), &y = out();
    int64_t h = x.shape.back(), rows = x.numel() / h;
    bool layer = op == "layer_norm";
    return withFloat(y, [&](auto t) {
      using T = decltype(t);
      PARAX_LAUNCH(normKernel<T>, rows, kThreads, 0, stream)(
          x.as<T>(), in(1).as<T>(), layer ? in(2).as<T>() : nullptr, y.as<T>(), h,
          static_cast<float>(attrFloat(a, "eps")), layer);
      return Status::ok();
    });
  }
  if (op == "rope") {
    DeviceBuffer &x = in(0), &y = out();
    int64_t rot = attrInt(a, "rotary_dim");
    Status st = copy(y.data, x.data, x.numel(), x);
    if (!st.isOk()) return st;
    int64_t B = x.shape[0], S = x.shape[1], H = x.shape[2], D = x.shape[3];
    return withFloat(y, [&](auto t) {
      using T = decltype(t);
      PARAX_LAUNCH(ropeKernel<T>, blocksFor(B * S * H * rot / 2), kThreads, 0, stream)(
          y.as<T>(), ropeFrequencies.at(&inst), B, S, H, D, rot, attrInt(a, "position_offset"),
          attrInt(a, "interleaved") != 0);
      return Status::ok();
    });
  }
  if (op == "attention") {
    DeviceBuffer &q = in(0), &k = in(1), &v = in(2), &y = out();
    int64_t B = q.shape[0], S = q.shape[1], H = q.shape[2], D = q.shape[3];
    int64_t T = k.shape[1], KH = k.shape[2], DV = v.shape[3];
    std::vector<std::string> headAxes = attrStrings(a, "head_axes");
    int64_t headOffset = 0, totalHeads = H;
    if (!headAxes.empty()) {
      headOffset = groupIndex(headAxes) * H;
      totalHeads = H * groupSize(headAxes);
    }
    int64_t limit = sharedOptIn;
    bool causal = attrInt(a, "causal") != 0;
    float scale = static_cast<float>(attrFloat(a, "scale"));
    // bf16 with head widths in 16s: tensor cores (unless PARAX_ATTENTION=cuda-cores).
    const char *choice = std::getenv("PARAX_ATTENTION");
    int64_t tcBytes = TensorCoreTiles::bytes(D, DV);
    if (y.elem == Elem::BF16 && D % 16 == 0 && DV % 16 == 0 && tcBytes <= limit &&
        !(choice && std::string(choice) == "cuda-cores")) {
      if (tcBytes > 48 * 1024)
        PARAX_CUDA(cudaFuncSetAttribute(attentionTensorCoreKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(tcBytes)));
      int64_t blocks = B * H * ((S + TensorCoreTiles::kQueries - 1) / TensorCoreTiles::kQueries);
      PARAX_LAUNCH(attentionTensorCoreKernel, blocks, 32 * TensorCoreTiles::kWarps, tcBytes, stream)(
          q.as<__nv_bfloat16>(), k.as<__nv_bfloat16>(), v.as<__nv_bfloat16>(), y.as<__nv_bfloat16>(), B, S, H, D,
          T, KH, DV, causal, scale, headOffset, totalHeads / KH);
      return Status::ok();
    }
    // Otherwise CUDA cores, with tiles that fit the device's shared memory
    // (opt-in beyond 48 KiB).
    AttentionTiles tiles;
    while (AttentionTiles::floats(tiles.queries, tiles.keys, D, DV) * 4 > limit && tiles.keys > 16)
      tiles.keys /= 2;
    while (AttentionTiles::floats(tiles.queries, tiles.keys, D, DV) * 4 > limit && tiles.queries > 8)
      tiles.queries /= 2;
    int64_t sharedBytes = AttentionTiles::floats(tiles.queries, tiles.keys, D, DV) * 4;
    if (sharedBytes > limit)
      return Status::error("attention: head widths " + std::to_string(D) + "/" + std::to_string(DV) +
                           " need " + std::to_string(sharedBytes) + " bytes of shared memory; the device has " +
                           std::to_string(limit));
    int64_t blocks = B * H * ((S + tiles.queries - 1) / tiles.queries);
    return withFloat(y, [&](auto t) {
      using E = decltype(t);
      if (sharedBytes > 48 * 1024)
        PARAX_CUDA(cudaFuncSetAttribute(attentionKernel<E>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(sharedBytes)));
      PARAX_LAUNCH(attentionKernel<E>, blocks, 256, sharedBytes, stream)(
          q.as<E>(), k.as<E>(), v.as<E>(), y.as<E>(), B, S, H, D, T, KH, DV, causal, scale, headOffset,
          totalHeads / KH, tiles.queries, tiles.keys);
      return Status::ok();
    });
  }
  if (op == "add" || op == "mul") {
    DeviceBuffer &l = in(0), &r = in(1), &y = out();
    return withFloat(y, [&](auto t) {
      using T = decltype(t);
      PARAX_LAUNCH(binaryKernel<T>, blocksFor(y.numel()), kThreads, 0, stream)(
          l.as<T>(), r.as<T>(), y.as<T>(), dimsOf(l.shape), dimsOf(r.shape), dimsOf(y.shape), y.numel(),
          op == "add");
      return Status::ok();
    });
  }
  if (op == "silu" || op == "sigmoid" || op == "gelu") {
    int kind = op == "silu" ? 0 : op == "sigmoid" ? 1 : attrString(a, "approximate") == "tanh" ? 2 : 3;
    return withFloat(out(), [&](auto t) {
      using T = decltype(t);
      PARAX_LAUNCH(unaryKernel<T>, blocksFor(out().numel()), kThreads, 0, stream)(in(0).as<T>(), out().as<T>(),
                                                                                 out().numel(), kind);
      return Status::ok();
    });
  }
  if (op == "swiglu") {
    return withFloat(out(), [&](auto t) {
      using T = decltype(t);
      PARAX_LAUNCH(swigluKernel<T>, blocksFor(out().numel()), kThreads, 0, stream)(
          in(0).as<T>(), in(1).as<T>(), out().as<T>(), out().numel());
      return Status::ok();
    });
  }
  if (op == "reshape")
    return copy(out().data, in(0).data, out().numel(), out());
  if (op == "transpose") {
    auto it = a.find("permutation");
    if (it == a.end()) return Status::error("transpose without permutation");
    std::vector<int64_t> perm(it->second.ints().values().begin(), it->second.ints().values().end());
    return withBits(out(), [&](auto w) {
      using W = decltype(w);
      PARAX_LAUNCH(transposeKernel<W>, blocksFor(out().numel()), kThreads, 0, stream)(
          in(0).as<W>(), out().as<W>(), dimsOf(in(0).shape), dimsOf(out().shape), dimsOf(perm), out().numel());
      return Status::ok();
    });
  }
  if (op == "broadcast") {
    return withBits(out(), [&](auto w) {
      using W = decltype(w);
      PARAX_LAUNCH(broadcastKernel<W>, blocksFor(out().numel()), kThreads, 0, stream)(
          in(0).as<W>(), out().as<W>(), dimsOf(in(0).shape), dimsOf(out().shape), out().numel());
      return Status::ok();
    });
  }
  if (op == "slice") {
    int dim = static_cast<int>(attrInt(a, "dim"));
    auto [outer, inner] = around(out().shape, dim);
    return withBits(out(), [&, outer = outer, inner = inner](auto w) {
      using W = decltype(w);
      PARAX_LAUNCH(sliceKernel<W>, blocksFor(out().numel()), kThreads, 0, stream)(
          in(0).as<W>(), out().as<W>(), outer, in(0).shape[dim], out().shape[dim], attrInt(a, "start"), inner);
      return Status::ok();
    });
  }
  if (op == "concat") {
    int dim = static_cast<int>(attrInt(a, "dim"));
    auto [outer, inner] = around(out().shape, dim);
    return withBits(out(), [&, outer = outer, inner = inner](auto w) {
      using W = decltype(w);
      int64_t at = 0;
      for (int k = 0; k < inst.operands_size(); ++k) {
        PARAX_LAUNCH(placeKernel<W>, blocksFor(in(k).numel()), kThreads, 0, stream)(
            in(k).as<W>(), out().as<W>(), outer, out().shape[dim], in(k).shape[dim], at, inner);
        at += in(k).shape[dim];
      }
      return Status::ok();
    });
  }
  if (op == "router") {
    DeviceBuffer &x = in(0), &gate = in(1), &w = out(0), &idx = out(1);
    int64_t h = x.shape.back(), tokens = x.numel() / h, E = gate.shape[0], K = attrInt(a, "top_k");
    if (K > 64) return Status::error("router: top_k above 64");
    // Logits [tokens, E] in fp32 = x . gate^T, then scores and choice (2E per token).
    Status st = ensureScratch(tokens * E * 3 + (tokens * h + 1) / 2);
    if (!st.isOk()) return st;
    float *logits = scratch, *choice = scratch + tokens * E;
    auto *xb = reinterpret_cast<__nv_bfloat16 *>(scratch + tokens * E * 3);
    st = gemm(x.data, x.elem, tokens, h, gate.data, gate.elem, true, E, logits, Elem::F32, xb);
    if (!st.isOk()) return st;
    return withFloat(w, [&](auto t) {
      using T = decltype(t);
      PARAX_LAUNCH(routerKernel<T>, blocksFor(tokens), kThreads, 0, stream)(
          logits, inst.operands_size() == 3 ? in(2).as<T>() : nullptr, choice, w.as<T>(), idx.i(), tokens, E, K,
          attrString(a, "score_func") == "sigmoid", attrInt(a, "normalize") != 0,
          static_cast<float>(attrFloat(a, "scaling_factor", 1.0)), attrInt(a, "num_groups", 1),
          attrInt(a, "topk_groups", 1));
      return Status::ok();
    });
  }
  if (op == "experts") {
    DeviceBuffer &x = in(0), &w = in(1), &idx = in(2), &wg = in(3), &wu = in(4), &wd = in(5), &y = out();
    int64_t H = x.shape.back(), K = idx.shape.back(), pairs = idx.numel(), E = wg.shape[0], F = wg.shape[1];
    // Scratch: count, offset [E]; perm, pos [pairs] (ints); rows [pairs, H]
    // (x's storage); gate, up [pairs, F]; down [pairs, H] (fp32); bf16
    // activations for the GEMMs.
    int64_t ints = 2 * E + 2 * pairs, widest = std::max(H, F);
    Status st = ensureScratch(ints + pairs * (2 * H + 2 * F) + (pairs * widest + 1) / 2);
    if (!st.isOk()) return st;
    auto *count = reinterpret_cast<int32_t *>(scratch);
    int32_t *offset = count + E, *perm = offset + E, *pos = perm + pairs;
    float *rowsAt = scratch + ints, *gate = rowsAt + pairs * H, *up = gate + pairs * F, *down = up + pairs * F;
    auto *xb = reinterpret_cast<__nv_bfloat16 *>(down + pairs * H);
    auto rows = [&](int64_t r) { return reinterpret_cast<char *>(rowsAt) + r * H * elemBytes(x.elem); };
    PARAX_LAUNCH(expertCountKernel, blocksFor(E), kThreads, 0, stream)(idx.i(), count, pairs, E);
    // The host needs each expert's row count to size its GEMMs.
    std::vector<int32_t> counts(E), offsets(E);
    PARAX_CUDA(cudaMemcpyAsync(counts.data(), count, E * 4, cudaMemcpyDeviceToHost, stream));
    st = sync();
    if (!st.isOk()) return st;
    int32_t total = 0;
    for (int64_t e = 0; e < E; ++e) {
      offsets[e] = total;
      total += counts[e];
    }
    PARAX_CUDA(cudaMemcpyAsync(offset, offsets.data(), E * 4, cudaMemcpyHostToDevice, stream));
    PARAX_CUDA(cudaMemsetAsync(pos, 0xff, pairs * 4, stream)); // -1: an unused dispatch row
    PARAX_LAUNCH(expertOrderKernel, blocksFor(E), kThreads, 0, stream)(idx.i(), offset, perm, pos, pairs, E);
    st = withBits(x, [&](auto b) {
      using W = decltype(b);
      PARAX_LAUNCH(gatherRowsKernel<W>, blocksFor(int64_t(total) * H), kThreads, 0, stream)(
          x.as<W>(), perm, reinterpret_cast<W *>(rowsAt), total, K, H);
      return Status::ok();
    });
    if (!st.isOk()) return st;
    for (int64_t e = 0; e < E && st.isOk(); ++e) {
      if (counts[e] == 0) continue;
      int64_t r = offsets[e], m = counts[e];
      // gate/up stacks are [E, F, H] and down [E, H, F]: x . W^T each.
      st = gemm(rows(r), x.elem, m, H, offsetOf(wg, e * F * H), wg.elem, true, F, gate + r * F, Elem::F32, xb);
      if (st.isOk())
        st = gemm(rows(r), x.elem, m, H, offsetOf(wu, e * F * H), wu.elem, true, F, up + r * F, Elem::F32, xb);
    }
    if (!st.isOk()) return st;
    PARAX_LAUNCH(swigluKernel<float>, blocksFor(int64_t(total) * F), kThreads, 0, stream)(gate, up, gate,
                                                                                        int64_t(total) * F);
    for (int64_t e = 0; e < E && st.isOk(); ++e) {
      if (counts[e] == 0) continue;
      int64_t r = offsets[e], m = counts[e];
      st = gemm(gate + r * F, Elem::F32, m, F, offsetOf(wd, e * H * F), wd.elem, true, H, down + r * H, Elem::F32,
                xb);
    }
    if (!st.isOk()) return st;
    return withFloat(y, [&](auto t) {
      using T = decltype(t);
      PARAX_LAUNCH(expertsCombineKernel<T>, blocksFor(y.numel()), kThreads, 0, stream)(
          down, w.as<T>(), pos, y.as<T>(), y.numel() / H, K, H);
      return Status::ok();
    });
  }
  if (op == "cross_entropy") {
    DeviceBuffer &logits = in(0), &labels = in(1), &y = out();
    int64_t V = logits.shape.back(), tokens = logits.numel() / V;
    Status st = ensureScratch(1);
    if (!st.isOk()) return st;
    auto *badToken = reinterpret_cast<int32_t *>(scratch);
    PARAX_CUDA(cudaMemsetAsync(y.data, 0, 4, stream));
    PARAX_CUDA(cudaMemsetAsync(badToken, 0xff, 4, stream)); // -1: every label is valid
    st = withFloat(logits, [&](auto t) {
      using T = decltype(t);
      PARAX_LAUNCH(crossEntropyKernel<T>, tokens, kThreads, 0, stream)(logits.as<T>(), labels.i(), y.f(), V,
                                                                       badToken);
      return Status::ok();
    });
    if (!st.isOk()) return st;
    PARAX_LAUNCH(scaleKernel, 1, 1, 0, stream)(y.f(), 1, 1.0f / tokens);
    int32_t bad = -1;
    PARAX_CUDA(cudaMemcpyAsync(&bad, badToken, 4, cudaMemcpyDeviceToHost, stream));
    st = sync();
    if (!st.isOk()) return st;
    if (bad >= 0)
      return Status::error("label out of range at token " + std::to_string(bad) + " (vocabulary " +
                           std::to_string(V) + ")");
    return Status::ok();
  }

  // Communication.
  std::vector<std::string> axes = attrStrings(a, "axes");
  int64_t P = groupSize(axes);
  unsigned mask = maskOf(axes);
  if (P > 1 && !comm)
    return Status::error("a collective over several ranks needs a communicator");
  // Pieces along `dim` (piece-major) <-> the tensor: slice/place kernels on
  // the tensor's bits; `pieces` is scratch laid out as the tensor's storage.
  auto toPieces = [&](const DeviceBuffer &t, int dim, void *pieces) {
    return withBits(t, [&](auto w) {
      using W = decltype(w);
      auto [outer, inner] = around(t.shape, dim);
      int64_t chunk = t.shape[dim] / P, n = t.numel() / P;
      for (int64_t p = 0; p < P; ++p)
        PARAX_LAUNCH(sliceKernel<W>, blocksFor(n), kThreads, 0, stream)(
            t.as<W>(), static_cast<W *>(pieces) + p * n, outer, t.shape[dim], chunk, p * chunk, inner);
      return Status::ok();
    });
  };
  auto fromPieces = [&](const void *pieces, int dim, DeviceBuffer &t) {
    return withBits(t, [&](auto w) {
      using W = decltype(w);
      auto [outer, inner] = around(t.shape, dim);
      int64_t chunk = t.shape[dim] / P, n = t.numel() / P;
      for (int64_t p = 0; p < P; ++p)
        PARAX_LAUNCH(placeKernel<W>, blocksFor(n), kThreads, 0, stream)(
            static_cast<const W *>(pieces) + p * n, t.as<W>(), outer, t.shape[dim], chunk, p * chunk, inner);
      return Status::ok();
    });
  };
  if (op == "all_reduce") {
    Status st = copy(out().data, in(0).data, out().numel(), out());
    if (!st.isOk() || P == 1) return st;
    return comm->allReduce(out().data, out().numel(), out().elem, mask, stream);
  }
  if (op == "shard_slice") {
    int dim = static_cast<int>(attrInt(a, "dim"));
    auto [outer, inner] = around(in(0).shape, dim);
    int64_t chunk = out().shape[dim];
    return withBits(out(), [&, outer = outer, inner = inner](auto w) {
      using W = decltype(w);
      PARAX_LAUNCH(sliceKernel<W>, blocksFor(out().numel()), kThreads, 0, stream)(
          in(0).as<W>(), out().as<W>(), outer, in(0).shape[dim], chunk, groupIndex(axes) * chunk, inner);
      return Status::ok();
    });
  }
  if (op == "to_partial") {
    if (groupIndex(axes) == 0) return copy(out().data, in(0).data, out().numel(), out());
    PARAX_CUDA(cudaMemsetAsync(out().data, 0, out().bytes(), stream));
    return Status::ok();
  }
  if (op == "all_gather" || op == "reduce_scatter" || op == "all_to_all") {
    DeviceBuffer &x = in(0), &y = out();
    int64_t largest = std::max(x.numel(), y.numel());
    Status st = ensureScratch(largest * 2);
    if (!st.isOk()) return st;
    void *a0 = scratch, *a1 = scratch + largest;
    if (op == "all_gather") {
      int dim = static_cast<int>(attrInt(a, "dim"));
      if (P == 1) return copy(y.data, x.data, y.numel(), y);
      st = comm->allGather(x.data, a0, x.numel(), x.elem, mask, stream);
      if (!st.isOk()) return st;
      return fromPieces(a0, dim, y);
    }
    if (op == "reduce_scatter") {
      int dim = static_cast<int>(attrInt(a, "dim"));
      st = toPieces(x, dim, a0);
      if (!st.isOk()) return st;
      if (P == 1) return copy(y.data, a0, y.numel(), y);
      return comm->reduceScatter(a0, y.data, y.numel(), y.elem, mask, stream);
    }
    int split = static_cast<int>(attrInt(a, "split_dim")), concat = static_cast<int>(attrInt(a, "concat_dim"));
    st = toPieces(x, split, a0);
    if (!st.isOk()) return st;
    if (P == 1) return fromPieces(a0, concat, y);
    st = comm->allToAll(a0, a1, x.numel() / P, x.elem, mask, stream);
    if (!st.isOk()) return st;
    return fromPieces(a1, concat, y);
  }
  if (op == "send" || op == "recv") {
    int peer = peerRank(axes.at(0), attrInt(a, "peer"));
    if (!comm)
      return Status::error("send/recv needs a communicator");
    if (op == "send")
      return comm->send(in(0).data, in(0).numel(), in(0).elem, peer, stream);
    return comm->recv(out().data, out().numel(), out().elem, peer, stream);
  }
  if (op == "moe_dispatch" || op == "moe_combine") {
    // Slots as the CPU backend fills them (moeSlotsKernel), an all-to-all of
    // fixed blocks of `pairs` slots per rank, everything on the device. The
    // dispatch exchanges fp32 rows [x | weight | expert]; the combine the
    // rows' own storage.
    int64_t E = attrInt(a, "num_experts"), local = E / P;
    DeviceBuffer &idx = in(op == "moe_dispatch" ? 2 : 1);
    int64_t pairs = idx.numel(), K = idx.shape.back(), slots = P * pairs;
    int64_t h = in(0).shape.back();
    int64_t width = op == "moe_dispatch" ? h + 2 : h;
    Status st = ensureScratch(pairs + 2 * slots * width);
    if (!st.isOk()) return st;
    auto *slot = reinterpret_cast<int32_t *>(scratch);
    float *send = scratch + pairs, *recv = send + slots * width;
    PARAX_CUDA(cudaMemsetAsync(slot, 0xff, pairs * 4, stream)); // -1: no slot
    PARAX_LAUNCH(moeSlotsKernel, blocksFor(P), kThreads, 0, stream)(idx.i(), slot, pairs, local, P);
    if (op == "moe_dispatch") {
      DeviceBuffer &x = in(0), &w = in(1);
      PARAX_LAUNCH(moeClearKernel, blocksFor(slots * width), kThreads, 0, stream)(send, slots, h);
      return withFloat(x, [&](auto t) {
        using T = decltype(t);
        PARAX_LAUNCH(moeFillKernel<T>, blocksFor(pairs * width), kThreads, 0, stream)(
            x.as<T>(), w.as<T>(), idx.i(), slot, send, pairs, K, h, local);
        const float *received = send;
        if (P > 1) {
          Status sent = comm->allToAll(send, recv, pairs * width, Elem::F32, mask, stream);
          if (!sent.isOk()) return sent;
          received = recv;
        }
        PARAX_LAUNCH(moeUnpackKernel<T>, blocksFor(slots * width), kThreads, 0, stream)(
            received, out(0).as<T>(), out(1).as<T>(), out(2).i(), slots, h);
        return Status::ok();
      });
    }
    DeviceBuffer &rowsBack = in(0), &y = out();
    const void *back = rowsBack.data;
    if (P > 1) {
      st = comm->allToAll(rowsBack.data, recv, pairs * h, rowsBack.elem, mask, stream);
      if (!st.isOk()) return st;
      back = recv;
    }
    return withFloat(y, [&](auto t) {
      using T = decltype(t);
      PARAX_LAUNCH(moeCombineKernel<T>, blocksFor(y.numel()), kThreads, 0, stream)(
          static_cast<const T *>(back), slot, y.as<T>(), y.numel() / h, K, h);
      return Status::ok();
    });
  }
  return Status::error("no CUDA kernel for '" + op + "'");
}

} // namespace parax::runtime
