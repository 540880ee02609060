//===- Profile.h - how a software stack runs on the hardware ----*- C++ -*-===//
//
// A cluster (Cluster.h) says what the hardware can do; a profile says what a
// software stack makes of it: how close its GEMMs come to the achievable
// peak as a function of their shape, which attention kernel it runs, how
// many passes over memory its elementwise ops take, what a kernel costs
// beyond its work, and which communication it hides behind compute. The
// search reads the two together (ClusterSpec::profile); every cost formula
// that depends on the stack asks the profile.
//
// Shipped profiles (docs/cost-model.md, "Profiles", with the documented
// behaviour each figure comes from): `roofline` (the ideal stack: fixed
// GEMM efficiency, flash attention, fused kernels, no overhead; a lower
// bound), `megatron-2021` (Megatron-LM as Narayanan et al. 2021 and
// Korthikanti et al. 2022 ran it), `megatron-core` (Megatron-Core with
// TransformerEngine: flash attention, fused kernels, overlapped DP and TP
// communication), `fsdp` (PyTorch FSDP / eager PyTorch, torchtitan-like),
// `deepspeed-zero3-2021` and `parax-cuda` (parax's own CUDA backend).
//
//===----------------------------------------------------------------------===//

#ifndef PARAX_PLAN_PROFILE_H
#define PARAX_PLAN_PROFILE_H

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace parax::plan {

enum class AttentionKernel {
  /// FlashAttention-class: the score matrix never leaves the chip; the
  /// FLOPs at `flashEfficiency` of the GEMMs' rate; causal masks skip
  /// the masked half.
  Flash,
  /// The score matrix written to HBM and read back (QK^T GEMM, softmax,
  /// dropout, PV GEMM as separate kernels), whole whatever the mask: the
  /// 2021-22 stacks.
  Materialized,
};
llvm::StringRef toString(AttentionKernel kind);

/// What a stack's selective recomputation re-runs in a layer's backward
/// (the rest of its forward's results are kept).
enum class SelectiveRecompute {
  /// parax's runtime (lib/Train/Recompute.cpp): norms, activations, rope,
  /// products, attention, and the GEMMs that widen 4x or more.
  Runtime,
  /// The attention core alone: Megatron-LM's `--recompute-activations`
  /// (Korthikanti et al. 2022) and Megatron-Core's default
  /// `recompute_modules` ["core_attn"].
  CoreAttention,
  /// Every op but the attention and every other GEMM of a layer (the
  /// 1st, 3rd, ... kept, the 2nd, 4th, ... re-run): torchtitan's op-level
  /// selective checkpointing (`_save_list` with `mm_count % 2`).
  AlternateGemms,
  /// None: the stack has no selective recomputation (Megatron-LM before
  /// 2022): the search does not try it; pinned, it re-runs nothing.
  None,
};
llvm::StringRef toString(SelectiveRecompute policy);

struct Profile {
  std::string name = "roofline";
  std::string description = "ideal kernels: fixed GEMM efficiency, flash attention, "
                            "one fused kernel an op, no launch cost (a lower bound)";
  // --- compute -----------------------------------------------------------
  /// GEMM efficiency by shape: the cluster's matmul_efficiency (the
  /// achievable peak of large GEMMs) times the tile and wave quantisation
  /// of the best of the device's GEMM tiles, times k / (k + gemmKOverhead)
  /// (a tile's pipeline fill and epilogue). False: matmul_efficiency for
  /// every shape.
  bool gemmShapes = false;
  double gemmKOverhead = 0;
  /// The share of the shorter of a GEMM's two times (its FLOPs' at the
  /// peak, its bytes' at the HBM rate) that its kernel does not hide under
  /// the longer: its time is the longer plus this share of the shorter.
  /// 0: the roofline (a GPU's loads run beside its tensor cores); 1: their
  /// sum (a CPU BLAS packs the operands' panels on the core that then
  /// multiplies them); between: a core that streams its weight while it
  /// multiplies, until the arithmetic takes most of the time. A calibrated
  /// profile takes the share that fits its GEMM timings best.
  double gemmUnhidden = 0;
  AttentionKernel attention = AttentionKernel::Flash;
  SelectiveRecompute selectiveRecompute = SelectiveRecompute::Runtime;
  /// Flash attention's FLOP/s as a share of the GEMMs' (matmul_efficiency).
  double flashEfficiency = 1;
  /// Flash attention's fixed cost a query, in keys: its FLOP/s are
  /// flashEfficiency's times T / (T + flashKeyOverhead), T the keys a
  /// query sees on average (a causal sequence's half; a query block's
  /// load, pipeline fill, masked diagonal block and final rescale cost
  /// about this many keys more). 0: every length at flashEfficiency.
  double flashKeyOverhead = 0;
  /// Flash attention's backward kernel's FLOP/s as a share of its forward
  /// kernel's (FlashAttention-2, cuDNN and FlashAttention-3 alike about
  /// 0.86 on an H100 at 4K-16K tokens: the FlashAttention-3 paper's
  /// figures; 1: the same rate).
  double flashBackwardRate = 1;
  /// Materialised attention: HBM bytes moved per score element in the
  /// forward pass (the backward pass moves twice as much, as every op's).
  double scoreBytes = 0;
  /// Materialised attention: bytes a score element the forward pass keeps
  /// for the backward (Megatron-LM's fused kernels with attention dropout:
  /// the softmax's output 2, the dropout's mask 1 and output 2 -- the
  /// 5 a s^2 b of Korthikanti et al. 2022, section 4.1), unless the
  /// attention is recomputed.
  double scoreKeptBytes = 0;
  /// The experts' intermediates a (token, choice) pair keeps for the
  /// backward, in bytes an element of the expert's width: 0 where the
  /// backward recomputes them from the dispatched rows (parax's runtime);
  /// 6 where the gated pair and the activation are kept in bf16
  /// (Megatron-Core's grouped MLP: 2 F x 2 + F x 2); 2 where the gated
  /// pair is kept in FP8 and the activation recomputed (DeepSeek-V3).
  double expertKeptBytes = 0;
  /// Memory-bound ops: HBM passes as a multiple of one fused kernel's
  /// (reads of the operands, one write of the result), per op class
  /// ("norm", "rope", "swiglu", "unary", "add": add and mul,
  /// "cross_entropy": the loss over the logits): an eager stack runs an
  /// RMSNorm as several kernels, some in fp32; a CPU's cross-entropy is
  /// bound by its exponentials, not its bytes.
  double normPasses = 1, ropePasses = 1, swigluPasses = 1, unaryPasses = 1, addPasses = 1,
         crossEntropyPasses = 1;
  /// gemm=fp8: the stack's quantisation of a GEMM's operands (scales,
  /// casts, the transposed copies its backward GEMMs read), as HBM passes
  /// over the operand's bytes in the model's dtype: over the activation
  /// input (forward) and the output gradient (backward) each, and over the
  /// weights each microbatch (training). 0: not costed.
  double fp8ActivationPasses = 0, fp8WeightPasses = 0;
  /// HBM bytes an optimizer step moves a parameter it updates (AdamW in
  /// fp32: master, m and v read and written, the gradient read: 16 as the
  /// planner has always counted it; a calibrated profile measures it).
  double optimizerBytes = 16;
  /// The experts' GEMMs (gathered rows, a GEMM an expert) as a share of
  /// the dense GEMMs' rate.
  double expertsEfficiency = 1;
  /// Under expert parallelism, the busiest rank's routed work over the
  /// mean rank's (a router's imbalance on its data; 1: balanced routing).
  /// The experts' time on an EP rank is the mean's times this: the
  /// combine waits for the busiest. `--calibrate` measures it (the EP
  /// runs' experts' time, the busiest rank's over the mean); the
  /// exchange's bytes are not scaled.
  double expertImbalance = 1;
  /// How the experts' GEMMs run: 0, one grouped kernel over a rank's
  /// local experts (they fill the device together); n > 0, a GEMM an
  /// expert, each launched on its own, n at once on as many streams
  /// (TransformerEngine's GroupedLinear on Hopper under FP8: one cuBLAS
  /// GEMM an expert on its pool of 4 compute streams; its docs, "Grouped
  /// GEMM", and transformer_engine/common/util/multi_stream.h).
  int expertGemmStreams = 0;
  /// The stack can fold its experts over the TP ranks (Megatron-Core's
  /// expert_tensor_parallel_size = 1, its EP group drawn from the TP x DP
  /// ranks): each expert whole on one rank, the TP ranks more expert ranks,
  /// the router and the dispatch on each rank's sequence shard. The search
  /// tries it beside experts split like the MLP (workload `etp=`); parax's
  /// runtime does not run it.
  bool expertFolding = false;
  /// Seconds each kernel costs beyond its work (launch gap, ramp-up, tail).
  double kernelOverhead = 0;
  // --- communication -----------------------------------------------------
  /// The stack's collectives' bus bandwidth as a share of NCCL's best on
  /// the link (the cluster's link efficiency).
  double collectiveEfficiency = 1;
  /// Per collective kind, a further share of that bus bandwidth
  /// (`collective_kinds`: all_reduce, all_gather, reduce_scatter,
  /// all_to_all, send_recv; 1 unless set): MPI on CPUs reduces in its own
  /// arithmetic and moves all-to-alls pairwise, so its kinds differ.
  double kindEfficiency[5] = {1, 1, 1, 1, 1}; // by CollectiveKind
  /// Per collective kind, by its message (the buffer collectiveTime is
  /// given), a further share of that bandwidth (`collective_size_curves`:
  /// a kind's [[MB, share], ...] with MB ascending; linear in log(bytes)
  /// between points, the end points' shares beyond them; none: 1 at any
  /// size): MPI on a CPU node copies through the last-level cache, and an
  /// all-reduce beyond it moves at a third of its pace (a calibrated
  /// profile measures each kind's curve, as nccl-tests does NCCL's).
  std::vector<std::pair<double, double>> sizeCurves[5]; // by CollectiveKind: (bytes, share)
  double sizeShare(int kind, double bytes) const;
  /// NCCL's protocols and algorithms: LL beside Simple, the tree beside
  /// the ring for all-reduce over nodes (false: a plain ring, as a
  /// calibrated MPI is costed).
  bool ncclProtocols = true;
  /// Shares of the tensor-parallel and expert all-to-all time hidden
  /// behind independent compute (0: the compute stream waits).
  double tpOverlap = 0, epOverlap = 0;
  /// Training: a microbatch's expert all-to-alls run beside another
  /// microbatch's compute, a forward pass merged with a backward
  /// (Megatron-Core's overlap_moe_expert_parallel_comm): hidden up to the
  /// layer's compute, exposed where they outlast it.
  bool epOverlapCompute = false;
  /// With epOverlapCompute: the SMs the expert dispatch and combine
  /// kernels hold while compute runs beside them (HybridEP's
  /// moe_hybridep_num_sms, 32 in Megatron-Bridge's performance recipes):
  /// the compute beside an exchange runs on the rest, so each second of
  /// exchange hidden costs this share of the SMs' second of compute.
  int epOverlapSms = 0;
  /// TP collectives decomposed with their GEMMs (TransformerEngine's
  /// userbuffers, with sequence parallelism): each hidden up to its GEMMs'
  /// time (LayerPlan::commBehindGemms) instead of by the tpOverlap share.
  bool tpOverlapGemms = false;
  /// With tpOverlapGemms: the backward's conjugate collectives decomposed
  /// too (TransformerEngine's userbuffers), or the forward's alone, the
  /// backward's exposed (PyTorch's AsyncTP as torchtitan ran it in 2024:
  /// "~20% forward pass speedup and ~8% E2E speedup in Llama3 70B").
  bool tpOverlapBackward = true;
  /// With tpOverlapGemms: a decomposed GEMM runs as tp chunks, one a
  /// peer's rows; the GEMMs beside a decomposed reduce-scatter leave this
  /// many SMs to it (TransformerEngine's userbuffers "pipeline" overlap:
  /// num_sm 16 with set_sm_margin, its default; PyTorch's AsyncTP: 0).
  int tpOverlapSms = 0;
  /// The chunks a GEMM decomposed with a reduce-scatter runs in (0: tp;
  /// TransformerEngine's "pipeline" overlap: num_splits 4).
  int tpOverlapSplits = 0;
  /// The expert dispatch sends a token once to each node holding its
  /// experts, over the scale-out network, and fans it out over NVLink there
  /// (DeepSeek's DeepEP); false: one copy an expert (an all-to-all).
  bool epNodeDispatch = false;
  /// With gemm=fp8, the expert dispatch sends its rows in FP8, quantised
  /// before it (DeepSeek-V3, section 3.3); false: in the model's dtype,
  /// the experts' GEMMs quantising them after (Megatron-Core's all-to-all
  /// dispatcher permutes and exchanges the bf16 hidden states; its HybridEP
  /// path refuses an fp8 dispatch). The combine is in the model's dtype
  /// either way.
  bool epDispatchFp8 = true;
  /// An interleaved schedule's exchanges between stages run beside the
  /// next chunk's compute (Megatron-Core's overlap_p2p_comm, its default
  /// with virtual stages): exposed only along the fill and drain, and
  /// where a transfer outlasts a chunk's forward pass.
  bool ppOverlap = false;
  /// Without sequence parallelism, each of a stage's tp ranks sends its
  /// 1/tp piece of the (replicated) boundary activation to its peer, and
  /// the receiving stage all-gathers the pieces over its TP group
  /// (Megatron-LM's scatter_gather_tensors_in_pipeline, on by default from
  /// Narayanan et al. 2021, section 4.1, until Megatron-Core): a boundary
  /// costs a send of 1/tp of it plus an all-gather over the TP links,
  /// instead of every rank sending it whole.
  bool ppScatterGather = false;
  /// Whether a pipeline boundary goes in tp pieces (ppScatterGather): a
  /// replicated one (no sequence parallelism) over tp > 1 ranks.
  bool boundaryInPieces(int64_t tp, bool sequenceParallel) const {
    return ppScatterGather && !sequenceParallel && tp > 1;
  }
  /// Pipeline stages hold equal counts of decoder layers (the embedding
  /// on the first, the output head and loss on the last, beside them),
  /// and an interleaved schedule's chunks equal counts of a stage's:
  /// Megatron-LM's rule (arguments.py: the layers divisible by pp, a
  /// stage's layers by the layers a virtual stage holds). Off, stages
  /// are split by time (parax's runtime).
  bool pipelineEvenSplit = false;
  /// The share of the SMs left to compute kernels while the stack's
  /// communication kernels run beside them (DeepSeek-V3: 20 of 132 SMs
  /// given to communication, 112/132): FLOP-bound ops run at that share
  /// of their rate.
  double computeShare = 1;
  /// Data-parallel gradient reduction (ZeRO-0/1/2) overlapped with the
  /// last microbatch's backward pass (Megatron-Core's overlap_grad_reduce,
  /// DDP's buckets); false: it starts after the backward pass.
  bool dpOverlap = true;
  /// Megatron-Core's gradient buckets (distributed_data_parallel.py,
  /// param_and_grad_buffer.py): filled walking a stage's parameters
  /// backwards from its last layer, each closed once it holds
  /// max(`dpBucketParams`, `dpBucketParamsPerRank` x DP) parameters (a
  /// device's). The last one formed holds the stage's first layers (the
  /// embedding on the first stage): its reduction starts only when the
  /// backward is done, so it is exposed whatever the overlap. With
  /// `dpParamGatherOverlap` (overlap_param_gather, ZeRO-1/2) the updated
  /// parameters are gathered bucket by bucket in the next forward, the
  /// first (that same bucket) before any layer runs, the rest behind the
  /// first microbatch's forward; without it they are gathered after the
  /// optimizer step, all exposed. 0: no buckets modelled (the whole sync
  /// hides behind the last backward).
  double dpBucketParams = 0, dpBucketParamsPerRank = 0;
  bool dpParamGatherOverlap = false;
  /// The bucket's parameters over `dp` ranks (0: no buckets).
  double dpBucketFor(int64_t dp) const { return std::max(dpBucketParams, dpBucketParamsPerRank * dp); }
  /// SMs a data-parallel collective's kernels hold while it runs beside
  /// the compute (the gradient sync's hidden part, ZeRO-3's gathers and
  /// reduce-scatters): NCCL runs a CTA a channel for the whole
  /// collective, and a GEMM's CTA (~200 KB of shared memory on Hopper)
  /// cannot share its SM. The compute beside it takes that share of the
  /// SMs' time longer (hidden time x sms / SMs). 0: free.
  int dpOverlapSms = 0;
  /// ZeRO-3 / FSDP: parameters gathered layer by layer, `zero3Prefetch`
  /// layers ahead (0: none, the compute waits for each gather), in
  /// messages of at most `zero3BucketBytes` (0: a layer's parameters in
  /// one), each gradient reduce-scattered in messages of at most
  /// `reduceBucketBytes` (0: a layer's; ZeRO-0/1/2's gradient reduction
  /// and parameter gather likewise, 0: one message), on one communication stream
  /// beside the compute (Planner.cpp simulates the two). One gather serves
  /// a layer's backward and its recomputed forward.
  int zero3Prefetch = 1;
  double zero3BucketBytes = 0, reduceBucketBytes = 0;
  /// ZeRO-3 as DeepSpeed's stage 3 ran it in 2021 (v0.3, partition_parameters.py):
  /// one collective a parameter tensor instead of buckets
  /// (`zero3_tensor_messages`); tensors of fewer than
  /// `zero3PersistElements` elements (a device's part) kept whole on every
  /// rank, never gathered (stage3_param_persistence_threshold); a layer's
  /// parameters gathered for its recomputed forward kept for its backward
  /// only when they are at most `zero3ReuseElements` (max_reuse_distance;
  /// 0: always kept), else gathered again.
  bool zero3TensorMessages = false;
  double zero3PersistElements = 0, zero3ReuseElements = 0;
  /// torch.distributed's list forms of all-gather and reduce-scatter
  /// (PyTorch <= 1.10) copy each rank's piece in a kernel of its own: a
  /// ZeRO-3 collective over n ranks costs n kernels more.
  bool collectiveListCopies = false;
  /// The weight-gradient GEMMs accumulate into the fp32 gradient sums
  /// (Megatron's gradient_accumulation_fusion, on by default): no gradient
  /// in the model's type is held (false: parax's runtime, which writes each
  /// bf16 gradient and then adds it to its sum).
  bool gradientFusion = false;
  /// Bytes an element of the gradients the data-parallel reduction moves
  /// (4: fp32 sums, as parax's runtime and Megatron's bf16 training reduce
  /// them; 2: DeepSpeed's fp16 gradients).
  double reduceBytes = 4;
  /// A pipeline stage's memory for its exchanges. `pipelineOutputsKept`:
  /// the activation a stage sends on is kept until that microbatch's
  /// backward (parax's runtime; Megatron-LM until 2022), not freed once
  /// sent (Megatron-Core's deallocate_pipeline_outputs, on in its
  /// training loop). `pipelineGradientSets`: each microbatch in flight has
  /// its own buffers for the gradient it receives and the one it sends
  /// back (parax's runtime's activation sets, docs/cuda.md), not one pair
  /// live during one microbatch's backward.
  bool pipelineOutputsKept = true, pipelineGradientSets = true;
  /// An interleaved schedule's activations: a slot a microbatch in each
  /// model chunk, as many as the chunk ever holds at once (parax's
  /// runtime), or each chunk pass's own allocation freed after its
  /// backward, the most passes at once (a caching allocator: Megatron-LM,
  /// torch.distributed.pipelining). runtime::InFlightMemory.
  bool pipelineActivationSlots = true;
  /// The loss's own buffers at its peak, in logits-sized buffers (the
  /// model's dtype) beyond the logits and their gradient: an eager fp32
  /// cross-entropy holds its fp32 copy and log-softmax (or, backward, the
  /// log-softmax, its fp32 gradient and the cast one): 10 bytes a bf16
  /// logit against the 4 of the two, 3 buffers more.
  double lossBuffers = 0;
  /// parax's runtime's own buffers: a stage's kernel scratch (the CUDA
  /// backend's) and the optimizer's two staging boxes; another stack
  /// holds neither.
  bool runtimeBuffers = true;
  /// ZeRO-3 under a pipeline: the stage's parameters gathered once a step
  /// and kept (not resharded after each forward) and its gradients kept
  /// unsharded in the reduction type until the last microbatch, reduced
  /// once (torchtitan: `reshard_after_forward=False` with PP, the
  /// schedule's no-sync microbatches).
  bool zero3PipelineUnsharded = false;
  /// ZeRO-3: each gathered layer's parameters copied out of the gather's
  /// buffer into their own tensors on the compute stream before the layer
  /// runs (FSDP2's foreach_all_gather_copy_out: a split_with_sizes_copy
  /// after waiting for the gather), a read and a write of the gathered
  /// bytes on the critical path.
  bool zero3CopyOut = false;
  /// gemm=fp8: a sequence-parallel all-gather that GEMMs read moves the
  /// shard after its quantisation, one byte an element (TransformerEngine's
  /// gather_along_first_dim with the input's quantizer; torchao's
  /// Float8ColwiseParallel casts before redistributing), and so does the
  /// backward's gather of the output gradient (TransformerEngine's
  /// grad_output quantizer; torchao's NoopFwToFloat8BwDynamic).
  bool tpGatherFp8 = false;
  /// Sequence-parallel collectives along the sequence of [batch, sequence,
  /// hidden] values (DTensor's Shard(1): torchtitan), not along their
  /// first dimension: PyTorch's functional all-gather gathers along
  /// dimension 0 and cats the pieces along the sequence, its
  /// reduce-scatter cats its input's pieces first (torch.cat of
  /// torch.chunk: a read and a write of the whole value). Where a GEMM
  /// reads the gathered value or writes the one scattered the copy is a
  /// kernel of its own: the forward's gathers and reduce-scatters, the
  /// backward's gathers of output gradients, and its reduce-scatters of
  /// an input's gradient where one GEMM reads the input (where several
  /// do, the compiler writes their data gradients' sum in the scattered
  /// order). AsyncTP's fused gather-GEMM and GEMM-reduce-scatter
  /// (tp_overlap_gemms) take the pieces as they are.
  bool spGatherCopies = false;
  /// Whether the stack can move a layer's value from one split to another
  /// by an all-to-all over the TP group (parax's partitioner can).
  /// Megatron's and DTensor's tensor parallelism cannot: their layers
  /// split and join values only by the column and row layouts'
  /// all-gathers, reduce-scatters and all-reduces, and the search keeps
  /// to those.
  bool tpAllToAll = true;
  /// The highest ZeRO stage the stack implements (Megatron-LM 2021: none;
  /// Megatron-Core's distributed optimizer: 1): the search tries no other.
  int maxZero = 3;
  /// The parallelisms the stack implements beyond TP, PP, DP and EP:
  /// sequence parallelism (Megatron-LM since 2022) and context
  /// parallelism (Megatron-Core since 2023). The search tries neither
  /// where the stack has none; a pinned sp=1 or cp= is costed whatever.
  bool sequenceParallel = true, contextParallel = true;
  /// The default: the kernels' lower bound.
  bool isRoofline() const { return name == "roofline"; }

  /// The profile as JSON (the format parseProfile reads).
  std::string toJson() const;
  /// One line: the assumptions a report prints under its table.
  std::string summary() const;
};

/// Reads a profile from JSON text; every field but `name` is optional (the
/// roofline profile's value when absent); unknown fields are an error.
llvm::Expected<Profile> parseProfile(llvm::StringRef json,
                                     llvm::StringRef source = "<json>");

/// A shipped profile's name, or a path to a JSON file.
llvm::Expected<Profile> resolveProfile(llvm::StringRef spec);

/// Names of the shipped profiles, sorted.
std::vector<std::string> profileNames();

/// A GEMM's achievable share of `matmulEfficiency` on a device with
/// `multiprocessors` SMs: the best, over the GEMM tiles a library
/// chooses from, of the tile and wave quantisation of the (m x n) output,
/// times k / (k + kOverhead). 1 for a shape no quantisation touches.
double gemmShapeEfficiency(double m, double n, double k, int64_t multiprocessors,
                           double kOverhead);

} // namespace parax::plan

#endif // PARAX_PLAN_PROFILE_H
