// Tensor.cpp - host tensors of the CPU backend.

#include "parax/runtime/Tensor.h"

#include <algorithm>

namespace parax::runtime {

int64_t numelOf(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

Tensor Tensor::floats(std::vector<int64_t> shape) {
  Tensor t;
  t.shape = std::move(shape);
  t.f.assign(numelOf(t.shape), 0.0f);
  return t;
}

Tensor Tensor::ints(std::vector<int64_t> shape) {
  Tensor t;
  t.isInt = true;
  t.shape = std::move(shape);
  t.i.assign(numelOf(t.shape), 0);
  return t;
}

int64_t Tensor::numel() const { return numelOf(shape); }

Tensor Tensor::rowBlock(int64_t first, int64_t rows) const {
  Tensor part;
  part.isInt = isInt;
  part.shape = shape;
  part.shape[0] = rows;
  int64_t perRow = shape[0] > 0 ? numel() / shape[0] : 0;
  if (isInt)
    part.i.assign(i.begin() + first * perRow, i.begin() + (first + rows) * perRow);
  else
    part.f.assign(f.begin() + first * perRow, f.begin() + (first + rows) * perRow);
  return part;
}

std::string Tensor::shapeString() const {
  std::string s = "[";
  for (size_t d = 0; d < shape.size(); ++d)
    s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "]";
}

std::vector<Tensor> recyclable(std::vector<Tensor> results) {
  std::vector<Tensor> kept;
  for (Tensor &t : results)
    if (t.hasValues() && t.numel() == static_cast<int64_t>(t.isInt ? t.i.size() : t.f.size()))
      kept.push_back(std::move(t));
  return kept;
}

Tensor takeSpare(std::vector<Tensor> &spare, bool isInt, const std::vector<int64_t> &shape) {
  auto same = [&](const Tensor &t) { return t.isInt == isInt && t.shape == shape; };
  auto kept = std::find_if(spare.begin(), spare.end(), same);
  if (kept == spare.end())
    return isInt ? Tensor::ints(shape) : Tensor::floats(shape);
  Tensor t = std::move(*kept);
  spare.erase(kept);
  return t;
}

} // namespace parax::runtime
