// Tensor.cpp - host tensors of the CPU backend.

#include "parax/runtime/Tensor.h"

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

std::string Tensor::shapeString() const {
  std::string s = "[";
  for (size_t d = 0; d < shape.size(); ++d)
    s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "]";
}

} // namespace parax::runtime
