// Checkpoint.cpp - safetensors (memory-mapped, sliced reads) and .npy files.

#include "parax/runtime/Checkpoint.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <functional>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

namespace parax::runtime {

// A minimal JSON reader for the safetensors header and the indexes:
// objects, arrays, strings, numbers; nothing else is needed or accepted.
struct detail::Json {
  enum Kind { Object, Array, String, Number } kind = Number;
  std::map<std::string, Json> object;
  std::vector<Json> array;
  std::string string;
  double number = 0;
};

namespace {

using detail::Json;

class JsonParser {
public:
  JsonParser(const char *p, const char *end) : p_(p), end_(end) {}
  bool parse(Json &out, int depth = 0) {
    skip();
    if (p_ >= end_ || depth > 16)
      return false;
    if (*p_ == '{') {
      out.kind = Json::Object;
      ++p_;
      skip();
      if (p_ < end_ && *p_ == '}') return ++p_, true;
      while (true) {
        Json key;
        skip();
        if (!parseString(key.string)) return false;
        skip();
        if (p_ >= end_ || *p_++ != ':') return false;
        Json value;
        if (!parse(value, depth + 1)) return false;
        if (!out.object.emplace(key.string, std::move(value)).second) return false;
        skip();
        if (p_ < end_ && *p_ == ',') { ++p_; continue; }
        if (p_ < end_ && *p_ == '}') return ++p_, true;
        return false;
      }
    }
    if (*p_ == '[') {
      out.kind = Json::Array;
      ++p_;
      skip();
      if (p_ < end_ && *p_ == ']') return ++p_, true;
      while (true) {
        Json value;
        if (!parse(value, depth + 1)) return false;
        out.array.push_back(std::move(value));
        skip();
        if (p_ < end_ && *p_ == ',') { ++p_; continue; }
        if (p_ < end_ && *p_ == ']') return ++p_, true;
        return false;
      }
    }
    if (*p_ == '"') {
      out.kind = Json::String;
      return parseString(out.string);
    }
    out.kind = Json::Number;
    const char *start = p_;
    while (p_ < end_ && (isdigit(*p_) || *p_ == '-' || *p_ == '+' || *p_ == '.' || *p_ == 'e' || *p_ == 'E'))
      ++p_;
    if (p_ == start) return false;
    out.number = std::strtod(std::string(start, p_).c_str(), nullptr);
    return true;
  }
  bool atEnd() { skip(); return p_ == end_; }

private:
  void skip() { while (p_ < end_ && isspace(static_cast<unsigned char>(*p_))) ++p_; }
  bool parseString(std::string &s) {
    if (p_ >= end_ || *p_ != '"') return false;
    ++p_;
    while (p_ < end_ && *p_ != '"') {
      if (*p_ == '\\') {
        if (++p_ >= end_) return false;
      }
      s.push_back(*p_++);
    }
    if (p_ >= end_) return false;
    ++p_;
    return true;
  }
  const char *p_, *end_;
};

size_t dtypeSize(const std::string &dtype) {
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  if (dtype == "I64") return 8;
  return 0;
}

float halfToFloat(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {
      int e = -1;
      do { ++e; mant <<= 1; } while (!(mant & 0x400));
      bits = sign | ((127 - 15 - e) << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

} // namespace

Checkpoint::~Checkpoint() {
  for (const File &file : files_)
    if (file.map)
      munmap(const_cast<uint8_t *>(file.map), file.mapSize);
}

namespace {

bool isDirectory(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool exists(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}
bool endsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
// Reads a whole (small) file.
StatusOr<std::string> readText(const std::string &path, size_t limit) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return PARAX_ERROR(path + ": cannot open");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() > limit)
    return PARAX_ERROR(path + ": larger than " + std::to_string(limit) + " bytes");
  return text;
}

} // namespace

StatusOr<std::shared_ptr<Checkpoint>> Checkpoint::open(const std::string &path) {
  std::shared_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->path_ = path;
  Status s = Status::ok();
  if (isDirectory(path)) {
    std::string folder = path; // (files named in it without a doubled '/')
    while (folder.size() > 1 && folder.back() == '/')
      folder.pop_back();
    std::string index = folder + "/model.safetensors.index.json", single = folder + "/model.safetensors",
                boxes = folder + "/" + kBoxIndexName;
    if (exists(boxes))
      s = ckpt->addIndex(boxes);
    else if (exists(index))
      s = ckpt->addIndex(index);
    else if (exists(single))
      s = ckpt->addFile(single, nullptr);
    else
      return PARAX_ERROR(path + ": a folder without model.safetensors.index.json or model.safetensors (nor a "
                                "box-wise checkpoint's " + kBoxIndexName + ")");
  } else if (endsWith(path, ".json")) {
    s = ckpt->addIndex(path);
  } else {
    s = ckpt->addFile(path, nullptr);
  }
  if (!s.isOk())
    return s;
  return ckpt;
}

namespace {

std::string folderOf(const std::string &path) {
  return path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/'));
}

// A file an index names: a plain name in the index's folder.
Status plainFileName(const std::string &index, const std::string &file, const std::string &what) {
  if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
    return PARAX_ERROR(index + ": " + what + " is in '" + file + "', which is not a plain file name in the index's folder");
  // ... and not a symbolic link, which could lead anywhere.
  struct stat info;
  std::string full = folderOf(index) + "/" + file;
  if (lstat(full.c_str(), &info) == 0 && S_ISLNK(info.st_mode))
    return PARAX_ERROR(index + ": " + what + " is in '" + file +
                       "', a symbolic link (refused: it may lead outside the checkpoint's folder)");
  return Status::ok();
}

std::string listed(const std::vector<int64_t> &dims) {
  std::string text = "[";
  for (int64_t d : dims) text += (text.size() > 1 ? ", " : "") + std::to_string(d);
  return text + "]";
}

// A JSON array of integers in [0, 1e12] (a shape or a box's start).
bool readDims(const Json &value, std::vector<int64_t> &dims) {
  if (value.kind != Json::Array || value.array.size() > 16) return false;
  dims.clear();
  for (const Json &d : value.array) {
    if (d.kind != Json::Number || !(d.number >= 0) || d.number > 1e12 || d.number != static_cast<int64_t>(d.number))
      return false;
    dims.push_back(static_cast<int64_t>(d.number));
  }
  return true;
}

// The elements of `dims`, or -1 past 2^62.
int64_t volume(const std::vector<int64_t> &dims) {
  int64_t n = 1;
  for (int64_t d : dims)
    if (__builtin_mul_overflow(n, d, &n) || n > (int64_t(1) << 62)) return -1;
  return n;
}

} // namespace

// The save a file names in its metadata object `key` (an index's
// "metadata", a safetensors file's "__metadata__"): "" if none (not
// written by parax-run, or an older save).
static std::string savedBy(const Json &root, const char *key) {
  auto meta = root.object.find(key);
  if (meta == root.object.end() || meta->second.kind != Json::Object)
    return "";
  auto id = meta->second.object.find("parax_save");
  return id != meta->second.object.end() && id->second.kind == Json::String ? id->second.string : "";
}

Status Checkpoint::recordedDigests(const Json &root, const std::string &path,
                                   std::map<std::string, FileDigest> &out) {
  auto meta = root.object.find("metadata");
  if (meta == root.object.end() || meta->second.kind != Json::Object)
    return Status::ok();
  auto files = meta->second.object.find("parax_files");
  if (files == meta->second.object.end())
    return Status::ok();
  if (files->second.kind != Json::Object)
    return PARAX_ERROR(path + ": metadata.parax_files is not an object (file name -> bytes and crc32)");
  for (const auto &[name, record] : files->second.object) {
    auto bytes = record.object.find("bytes"), crc = record.object.find("crc32");
    char *end = nullptr;
    unsigned long value = 0;
    if (record.kind == Json::Object && crc != record.object.end() && crc->second.kind == Json::String &&
        crc->second.string.size() == 8)
      value = std::strtoul(crc->second.string.c_str(), &end, 16);
    if (record.kind != Json::Object || bytes == record.object.end() || bytes->second.kind != Json::Number ||
        bytes->second.number < 0 || bytes->second.number > 9e15 || !end || *end)
      return PARAX_ERROR(path + ": the record of file '" + name +
                         "' is not {\"bytes\": a size, \"crc32\": 8 hexadecimal digits}");
    out[name] = FileDigest{static_cast<uint64_t>(bytes->second.number), static_cast<uint32_t>(value)};
  }
  return Status::ok();
}

Status Checkpoint::addIndexedFiles(const Json &root, const std::string &path,
                                   const std::map<std::string, std::set<std::string>> &namesOf,
                                   const std::string &save) {
  std::string folder = folderOf(path);
  std::map<std::string, FileDigest> digests;
  if (Status s = recordedDigests(root, path, digests); !s.isOk())
    return s;
  for (const auto &[file, names] : namesOf) {
    auto digest = digests.find(file);
    if (!digests.empty() && digest == digests.end() && exists(folder + "/" + file)) // (else: "cannot open")
      return PARAX_ERROR(path + ": records no size and checksum for its file " + file +
                         " (an index edited by hand?)");
    if (Status s = addFile(folder + "/" + file, &names, save.empty() ? nullptr : &save,
                           digest == digests.end() ? nullptr : &digest->second);
        !s.isOk())
      return s;
  }
  return Status::ok();
}

Status Checkpoint::addIndex(const std::string &path) {
  StatusOr<std::string> text = readText(path, size_t(1) << 28);
  if (!text.isOk())
    return text.status();
  JsonParser parser(text.value().data(), text.value().data() + text.value().size());
  Json root;
  if (!parser.parse(root) || !parser.atEnd() || root.kind != Json::Object)
    return PARAX_ERROR(path + ": not a JSON object");
  if (root.object.count("tensors"))
    return addBoxIndex(root, path);
  auto map = root.object.find("weight_map");
  if (map == root.object.end() || map->second.kind != Json::Object)
    return PARAX_ERROR(path + ": no \"weight_map\" object (a sharded checkpoint's index)");
  std::string save = savedBy(root, "metadata");
  std::map<std::string, std::set<std::string>> tensorsOf; // shard file -> its tensors
  for (const auto &[name, file] : map->second.object) {
    if (file.kind != Json::String)
      return PARAX_ERROR(path + ": the shard of tensor '" + name + "' is not a file name");
    if (Status plain = plainFileName(path, file.string, "tensor '" + name + "'"); !plain.isOk())
      return plain;
    tensorsOf[file.string].insert(name);
  }
  if (Status s = addIndexedFiles(root, path, tensorsOf, save); !s.isOk())
    return s;
  for (const auto &[shard, names] : tensorsOf)
    for (const std::string &name : names)
      if (!entries_.count(name))
        return PARAX_ERROR(path + ": tensor '" + name + "' is not in its shard " + shard);
  return Status::ok();
}

Status Checkpoint::addBoxIndex(const Json &root, const std::string &path) {
  const Json &tensors = root.object.at("tensors");
  std::string save = savedBy(root, "metadata");
  if (tensors.kind != Json::Object)
    return PARAX_ERROR(path + ": \"tensors\" is not an object (a box-wise checkpoint's index)");
  std::map<std::string, std::set<std::string>> keysOf; // file -> the boxes' keys in it
  std::map<std::string, std::string> fileOf;           // key -> its file
  // Every pair of a tensor's boxes is compared: bound the work a hostile
  // index can ask for.
  int64_t pairs = 0;
  for (const auto &[name, tensor] : tensors.object) {
    std::string where = path + ": tensor '" + name + "'";
    auto shape = tensor.object.find("shape");
    auto boxes = tensor.object.find("boxes");
    Boxed boxed;
    if (tensor.kind != Json::Object || shape == tensor.object.end() || !readDims(shape->second, boxed.shape) ||
        volume(boxed.shape) < 0)
      return PARAX_ERROR(where + ": no shape (an array of dimensions)");
    if (boxes == tensor.object.end() || boxes->second.kind != Json::Array)
      return PARAX_ERROR(where + ": no \"boxes\" array");
    int64_t covered = 0;
    for (const Json &b : boxes->second.array) {
      Box box;
      auto start = b.object.find("start"), size = b.object.find("size"), file = b.object.find("file");
      if (b.kind != Json::Object || start == b.object.end() || size == b.object.end() || file == b.object.end() ||
          !readDims(start->second, box.start) || !readDims(size->second, box.size) ||
          file->second.kind != Json::String)
        return PARAX_ERROR(where + ": a box without start, size (arrays of dimensions) and file");
      bool inside = box.start.size() == boxed.shape.size() && box.size.size() == boxed.shape.size();
      for (size_t d = 0; inside && d < box.start.size(); ++d)
        inside = box.start[d] + box.size[d] <= boxed.shape[d];
      if (!inside)
        return PARAX_ERROR(where + ": the box at " + listed(box.start) + " of size " + listed(box.size) +
                           " lies outside its shape " + listed(boxed.shape));
      // A run of the box's elements (a ZeRO chunk), or all of them.
      box.end = volume(box.size);
      auto range = b.object.find("range");
      box.run = range != b.object.end();
      if (box.run) {
        std::vector<int64_t> bounds;
        if (!readDims(range->second, bounds) || bounds.size() != 2 || bounds[0] >= bounds[1] ||
            bounds[1] > box.end)
          return PARAX_ERROR(where + ": the box at " + listed(box.start) + " has a range that is not [begin, end)" +
                             " within its " + std::to_string(box.end) + " elements");
        box.begin = bounds[0];
        box.end = bounds[1];
      }
      for (const Box &other : boxed.boxes) {
        bool overlap = true;
        if (other.start == box.start && other.size == box.size) { // runs of one box
          overlap = std::max(box.begin, other.begin) < std::min(box.end, other.end);
        } else {
          for (size_t d = 0; overlap && d < box.start.size(); ++d)
            overlap = std::max(box.start[d], other.start[d]) <
                      std::min(box.start[d] + box.size[d], other.start[d] + other.size[d]);
        }
        if (overlap)
          return PARAX_ERROR(where + ": the boxes at " + listed(other.start) + " and " + listed(box.start) +
                             " overlap");
      }
      if ((pairs += static_cast<int64_t>(boxed.boxes.size())) > (int64_t(1) << 26))
        return PARAX_ERROR(path + ": more boxes than a checkpoint's index may hold");
      covered += box.end - box.begin;
      box.key = SavedBox{name, {}, box.start, box.size, 0, box.begin, box.run ? box.end : -1}.key();
      if (Status plain = plainFileName(path, file->second.string, "box '" + box.key + "'"); !plain.isOk())
        return plain;
      keysOf[file->second.string].insert(box.key);
      fileOf[box.key] = file->second.string;
      boxed.boxes.push_back(std::move(box));
    }
    if (covered != volume(boxed.shape))
      return PARAX_ERROR(where + ": its boxes cover " + std::to_string(covered) + " of its " +
                         std::to_string(volume(boxed.shape)) + " elements");
    boxed_[name] = std::move(boxed);
  }
  if (Status s = addIndexedFiles(root, path, keysOf, save); !s.isOk())
    return s;
  for (const auto &[name, boxed] : boxed_) {
    bool integers = false;
    for (size_t i = 0; i < boxed.boxes.size(); ++i) {
      const Box &box = boxed.boxes[i];
      const Entry *entry = find(box.key);
      if (!entry)
        return PARAX_ERROR(path + ": box '" + box.key + "' is not in its file " + fileOf[box.key]);
      std::vector<int64_t> stored = box.run ? std::vector<int64_t>{box.end - box.begin} : box.size;
      if (entry->shape != stored)
        return PARAX_ERROR(path + ": box '" + box.key + "' has shape " + listed(entry->shape) + " in " +
                           fileOf[box.key] + ", the index says " + listed(stored));
      bool isInt = entry->dtype == "I32" || entry->dtype == "I64";
      if (i && isInt != integers)
        return PARAX_ERROR(path + ": the boxes of tensor '" + name + "' mix integer and floating-point dtypes");
      integers = isInt;
    }
  }
  return Status::ok();
}

Status Checkpoint::addFile(const std::string &path, const std::set<std::string> *only, const std::string *save,
                           const FileDigest *digest) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0)
    return PARAX_ERROR(path + ": cannot open the checkpoint");
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size < 8) {
    ::close(fd);
    return PARAX_ERROR(path + ": not a safetensors file (too short)");
  }
  void *mapped = mmap(nullptr, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapped == MAP_FAILED)
    return PARAX_ERROR(path + ": cannot map the checkpoint");
  files_.push_back({path, static_cast<const uint8_t *>(mapped), static_cast<size_t>(st.st_size), 0});
  File &file = files_.back();
  uint64_t headerSize = 0;
  for (int i = 7; i >= 0; --i)
    headerSize = (headerSize << 8) | file.map[i];
  if (headerSize > file.mapSize - 8 || headerSize > (uint64_t(1) << 30))
    return PARAX_ERROR(path + ": header size " + std::to_string(headerSize) +
                       " exceeds the file");
  file.dataOffset = 8 + headerSize;
  const char *text = reinterpret_cast<const char *>(file.map + 8);
  JsonParser parser(text, text + headerSize);
  Json root;
  if (!parser.parse(root) || !parser.atEnd() || root.kind != Json::Object)
    return PARAX_ERROR(path + ": the header is not a JSON object");
  if (save) {
    // A file of another save than its index's: a save that did not finish
    // (its index still the last one's) or files of two runs together.
    std::string mine = savedBy(root, "__metadata__");
    if (mine != *save)
      return PARAX_ERROR(path + ": written by another save (" + (mine.empty() ? "none named" : mine) +
                         ") than its index names (" + *save +
                         "): a save that did not finish, or files of two saves mixed; refused");
  }
  if (digest) {
    // Damaged, truncated or replaced since its save completed.
    if (file.mapSize != digest->bytes)
      return PARAX_ERROR(path + ": " + std::to_string(file.mapSize) + " bytes, its index records " +
                         std::to_string(digest->bytes) + " (truncated or replaced since it was saved); refused");
    uLong crc = crc32(0L, Z_NULL, 0);
    for (size_t at = 0; at < file.mapSize;) {
      uInt piece = static_cast<uInt>(std::min<size_t>(file.mapSize - at, size_t(1) << 30));
      crc = crc32(crc, file.map + at, piece);
      at += piece;
    }
    if (static_cast<uint32_t>(crc) != digest->crc32) {
      char text[64];
      std::snprintf(text, sizeof text, "CRC-32 %08x, its index records %08x", static_cast<uint32_t>(crc),
                    digest->crc32);
      return PARAX_ERROR(path + ": " + text + " (damaged since it was saved); refused");
    }
  }
  size_t dataSize = file.mapSize - file.dataOffset;
  for (const auto &[name, value] : root.object) {
    if (name == "__metadata__" || (only && !only->count(name)))
      continue;
    std::string where = path + ": tensor '" + name + "'";
    if (value.kind != Json::Object)
      return PARAX_ERROR(where + " is not an object");
    auto dtype = value.object.find("dtype");
    auto shape = value.object.find("shape");
    auto offsets = value.object.find("data_offsets");
    if (dtype == value.object.end() || dtype->second.kind != Json::String ||
        !dtypeSize(dtype->second.string))
      return PARAX_ERROR(where + ": dtype missing or not F32/BF16/F16/I32/I64");
    if (shape == value.object.end() || shape->second.kind != Json::Array)
      return PARAX_ERROR(where + ": shape missing");
    if (offsets == value.object.end() || offsets->second.kind != Json::Array ||
        offsets->second.array.size() != 2)
      return PARAX_ERROR(where + ": data_offsets missing");
    Entry entry;
    entry.dtype = dtype->second.string;
    entry.file = static_cast<int>(files_.size()) - 1;
    int64_t elements = 1;
    for (const Json &d : shape->second.array) {
      if (d.kind != Json::Number || d.number < 0 || d.number > 1e12)
        return PARAX_ERROR(where + ": bad shape");
      entry.shape.push_back(static_cast<int64_t>(d.number));
      elements *= entry.shape.back();
    }
    double begin = offsets->second.array[0].number, end = offsets->second.array[1].number;
    if (begin < 0 || end < begin || end > static_cast<double>(dataSize))
      return PARAX_ERROR(where + ": data_offsets outside the file");
    entry.begin = static_cast<size_t>(begin);
    entry.end = static_cast<size_t>(end);
    if (entry.end - entry.begin != static_cast<size_t>(elements) * dtypeSize(entry.dtype))
      return PARAX_ERROR(where + ": byte size does not match its shape and dtype");
    if (entries_.count(name))
      return PARAX_ERROR(where + ": also in " + files_[entries_[name].file].path);
    entries_[name] = entry;
  }
  return Status::ok();
}

