// Trainer.h - a training step's gradients, where they are averaged and
// gathered, and the optimizer that applies them (parax-run and Session,
// Session.h, train through it).
//
// A training step's program returns each parameter's gradient from every
// stage that holds the parameter, in the parameter's split (each rank its
// box). Here: the gradients are averaged over microbatches and over the
// data-parallel replicas (an all-reduce over "dp", or with ZeRO a
// reduce-scatter over every rank holding the box: each then updates its
// share of the box and an all-gather puts it back together), clipped by
// their global norm,
// and applied to the rank's parameter boxes (SGD or AdamW, in fp32). A
// weight several stages read (a tied embedding and head) has a part of its
// gradient on each of them: the parts are added first, on each of them,
// in stage order (the same sum everywhere, so the copies stay equal). The
// writer gathers whole tensors from the boxes (gradients for --output,
// parameters for --save-weights).

#ifndef PARAX_RUNTIME_TRAINER_H
#define PARAX_RUNTIME_TRAINER_H

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include "parax/runtime/Checkpoint.h"
#include "parax/runtime/StallWatchdog.h"
#include "parax/runtime/Status.h"
#include "parax/runtime/Tensor.h"
#include "parax/runtime/executable.pb.h"

#include <mpi.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace parax::runtime {

/// Joins a later microbatch's or replica's result to `into`: its rows
/// appended; a scalar's value collected (for a mean).
void appendRows(Tensor &into, const Tensor &part);

struct OptimizerConfig {
  std::string kind; // "sgd", "adamw"; empty: no optimizer
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weightDecay = 0;  // decoupled (AdamW), on matrices only (rank >= 2)
  double clipNorm = 0;     // the gradients' global L2 norm at most this (0: no clipping)
  bool zero = false;       // ZeRO: optimizer states split over the ranks holding each box
  int zeroStage = 0;       // 1, or 2: the gradient sums split too (the CUDA device optimizer)
  // The learning rate of step t (1, 2, ...; a resumed run goes on counting):
  // lr t / W for the first W warm-up steps, then from lr down to minLr by
  // step decaySteps along `schedule` ("constant", "linear", "cosine"), minLr
  // after it (Megatron's schedules).
  int64_t warmupSteps = 0, decaySteps = 0;
  std::string schedule = "constant";
  double minLr = 0;
  // A step whose gradients are not finite (their global norm NaN or
  // infinite): stop, naming it (false), or skip its update, as
  // mixed-precision trainers do, and count it (true: --skip-nonfinite).
  bool skipNonfinite = false;
};

/// The learning rate of optimizer step `step` (see OptimizerConfig).
double learningRate(const OptimizerConfig &config, int64_t step);

/// One AdamW update's factors for a step: gradient clip, betas, learning
/// rate, weight decay (decoupled: Loshchilov & Hutter, as torch.optim.AdamW),
/// eps and the bias corrections 1 - beta^t.
struct AdamwFactors {
  double clip, beta1, beta2, lr, decay, eps, correction1, correction2;
};
/// p, m, v updated in place from g, n elements each (fp32).
void adamwUpdate(float *p, float *m, float *v, const float *g, size_t n, const AdamwFactors &f);
/// The sum of x's squares (a gradient norm's part).
double sumOfSquares(const float *x, size_t n);

/// One rank's share of a training run. `mpi`: launched under MPI (else a
/// single rank, no MPI calls); `waits` watches every blocking MPI call.
class Trainer {
public:
  Trainer(const pxe::Executable &exe, int rank, bool mpi, StallWatchdog *waits);
  ~Trainer();
  Trainer(const Trainer &) = delete;
  Trainer &operator=(const Trainer &) = delete;

