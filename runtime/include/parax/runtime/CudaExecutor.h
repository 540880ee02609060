// CudaExecutor.h - the CUDA backend: the same executable, run on one GPU per
// rank (cuBLAS GEMMs, a CUDA kernel per op, NCCL collectives).
//
// Built only when PARAX_ENABLE_CUDA resolves ON; this header has no CUDA
// types, so CPU-only code can include it.

#ifndef PARAX_RUNTIME_CUDAEXECUTOR_H
#define PARAX_RUNTIME_CUDAEXECUTOR_H

#include "parax/runtime/BufferPlan.h"
#include "parax/runtime/Checkpoint.h"
#include "parax/runtime/PipelineSchedule.h"
#include "parax/runtime/Status.h"
#include "parax/runtime/Tensor.h"
#include "parax/runtime/executable.pb.h"

#include <memory>
#include <optional>
#include <utility>
#include <string>
#include <map>
#include <vector>

namespace parax::runtime {

/// GPUs visible to this process; 0 (never an error) when there is no driver,
/// no device, or CUDA reports anything else ("no GPU, skip").
int cudaDeviceCount();

/// NCCL communicators for a grid: a world communicator (its id broadcast
/// over MPI) split into one communicator per set of grid axes, and a
/// watchdog that aborts them and reports rank and operation on an
/// asynchronous error or after `timeoutSeconds`.
/// When this node has more ranks than GPUs (NCCL before 2.30 allows one
/// rank per device in a communicator), or PARAX_COLLECTIVES=mpi, every rank
/// instead stages collectives through host memory and MPI: same results,
/// lower bandwidth. PARAX_COLLECTIVES=nccl keeps NCCL where ranks share a
/// GPU if NCCL is 2.30 or newer (NCCL_MULTI_RANK_GPU_ENABLE=1), and stages
/// otherwise; any other value is an error.
/// Release with destroyNcclCommunicator (before MPI_Finalize).
class NcclCommunicator;
class Executor;
StatusOr<NcclCommunicator *>
createNcclCommunicator(const std::vector<int64_t> &shape, int rank, int size,
                       int device, double timeoutSeconds = 300);
void destroyNcclCommunicator(NcclCommunicator *comm);
/// True when `comm` stages collectives through MPI (see above).
bool isHostStaged(const NcclCommunicator *comm);
/// Where ranks share a GPU under PARAX_COLLECTIVES=nccl: how their
/// collectives run, with NCCL's version (empty otherwise).
std::string collectivesNote(const NcclCommunicator *comm);

class CudaExecutor {
public:
  CudaExecutor();
  ~CudaExecutor();
  /// What a program borrows from another prepared on the same rank.
  enum class Share {
    Weights,         // another microbatch's program: its own KV caches
    WeightsAndCaches // the same microbatch's prefill program
  };
  /// `comm` may be null for a grid of one rank. With `share` (another
  /// program prepared on this rank: a generation's prefill, or the same
  /// program for another microbatch), the parameters it holds in the same
  /// box (and, with Share::WeightsAndCaches, the KV caches it writes in
  /// place of the same input and shape) are its memory, not loaded or
  /// allocated again; `share` must outlive this executor. The two also
  /// share cuBLAS's workspaces and, when `share`'s is large enough, the
  /// memory of their temporaries (outputs among them): run them one after
  /// the other (each run returns when the GPU is done), and read one's
  /// outputs before the other runs.
  Status prepare(const pxe::Executable &exe, int rank, NcclCommunicator *comm,
                 const Checkpoint &weights, const std::vector<Tensor> &inputs,
                 int device, const CudaExecutor *share = nullptr,
                 Share what = Share::WeightsAndCaches);
  /// Parameters, KV caches and results of parameter moves run once at
  /// prepare (the same moves of the same parameters) that prepare took
  /// from `share`.
  size_t sharedParameters() const;
  /// The parameters prepare looked for in `share` (sharedParameters of
  /// them found): every one but those read only through parameter moves,
  /// which share the moves' results instead (sharedMoves).
  size_t offeredParameters() const;
  size_t sharedCaches() const;
  size_t sharedMoves() const;
  /// Whether this program's temporaries live in `share`'s memory.
  bool borrowsTemporaries() const;
  Status setInputs(const std::vector<Tensor> &inputs);
  /// One step; returns when the GPU is done. From the second step on, a
  /// stage with no collectives and no host synchronisation replays the
  /// step as one CUDA graph (PARAX_CUDA_GRAPHS=0: never).
  Status run();
  std::vector<Tensor> outputs() const;
  /// An earlier step's results: outputs() writes results of the same shape
  /// into their memory instead of fresh memory (a prefill's fp32 logits
  /// are a gigabyte, which the host would zero page by page each step).
  void recycle(std::vector<Tensor> results);