std::vector<std::string> Checkpoint::tensorNames() const {
  std::set<std::string> boxes;
  std::vector<std::string> names;
  for (const auto &[name, boxed] : boxed_) {
    names.push_back(name);
    for (const Box &box : boxed.boxes)
      boxes.insert(box.key);
  }
  for (const auto &[name, entry] : entries_)
    if (!boxes.count(name))
      names.push_back(name);
  return names;
}

std::vector<int64_t> Checkpoint::shapeOf(const std::string &name) const {
  auto boxed = boxed_.find(name);
  if (boxed != boxed_.end())
    return boxed->second.shape;
  const Entry *entry = find(name);
  return entry ? entry->shape : std::vector<int64_t>{};
}

const Checkpoint::Entry *Checkpoint::find(const std::string &name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

// Whether `want` is `have` with dimensions split into adjacent ones (each of
// `have`'s the product of consecutive dimensions of `want`): the same
// row-major elements, read in more dimensions (a [heads * rows, in] weight
// read as [heads, rows, in]). A transposed tensor of the same size is not.
static bool refines(const std::vector<int64_t> &want, const std::vector<int64_t> &have) {
  size_t i = 0;
  for (int64_t dim : have) {
    int64_t product = 1;
    do {
      if (i == want.size())
        return false;
      product *= want[i++];
    } while (product < dim && product != 0);
    if (product != dim)
      return false;
  }
  for (; i < want.size(); ++i)
    if (want[i] != 1)
      return false;
  return true;
}

Status Checkpoint::readBox(const std::string &name, const std::vector<int64_t> &shape,
                           const std::vector<int64_t> &start,
                           const std::vector<int64_t> &size, Tensor &out) const {
  auto boxed = boxed_.find(name);
  const Entry *entry = find(name);
  if (!entry && boxed == boxed_.end())
    return PARAX_ERROR(path_ + ": no tensor '" + name + "' (a missing weight)");
  const std::vector<int64_t> &have = entry ? entry->shape : boxed->second.shape;
  // A box-wise tensor's boxes are boxes of its own shape only.
  if (have != shape && (boxed != boxed_.end() || !refines(shape, have)))
    return PARAX_ERROR(path_ + ": tensor '" + name + "' has shape " + listed(have) + ", the executable expects " +
                       listed(shape));
  if (entry) {
    bool isInt = entry->dtype == "I32" || entry->dtype == "I64";
    out = isInt ? Tensor::ints(size) : Tensor::floats(size);
    copyRegion(*entry, shape, start, size, out, std::vector<int64_t>(size.size(), 0));
    return Status::ok();
  }
  // From every saved box the wanted one overlaps (they tile the tensor).
  const std::vector<Box> &boxes = boxed->second.boxes;
  const std::string &dtype = boxes.empty() ? "F32" : entries_.at(boxes.front().key).dtype; // (no box: no element)
  bool isInt = dtype == "I32" || dtype == "I64";
  out = isInt ? Tensor::ints(size) : Tensor::floats(size);
  for (const Box &box : boxes) {
    std::vector<int64_t> from(shape.size()), part(shape.size()), to(shape.size());
    bool overlaps = true;
    for (size_t d = 0; d < shape.size(); ++d) {
      int64_t lo = std::max(start[d], box.start[d]);
      int64_t hi = std::min(start[d] + size[d], box.start[d] + box.size[d]);
      overlaps = overlaps && lo < hi;
      from[d] = lo - box.start[d];
      part[d] = hi - lo;
      to[d] = lo - start[d];
    }
    if (overlaps)
      copyRegion(entries_.at(box.key), box.size, from, part, out, to, box.begin, box.end);
  }
  return Status::ok();
}

void Checkpoint::copyRegion(const Entry &entry, const std::vector<int64_t> &shape, const std::vector<int64_t> &from,
                            const std::vector<int64_t> &size, Tensor &out, const std::vector<int64_t> &to,
                            int64_t begin, int64_t end) const {
  size_t rank = shape.size();
  size_t elem = dtypeSize(entry.dtype);
  const File &file = files_[entry.file];
  const uint8_t *base = file.map + file.dataOffset + entry.begin;
  std::vector<int64_t> strides(rank, 1), outStrides(rank, 1);
  for (int64_t d = static_cast<int64_t>(rank) - 2; d >= 0; --d) {
    strides[d] = strides[d + 1] * shape[d + 1];
    outStrides[d] = outStrides[d + 1] * out.shape[d + 1];
  }
  int64_t rows = 1;
  for (int64_t d : size) rows *= d;
  // Row by row: the region's last dimension is contiguous in the file.
  int64_t inner = rank ? size[rank - 1] : 1;
  if (rows == 0 || inner == 0)
    return;
  rows /= inner;
  const std::string &dtype = entry.dtype;
  auto convert = [&](const uint8_t *p, int64_t k, int64_t count) {
    if (dtype == "F32") {
      std::memcpy(&out.f[k], p, count * 4);
    } else if (dtype == "BF16") {
      for (int64_t j = 0; j < count; ++j, p += 2) {
        uint32_t bits = uint32_t(p[0] | (p[1] << 8)) << 16;
        std::memcpy(&out.f[k + j], &bits, 4);
      }
    } else if (dtype == "F16") {
      for (int64_t j = 0; j < count; ++j, p += 2)
        out.f[k + j] = halfToFloat(uint16_t(p[0] | (p[1] << 8)));
    } else if (dtype == "I32") {
      std::memcpy(&out.i[k], p, count * 4);
    } else {
      for (int64_t j = 0; j < count; ++j, p += 8) {
        int64_t v;
        std::memcpy(&v, p, 8);
        out.i[k + j] = static_cast<int32_t>(v);
      }
    }
  };
  std::vector<int64_t> index(rank, 0); // the row's coordinates in the region (last stays 0)
  for (int64_t row = 0; row < rows; ++row) {
    int64_t offset = 0, at = 0;
    for (size_t d = 0; d < rank; ++d) {
      offset += (from[d] + index[d]) * strides[d];
      at += (to[d] + index[d]) * outStrides[d];
    }
    // The part of the row the entry holds.
    int64_t lo = std::max(offset, begin), hi = std::min(offset + inner, end);
    if (lo < hi)
      convert(base + (lo - begin) * elem, at + (lo - offset), hi - lo);
    for (int64_t d = static_cast<int64_t>(rank) - 2; d >= 0; --d) {
      if (++index[d] < size[d])
        break;
      index[d] = 0;
    }
  }
}

// The checkpoint name of expert `x` of the stack `name` ("{e}" replaced).
static std::string expertName(const std::string &name, int64_t x) {
  size_t e = name.find("{e}");
  return name.substr(0, e) + std::to_string(x) + name.substr(e + 3);
}

Status Checkpoint::readParameterBox(const std::string &name, const std::vector<int64_t> &shape,
                                    const std::vector<int64_t> &start,
                                    const std::vector<int64_t> &size, Tensor &out) const {
  size_t e = name.find("{e}");
  if (e == std::string::npos)
    return readBox(name, shape, start, size, out);
  if (shape.empty() || start.size() != shape.size() || size.size() != shape.size())
    return PARAX_ERROR(path_ + ": a stack of experts '" + name + "' needs a leading expert dimension");
  out = Tensor::floats(size);
  std::vector<int64_t> inner(shape.begin() + 1, shape.end());
  std::vector<int64_t> innerStart(start.begin() + 1, start.end());
  std::vector<int64_t> innerSize(size.begin() + 1, size.end());
  int64_t perExpert = out.numel() / std::max<int64_t>(size[0], 1);
  for (int64_t x = 0; x < size[0]; ++x) {
    std::string expert = expertName(name, start[0] + x);
    Tensor piece;
    Status s = readBox(expert, inner, innerStart, innerSize, piece);
    if (!s.isOk())
      return s;
    // (an expert's weights are floats; integers there left the stack's
    // part zero, silently, before)
    if (piece.isInt)
      return PARAX_ERROR(path_ + ": checkpoint tensor '" + expert +
                         "' holds integers, the program reads floats there (a stack of experts' weights)");
    std::copy(piece.f.begin(), piece.f.end(), out.f.begin() + x * perExpert);
  }
  return Status::ok();
}

std::vector<std::string> checkpointNames(const std::string &name, const std::vector<int64_t> &shape) {
  size_t e = name.find("{e}");
  if (e == std::string::npos || shape.empty())
    return {name};
  std::vector<std::string> names;
  for (int64_t x = 0; x < shape[0]; ++x)
    names.push_back(expertName(name, x));
  return names;
}

void putParameter(const std::string &name, Tensor whole, std::map<std::string, Tensor> &tensors) {
  std::vector<std::string> names = checkpointNames(name, whole.shape);
  if (names.size() == 1 && names[0] == name) {
    tensors[name] = std::move(whole);
    return;
  }
  std::vector<int64_t> inner(whole.shape.begin() + 1, whole.shape.end());
  int64_t perExpert = whole.numel() / std::max<int64_t>(whole.shape[0], 1);
  for (size_t x = 0; x < names.size(); ++x) {
    Tensor piece = Tensor::floats(inner);
    std::copy(whole.f.begin() + x * perExpert, whole.f.begin() + (x + 1) * perExpert, piece.f.begin());
    tensors[names[x]] = std::move(piece);
  }
}

StatusOr<Tensor> readNpy(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return PARAX_ERROR(path + ": cannot open");
  char magic[8];
  in.read(magic, 8);
  if (!in || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    return PARAX_ERROR(path + ": not a .npy file");
  uint32_t headerLen = 0;
  if (magic[6] == 1) {
    unsigned char b[2];
    in.read(reinterpret_cast<char *>(b), 2);
    headerLen = b[0] | (b[1] << 8);
  } else {
    unsigned char b[4];
    in.read(reinterpret_cast<char *>(b), 4);
    headerLen = b[0] | (b[1] << 8) | (b[2] << 16) | (uint32_t(b[3]) << 24);
  }
  if (!in || headerLen > 65536)
    return PARAX_ERROR(path + ": bad .npy header");
  std::string header(headerLen, '\0');
  in.read(header.data(), headerLen);
  auto field = [&](const std::string &key) {
    size_t k = header.find("'" + key + "'");
    return k == std::string::npos ? std::string() : header.substr(k + key.size() + 2);
  };
  std::string descr = field("descr"), order = field("fortran_order"), shapeText = field("shape");
  if (order.find("False") == std::string::npos || order.find("False") > 4)
    return PARAX_ERROR(path + ": Fortran-ordered arrays are not supported");
  std::string type;
  for (const char *t : {"<f4", "<i4", "<i8"})
    if (descr.find(t) != std::string::npos && descr.find(t) < 6)
      type = t;
  if (type.empty())
    return PARAX_ERROR(path + ": dtype must be <f4, <i4 or <i8");
  std::vector<int64_t> shape;
  size_t open = shapeText.find('('), close = shapeText.find(')');
  if (open == std::string::npos || close == std::string::npos)
    return PARAX_ERROR(path + ": no shape in the header");
  std::string dims = shapeText.substr(open + 1, close - open - 1);
  size_t pos = 0;
  int64_t n = 1; // elements
  while (pos < dims.size()) {
    size_t next = dims.find(',', pos);
    std::string item = dims.substr(pos, next == std::string::npos ? std::string::npos : next - pos);
    size_t first = item.find_first_not_of(' '), last = item.find_last_not_of(' ');
    item = first == std::string::npos ? std::string() : item.substr(first, last - first + 1);
    if (!item.empty()) { // (a trailing comma leaves none)
      if (item.size() > 12 || item.find_first_not_of("0123456789") != std::string::npos)
        return PARAX_ERROR(path + ": the shape's dimension '" + item + "' is not a count");
      shape.push_back(std::stoll(item));
      n *= shape.back();
      if (n > (int64_t(1) << 40))
        return PARAX_ERROR(path + ": the shape holds too many elements");
    }
    if (next == std::string::npos) break;
    pos = next + 1;
  }
  // The data must all be there before anything is allocated for it.
  std::streampos data = in.tellg();
  in.seekg(0, std::ios::end);
  int64_t available = static_cast<int64_t>(in.tellg() - data);
  in.seekg(data);
  if (!in || available < n * (type == "<i8" ? 8 : 4))
    return PARAX_ERROR(path + ": truncated data");
  Tensor t = type == "<f4" ? Tensor::floats(shape) : Tensor::ints(shape);
  if (type == "<f4") {
    in.read(reinterpret_cast<char *>(t.f.data()), n * 4);
  } else if (type == "<i4") {
    in.read(reinterpret_cast<char *>(t.i.data()), n * 4);
  } else {
    std::vector<int64_t> wide(n);
    in.read(reinterpret_cast<char *>(wide.data()), n * 8);
    for (int64_t k = 0; k < n; ++k) {
      if (wide[k] < INT32_MIN || wide[k] > INT32_MAX) // (truncated, it would be another token)
        return PARAX_ERROR(path + ": element " + std::to_string(k) + " is " + std::to_string(wide[k]) +
                           ", outside the 32-bit range the runtime's indices hold");
      t.i[k] = static_cast<int32_t>(wide[k]);
    }
  }
  if (!in)
    return PARAX_ERROR(path + ": truncated data");
  return t;
}

// Writes `path` through a temporary file beside it, flushed, synced and
// renamed over it: the old file stays whole until the new one is, so a run
// killed mid-write loses neither.
static Status writeAtomically(const std::string &path, const std::function<void(std::ostream &)> &write) {
  std::string partial = path + ".partial-" + std::to_string(getpid());
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    if (!out)
      return PARAX_ERROR(path + ": cannot write (" + partial + ")");
    write(out);
    out.flush();
    if (!out) {
      std::remove(partial.c_str());
      return PARAX_ERROR(path + ": write failed");
    }
  }
  int fd = ::open(partial.c_str(), O_RDONLY);
  bool synced = fd >= 0 && ::fsync(fd) == 0;
  if (fd >= 0)
    ::close(fd);
  if (!synced || std::rename(partial.c_str(), path.c_str()) != 0) {
    std::remove(partial.c_str());
    return PARAX_ERROR(path + ": cannot put the written file in place");
  }
  return Status::ok();
}

Status writeNpy(const std::string &path, const Tensor &t) {
  std::string shape = "(";
  for (int64_t d : t.shape)
    shape += std::to_string(d) + ",";
  shape += ")";
  std::string header = "{'descr': '" + std::string(t.isInt ? "<i4" : "<f4") +
                       "', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64)
    header += ' ';
  header += '\n';
  return writeAtomically(path, [&](std::ostream &out) {
    out.write("\x93NUMPY\x01\x00", 8);
    uint16_t len = header.size();
    out.put(len & 0xff);
    out.put(len >> 8);
    out << header;
    if (t.isInt)
      out.write(reinterpret_cast<const char *>(t.i.data()), t.i.size() * 4);
    else
      out.write(reinterpret_cast<const char *>(t.f.data()), t.f.size() * 4);
  });
}

// Tensor names are written unescaped: refuse those that would need it.
static Status plainName(const std::string &path, const std::string &name) {
  for (char c : name)
    if (c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20)
      return PARAX_ERROR(path + ": tensor name '" + name + "' needs escaping, which is not written");
  return Status::ok();
}

std::string shardFileName(int k, int n) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, n);
  return name;
}

