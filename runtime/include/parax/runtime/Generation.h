// Generation.h - what a generation loop asks of its programs: a step built
// with --cache (tokens [batch, 1], a run-time position, KV caches written in
// place) and, optionally, a prefill program alike but for chunks of tokens.
// parax-run --generate drives the loop; an embedder can too.

#ifndef PARAX_RUNTIME_GENERATION_H
#define PARAX_RUNTIME_GENERATION_H

#include "parax/runtime/Status.h"
#include "parax/runtime/Tensor.h"
#include "parax/runtime/executable.pb.h"

#include <cstdint>
#include <vector>

namespace parax::runtime {

/// A model input as an executable declares it, every stage's view joined.
struct InputSpec {
  std::vector<int64_t> shape; // global (one data-parallel replica's)
  bool isInt = false;
  bool cacheState = false;    // a KV cache a stage writes in place
  bool ring = false;          // ... a sliding window's ring (any position fits)
  bool found = false;         // some stage reads it
};
std::vector<InputSpec> inputSpecs(const pxe::Executable &exe);

/// A generation step's inputs: tokens (input 0), the position, the caches.
struct GenerationProgram {
  std::vector<InputSpec> inputs;
  int64_t batch = 0;         // rows of one replica
  int64_t tokens = 0;        // per row and step: 1, or a prefill's chunk
  int64_t positionInput = -1;
  int64_t capacity = 0;      // positions the caches hold (rings hold any)
};

/// Checks that `exe` is a generation step (tokens [batch, 1], a position,
/// caches and nothing else); errors name the input at fault.
StatusOr<GenerationProgram> generationProgram(const pxe::Executable &exe);

/// Checks that `prefill` goes with `step`: the same grid, batch, position
/// and caches (global shapes), tokens [batch, P]; returns it.
StatusOr<GenerationProgram> prefillProgram(const pxe::Executable &prefill, const pxe::Executable &step,
                                           const GenerationProgram &stepProgram);

/// A prompt laid out for generation: `sequence` is [rows, width] tokens,
/// width = the prompt's length + the tokens to generate, each row its
/// prompt then -1s; `lengths` each row's prompt length.
struct PromptRows {
  std::vector<int32_t> sequence;
  std::vector<int64_t> lengths;
  int64_t rows = 0, length = 0, width = 0;
};

/// Reads `prompt` (integer tokens [rows, L], a shorter prompt padded with
/// -1 at its end) for `tokens` more through `step`: errors name a prompt of
/// another shape, more tokens than the step's caches hold, a token after
/// the -1 that ends a row, an empty row.
StatusOr<PromptRows> promptRows(const Tensor &prompt, int64_t tokens, const GenerationProgram &step);

/// The inputs of one step of `program` at position `at`: rows `firstRow ..
/// firstRow + batch - 1` of `sequence` ([rows, width] tokens), columns `at
/// ..`; the caches as shapes without values (they keep their own). A
/// negative token (a position past a row's tokens, whose results no one
/// reads) is given as token 0.
std::vector<Tensor> generationInputs(const GenerationProgram &program, const std::vector<int32_t> &sequence,
                                     int64_t width, int64_t firstRow, int64_t at);

/// How the next token is picked from a row's logits: the most likely
/// (temperature 0), or drawn from softmax(logits / temperature) over the
/// `topK` most likely (0: all), ties to the lower id, then over the
/// fewest of those, most likely first, whose probabilities sum to at least
/// `topP` of theirs (nucleus sampling; 1: all), with the uniform number of
/// (seed, row, position) (SplitMix64: reproducible anywhere).
struct Sampling {
  double temperature = 0;
  int64_t topK = 0;
  uint64_t seed = 0;
  double topP = 1;
};
int32_t sampleToken(const float *logits, int64_t vocab, const Sampling &sampling, int64_t row, int64_t position);
/// The uniform number in [0, 1) that sampleToken draws for (seed, row, position).
double sampleUniform(uint64_t seed, int64_t row, int64_t position);

} // namespace parax::runtime

#endif // PARAX_RUNTIME_GENERATION_H