  /// Whether output `k` of this rank's stage is a gradient.
  bool isGrad(size_t k) const { return k < gradOf_.size() && !gradOf_[k].empty(); }
  /// Joins another microbatch's outputs to `into`: gradients added, any
  /// other output's rows appended (a scalar's values collected).
  Status join(std::vector<Tensor> &into, std::vector<Tensor> part) const;
  /// Gradients summed over `micro` microbatches: the stages' parts added
  /// (sumStageParts), then their mean over the microbatches and over the
  /// data-parallel replicas (every rank takes part). `zeroShares` (an
  /// optimizer with ZeRO): averaged over the microbatches only; `apply`
  /// reduce-scatters them over the replicas, and `meanOverReplicas` takes
  /// the replicas' mean for writing.
  Status averageGradients(std::vector<Tensor> &outputs, int64_t micro, bool zeroShares);
  /// The gradients' all-reduces over the replicas (and their partial axes)
  /// since the last call, by the ranks each spans and its message's bytes:
  /// how many, and their wall time (parax-run --profile's
  /// `gradient_all_reduces`).
  struct ReduceTally {
    int calls = 0;
    double seconds = 0;
  };
  using ReduceKey = std::pair<int, int64_t>; // (ranks, bytes a call)
  std::map<ReduceKey, ReduceTally> takeReduceTally() { return std::exchange(reduces_, {}); }
  Status meanOverReplicas(std::vector<Tensor> &outputs);
  /// Each gradient that is this stage's part (`output_stage_parts`)
  /// replaced by the sum of every holding stage's part, in stage order: the
  /// parts exchanged with the ranks of those stages that share this rank's
  /// other coordinates, in the order of the results (every rank takes part).
  Status sumStageParts(std::vector<Tensor> &outputs);
  /// Checks that every gradient output has its parameter's box on this
  /// rank (same name, piece and shape); an error naming the first that
  /// does not. Call once before `apply`.
  Status bindParameters(const std::vector<Tensor> &buffers);
  /// One optimizer step: clips, then updates this rank's parameter boxes
  /// in `buffers` (the executor's) with the averaged gradients. Every rank
  /// takes part. `gradNorm` receives the norm before clipping.
  Status apply(const OptimizerConfig &config, std::vector<Tensor> &outputs, std::vector<Tensor> &buffers,
               double &gradNorm);
  /// The optimizer on the device (the CUDA backend keeps the gradients,
  /// fp32 masters and moments there and runs the update; this class still
  /// decides what it does): each gradient output, the parameter box it
  /// updates, the part of it this rank updates (ZeRO: its chunk of the
  /// flattened box, `size` values a chunk, the `index`-th of the `members`
  /// chunks of the share group `axes`; else the whole box) and whether
  /// weight decay applies. After `bindParameters`.
  struct Update {
    int output, parameter;
    int64_t begin, end, size;
    bool decays;
    unsigned axes;           // ZeRO's share group (a mask of grid axes)
    int64_t members, index;  // its ranks, and this rank's place among them
    // The grid axes the gradient is a partial sum over (a mask; within
    // `axes` under ZeRO): the reduction sums over them as well as over the
    // replicas; and the equal copies of the whole sum that reduction adds
    // up, the mean's divisor besides the microbatches (copiesOf).
    unsigned partialAxes;
    int64_t copies;
    // A stage's part of a gradient (a weight several stages read): the
    // ranks whose parts are added, in stage order, this rank among them
    // (see sumStageParts); else empty.
    std::vector<int> partRanks;
  };
  std::vector<Update> updates(const OptimizerConfig &config) const;
  /// Whether the optimizer splits its state (ZeRO, with some box held by
  /// more than one rank of its stage, on any stage: every rank agrees).
  bool sharesState(const OptimizerConfig &config) const { return config.zero && largestShareGroup_ > 1; }
  /// Starts optimizer step t + 1: its learning rate, AdamW's bias
  /// corrections, and the gradients' scale (clipping) from their global
  /// norm, summed from `squares` (per output: the sum of the squares of
  /// the gradient values this rank updates) over the ranks that count each
  /// box once. Every rank takes part. `gradNorm` receives the norm.
  struct StepFactors {
    double lr, clip, correction1, correction2;
    bool skip = false; // the gradients are not finite and --skip-nonfinite: no update
  };
  /// Steps whose update was skipped (--skip-nonfinite).
  int64_t skippedSteps() const { return skipped_; }
  Status beginStep(const OptimizerConfig &config, const std::vector<double> &squares, StepFactors &factors,
                   double &gradNorm);
  /// AdamW's moment (`which` 0: m, 1: v) of gradient output `k`, as this
  /// rank holds it (the device optimizer's copy, read back for saving).
  std::vector<float> &moment(int k, int which) { return which == 0 ? states_[k].m : states_[k].v; }
  /// Bytes of optimizer state this rank holds (m and v, or none).
  size_t stateBytes() const;
  /// The optimizer steps taken (with a loaded state's) and the last one's
  /// learning rate.
  int64_t steps() const { return step_; }
  double lastLearningRate() const { return lr_; }

  /// The loss of this step (a scalar result of the last stage: the mean of
  /// the microbatches' values), averaged over the replicas; every rank of
  /// the last stage gets it.
  Status replicaMean(double &value);