// An index's metadata: the total, the save and each file's digest.
static std::string indexMetadata(uint64_t totalBytes, const std::string &save,
                                 const std::map<std::string, FileDigest> &files) {
  std::string text = "{\"total_size\": " + std::to_string(totalBytes);
  if (!save.empty())
    text += ", \"parax_save\": \"" + save + "\"";
  if (!files.empty()) {
    text += ", \"parax_files\": {";
    const char *separator = "";
    for (const auto &[name, digest] : files) {
      char crc[16];
      std::snprintf(crc, sizeof crc, "%08x", digest.crc32);
      text += separator + std::string("\"") + name + "\": {\"bytes\": " + std::to_string(digest.bytes) +
              ", \"crc32\": \"" + crc + "\"}";
      separator = ", ";
    }
    text += "}";
  }
  return text + "}";
}

StatusOr<FileDigest> digestFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return PARAX_ERROR(path + ": cannot read it back");
  FileDigest digest;
  uLong crc = crc32(0L, Z_NULL, 0);
  std::vector<char> buffer(size_t(1) << 20);
  while (in) {
    in.read(buffer.data(), buffer.size());
    std::streamsize got = in.gcount();
    if (got <= 0)
      break;
    crc = crc32(crc, reinterpret_cast<const Bytef *>(buffer.data()), static_cast<uInt>(got));
    digest.bytes += static_cast<uint64_t>(got);
  }
  if (in.bad())
    return PARAX_ERROR(path + ": a read failed");
  digest.crc32 = static_cast<uint32_t>(crc);
  return digest;
}

