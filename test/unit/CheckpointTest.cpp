// CheckpointTest.cpp - box-wise checkpoints: random tilings of random
// tensors (boxes cut at random, some held as runs of their elements, the
// files of random writers) written by putParameterBox / writeBoxIndex and
// read back by Checkpoint::readBox for random wanted boxes; every value
// must be the whole tensor's (each element holds its own row-major index).

#include "parax/runtime/Checkpoint.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

using namespace parax::runtime;

namespace {

int64_t numel(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The row-major index of each element of the box [start, start + size)
// of a tensor of `shape`, in the box's row-major order.
std::vector<float> indices(const std::vector<int64_t> &shape, const std::vector<int64_t> &start,
                           const std::vector<int64_t> &size) {
  std::vector<float> out;
  std::vector<int64_t> at(size.size(), 0);
  for (int64_t k = 0, n = numel(size); k < n; ++k) {
    int64_t flat = 0;
    for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + start[d] + at[d];
    out.push_back(static_cast<float>(flat));
    for (int64_t d = static_cast<int64_t>(size.size()) - 1; d >= 0; --d) {
      if (++at[d] < size[d]) break;
      at[d] = 0;
    }
  }
  return out;
}

struct Region {
  std::vector<int64_t> start, size;
};

// Cuts `whole` into boxes: up to `cuts` times a box is split in two along
// a random dimension at a random point.
std::vector<Region> tile(const std::vector<int64_t> &whole, int cuts, std::mt19937 &rng) {
  std::vector<Region> boxes = {{std::vector<int64_t>(whole.size(), 0), whole}};
  for (int c = 0; c < cuts; ++c) {
    Region &box = boxes[rng() % boxes.size()];
    int d = rng() % whole.size();
    if (box.size[d] < 2) continue;
    int64_t at = 1 + rng() % (box.size[d] - 1);
    Region other = box;
    box.size[d] = at;
    other.start[d] += at;
    other.size[d] -= at;
    boxes.push_back(other);
  }
  return boxes;
}

class TempFolder {
public:
  TempFolder() {
    char name[] = "/tmp/parax-checkpoint-test-XXXXXX";
    path_ = mkdtemp(name);
  }
  ~TempFolder() { std::filesystem::remove_all(path_); }
  const std::string &path() const { return path_; }

private:
  std::string path_;
};

// Writes `checkpoint` as `writers` ranks would: each its own tensors.
void write(const BoxCheckpoint &checkpoint, int writers, const std::string &folder) {
  for (int w = 0; w < writers; ++w) {
    std::map<std::string, Tensor> mine;
    for (const SavedBox &box : checkpoint.records)
      if (box.writer == w) mine[box.key()] = checkpoint.tensors.at(box.key());
    if (!mine.empty()) {
      ASSERT_TRUE(writeSafetensors(folder + "/" + boxFileName(w, writers), mine).isOk());
    }
  }
  ASSERT_TRUE(writeBoxIndex(folder, checkpoint.records, writers).isOk());
}

} // namespace

TEST(BoxCheckpoint, AnyWantedBoxReadsTheWholeTensorsValues) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 150; ++trial) {
    TempFolder folder;
    std::vector<int64_t> shape;
    for (int d = 0, rank = 1 + rng() % 3; d < rank; ++d) shape.push_back(1 + rng() % 9);
    const int writers = 1 + rng() % 3;
    BoxCheckpoint saved;
    for (const Region &box : tile(shape, rng() % 6, rng)) {
      std::vector<float> values = indices(shape, box.start, box.size);
      int64_t n = numel(box.size);
      if (n >= 2 && rng() % 2) { // as ZeRO's chunks: runs of the box's elements, in either order
        int64_t cut = 1 + rng() % (n - 1);
        bool later = rng() % 2;
        for (int run : {later ? 1 : 0, later ? 0 : 1}) {
          int64_t begin = run ? cut : 0, end = run ? n : cut;
          putParameterBox("w", shape, box.start, box.size, rng() % writers, values.data() + begin, saved, begin,
                          end);
        }
      } else {
        putParameterBox("w", shape, box.start, box.size, rng() % writers, values.data(), saved);
      }
    }
    write(saved, writers, folder.path());
    auto opened = Checkpoint::open(folder.path());
    ASSERT_TRUE(opened.isOk()) << opened.status().message();
    for (int want = 0; want < 10; ++want) {
      Region box;
      for (int64_t dim : shape) {
        int64_t a = rng() % dim, b = rng() % dim;
        box.start.push_back(std::min(a, b));
        box.size.push_back(std::max(a, b) - std::min(a, b) + 1);
      }
      Tensor got;
      ASSERT_TRUE(opened.value()->readBox("w", shape, box.start, box.size, got).isOk());
      ASSERT_EQ(got.f, indices(shape, box.start, box.size)) << "trial " << trial << ", wanted box " << want;
    }
  }
}