  /// Pipeline training (1F1B, interleaved). After prepare, with the
  /// stage's ranges (runtime::pipelineRanges): each microbatch keeps the
  /// inputs, the temporaries live across a range's start, what a range
  /// receives first and what it sends last (see exchange) in memory of its
  /// own; temporaries within one range share the arena. With `sets`
  /// microbatches in flight at once; with several model chunks, what only
  /// chunk c's ranges touch in chunkSets[c] slots of its own
  /// (runtime::chunksInFlight: fewer microbatches hold a later chunk). No
  /// CUDA graphs then.
  /// `gradientsBound`: bindOptimizer will bind every gradient output, so
  /// each is read (added to its sum) right after the range that writes it
  /// and shares the arena rather than taking a set's memory. With no
  /// ranges, only that changes: each gradient is then added to its sum
  /// right after the instruction that writes it (every microbatch's run
  /// calls streamGradients first) and has no memory past its last use.
  Status holdActivations(int sets, const std::vector<int64_t> &chunkSets, const std::vector<PipelineRange> &ranges,
                         bool gradientsBound = false);
  /// Microbatch `micro`'s activations for the next setInputs, exchange and
  /// runRange (its slot of each pool).
  Status useActivations(int64_t micro);
  int activationSets() const;
  size_t activationBytes() const; // device memory kept for activations, every slot
  /// One pipeline step's communication, as one NCCL group: the sends the
  /// ranges before held, and the leading receives of each range
  /// (microbatch, first instruction) the step will run; runRange then
  /// skips those receives. Megatron's interleaved schedule receives a
  /// step's forward and backward inputs together, before either runs: a
  /// send may wait for its receive (NCCL), and apart the stages would wait
  /// for each other (bench/pipeline_p2p_model.py).
  Status exchange(const std::vector<std::pair<int64_t, int>> &microAndBegin);
  /// Instructions [begin, end) of the stage; returns when the GPU is done.
  /// With `holdSends`, the range's sends after its last receive are held
  /// and issued with the next exchange's (or range's, or run's) leading
  /// receives as one group: in 1F1B two neighbouring stages each send
  /// before they receive (stage s the activations of microbatch m + 1,
  /// stage s + 1 the gradient of m), and a send may wait for its receive
  /// (NCCL), so apart they would wait for each other. The step's last
  /// range holds none.
  Status runRange(int begin, int end, bool holdSends);

  /// Before prepare: keep the parameters' values as loaded (fp32, before
  /// their rounding to the storage dtype) on the host for
  /// takeLoadedParameters, so that an optimizer's fp32 master copies start
  /// from the checkpoint's values, not from their bf16 rounding.
  void keepLoadedParameters();
  /// Those values, indexed by buffer id (other buffers empty), moved out:
  /// the host copies go.
  std::vector<Tensor> takeLoadedParameters();
  /// Writes new values into the parameter boxes `values` holds (indexed by
  /// buffer id; empty: unchanged), rounded to their storage dtype, then runs
  /// the moves of parameters that prepare ran once again, on the device.
  Status updateParameters(const std::vector<Tensor> &values);