Status writeSafetensorsIndex(const std::string &folder, const std::map<std::string, std::string> &weightMap,
                             uint64_t totalBytes, const std::string &save,
                             const std::map<std::string, FileDigest> &files) {
  std::string path = folder + "/model.safetensors.index.json";
  for (const auto &[name, file] : weightMap)
    if (Status plain = plainName(path, name); !plain.isOk())
      return plain;
  return writeAtomically(path, [&](std::ostream &out) {
    out << "{\n  \"metadata\": " << indexMetadata(totalBytes, save, files) << ",\n  \"weight_map\": {";
    const char *separator = "\n";
    for (const auto &[name, file] : weightMap) {
      out << separator << "    \"" << name << "\": \"" << file << "\"";
      separator = ",\n";
    }
    out << "\n  }\n}\n";
  });
}

std::string boxKey(const std::string &name, const std::vector<int64_t> &start) {
  std::string key = name + "@";
  for (size_t d = 0; d < start.size(); ++d) key += (d ? "," : "") + std::to_string(start[d]);
  return key;
}

std::string boxFileName(int rank, int ranks) {
  char name[64];
  std::snprintf(name, sizeof name, "boxes-%05d-of-%05d.safetensors", rank + 1, ranks);
  return name;
}

std::string SavedBox::key() const {
  return boxKey(name, start) + (end >= 0 ? "#" + std::to_string(begin) : "");
}

