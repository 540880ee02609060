// Generator.h - the generation loop: one replica's rows through a
// generation step (and a prefill program for the prompt's chunks), as
// microbatches that each keep their own KV caches (parax-run --generate and
// Session::generate, Session.h).

#ifndef PARAX_RUNTIME_GENERATOR_H
#define PARAX_RUNTIME_GENERATOR_H

#include "parax/runtime/Generation.h"
#include "parax/runtime/Runner.h"
#include "parax/runtime/StallWatchdog.h"

#include <functional>
#include <string>
#include <vector>

namespace parax::runtime {

struct Generator {
  // The programs: the step and the prefill (`chunks` > 0), a runner of
  // each per microbatch.
  const pxe::Executable &exe;
  const runtime::GenerationProgram &step, &prefill;
  std::vector<Runner> &steps, &prefills;
  // This rank: the world's size, its replica, the replica's microbatches
  // of `batch` rows, and whether it writes the replica's results.
  int size = 1;
  int64_t replica = 0, micro = 1, batch = 0;
  bool replicaWriter = false;
  // Every row's tokens, [rows, promptLength + generate]: the prompts in,
  // this replica's rows generated out. Row r's prompt is its first
  // promptLengths[r] tokens (at most promptLength; -1 after them): it
  // gets `generate` tokens after its own prompt, then -1.
  std::vector<int32_t> &sequence;
  const std::vector<int64_t> &promptLengths;
  int64_t rows = 0, promptLength = 0, generate = 0, chunks = 0;
  Sampling sampling;
  long long stopToken = -1; // -1: none
  bool wantLogits = false;  // every position's logits as a second result
  StallWatchdog *waits = nullptr; // (null: one rank, nothing to wait for)
  // Around the prefill, to time it (null: none).
  std::function<void(const char *)> barrier;
  // About once a second on the first replica's writer (null: none): the
  // positions run of `total`, and the rows' tokens a second since the
  // last call.
  std::function<void(int64_t position, int64_t total, double tokensPerSecond)> progress;

  struct Result {
    std::vector<double> times;  // each position's step, on this rank
    double prefillSeconds = 0;  // the prompt's chunks
    int64_t ran = 0;            // positions run (fewer when every row stopped)
    std::vector<Tensor> results; // the writer's: tokens [rows of the replica, width], then logits
  };
  /// The loop; an error names what failed (a program's, or logits of
  /// the wrong shape).
  Status run(Result &result);

private:
  // Microbatch m's first row: rows (replica * micro + m) * batch ...
  int64_t firstRowOf(int64_t m) const { return (replica * micro + m) * batch; }
  // Row r holds its prompt below promptLengths[r], its generated tokens
  // from there up to endOf(r), -1 after.
  int64_t endOf(int64_t row) const { return promptLengths[row] + generate; }
  // A row's positions in `sequence`: its prompt's and the generated ones.
  int64_t width() const { return promptLength + generate; }
  // After the loop: the positions a stopped microbatch never ran get the
  // stop token; the writer's results (the replica's rows, and with
  // wantLogits their logits, NaN where none ran) into `result`.
  void finish(Result &result, const std::vector<int64_t> &ranOf,
              const std::vector<std::vector<std::vector<float>>> &stepLogits, int64_t vocab);
  StallWatchdog::Scope watch(const char *operation) {
    return waits ? waits->watch(operation) : StallWatchdog::Scope(nullptr);
  }
};

} // namespace parax::runtime

#endif // PARAX_RUNTIME_GENERATOR_H
