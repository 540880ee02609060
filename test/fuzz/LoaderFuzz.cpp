// LoaderFuzz.cpp - a libFuzzer target for the runtime's loaders: every byte
// string is one of the files a user hands parax-run, and each must end in a
// named error or in data the runtime can use -- never a crash, a read past a
// buffer (AddressSanitizer), undefined behaviour (UBSan), a hang or an
// allocation past the limit (libFuzzer's -timeout and -rss_limit_mb).
//
// The first byte picks the loader (its value modulo 5), the rest is the file:
//   0  an executable (.pxe): parsed, validated, and the helpers the
//      executors call on a validated one (result sources, pipeline ranges,
//      cache inputs) run over every stage;
//   1  a safetensors file: opened, every tensor read whole;
//   2  a sharded checkpoint's index (model.safetensors.index.json) over two
//      valid shards, with their sizes and CRC-32s recorded;
//   3  a box-wise checkpoint's index (boxes.index.json) over two ranks'
//      files of boxes;
//   4  a .npy array.
// The shards and box files (2, 3) are written once, by the library's own
// writers, in a folder of the process (LLVMFuzzerInitialize).
//
// PARAX_FUZZ_WRITE_SEEDS=DIR: writes a seed of loaders 2 and 3 (the indexes
// as written) to DIR and exits. PARAX_FUZZ_EXPECT_VALID=1: an input refused
// is a failure (abort) -- test/fuzz/run.sh runs the seed corpus so first,
// so that the fuzzing cannot pass by mutating files no loader accepts.
// Built and run for a bounded time by test/fuzz/run.sh (ctest loader-fuzz).

#include "parax/runtime/Checkpoint.h"
#include "parax/runtime/Executable.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

using namespace parax::runtime;

namespace {

std::string workDir;        // this process's folder
bool expectValid = false;   // PARAX_FUZZ_EXPECT_VALID
constexpr int64_t kMaxRead = int64_t(1) << 22; // elements read a tensor (past it: the header's claims alone)

void writeFile(const std::string &path, const uint8_t *data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char *>(data), static_cast<std::streamsize>(size));
}

std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void refused(const Status &status) {
  if (expectValid) {
    std::fprintf(stderr, "loader-fuzz: a seed was refused: %s\n", status.message().c_str());
    std::abort();
  }
}

void must(const Status &status) {
  if (!status.isOk()) {
    std::fprintf(stderr, "loader-fuzz: setup failed: %s\n", status.message().c_str());
    std::exit(1);
  }
}

void fuzzExecutable(const std::string &bytes) {
  StatusOr<parax::pxe::Executable> parsed = parseExecutable(bytes, "fuzz.pxe");
  if (!parsed.isOk())
    return refused(parsed.status());
  const parax::pxe::Executable &exe = parsed.value();
  (void)resultSources(exe);
  for (int s = 0; s < exe.stages_size(); ++s) {
    const parax::pxe::Stage &stage = exe.stages(s);
    (void)cacheStateInputs(stage);
    (void)backwardStart(stage);
    (void)tailStart(stage);
    for (int k = 0; k < stage.outputs_size(); ++k)
      (void)outputResult(stage, k);
    StatusOr<std::vector<PipelineRange>> ranges = pipelineRanges(exe, s);
    if (!ranges.isOk())
      refused(ranges.status());
  }
}

void readEveryTensor(const std::string &path) {
  StatusOr<std::shared_ptr<Checkpoint>> opened = Checkpoint::open(path);
  if (!opened.isOk())
    return refused(opened.status());
  const Checkpoint &ckpt = *opened.value();
  for (const std::string &name : ckpt.tensorNames()) {
    std::vector<int64_t> shape = ckpt.shapeOf(name);
    if (numelOf(shape) > kMaxRead)
      continue;
    Tensor out;
    Status status = ckpt.readBox(name, shape, std::vector<int64_t>(shape.size(), 0), shape, out);
    if (!status.isOk())
      refused(status);
  }
}