TEST(BoxCheckpoint, AStackOfExpertsIsSavedAsEachExpertsBoxes) {
  // A rank's box of experts 1..2 of 4 (each [3, 4]) and its run cut inside
  // expert 2, the other experts' boxes whole: each expert's tensor is
  // recorded under its own name, and the stack reads back whole.
  TempFolder folder;
  std::vector<int64_t> shape = {4, 3, 4};
  BoxCheckpoint saved;
  std::vector<float> middle = indices(shape, {1, 0, 0}, {2, 3, 4});
  putParameterBox("experts.{e}.w", shape, {1, 0, 0}, {2, 3, 4}, 0, middle.data(), saved, 0, 17);
  putParameterBox("experts.{e}.w", shape, {1, 0, 0}, {2, 3, 4}, 1, middle.data() + 17, saved, 17, 24);
  for (int64_t x : {0, 3}) {
    std::vector<float> expert = indices(shape, {x, 0, 0}, {1, 3, 4});
    putParameterBox("experts.{e}.w", shape, {x, 0, 0}, {1, 3, 4}, 1, expert.data(), saved);
  }
  std::set<std::string> names;
  for (const SavedBox &box : saved.records) names.insert(box.name);
  EXPECT_EQ(names, (std::set<std::string>{"experts.0.w", "experts.1.w", "experts.2.w", "experts.3.w"}));
  write(saved, 2, folder.path());
  auto opened = Checkpoint::open(folder.path());
  ASSERT_TRUE(opened.isOk()) << opened.status().message();
  Tensor got;
  ASSERT_TRUE(opened.value()->readParameterBox("experts.{e}.w", shape, {0, 0, 0}, shape, got).isOk());
  // (each expert's values: its own index within the stack)
  EXPECT_EQ(got.f, indices(shape, {0, 0, 0}, shape));
}

// Issue 45 R3: a checkpoint written over an existing one by a process
// killed mid-write. The file at the path must be one whole checkpoint or
// the other, never a truncated one (it was opened with O_TRUNC and written
// in place: both were lost). The writer is killed 5 ms into a 256 MB write.
TEST(CheckpointWrite, AKilledWriterLeavesTheOldFileWhole) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("parax-atomic-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::string path = (dir / "w.safetensors").string();
  std::map<std::string, Tensor> old;
  old["a"] = Tensor::floats({4});
  old["a"].f = {1, 2, 3, 4};
  ASSERT_TRUE(writeSafetensors(path, old).isOk());
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::map<std::string, Tensor> big;
    big["a"] = Tensor::floats({64 << 20});
    char go = 1;
    (void)!write(ready[1], &go, 1); // (the memory is ready: the write starts now)
    (void)writeSafetensors(path, big);
    _exit(0);
  }
  char go = 0;
  ASSERT_EQ(read(ready[0], &go, 1), 1);
  usleep(5000);
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  close(ready[0]);
  close(ready[1]);
  auto ckpt = Checkpoint::open(path);
  ASSERT_TRUE(ckpt.isOk()) << ckpt.status().message();
  const Checkpoint::Entry *entry = ckpt.value()->find("a");
  ASSERT_NE(entry, nullptr);
  EXPECT_TRUE(entry->shape == std::vector<int64_t>{4} || entry->shape == std::vector<int64_t>{64 << 20});
  // ... and every byte its header promises is there.
  std::ifstream file(path, std::ios::binary);
  uint64_t header = 0;
  file.read(reinterpret_cast<char *>(&header), 8);
  EXPECT_EQ(fs::file_size(path), 8 + header + 4 * static_cast<uint64_t>(numel(entry->shape)));
  if (entry->shape == std::vector<int64_t>{4}) {
    Tensor out;
    ASSERT_TRUE(ckpt.value()->readBox("a", {4}, {0}, {4}, out).isOk());
    EXPECT_EQ(out.f, (std::vector<float>{1, 2, 3, 4}));
  }
  fs::remove_all(dir);
}
