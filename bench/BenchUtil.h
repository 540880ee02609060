// BenchUtil.h - pieces the runtime benchmarks share: medians, one-rank
// programs built by hand, an empty checkpoint.

#ifndef PARAX_BENCH_BENCHUTIL_H
#define PARAX_BENCH_BENCHUTIL_H

#include "parax/runtime/executable.pb.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace parax::bench {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Wall-clock seconds per call of `f`, median of `reps` (after one
/// untimed call).
inline double timeIt(const std::function<void()> &f, int reps) {
  f();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto s = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count());
  }
  return median(t);
}

/// Appends an fp32 buffer of `shape` (unsplit) with `role` to `stage`.
inline parax::pxe::Buffer *addBuffer(parax::pxe::Stage &stage, std::vector<int64_t> shape,
                                     parax::pxe::Role role) {
  auto *b = stage.add_buffers();
  b->set_id(stage.buffers_size() - 1);
  b->set_dtype(parax::pxe::F32);
  b->set_role(role);
  for (int64_t d : shape) {
    b->add_shape(d);
    b->add_global_shape(d);
    b->add_split();
  }
  return b;
}

/// Writes a safetensors file with no tensors at `path` (for programs that
/// take no parameters) and returns the path.
inline std::string emptyCheckpoint(const std::string &path) {
  std::ofstream f(path, std::ios::binary);
  const char header[] = "{}      ";
  uint64_t n = 8;
  f.write(reinterpret_cast<const char *>(&n), 8);
  f.write(header, 8);
  return path;
}

/// A one-rank program: y[m, n] = x[m, k] @ w[k, n], x and w its inputs 0, 1.
/// y = x · w, w [k, n]; `transposed`: w [n, k] (transpose_w, a Hugging Face
/// projection's layout).
/// `dtype`: the three buffers' storage (the inputs are given in fp32).
inline parax::pxe::Executable linearProgram(int64_t m, int64_t k, int64_t n, bool transposed = false,
                                            parax::pxe::DType dtype = parax::pxe::F32) {
  parax::pxe::Executable exe;
  exe.set_format_version(2);
  exe.add_ranks();
  parax::pxe::Stage &s = *exe.add_stages();
  addBuffer(s, {m, k}, parax::pxe::INPUT)->set_input_index(0);
  addBuffer(s, transposed ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}, parax::pxe::INPUT)
      ->set_input_index(1);
  addBuffer(s, {m, n}, parax::pxe::TEMPORARY);
  for (int b = 0; b < 3; ++b) s.mutable_buffers(b)->set_dtype(dtype);
  auto *inst = s.add_instructions();
  inst->set_kind(parax::pxe::OP_LINEAR);
  if (transposed) (*inst->mutable_attrs())["transpose_w"].set_b(true);
  inst->add_operands(0);
  inst->add_operands(1);
  inst->add_results(2);
  s.add_outputs(2);
  return exe;
}

} // namespace parax::bench

#endif // PARAX_BENCH_BENCHUTIL_H