// Two tensors in two shards; the same two as a box-wise checkpoint of two
// ranks (one split by rows, one a ZeRO-like run of elements on each).
void writeFixtures() {
  Tensor a = Tensor::floats({4, 3}), b = Tensor::floats({5});
  for (int64_t k = 0; k < a.numel(); ++k)
    a.f[k] = 0.25f * float(k);
  for (int64_t k = 0; k < b.numel(); ++k)
    b.f[k] = -1.0f - float(k);
  std::string sharded = workDir + "/sharded";
  std::filesystem::create_directories(sharded);
  std::filesystem::create_directories(workDir + "/boxes");
  std::string save = "fuzz-save";
  std::map<std::string, FileDigest> digests;
  for (int k = 0; k < 2; ++k) {
    std::string file = shardFileName(k, 2);
    std::map<std::string, Tensor> tensors{{k ? "b" : "a", k ? b : a}};
    must(writeSafetensors(sharded + "/" + file, tensors, save));
    StatusOr<FileDigest> digest = digestFile(sharded + "/" + file);
    must(digest.status());
    digests[file] = digest.value();
  }
  must(writeSafetensorsIndex(sharded, {{"a", shardFileName(0, 2)}, {"b", shardFileName(1, 2)}},
                             4 * uint64_t(a.numel() + b.numel()), save, digests));

  BoxCheckpoint ranks[2];
  for (int r = 0; r < 2; ++r) {
    putParameterBox("a", {4, 3}, {2 * r, 0}, {2, 3}, r, a.f.data() + 6 * r, ranks[r]);
    putParameterBox("b", {5}, {0}, {5}, r, b.f.data() + 3 * r, ranks[r], 3 * r, r ? 5 : 3);
  }
  std::vector<SavedBox> records = ranks[0].records;
  records.insert(records.end(), ranks[1].records.begin(), ranks[1].records.end());
  std::map<std::string, FileDigest> boxDigests;
  for (int r = 0; r < 2; ++r) {
    std::string file = boxFileName(r, 2);
    must(writeSafetensors(workDir + "/boxes/" + file, ranks[r].tensors, save));
    StatusOr<FileDigest> digest = digestFile(workDir + "/boxes/" + file);
    must(digest.status());
    boxDigests[file] = digest.value();
  }
  must(writeBoxIndex(workDir + "/boxes", records, 2, save, boxDigests));
}

void writeSeed(const std::string &dir, const char *name, uint8_t loader, const std::string &file) {
  std::string bytes = std::string(1, char(loader)) + readFile(file);
  writeFile(dir + "/" + name, reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size());
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  char pattern[] = "/tmp/parax-loader-fuzz.XXXXXX";
  if (!mkdtemp(pattern)) {
    std::perror("loader-fuzz: mkdtemp");
    std::exit(1);
  }
  workDir = pattern;
  std::atexit([] { std::filesystem::remove_all(workDir); });
  writeFixtures();
  expectValid = std::getenv("PARAX_FUZZ_EXPECT_VALID") != nullptr;
  if (const char *seeds = std::getenv("PARAX_FUZZ_WRITE_SEEDS")) {
    writeSeed(seeds, "sharded-index", 2, workDir + "/sharded/model.safetensors.index.json");
    writeSeed(seeds, "box-index", 3, workDir + "/boxes/" + kBoxIndexName);
    writeSeed(seeds, "shard", 1, workDir + "/sharded/" + shardFileName(0, 2));
    // The other dtypes a safetensors file may hold (the writers' are F32).
    std::string header = R"({"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},)"
                         R"("h":{"dtype":"F16","shape":[2],"data_offsets":[8,12]},)"
                         R"("i":{"dtype":"I32","shape":[1,2],"data_offsets":[12,20]},)"
                         R"("l":{"dtype":"I64","shape":[2],"data_offsets":[20,36]},"__metadata__":{"format":"pt"}})";
    uint64_t length = header.size();
    std::string typed(1, char(1));
    typed.append(reinterpret_cast<const char *>(&length), 8);
    typed += header + std::string(36, '\x01');
    writeFile(std::string(seeds) + "/dtypes", reinterpret_cast<const uint8_t *>(typed.data()), typed.size());
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0)
    return 0;
  const uint8_t *file = data + 1;
  size_t bytes = size - 1;
  switch (data[0] % 5) {
  case 0:
    fuzzExecutable(std::string(reinterpret_cast<const char *>(file), bytes));
    break;
  case 1:
    writeFile(workDir + "/fuzz.safetensors", file, bytes);
    readEveryTensor(workDir + "/fuzz.safetensors");
    break;
  case 2:
    writeFile(workDir + "/sharded/model.safetensors.index.json", file, bytes);
    readEveryTensor(workDir + "/sharded");
    break;
  case 3:
    writeFile(workDir + "/boxes/" + kBoxIndexName, file, bytes);
    readEveryTensor(workDir + "/boxes");
    break;
  case 4: {
    writeFile(workDir + "/fuzz.npy", file, bytes);
    StatusOr<Tensor> array = readNpy(workDir + "/fuzz.npy");
    if (!array.isOk())
      refused(array.status());
    break;
  }
  }
  return 0;
}
