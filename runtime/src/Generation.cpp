// Generation.cpp - the generation loop's programs, checked (Generation.h).

#include "parax/runtime/Generation.h"
#include "parax/runtime/Executable.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace parax::runtime {

std::vector<InputSpec> inputSpecs(const pxe::Executable &exe) {
  std::vector<InputSpec> specs;
  for (const pxe::Stage &stage : exe.stages()) {
    std::vector<int32_t> state = cacheStateInputs(stage), rings;
    for (const pxe::Instruction &inst : stage.instructions())
      if (inst.kind() == pxe::OP_RING_CACHE_UPDATE && inst.operands_size() > 0) rings.push_back(inst.operands(0));
    for (const pxe::Buffer &b : stage.buffers()) {
      if (b.role() != pxe::INPUT || b.input_index() < 0) continue;
      if (specs.size() <= static_cast<size_t>(b.input_index())) specs.resize(b.input_index() + 1);
      InputSpec &spec = specs[b.input_index()];
      spec.shape.assign(b.global_shape().begin(), b.global_shape().end());
      spec.isInt = b.dtype() == pxe::I32 || b.dtype() == pxe::I64;
      spec.cacheState = std::find(state.begin(), state.end(), b.id()) != state.end();
      spec.ring = spec.cacheState && std::find(rings.begin(), rings.end(), b.id()) != rings.end();
      spec.found = true;
    }
  }
  return specs;
}

static std::string shapeText(const std::vector<int64_t> &shape) {
  return Tensor{false, shape, {}, {}}.shapeString();
}

StatusOr<PromptRows> promptRows(const Tensor &prompt, int64_t tokens, const GenerationProgram &step) {
  if (!prompt.isInt || prompt.shape.size() != 2)
    return Status::error("the prompt must be integer tokens [rows, L], got " + prompt.shapeString());
  if (tokens < 1) return Status::error("asked for " + std::to_string(tokens) + " tokens");
  PromptRows p;
  p.rows = prompt.shape[0];
  p.length = prompt.shape[1];
  p.width = p.length + tokens;
  if (p.width - 1 > step.capacity)
    return Status::error("the prompt's " + std::to_string(p.length) + " tokens and " + std::to_string(tokens) +
                         " generated ones need " + std::to_string(p.width - 1) +
                         " cache rows; the step's caches hold " + std::to_string(step.capacity) +
                         " (build it with a larger --cache)");
  p.sequence.assign(p.rows * p.width, -1);
  p.lengths.assign(p.rows, p.length);
  for (int64_t r = 0; r < p.rows; ++r) {
    const int32_t *row = &prompt.i[r * p.length];
    int64_t length = std::find_if(row, row + p.length, [](int32_t t) { return t < 0; }) - row;
    for (int64_t t = length; t < p.length; ++t)
      if (row[t] != -1)
        return Status::error("prompt row " + std::to_string(r) + " has token " + std::to_string(row[t]) +
                             " at position " + std::to_string(t) +
                             ", after the -1 that ends it (a shorter prompt is padded with -1 at its end)");
    if (length == 0) return Status::error("prompt row " + std::to_string(r) + " is empty (it starts with -1)");
    p.lengths[r] = length;
    std::copy(row, row + length, &p.sequence[r * p.width]);
  }
  return p;
}

StatusOr<GenerationProgram> generationProgram(const pxe::Executable &exe) {
  GenerationProgram program;
  program.inputs = inputSpecs(exe);
  const std::vector<InputSpec> &specs = program.inputs;
  if (specs.empty() || !specs[0].isInt || specs[0].shape.size() != 2 || specs[0].shape[1] != 1)
    return Status::error("--generate needs a generation step whose first input is one token per row [batch, 1] "
                         "(build it with --seq 1 --cache C)");
  program.batch = specs[0].shape[0];
  program.tokens = 1;
  bool caches = false, full = false;
  for (size_t k = 1; k < specs.size(); ++k) {
    if (!specs[k].found) return Status::error("--generate: no stage reads input #" + std::to_string(k));
    if (specs[k].shape.empty() && specs[k].isInt) {
      program.positionInput = static_cast<int64_t>(k);
    } else if (specs[k].cacheState && specs[k].shape.size() == 4) {
      caches = true;
      if (!specs[k].ring) { // (a ring holds its window's tokens at any position)
        program.capacity = full ? std::min(program.capacity, specs[k].shape[1]) : specs[k].shape[1];
        full = true;
      }
    } else
      return Status::error("--generate: input #" + std::to_string(k) + " " + shapeText(specs[k].shape) +
                           " is neither the step's position nor a KV cache the step writes in place");
  }
  if (program.positionInput < 0 || !caches)
    return Status::error("--generate needs a step with a run-time position and KV caches (build it with --cache C)");
  if (!full) program.capacity = INT32_MAX; // (positions are 32-bit)
  return program;
}