  /// The optimizer on the device: a training run's parameters stay on the
  /// GPU, with fp32 master copies of them and AdamW's moments in device
  /// memory beside them. Each step's gradients are summed over its
  /// microbatches there, averaged over the data-parallel replicas by NCCL
  /// (ZeRO: reduce-scattered over the ranks holding the box, each updating
  /// its chunk of it, then an all-gather of the new values) and applied by
  /// one kernel per box. parax-run's Training decides which gradient
  /// updates which box, the chunks, the learning rate and the clipping; the
  /// arithmetic is its host optimizer's, element for element.
  struct Gradient {
    int output;    // its index among the stage's outputs
    int parameter; // the buffer id of the parameter box it updates
    // ZeRO: this rank's chunk [begin, end) of the flattened box, `size`
    // values a chunk (the box padded to size x members); else the box.
    int64_t begin, end, size;
    // ZeRO: the ranks holding the box (a mask of grid axes: dp, and those
    // of ep, cp, tp it is replicated over), how many, and this rank's
    // place among them.
    unsigned axes = 0;
    int64_t members = 1, index = 0;
    // A stage's part of a gradient (a weight several stages read): the
    // world ranks whose parts are added once a step, in stage order, this
    // rank among them; else empty.
    std::vector<int> partRanks;
    // The grid axes the gradient is a partial sum over (a mask; within
    // `axes` under ZeRO): its reduction sums over them too (without ZeRO:
    // an all-reduce over dp and them). `copies`: the equal copies of the
    // whole sum that reduction adds up, its mean's divisor besides the
    // microbatches (the replicas; ZeRO: the members over the partial
    // axes' ranks).
    unsigned partialAxes = 0;
    int64_t copies = 1;
  };
  struct OptimizerSetup {
    bool adamw = false;   // else SGD (no moments)
    int replicaAxis = -1; // the grid axis "dp" (-1: none)
    int64_t replicas = 1; // along that axis
    bool zero = false; // ZeRO: optimizer state split over each box's ranks
    // ZeRO-2: the gradient sums too. Each microbatch's gradients are
    // reduce-scattered as they are made (fp32, through two staging boxes
    // the size of the largest padded box), into this rank's chunk of the
    // sums; else (ZeRO-1) the sums are whole and reduced once a step.
    bool shardSums = false;
    // ZeRO-3 (with shardSums): the parameters too. A split box is kept as
    // the rank's chunk between uses; before the instructions that read it
    // (each run of them: the forward's, the backward's, each pipeline
    // range's) an all-gather puts it together in a shared block of memory
    // placed like the temporaries, and the update writes the chunk only.
    // Not for a box a move of parameters reads (hoisted at prepare).
    bool shardParameters = false;
  };
  /// Allocates the gradients' sums, the masters (from `masters`, indexed
  /// by buffer id: whole fp32 boxes, of which a ZeRO replica keeps its
  /// chunk) and the moments (zeros). Bound gradient outputs are no longer
  /// copied by outputs() (empty tensors there).
  Status bindOptimizer(const std::vector<Gradient> &gradients, const OptimizerSetup &setup,
                       const std::vector<Tensor> &masters);
  /// After a run: adds its gradients to the step's sums (`first`: the
  /// step's first microbatch, whose gradients replace them). With `range`
  /// (an index into holdActivations' ranges): after that range, the
  /// gradients it writes (a forward range's go with the last range).
  Status accumulateGradients(bool first, int range = -1);
  /// Instead of accumulateGradients after the step's last microbatch,
  /// before it (its run, or its backward half's runRange): that run adds
  /// each gradient to its sum right after the instruction that writes it
  /// and issues the data-parallel all-reduce of the sum's bucket once the
  /// bucket's last box is summed (ZeRO: the box's reduce-scatter then),
  /// on the collectives' stream, so that the reductions overlap the
  /// rest of the backward pass (as DDP's and Megatron's buckets do; what
  /// the planner's step time assumes). PARAX_CUDA_OVERLAP=0: all of them
  /// after the run's last instruction.
  /// With `range`: during that range's runRange, its gradients (each
  /// backward range of the last microbatch streams its own).
  /// With `reduce` false (a microbatch before the step's last, without
  /// ranges): each gradient is added to its sum right after the
  /// instruction that writes it, and nothing reduced (but ZeRO-2's
  /// reduce-scatter of each microbatch's gradients): every microbatch of a
  /// step without ranges streams so, since holdActivations then gives a
  /// bound gradient no memory past its instruction.
  Status streamGradients(bool first, int range = -1, bool reduce = true);
  /// Of the last such run: reductions issued with instructions still to run.
  size_t gradientsReducedEarly() const;
  /// Without ZeRO, over replicas: the buckets the gradient sums are
  /// all-reduced in (one NCCL call each; PARAX_CUDA_BUCKET_BYTES, default
  /// 25 MiB), and the boxes they hold.
  struct GradientBuckets {
    size_t buckets = 0, boxes = 0;
  };
  GradientBuckets gradientBuckets() const;
  /// The sums averaged over `microbatches` and the replicas (ZeRO: this
  /// replica's chunk of them, reduce-scattered in place). Per gradient,
  /// the sum of the squares of the values this rank updates. Every rank of
  /// the dp group calls it.
  StatusOr<std::vector<double>> averageGradients(int64_t microbatches);
  struct OptimizerStep {
    double lr, beta1, beta2, eps, weightDecay;
    double clip;                     // the gradients' scale (clipping; 1: none)
    double correction1, correction2; // AdamW's bias corrections
    std::vector<bool> decays;        // per gradient: weight decay applies
  };
  /// Updates masters (and moments), rounds them into the parameter boxes
  /// (ZeRO: all-gathered over the replicas), runs the moves of parameters
  /// that prepare ran once again, and waits for the GPU.
  Status applyOptimizer(const OptimizerStep &step);
  /// Host copies, for writing at the end of a run: per gradient, the last
  /// step's mean over its microbatches and the replicas (ZeRO: the chunks
  /// all-gathered); the fp32 masters put whole into values[parameter]
  /// (ZeRO: all-gathered into the sums' memory, so after gradientSums);
  /// AdamW's moment (`which` 0: m, 1: v) per gradient, of the values this
  /// rank updates (end - begin); the fp32 masters likewise, nothing
  /// gathered (a ZeRO rank's own chunks, for a box-wise checkpoint). Under
  /// ZeRO every rank of the dp group calls the first two.
  StatusOr<std::vector<Tensor>> gradientSums();
  Status readMasters(std::vector<Tensor> &values);
  StatusOr<std::vector<std::vector<float>>> readMoments(int which) const;
  StatusOr<std::vector<std::vector<float>>> readMasterChunks() const;
  /// Bytes the four calls above copied to the host so far.
  size_t readBackBytes() const;
  /// Replaces the moments (a resumed run's), as readMoments gives them.
  Status writeMoments(int which, const std::vector<std::vector<float>> &values);
  /// ZeRO-3: the parameter boxes kept as chunks, those chunks' bytes, the
  /// bytes of the block they are gathered into, and how many all-gathers
  /// so far were issued ahead of the instruction reading them (so that
  /// they run beside the compute before it).
  struct ShardedParameters {
    size_t boxes = 0, chunkBytes = 0, gatherBytes = 0, gatheredAhead = 0;
  };
  ShardedParameters shardedParameters() const;
  /// Device memory of the optimizer (sums, masters, moments; ZeRO's
  /// staging for a box not a multiple of its ranks; ZeRO-2's staging).
  size_t optimizerBytes() const;