void putParameterBox(const std::string &name, const std::vector<int64_t> &shape, const std::vector<int64_t> &start,
                     const std::vector<int64_t> &size, int writer, const float *data, BoxCheckpoint &into,
                     int64_t begin, int64_t end) {
  // A box (or the run [first, last) of its elements) and its values.
  auto put = [&](const std::string &tensor, std::vector<int64_t> whole, std::vector<int64_t> at,
                 std::vector<int64_t> extent, int64_t first, int64_t last, const float *values) {
    SavedBox box{tensor, std::move(whole), std::move(at), std::move(extent), writer, first, last};
    if (values) {
      Tensor t = Tensor::floats(last >= 0 ? std::vector<int64_t>{last - first} : box.size);
      std::copy(values, values + t.numel(), t.f.begin());
      into.tensors[box.key()] = std::move(t);
    }
    into.records.push_back(std::move(box));
  };
  if (name.find("{e}") == std::string::npos || shape.empty()) {
    put(name, shape, start, size, begin, end, data);
    return;
  }
  // A stack of experts: a box of each expert it covers (a run: its part
  // of each expert's elements).
  std::vector<int64_t> inner(shape.begin() + 1, shape.end()), innerStart(start.begin() + 1, start.end()),
      innerSize(size.begin() + 1, size.end());
  int64_t perExpert = 1;
  for (int64_t d : innerSize) perExpert *= d;
  for (int64_t x = 0; x < size[0]; ++x) {
    int64_t first = x * perExpert, last = first + perExpert; // the expert's elements in the box
    if (end >= 0) {
      first = std::max(first, begin);
      last = std::min(last, end);
      if (first >= last) continue;
    }
    bool whole = end < 0 || (first == x * perExpert && last == first + perExpert);
    put(expertName(name, start[0] + x), inner, innerStart, innerSize, whole ? 0 : first - x * perExpert,
        whole ? -1 : last - x * perExpert, data ? data + (first - (end >= 0 ? begin : 0)) : nullptr);
  }
}

