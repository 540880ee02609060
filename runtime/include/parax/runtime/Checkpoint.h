// Checkpoint.h - safetensors weights, each rank reading only its slice.

#ifndef PARAX_RUNTIME_CHECKPOINT_H
#define PARAX_RUNTIME_CHECKPOINT_H

#include "parax/runtime/Status.h"
#include "parax/runtime/Tensor.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace parax::runtime {

/// A memory-mapped safetensors file (validated header: dtypes F32/BF16/F16/
/// I32/I64, offsets inside the file, sizes matching shapes).
class Checkpoint {
public:
  static StatusOr<std::shared_ptr<Checkpoint>> open(const std::string &path);
  ~Checkpoint();

  struct Entry {
    std::string dtype;
    std::vector<int64_t> shape;
    size_t begin = 0, end = 0; // byte offsets into the data section
  };
  const Entry *find(const std::string &name) const;

  /// Copies the box [start, start + size) of tensor `name` (whole tensor
  /// shape `shape` expected) into `out` (f32 for floats, i32 for integers).
  Status readBox(const std::string &name, const std::vector<int64_t> &shape,
                 const std::vector<int64_t> &start,
                 const std::vector<int64_t> &size, Tensor &out) const;

  /// readBox of a parameter: a name with "{e}" is a stack along dimension
  /// 0 of per-expert tensors, each stored under the name with its expert's
  /// index (as MoE checkpoints store experts).
  Status readParameterBox(const std::string &name, const std::vector<int64_t> &shape,
                          const std::vector<int64_t> &start,
                          const std::vector<int64_t> &size, Tensor &out) const;

private:
  Checkpoint() = default;
  std::string path_;
  const uint8_t *map_ = nullptr;
  size_t mapSize_ = 0;
  size_t dataOffset_ = 0;
  std::map<std::string, Entry> entries_;
};

/// Reads a .npy array (little-endian f4 / i4 / i8, C order).
StatusOr<Tensor> readNpy(const std::string &path);
/// Writes `tensors` as a safetensors file, every tensor F32 (what the
/// runtime computes in), in name order.
Status writeSafetensors(const std::string &path, const std::map<std::string, Tensor> &tensors);

/// Puts the whole tensor `name` into `tensors`: a stack of experts ("{e}"
/// in the name) as one tensor per expert, as readParameterBox reads them.
void putParameter(const std::string &name, Tensor whole, std::map<std::string, Tensor> &tensors);

/// Writes `t` as .npy (f4 or i4).
Status writeNpy(const std::string &path, const Tensor &t);

} // namespace parax::runtime

#endif // PARAX_RUNTIME_CHECKPOINT_H
