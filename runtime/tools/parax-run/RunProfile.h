// RunProfile.h - parax-run --profile: what each instruction of a rank took.
//
// The file parax-plan --calibrate reads (docs/cost-model.md, "Calibration"):
// the run's setting (device, ranks, the rank's grid coordinates and stage,
// the median step, a training step's gradient averaging and optimizer
// update with the parameter values the rank holds), then every instruction the rank ran with its operands'
// and results' local shapes, its dtype, its attributes, the ranks its
// collective spans, and the median of its wall times over the runs.

#ifndef PARAX_RUN_RUNPROFILE_H
#define PARAX_RUN_RUNPROFILE_H

#include "parax/runtime/Executor.h"
#include "parax/runtime/Status.h"

#include <string>
#include <vector>

namespace parax::runtime {

/// Medians over a run's steps, seconds.
struct RunProfileTotals {
  double step = 0;
  int steps = 0;
  /// A training step's host work after the stage's instructions: the
  /// gradients averaged over microbatches and replicas (the data-parallel
  /// reduction), and the optimizer's update (`optimizer`: its kind; empty:
  /// none ran).
  double gradientAverage = 0, optimizerUpdate = 0;
  std::string optimizer;
  /// The gradient averaging's all-reduces a step (part of its time), by
  /// the ranks they span and their message's size: the bytes a rank put
  /// into them (calls x message), how many calls, the median of their
  /// summed seconds.
  struct Reduce {
    int ranks = 0;
    double bytes = 0;
    int calls = 0;
    double seconds = 0;
  };
  std::vector<Reduce> gradientReduces;
};

/// A number as JSON writes it (%.9g; null for NaN or infinity, which JSON
/// has not).
std::string jsonNumber(double x);

/// `executor`: the stage's program and the rank's coordinates; `seconds`:
/// each instruction's wall times (one a run; empty: not run).
Status writeRunProfile(const std::string &path, const pxe::Executable &exe, const Executor &executor,
                       const std::vector<std::vector<double>> &seconds, int rank, int ranks,
                       const std::string &device, const RunProfileTotals &totals);

} // namespace parax::runtime

#endif // PARAX_RUN_RUNPROFILE_H
