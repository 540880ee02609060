// Checkpoint.h - safetensors weights, each rank reading only its slice.

#ifndef PARAX_RUNTIME_CHECKPOINT_H
#define PARAX_RUNTIME_CHECKPOINT_H

#include "parax/runtime/Status.h"
#include "parax/runtime/Tensor.h"

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace parax::runtime {

namespace detail {
struct Json; // a parsed JSON value (Checkpoint.cpp)
} // namespace detail

/// A written file's size and CRC-32 (zlib's): an index records one for
/// each of its files (metadata.parax_files) and a loader checks it, so a
/// file damaged, truncated or replaced after a complete save is refused,
/// named.
struct FileDigest {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};
StatusOr<FileDigest> digestFile(const std::string &path);

/// Memory-mapped safetensors weights (validated headers: dtypes F32/BF16/
/// F16/I32/I64, offsets inside the file, sizes matching shapes): one file,
/// or a sharded checkpoint as Hugging Face writes it -- an index
/// (`model.safetensors.index.json`: "weight_map", tensor name -> shard file
/// in the index's folder) or a folder holding that index (or a lone
/// `model.safetensors`); or a box-wise checkpoint (`boxes.index.json`, or
/// a folder holding it: each tensor's shape and the boxes that tile it,
/// each box -- or a run of a box's elements in row-major order (a ZeRO
/// chunk) -- a tensor of one rank's file, as parax-run `--save-format
/// boxes` writes them), read under any split.
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
  /// The whole tensors it holds, by name (a box-wise checkpoint's, not its
  /// boxes').
  std::vector<std::string> tensorNames() const;
  /// A whole tensor's shape (of a box-wise checkpoint's tensor, the shape
  /// its boxes tile); empty when it holds none of that name.
  std::vector<int64_t> shapeOf(const std::string &name) const;

  /// Copies the box [start, start + size) of tensor `name` (whole tensor
  /// shape `shape` expected, or a tensor whose dimensions `shape` splits:
  /// [heads * rows, in] read as [heads, rows, in]) into `out` (f32 for
  /// floats, i32 for integers); of a box-wise checkpoint's tensor, from
  /// the saved boxes it overlaps.
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
  /// `save`: the save its index records (parax_save), which the file's
  /// own metadata must name too (a shard of another save: refused).
  /// `digest`: the size and CRC-32 its index records (checked).
  Status addFile(const std::string &path, const std::set<std::string> *only, const std::string *save = nullptr,
                 const FileDigest *digest = nullptr);
  /// The files an index names (file -> the tensors or boxes read from
  /// it), each checked against its recorded digest, if the index has them.
  Status addIndexedFiles(const detail::Json &root, const std::string &path,
                         const std::map<std::string, std::set<std::string>> &namesOf, const std::string &save);
  /// The digests an index records (metadata.parax_files), by file name.
  static Status recordedDigests(const detail::Json &root, const std::string &path,
                                std::map<std::string, FileDigest> &out);
  /// A sharded checkpoint's index or a box-wise one's.
  Status addIndex(const std::string &path);
  /// A box-wise checkpoint's index (parsed `root`, read from `path`).
  Status addBoxIndex(const detail::Json &root, const std::string &path);
  /// Copies the region [from, from + size) of a tensor of `shape` into
  /// `out` at `to`; `entry` holds the tensor's elements [begin, end) in
  /// row-major order (a run of them: those outside are left alone).
  void copyRegion(const Entry &entry, const std::vector<int64_t> &shape, const std::vector<int64_t> &from,
                  const std::vector<int64_t> &size, Tensor &out, const std::vector<int64_t> &to,
                  int64_t begin = 0, int64_t end = INT64_MAX) const;
  std::string path_; // what was opened (a file, an index or a folder)
  std::vector<File> files_;
  std::map<std::string, Entry> entries_;
  /// A box-wise checkpoint's tensors: the whole shape and the boxes that
  /// tile it (each an entry named by boxKey).
  struct Box {
    std::vector<int64_t> start, size;
    int64_t begin = 0, end = 0; // the elements it holds, in the box's row-major order
    bool run = false;           // stored flat, as those elements alone
    std::string key;
  };
  struct Boxed {
    std::vector<int64_t> shape;
    std::vector<Box> boxes;
  };
  std::map<std::string, Boxed> boxed_;
};

/// A box of a whole checkpoint tensor, as a box-wise checkpoint's index
/// records it.
struct SavedBox {
  std::string name;                        // the checkpoint tensor
  std::vector<int64_t> shape, start, size; // its whole shape; the box's start and size
  int writer = 0;                          // the rank whose file holds it
  /// A run of the box's elements (row-major) alone, [begin, end): a ZeRO
  /// chunk of it (end < 0: the whole box).
  int64_t begin = 0, end = -1;
  /// Its tensor's name in the file: boxKey (and "#<begin>" for a run).
  std::string key() const;
};
/// A box-wise checkpoint's records (every box, on every rank) and this
/// rank's boxes' values by key.
struct BoxCheckpoint {
  std::vector<SavedBox> records;
  std::map<std::string, Tensor> tensors;
};
/// The index of a box-wise checkpoint in its folder.
inline constexpr const char *kBoxIndexName = "boxes.index.json";
/// A box's tensor name in its file: "<name>@<start, comma-separated>".
std::string boxKey(const std::string &name, const std::vector<int64_t> &start);
/// The file of rank `rank` (from 0) of `ranks` in a box-wise checkpoint:
/// boxes-00003-of-00008.safetensors.
std::string boxFileName(int rank, int ranks);
/// Adds a box [start, start + size) of parameter `name` (whole `shape`;
/// "{e}" in the name: a stack of experts, recorded as one box per expert
/// it covers, under the expert's name, as putParameter writes them),
/// held by rank `writer`, to `into`: its records and, when `data` (its
/// values) is given, its tensors. With `end` >= 0, only the box's
/// elements [begin, end) in row-major order (`data`: those alone).
void putParameterBox(const std::string &name, const std::vector<int64_t> &shape, const std::vector<int64_t> &start,
                     const std::vector<int64_t> &size, int writer, const float *data, BoxCheckpoint &into,
                     int64_t begin = 0, int64_t end = -1);
/// Writes `folder`/boxes.index.json: every tensor's shape and its boxes
/// (start, size and the file of the rank holding it, of `ranks`), and
/// their total bytes (F32); `save`, the save its files' metadata name.
/// `files`: each file's digest, recorded.
Status writeBoxIndex(const std::string &folder, const std::vector<SavedBox> &records, int ranks,
                     const std::string &save = "", const std::map<std::string, FileDigest> &files = {});

/// Reads a .npy array (little-endian f4 / i4 / i8, C order).
StatusOr<Tensor> readNpy(const std::string &path);
/// Writes `tensors` as a safetensors file, every tensor F32 (what the
/// runtime computes in), in name order.
/// `save`: an identity of this save, recorded in the file's metadata
/// (parax_save) for an index to match its shards against.
Status writeSafetensors(const std::string &path, const std::map<std::string, Tensor> &tensors,
                        const std::string &save = "");
/// Writes a sharded checkpoint's index (`model.safetensors.index.json` in
/// `folder`): each tensor's shard file, and the tensors' total bytes.
Status writeSafetensorsIndex(const std::string &folder, const std::map<std::string, std::string> &weightMap,
                             uint64_t totalBytes, const std::string &save = "",
                             const std::map<std::string, FileDigest> &files = {});
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
