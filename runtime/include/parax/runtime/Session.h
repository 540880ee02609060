// Session.h - one rank's share of an executable on the CPU, as a library:
// open (load, validate, read the weights), then run, train or generate.
// What parax-run does for a user at the command line, for a program that
// embeds parax's runtime instead (docs/embedding.md).
//
// Every rank of the executable's grid opens the same session and makes the
// same calls in the same order (each call may communicate). One rank needs
// no MPI; several are processes started by an MPI launcher (mpirun -np N,
// N the grid's ranks) that have called MPI_Init before opening.
//
// Inputs are whole, as every rank gives them: input #0's rows are the
// executable's batch (a replica's microbatch) x its data-parallel replicas
// x the microbatches of a step. Replica r takes microbatches r * M ..
// r * M + M - 1 of them, each run in turn (no pipeline schedule: a pipelined
// executable's stages run one microbatch through at a time; parax-run runs
// its 1F1B and interleaved schedules). Results are a replica's: its rows,
// on the rank that holds them (holdsResults).

#ifndef PARAX_RUNTIME_SESSION_H
#define PARAX_RUNTIME_SESSION_H

#include "parax/runtime/Checkpoint.h"
#include "parax/runtime/Communicator.h"
#include "parax/runtime/Executor.h"
#include "parax/runtime/Generation.h"
#include "parax/runtime/StallWatchdog.h"
#include "parax/runtime/Status.h"
#include "parax/runtime/Tensor.h"
#include "parax/runtime/Trainer.h"

#include <memory>
#include <string>
#include <vector>

namespace parax::runtime {

/// A checkpoint tensor that no stage of `exe` reads means a model other
/// than the program's (a bias, a layer, a norm it does not build): an error
/// naming the first of them (`path`: the checkpoint's, for the message).
Status checkEveryWeightRead(const pxe::Executable &exe, const Checkpoint &weights, const std::string &path);

struct SessionOptions {
  std::string executable; // the .pxe file
  std::string weights;    // a .safetensors file, a model folder, or a checkpoint index (Checkpoint::open)
  bool allowUnusedWeights = false; // else checkEveryWeightRead refuses a checkpoint with tensors unread
  double collectiveTimeout = 300;  // seconds one wait for the other ranks may take before the job ends
};

class Session {
public:
  /// Opens the executable on this process's rank (MPI's, or 0): loaded,
  /// validated against the grid MPI started, the checkpoint opened. The
  /// weights are read at the first run, train step or generation.
  static StatusOr<std::unique_ptr<Session>> open(const SessionOptions &options);
  ~Session();
  Session(const Session &) = delete;
  Session &operator=(const Session &) = delete;

  const pxe::Executable &executable() const { return exe_; }
  int rank() const { return rank_; }
  int ranks() const { return size_; }
  int stage() const { return stage_; }
  int64_t replicas() const { return replicas_; }
  int64_t replica() const { return replica_; }
  /// Rows of one microbatch of one replica (input #0's first dimension).
  int64_t batch() const { return batch_; }
  /// Whether this rank gets its replica's results: the last stage's, every
  /// coordinate but "dp" 0.
  bool holdsResults() const { return holdsResults_; }

  /// The program over `inputs` (whole; see above). On a rank that holds
  /// results, `results` gets the replica's: each result's microbatches'
  /// rows joined (a scalar: their mean); elsewhere it is emptied.
  Status run(const std::vector<Tensor> &inputs, std::vector<Tensor> &results);

  struct StepReport {
    double loss = 0;     // the step's: the mean over its microbatches and replicas (last stage)
    double gradNorm = 0; // the gradients' global L2 norm before clipping
    double learningRate = 0;
    int64_t step = 0;    // optimizer steps taken, this one included
  };
  /// One training step of a program built with its gradients (parax-opt
  /// --parax-autodiff): the program over `inputs`' microbatches, their
  /// gradients averaged over them and over the replicas (ZeRO: as
  /// `optimizer.zero` says), then `optimizer` applied to this rank's
  /// parameters. The same arithmetic, in the same order, as parax-run's
  /// steps on the CPU. The report's loss is on the last stage's ranks.
  Status trainStep(const std::vector<Tensor> &inputs, const OptimizerConfig &optimizer, StepReport &report);

  /// `tokens` new tokens after each row of `prompt` (integer [rows, L];
  /// a shorter prompt ends with -1s) through a generation step (built with
  /// --cache; its caches hold the prompt and the new tokens), every
  /// position a step. On a rank that holds results, `sequence` gets the
  /// replica's rows [rows of the replica, L + tokens]: prompt, then the
  /// tokens chosen (greedy with a temperature of 0, else drawn as
  /// `sampling` says, the same on any rank count).
  Status generate(const Tensor &prompt, int64_t tokens, const Sampling &sampling, Tensor &sequence);

  /// The prepared executor and the trainer (after the first call that
  /// needs each), for what the calls above do not cover.
  Executor &executor() { return executor_; }
  Trainer *trainer() { return trainer_.get(); }

private:
  Session() = default;
  /// Microbatch m of this replica's rows of `inputs`.
  std::vector<Tensor> microbatch(const std::vector<Tensor> &inputs, int64_t m) const;
  /// The microbatches a replica takes of `rows` rows.
  StatusOr<int64_t> microbatches(int64_t rows) const;
  /// Reads the weights and prepares the executor, with `first` as inputs.
  Status prepare(const std::vector<Tensor> &first);
  /// Runs each microbatch of `inputs` and joins the stage's outputs.
  Status runMicrobatches(const std::vector<Tensor> &inputs, int64_t micro, std::vector<Tensor> &outputs);

  pxe::Executable exe_;
  std::string weightsPath_;
  std::shared_ptr<Checkpoint> weights_;
  bool mpi_ = false;
  int rank_ = 0, size_ = 1, stage_ = 0;
  int64_t replicas_ = 1, replica_ = 0, batch_ = 0;
  bool holdsResults_ = false, prepared_ = false;
  std::unique_ptr<StallWatchdog> waits_;
  std::unique_ptr<Communicator> comm_;
  Executor executor_;
  std::unique_ptr<Trainer> trainer_;
  int lossOutput_ = -1; // the stage's output that is the loss (a training step's last stage)
};

} // namespace parax::runtime

#endif // PARAX_RUNTIME_SESSION_H