  /// The writer's whole gradients: result index -> tensor, gathered from
  /// the boxes of replica 0's ranks. Every rank takes part.
  Status gatherGradients(const std::vector<Tensor> &outputs, int writer, std::map<int, Tensor> &whole);
  /// gatherParameters' and gatherState's writer for a sharded checkpoint:
  /// whole tensor i put together on rank i mod the ranks.
  static constexpr int kEveryRank = -1;
  /// Where each whole tensor of a checkpoint is written (its writer's
  /// rank, by checkpoint name) and the bytes of them all (F32).
  struct Layout {
    std::map<std::string, int> writer;
    uint64_t bytes = 0;
  };
  /// The writer's whole parameters by checkpoint name (+ `suffix`; fused
  /// pieces put in place; a stack of experts one tensor per expert),
  /// gathered from replica 0's ranks' boxes in `buffers` (indexed by buffer
  /// id); `layout`, if given, gets every tensor's writer (on every rank).
  /// Every rank takes part.
  Status gatherParameters(const std::vector<Tensor> &buffers, int writer, std::map<std::string, Tensor> &whole,
                          const std::string &suffix = "", Layout *layout = nullptr);
  /// AdamW's state on the writer, as PyTorch names it per parameter:
  /// "<name>.exp_avg" (m) and "<name>.exp_avg_sq" (v), whole tensors like
  /// the parameters, and "optimizer.step" (t, one value; kEveryRank: on
  /// rank 0). Every rank takes part. After `bindParameters`.
  Status gatherState(int writer, std::map<std::string, Tensor> &whole, Layout *layout = nullptr);
  /// This rank's part of a box-wise checkpoint of the parameters in
  /// `buffers` (indexed by buffer id; their names + `suffix`): the boxes
  /// of which it is the first holder in replica 0, with their values. No
  /// communication.
  void parameterBoxes(const std::vector<Tensor> &buffers, const std::string &suffix,
                      BoxCheckpoint &into) const;
  /// Likewise under ZeRO with the parameters a gradient updates given as
  /// this rank's chunks (`chunks`, per gradient output: the values it
  /// updates, as the device optimizer keeps its masters), each written as
  /// its run of the box's elements like the moments, nothing gathered; the
  /// other parameters (none updates them) from `buffers`.
  Status parameterChunkBoxes(const std::vector<Tensor> &buffers, const std::vector<std::vector<float>> &chunks,
                             BoxCheckpoint &into) const;
  /// AdamW's state likewise (gatherState's names), and the step count on
  /// rank 0; under ZeRO every rank its own chunk of each box, a run of the
  /// box's elements. No communication.
  Status optimizerStateBoxes(BoxCheckpoint &into);
  /// Every rank's records put together on rank 0 (for its index). Every
  /// rank takes part.
  Status gatherRecords(std::vector<SavedBox> &records);
  /// Reads this rank's boxes (its share, under ZeRO) of such a state, to
  /// go on from where it was saved (the next step is t + 1). After
  /// `bindParameters`.
  Status loadState(const Checkpoint &file, const std::string &path, bool zero);

private:
  std::vector<float> ringSend_, ringReceived_; // the ZeRO reduce-scatter's scratch (MpiRing.h)
  struct Item; // a box of a whole tensor, held by some ranks
  /// The boxes of an item: the first rank of replica 0 holding each, and
  /// where the box starts in the whole tensor.
  std::vector<std::pair<int, std::vector<int64_t>>> holders(const Item &item) const;
  /// An item for every parameter piece (`buffers`: this rank's values),
  /// once over the stages; `names` and `shapes` get the whole tensors.
  std::vector<Item> parameterItems(const std::vector<Tensor> &buffers, std::vector<std::string> &names,
                                   std::vector<std::vector<int64_t>> &shapes) const;
  Status gather(const std::vector<Item> &items, std::vector<Tensor> &whole);
  Status stateBoxes(int which, std::vector<Tensor> &boxes);
  bool ownsBoxIgnoringReplica(int output) const;
  /// Whether weight decay applies to gradient output k's parameter: a
  /// matrix (not a norm's weight or a bias).
  bool decays(int k) const;
  /// Gradient output k's values summed over the replicas and the axes it
  /// is a partial sum over (`partialOf_`).
  Status allReduceOverReplicas(size_t k, float *data, size_t n);
  /// Each gradient divided by `micro`, and with `overReplicas` all-reduced
  /// over the replicas (and its partial axes) and divided by the replicas
  /// too.
  Status meanOf(std::vector<Tensor> &outputs, int64_t micro, bool overReplicas);
  /// The equal copies of gradient output k's whole sum that its reduction
  /// adds up (ZeRO, `shares`: over its share group, whose members hold
  /// parts along the partial axes; else over dp and those axes).
  int64_t copiesOf(size_t k, bool shares) const;
  /// ZeRO shares the optimizer state of a box over its share group: the
  /// ranks of the stage holding the same box (they differ only along the
  /// grid axes the parameter is neither split nor partial over: dp, and
  /// ep, cp or tp where it is replicated). Their gradients are equal but
  /// for dp and the axes the gradient is a partial sum over, so a
  /// reduce-scatter over the group, divided by its size over those axes'
  /// ranks, is the data-parallel mean.
  struct ShareGroup {
    unsigned axes = 0;           // a mask of grid axes
    int64_t members = 1, index = 0;
    MPI_Comm comm = MPI_COMM_NULL; // (members > 1)
  };
  /// The part of gradient output k's box of n values (flattened, padded to
  /// a multiple of the group's ranks) this rank updates: [begin, end),
  /// `size` each.
  struct Chunk {
    int64_t begin, end, size;
  };
  Chunk chunkOf(size_t k, int64_t n) const;
  /// Every group member's chunk of output k's box (`mine`, this rank's)
  /// put together into `box`.
  Status gatherChunks(size_t k, const std::vector<float> &mine, std::vector<float> &box, const char *what);
  /// `waits_` watching `operation` (nothing without MPI).
  StallWatchdog::Scope watch(const char *operation);