Status writeBoxIndex(const std::string &folder, const std::vector<SavedBox> &records, int ranks,
                     const std::string &save, const std::map<std::string, FileDigest> &files) {
  std::string path = folder + "/" + kBoxIndexName;
  std::map<std::string, std::vector<const SavedBox *>> byTensor;
  uint64_t bytes = 0;
  for (const SavedBox &box : records) {
    if (Status plain = plainName(path, box.name); !plain.isOk())
      return plain;
    byTensor[box.name].push_back(&box);
    bytes += 4 * static_cast<uint64_t>(box.end >= 0 ? box.end - box.begin : volume(box.size));
  }
  return writeAtomically(path, [&](std::ostream &out) {
    out << "{\n  \"format\": \"parax-boxes\",\n  \"metadata\": " << indexMetadata(bytes, save, files)
        << ",\n  \"tensors\": {";
    const char *separator = "\n";
    for (const auto &[name, boxes] : byTensor) {
      out << separator << "    \"" << name << "\": {\"shape\": " << listed(boxes.front()->shape)
          << ", \"boxes\": [";
      for (size_t i = 0; i < boxes.size(); ++i) {
        out << (i ? ",\n" : "\n") << "      {\"start\": " << listed(boxes[i]->start) << ", \"size\": "
            << listed(boxes[i]->size);
        if (boxes[i]->end >= 0)
          out << ", \"range\": " << listed({boxes[i]->begin, boxes[i]->end});
        out << ", \"file\": \"" << boxFileName(boxes[i]->writer, ranks) << "\"}";
      }
      out << "]}";
      separator = ",\n";
    }
    out << "\n  }\n}\n";
  });
}

