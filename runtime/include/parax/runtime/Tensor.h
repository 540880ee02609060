// Tensor.h - host tensors of the CPU backend.
//
// Floating point values are computed in fp32 whatever their storage dtype
// (bf16 checkpoints are widened on load); indices are int32.

#ifndef PARAX_RUNTIME_TENSOR_H
#define PARAX_RUNTIME_TENSOR_H

#include <cstdint>
#include <string>
#include <vector>

namespace parax::runtime {

struct Tensor {
  bool isInt = false;
  std::vector<int64_t> shape;
  std::vector<float> f;    // when !isInt
  std::vector<int32_t> i;  // when isInt

  static Tensor floats(std::vector<int64_t> shape);
  static Tensor ints(std::vector<int64_t> shape);
  int64_t numel() const;
  /// False for a tensor of a shape only (an input that keeps its buffer's
  /// values: see Executor::setInputs).
  bool hasValues() const { return !f.empty() || !i.empty(); }
  int64_t dim(int d) const { return shape[d < 0 ? shape.size() + d : d]; }
  std::string shapeString() const;
  /// Rows `first .. first + rows - 1` of dimension 0 (a microbatch, a
  /// data-parallel replica's share); the caller keeps them inside.
  Tensor rowBlock(int64_t first, int64_t rows) const;
};

int64_t numelOf(const std::vector<int64_t> &shape);

/// An earlier step's results kept for their memory (those with all their
/// values): a backend's outputs() writes results of the same shape into
/// them instead of fresh memory, which the host would otherwise fault in
/// and zero page by page each step (a prefill's logits: a gigabyte).
std::vector<Tensor> recyclable(std::vector<Tensor> results);
/// One of `spare`'s tensors of this kind and shape, moved out (its old
/// values still in it: the caller overwrites them all), else a fresh one.
Tensor takeSpare(std::vector<Tensor> &spare, bool isInt, const std::vector<int64_t> &shape);

} // namespace parax::runtime

#endif // PARAX_RUNTIME_TENSOR_H
