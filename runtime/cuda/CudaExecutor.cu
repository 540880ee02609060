// CudaExecutor.cu - the CUDA backend: device buffers stored as the
// executable declares them (fp32 or bf16), cuBLAS / cuBLASLt GEMMs, one
// kernel per op (Kernels.cuh), NCCL collectives with a watchdog
// (NcclCommunicator.cuh), a training run's optimizer on the device
// (OptimizerKernels.cuh). Weights and inputs are loaded by the CPU backend's
// loader and uploaded. The SIMT emulator compiles this file as C++
// (simt/SimtCudaExecutor.cpp).

#define OMPI_SKIP_MPICXX 1
#include "CudaCommon.cuh"
#include "CudnnAttention.h"
#include "GeluEpilogue.cuh"
#include "GradientKernels.cuh"
#include "Kernels.cuh"
#include "NcclCommunicator.cuh"
#include "OptimizerKernels.cuh"
#include "parax/runtime/BufferPlan.h"
#include "parax/runtime/CudaExecutor.h"
#include "parax/runtime/Executable.h"
#include "parax/runtime/Executor.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace parax::runtime {

int cudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

//===----------------------------------------------------------------------===//
// Executor
//===----------------------------------------------------------------------===//

struct DeviceBuffer {
  std::vector<int64_t> shape;
  Elem elem = Elem::F32;
  void *data = nullptr;
  bool inArena = false; // a temporary placed in the step's arena (not its own allocation)
  bool aliased = false; // another buffer's memory: an in-place cache_update's result is its cache; a result in
                        // place is its host's allocation (PARAX_CUDA_SHARE_TEMPORARIES=0)
  // A parameter in another program's memory whose leading slices lie this
  // many elements apart there (a head_linear's weight alone); 0: dense.
  int64_t blockStride = 0;
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

// Lets each kernel's blocks take up to `bytes` of dynamic shared memory.
template <typename... Kernels> Status allowSharedMemory(int bytes, Kernels *...kernels) {
  for (cudaError_t e : {cudaFuncSetAttribute(kernels, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)...})
    if (e != cudaSuccess) return Status::error(std::string("cudaFuncSetAttribute: ") + cudaGetErrorString(e));
  return Status::ok();
}

/// `value` from environment variable `name` when it is set: a positive
/// count (of `what`), or an error naming it.
Status positiveFromEnv(const char *name, const char *what, int64_t &value) {
  const char *text = std::getenv(name);
  if (!text) return Status::ok();
  char *end = nullptr;
  long long n = std::strtoll(text, &end, 10);
  if (!*text || *end || n < 1)
    return Status::error(std::string(name) + "=" + text + ": not a positive count of " + what);
  value = n;
  return Status::ok();
}

// Outer (before dim), inner (after dim) extents.
std::pair<int64_t, int64_t> around(const std::vector<int64_t> &shape, int dim) {
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d) outer *= shape[d];
  for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  return {outer, inner};
}

constexpr size_t kLtWorkspace = 32u << 20;   // cuBLASLt's workspace (32 MiB suits Hopper)
constexpr size_t kBlasWorkspace = 32u << 20; // cuBLAS's, set explicitly for graph capture
// ZeRO-2 reduce-scatters a box's gradient through two fp32 staging boxes
// of at most this many values (64 MiB each; a larger box goes in parts),
// so the staging stays small beside the sums it saves
// (PARAX_CUDA_ZERO_STAGING=N: N values, for tests of the parts).
constexpr int64_t kZeroStagingValues = int64_t(1) << 24;
// Without ZeRO, the gradient sums all-reduced over the data-parallel
// replicas go in buckets of up to this many bytes (PyTorch DDP's default
// bucket_cap_mb; PARAX_CUDA_BUCKET_BYTES=N sets it, 1: one box a bucket):
// one NCCL call per bucket, not per box.
constexpr int64_t kBucketBytes = int64_t(25) << 20;
// ZeRO-3 gathers a box again when its next read is more than this many
// instructions after the last, and issues each all-gather up to this many
// instructions ahead of the first read (within its pipeline range), so
// that it runs beside the compute before it.
constexpr int kGatherGap = 16;
/// The values each rank's chunk of a box goes in a part, and how many a
/// staging box holds, for a box of `members` chunks of `size`.
int64_t zeroPartWidth(int64_t size, int64_t members, int64_t limit) {
  return std::max<int64_t>(1, std::min(size, limit / members));
}