StatusOr<GenerationProgram> prefillProgram(const pxe::Executable &prefill, const pxe::Executable &step,
                                           const GenerationProgram &stepProgram) {
  const pxe::Grid &a = step.grid(), &b = prefill.grid();
  if (!std::equal(a.axis_names().begin(), a.axis_names().end(), b.axis_names().begin(), b.axis_names().end()) ||
      !std::equal(a.shape().begin(), a.shape().end(), b.shape().begin(), b.shape().end()))
    return Status::error("--prefill: its grid is not the step's (plan both with the same pins)");
  GenerationProgram program = stepProgram;
  program.inputs = inputSpecs(prefill);
  const std::vector<InputSpec> &theirs = program.inputs, &specs = stepProgram.inputs;
  if (theirs.size() != specs.size() || !theirs[0].isInt || theirs[0].shape.size() != 2 ||
      theirs[0].shape[0] != stepProgram.batch)
    return Status::error("--prefill: its inputs are not the step's (tokens [" + std::to_string(stepProgram.batch) +
                         ", P], the position, the caches): build it like the step with another --seq");
  for (size_t k = 1; k < specs.size(); ++k)
    if (theirs[k].shape != specs[k].shape || theirs[k].cacheState != specs[k].cacheState)
      return Status::error("--prefill: its input #" + std::to_string(k) + " " + shapeText(theirs[k].shape) +
                           " is not the step's " + shapeText(specs[k].shape));
  program.tokens = theirs[0].shape[1];
  return program;
}

std::vector<Tensor> generationInputs(const GenerationProgram &program, const std::vector<int32_t> &sequence,
                                     int64_t width, int64_t firstRow, int64_t at) {
  std::vector<Tensor> in(program.inputs.size());
  in[0] = Tensor::ints({program.batch, program.tokens});
  for (int64_t b = 0; b < program.batch; ++b)
    for (int64_t j = 0; j < program.tokens; ++j)
      in[0].i[b * program.tokens + j] = std::max(0, sequence[(firstRow + b) * width + at + j]); // (-1: past the row's end)
  for (size_t k = 1; k < program.inputs.size(); ++k)
    in[k] = Tensor{program.inputs[k].isInt, program.inputs[k].shape, {}, {}};
  in[program.positionInput] = Tensor::ints({});
  in[program.positionInput].i[0] = static_cast<int32_t>(at);
  return in;
}

static uint64_t splitMix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double sampleUniform(uint64_t seed, int64_t row, int64_t position) {
  uint64_t h = splitMix64(splitMix64(splitMix64(seed) ^ static_cast<uint64_t>(row)) ^ static_cast<uint64_t>(position));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

int32_t sampleToken(const float *logits, int64_t vocab, const Sampling &sampling, int64_t row, int64_t position) {
  std::vector<int32_t> order(vocab);
  for (int64_t i = 0; i < vocab; ++i) order[i] = static_cast<int32_t>(i);
  auto likelier = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  if (sampling.temperature <= 0)
    return *std::min_element(order.begin(), order.end(), likelier);
  int64_t k = vocab;
  bool nucleus = sampling.topP < 1;
  if (sampling.topK > 0 && sampling.topK < vocab) { // the k most likely, most likely first
    k = sampling.topK;
    std::partial_sort(order.begin(), order.begin() + k, order.end(), likelier);
  } else if (nucleus) {
    std::sort(order.begin(), order.end(), likelier);
  }
  float top = logits[*std::min_element(order.begin(), order.begin() + k, likelier)];
  std::vector<double> weights(k);
  double total = 0;
  for (int64_t i = 0; i < k; ++i) total += weights[i] = std::exp((logits[order[i]] - top) / sampling.temperature);
  if (nucleus) { // the fewest, most likely first, holding topP of the weight
    double kept = 0, wanted = sampling.topP * total;
    int64_t n = 0;
    while (n < k && (n == 0 || kept < wanted)) kept += weights[n++];
    k = n;
    total = kept;
  }
  double u = sampleUniform(sampling.seed, row, position) * total, sum = 0;
  for (int64_t i = 0; i < k; ++i)
    if (u < (sum += weights[i])) return order[i];
  return order[k - 1];
}

} // namespace parax::runtime