  /// Each row's most likely token of the first output (logits [..., V]),
  /// picked on the GPU: greedy generation copies one index a row to the
  /// host. The last stage only.
  StatusOr<std::vector<int32_t>> greedyTokens();
  int stage() const;
  size_t instructionCount() const;
  /// True once steps run as one captured CUDA graph (see run()).
  bool replaysGraph() const;
  /// Instructions the last step issued while a collective's transfer was
  /// still running (the compute stream waits for a collective only before
  /// the first instruction that touches its buffers; PARAX_CUDA_OVERLAP=0:
  /// right after it, and this is 0).
  size_t overlappedInstructions() const;
  /// Instructions prepare ran once because they only move parameters
  /// (slices, shard_slices, ... of weights): steps skip them.
  size_t hoistedInstructions() const;
  /// As Executor::busiestExpertLoad (the expert dispatches over several ranks).
  double busiestExpertLoad() const;
  /// As Executor::setLabelCount (parax-run --per-token-loss).
  void setLabelCount(std::optional<float> count);
  /// As Executor::takeExpertCounts (counted on the device; this waits for it).
  StatusOr<std::map<int32_t, std::vector<double>>> takeExpertCounts();
  /// Concats of a KV cache and new keys or values that the decode attention
  /// reads in place (not issued).
  size_t cacheReadsInPlace() const;
  /// Which kernels run the stage's attention and attention_grad ops: how
  /// many through cuDNN's SDPA, the rest on the backend's own kernels and
  /// the first reason why ("" when the stage has none).
  const std::string &attentionPath() const;
  /// KV caches (inputs) that cache_update writes in place: the new rows
  /// only, and the input holds the updated cache after the step.
  size_t cacheWritesInPlace() const;
  /// Where the step's temporaries live: one arena they share (its size, the
  /// lower bound, and what one allocation each would take).
  const BufferPlan &temporaries() const;
  /// With PARAX_CUDA_MEMORY_PEAK=1: the instruction where the shared
  /// temporaries peak and the largest buffers live there; else empty.
  const std::string &memoryPeak() const;
  /// Temporaries written into the memory of an operand they are the last
  /// reader of (elementwise ops of one shape): not in temporaries().
  size_t inPlaceTemporaries() const;
  /// Device memory this executor has allocated (weights, inputs,
  /// temporaries, workspaces, scratch; not NCCL's own).
  size_t deviceBytes() const;
  /// Of which the kernels' scratch buffer (grown by the steps to the largest
  /// any instruction needed; the planner's `scratch`).
  size_t scratchBytes() const;
  /// One more step, kernel by kernel, timing each instruction on the GPU:
  /// compute-stream time from its issue to the next instruction's (a wait
  /// for a collective counts for the instruction that needs its result).
  /// Per op, in order of first appearance. Every rank must call it (the
  /// step's collectives).
  struct OpTime {
    std::string op;
    double ms = 0;
    int count = 0;
  };
  StatusOr<std::vector<OpTime>> profileStep();
  /// One more step, each instruction timed on the device by events:
  /// seconds by instruction (-1: not run, e.g. hoisted). parax-run
  /// --profile on cuda.
  StatusOr<std::vector<double>> timeInstructions();
  /// The CPU executor this one loaded through (its stage program, the
  /// rank's coordinates).
  const Executor &hostExecutor() const;

private:
  struct State;
  std::unique_ptr<State> s_;
};

} // namespace parax::runtime

#endif // PARAX_RUNTIME_CUDAEXECUTOR_H