// Ops whose work is all on the compute stream with no host synchronisation
// and no allocation once the scratch buffer has its size: a stage of only
// these (and grouped experts, see State::capturable) can be captured as a
// CUDA graph.
bool among(const std::string &op, std::initializer_list<const char *> ops) {
  return std::any_of(ops.begin(), ops.end(), [&](const char *o) { return op == o; });
}
bool capturableOp(const std::string &op) {
  return among(op, {"embedding", "position_embedding", "linear", "head_linear", "rms_norm", "layer_norm", "rope", "attention",
                    "add", "mul", "silu", "sigmoid", "gelu", "softcap", "swiglu", "reshape", "transpose", "broadcast", "slice",
                    "concat", "cache_update", "ring_cache_update", "router", "shard_slice", "to_partial", "linear_weight_grad",
                    "rms_norm_grad", "rms_norm_weight_grad", "swiglu_grad", "attention_grad", "sum_to",
                    "gelu_grad", "layer_norm_grad", "layer_norm_weight_grad", "position_embedding_grad",
                    "sigmoid_grad", "softcap_grad", "router_grad", "router_load", "router_aux_grad", "balance_loss", "label_count", "shift", "logsumexp"});
}
// Ops that move data between ranks (through the communicator, if any).
bool isCollective(const std::string &op) {
  return among(op, {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send", "recv", "moe_dispatch",
                    "moe_combine"});
}
// True when environment variable `name` is set to `value`.
bool envIs(const char *name, const char *value) {
  const char *set = std::getenv(name);
  return set && std::string(set) == value;
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
  float *scratch = nullptr; // for compute instructions
  int32_t *tokens = nullptr; // greedyTokens' result, tokenRows of them
  int64_t tokenRows = 0;
  size_t scratchSize = 0;
  float *commScratch = nullptr; // for collectives only (see PendingCollective)
  size_t commScratchSize = 0;
  float *fewRowsPartials = nullptr; // the few-row linear's k splits' sums (see FewRows)
  size_t fewRowsSize = 0;
  bool fewRowsKernel = true; // an inference step's linears of at most 8 rows through the few-row kernels
                             // (PARAX_FEW_ROWS=0, or a training step: cuBLAS)
  int sharedOptIn = 48 * 1024; // bytes of shared memory a block may opt into
  bool tensorCoreAttention = true; // bf16 attention on tensor cores (PARAX_ATTENTION)
  bool splitDecodeAttention = true; // a few queries over many keys: split over the keys (PARAX_ATTENTION)
  bool cudnnAttentionOn = true; // cuDNN's SDPA where it takes the shape (PARAX_ATTENTION=kernels: never)
  int multiprocessors = 132;
  // Another program of this rank whose memory this one borrows (prepare's
  // `share`). The two never run at once, so they also share the workspaces
  // and, when it is large enough, the arena of temporaries.
  const State *lender = nullptr;
  bool ownsArena = true, ownsWorkspaces = true;

  // The optimizer on the device (bindOptimizer): per bound gradient, its
  // step's sums and what this rank updates (see CudaExecutor::Gradient).
  struct OptimizerSlot {
    CudaExecutor::Gradient g;
    int64_t n = 0;           // values in the box
    int64_t updated = 0;     // values this rank updates: n, or ZeRO's chunk size
    bool shared = false;     // ZeRO over more than one rank
    bool chunkSums = false;  // ZeRO-2: `sum` is this rank's chunk only
    float *sum = nullptr;    // n (ZeRO-1: size x members, zeros past n; ZeRO-2: size)
    float *share = nullptr;  // ZeRO: this rank's chunk of `sum` (ZeRO-1: reduce-scattered in place); else `sum`
    float *master = nullptr; // `updated` values
    float *m = nullptr, *v = nullptr; // AdamW's moments, as `master`
    cudaEvent_t summed = nullptr;     // ZeRO-2: its last reduce-scatter into `sum` done
    void *chunk = nullptr; // ZeRO-3: the parameter's chunk (storage type, `size` values)
    float *otherParts = nullptr; // a stage's part: the other stages' parts of `share` (updated values each)
  };
  /// Host copies of one of each slot's chunk-sized arrays (the values
  /// this rank updates: master, m or v), nothing gathered.
  StatusOr<std::vector<std::vector<float>>> readChunks(float *OptimizerSlot::*which) {
    std::vector<std::vector<float>> chunks(slots.size());
    for (size_t i = 0; i < slots.size(); ++i) {
      const OptimizerSlot &slot = slots[i];
      chunks[i].resize(slot.g.end - slot.g.begin);
      Status st = copyToHost(chunks[i].data(), slot.*which, chunks[i].size(), Elem::F32, stream);
      if (!st.isOk()) return st;
      readBackBytes += chunks[i].size() * sizeof(float);
    }
    return chunks;
  }
  /// Whether slot i's sums are reduced over other ranks (ZeRO's group, or
  /// dp and the gradient's partial axes).
  bool reducesSum(const OptimizerSlot &slot) const { return slot.shared || sumAxes(slot) != 0; }
  /// Without ZeRO, the axes slot i's sums are all-reduced over: dp, and
  /// those its gradient is a partial sum over.
  unsigned sumAxes(const OptimizerSlot &slot) const {
    return (optimizer.replicas > 1 ? 1u << optimizer.replicaAxis : 0u) | slot.g.partialAxes;
  }
  /// Without ZeRO: consecutive slots (in the order the program writes
  /// their gradients) whose sums lie side by side in one allocation, all-
  /// reduced over the same axes (sumAxes) in one call once the last of
  /// them is summed.
  struct Bucket {
    std::vector<int> slots;
    unsigned axes = 0;
    float *sum = nullptr;
    int64_t n = 0;     // values
    size_t summed = 0; // of its slots, this step
  };
  std::vector<Bucket> buckets;
  std::vector<int> bucketOf; // per slot: its bucket, or -1 (ZeRO's slots, or no replicas)
  int64_t bucketBytes = kBucketBytes;
  bool issuingEarly = false; // reductions issued now have instructions still to run (the last run)
  /// Issues slot i's reduction over the ranks (ZeRO: reduce-scatter over
  /// its group; else all-reduce over dp of its bucket, once its last slot
  /// is summed) on the collectives' stream.
  Status reduceSums(int i) {
    const OptimizerSlot &slot = slots[i];
    if (slot.shared) {
      if (streaming && issuingEarly) ++streamedEarly;
      return comm->reduceScatter(slot.sum, slot.share, slot.g.size, Elem::F32, slot.g.axes, stream);
    }
    Bucket &b = buckets[bucketOf[i]];
    if (++b.summed < b.slots.size()) return Status::ok();
    if (streaming && issuingEarly) ++streamedEarly;
    return comm->allReduce(b.sum, b.n, Elem::F32, b.axes, stream);
  }
  /// Places the bucketed slots' sums (bindOptimizer).
  Status placeBuckets(const std::function<Status(float **, int64_t)> &take);
  /// ZeRO-2: slot i's gradient of this microbatch, in fp32 and padded, in
  /// a staging box; but for the step's first, with this rank's sums added
  /// to its own chunk; reduce-scattered over the group into the sums.
  Status reduceScatterMicrobatch(int i, bool first);
  float *sumStaging[2] = {nullptr, nullptr}; // ZeRO-2 (zeroStagingValues of the largest box, fp32)
  // ZeRO-3: each run of instructions reading a chunked parameter, and
  // where in `gatherBlock` its box is put together for them.
  struct GatherInterval {
    int slot;
    int issue;       // the instruction before which its all-gather is issued
    int first, last; // the instructions reading it (inclusive)
    size_t offset;
    cudaEvent_t gathered = nullptr; // its all-gather done
  };
  std::vector<GatherInterval> gatherIntervals;
  // per instruction: the intervals whose all-gather is issued there, and
  // those whose first read it is (the compute stream waits for them)
  std::vector<std::vector<int>> gathersAt, gatherWaitsAt;
  size_t gathersAhead = 0; // all-gathers issued ahead of the instruction reading them, so far
  void *gatherBlock = nullptr;
  CudaExecutor::ShardedParameters sharded;
  /// ZeRO-3: keeps each eligible slot's parameter as its chunk (the box's
  /// memory freed) and places the intervals of instructions that read it.
  Status shardParameters();
  /// ZeRO-3: before instruction k, the boxes whose intervals begin there
  /// gathered (the compute stream waits for them).
  Status gatherBefore(int k);
  cudaEvent_t stagingFree[2] = {nullptr, nullptr};
  int nextStaging = 0;
  int64_t zeroStagingLimit = kZeroStagingValues;
  /// Room for a slot's box gathered whole in fp32 (its padded size): the
  /// sums (ZeRO-1), or (ZeRO-2) a staging box when the box fits one, else
  /// memory of its own for the call (reading a run's results back).
  StatusOr<float *> gatherRoom(OptimizerSlot &slot, std::unique_ptr<float, decltype(&cudaFree)> &own) {
    if (!slot.chunkSums) return slot.sum;
    int64_t padded = slot.g.size * slot.g.members;
    if (padded <= slot.g.members * zeroPartWidth(slot.g.size, slot.g.members, zeroStagingLimit))
      return sumStaging[0];
    float *p = nullptr;
    if (cudaMalloc(reinterpret_cast<void **>(&p), padded * 4) != cudaSuccess) {
      cudaGetLastError();
      return Status::error("out of device memory: gathering the ZeRO-2 box of " + nameOf(slot.g.parameter) +
                           " whole needs " + bytesText(padded * 4));
    }
    own.reset(p);
    return p;
  }
  std::vector<OptimizerSlot> slots;
  CudaExecutor::OptimizerSetup optimizer;
  // streamGradients: during the next run, each bound gradient is added to
  // its sum, and (`streamReduces`) the sum's data-parallel reduction
  // issued, right after the instruction that writes it (slotsOf[k]: the
  // slots instruction k's results are the gradients of); `taken`: per
  // slot, added this run; `reduced`: reduced this step.
  std::vector<std::vector<int>> slotsOf;
  std::vector<bool> taken, reduced;
  bool streaming = false, streamFirst = false, streamReduces = true;
  int streamRange = -1; // the range streamed (-1: the whole program)
  size_t streamedEarly = 0; // reductions (buckets) issued with instructions still to run (the last run)
  Status reduceGradient(int slot);
  Status reduceGradientsOf(int k);
  std::vector<bool> boundOutput; // per stage output: a bound gradient (outputs() skips it)
  mutable std::vector<Tensor> spare; // recycle()'s tensors, for outputs() to write into
  // ZeRO, a box of n values not a multiple of the replicas: the padded box
  // the all-gather of the new values fills (storage-sized, the largest such).
  void *staging = nullptr;
  double *squares = nullptr; // per slot
  bool sumsGathered = false; // ZeRO: readMasters has used the sums' memory
  std::vector<void *> optimizerMemory;
  size_t optimizerBytes = 0;
  size_t readBackBytes = 0; // of the optimizer's state, copied to the host for writing
  bool keepParameters = false; // keepLoadedParameters

  ~State() {
    for (const GatherInterval &g : gatherIntervals) {
      buffers[slots[g.slot].g.parameter].data = nullptr; // (the block's)
      if (g.gathered) cudaEventDestroy(g.gathered);
    }
    for (void *p : optimizerMemory) cudaFree(p);
    for (OptimizerSlot &slot : slots)
      if (slot.summed) cudaEventDestroy(slot.summed);
    for (cudaEvent_t e : stagingFree)
      if (e) cudaEventDestroy(e);
    for (void *p : setAllocations) cudaFree(p);
    for (size_t j = 0; j < held.size() && !poolMemory.empty(); ++j) // inputs: slot 0's are their own allocation
      if (heldPool[j] == 0 && !buffers[held[j]].inArena) buffers[held[j]].data = poolMemory[0][0][heldIndex[j]];
    for (DeviceBuffer &b : buffers)
      if (b.data && !b.inArena && !b.aliased) cudaFree(b.data);
    if (arena && ownsArena) cudaFree(arena);
    if (scratch) cudaFree(scratch);
    if (tokens) cudaFree(tokens);
    if (commScratch) cudaFree(commScratch);
    if (fewRowsPartials) cudaFree(fewRowsPartials);
    for (auto &[inst, frequencies] : ropeFrequencies) cudaFree(frequencies);
    for (auto &[bias, counts] : expertCounts) cudaFree(counts);
    cudnnAttention.clear(); // before the handle
    CudnnAttention::destroyHandle(cudnn);
    if (blas) cublasDestroy(blas);
    ltPlans.clear(); // before the handle
    if (lt) cublasLtDestroy(lt);
    if (ltWorkspace && ownsWorkspaces) cudaFree(ltWorkspace);
    if (graph) cudaGraphExecDestroy(graph);
    if (blasWorkspace && ownsWorkspaces) cudaFree(blasWorkspace);
    if (stream) cudaStreamDestroy(stream);
  }

  // RoPE's inverse frequencies per instruction, computed (in double) and
  // uploaded once by prepare.
  std::map<const pxe::Instruction *, double *> ropeFrequencies;

  // A collective whose transfer may still be running on the collectives'
  // stream. The compute stream waits for it (and then issues `finish`, the
  // kernels that unpack the transfer into the result) only when it must:
  // before an instruction that touches one of `buffers`, before another
  // collective or a host synchronisation, and at the end of the stage.
  // Instructions issued in between run while the transfer does.
  struct PendingCollective {
    cudaEvent_t done;             // recorded on the collectives' stream after the transfer
    std::vector<int32_t> buffers; // what the transfer and `finish` read or write
    std::function<Status()> finish;
  };
  std::optional<PendingCollective> pending;
  bool overlap = true;   // PARAX_CUDA_OVERLAP=0: wait right after each collective
  size_t overlapped = 0; // instructions issued during a transfer, this step
  double expertLoad = 0;  // busiestExpertLoad: the expert dispatches' busiest rank
  std::optional<float> labelCount; // setLabelCount: what label_count gives instead of counting
  std::map<int32_t, int32_t *> expertCounts; // takeExpertCounts: per router bias buffer, [E] on the device

  /// After a collective's transfer is issued: finishes at once when it has
  /// completed (host-staged) or overlap is off, otherwise leaves it pending.
  Status deferUntilNeeded(std::vector<int32_t> touched, std::function<Status()> finish) {
    cudaEvent_t done = comm ? comm->takeIssued() : nullptr;
    if (!done) return finish ? finish() : Status::ok();
    pending = PendingCollective{done, std::move(touched), std::move(finish)};
    return overlap ? Status::ok() : completePending();
  }
  Status completePending() {
    if (!pending) return Status::ok();
    PendingCollective p = std::move(*pending);
    pending.reset();
    PARAX_CUDA(cudaStreamWaitEvent(stream, p.done, 0));
    return p.finish ? p.finish() : Status::ok();
  }
  // Experts: one grouped GEMM launch per projection with the row counts on
  // the device (no host synchronisation; a single-rank MoE stage replays as
  // a CUDA graph) while experts average at most kGroupedRows rows and their
  // weights are small (tiny models: launches and the count copy would
  // dominate); else cuBLAS GEMMs per expert sized by the host. Measured on
  // an H200 (2026-12-04), DeepSeek-V3's 16 experts of 7168 x 2048 at decode
  // size (32 tokens x 8 choices, 16 rows an expert): grouped 5.70 ms,
  // per expert 0.69 ms (the grouped kernel's simple tiles read the
  // weights at 0.23 TB/s, cuBLAS at 1.35 TB/s). The grouped GEMM can win
  // only where 3E launches and a synchronising copy cost more than that
  // gap: small weights (the 64 MB in bf16 here is a guess until a GPU
  // measures the crossover).
  // PARAX_EXPERTS=grouped or per-expert forces one.
  // At decode size (an inference step's experts of at most FewRows::kMaxRows
  // rows on average) the grouped path runs groupedFewRowsKernel whatever
  // the weights' size: each expert's weights read once, no host
  // synchronisation (the per-expert path's 3E few-row GEMMs read them once
  // too, after a synchronising copy of the counts).
  static constexpr int64_t kGroupedRows = 128;
  static constexpr int64_t kGroupedWeights = int64_t(32) << 20; // values of gate, up and down together
  std::string expertsPath; // PARAX_EXPERTS
  bool fewRowExperts(int64_t pairs, int64_t E) const { return fewRowsKernel && pairs <= FewRows::kMaxRows * E; }
  bool groupedExperts(const pxe::Instruction &inst) const {
    if (!expertsPath.empty()) return expertsPath == "grouped"; // validated by prepare
    const std::vector<Tensor> &b = host.hostBuffers();
    const Tensor &gate = b[inst.operands(3)]; // [E, F, H], as up; down [E, H, F]
    int64_t pairs = b[inst.operands(2)].numel(), E = gate.shape[0];
    return fewRowExperts(pairs, E) || (pairs <= kGroupedRows * E && 3 * gate.numel() <= kGroupedWeights);
  }
  // Collectives too, through NCCL (a host-staged one copies through the
  // host) or locally (no communicator).
  bool capturable(const pxe::Instruction &inst) const {
    // (An expert exchange over several ranks reads its counts on the host.)
    if ((opName(inst) == "moe_dispatch" || opName(inst) == "moe_combine") &&
        groupSize(attrStrings(inst.attrs(), "axes")) > 1)
      return !comm;
    if (isCollective(opName(inst))) return !comm || !comm->staged;
    return capturableOp(opName(inst)) || (opName(inst) == "experts" && groupedExperts(inst));
  }

  // A biased `linear` whose only use is the next instruction, a `gelu` of
  // the form cuBLASLt's GELU_BIAS epilogue computes (measured at prepare:
  // GeluEpilogue.cuh), writes the gelu's result through that epilogue;
  // the gelu is skipped. linear -> the gelu's result buffer.
  std::map<const pxe::Instruction *, int32_t> geluInto;
  std::vector<bool> skipped; // per instruction: not issued by steps (fused, or hoisted)
  Status planGeluFusion();

  // A decode step's KV cache joined with the new tokens' keys (or values)
  // by a `concat` on the sequence whose only use is an attention that
  // takes the split decode kernel: the concat is skipped and the kernel
  // reads the two parts where they are, so the cache is read once a step
  // instead of copied and read again. (attention, operand 1 or 2) -> the
  // concat's (cache, new) buffers.
  std::map<std::pair<const pxe::Instruction *, int>, std::pair<int32_t, int32_t>> cacheParts;
  // Attentions that run split over the keys (their shapes allow it) -> their
  // tiles (keys, and query rows a block); decided once at prepare.
  std::map<const pxe::Instruction *, DecodeTiles> decodeKeyTiles;
  // The attention and attention_grad instructions cuDNN runs (their graphs,
  // built at prepare), its handle, and what attentionPath() reports.
  void *cudnn = nullptr;
  std::map<const pxe::Instruction *, std::unique_ptr<CudnnAttention>> cudnnAttention;
  std::string attentionPath;
  void planCudnnAttention();
  std::string cudnnRefusal(const pxe::Instruction &inst, CudnnAttentionShape &shape);
  Status runCudnnAttention(const pxe::Instruction &inst, const CudnnAttention &graphs);
  bool ranCudnnAttention(const pxe::Instruction &inst);
  void planDecodeAttention();
  void aliasCacheUpdates();
  size_t cacheWritesInPlace = 0;
  size_t sharedParameters = 0, sharedCaches = 0; // taken from another program (prepare's `share`)
  size_t offeredParameters = 0; // looked for in `share` (not read through parameter moves)
  /// This stage's buffer of the same role, box (parameter name and piece,
  /// or input index), shape, split and dtype as `other`, or -1.
  int32_t sameBox(const pxe::Buffer &other) const {
    for (const pxe::Buffer &b : host.stageProgram().buffers()) {
      if (!buffers[b.id()].data) continue;
      if (b.role() == pxe::INPUT ? sameInputBox(b, other) : b.role() == pxe::PARAMETER && sameParameterBox(b, other))
        return b.id();
    }
    return -1;
  }
  /// Where this program holds the values of `other`, a parameter of
  /// `otherHost`'s program on this rank: a parameter of the same box, or
  /// one whose elements of the same checkpoint tensor, declared in another
  /// shape, include `other`'s (DeepSeek-V3's kv_b_proj: [heads x 256, 512]
  /// to an expanded prefill; [heads, 128, 512] of keys and [heads, 128,
  /// 512] of values, pieces of [heads, 256, 512], to an absorbed step).
  /// `other`'s values start `offset` elements into that parameter; with
  /// `blockStride` > 0 its leading slices lie that many elements apart
  /// there, which only a reader that takes a stride may accept (`strided`).
  struct Held {
    int32_t id = -1;
    int64_t offset = 0, blockStride = 0;
  };
  std::optional<Held> heldParameter(const pxe::Buffer &other, const Executor &otherHost, bool strided) const {
    int32_t same = sameBox(other);
    if (same >= 0) return Held{same};
    CheckpointBox box = otherHost.parameterBox(other);
    for (const pxe::Buffer &b : host.stageProgram().buffers()) {
      if (!buffers[b.id()].data || b.role() != pxe::PARAMETER || b.param_name() != other.param_name() ||
          b.dtype() != other.dtype() ||
          !std::equal(b.partial().begin(), b.partial().end(), other.partial().begin(), other.partial().end()))
        continue;
      auto at = heldAt(box, other, host.parameterBox(b), b);
      // (blocks: only for a reader that takes their stride, a block a head)
      if (at && (at->blockStride == 0 || (strided && at->blocks == other.shape(0))))
        return Held{b.id(), at->offset, at->blockStride};
    }
    return std::nullopt;
  }
  static bool sameParameterBox(const pxe::Buffer &a, const pxe::Buffer &b) {
    auto same = [](const auto &x, const auto &y) { return std::equal(x.begin(), x.end(), y.begin(), y.end()); };
    if (b.role() != pxe::PARAMETER || a.param_name() != b.param_name() || a.dtype() != b.dtype() ||
        !same(a.shape(), b.shape()) || !same(a.param_offset(), b.param_offset()) || !same(a.partial(), b.partial()) ||
        a.split_size() != b.split_size())
      return false;
    for (int d = 0; d < a.split_size(); ++d)
      if (!same(a.split(d).axes(), b.split(d).axes())) return false;
    return true;
  }
  /// By buffer: whether every read of it is as a head_linear's weight
  /// (headGemm takes its heads' stride: a parameter whose heads lie apart
  /// in another's memory).
  std::vector<bool> readOnlyAsHeadWeights() const {
    const pxe::Stage &stage = host.stageProgram();
    std::vector<bool> only(stage.buffers_size(), true);
    for (const pxe::Instruction &inst : stage.instructions())
      for (int i = 0; i < inst.operands_size(); ++i)
        if (opName(inst) != "head_linear" || i != 1) only[inst.operands(i)] = false;
    for (int32_t id : stage.outputs()) only[id] = false;
    return only;
  }
  /// How many times each buffer is read: by instructions and as the
  /// stage's outputs.
  std::map<int32_t, int> useCounts() const {
    std::map<int32_t, int> uses;
    for (const pxe::Instruction &inst : host.stageProgram().instructions())
      for (int32_t id : inst.operands()) ++uses[id];
    for (int32_t id : host.stageProgram().outputs()) ++uses[id];
    return uses;
  }
  /// The buffers an instruction reads: its operands, a fused concat's
  /// result replaced by the concat's parts.
  std::vector<int32_t> readsOf(const pxe::Instruction &inst) const {
    std::vector<int32_t> ids;
    for (int i = 0; i < inst.operands_size(); ++i) {
      auto it = cacheParts.find({&inst, i});
      if (it == cacheParts.end())
        ids.push_back(inst.operands(i));
      else
        ids.insert(ids.end(), {it->second.first, it->second.second});
    }
    return ids;
  }

  // Data movement whose operands are all parameters (or results of such
  // moves) gives the same result every step: GPT-2's fused QKV weight,
  // sliced and then cut for TP, for instance. prepare runs it once.
  size_t hoisted = 0;
  size_t sharedMoves = 0; // hoisted moves' results taken from the lender
  // Each hoisted move's result by what it computes (op, attributes, the
  // parameter boxes or moves it reads, its shape): the same name in two
  // programs is the same value.
  std::map<std::string, int32_t> hoistedByName;
  std::string valueName(int32_t id, const std::map<int32_t, std::string> &moves) const;
  Status hoistInvariants();

  // The step's temporaries share one arena: two whose lifetimes do not meet
  // get the same memory (BufferPlan.h). A collective's operands and results
  // stay live until its first result is read (or the stage ends): it may
  // run on its own stream until then. PARAX_CUDA_SHARE_TEMPORARIES=0 gives
  // every temporary its own allocation (what the AddressSanitizer run uses,
  // so that it sees each buffer's bounds).
  // PARAX_CUDA_POISON_DEAD=1 (a check, used by the emulator's tests): a
  // temporary is filled with NaN (0xff bytes) on the compute stream right
  // after its last use, so that anything still reading it afterwards -- a
  // transfer on the collectives' stream, say -- computes NaN instead of
  // reading memory that only happens not to be reused yet.
  void *arena = nullptr;
  BufferPlan temporaries;
  std::string peakReport; // PARAX_CUDA_MEMORY_PEAK=1 (prepare)
  size_t inPlace = 0; // temporaries in an operand's memory (placeTemporaries)
  std::vector<int32_t> placed; // the temporaries placeTemporaries gave memory
  std::vector<std::vector<int32_t>> poisonAfter; // per instruction
  Status placeTemporaries();
  // placeTemporaries' parts. Each temporary's lifetime (instructions first
  // .. last) and what may share memory: an elementwise result in the
  // memory of its operand (hostOf; guestOf the reverse), a temporary kept
  // between pipeline ranges (pinned, or crossing a range's start).
  struct TemporaryLives {
    std::vector<int32_t> ids; // the temporaries still without memory
    std::vector<int> first, last, lastUse;
    std::vector<bool> takenAfterRange, pinned, reshaped, untouched;
    std::vector<int32_t> hostOf, guestOf;
    // collectTemporaries': the shared ones (not those in a host's memory)
    // and the held ones with their lifetimes.
    std::vector<int32_t> shared;
    std::vector<BufferLifetime> lifetimes, heldLifetimes;
    int32_t tailOf(int32_t id) const { // the last of the results that take id's memory in turn
      while (guestOf[id] >= 0) id = guestOf[id];
      return id;
    }
  };
  bool crossesRange(const TemporaryLives &lives, int32_t id) const;
  TemporaryLives temporaryLifetimes();
  void resultsInPlace(TemporaryLives &lives);
  BufferPlan collectTemporaries(TemporaryLives &lives, bool own);
  void arrangeTemporaries(TemporaryLives &lives, bool own);
  void reportMemoryPeak(const TemporaryLives &lives);
  Status allocateTemporaries(const TemporaryLives &lives, bool own, bool poison);
  Status placeHeldTemporaries(const TemporaryLives &lives, bool own, bool poison);

  bool conflictsWithPending(int k) const {
    if (waitsForPending[k]) return true; // a collective, or a host synchronisation
    const pxe::Instruction &inst = host.stageProgram().instructions(k);
    auto touched = [&](int32_t id) {
      return std::find(pending->buffers.begin(), pending->buffers.end(), id) != pending->buffers.end();
    };
    for (int32_t id : readsOf(inst))
      if (touched(id)) return true;
    for (int32_t id : inst.results())
      if (touched(id)) return true;
    auto fused = geluInto.find(&inst);
    return fused != geluInto.end() && touched(fused->second);
  }

  /// Waits for the GPU: for the collectives in flight first (the watchdog),
  /// then for the compute stream. Every host synchronisation goes here.
  Status sync() {
    Status done = completePending();
    if (!done.isOk()) return done;
    if (comm) {
      Status st = comm->drain();
      if (!st.isOk()) return st;
    }
    PARAX_CUDA(cudaStreamSynchronize(stream));
    return Status::ok();
  }

  /// cudaMalloc; when the device is full, an error that says what did not
  /// fit, how much this rank holds already and what the device has left.
  size_t deviceBytes = 0; // allocated by this executor so far
  template <typename T> Status allocate(T **ptr, size_t bytes, const std::string &what) {
    cudaError_t e = cudaMalloc(reinterpret_cast<void **>(ptr), bytes);
    if (e == cudaSuccess) {
      deviceBytes += bytes;
      return Status::ok();
    }
    cudaGetLastError(); // not sticky: clear it for the checks after each instruction
    if (e != cudaErrorMemoryAllocation)
      return Status::error("cudaMalloc for " + what + ": " + cudaGetErrorString(e));
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    return Status::error("out of device memory: " + what + " needs " + bytesText(bytes) + ", this rank holds " +
                         bytesText(deviceBytes) + " already (the device has " + bytesText(free) + " free of " +
                         bytesText(total) + "); the plan needs more devices, a smaller batch or recomputation");
  }
  static std::string bytesText(size_t bytes) {
    char text[32];
    if (bytes < (1u << 20)) std::snprintf(text, sizeof text, "%.1f KiB", bytes / 1024.0);
    else if (bytes < (1u << 30)) std::snprintf(text, sizeof text, "%.1f MiB", bytes / 1048576.0);
    else std::snprintf(text, sizeof text, "%.2f GiB", bytes / 1073741824.0);
    return text;
  }
  /// Buffer `id` in words, for errors: a parameter's checkpoint name.
  std::string nameOf(int32_t id) const {
    const pxe::Buffer &b = host.stageProgram().buffers(id);
    std::string shape;
    for (int64_t d : buffers[id].shape) shape += (shape.empty() ? "" : "x") + std::to_string(d);
    if (b.role() == pxe::PARAMETER) return "parameter '" + b.param_name() + "' [" + shape + "]";
    if (b.role() == pxe::INPUT) return "input " + std::to_string(b.input_index()) + " [" + shape + "]";
    const pxe::Stage &stage = host.stageProgram();
    for (int k = 0; k < stage.instructions_size(); ++k)
      for (int32_t result : stage.instructions(k).results())
        if (result == id)
          return "the result of instruction " + std::to_string(k) + " (" + opName(stage.instructions(k)) + ") [" +
                 shape + "]";
    return "buffer " + std::to_string(id) + " [" + shape + "]";
  }

  /// Grows `buffer` (compute or collective scratch) to `floats`.
  Status ensureScratch(size_t floats, float *&buffer, size_t &size) {
    if (floats <= size) return Status::ok();
    if (buffer) {
      Status st = sync(); // cudaFree waits for the device anyway
      if (!st.isOk()) return st;
      PARAX_CUDA(cudaFree(buffer));
      deviceBytes -= size * sizeof(float);
    }
    Status st = allocate(&buffer, floats * sizeof(float), "scratch space");
    if (!st.isOk()) return st;
    size = floats;
    return Status::ok();
  }
  Status ensureScratch(size_t floats) { return ensureScratch(floats, scratch, scratchSize); }

  /// A kernel's flag on the device (-1: nothing wrong, else the index of a
  /// bad label or id), read after the stream's work.
  Status checkFlag(const int32_t *flag, const std::function<std::string(int32_t)> &message) {
    int32_t bad = -1;
    PARAX_CUDA(cudaMemcpyAsync(&bad, flag, 4, cudaMemcpyDeviceToHost, stream));
    Status st = sync();
    if (!st.isOk()) return st;
    return bad >= 0 ? Status::error(message(bad)) : Status::ok();
  }
  Status ensureCommScratch(size_t floats) { return ensureScratch(floats, commScratch, commScratchSize); }

  /// The tensor `t` cut along `dim` into `parts` pieces, stored piece after
  /// piece in `pieces` (a buffer of t's storage), or (`gather`) back.
  Status pieces(bool gather, DeviceBuffer &t, int dim, int64_t parts, void *storage) {
    return withBits(t, [&](auto w) {
      using W = decltype(w);
      auto [outer, inner] = around(t.shape, dim);
      int64_t chunk = t.shape[dim] / parts, n = t.numel() / parts;
      for (int64_t p = 0; p < parts; ++p) {
        W *piece = static_cast<W *>(storage) + p * n;
        if (gather)
          PARAX_LAUNCH(placeKernel<W>, blocksFor(n), kThreads, 0, stream)(piece, t.as<W>(), outer, t.shape[dim],
                                                                          chunk, p * chunk, inner);
        else
          PARAX_LAUNCH(sliceKernel<W>, blocksFor(n), kThreads, 0, stream)(t.as<W>(), piece, outer, t.shape[dim],
                                                                          chunk, p * chunk, inner);
      }
      return Status::ok();
    });
  }

  // Buffer `id`'s shape and storage type, from the host's.
  void describe(int32_t id) {
    const Tensor &t = host.hostBuffers()[id];
    buffers[id].shape = t.shape;
    buffers[id].elem = t.isInt ? Elem::I32 : elemOf(host.stageProgram().buffers(id).dtype());
  }
  Status upload(int id) {
    const Tensor &t = host.hostBuffers()[id];
    DeviceBuffer &d = buffers[id];
    size_t bytes = t.numel() * 4;
    if (bytes == 0) return Status::ok();
    if (!t.isInt) return copyToDevice(d.data, t.f.data(), t.numel(), d.elem, stream);
    PARAX_CUDA(cudaMemcpyAsync(d.data, t.i.data(), bytes, cudaMemcpyHostToDevice, stream));
    return Status::ok();
  }

  // This rank's place in the group of `axes`, its ranks (Executable.h).
  int64_t groupIndex(const std::vector<std::string> &axes) {
    return runtime::groupIndex(*exe, host.coordinates(), axes);
  }
  int64_t groupSize(const std::vector<std::string> &axes) const { return runtime::groupSize(*exe, axes); }
  SequenceRows rowsOf(const Attrs &a, int64_t rows) { return sequenceRows(*exe, host.coordinates(), a, rows); }
  int peerRank(const std::string &axis, int64_t peer) {
    return runtime::peerRank(*exe, host.coordinates(), axis, peer);
  }

  /// Instruction k of the stage, by its kernel (kernels[k]).
  Status run(int k);
  using Kernel = Status (State::*)(const pxe::Instruction &inst);
  // Each op the backend runs (by the executable's kind) and its kernel; a
  // kernel serving several ops reads which from the instruction's kind.
  struct KernelEntry {
    pxe::OpKind kind;
    Kernel kernel;
  };
  static const KernelEntry kKernels[];
  std::vector<Kernel> kernels; // per instruction: its op's kernel (nullptr: none), resolved at prepare
  // Per instruction: a collective or a host synchronisation, which waits
  // for the collectives in flight (conflictsWithPending).
  std::vector<bool> waitsForPending;
  void resolveKernels();
  // An instruction's operands or results by place (each kernel's first
  // lines: `Pick in{buffers, inst.operands()}, out{buffers, inst.results()};`).
  struct Pick {
    std::vector<DeviceBuffer> &b;
    const google::protobuf::RepeatedField<int32_t> &ids;
    DeviceBuffer &operator()(int k = 0) const { return b[ids[k]]; }
  };
  // Copies n elements of `like`'s storage on the stream.
  Status copy(void *dst, const void *src, int64_t n, const DeviceBuffer &like) {
    PARAX_CUDA(cudaMemcpyAsync(dst, src, n * elemBytes(like.elem), cudaMemcpyDeviceToDevice, stream));
    return Status::ok();
  }
  static void *offsetOf(const DeviceBuffer &b, int64_t elements) {
    return static_cast<char *>(b.data) + elements * elemBytes(b.elem);
  }
  // A collective's axes, the ranks they span and their mask; an error for
  // a group of several ranks without a communicator.
  struct CollectiveGroup {
    std::vector<std::string> axes;
    int64_t ranks;
    unsigned mask;
  };
  StatusOr<CollectiveGroup> collectiveGroup(const Attrs &a) {
    CollectiveGroup g{attrStrings(a, "axes"), 0, 0};
    g.ranks = groupSize(g.axes);
    StatusOr<unsigned> mask = groupMask(*exe, g.axes);
    if (!mask.isOk()) return mask.status();
    g.mask = mask.value();
    if (g.ranks > 1 && !comm) return Status::error("a collective over several ranks needs a communicator");
    return g;
  }
  // The kernels, one an op or a family of ops (kKernels).
  Status runEmbedding(const pxe::Instruction &inst);
  Status runPositionEmbedding(const pxe::Instruction &inst);
  Status runLinear(const pxe::Instruction &inst);
  Status runHeadLinear(const pxe::Instruction &inst);
  Status runNorm(const pxe::Instruction &inst);
  Status runRope(const pxe::Instruction &inst);
  Status runAttention(const pxe::Instruction &inst);
  Status runBinary(const pxe::Instruction &inst);
  Status runUnary(const pxe::Instruction &inst);
  Status runSwiglu(const pxe::Instruction &inst);
  Status runReshape(const pxe::Instruction &inst);
  Status runTranspose(const pxe::Instruction &inst);
  Status runBroadcast(const pxe::Instruction &inst);
  Status runSlice(const pxe::Instruction &inst);
  Status runCacheUpdate(const pxe::Instruction &inst);
  Status runRingCacheUpdate(const pxe::Instruction &inst);
  Status runConcat(const pxe::Instruction &inst);
  Status runBalanceLoss(const pxe::Instruction &inst);
  Status runRouter(const pxe::Instruction &inst);
  Status runExpertsGrad(const pxe::Instruction &inst);
  Status runExperts(const pxe::Instruction &inst);
  Status runShift(const pxe::Instruction &inst);
  Status runLabelCount(const pxe::Instruction &inst);
  Status runLogsumexp(const pxe::Instruction &inst);
  Status runCrossEntropy(const pxe::Instruction &inst);
  Status runLinearWeightGrad(const pxe::Instruction &inst);
  Status runNormGrad(const pxe::Instruction &inst);
  Status runSumTo(const pxe::Instruction &inst);
  Status runSigmoidGrad(const pxe::Instruction &inst);
  Status runSoftcapGrad(const pxe::Instruction &inst);
  Status runGeluGrad(const pxe::Instruction &inst);
  Status runPositionEmbeddingGrad(const pxe::Instruction &inst);
  Status runSwigluGrad(const pxe::Instruction &inst);
  Status runAttentionGrad(const pxe::Instruction &inst);
  Status runEmbeddingGrad(const pxe::Instruction &inst);
  Status runAllReduce(const pxe::Instruction &inst);
  Status runShardSlice(const pxe::Instruction &inst);
  Status runToPartial(const pxe::Instruction &inst);
  Status runGatherScatter(const pxe::Instruction &inst);
  Status runSendRecv(const pxe::Instruction &inst);
  Status runExpertExchange(const pxe::Instruction &inst);
  /// `st` as the error of instruction k, done `how` ("on the GPU", ...).
  /// The moves of parameters that prepare ran once, again on the new
  /// values (on the device: the host's copies are gone); waits for the GPU.
  Status rerunParameterMoves() {
    for (int k = 0; k < host.stageProgram().instructions_size(); ++k) {
      if (!host.hoisted(k)) continue;
      Status st = run(k);
      if (!st.isOk()) return failed(k, "run again after a parameter update", st);
    }
    return sync();
  }
  /// The collectives issued from now on are the optimizer's (for reports).
  void issueAsOptimizer() {
    if (!comm) return;
    comm->issuerStage = host.stage();
    comm->issuerInstruction = -1;
  }
  /// The compute stream waits for the collective just issued (if it has
  /// not finished already).
  Status awaitIssued() {
    cudaEvent_t done = comm ? comm->takeIssued() : nullptr;
    if (done) PARAX_CUDA(cudaStreamWaitEvent(stream, done, 0));
    return Status::ok();
  }
  Status failed(int k, const char *how, const Status &st) {
    return Status::error("stage " + std::to_string(host.stage()) + " instruction " + std::to_string(k) + " (" +
                         opName(host.stageProgram().instructions(k)) + ") " + how + ": " + st.message());
  }
  /// Issues instructions [begin, end) of the stage (errors name the
  /// instruction); with `marks` (instructions + 1 events), records marks[k]
  /// on the compute stream before instruction k and the last after the
  /// range. Sends held by the range before go in one group with this
  /// range's leading receives; with `holdSends`, this range's sends after
  /// its last receive are held for the next range (see
  /// CudaExecutor::runRange).
  Status issue(int begin, int end, bool holdSends = false, const std::vector<cudaEvent_t> *marks = nullptr);
  std::vector<NcclCommunicator::PointToPoint> heldSends;
  /// A send's or recv's transfer: its buffer (in the activation set in
  /// use) and the peer's world rank.
  NcclCommunicator::PointToPoint pointToPoint(int k) {
    const pxe::Instruction &inst = host.stageProgram().instructions(k);
    return pointToPoint(inst, inst.kind() == pxe::OP_SEND);
  }
  NcclCommunicator::PointToPoint pointToPoint(const pxe::Instruction &inst, bool sending) {
    const DeviceBuffer &b = buffers[sending ? inst.operands(0) : inst.results(0)];
    return {b.data, static_cast<size_t>(b.numel()), b.elem,
            peerRank(attrStrings(inst.attrs(), "axes").at(0), attrInt(inst.attrs(), "peer")), sending};
  }

  // Pipeline training (CudaExecutor::holdActivations): the stage runs in
  // `ranges`; what a microbatch keeps between its ranges -- the inputs,
  // the temporaries live across a range's start, the results of the
  // receives that begin a range (received ahead, by exchange) and the
  // operands of the sends that end one (held for the next step's group) --
  // lives in memory of its own, the rest of the temporaries within one
  // range share the arena. Kept values are pooled: a model chunk's own
  // (written and read only by that chunk's ranges) in pool 1 + c, with a
  // slot for each of chunkSets[c] microbatches that hold the chunk at once;
  // the others (inputs, values several chunks read; everything with one
  // chunk) in pool 0, a slot a microbatch in flight (`sets`). Microbatch m
  // uses slot m % slots of each pool: poolMemory[pool][slot][heldIndex[j]]
  // is where held[j] lives.
  std::vector<PipelineRange> ranges;
  int sets = 1;
  std::vector<int> poolSlots;   // per pool
  int64_t currentMicro = 0;     // useActivations'
  std::vector<int32_t> held;
  std::vector<int> heldPool, heldIndex;
  std::vector<std::vector<std::vector<void *>>> poolMemory;
  std::vector<void *> setAllocations; // the pools' memory (but pool 0 slot 0's inputs: prepare's)
  size_t keptBytes = 0;               // all of it
  bool gradientsBound = false; // holdActivations' promise: bindOptimizer binds every gradient output
  std::set<std::pair<int64_t, int>> receivedAhead; // (microbatch, range start): its leading receives done
  /// Per bound gradient, the range it belongs to: its writer's, or the
  /// last range when a forward range writes it (set by bindOptimizer and
  /// holdActivations, whichever comes last; empty without ranges).
  std::vector<int> slotRange;
  void assignSlotRanges() {
    slotRange.assign(ranges.empty() ? 0 : slots.size(), static_cast<int>(ranges.size()) - 1);
    for (int k = 0; k < static_cast<int>(slotsOf.size()) && !ranges.empty(); ++k)
      for (int i : slotsOf[k])
        for (int r = 0; r < static_cast<int>(ranges.size()); ++r)
          if (k >= ranges[r].begin && k < ranges[r].end && ranges[r].backward) slotRange[i] = r;
  }
  bool inRange(int slot, int range) const { return range < 0 || slotRange.empty() || slotRange[slot] == range; }
  /// Past the receives (and instructions run elsewhere) that begin the
  /// range [begin, end): what a step's group receives ahead.
  int pastLeadingReceives(int begin, int end) const {
    const pxe::Stage &stage = host.stageProgram();
    while (begin < end && (skipped[begin] || stage.instructions(begin).kind() == pxe::OP_RECV)) ++begin;
    return begin;
  }
  /// The sends held so far and `receives` as one NCCL group, complete
  /// before anything else runs (errors name `instruction`).
  Status exchangeHeld(std::vector<NcclCommunicator::PointToPoint> receives, int instruction) {
    std::vector<NcclCommunicator::PointToPoint> group;
    group.swap(heldSends);
    group.insert(group.end(), receives.begin(), receives.end());
    if (group.empty()) return Status::ok();
    if (!comm) return Status::error("sends and receives without a communicator");
    comm->issuerStage = host.stage();
    comm->issuerInstruction = instruction;
    Status st = completePending();
    if (st.isOk()) st = comm->exchange(group, stream);
    if (st.isOk()) st = awaitIssued();
    if (!st.isOk() && comm->aborted) return st;
    if (!st.isOk()) return failed(instruction, "exchanging with the pipeline's neighbours", st);
    return Status::ok();
  }

  // The step as a CUDA graph (see CudaExecutor::run).
  bool graphs = false; // every instruction capturable, and not turned off
  int collectives = 0; // the stage's collective instructions
  int eagerSteps = 0;
  cudaGraphExec_t graph = nullptr;
  void *blasWorkspace = nullptr; // cuBLAS's own, so that captures allocate nothing

  /// Row-major y[m, n] = x[m, k] . W (+ bias[n]), W stored [k, n] or,
  /// `transposeW`, [n, k]. Each of x, W, y is fp32 or bf16 (their `Elem`);
  /// a bf16 W runs on bf16 tensor cores with fp32 accumulation, an fp32 x
  /// then rounded to bf16 into `xb` (m * k elements) first. An fp32 W needs
  /// an fp32 x. With a bias (y's type), cuBLASLt adds it in its epilogue.
  /// y = x · op(W) (+ bias, gelu'd); `accumulate`: y += x · op(W) (no bias).
  Status gemm(const void *x, Elem xe, int64_t m, int64_t k, const void *w, Elem we, bool transposeW, int64_t n,
              void *y, Elem ye, __nv_bfloat16 *xb, const void *bias = nullptr, bool gelu = false,
              bool accumulate = false) {
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    // Column-major: y^T[n, m] = op(W^T) x^T.
    cublasOperation_t op = transposeW ? CUBLAS_OP_T : CUBLAS_OP_N;
    int ldw = static_cast<int>(transposeW ? k : n);
    if (we == Elem::F32 && (xe != Elem::F32 || ye != Elem::F32))
      return Status::error("a GEMM with fp32 weights needs fp32 activations");
    if (fewRowsKernel && !gelu && !accumulate && FewRows::fits(m, k, n, transposeW, elemBytes(we), w))
      return fewRowsGemm(x, xe, m, k, w, we, transposeW, n, y, ye, bias);
    if (we == Elem::BF16 && xe == Elem::F32) {
      PARAX_LAUNCH(toBf16Kernel, blocksFor(m * k), kThreads, 0, stream)(static_cast<const float *>(x), xb, m * k);
      x = xb;
    }
    cudaDataType_t wType = we == Elem::BF16 ? CUDA_R_16BF : CUDA_R_32F;
    cudaDataType_t yType = ye == Elem::BF16 ? CUDA_R_16BF : CUDA_R_32F;
    if (bias)
      return gemmWithBias(x, m, k, w, wType, op, ldw, n, y, yType, bias, gelu);
    if (we == Elem::BF16) {
      PARAX_CUBLAS(cublasGemmEx(blas, op, CUBLAS_OP_N, n, m, k, &one, w, CUDA_R_16BF, ldw, x, CUDA_R_16BF, k,
                                &beta, y, yType, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      return Status::ok();
    }
    PARAX_CUBLAS(cublasSgemm(blas, op, CUBLAS_OP_N, n, m, k, &one, static_cast<const float *>(w), ldw,
                             static_cast<const float *>(x), k, &beta, static_cast<float *>(y), n));
    return Status::ok();
  }

  /// gemm's y[m, n] = x[m, k] · op(W) (+ bias[n]) for m <= 8 rows, each
  /// byte of W read once: W [n, k] (`transposeW`) by
  /// fewRowsLinearTransposedKernel, W [k, n] by fewRowsLinearKernel over
  /// splits of k whose sums fewRowsCombineKernel adds; x in either type,
  /// read as it is.
  Status fewRowsGemm(const void *x, Elem xe, int64_t m, int64_t k, const void *w, Elem we, bool transposeW,
                     int64_t n, void *y, Elem ye, const void *bias) {
    const int64_t wBytes = elemBytes(we);
    int64_t splits = 0, kPerSplit = 0;
    dim3 grid;
    if (transposeW) {
      const int64_t columns = FewRows::kWarps * FewRows::kWarpColumns; // a block's
      grid = dim3(static_cast<unsigned>((n + columns - 1) / columns));
    } else {
      splits = FewRows::splits(m, k, n, wBytes, multiprocessors);
      Status st = ensureScratch(static_cast<size_t>(splits * m * n), fewRowsPartials, fewRowsSize);
      if (!st.isOk()) return st;
      kPerSplit = (k + splits - 1) / splits;
      grid = dim3(static_cast<unsigned>((n + FewRows::columns(wBytes) - 1) / FewRows::columns(wBytes)),
                  static_cast<unsigned>(splits));
    }
    auto launch = [&](auto rows) {
      constexpr int R = decltype(rows)::value;
      using BF16 = __nv_bfloat16;
      auto transposed = [&](auto xs, auto ws, auto ys) {
        using Shape = FewRowsShape<R, decltype(xs), decltype(ws), decltype(ys)>;
        PARAX_LAUNCH(fewRowsLinearTransposedKernel<Shape>, grid, FewRows::kThreads, 0, stream)(
            static_cast<const typename Shape::TX *>(x), static_cast<const typename Shape::TW *>(w),
            static_cast<const typename Shape::TY *>(bias), static_cast<typename Shape::TY *>(y), k, n);
      };
      auto split = [&](auto xs, auto ws) {
        using Shape = FewRowsShape<R, decltype(xs), decltype(ws)>;
        PARAX_LAUNCH(fewRowsLinearKernel<Shape>, grid, FewRows::kThreads, 0, stream)(
            static_cast<const typename Shape::TX *>(x), static_cast<const typename Shape::TW *>(w),
            fewRowsPartials, k, n, kPerSplit);
      };
      // (an fp32 W has fp32 x and y: gemm checked)
      if (!transposeW) {
        if (we == Elem::F32) split(float{}, float{});
        else if (xe == Elem::F32) split(float{}, BF16{});
        else split(BF16{}, BF16{});
      } else if (we == Elem::F32) {
        transposed(float{}, float{}, float{});
      } else if (xe == Elem::F32) {
        if (ye == Elem::BF16) transposed(float{}, BF16{}, BF16{});
        else transposed(float{}, BF16{}, float{});
      } else {
        if (ye == Elem::BF16) transposed(BF16{}, BF16{}, BF16{});
        else transposed(BF16{}, BF16{}, float{});
      }
    };
    switch (m) {
    case 1: launch(std::integral_constant<int, 1>{}); break;
    case 2: launch(std::integral_constant<int, 2>{}); break;
    case 3: launch(std::integral_constant<int, 3>{}); break;
    case 4: launch(std::integral_constant<int, 4>{}); break;
    case 5: launch(std::integral_constant<int, 5>{}); break;
    case 6: launch(std::integral_constant<int, 6>{}); break;
    case 7: launch(std::integral_constant<int, 7>{}); break;
    default: launch(std::integral_constant<int, 8>{}); break; // (FewRows::fits: m <= 8)
    }
    if (transposeW) return Status::ok();
    if (ye == Elem::BF16)
      PARAX_LAUNCH(fewRowsCombineKernel<__nv_bfloat16>, blocksFor(m * n), kThreads, 0, stream)(
          fewRowsPartials, static_cast<const __nv_bfloat16 *>(bias), static_cast<__nv_bfloat16 *>(y), m, n, splits);
    else
      PARAX_LAUNCH(fewRowsCombineKernel<float>, blocksFor(m * n), kThreads, 0, stream)(
          fewRowsPartials, static_cast<const float *>(bias), static_cast<float *>(y), m, n, splits);
    return Status::ok();
  }

  /// Row-major y[m, g, n] = x[m, g, k] · W[g] for every head g, W stored
  /// [g, k, n] or, `transposeW`, [g, n, k], its heads `wStride` elements
  /// apart (k * n dense): one strided batched GEMM with fp32 accumulation
  /// (x's heads' rows g * k apart). Types as gemm's: a
  /// bf16 W with an fp32 x rounds x into `xb` (m * g * k elements) first.
  Status headGemm(const void *x, Elem xe, int64_t m, int64_t g, int64_t k, const void *w, int64_t wStride, Elem we,
                  bool transposeW, int64_t n, void *y, Elem ye, __nv_bfloat16 *xb) {
    if (we == Elem::F32 && (xe != Elem::F32 || ye != Elem::F32))
      return Status::error("a GEMM with fp32 weights needs fp32 activations");
    if (we == Elem::BF16 && xe == Elem::F32) {
      PARAX_LAUNCH(toBf16Kernel, blocksFor(m * g * k), kThreads, 0, stream)(static_cast<const float *>(x), xb,
                                                                           m * g * k);
      x = xb;
    }
    cudaDataType_t wType = we == Elem::BF16 ? CUDA_R_16BF : CUDA_R_32F;
    cudaDataType_t yType = ye == Elem::BF16 ? CUDA_R_16BF : CUDA_R_32F;
    const float one = 1.0f, zero = 0.0f;
    // Column-major, head by head: y_g^T [n, m] = op(W_g^T) x_g^T.
    PARAX_CUBLAS(cublasGemmStridedBatchedEx(
        blas, transposeW ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
        static_cast<int>(k), &one, w, wType, static_cast<int>(transposeW ? k : n), wStride, x, wType,
        static_cast<int>(g * k), k, &zero, y, yType, static_cast<int>(g * n), n, static_cast<int>(g),
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return Status::ok();
  }

  /// C [k, n] = Aᵀ · B of row-major A [m, k] and B [m, n], all of type `e`
  /// (fp32 sums): a weight's gradient.
  Status transposedProduct(const void *A, int64_t k, const void *B, int64_t n, int64_t m, void *C, Elem e) {
    const float one = 1.0f, zero = 0.0f;
    // Column-major: Cᵀ [n, k] = B-view · A-viewᵀ.
    int ni = static_cast<int>(n), ki = static_cast<int>(k), mi = static_cast<int>(m);
    if (e == Elem::BF16) {
      PARAX_CUBLAS(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_T, ni, ki, mi, &one, B, CUDA_R_16BF, ni, A,
                                CUDA_R_16BF, ki, &zero, C, CUDA_R_16BF, ni, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      return Status::ok();
    }
    PARAX_CUBLAS(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, ni, ki, mi, &one, static_cast<const float *>(B), ni,
                             static_cast<const float *>(A), ki, &zero, static_cast<float *>(C), ni));
    return Status::ok();
  }

  /// gemm's column-major product through cuBLASLt with the bias epilogue,
  /// or (`gelu`) the GELU_BIAS one (x has W's type here; the bias has y's).
  /// Descriptors and the heuristic's algorithm are made once per shape and
  /// kept.
  struct LtPlan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo;
    ~LtPlan() {
      if (d) cublasLtMatrixLayoutDestroy(d);
      if (b) cublasLtMatrixLayoutDestroy(b);
      if (a) cublasLtMatrixLayoutDestroy(a);
      if (op) cublasLtMatmulDescDestroy(op);
    }
  };
  using LtKey = std::tuple<int64_t, int64_t, int64_t, int, int, int, bool>; // m, k, n, W, y, op, gelu
  std::map<LtKey, std::unique_ptr<LtPlan>> ltPlans;

  Status gemmWithBias(const void *x, int64_t m, int64_t k, const void *w, cudaDataType_t wType,
                      cublasOperation_t op, int ldw, int64_t n, void *y, cudaDataType_t yType, const void *bias,
                      bool gelu) {
    std::unique_ptr<LtPlan> &plan = ltPlans[LtKey{m, k, n, wType, yType, op, gelu}];
    if (!plan) {
      auto made = std::make_unique<LtPlan>();
      PARAX_CUBLAS(cublasLtMatmulDescCreate(&made->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      int32_t transa = op, transb = CUBLAS_OP_N;
      uint32_t epilogue = gelu ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
      PARAX_CUBLAS(cublasLtMatmulDescSetAttribute(made->op, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)));
      PARAX_CUBLAS(cublasLtMatmulDescSetAttribute(made->op, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)));
      PARAX_CUBLAS(
          cublasLtMatmulDescSetAttribute(made->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
      bool t = op != CUBLAS_OP_N;
      PARAX_CUBLAS(cublasLtMatrixLayoutCreate(&made->a, wType, t ? k : n, t ? n : k, ldw));
      PARAX_CUBLAS(cublasLtMatrixLayoutCreate(&made->b, wType, k, m, k));
      PARAX_CUBLAS(cublasLtMatrixLayoutCreate(&made->d, yType, n, m, n));
      cublasLtMatmulPreference_t preference = nullptr;
      PARAX_CUBLAS(cublasLtMatmulPreferenceCreate(&preference));
      uint64_t workspace = kLtWorkspace;
      cublasStatus_t set = cublasLtMatmulPreferenceSetAttribute(
          preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
      cublasLtMatmulHeuristicResult_t best;
      int found = 0;
      cublasStatus_t asked = set != CUBLAS_STATUS_SUCCESS
                                 ? set
                                 : cublasLtMatmulAlgoGetHeuristic(lt, made->op, made->a, made->b, made->d, made->d,
                                                                  preference, 1, &best, &found);
      cublasLtMatmulPreferenceDestroy(preference);
      PARAX_CUBLAS(asked);
      if (found == 0)
        return Status::error("cuBLASLt has no algorithm for a " + std::to_string(m) + "x" + std::to_string(k) + "x" +
                             std::to_string(n) + " GEMM with a bias");
      made->algo = best.algo;
      plan = std::move(made);
    }
    PARAX_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    const float one = 1.0f, zero = 0.0f;
    PARAX_CUBLAS(cublasLtMatmul(lt, plan->op, &one, w, plan->a, x, plan->b, &zero, y, plan->d, y, plan->d,
                                &plan->algo, ltWorkspace, kLtWorkspace, stream));
    return Status::ok();
  }
};

Status CudaExecutor::State::planGeluFusion() {
  const pxe::Stage &stage = host.stageProgram();
  int n = stage.instructions_size();
  skipped.assign(n, false);
  if (envIs("PARAX_CUDA_FUSE_GELU", "0")) return Status::ok();
  std::map<int32_t, int> uses = useCounts();
  std::optional<GeluProbe> probe; // run once, when a candidate appears
  for (int k = 0; k + 1 < n; ++k) {
    const pxe::Instruction &lin = stage.instructions(k), &act = stage.instructions(k + 1);
    if (opName(lin) != "linear" || lin.operands_size() != 3 || opName(act) != "gelu" ||
        act.operands(0) != lin.results(0) || uses[lin.results(0)] != 1 ||
        buffers[lin.results(0)].elem != buffers[act.results(0)].elem)
      continue;
    if (!probe) probe = probeGeluEpilogue(lt);
    GeluForm wanted = attrString(act.attrs(), "approximate") == "tanh" ? GeluForm::Tanh : GeluForm::Erf;
    if (probe->form != wanted) continue;
    geluInto[&lin] = act.results(0);
    skipped[k + 1] = true;
  }
  return Status::ok();
}

void CudaExecutor::State::planDecodeAttention() {
  const pxe::Stage &stage = host.stageProgram();
  if (!splitDecodeAttention) return;
  for (const pxe::Instruction &inst : stage.instructions()) {
    if (opName(inst) != "attention") continue;
    const DeviceBuffer &q = buffers[inst.operands(0)], &k = buffers[inst.operands(1)];
    int64_t S = q.shape[1], H = q.shape[2], D = q.shape[3], KH = k.shape[2];
    int64_t DV = buffers[inst.results(0)].shape[3]; // (v's first DV channels, with value_dim)
    std::vector<std::string> headAxes = attrStrings(inst.attrs(), "head_axes");
    // A KV head's query rows on this rank (the rank's heads of its group).
    int64_t group = (headAxes.empty() ? H : H * groupSize(headAxes)) / KH, rows = std::min(group, H) * S;
    DecodeTiles tiles;
    tiles.rows = static_cast<int>(std::min<int64_t>(rows, tiles.rows));
    auto bytes = [&] { return AttentionTiles::floats(tiles.rows, tiles.keys, D, DV) * 4; };
    while (bytes() > sharedOptIn && tiles.keys > 16) tiles.keys /= 2;
    while (bytes() > sharedOptIn && tiles.rows > 1) tiles.rows = (tiles.rows + 1) / 2;
    if (S <= 4 && bytes() <= sharedOptIn) decodeKeyTiles[&inst] = tiles;
  }
  // The concats that join a cache with new keys or values for one of them.
  std::map<int32_t, int> uses = useCounts();
  std::map<int32_t, std::pair<int, int>> readBy; // a buffer's (last) reader: instruction, operand
  for (int k = 0; k < stage.instructions_size(); ++k)
    for (int i = 0; i < stage.instructions(k).operands_size(); ++i)
      readBy[stage.instructions(k).operands(i)] = {k, i};
  for (int k = 0; k < stage.instructions_size(); ++k) {
    const pxe::Instruction &cat = stage.instructions(k);
    if (skipped[k] || opName(cat) != "concat" || cat.operands_size() != 2 || attrInt(cat.attrs(), "dim") != 1 ||
        buffers[cat.results(0)].shape.size() != 4 || uses[cat.results(0)] != 1 || !readBy.count(cat.results(0)))
      continue;
    auto [reader, operand] = readBy[cat.results(0)];
    const pxe::Instruction &attention = stage.instructions(reader);
    if ((operand != 1 && operand != 2) || skipped[reader] || !decodeKeyTiles.count(&attention)) continue;
    cacheParts[{&attention, operand}] = {cat.operands(0), cat.operands(1)};
    skipped[k] = true;
  }
}

// Why cuDNN's SDPA cannot run this attention or attention_grad ("" when it
// can; then `shape` is its shape). It takes bf16 over whole
// sequences: no decode step's run-time position or key-split tiles, no
// queries split over ranks (context parallelism's rows) or a ring's window,
// no sliding window or soft cap, the values' channels all read, and query
// head h reading key/value head h / (H / KH) as GQA does (a rank's query
// heads over replicated key/value heads read others: the own kernels).
std::string CudaExecutor::State::cudnnRefusal(const pxe::Instruction &inst, CudnnAttentionShape &shape) {
  const Attrs &a = inst.attrs();
  const bool grad = opName(inst) == "attention_grad";
  const DeviceBuffer &q = buffers[inst.operands(0)], &k = buffers[inst.operands(1)], &v = buffers[inst.operands(2)];
  const DeviceBuffer &y = grad ? buffers[inst.operands(3)] : buffers[inst.results(0)]; // (dy: y's shape)
  if (q.elem != Elem::BF16) return "fp32 (cuDNN's SDPA takes bf16 and fp16)";
  if (q.shape.size() != 4 || k.shape.size() != 4 || v.shape.size() != 4 || y.shape.size() != 4)
    return "not [B, S, H, D] tensors";
  if (!grad && inst.operands_size() != 3) return "a generation step's run-time position";
  if (decodeKeyTiles.count(&inst)) return "a decode step (split over the keys)";
  if (attrFlag(a, "ring")) return "a ring's window of keys";
  shape.window = attrInt(a, "window");
  if (shape.window != 0 && !attrFlag(a, "causal")) return "a sliding window without the causal mask";
  if (attrFloat(a, "softcap") != 0) return "a soft cap";
  shape.B = q.shape[0];
  shape.S = q.shape[1];
  shape.H = q.shape[2];
  shape.D = q.shape[3];
  shape.T = k.shape[1];
  shape.KH = k.shape[2];
  shape.DV = y.shape[3];
  shape.causal = attrFlag(a, "causal");
  shape.scale = static_cast<float>(attrFloat(a, "scale"));
  shape.bf16 = true;
  if (v.shape[3] != shape.DV) return "the values' channels read in part (value_dim)";
  SequenceRows rows = rowsOf(a, shape.S);
  if (rows.pieces != 1 || rows.start != 0 || rows.stride != 1) return "queries split over ranks";
  if (shape.KH <= 0 || shape.H % shape.KH != 0) return "query heads not a multiple of the key/value heads";
  std::vector<std::string> headAxes = attrStrings(a, "head_axes");
  int64_t offset = headAxes.empty() ? 0 : groupIndex(headAxes) * shape.H;
  int64_t group = (headAxes.empty() ? shape.H : shape.H * groupSize(headAxes)) / shape.KH;
  for (int64_t h = 0; h < shape.H; ++h)
    if ((offset + h) / group != h / (shape.H / shape.KH))
      return "a rank's query heads over every key/value head";
  if (shape.D % 8 != 0 || shape.DV % 8 != 0 || shape.D > 256 || shape.DV > 256)
    return "head widths " + std::to_string(shape.D) + "/" + std::to_string(shape.DV) +
           " (cuDNN: multiples of 8, at most 256)";
  return "";
}

void CudaExecutor::State::planCudnnAttention() {
  int total = 0, taken = 0;
  std::string refused; // the first op cuDNN does not run, and why
  for (const pxe::Instruction &inst : host.stageProgram().instructions()) {
    std::string op = opName(inst);
    if (op != "attention" && op != "attention_grad") continue;
    ++total;
    CudnnAttentionShape shape;
    std::string why = cudnnRefusal(inst, shape);
    if (why.empty() && !cudnnAttentionOn) why = "PARAX_ATTENTION=" + std::string(std::getenv("PARAX_ATTENTION"));
    if (why.empty() && !cudnn) {
      StatusOr<void *> handle = CudnnAttention::createHandle(stream);
      if (handle.isOk())
        cudnn = handle.value();
      else
        why = handle.status().message();
    }
    if (why.empty()) {
      StatusOr<std::unique_ptr<CudnnAttention>> built = CudnnAttention::create(cudnn, shape, op == "attention_grad");
      if (built.isOk()) {
        cudnnAttention[&inst] = std::move(built.value());
        ++taken;
        continue;
      }
      why = built.status().message();
    }
    if (refused.empty()) refused = op + ": " + why;
  }
  if (total == 0) return;
  attentionPath = "attention: " + std::to_string(taken) + " of " + std::to_string(total) + " op(s) through cuDNN" +
                  (taken ? " " + CudnnAttention::version() : "") +
                  (refused.empty() ? "" : ", the rest on parax's kernels (" + refused + ")");
}

// An attention or attention_grad through its cuDNN graphs. The backward's
// graph reads the forward's output and row statistics, which parax's
// attention_grad does not receive: it runs the forward graph again first,
// into scratch.
Status CudaExecutor::State::runCudnnAttention(const pxe::Instruction &inst, const CudnnAttention &graphs) {
  Pick in{buffers, inst.operands()}, out{buffers, inst.results()};
  auto up = [](int64_t bytes) { return (bytes + 255) / 256 * 256; }; // (each piece 256-byte aligned)
  const int64_t work = up(graphs.workspaceBytes()), y = up(graphs.outputBytes()), stats = up(graphs.statsBytes());
  Status st = ensureScratch(static_cast<size_t>((work + y + stats) / 4 + 64));
  if (!st.isOk()) return st;
  char *base = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(scratch) + 255) / 256 * 256);
  void *workspace = work ? base : nullptr;
  if (opName(inst) == "attention")
    return graphs.forward(cudnn, in(0).data, in(1).data, in(2).data, out().data, nullptr, workspace);
  void *output = base + work;
  float *rowStats = reinterpret_cast<float *>(base + work + y);
  st = graphs.forward(cudnn, in(0).data, in(1).data, in(2).data, output, rowStats, workspace);
  if (!st.isOk()) return st;
  return graphs.backward(cudnn, in(0).data, in(1).data, in(2).data, output, rowStats, in(3).data, out(0).data,
                         out(1).data, out(2).data, workspace);
}

// Whether cuDNN ran `inst` (its graphs planned, and their run succeeded). A
// graph that fails when it runs sends its op to parax's kernels from then
// on, which attentionPath reports.
bool CudaExecutor::State::ranCudnnAttention(const pxe::Instruction &inst) {
  auto planned = cudnnAttention.find(&inst);
  if (planned == cudnnAttention.end()) return false;
  Status st = runCudnnAttention(inst, *planned->second);
  if (st.isOk()) return true;
  (void)cudaGetLastError();
  cudnnAttention.erase(planned);
  attentionPath += "; " + opName(inst) + " failed in cuDNN (" + st.message() + "): on parax's kernels since";
  return false;
}

// A cache_update of a KV cache the steps write in place (an input only it
// reads) writes into the input's memory: its result is that memory, so the
// step moves only the new rows and the input holds the cache afterwards.
void CudaExecutor::State::aliasCacheUpdates() {
  for (const pxe::Instruction &inst : host.stageProgram().instructions()) {
    bool ring = inst.kind() == pxe::OP_RING_CACHE_UPDATE; // (its second result, the ring)
    if ((inst.kind() != pxe::OP_CACHE_UPDATE && !ring) || !host.isCacheState(inst.operands(0))) continue;
    DeviceBuffer &result = buffers[inst.results(ring ? 1 : 0)];
    result.data = buffers[inst.operands(0)].data;
    result.aliased = true;
    ++cacheWritesInPlace;
  }
}

// A parameter by its box, a hoisted move's result by its name (`moves`).
std::string CudaExecutor::State::valueName(int32_t id, const std::map<int32_t, std::string> &moves) const {
  if (auto it = moves.find(id); it != moves.end()) return it->second;
  const pxe::Buffer &b = host.stageProgram().buffers(id);
  std::string name = "param " + b.param_name() + " dtype " + std::to_string(b.dtype()) + " at";
  for (int64_t o : b.param_offset()) name += " " + std::to_string(o);
  name += " shape";
  for (int64_t d : b.shape()) name += " " + std::to_string(d);
  for (const pxe::AxisList &split : b.split()) {
    name += " /";
    for (const std::string &axis : split.axes()) name += " " + axis;
  }
  name += " partial";
  for (const std::string &axis : b.partial()) name += " " + axis;
  return name;
}

// The host executor has run the moves of parameters once (exact in any
// storage dtype: they only copy values); their results are uploaded, or
// taken from the lender (another program of this rank: a microbatch's, a
// prefill's) where it holds the same move of the same parameters.
Status CudaExecutor::State::hoistInvariants() {
  std::map<int32_t, std::string> moves; // result id -> name
  for (int k = 0; k < host.stageProgram().instructions_size(); ++k) {
    if (!host.hoisted(k)) continue;
    const pxe::Instruction &inst = host.stageProgram().instructions(k);
    std::string computed = opName(inst) + "(";
    for (int32_t id : inst.operands()) computed += valueName(id, moves) + ";";
    computed += ")";
    std::map<std::string, std::string> attrs; // (in key order: a protobuf map has none)
    for (const auto &[key, value] : inst.attrs()) attrs[key] = value.SerializeAsString();
    for (const auto &[key, value] : attrs) computed += " " + key + "=" + value;
    for (int r = 0; r < inst.results_size(); ++r) {
      int32_t id = inst.results(r);
      std::string name = computed + " result " + std::to_string(r) + " dtype " +
                         std::to_string(host.stageProgram().buffers(id).dtype()) + " shape";
      for (int64_t d : host.stageProgram().buffers(id).shape()) name += " " + std::to_string(d);
      moves[id] = name;
      hoistedByName[name] = id;
      if (lender) {
        auto theirs = lender->hoistedByName.find(name);
        if (theirs != lender->hoistedByName.end()) {
          buffers[id].data = lender->buffers[theirs->second].data;
          buffers[id].aliased = true;
          ++sharedMoves;
          continue;
        }
      }
      Status st = allocate(&buffers[id].data, buffers[id].bytes(), nameOf(id));
      if (!st.isOk()) return st;
      st = upload(id);
      if (!st.isOk()) return failed(k, "run once at prepare", st);
    }
    skipped[k] = true;
    ++hoisted;
  }
  return Status::ok();
}

Status CudaExecutor::State::placeTemporaries() {
  TemporaryLives lives = temporaryLifetimes();
  placed = lives.ids;
  const bool own = envIs("PARAX_CUDA_SHARE_TEMPORARIES", "0"); // one allocation each
  const bool poison = envIs("PARAX_CUDA_POISON_DEAD", "1");
  resultsInPlace(lives);
  arrangeTemporaries(lives, own);
  reportMemoryPeak(lives);
  Status st = allocateTemporaries(lives, own, poison);
  if (!st.isOk() || ranges.empty()) return st;
  return placeHeldTemporaries(lives, own, poison);
}

// Whether a temporary is live across the start of a range (kept between
// ranges).
bool CudaExecutor::State::crossesRange(const TemporaryLives &lives, int32_t id) const {
  for (const PipelineRange &r : ranges)
    if (r.begin > 0 && lives.first[id] < r.begin && lives.last[id] >= r.begin) return true;
  return false;
}

// Each temporary's first and last instruction: a collective's operands and
// results until its first result is read; an output to the step's end; a
// gradient the device optimizer takes right after its range (or its
// instruction) no longer; what begins or ends a range for the whole
// program (pinned).
CudaExecutor::State::TemporaryLives CudaExecutor::State::temporaryLifetimes() {
  const pxe::Stage &stage = host.stageProgram();
  const int n = stage.instructions_size(), count = stage.buffers_size();
  TemporaryLives lives;
  for (const pxe::Buffer &b : stage.buffers())
    if (b.role() == pxe::TEMPORARY && !buffers[b.id()].data) lives.ids.push_back(b.id());
  std::vector<int> &first = lives.first, &last = lives.last;
  first.assign(count, n);
  last.assign(count, -1);
  auto live = [&](int32_t id, int k) {
    first[id] = std::min(first[id], k);
    last[id] = std::max(last[id], k);
  };
  std::vector<int> firstRead(count, n); // after its writer
  for (int k = 0; k < n; ++k) {
    if (skipped[k]) continue;
    const pxe::Instruction &inst = stage.instructions(k);
    for (int32_t id : readsOf(inst)) {
      live(id, k);
      firstRead[id] = std::min(firstRead[id], k);
    }
    for (int32_t id : inst.results()) live(id, k);
    if (auto fused = geluInto.find(&inst); fused != geluInto.end()) live(fused->second, k);
  }
  for (int k = 0; k < n; ++k) {
    const pxe::Instruction &inst = stage.instructions(k);
    if (skipped[k] || !isCollective(opName(inst))) continue;
    int until = n; // where the compute stream has surely waited for it
    for (int32_t id : inst.results()) until = std::min(until, firstRead[id]);
    for (const auto *list : {&inst.operands(), &inst.results()})
      for (int32_t id : *list) last[id] = std::max(last[id], until);
  }
  lives.lastUse = last; // (an output's, before it is kept past the run)
  for (int32_t id : stage.outputs()) last[id] = n; // read after the step
  // A gradient the device optimizer takes (adds to its sum) right after the
  // backward range that writes it is not kept past that range (not one
  // copy a microbatch in flight); nor poisoned at its end (it is read
  // after it).
  lives.takenAfterRange.assign(count, false);
  for (int k = 0; gradientsBound && k < stage.outputs_size() && k < stage.output_grads_size(); ++k) {
    int32_t id = stage.outputs(k);
    if (stage.output_grads(k).empty() || stage.buffers(id).role() != pxe::TEMPORARY) continue;
    for (const PipelineRange &r : ranges)
      if (first[id] >= r.begin && first[id] < r.end && r.backward) {
        last[id] = r.end - 1;
        lives.takenAfterRange[id] = true;
      }
  }
  // Without ranges, every microbatch's run adds a gradient the device
  // optimizer takes to its sum right after the instruction that writes it
  // (streamGradients; Megatron-LM accumulates into its main_grad buffer
  // likewise): no memory past its last use then, instead of every
  // gradient held to the backward pass's end. Not a collective's result
  // (added once the compute stream waits for it), one an instruction
  // fused into the one before writes (skipped), nor with
  // PARAX_CUDA_OVERLAP=0 (added after the run).
  if (gradientsBound && ranges.empty() && overlap) {
    std::vector<int> writer(count, -1); // the last instruction writing each
    for (int j = 0; j < n; ++j)
      for (int32_t r : stage.instructions(j).results()) writer[r] = j;
    for (int k = 0; k < stage.outputs_size() && k < stage.output_grads_size(); ++k) {
      int32_t id = stage.outputs(k), w = writer[id];
      if (stage.output_grads(k).empty() || stage.buffers(id).role() != pxe::TEMPORARY) continue;
      if (w >= 0 && !skipped[w] && !isCollective(opName(stage.instructions(w)))) last[id] = lives.lastUse[id];
    }
  }
  // Ranges (holdActivations): what begins and ends a range -- received
  // ahead, or sent in the next step's group -- gets memory of its own in
  // each set, live through the whole program: a step's group receives
  // into one microbatch's set while it sends from another's (or the same
  // set's, a microbatch later), and what it sends must not be what it
  // receives into.
  lives.pinned.assign(count, false);
  for (const PipelineRange &r : ranges) {
    int k = pastLeadingReceives(r.begin, r.end);
    for (int j = r.begin; j < k; ++j)
      for (int32_t id : stage.instructions(j).results()) lives.pinned[id] = true;
    int lastReceive = k - 1;
    for (int j = k; j < r.end; ++j)
      if (!skipped[j] && opName(stage.instructions(j)) == "recv") lastReceive = j;
    for (int j = lastReceive + 1; j < r.end; ++j)
      if (!skipped[j] && opName(stage.instructions(j)) == "send")
        for (int32_t id : stage.instructions(j).operands()) lives.pinned[id] = true;
  }
  for (int32_t id = 0; id < count; ++id)
    if (lives.pinned[id] && first[id] <= last[id]) {
      first[id] = 0;
      last[id] = n;
    }
  return lives;
}

// An elementwise result takes the memory of an operand of its shape that it
// is the last reader of (each thread reads its element before it writes
// it; rope rotates each pair of a row in one thread): a gradient's two
// parts summed, a residual added, queries rotated, the gradient through a
// SwiGLU, sigmoid or GELU written over the last of its operands it reads
// (the up-projection's, or dy); a reshape's result, of an operand it is
// the last reader of. Not an operand a collective reads (it may still be
// in flight on its own stream), nor one the optimizer takes after its
// range, nor one kept between ranges. hostOf[result] = that operand;
// guestOf the reverse. (PARAX_CUDA_IN_PLACE=0: none, for side-by-side
// checks.) Then a temporary no step touches (a fused concat's or linear's
// result) gets no memory.
void CudaExecutor::State::resultsInPlace(TemporaryLives &lives) {
  const pxe::Stage &stage = host.stageProgram();
  const int n = stage.instructions_size(), count = stage.buffers_size();
  const std::vector<int> &first = lives.first, &last = lives.last;
  lives.hostOf.assign(count, -1);
  lives.guestOf.assign(count, -1);
  lives.reshaped.assign(count, false); // in place as a reshape's result
  std::vector<bool> temporary(count, false), sentOrReduced(count, false);
  for (int32_t id : lives.ids) temporary[id] = true;
  for (int k = 0; k < n; ++k)
    if (!skipped[k] && isCollective(opName(stage.instructions(k))))
      for (int32_t id : stage.instructions(k).operands()) sentOrReduced[id] = true;
  auto mayShare = [&](int32_t id) {
    return temporary[id] && first[id] <= last[id] && !lives.pinned[id] && !crossesRange(lives, id) &&
           !lives.takenAfterRange[id];
  };
  const bool inPlaceOff = envIs("PARAX_CUDA_IN_PLACE", "0"); // (for side-by-side checks)
  for (int k = 0; k < n && !inPlaceOff; ++k) {
    const pxe::Instruction &inst = stage.instructions(k);
    if (skipped[k] || inst.results_size() != 1 ||
        !among(opName(inst), {"add", "mul", "silu", "sigmoid", "gelu", "swiglu", "rope", "reshape", "swiglu_grad",
                           "sigmoid_grad", "gelu_grad"}))
      continue;
    int32_t result = inst.results(0);
    if (!mayShare(result) || first[result] != k) continue;
    bool reshape = opName(inst) == "reshape"; // (its result is then its operand's bytes: no copy)
    for (int32_t id : inst.operands()) {
      if (!mayShare(id) || last[id] != k || first[id] >= k || sentOrReduced[id] || lives.guestOf[id] >= 0 ||
          buffers[id].elem != buffers[result].elem ||
          (reshape ? buffers[id].numel() != buffers[result].numel() : buffers[id].shape != buffers[result].shape))
        continue;
      lives.hostOf[result] = id;
      lives.guestOf[id] = result;
      lives.reshaped[result] = reshape;
      break;
    }
  }
  lives.untouched.assign(count, false); // by a step: no memory
  for (int32_t id : lives.ids)
    if (lives.first[id] > lives.last[id]) {
      lives.untouched[id] = true;
      lives.first[id] = lives.last[id] = 0;
    }
}

// The shared temporaries (a result in place: in its host's memory, not
// listed) and the held ones (kept between ranges), with their lifetimes;
// the shared ones placed in one arena.
BufferPlan CudaExecutor::State::collectTemporaries(TemporaryLives &lives, bool own) {
  lives.shared.clear(), lives.lifetimes.clear(), held.clear(), lives.heldLifetimes.clear();
  inPlace = 0;
  for (int32_t id : lives.ids) {
    if (!ranges.empty() && !lives.untouched[id] && (lives.pinned[id] || crossesRange(lives, id))) {
      held.push_back(id);
      lives.heldLifetimes.push_back({buffers[id].bytes(), lives.first[id], lives.last[id]});
    } else if (lives.hostOf[id] >= 0) {
      ++inPlace;
    } else {
      lives.shared.push_back(id);
      lives.lifetimes.push_back(
          {lives.untouched[id] ? 0 : buffers[id].bytes(), lives.first[id], lives.last[lives.tailOf(id)]});
    }
  }
  return own ? BufferPlan{} : planBuffers(lives.lifetimes, 256);
}

// The greedy placement is not optimal: the buffers are placed again with
// only the reshapes in place, and with none, and the smallest arena kept
// (the first of equals).
void CudaExecutor::State::arrangeTemporaries(TemporaryLives &lives, bool own) {
  temporaries = collectTemporaries(lives, own);
  const std::vector<int32_t> hosts = lives.hostOf;
  auto only = [&](bool keepElementwise, bool keepReshapes) {
    for (size_t id = 0; id < hosts.size(); ++id) {
      bool keep = hosts[id] >= 0 && (lives.reshaped[id] ? keepReshapes : keepElementwise);
      lives.hostOf[id] = keep ? hosts[id] : -1;
      if (hosts[id] >= 0) lives.guestOf[hosts[id]] = keep ? static_cast<int32_t>(id) : -1;
    }
  };
  int bestChoice = 0;
  for (int choice = 1; choice < 3 && inPlace > 0; ++choice) {
    only(false, choice == 1);
    BufferPlan other = collectTemporaries(lives, own);
    if (other.arenaBytes < temporaries.arenaBytes) temporaries = other, bestChoice = choice;
  }
  if (bestChoice != 2) { // (choice 2, none in place, is the last collected)
    only(bestChoice == 0, true);
    temporaries = collectTemporaries(lives, own);
  }
}

// PARAX_CUDA_MEMORY_PEAK=1: what is live where the shared temporaries peak
// (the arena's lower bound), the largest first -- for setting a memory
// model beside the runtime.
void CudaExecutor::State::reportMemoryPeak(const TemporaryLives &lives) {
  peakReport.clear();
  if (!envIs("PARAX_CUDA_MEMORY_PEAK", "1") || temporaries.peakInstruction < 0) return;
  const pxe::Stage &stage = host.stageProgram();
  const int n = stage.instructions_size(), at = temporaries.peakInstruction;
  const std::vector<BufferLifetime> &lifetimes = lives.lifetimes;
  auto opOf = [&](int k) { return k < n ? opName(stage.instructions(k)) : std::string("the run's end"); };
  std::vector<size_t> live;
  for (size_t i = 0; i < lifetimes.size(); ++i)
    if (lifetimes[i].bytes && lifetimes[i].first <= at && at <= lifetimes[i].last) live.push_back(i);
  std::stable_sort(live.begin(), live.end(),
                   [&](size_t a, size_t b) { return lifetimes[a].bytes > lifetimes[b].bytes; });
  peakReport = "temporaries peak at instruction " + std::to_string(at) + " (" + opOf(at) + "): " +
               std::to_string(temporaries.peakLiveBytes) + " bytes live (each 256-byte aligned) in " +
               std::to_string(live.size()) + " buffers; the largest:";
  for (size_t j = 0; j < live.size() && j < 12; ++j) {
    const BufferLifetime &l = lifetimes[live[j]];
    peakReport += "\n  " + std::to_string(l.bytes) + " bytes: buffer " + std::to_string(lives.shared[live[j]]) +
                  ", from instruction " + std::to_string(l.first) + " (" + opOf(l.first) + ") to " +
                  std::to_string(l.last) + " (" + opOf(l.last) + ")";
  }
}

// The arena (or the lender's, when it fits: the programs run one after the
// other; or one allocation a temporary), each shared temporary and the
// results in its memory placed in it, and the poisoning after each last
// use.
Status CudaExecutor::State::allocateTemporaries(const TemporaryLives &lives, bool own, bool poison) {
  const int n = host.stageProgram().instructions_size();
  const std::vector<int32_t> &shared = lives.shared;
  if (poison) poisonAfter.assign(n, {});
  if (own) {
    for (int32_t id : shared) {
      Status st = allocate(&buffers[id].data, buffers[id].bytes(), nameOf(id));
      if (!st.isOk()) return st;
    }
  } else if (temporaries.arenaBytes > 0) {
    if (lender && lender->arena && temporaries.arenaBytes <= lender->temporaries.arenaBytes) {
      arena = lender->arena; // the programs run one after the other
      ownsArena = false;
    } else {
      Status st = allocate(&arena, temporaries.arenaBytes,
                           "the step's temporaries (" + std::to_string(shared.size()) + " buffers sharing one block)");
      if (!st.isOk()) return st;
    }
  }
  for (size_t j = 0; j < shared.size(); ++j) {
    int32_t tail = lives.tailOf(shared[j]);
    if (!own) {
      buffers[shared[j]].data = static_cast<char *>(arena) + temporaries.offsets[j];
      buffers[shared[j]].inArena = true;
    }
    for (int32_t id = lives.guestOf[shared[j]]; id >= 0; id = lives.guestOf[id]) {
      buffers[id].data = buffers[shared[j]].data;
      buffers[id].inArena = !own;
      buffers[id].aliased = own;
    }
    if (poison && lives.last[tail] < n && !lives.untouched[tail] && !lives.takenAfterRange[tail])
      poisonAfter[lives.last[tail]].push_back(tail);
  }
  return Status::ok();
}

// Pools (see `held`): each a block a slot (or one allocation a buffer), the
// held temporaries placed in it by their lifetimes; pool 0's slots also
// hold the inputs (slot 0: those prepare uploaded).
Status CudaExecutor::State::placeHeldTemporaries(const TemporaryLives &lives, bool own, bool poison) {
  const pxe::Stage &stage = host.stageProgram();
  const int n = stage.instructions_size();
  const std::vector<BufferLifetime> &heldLifetimes = lives.heldLifetimes;
  int chunks = 1;
  for (const PipelineRange &r : ranges) chunks = std::max(chunks, r.chunk + 1);
  std::vector<int> chunkOf(n, 0);
  for (const PipelineRange &r : ranges)
    for (int k = r.begin; k < r.end; ++k) chunkOf[k] = r.chunk;
  std::vector<int> usedBy(stage.buffers_size(), -1); // the chunk whose ranges alone touch it; -2: several
  for (int k = 0; k < n && chunks > 1; ++k) {
    if (skipped[k]) continue;
    std::vector<int32_t> ids = readsOf(stage.instructions(k));
    ids.insert(ids.end(), stage.instructions(k).results().begin(), stage.instructions(k).results().end());
    for (int32_t id : ids) usedBy[id] = usedBy[id] == -1 || usedBy[id] == chunkOf[k] ? chunkOf[k] : -2;
  }
  for (int32_t id : stage.outputs()) usedBy[id] = -2; // read after the microbatch's last range
  heldPool.clear();
  heldIndex.clear();
  const int pools = chunks > 1 ? 1 + chunks : 1;
  std::vector<std::vector<BufferLifetime>> poolLifetimes(pools);
  for (size_t j = 0; j < held.size(); ++j) {
    int pool = chunks > 1 && usedBy[held[j]] >= 0 ? 1 + usedBy[held[j]] : 0;
    heldPool.push_back(pool);
    heldIndex.push_back(static_cast<int>(poolLifetimes[pool].size()));
    poolLifetimes[pool].push_back(heldLifetimes[j]);
  }
  if (static_cast<int>(poolSlots.size()) != pools) poolSlots.assign(pools, sets);
  poolSlots[0] = sets;
  std::vector<int32_t> inputs;
  for (const pxe::Buffer &b : stage.buffers())
    if (b.role() == pxe::INPUT && !host.isCacheState(b.id())) inputs.push_back(b.id());
  keptBytes = 0;
  poolMemory.assign(pools, {});
  for (int p = 0; p < pools; ++p) {
    BufferPlan plan = planBuffers(poolLifetimes[p], 256);
    poolMemory[p].assign(poolSlots[p], {});
    for (int k = 0; k < poolSlots[p]; ++k) {
      std::string where = p == 0 ? "activation set " + std::to_string(k)
                                 : "chunk " + std::to_string(p - 1) + "'s activation slot " + std::to_string(k);
      auto take = [&](size_t bytes, const std::string &what) -> StatusOr<char *> {
        void *data = nullptr;
        Status st = allocate(&data, bytes, what + " of " + where);
        if (!st.isOk()) return st;
        setAllocations.push_back(data);
        keptBytes += bytes;
        return static_cast<char *>(data);
      };
      char *block = nullptr;
      if (!own && plan.arenaBytes > 0) {
        StatusOr<char *> got = take(plan.arenaBytes, "the temporaries kept between ranges");
        if (!got.isOk()) return got.status();
        block = got.value();
      }
      for (size_t j = 0; j < poolLifetimes[p].size(); ++j) {
        StatusOr<char *> got = own ? take(poolLifetimes[p][j].bytes, "a kept temporary") : block + plan.offsets[j];
        if (!got.isOk()) return got.status();
        poolMemory[p][k].push_back(got.value());
      }
      for (int32_t id : p == 0 ? inputs : std::vector<int32_t>{}) {
        StatusOr<char *> got = k == 0 ? static_cast<char *>(buffers[id].data) : take(buffers[id].bytes(), nameOf(id));
        if (!got.isOk()) return got.status();
        if (k == 0) keptBytes += buffers[id].bytes();
        poolMemory[p][k].push_back(got.value());
      }
    }
  }
  for (size_t j = 0; j < heldLifetimes.size(); ++j) {
    buffers[held[j]].inArena = true; // (not an allocation of its own)
    if (poison && heldLifetimes[j].last < n) poisonAfter[heldLifetimes[j].last].push_back(held[j]);
  }
  for (size_t i = 0; i < inputs.size(); ++i) { // after pool 0's temporaries in each slot
    held.push_back(inputs[i]);
    heldPool.push_back(0);
    heldIndex.push_back(static_cast<int>(poolLifetimes[0].size() + i));
  }
  currentMicro = 0;
  for (size_t j = 0; j < held.size(); ++j) buffers[held[j]].data = poolMemory[heldPool[j]][0][heldIndex[j]];
  return Status::ok();
}

CudaExecutor::CudaExecutor() : s_(std::make_unique<State>()) {}
CudaExecutor::~CudaExecutor() = default;
int CudaExecutor::stage() const { return s_->host.stage(); }
size_t CudaExecutor::cacheWritesInPlace() const { return s_->cacheWritesInPlace; }
size_t CudaExecutor::sharedParameters() const { return s_->sharedParameters; }
size_t CudaExecutor::offeredParameters() const { return s_->offeredParameters; }
size_t CudaExecutor::sharedCaches() const { return s_->sharedCaches; }
bool CudaExecutor::borrowsTemporaries() const { return !s_->ownsArena; }
size_t CudaExecutor::instructionCount() const { return s_->host.instructionCount(); }

Status CudaExecutor::prepare(const pxe::Executable &exe, int rank, NcclCommunicator *comm,
                             const Checkpoint &weights, const std::vector<Tensor> &inputs,
                             int device, const CudaExecutor *share, Share what) {
  if (cudaDeviceCount() == 0)
    return Status::error("no CUDA device");
  PARAX_CUDA(cudaSetDevice(device));
  State &s = *s_;
  PARAX_CUDA(cudaDeviceGetAttribute(&s.sharedOptIn, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  PARAX_CUDA(cudaDeviceGetAttribute(&s.multiprocessors, cudaDevAttrMultiProcessorCount, device));
  s.exe = &exe;
  s.comm = comm;
  PARAX_CUDA(cudaStreamCreate(&s.stream));
  PARAX_CUBLAS(cublasCreate(&s.blas));
  PARAX_CUBLAS(cublasSetStream(s.blas, s.stream));
  PARAX_CUBLAS(cublasLtCreate(&s.lt));
  Status st = Status::ok();
  if (share) { // the two programs never run at once: one set of workspaces
    s.lender = share->s_.get();
    s.ltWorkspace = s.lender->ltWorkspace;
    s.blasWorkspace = s.lender->blasWorkspace;
    s.ownsWorkspaces = false;
  } else {
    st = s.allocate(&s.ltWorkspace, kLtWorkspace, "cuBLASLt's workspace");
    if (st.isOk()) st = s.allocate(&s.blasWorkspace, kBlasWorkspace, "cuBLAS's workspace");
    if (!st.isOk()) return st;
  }
  // The attention kernels may use all the shared memory a block can opt
  // into; set once here (not while a CUDA graph is being captured).
  st = allowSharedMemory(s.sharedOptIn, attentionTensorCoreKernel, attentionKernel<float>,
                         attentionKernel<__nv_bfloat16>, decodeAttentionKernel<float>,
                         decodeAttentionKernel<__nv_bfloat16>, attentionGradStatsKernel<float>,
                         attentionGradStatsKernel<__nv_bfloat16>, attentionGradKeyValueKernel<float>,
                         attentionGradKeyValueKernel<__nv_bfloat16>, attentionGradQueryKernel<float>,
                         attentionGradQueryKernel<__nv_bfloat16>, attentionGradTensorCoreKeyValueKernel,
                         attentionGradTensorCoreQueryKernel);
  if (!st.isOk()) return st;
  PARAX_CUBLAS(cublasSetWorkspace(s.blas, s.blasWorkspace, kBlasWorkspace));
  s.graphs = !envIs("PARAX_CUDA_GRAPHS", "0");
  s.fewRowsKernel = !envIs("PARAX_FEW_ROWS", "0");
  s.overlap = !envIs("PARAX_CUDA_OVERLAP", "0");
  const char *experts = std::getenv("PARAX_EXPERTS");
  s.expertsPath = experts ? experts : "";
  if (!s.expertsPath.empty() && s.expertsPath != "grouped" && s.expertsPath != "per-expert")
    return Status::error("PARAX_EXPERTS must be grouped or per-expert, got '" + s.expertsPath + "'");
  s.tensorCoreAttention = !envIs("PARAX_ATTENTION", "cuda-cores");
  s.splitDecodeAttention = !envIs("PARAX_ATTENTION", "no-split");
  s.cudnnAttentionOn = !envIs("PARAX_ATTENTION", "kernels") && !envIs("PARAX_ATTENTION", "cuda-cores");
  // Each parameter goes to the device as soon as the host has read it (and
  // leaves the host then, unless a move of parameters reads it at prepare):
  // the host never holds every weight at once.
  Executor::LoadHooks hooks;
  hooks.keepParameters = s.keepParameters;
  hooks.parameterLoaded = [&s](int32_t id) -> Status {
    if (s.buffers.empty()) s.buffers.resize(s.host.stageProgram().buffers_size()); // the stage is known now
    s.describe(id);
    Status st = s.allocate(&s.buffers[id].data, s.buffers[id].bytes(), s.nameOf(id));
    if (!st.isOk()) return st;
    st = s.upload(id);
    if (!st.isOk()) return st;
    PARAX_CUDA(cudaStreamSynchronize(s.stream)); // done reading the host copy
    return Status::ok();
  };
  if (share) // a parameter `share` holds in the same box: its memory
    hooks.alreadyHeld = [&s, share, headWeights = std::vector<bool>()](int32_t id) mutable {
      if (s.buffers.empty()) s.buffers.resize(s.host.stageProgram().buffers_size());
      if (headWeights.empty()) headWeights = s.readOnlyAsHeadWeights();
      const pxe::Buffer &mine = s.host.stageProgram().buffers(id);
      ++s.offeredParameters;
      auto theirs = share->s_->heldParameter(mine, s.host, headWeights[id]);
      if (!theirs) return false;
      s.describe(id);
      const DeviceBuffer &lent = share->s_->buffers[theirs->id];
      s.buffers[id].data = static_cast<char *>(lent.data) + theirs->offset * elemBytes(lent.elem);
      s.buffers[id].blockStride = theirs->blockStride;
      s.buffers[id].aliased = true;
      ++s.sharedParameters;
      return true;
    };
  st = s.host.prepare(exe, rank, nullptr, weights, inputs, &hooks);
  if (!st.isOk()) return st;
  for (const pxe::Instruction &inst : s.host.stageProgram().instructions()) {
    s.graphs = s.graphs && s.capturable(inst);
    s.collectives += isCollective(opName(inst));
    // A training step keeps its linears on cuBLAS: the few-row kernel is
    // for decode steps, and a training check's tolerance after optimizer
    // steps is the cuBLAS order's (see docs/cuda.md).
    if (inst.kind() == pxe::OP_LINEAR_WEIGHT_GRAD) s.fewRowsKernel = false;
  }
  s.buffers.resize(s.host.stageProgram().buffers_size()); // a stage without parameters
  for (const pxe::Buffer &proto : s.host.stageProgram().buffers()) {
    if (proto.role() == pxe::PARAMETER) continue; // described and uploaded as loaded
    s.describe(proto.id());
    // Temporaries are placed once hoisting and fusion are known.
    if (proto.role() != pxe::INPUT) continue;
    DeviceBuffer &d = s.buffers[proto.id()];
    if (share && what == Share::WeightsAndCaches && s.host.isCacheState(proto.id())) { // `share`'s cache
      int32_t theirs = share->s_->sameBox(proto);
      if (theirs < 0 || !share->s_->host.isCacheState(theirs))
        return Status::error("input #" + std::to_string(proto.input_index()) +
                             ": the other program keeps no KV cache of this rank's box of it (plan both alike)");
      d.data = share->s_->buffers[theirs].data;
      d.aliased = true;
      ++s.sharedCaches;
      continue;
    }
    st = s.allocate(&d.data, d.bytes(), s.nameOf(proto.id()));
    if (!st.isOk()) return st;
    if (!s.host.hostBuffers()[proto.id()].hasValues()) { // a KV cache the steps write: zeros at first
      PARAX_CUDA(cudaMemsetAsync(d.data, 0, d.bytes(), s.stream));
      continue;
    }
    st = s.upload(proto.id());
    if (!st.isOk()) return st;
  }
  s.aliasCacheUpdates();
  st = s.planGeluFusion();
  if (!st.isOk()) return st;
  s.resolveKernels();
  for (const pxe::Instruction &inst : s.host.stageProgram().instructions()) {
    if (opName(inst) != "rope") continue;
    StatusOr<std::vector<double>> frequencies = ropeInverseFrequencies(inst.attrs());
    if (!frequencies.isOk()) return frequencies.status();
    double *device = nullptr;
    st = s.allocate(&device, frequencies.value().size() * sizeof(double), "rope frequencies");
    if (!st.isOk()) return st;
    s.ropeFrequencies[&inst] = device;
    PARAX_CUDA(cudaMemcpy(device, frequencies.value().data(), frequencies.value().size() * sizeof(double),
                          cudaMemcpyHostToDevice));
  }
  st = s.hoistInvariants();
  if (!st.isOk()) return st;
  s.planDecodeAttention();
  s.planCudnnAttention();
  st = s.placeTemporaries();
  if (!st.isOk()) return st;
  st = s.sync(); // the uploads have finished reading the host copies
  if (!st.isOk()) return st;
  s.host.releaseHostCopies(s.keepParameters); // the fp32 host copy of every weight, among them (unless kept)
  return Status::ok();
}

Status CudaExecutor::setInputs(const std::vector<Tensor> &inputs) {
  State &s = *s_;
  Status st = s.host.setInputs(inputs);
  if (!st.isOk()) return st;
  for (const pxe::Buffer &b : s.host.stageProgram().buffers())
    if (b.role() == pxe::INPUT && inputs[b.input_index()].hasValues()) { // (a cache given without values keeps its own)
      st = s.upload(b.id());
      if (!st.isOk()) return st;
    }
  return Status::ok();
}

std::vector<Tensor> CudaExecutor::outputs() const {
  std::vector<Tensor> out;
  const auto &ids = s_->host.stageProgram().outputs();
  for (int k = 0; k < ids.size(); ++k) {
    if (k < static_cast<int>(s_->boundOutput.size()) && s_->boundOutput[k]) { // summed on the device
      out.emplace_back();
      continue;
    }
    const DeviceBuffer &d = s_->buffers[ids[k]];
    Tensor t = takeSpare(s_->spare, d.elem == Elem::I32, d.shape); // (every value is written below)
    if (d.elem == Elem::I32)
      cudaMemcpy(t.i.data(), d.data, d.numel() * 4, cudaMemcpyDeviceToHost);
    else
      (void)copyToHost(t.f.data(), d.data, d.numel(), d.elem, s_->stream); // run() has reported errors
    out.push_back(std::move(t));
  }
  return out;
}

void CudaExecutor::recycle(std::vector<Tensor> results) {
  s_->spare = recyclable(std::move(results));
}

StatusOr<std::vector<int32_t>> CudaExecutor::greedyTokens() {
  State &s = *s_;
  const pxe::Stage &stage = s.host.stageProgram();
  if (stage.outputs_size() == 0) return Status::error("greedy tokens: this stage returns nothing");
  const DeviceBuffer &logits = s.buffers[stage.outputs(0)];
  if (logits.elem == Elem::I32 || logits.shape.empty())
    return Status::error("greedy tokens: the first result is not logits [..., vocab]");
  int64_t vocab = logits.shape.back(), rows = logits.numel() / vocab;
  if (s.tokenRows < rows) {
    if (s.tokens) PARAX_CUDA(cudaFree(s.tokens));
    s.tokens = nullptr;
    Status st = s.allocate(&s.tokens, rows * sizeof(int32_t), "the greedy tokens");
    if (!st.isOk()) return st;
    s.tokenRows = rows;
  }
  Status st = withFloat(logits, [&](auto t) {
    using T = decltype(t);
    PARAX_LAUNCH(argmaxRowsKernel<T>, rows, kThreads, 0, s.stream)(logits.as<T>(), s.tokens, vocab);
    return Status::ok();
  });
  if (!st.isOk()) return st;
  std::vector<int32_t> tokens(rows);
  PARAX_CUDA(cudaMemcpyAsync(tokens.data(), s.tokens, rows * sizeof(int32_t), cudaMemcpyDeviceToHost, s.stream));
  st = s.sync();
  if (!st.isOk()) return st;
  return tokens;
}

Status CudaExecutor::State::issue(int begin, int end, bool holdSends, const std::vector<cudaEvent_t> *marks) {
  const pxe::Stage &stage = host.stageProgram();
  if (begin == 0) overlapped = 0;
  int from = begin; // (before: the leading receives, grouped)
  if (receivedAhead.erase({currentMicro, begin})) { // by exchange, with the held sends
    from = pastLeadingReceives(begin, end);
  } else if (!heldSends.empty()) { // (held only with a communicator)
    // The sends the range before held, with this range's leading receives:
    // one group (the sends' buffers may be this range's temporaries).
    from = pastLeadingReceives(begin, end);
    std::vector<NcclCommunicator::PointToPoint> receives;
    for (int k = begin; k < from; ++k)
      if (!skipped[k]) receives.push_back(pointToPoint(k));
    Status st = exchangeHeld(std::move(receives), begin);
    if (!st.isOk()) return st;
  }
  // With holdSends, the sends after the range's last receive wait for the
  // next range. (Their operands stay live until the stage ends, and the
  // next range completes them before it computes: nothing overwrites them.)
  int heldAfter = end; // the sends from here on are held
  if (holdSends && comm) {
    heldAfter = from;
    for (int k = from; k < end; ++k)
      if (!skipped[k] && stage.instructions(k).kind() == pxe::OP_RECV) heldAfter = k + 1;
  }
  for (int k = begin; k < from && !gathersAt.empty(); ++k) { // (issued before the leading receives ran)
    Status st = gatherBefore(k);
    if (!st.isOk()) return failed(k, "gathering ZeRO-3 parameters", st);
  }
  for (int k = from; k < end; ++k) {
    if (marks) PARAX_CUDA(cudaEventRecord((*marks)[k], stream));
    if (!gathersAt.empty()) { // ZeRO-3: boxes gathered ahead of their reads
      Status st = gatherBefore(k);
      if (!st.isOk()) return failed(k, "gathering ZeRO-3 parameters", st);
    }
    if (skipped[k]) continue; // fused into the instruction before, or run once at prepare
    if (k >= heldAfter && stage.instructions(k).kind() == pxe::OP_SEND) {
      heldSends.push_back(pointToPoint(k));
      continue;
    }
    if (comm) {
      comm->issuerStage = host.stage();
      comm->issuerInstruction = k;
    }
    Status st = Status::ok();
    if (pending && conflictsWithPending(k))
      st = completePending();
    else if (pending)
      ++overlapped;
    if (st.isOk())
      st = run(k);
    if (st.isOk() && streaming) st = reduceGradientsOf(k);
    if (st.isOk() && !poisonAfter.empty())
      for (int32_t id : poisonAfter[k])
        if (st.isOk() && cudaMemsetAsync(buffers[id].data, 0xff, buffers[id].bytes(), stream) != cudaSuccess)
          st = Status::error("filling dead temporary " + std::to_string(id) + " with NaN failed");
    if (st.isOk()) {
      cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) st = Status::error(cudaGetErrorString(e));
    }
    if (!st.isOk() && comm && comm->aborted) return st; // the watchdog's report names its collective
    if (!st.isOk()) return failed(k, "on the GPU", st);
  }
  Status st = completePending();
  for (size_t i = 0; i < slots.size() && streaming && st.isOk(); ++i) // written before the range, or not overlapped
    if (!taken[i] && inRange(static_cast<int>(i), streamRange)) st = reduceGradient(static_cast<int>(i));
  streaming = false;
  if (st.isOk() && marks) PARAX_CUDA(cudaEventRecord(marks->back(), stream));
  return st;
}

Status CudaExecutor::State::reduceGradientsOf(int k) {
  if (!overlap || k >= static_cast<int>(slotsOf.size()) || slotsOf[k].empty()) return Status::ok();
  const bool early = k + 1 < host.stageProgram().instructions_size();
  bool transferred = false; // the gradient is the pending collective's result
  for (int i : slotsOf[k]) {
    int32_t id = host.stageProgram().outputs(slots[i].g.output);
    transferred = transferred || (pending && std::find(pending->buffers.begin(), pending->buffers.end(), id) !=
                                                 pending->buffers.end());
  }
  if (transferred) {
    // A collective's result (a gradient all-reduced over TP, say): reduced
    // once the compute stream has waited for that collective.
    std::function<Status()> finish = std::move(pending->finish);
    pending->finish = [this, finish, k, early]() {
      Status st = finish ? finish() : Status::ok();
      issuingEarly = early;
      for (int i : slotsOf[k])
        if (st.isOk()) st = reduceGradient(i);
      issuingEarly = false;
      return st;
    };
    return Status::ok();
  }
  issuingEarly = early;
  Status st = Status::ok();
  for (int i : slotsOf[k])
    if (st.isOk()) st = reduceGradient(i);
  issuingEarly = false;
  return st;
}

Status CudaExecutor::State::placeBuckets(const std::function<Status(float **, int64_t)> &take) {
  bucketOf.assign(slots.size(), -1);
  // The slots all-reduced (over dp, or the axes their gradients are
  // partial sums over), in the order the program writes their gradients
  // (a backward pass: the last layer's first).
  std::vector<int> order;
  std::vector<bool> seen(slots.size(), false);
  auto add = [&](int i) {
    if (seen[i] || slots[i].shared || !sumAxes(slots[i])) return;
    seen[i] = true;
    order.push_back(i);
  };
  for (const std::vector<int> &written : slotsOf)
    for (int i : written) add(i);
  for (size_t i = 0; i < slots.size(); ++i) add(static_cast<int>(i));
  if (order.empty()) return Status::ok();
  int64_t total = 0;
  for (int i : order) total += slots[i].n;
  float *arena = nullptr;
  Status st = take(&arena, total * 4);
  if (!st.isOk()) return st;
  int64_t offset = 0;
  for (int i : order) {
    OptimizerSlot &slot = slots[i];
    if (buckets.empty() || (buckets.back().n + slot.n) * 4 > bucketBytes || buckets.back().axes != sumAxes(slot)) {
      buckets.emplace_back();
      buckets.back().sum = arena + offset;
      buckets.back().axes = sumAxes(slot);
    }
    Bucket &b = buckets.back();
    b.slots.push_back(i);
    b.n += slot.n;
    slot.sum = slot.share = arena + offset;
    offset += slot.n;
    bucketOf[i] = static_cast<int>(buckets.size()) - 1;
  }
  return Status::ok();
}

Status CudaExecutor::State::reduceGradient(int i) {
  OptimizerSlot &slot = slots[i];
  taken[i] = true;
  if (slot.chunkSums) { // (every microbatch's reduce-scattered)
    reduced[i] = reduced[i] || streamReduces;
    if (streaming && issuingEarly && streamReduces) ++streamedEarly;
    return reduceScatterMicrobatch(i, streamFirst);
  }
  const DeviceBuffer &out = buffers[host.stageProgram().outputs(slot.g.output)];
  Status st = withFloat(out, [&](auto t) {
    using T = decltype(t);
    PARAX_LAUNCH(accumulateKernel<T>, blocksFor(slot.n), kThreads, 0, stream)(out.as<T>(), slot.sum, slot.n,
                                                                              streamFirst ? 1 : 0);
    return Status::ok();
  });
  if (!st.isOk() || !streamReduces) return st;
  reduced[i] = true;
  if (!reducesSum(slot)) return st;
  // On the collectives' stream, after the sum: nothing on the compute
  // stream reads it before the step's host synchronisation (its watchdog
  // waits for it), so nothing waits for it here.
  issueAsOptimizer();
  st = reduceSums(i);
  if (st.isOk()) (void)comm->takeIssued();
  return st.isOk() ? st : Status::error("the data-parallel gradient reduction: " + st.message());
}

Status CudaExecutor::State::reduceScatterMicrobatch(int i, bool first) {
  OptimizerSlot &slot = slots[i];
  const DeviceBuffer &out = buffers[host.stageProgram().outputs(slot.g.output)];
  const int64_t members = slot.g.members, size = slot.g.size;
  // In parts of at most kZeroStagingValues a staging box: part j holds each
  // rank's values [j w, (j + 1) w) of its chunk, side by side.
  const int64_t width = zeroPartWidth(size, members, zeroStagingLimit);
  for (int64_t offset = 0; offset < size; offset += width) {
    const int64_t w = std::min(width, size - offset);
    const int b = nextStaging;
    nextStaging ^= 1;
    // The staging box's last reduce-scatter has read it, and this slot's
    // last one has written its sums (both on the collectives' stream).
    PARAX_CUDA(cudaStreamWaitEvent(stream, stagingFree[b], 0));
    PARAX_CUDA(cudaStreamWaitEvent(stream, slot.summed, 0));
    Status st = withFloat(out, [&](auto t) {
      using T = decltype(t);
      // (but for the step's first microbatch, this rank's block comes back
      // as its own sums plus every rank's gradient)
      PARAX_LAUNCH(stagePartKernel<T>, blocksFor(members * w), kThreads, 0, stream)(
          out.as<T>(), slot.n, sumStaging[b], members, size, offset, w, first ? nullptr : slot.sum, slot.g.index);
      return Status::ok();
    });
    if (!st.isOk()) return st;
    PARAX_CUDA(cudaGetLastError());
    issueAsOptimizer();
    st = comm->reduceScatter(sumStaging[b], slot.sum + offset, w, Elem::F32, slot.g.axes, stream);
    if (!st.isOk()) return Status::error("the ZeRO-2 gradient reduce-scatter: " + st.message());
    // Recorded where the reduce-scatter runs: the collectives' stream, or
    // (host-staged: done already) the compute stream.
    cudaStream_t where = comm->takeIssued() ? comm->commStream : stream;
    PARAX_CUDA(cudaEventRecord(stagingFree[b], where));
    PARAX_CUDA(cudaEventRecord(slot.summed, where));
  }
  return Status::ok();
}

Status CudaExecutor::State::shardParameters() {
  const pxe::Stage &stage = host.stageProgram();
  const int n = stage.instructions_size();
  // A run of instructions reading a box ends where a pipeline range
  // begins, or where the next read is more than kGatherGap instructions on
  // (a layer's forward and its backward are far apart: the box is
  // gathered again for the backward rather than held through the layers
  // between).
  std::vector<bool> breaks(n + 1, false);
  for (const PipelineRange &r : ranges) breaks[r.begin] = true;
  std::vector<bool> movesRead(buffers.size(), false); // read by a move of parameters (hoisted)
  for (int k = 0; k < n; ++k)
    if (host.hoisted(k))
      for (int32_t id : stage.instructions(k).operands()) movesRead[id] = true;
  std::vector<BufferLifetime> lifetimes;
  for (size_t i = 0; i < slots.size(); ++i) {
    OptimizerSlot &slot = slots[i];
    DeviceBuffer &param = buffers[slot.g.parameter];
    if (!slot.chunkSums || param.aliased || param.inArena || movesRead[slot.g.parameter]) continue;
    const size_t eb = elemBytes(param.elem);
    size_t first = gatherIntervals.size();
    for (int k = 0, segment = -1, runStart = 0; k < n; ++k) {
      if (breaks[k]) segment = -1, runStart = k; // (a new run)
      if (skipped[k]) continue;
      const auto &operands = stage.instructions(k).operands();
      if (std::find(operands.begin(), operands.end(), slot.g.parameter) == operands.end()) continue;
      if (segment >= 0 && k - gatherIntervals[segment].last > kGatherGap) segment = -1;
      if (segment < 0) {
        // Issued ahead, but within the run and after the box's last
        // interval (whose reads its memory would otherwise change under).
        int issue = std::max({runStart, k - kGatherGap,
                              gatherIntervals.size() > first ? gatherIntervals.back().last + 1 : 0});
        segment = static_cast<int>(gatherIntervals.size());
        gatherIntervals.push_back({static_cast<int>(i), issue, k, k, 0});
        lifetimes.push_back({static_cast<size_t>(slot.g.size * slot.g.members) * eb, issue, k});
        PARAX_CUDA(cudaEventCreateWithFlags(&gatherIntervals.back().gathered, cudaEventDisableTiming));
      }
      gatherIntervals[segment].last = lifetimes[segment].last = k;
    }
    if (gatherIntervals.size() == first) continue; // read by no instruction
    // The chunk, from the loaded box; then the box's own memory goes.
    Status st = allocate(&slot.chunk, slot.g.size * eb, "the ZeRO-3 chunk of " + nameOf(slot.g.parameter));
    if (!st.isOk()) return st;
    optimizerMemory.push_back(slot.chunk);
    PARAX_CUDA(cudaMemsetAsync(slot.chunk, 0, slot.g.size * eb, stream));
    PARAX_CUDA(cudaMemcpyAsync(slot.chunk, static_cast<char *>(param.data) + slot.g.begin * eb,
                               (slot.g.end - slot.g.begin) * eb, cudaMemcpyDeviceToDevice, stream));
    PARAX_CUDA(cudaStreamSynchronize(stream));
    PARAX_CUDA(cudaFree(param.data));
    deviceBytes -= param.bytes();
    param.data = nullptr;
    ++sharded.boxes;
    sharded.chunkBytes += slot.g.size * eb;
  }
  if (gatherIntervals.empty()) return Status::ok();
  graphs = false; // (steps issue the all-gathers and re-point the boxes: no captured graph)
  BufferPlan plan = planBuffers(lifetimes, 256);
  Status st = allocate(&gatherBlock, std::max<size_t>(plan.arenaBytes, 1), "the ZeRO-3 parameters' gather block");
  if (!st.isOk()) return st;
  optimizerMemory.push_back(gatherBlock);
  sharded.gatherBytes = plan.arenaBytes;
  gathersAt.assign(n, {});
  gatherWaitsAt.assign(n, {});
  for (size_t g = 0; g < gatherIntervals.size(); ++g) {
    gatherIntervals[g].offset = plan.offsets[g];
    gathersAt[gatherIntervals[g].issue].push_back(static_cast<int>(g));
    gatherWaitsAt[gatherIntervals[g].first].push_back(static_cast<int>(g));
  }
  return Status::ok();
}

Status CudaExecutor::State::gatherBefore(int k) {
  for (int g : gathersAt[k]) {
    GatherInterval &interval = gatherIntervals[g];
    const OptimizerSlot &slot = slots[interval.slot];
    DeviceBuffer &param = buffers[slot.g.parameter];
    // (The block's memory was last read by instructions issued before this
    // one: the collectives' stream starts after them.)
    param.data = static_cast<char *>(gatherBlock) + interval.offset;
    Status st = comm->allGather(slot.chunk, param.data, slot.g.size, param.elem, slot.g.axes, stream);
    if (!st.isOk()) return Status::error("the ZeRO-3 all-gather of " + nameOf(slot.g.parameter) + ": " + st.message());
    // Recorded where it runs: the collectives' stream, or (host-staged:
    // done already) the compute stream.
    PARAX_CUDA(cudaEventRecord(interval.gathered, comm->takeIssued() ? comm->commStream : stream));
    gathersAhead += interval.issue < interval.first ? 1 : 0;
  }
  for (int g : gatherWaitsAt[k]) PARAX_CUDA(cudaStreamWaitEvent(stream, gatherIntervals[g].gathered, 0));
  return Status::ok();
}

CudaExecutor::ShardedParameters CudaExecutor::shardedParameters() const {
  ShardedParameters p = s_->sharded;
  p.gatheredAhead = s_->gathersAhead;
  return p;
}

StatusOr<std::vector<double>> CudaExecutor::timeInstructions() {
  State &s = *s_;
  const pxe::Stage &stage = s.host.stageProgram();
  std::vector<cudaEvent_t> marks(stage.instructions_size() + 1, nullptr);
  struct Release {
    std::vector<cudaEvent_t> &events;
    ~Release() {
      for (cudaEvent_t e : events)
        if (e) cudaEventDestroy(e);
    }
  } release{marks};
  for (cudaEvent_t &e : marks) PARAX_CUDA(cudaEventCreate(&e));
  Status st = s.issue(0, stage.instructions_size(), false, &marks);
  if (st.isOk()) st = s.sync();
  if (!st.isOk()) return st;
  std::vector<double> seconds(stage.instructions_size(), -1);
  for (int k = 0; k < stage.instructions_size(); ++k) {
    if (s.skipped[k]) continue;
    float ms = 0;
    PARAX_CUDA(cudaEventElapsedTime(&ms, marks[k], marks[k + 1]));
    seconds[k] = 1e-3 * ms;
  }
  return seconds;
}

StatusOr<std::vector<CudaExecutor::OpTime>> CudaExecutor::profileStep() {
  StatusOr<std::vector<double>> seconds = timeInstructions();
  if (!seconds.isOk()) return seconds.status();
  const pxe::Stage &stage = s_->host.stageProgram();
  std::vector<OpTime> times; // by op, in order of first appearance
  for (int k = 0; k < stage.instructions_size(); ++k) {
    if (seconds.value()[k] < 0) continue;
    const std::string &op = opName(stage.instructions(k));
    auto it = std::find_if(times.begin(), times.end(), [&](const OpTime &t) { return t.op == op; });
    if (it == times.end()) it = times.insert(times.end(), OpTime{op, 0.0, 0});
    it->ms += 1e3 * seconds.value()[k];
    ++it->count;
  }
  return times;
}

const Executor &CudaExecutor::hostExecutor() const { return s_->host; }

bool CudaExecutor::replaysGraph() const { return s_->graph != nullptr; }
size_t CudaExecutor::overlappedInstructions() const { return s_->overlapped; }
size_t CudaExecutor::hoistedInstructions() const { return s_->hoisted; }
double CudaExecutor::busiestExpertLoad() const { return s_->expertLoad; }
void CudaExecutor::setLabelCount(std::optional<float> count) { s_->labelCount = count; }

StatusOr<std::map<int32_t, std::vector<double>>> CudaExecutor::takeExpertCounts() {
  State &s = *s_;
  std::map<int32_t, std::vector<int32_t>> host; // every router's, then one wait
  for (auto &[bias, counts] : s.expertCounts) {
    std::vector<int32_t> &into = host[bias];
    into.resize(s.buffers[bias].numel());
    PARAX_CUDA(cudaMemcpyAsync(into.data(), counts, into.size() * 4, cudaMemcpyDeviceToHost, s.stream));
    PARAX_CUDA(cudaMemsetAsync(counts, 0, into.size() * 4, s.stream));
  }
  Status st = s.sync();
  if (!st.isOk()) return st;
  std::map<int32_t, std::vector<double>> taken;
  for (const auto &[bias, counts] : host) taken[bias].assign(counts.begin(), counts.end());
  return taken;
}
size_t CudaExecutor::sharedMoves() const { return s_->sharedMoves; }
size_t CudaExecutor::cacheReadsInPlace() const { return s_->cacheParts.size(); }
const std::string &CudaExecutor::attentionPath() const { return s_->attentionPath; }
const BufferPlan &CudaExecutor::temporaries() const { return s_->temporaries; }

const std::string &CudaExecutor::memoryPeak() const { return s_->peakReport; }
size_t CudaExecutor::inPlaceTemporaries() const { return s_->inPlace; }
size_t CudaExecutor::deviceBytes() const { return s_->deviceBytes; }
size_t CudaExecutor::scratchBytes() const { return (s_->scratchSize + s_->fewRowsSize) * sizeof(float); }

void CudaExecutor::keepLoadedParameters() { s_->keepParameters = true; }

std::vector<Tensor> CudaExecutor::takeLoadedParameters() {
  State &s = *s_;
  std::vector<Tensor> &held = s.host.hostBuffers();
  std::vector<Tensor> values(held.size());
  for (const pxe::Buffer &b : s.host.stageProgram().buffers()) {
    if (b.role() != pxe::PARAMETER || held[b.id()].isInt || held[b.id()].f.empty()) continue;
    values[b.id()].shape = held[b.id()].shape; // (the executor keeps the shape)
    values[b.id()].f.swap(held[b.id()].f);
  }
  s.host.releaseHostCopies();
  return values;
}

Status CudaExecutor::updateParameters(const std::vector<Tensor> &values) {
  State &s = *s_;
  for (const pxe::Buffer &b : s.host.stageProgram().buffers()) {
    if (b.role() != pxe::PARAMETER || b.id() >= static_cast<int>(values.size()) || values[b.id()].f.empty())
      continue;
    DeviceBuffer &d = s.buffers[b.id()];
    if (d.aliased)
      return Status::error("parameter " + b.param_name() + " is another program's memory: it cannot be updated here");
    if (!s.gatherIntervals.empty())
      return Status::error("parameter " + b.param_name() + ": ZeRO-3 keeps the parameters as chunks on the device; "
                           "the host cannot write them whole");
    if (values[b.id()].numel() != d.numel() || values[b.id()].f.size() != static_cast<size_t>(d.numel()))
      return Status::error("parameter " + b.param_name() + ": " + std::to_string(values[b.id()].f.size()) +
                           " values for a box of " + std::to_string(d.numel()));
    Status st = copyToDevice(d.data, values[b.id()].f.data(), d.numel(), d.elem, s.stream);
    if (!st.isOk()) return st;
  }
  return s.rerunParameterMoves();
}

//===----------------------------------------------------------------------===//
// The optimizer on the device
//===----------------------------------------------------------------------===//

Status CudaExecutor::bindOptimizer(const std::vector<Gradient> &gradients, const OptimizerSetup &setup,
                                   const std::vector<Tensor> &masters) {
  State &s = *s_;
  const pxe::Stage &stage = s.host.stageProgram();
  if (!s.slots.empty()) return Status::error("the optimizer is bound already");
  const bool zero = setup.zero;
  const unsigned mask = setup.replicaAxis >= 0 ? 1u << setup.replicaAxis : 0;
  if (setup.replicas > 1 && (!s.comm || mask >= s.comm->sizes.size() || s.comm->sizes[mask] != setup.replicas))
    return Status::error("the optimizer's " + std::to_string(setup.replicas) +
                         " data-parallel replicas are not a group of this rank's communicator");
  s.optimizer = setup;
  s.boundOutput.assign(stage.outputs_size(), false);
  auto take = [&](auto **p, int64_t bytes, const std::string &what) {
    bytes = std::max<int64_t>(bytes, 1);
    Status st = s.allocate(p, bytes, what);
    if (!st.isOk()) return st;
    s.optimizerMemory.push_back(*p);
    s.optimizerBytes += bytes;
    PARAX_CUDA(cudaMemsetAsync(*p, 0, bytes, s.stream));
    return Status::ok();
  };
  int64_t staged = 0;     // bytes of the largest padded box that needs staging
  int64_t sumStaged = 0;  // ZeRO-2: values of the largest staging box
  Status limits = positiveFromEnv("PARAX_CUDA_ZERO_STAGING", "values", s.zeroStagingLimit);
  if (limits.isOk()) limits = positiveFromEnv("PARAX_CUDA_BUCKET_BYTES", "bytes", s.bucketBytes);
  if (!limits.isOk()) return limits;
  for (const Gradient &g : gradients) {
    if (g.output < 0 || g.output >= stage.outputs_size() || g.parameter < 0 ||
        g.parameter >= static_cast<int>(s.buffers.size()))
      return Status::error("the optimizer: no output " + std::to_string(g.output) + " or buffer " +
                           std::to_string(g.parameter) + " in this stage");
    const DeviceBuffer &out = s.buffers[stage.outputs(g.output)], &param = s.buffers[g.parameter];
    std::string what = "the optimizer's state of " + s.nameOf(g.parameter);
    if (out.elem == Elem::I32 || param.elem == Elem::I32 || out.numel() != param.numel())
      return Status::error(what + ": its gradient (output " + std::to_string(g.output) + ") is not its box");
    if (param.aliased)
      return Status::error("parameter " + s.nameOf(g.parameter) + " is another program's memory: it cannot be updated here");
    State::OptimizerSlot slot;
    slot.g = g;
    slot.n = param.numel();
    slot.shared = zero && g.members > 1;
    slot.chunkSums = slot.shared && setup.shardSums;
    slot.updated = slot.shared ? g.size : slot.n;
    if (slot.shared &&
        (!s.comm || g.axes >= s.comm->sizes.size() || s.comm->sizes[g.axes] != g.members || g.index < 0 ||
         g.index >= g.members))
      return Status::error(what + ": its ZeRO group of " + std::to_string(g.members) +
                           " ranks is not a group of this rank's communicator");
    if (slot.shared && (g.size * g.members < slot.n || g.begin != std::min(slot.n, g.index * g.size) ||
                        g.end > slot.n || g.end - g.begin > g.size))
      return Status::error(what + ": a ZeRO chunk [" + std::to_string(g.begin) + ", " + std::to_string(g.end) +
                           ") of " + std::to_string(g.size) + " that is not rank " + std::to_string(g.index) + " of " +
                           std::to_string(g.members) + "'s of a box of " + std::to_string(slot.n));
    if (g.partRanks.size() > 1 &&
        (!s.comm || std::find(g.partRanks.begin(), g.partRanks.end(), s.comm->rank) == g.partRanks.end()))
      return Status::error(what + ": its gradient's parts are added over ranks this rank is not among");
    if (!slot.shared && (g.begin != 0 || g.end != slot.n))
      return Status::error(what + ": a chunk [" + std::to_string(g.begin) + ", " + std::to_string(g.end) +
                           ") of a box of " + std::to_string(slot.n) + " updated without ZeRO");
    const unsigned summed = s.sumAxes(slot);
    if (slot.shared ? (g.partialAxes & ~g.axes) != 0 : summed && (!s.comm || summed >= s.comm->sizes.size()))
      return Status::error(what + ": the axes its gradient is a partial sum over are not a group of this rank's "
                                  "communicator" + (slot.shared ? std::string(" within its ZeRO group") : ""));
    if (g.copies < 1) return Status::error(what + ": its mean divides by " + std::to_string(g.copies) + " copies");
    int64_t sums = slot.chunkSums ? g.size : slot.shared ? g.size * g.members : slot.n;
    // (reduced without ZeRO: side by side in buckets, placeBuckets)
    bool bucketed = !slot.shared && summed;
    Status st = bucketed ? Status::ok() : take(&slot.sum, sums * 4, what + " (gradient sums)");
    if (st.isOk()) st = take(&slot.master, slot.updated * 4, what + " (fp32 master)");
    if (st.isOk() && setup.adamw) st = take(&slot.m, slot.updated * 4, what + " (AdamW's first moment)");
    if (st.isOk() && setup.adamw) st = take(&slot.v, slot.updated * 4, what + " (AdamW's second moment)");
    if (st.isOk() && g.partRanks.size() > 1)
      st = take(&slot.otherParts, slot.updated * 4 * static_cast<int64_t>(g.partRanks.size() - 1),
                what + " (the other stages' parts of its gradient)");
    if (!st.isOk()) return st;
    slot.share = slot.shared && !slot.chunkSums ? slot.sum + g.index * g.size : slot.sum;
    // The master's first values: the box's (ZeRO: its chunk).
    if (g.parameter >= static_cast<int>(masters.size()) ||
        masters[g.parameter].f.size() != static_cast<size_t>(slot.n))
      return Status::error(what + ": no fp32 master values of its box given");
    st = copyToDevice(slot.master, masters[g.parameter].f.data() + g.begin, g.end - g.begin, Elem::F32, s.stream);
    if (!st.isOk()) return st;
    if (slot.shared && g.size * g.members != slot.n)
      staged = std::max<int64_t>(staged, g.size * g.members * elemBytes(param.elem));
    if (slot.chunkSums) {
      sumStaged = std::max<int64_t>(sumStaged, g.members * zeroPartWidth(g.size, g.members, s.zeroStagingLimit));
      PARAX_CUDA(cudaEventCreateWithFlags(&slot.summed, cudaEventDisableTiming));
    }
    s.boundOutput[g.output] = true;
    s.slots.push_back(slot);
  }
  for (int k = 0; s.gradientsBound && k < stage.outputs_size() && k < stage.output_grads_size(); ++k)
    if (!stage.output_grads(k).empty() && !s.boundOutput[k])
      return Status::error("the optimizer: gradient output " + std::to_string(k) + " (" + stage.output_grads(k) +
                           ") is not bound, but holdActivations placed it as read right after its range");
  s.slotsOf.assign(stage.instructions_size(), {});
  s.reduced.assign(s.slots.size(), false);
  s.taken.assign(s.slots.size(), false);
  for (int k = 0; k < stage.instructions_size(); ++k)
    for (int32_t id : stage.instructions(k).results())
      for (size_t i = 0; i < s.slots.size(); ++i)
        if (stage.outputs(s.slots[i].g.output) == id) s.slotsOf[k].push_back(static_cast<int>(i));
  Status st = s.placeBuckets(
      [&](float **p, int64_t bytes) { return take(p, bytes, "the optimizer's gradient sums (buckets)"); });
  if (st.isOk() && staged) st = take(&s.staging, staged, "the optimizer's ZeRO all-gather staging");
  for (int b = 0; b < 2 && sumStaged && st.isOk(); ++b) {
    st = take(&s.sumStaging[b], sumStaged * 4, "the optimizer's ZeRO-2 reduce-scatter staging");
    if (st.isOk() && cudaEventCreateWithFlags(&s.stagingFree[b], cudaEventDisableTiming) != cudaSuccess)
      st = Status::error("the optimizer's ZeRO-2 staging: cudaEventCreate failed");
  }
  if (st.isOk()) st = take(&s.squares, s.slots.size() * sizeof(double), "the optimizer's sums of squares");
  if (!st.isOk()) return st;
  s.assignSlotRanges();
  if (setup.shardParameters && setup.shardSums) {
    Status sharded = s.shardParameters();
    if (!sharded.isOk()) return sharded;
  }
  return s.sync();
}

Status CudaExecutor::streamGradients(bool first, int range, bool reduce) {
  State &s = *s_;
  if (s.slots.empty()) return Status::error("streamGradients: no optimizer bound");
  if (first) s.sumsGathered = false; // a step's sums made anew
  s.streaming = true;
  s.streamFirst = first;
  s.streamRange = range;
  s.streamReduces = reduce;
  s.taken.assign(s.slots.size(), false);
  if (std::none_of(s.reduced.begin(), s.reduced.end(), [](bool r) { return r; }))
    s.streamedEarly = 0; // the step's first streamed range
  return Status::ok();
}

size_t CudaExecutor::gradientsReducedEarly() const { return s_->streamedEarly; }

CudaExecutor::GradientBuckets CudaExecutor::gradientBuckets() const {
  GradientBuckets b;
  b.buckets = s_->buckets.size();
  for (const State::Bucket &bucket : s_->buckets) b.boxes += bucket.slots.size();
  return b;
}

Status CudaExecutor::accumulateGradients(bool first, int range) {
  State &s = *s_;
  if (first) s.sumsGathered = false; // a step's sums made anew
  for (size_t i = 0; i < s.slots.size(); ++i) {
    const State::OptimizerSlot &slot = s.slots[i];
    if (!s.inRange(static_cast<int>(i), range)) continue;
    if (slot.chunkSums) {
      Status st = s.reduceScatterMicrobatch(static_cast<int>(i), first);
      if (!st.isOk()) return st;
      continue;
    }
    const DeviceBuffer &out = s.buffers[s.host.stageProgram().outputs(slot.g.output)];
    Status st = withFloat(out, [&](auto t) {
      using T = decltype(t);
      PARAX_LAUNCH(accumulateKernel<T>, blocksFor(slot.n), kThreads, 0, s.stream)(out.as<T>(), slot.sum, slot.n,
                                                                                  first ? 1 : 0);
      return Status::ok();
    });
    if (!st.isOk()) return st;
  }
  PARAX_CUDA(cudaGetLastError());
  return Status::ok();
}

StatusOr<std::vector<double>> CudaExecutor::averageGradients(int64_t microbatches) {
  State &s = *s_;
  s.issueAsOptimizer();
  if (!s.slots.empty()) PARAX_CUDA(cudaMemsetAsync(s.squares, 0, s.slots.size() * sizeof(double), s.stream));
  // The sums all-reduced over the replicas (ZeRO: reduce-scattered over
  // the box's ranks, this rank's chunk), unless streamGradients' run has
  // (ZeRO-2: each microbatch's run has): every reduction issued (a bucket
  // goes with its last slot), then the compute stream waits for the last
  // (they run in order on the collectives' stream).
  for (size_t i = 0; i < s.slots.size(); ++i) {
    State::OptimizerSlot &slot = s.slots[i];
    if (slot.chunkSums) {
      PARAX_CUDA(cudaStreamWaitEvent(s.stream, slot.summed, 0));
    } else if (s.reducesSum(slot) && !s.reduced[i]) {
      Status st = s.reduceSums(static_cast<int>(i));
      if (!st.isOk()) return Status::error("the data-parallel gradient reduction: " + st.message());
    }
  }
  Status awaited = s.awaitIssued();
  if (!awaited.isOk()) return Status::error("the data-parallel gradient reduction: " + awaited.message());
  // A weight several stages read: each of them adds the others' parts of
  // its gradient, exchanged in one group (in the order of the results, as
  // every stage issues them), in stage order.
  std::vector<int> parts;
  for (size_t i = 0; i < s.slots.size(); ++i)
    if (s.slots[i].g.partRanks.size() > 1) parts.push_back(static_cast<int>(i));
  if (!parts.empty()) {
    const pxe::Stage &stage = s.host.stageProgram();
    std::sort(parts.begin(), parts.end(), [&](int a, int b) {
      return outputResult(stage, s.slots[a].g.output) < outputResult(stage, s.slots[b].g.output);
    });
    std::vector<NcclCommunicator::PointToPoint> ops;
    for (int i : parts) {
      const State::OptimizerSlot &slot = s.slots[i];
      const std::vector<int> &ranks = slot.g.partRanks;
      for (size_t j = 0, other = 0; j < ranks.size(); ++j) {
        if (ranks[j] == s.comm->rank) continue;
        ops.push_back({slot.share, static_cast<size_t>(slot.updated), Elem::F32, ranks[j], true});
        ops.push_back({slot.otherParts + other++ * slot.updated, static_cast<size_t>(slot.updated), Elem::F32,
                       ranks[j], false});
      }
    }
    Status st = s.comm->exchange(ops, s.stream);
    if (st.isOk()) st = s.awaitIssued();
    if (!st.isOk()) return Status::error("the sum of a gradient's parts over the stages holding its weight: " +
                                         st.message());
    for (int i : parts) {
      const State::OptimizerSlot &slot = s.slots[i];
      const std::vector<int> &ranks = slot.g.partRanks;
      int at = static_cast<int>(std::find(ranks.begin(), ranks.end(), s.comm->rank) - ranks.begin());
      PARAX_LAUNCH(sumPartsKernel, blocksFor(slot.updated), kThreads, 0, s.stream)(
          slot.share, slot.otherParts, slot.updated, static_cast<int>(ranks.size()), at);
    }
  }
  // Then their mean, and its sum of squares.
  for (size_t i = 0; i < s.slots.size(); ++i) {
    State::OptimizerSlot &slot = s.slots[i];
    s.reduced[i] = false;
    PARAX_LAUNCH(scaleKernel, blocksFor(slot.updated), kThreads, 0, s.stream)(
        slot.share, slot.updated, 1.0f / static_cast<float>(microbatches * slot.g.copies));
    PARAX_LAUNCH(sumOfSquaresKernel, blocksFor(slot.updated), kThreads, 0, s.stream)(slot.share, slot.updated,
                                                                                      s.squares + i);
  }
  for (State::Bucket &b : s.buckets) b.summed = 0;
  std::vector<double> squares(s.slots.size());
  if (!squares.empty())
    PARAX_CUDA(cudaMemcpyAsync(squares.data(), s.squares, squares.size() * sizeof(double), cudaMemcpyDeviceToHost,
                               s.stream));
  Status st = s.sync();
  if (!st.isOk()) return st;
  return squares;
}

Status CudaExecutor::applyOptimizer(const OptimizerStep &step) {
  State &s = *s_;
  s.issueAsOptimizer();
  const CudaExecutor::OptimizerSetup &o = s.optimizer;
  if (step.decays.size() != s.slots.size())
    return Status::error("the optimizer step: " + std::to_string(step.decays.size()) + " decay flags for " +
                         std::to_string(s.slots.size()) + " gradients");
  UpdateArgs args{step.lr, step.beta1, step.beta2, step.eps, 0.0, step.clip, step.correction1, step.correction2};
  // ZeRO without ZeRO-3, a box not a multiple of the group's ranks: its
  // chunk goes through the one padded staging box, so box by box.
  auto staged = [&](const State::OptimizerSlot &slot) {
    return slot.shared && !slot.chunk && slot.g.size * slot.g.members != slot.n;
  };
  // Where slot i's new values go: the parameter (ZeRO: this rank's place in
  // the box, which the all-gather fills in place; ZeRO-3: the chunk, which
  // is all the rank keeps; staged: the staging box's place).
  auto target = [&](const State::OptimizerSlot &slot) -> char * {
    const DeviceBuffer &param = s.buffers[slot.g.parameter];
    if (slot.chunk) return static_cast<char *>(slot.chunk);
    char *box = static_cast<char *>(staged(slot) ? s.staging : param.data);
    return box + (slot.shared ? slot.g.index * slot.g.size : 0) * elemBytes(param.elem);
  };
  // Every other box in one launch per parameter type (a table of the boxes
  // in the scratch buffer, not in use between steps).
  auto updateAll = [&](auto t) {
    using T = decltype(t);
    const Elem elem = std::is_same<T, float>::value ? Elem::F32 : Elem::BF16;
    std::vector<UpdateBox<T>> boxes;
    int64_t blocks = 0;
    for (size_t i = 0; i < s.slots.size(); ++i) {
      const State::OptimizerSlot &slot = s.slots[i];
      if (s.buffers[slot.g.parameter].elem != elem || staged(slot) || slot.updated == 0) continue;
      boxes.push_back({slot.master, slot.m, slot.v, slot.share, reinterpret_cast<T *>(target(slot)), slot.updated,
                       blocks, step.decays[i] ? step.weightDecay : 0.0});
      blocks += (slot.updated + kUpdateChunk - 1) / kUpdateChunk;
    }
    if (boxes.empty()) return Status::ok();
    const size_t bytes = boxes.size() * sizeof(UpdateBox<T>);
    Status table = s.ensureScratch((bytes + 3) / 4);
    if (!table.isOk()) return table;
    PARAX_CUDA(cudaMemcpyAsync(s.scratch, boxes.data(), bytes, cudaMemcpyHostToDevice, s.stream));
    PARAX_LAUNCH(multiUpdateKernel<T>, blocks, kThreads, 0, s.stream)(
        reinterpret_cast<const UpdateBox<T> *>(s.scratch), static_cast<int>(boxes.size()), args, o.adamw);
    PARAX_CUDA(cudaGetLastError());
    return Status::ok();
  };
  Status updated = updateAll(float{});
  if (updated.isOk()) updated = updateAll(__nv_bfloat16{});
  if (!updated.isOk()) return updated;
  for (size_t i = 0; i < s.slots.size(); ++i) {
    State::OptimizerSlot &slot = s.slots[i];
    DeviceBuffer &param = s.buffers[slot.g.parameter];
    UpdateArgs a = args;
    a.decay = step.decays[i] ? step.weightDecay : 0.0;
    Status st = withFloat(param, [&](auto t) {
      using T = decltype(t);
      T *into = reinterpret_cast<T *>(target(slot));
      if (staged(slot)) {
        if (o.adamw)
          PARAX_LAUNCH(adamwKernel<T>, blocksFor(slot.updated), kThreads, 0, s.stream)(
              slot.master, slot.m, slot.v, slot.share, into, slot.updated, a);
        else
          PARAX_LAUNCH(sgdKernel<T>, blocksFor(slot.updated), kThreads, 0, s.stream)(slot.master, slot.share, into,
                                                                                   slot.updated, a);
        PARAX_CUDA(cudaGetLastError());
      }
      if (!slot.shared || slot.chunk) return Status::ok();
      T *box = staged(slot) ? static_cast<T *>(s.staging) : param.as<T>();
      Status gathered = s.comm->allGather(into, box, slot.g.size, param.elem, slot.g.axes, s.stream);
      if (gathered.isOk()) gathered = s.awaitIssued();
      if (!gathered.isOk()) return Status::error("the ZeRO parameter all-gather: " + gathered.message());
      if (staged(slot))
        PARAX_CUDA(cudaMemcpyAsync(param.data, box, slot.n * elemBytes(param.elem), cudaMemcpyDeviceToDevice,
                                   s.stream));
      return Status::ok();
    });
    if (!st.isOk()) return st;
  }
  return s.rerunParameterMoves();
}

StatusOr<std::vector<Tensor>> CudaExecutor::gradientSums() {
  State &s = *s_;
  s.issueAsOptimizer();
  if (s.sumsGathered) return Status::error("the gradient sums were read after the masters (their memory is gone)");
  std::vector<Tensor> sums;
  for (State::OptimizerSlot &slot : s.slots) {
    float *whole = slot.sum;
    std::unique_ptr<float, decltype(&cudaFree)> own(nullptr, cudaFree);
    if (slot.shared) { // every rank's chunk of the mean (ZeRO-1: in place)
      StatusOr<float *> room = s.gatherRoom(slot, own);
      if (!room.isOk()) return room.status();
      whole = room.value();
      Status st = s.comm->allGather(slot.share, whole, slot.g.size, Elem::F32, slot.g.axes, s.stream);
      if (st.isOk()) st = s.awaitIssued();
      if (!st.isOk()) return Status::error("gathering the ZeRO gradients: " + st.message());
    }
    sums.push_back(Tensor::floats(s.buffers[s.host.stageProgram().outputs(slot.g.output)].shape));
    Status st = copyToHost(sums.back().f.data(), whole, slot.n, Elem::F32, s.stream);
    if (!st.isOk()) return st;
    s.readBackBytes += slot.n * sizeof(float);
  }
  Status st = s.sync();
  if (!st.isOk()) return st;
  return sums;
}

Status CudaExecutor::readMasters(std::vector<Tensor> &values) {
  State &s = *s_;
  s.issueAsOptimizer();
  for (State::OptimizerSlot &slot : s.slots) {
    const float *whole = slot.master;
    std::unique_ptr<float, decltype(&cudaFree)> own(nullptr, cudaFree);
    if (slot.shared) { // gathered where the sums were (ZeRO-1) or in a staging box (the padded box's size)
      s.sumsGathered = s.sumsGathered || !slot.chunkSums;
      StatusOr<float *> gathered = s.gatherRoom(slot, own);
      if (!gathered.isOk()) return gathered.status();
      float *room = gathered.value();
      Status st = s.comm->allGather(slot.master, room, slot.g.size, Elem::F32, slot.g.axes, s.stream);
      if (st.isOk()) st = s.awaitIssued();
      if (!st.isOk()) return Status::error("gathering the ZeRO master copies: " + st.message());
      whole = room;
    }
    if (slot.g.parameter >= static_cast<int>(values.size())) values.resize(slot.g.parameter + 1);
    values[slot.g.parameter] = Tensor::floats(s.buffers[slot.g.parameter].shape);
    Status st = copyToHost(values[slot.g.parameter].f.data(), whole, slot.n, Elem::F32, s.stream);
    if (!st.isOk()) return st;
    s.readBackBytes += slot.n * sizeof(float);
    // ZeRO-1 gathered into the sums: zeros again, as the next step's sums
    // start (their padding past the box is never written).
    if (slot.shared && whole == slot.sum)
      PARAX_CUDA(cudaMemsetAsync(slot.sum, 0, slot.g.size * slot.g.members * 4, s.stream));
  }
  return s.sync();
}

StatusOr<std::vector<std::vector<float>>> CudaExecutor::readMoments(int which) const {
  if (!s_->optimizer.adamw) return std::vector<std::vector<float>>(s_->slots.size());
  return s_->readChunks(which == 0 ? &State::OptimizerSlot::m : &State::OptimizerSlot::v);
}

StatusOr<std::vector<std::vector<float>>> CudaExecutor::readMasterChunks() const {
  return s_->readChunks(&State::OptimizerSlot::master);
}

size_t CudaExecutor::readBackBytes() const { return s_->readBackBytes; }

Status CudaExecutor::writeMoments(int which, const std::vector<std::vector<float>> &values) {
  State &s = *s_;
  if (!s.optimizer.adamw) return Status::ok();
  if (values.size() != s.slots.size())
    return Status::error("the optimizer's moments: " + std::to_string(values.size()) + " tensors for " +
                         std::to_string(s.slots.size()) + " gradients");
  for (size_t i = 0; i < s.slots.size(); ++i) {
    const State::OptimizerSlot &slot = s.slots[i];
    int64_t n = slot.g.end - slot.g.begin;
    if (values[i].empty()) continue; // none saved: zeros
    if (static_cast<int64_t>(values[i].size()) != n)
      return Status::error("the optimizer's moment of " + s.nameOf(slot.g.parameter) + ": " +
                           std::to_string(values[i].size()) + " values for " + std::to_string(n));
    Status st = copyToDevice(which == 0 ? slot.m : slot.v, values[i].data(), n, Elem::F32, s.stream);
    if (!st.isOk()) return st;
  }
  return Status::ok();
}

size_t CudaExecutor::optimizerBytes() const { return s_->optimizerBytes; }

Status CudaExecutor::run() {
  State &s = *s_;
  const int n = s.host.stageProgram().instructions_size();
  // After one eager step (which sizes the scratch buffer), a stage that can
  // be captured runs as one CUDA graph: one launch for the whole step
  // instead of one per kernel (PARAX_CUDA_GRAPHS=0 turns this off).
  if (s.graphs && s.eagerSteps > 0 && !s.graph && s.heldSends.empty() && !s.streaming) {
    if (s.comm) {
      Status ready = s.comm->beginCapture(s.collectives);
      if (!ready.isOk()) return ready;
    }
    // Thread-local with collectives: NCCL's own threads keep working while
    // this one captures (a global capture would refuse their CUDA calls).
    cudaError_t began = cudaStreamBeginCapture(
        s.stream, s.collectives ? cudaStreamCaptureModeThreadLocal : cudaStreamCaptureModeGlobal);
    if (began != cudaSuccess) {
      if (s.comm) s.comm->endCapture(false);
      return Status::error(std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(began));
    }
    Status st = s.issue(0, n);
    cudaGraph_t captured = nullptr;
    cudaError_t e = cudaStreamEndCapture(s.stream, &captured);
    if (st.isOk() && e != cudaSuccess)
      st = Status::error(std::string("capturing the step: ") + cudaGetErrorString(e));
    if (st.isOk() && (e = cudaGraphInstantiate(&s.graph, captured, 0)) != cudaSuccess)
      st = Status::error(std::string("instantiating the step's graph: ") + cudaGetErrorString(e));
    if (captured) cudaGraphDestroy(captured);
    if (s.comm) s.comm->endCapture(st.isOk());
    if (!st.isOk()) {
      // Graphs are an optimisation: say why, and run eagerly from now on.
      std::fprintf(stderr, "parax-run: no CUDA graph for this stage (%s); running kernel by kernel\n",
                   st.message().c_str());
      (void)cudaGetLastError();
      s.graph = nullptr;
      s.graphs = false;
    }
  }
  if (s.graph && s.heldSends.empty() && !s.streaming) {
    PARAX_CUDA(cudaGraphLaunch(s.graph, s.stream));
    if (s.comm) s.comm->watchGraph();
    return s.sync();
  }
  Status st = s.issue(0, n);
  if (!st.isOk()) return st;
  ++s.eagerSteps;
  return s.sync();
}

Status CudaExecutor::holdActivations(int sets, const std::vector<int64_t> &chunkSets,
                                     const std::vector<PipelineRange> &ranges, bool gradientsBound) {
  State &s = *s_;
  if (sets < 1 || !s.ranges.empty()) return Status::ok();
  // Without ranges: placed again only for the gradients the optimizer
  // takes as they are written (placeTemporaries).
  if (ranges.empty() && (!gradientsBound || !s.ownsArena || s.gradientsBound)) return Status::ok();
  int chunks = 1;
  for (const PipelineRange &r : ranges) chunks = std::max(chunks, r.chunk + 1);
  if (chunks > 1 && static_cast<int>(chunkSets.size()) != chunks)
    return Status::error("activation sets: " + std::to_string(chunkSets.size()) + " chunk slot counts for " +
                         std::to_string(chunks) + " model chunks");
  s.poolSlots.assign(1, sets);
  for (int c = 0; c < chunks && chunks > 1; ++c) {
    if (chunkSets[c] < 1 || chunkSets[c] > sets)
      return Status::error("activation sets: chunk " + std::to_string(c) + " with " + std::to_string(chunkSets[c]) +
                           " slots (1 to " + std::to_string(sets) + ")");
    s.poolSlots.push_back(static_cast<int>(chunkSets[c]));
  }
  for (size_t r = 0; r < ranges.size(); ++r)
    if (ranges[r].begin < 0 || ranges[r].end > s.host.stageProgram().instructions_size() ||
        ranges[r].begin > ranges[r].end || (r > 0 && ranges[r].begin != ranges[r - 1].end))
      return Status::error("activation sets: ranges that do not cut the stage's program in order");
  if (!s.ownsArena) return Status::error("activation sets: this program borrows another's temporary memory");
  // Placed again, split: the first placement's memory goes.
  if (s.arena) {
    PARAX_CUDA(cudaFree(s.arena));
    s.deviceBytes -= s.temporaries.arenaBytes;
    s.arena = nullptr;
  }
  for (int32_t id : s.placed) {
    DeviceBuffer &b = s.buffers[id];
    if (!b.inArena && !b.aliased) { // PARAX_CUDA_SHARE_TEMPORARIES=0: its own allocation
      PARAX_CUDA(cudaFree(b.data));
      s.deviceBytes -= b.bytes();
    }
    b.data = nullptr;
    b.inArena = b.aliased = false;
  }
  s.ranges = ranges;
  s.assignSlotRanges();
  s.sets = sets;
  s.gradientsBound = gradientsBound;
  if (!ranges.empty()) s.graphs = false; // the sets' buffers move between runs
  return s.placeTemporaries();
}

Status CudaExecutor::useActivations(int64_t micro) {
  State &s = *s_;
  if (micro < 0) return Status::error("activations of microbatch " + std::to_string(micro));
  for (size_t j = 0; j < s.held.size(); ++j) {
    int pool = s.heldPool[j];
    s.buffers[s.held[j]].data = s.poolMemory[pool][micro % s.poolSlots[pool]][s.heldIndex[j]];
  }
  s.currentMicro = micro;
  return Status::ok();
}

Status CudaExecutor::exchange(const std::vector<std::pair<int64_t, int>> &microAndBegin) {
  State &s = *s_;
  const pxe::Stage &stage = s.host.stageProgram();
  std::vector<NcclCommunicator::PointToPoint> receives;
  const int64_t current = s.currentMicro;
  Status st = Status::ok();
  for (const auto &[micro, begin] : microAndBegin) {
    if (!s.receivedAhead.insert({micro, begin}).second)
      return Status::error("exchange: the receives at " + std::to_string(begin) + " of microbatch " +
                           std::to_string(micro) + " are done already");
    st = useActivations(micro); // (each receive into its microbatch's memory)
    const int past = s.pastLeadingReceives(begin, stage.instructions_size());
    for (int k = begin; st.isOk() && k < past; ++k)
      if (!s.skipped[k]) receives.push_back(s.pointToPoint(k));
  }
  if (st.isOk()) st = useActivations(current);
  if (!st.isOk()) return st;
  return s.exchangeHeld(std::move(receives), microAndBegin.empty() ? 0 : microAndBegin.front().second);
}

int CudaExecutor::activationSets() const { return s_->sets; }
size_t CudaExecutor::activationBytes() const { return s_->keptBytes; }

Status CudaExecutor::runRange(int begin, int end, bool holdSends) {
  State &s = *s_;
  begin = std::max(begin, 0);
  end = std::min(end, s.host.stageProgram().instructions_size());
  Status st = s.issue(begin, end, holdSends);
  return st.isOk() ? s.sync() : st;
}


// (An instruction's floating-point operands and results have one type but
// the fp32 of losses and loads: the executable's validator, at prepare.)
// The kernel of instruction k (resolveKernels: by its op, once).
Status CudaExecutor::State::run(int k) {
  const pxe::Instruction &inst = host.stageProgram().instructions(k);
  if (!kernels[k]) return Status::error("no CUDA kernel for '" + opName(inst) + "'");
  return (this->*kernels[k])(inst);
}

// Each op the CUDA backend runs, and its kernel.
const CudaExecutor::State::KernelEntry CudaExecutor::State::kKernels[] = {
    {pxe::OP_EMBEDDING, &State::runEmbedding},
    {pxe::OP_POSITION_EMBEDDING, &State::runPositionEmbedding},
    {pxe::OP_LINEAR, &State::runLinear},
    {pxe::OP_HEAD_LINEAR, &State::runHeadLinear},
    {pxe::OP_RMS_NORM, &State::runNorm},
    {pxe::OP_LAYER_NORM, &State::runNorm},
    {pxe::OP_ROPE, &State::runRope},
    {pxe::OP_ATTENTION, &State::runAttention},
    {pxe::OP_ADD, &State::runBinary},
    {pxe::OP_MUL, &State::runBinary},
    {pxe::OP_SILU, &State::runUnary},
    {pxe::OP_SIGMOID, &State::runUnary},
    {pxe::OP_GELU, &State::runUnary},
    {pxe::OP_SOFTCAP, &State::runUnary},
    {pxe::OP_SWIGLU, &State::runSwiglu},
    {pxe::OP_RESHAPE, &State::runReshape},
    {pxe::OP_TRANSPOSE, &State::runTranspose},
    {pxe::OP_BROADCAST, &State::runBroadcast},
    {pxe::OP_SLICE, &State::runSlice},
    {pxe::OP_CACHE_UPDATE, &State::runCacheUpdate},
    {pxe::OP_RING_CACHE_UPDATE, &State::runRingCacheUpdate},
    {pxe::OP_CONCAT, &State::runConcat},
    {pxe::OP_BALANCE_LOSS, &State::runBalanceLoss},
    {pxe::OP_ROUTER, &State::runRouter},
    {pxe::OP_ROUTER_GRAD, &State::runRouter},
    {pxe::OP_ROUTER_LOAD, &State::runRouter},
    {pxe::OP_ROUTER_AUX_GRAD, &State::runRouter},
    {pxe::OP_EXPERTS_GRAD, &State::runExpertsGrad},
    {pxe::OP_EXPERTS, &State::runExperts},
    {pxe::OP_SHIFT, &State::runShift},
    {pxe::OP_LABEL_COUNT, &State::runLabelCount},
    {pxe::OP_LOGSUMEXP, &State::runLogsumexp},
    {pxe::OP_CROSS_ENTROPY, &State::runCrossEntropy},
    {pxe::OP_CROSS_ENTROPY_GRAD, &State::runCrossEntropy},
    {pxe::OP_LINEAR_WEIGHT_GRAD, &State::runLinearWeightGrad},
    {pxe::OP_RMS_NORM_GRAD, &State::runNormGrad},
    {pxe::OP_RMS_NORM_WEIGHT_GRAD, &State::runNormGrad},
    {pxe::OP_LAYER_NORM_GRAD, &State::runNormGrad},
    {pxe::OP_LAYER_NORM_WEIGHT_GRAD, &State::runNormGrad},
    {pxe::OP_SUM_TO, &State::runSumTo},
    {pxe::OP_SIGMOID_GRAD, &State::runSigmoidGrad},
    {pxe::OP_SOFTCAP_GRAD, &State::runSoftcapGrad},
    {pxe::OP_GELU_GRAD, &State::runGeluGrad},
    {pxe::OP_POSITION_EMBEDDING_GRAD, &State::runPositionEmbeddingGrad},
    {pxe::OP_SWIGLU_GRAD, &State::runSwigluGrad},
    {pxe::OP_ATTENTION_GRAD, &State::runAttentionGrad},
    {pxe::OP_EMBEDDING_GRAD, &State::runEmbeddingGrad},
    {pxe::OP_ALL_REDUCE, &State::runAllReduce},
    {pxe::OP_SHARD_SLICE, &State::runShardSlice},
    {pxe::OP_TO_PARTIAL, &State::runToPartial},
    {pxe::OP_ALL_GATHER, &State::runGatherScatter},
    {pxe::OP_REDUCE_SCATTER, &State::runGatherScatter},
    {pxe::OP_ALL_TO_ALL, &State::runGatherScatter},
    {pxe::OP_SEND, &State::runSendRecv},
    {pxe::OP_RECV, &State::runSendRecv},
    {pxe::OP_MOE_DISPATCH, &State::runExpertExchange},
    {pxe::OP_MOE_COMBINE, &State::runExpertExchange},
};

void CudaExecutor::State::resolveKernels() {
  const pxe::Stage &stage = host.stageProgram();
  kernels.assign(stage.instructions_size(), nullptr);
  waitsForPending.assign(stage.instructions_size(), true);
  for (int k = 0; k < stage.instructions_size(); ++k) {
    const pxe::Instruction &inst = stage.instructions(k);
    for (const KernelEntry &entry : kKernels)
      if (inst.kind() == entry.kind) kernels[k] = entry.kernel;
    waitsForPending[k] = isCollective(opName(inst)) || !capturable(inst);
  }
}

} // namespace parax::runtime

// The kernels, a file an op family.
#include "kernels/Embedding.cuh"
#include "kernels/Linear.cuh"
#include "kernels/Norms.cuh"
#include "kernels/Attention.cuh"
#include "kernels/KvCache.cuh"
#include "kernels/Elementwise.cuh"
#include "kernels/Layout.cuh"
#include "kernels/Moe.cuh"
#include "kernels/Loss.cuh"
#include "kernels/Collectives.cuh"
