// Options.h - parax-run's command line: what a run was asked to do, read
// and checked before anything is loaded.

#ifndef PARAX_RUN_OPTIONS_H
#define PARAX_RUN_OPTIONS_H

#include "parax/runtime/Trainer.h"

#include "parax/runtime/Generation.h"

#include <array>
#include <functional>
#include <string>
#include <vector>

namespace parax::run {

using runtime::OptimizerConfig;

// The loss terms a training step returns apart (already in its loss):
// the MoE load-balancing losses' sum, multi-token prediction's weighted
// depths; each the last stage's output marked with its term.
struct LossTerm {
  const char *term, *label, *flag, *file, *noun, *missing;
  std::string path;             // its flag's: each step's value
  int output = -1, result = -1; // the last stage's output, the program's result
  std::vector<float> values;    // each step's
};

struct Options {
  std::string model, weights;
  std::vector<std::string> outputs;
  std::string outputDir; // --output-dir
  std::vector<std::string> inputs;
  int steps = 1;
  long generate = -1; // --generate K: tokens to generate per row
  std::string prefillPath; // --prefill: a program for the prompt's chunks
  std::string profilePath; // --profile: each instruction's wall time (CPU)
  std::string logJsonPath; // --log-json: a JSON line a training step
  runtime::Sampling sampling;        // --temperature, --top-k, --seed
  long long stopToken = -1; // --stop-token
  bool samplingGiven = false;
  bool stepsGiven = false;
  std::string device = "cpu";
  OptimizerConfig optimizer;  // --optimizer and its settings
  std::string saveWeights;    // --save-weights
  std::string saveFormat = "whole"; // --save-format: whole tensors, or each rank's boxes
  long long saveEvery = 0;          // --save-every K: a checkpoint every K steps too
  std::string lossesPath;     // --losses
  bool perTokenLoss = false;  // --per-token-loss
  bool allowUnusedWeights = false; // --allow-unused-weights
  std::string saveOptimizer, loadOptimizer; // --save-optimizer, --load-optimizer
  long long stepRows = 0;     // --step-rows (0: every row every step)
  bool optimizerSettings = false;
  double biasSpeed = 0;       // --bias-update-speed
  bool zeroGiven = false;     // --zero / --no-zero / --zero-stage (else the plan's ZeRO stage decides)
  bool quiet = false;         // --quiet: no line a step, no generation progress (the summary still)
  // The loss terms a training step returns apart (already in its loss):
  // the MoE load-balancing losses' sum, multi-token prediction's weighted
  // depths; each the last stage's output marked with its term.
  std::array<LossTerm, 2> terms = {
      {{"balance", "load balancing", "--balance-losses", "balance_loss", "load-balancing loss",
        "no router has aux_loss_coef"},
       {"mtp", "multi-token prediction", "--mtp-losses", "mtp_loss", "multi-token prediction loss",
        "built without --mtp-weight"}}};
  bool help = false; // --help: the usage was printed, nothing else to do

  /// A training run (--optimizer given).
  bool trains() const { return !optimizer.kind.empty(); }
};

/// parax-run's flags from argv (--name=value is --name value), each value
/// checked and the flags checked against each other; `die` ends the run
/// naming the problem (it does not return).
Options parseOptions(int argc, char **argv, const std::function<void(const std::string &)> &die);

/// The usage text, on stderr.
void usage();

/// A checkpoint path naming a folder (a sharded checkpoint): ending in '/',
/// or an existing folder.
bool isFolderPath(const std::string &path);

/// Started by an MPI launcher (Open MPI, MPICH, PMIx, Slurm)? A single rank
/// started by hand runs without MPI: no launcher daemon is needed then.
bool launchedByMpi();

} // namespace parax::run

#endif // PARAX_RUN_OPTIONS_H