Status writeSafetensors(const std::string &path, const std::map<std::string, Tensor> &tensors,
                        const std::string &save) {
  std::string header = "{";
  if (!save.empty())
    header += "\"__metadata__\":{\"parax_save\":\"" + save + "\"}";
  size_t offset = 0;
  for (const auto &[name, t] : tensors) {
    if (t.isInt)
      return PARAX_ERROR(path + ": tensor " + name + " holds integers (only F32 is written)");
    if (Status plain = plainName(path, name); !plain.isOk())
      return plain;
    std::string shape;
    for (int64_t d : t.shape)
      shape += (shape.empty() ? "" : ",") + std::to_string(d);
    size_t bytes = t.f.size() * 4;
    header += (header.size() > 1 ? "," : "") + std::string("\"") + name + "\":{\"dtype\":\"F32\",\"shape\":[" +
              shape + "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + bytes) + "]}";
    offset += bytes;
  }
  header += "}";
  while (header.size() % 8)
    header += ' ';
  return writeAtomically(path, [&](std::ostream &out) {
    uint64_t length = header.size();
    for (int b = 0; b < 8; ++b)
      out.put(static_cast<char>((length >> (8 * b)) & 0xff));
    out << header;
    for (const auto &[name, t] : tensors)
      out.write(reinterpret_cast<const char *>(t.f.data()), t.f.size() * 4);
  });
}

} // namespace parax::runtime