  const pxe::Executable &exe_;
  int rank_, stage_;
  bool mpi_;
  StallWatchdog *waits_;
  int64_t replicas_ = 1, replica_ = 0;
  MPI_Comm replicaComm_ = MPI_COMM_NULL; // the ranks that differ from this one only along "dp"
  std::vector<ShareGroup> shareOf_;      // per output of this stage (gradients')
  /// Per output of this stage: the grid axes its box is a partial sum over
  /// (a mask; the buffer's `partial`), the ranks along them, and the
  /// group it is all-reduced over without ZeRO (dp and those axes), which
  /// holds `copies` equal sums of the parts (the replicas; fewer when dp
  /// is among the axes: a program splitting its tokens over dp itself).
  struct PartialSum {
    unsigned axes = 0;
    int64_t ranks = 1, copies = 1;
    MPI_Comm comm = MPI_COMM_NULL;
  };
  std::vector<PartialSum> partialOf_;
  std::map<ReduceKey, ReduceTally> reduces_; // since the last takeReduceTally
  std::map<unsigned, MPI_Comm> shareComms_; // by axes mask, groups of more than one rank
  int64_t largestShareGroup_ = 1;           // over every stage
  std::vector<std::string> gradOf_;      // per output of this stage: "<name>[@offsets]" or ""
  std::vector<int> paramOf_;             // per gradient output: its parameter's buffer id
  /// Under ZeRO: this rank's chunk of each box a gradient updates (the
  /// first stage's, of a weight two stages hold), `values(k)` the chunk's
  /// values for gradient output k, as a run of the box's elements.
  void chunkBoxes(const std::string &suffix, const std::function<const float *(int k)> &values,
                  BoxCheckpoint &into) const;
  /// Of the parameters in `buffers`, those not `skipped` (by this stage's
  /// buffer id), as parameterBoxes writes them.
  void wholeBoxes(const std::vector<Tensor> &buffers, const std::string &suffix, const std::vector<bool> &skipped,
                  BoxCheckpoint &into) const;
  // Per output that is a stage's part of a gradient: the ranks whose parts
  // are added (Update::partRanks); and those outputs in result order.
  std::vector<std::vector<int>> partRanks_;
  std::vector<int> partOutputs_;
  // Per gradient output: whether its box counts in the global norm here
  // (the first stage and first rank holding it; bindParameters sets it),
  // and whether this stage is the first returning it (under ZeRO each rank
  // of that stage counts its chunk).
  std::vector<bool> countedInNorm_, firstStage_;
  struct State {
    std::vector<float> m, v;
  };
  std::vector<State> states_; // per output
  int64_t step_ = 0;
  int64_t skipped_ = 0; // steps not applied (non-finite gradients)
  double lr_ = 0;
  bool zeroShares_ = false; // the states hold this rank's chunk of each box
};

} // namespace parax::runtime

#endif // PARAX_RUNTIME_TRAINER_H
