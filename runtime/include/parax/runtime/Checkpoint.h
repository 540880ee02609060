// Checkpoint.h - safetensors weights, each rank reading only its slice.

#ifndef PARAX_RUNTIME_CHECKPOINT_H
#define PARAX_RUNTIME_CHECKPOINT_H

#include "parax/runtime/Status.h"
#include "parax/runtime/Tensor.h"

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace parax::runtime {

/// Memory-mapped safetensors weights (validated headers: dtypes F32/BF16/
/// F16/I32/I64, offsets inside the file, sizes matching shapes): one file,
/// or a sharded checkpoint as Hugging Face writes it -- an index
/// (`model.safetensors.index.json`: "weight_map", tensor name -> shard file
/// in the index's folder) or a folder holding that index (or a lone
/// `model.safetensors`).
class Checkpoint {
public:
  static StatusOr<std::shared_ptr<Checkpoint>> open(const std::string &path);
  ~Checkpoint();

  struct Entry {
    std::string dtype;
    std::vector<int64_t> shape;
    size_t begin = 0, end = 0; // byte offsets into the data section
    int file = 0;              // which of the mapped files
  };
  const Entry *find(const std::string &name) const;

  /// Copies the box [start, start + size) of tensor `name` (whole tensor
  /// shape `shape` expected, or a tensor whose dimensions `shape` splits:
  /// [heads * rows, in] read as [heads, rows, in]) into `out` (f32 for
  /// floats, i32 for integers).
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
  struct File {
    std::string path;
    const uint8_t *map = nullptr;
    size_t mapSize = 0, dataOffset = 0;
  };
  /// Maps `path` and adds its tensors (those `only` names, when given).
  Status addFile(const std::string &path, const std::set<std::string> *only);
  Status addIndex(const std::string &path);
  std::string path_; // what was opened (a file, an index or a folder)
  std::vector<File> files_;
  std::map<std::string, Entry> entries_;
};

/// Reads a .npy array (little-endian f4 / i4 / i8, C order).
StatusOr<Tensor> readNpy(const std::string &path);
/// Writes `tensors` as a safetensors file, every tensor F32 (what the
/// runtime computes in), in name order.
Status writeSafetensors(const std::string &path, const std::map<std::string, Tensor> &tensors);
/// Writes a sharded checkpoint's index (`model.safetensors.index.json` in
/// `folder`): each tensor's shard file, and the tensors' total bytes.
Status writeSafetensorsIndex(const std::string &folder, const std::map<std::string, std::string> &weightMap,
                             uint64_t totalBytes);
/// The file name of shard `k` (from 0) of `n`, as Hugging Face names them:
/// model-00001-of-00004.safetensors.
std::string shardFileName(int k, int n);

/// The checkpoint's names of the whole tensor `name` of `shape`: itself,
/// or for a stack of experts ("{e}" in the name) one per expert.
std::vector<std::string> checkpointNames(const std::string &name, const std::vector<int64_t> &shape);
/// Puts the whole tensor `name` into `tensors` under its checkpoint names
/// (a stack of experts one tensor per expert, as readParameterBox reads
/// them).
void putParameter(const std::string &name, Tensor whole, std::map<std::string, Tensor> &tensors);

/// Writes `t` as .npy (f4 or i4).
Status writeNpy(const std::string &path, const Tensor &t);

} // namespace parax::runtime

#endif // PARAX_RUNTIME_CHECKPOINT_H
