// ThreadCommunicator.cpp - in-process communicators (one thread per rank),
// with the group semantics of the MPI one: a group is the ranks that differ
// only along a set of grid axes, ordered by their coordinates on them.

#include "parax/runtime/Communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>

namespace parax::runtime {

namespace {

struct World {
  std::vector<int64_t> shape;
  int size = 1;
  std::mutex mutex;
  std::condition_variable cv;
  // A generation-counted barrier per group (only its members call it).
  std::map<std::vector<int>, std::pair<int, long>> barriers; // members -> (arrived, generation)
  std::vector<const float *> posted;
  std::vector<const std::vector<size_t> *> postedCounts; // allToAllv's send counts
  std::map<std::pair<int, int>, std::deque<std::vector<float>>> mailboxes;
  bool cancelled = false; // cancelThreadCommunicators: every wait ends in an error

  std::vector<int64_t> coords(int rank) const {
    std::vector<int64_t> c(shape.size());
    for (int64_t i = shape.size() - 1; i >= 0; --i) {
      c[i] = rank % shape[i];
      rank /= shape[i];
    }
    return c;
  }
  // Members of `rank`'s group over `mask`, in group order.
  std::vector<int> members(int rank, unsigned mask) const {
    std::vector<int> out;
    for (int r = 0; r < size; ++r) {
      std::vector<int64_t> a = coords(r), b = coords(rank);
      bool same = true;
      for (size_t i = 0; i < shape.size(); ++i)
        if (!(mask & (1u << i)) && a[i] != b[i])
          same = false;
      if (same)
        out.push_back(r); // row-major order = group order (axes in grid order)
    }
    return out;
  }
  /// False when the world was cancelled instead of the group arriving: a
  /// rank never arrives once the world is cancelled, and a wait ends on the
  /// cancellation unless the group arrived first (then every member sees
  /// true). `untilAll`: the group's members have all passed an earlier
  /// barrier and will arrive, so cancellation does not end this wait (the
  /// barrier after reading each other's posts: a rank must not free what
  /// another still reads).
  bool barrier(const std::vector<int> &group, bool untilAll = false) {
    std::unique_lock<std::mutex> lock(mutex);
    if (cancelled && !untilAll) return false;
    auto &[arrived, generation] = barriers[group];
    long mine = generation;
    if (++arrived == static_cast<int>(group.size())) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return true;
    }
    cv.wait(lock, [&] { return barriers[group].second != mine || (cancelled && !untilAll); });
    return barriers[group].second != mine;
  }
};

Status cancelledError() { return Status::error("another rank failed: this collective was cancelled"); }

class ThreadCommunicator : public Communicator {
public:
  ThreadCommunicator(std::shared_ptr<World> world, int rank) : w_(std::move(world)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return w_->size; }
  int groupSize(unsigned mask) const override {
    return static_cast<int>(w_->members(rank_, mask).size());
  }

  // Posts `data`, waits for the group, lets `body` read every member's post,
  // and waits again before anyone reuses its buffer.
  template <typename F> Status exchange(const float *data, unsigned mask, F body) {
    std::vector<int> group = w_->members(rank_, mask);
    {
      std::lock_guard<std::mutex> lock(w_->mutex);
      w_->posted[rank_] = data;
    }
    if (!w_->barrier(group)) return cancelledError();
    std::vector<const float *> posts;
    {
      std::lock_guard<std::mutex> lock(w_->mutex);
      for (int r : group)
        posts.push_back(w_->posted[r]);
    }
    int me = static_cast<int>(std::find(group.begin(), group.end(), rank_) - group.begin());
    body(posts, me);
    w_->barrier(group, /*untilAll=*/true); // (the collective completed: a cancellation shows at the next wait)
    return Status::ok();
  }

  Status allReduce(float *data, size_t n, unsigned mask) override {
    std::vector<float> sum(n, 0.0f);
    Status s = exchange(data, mask, [&](auto &posts, int) {
      for (const float *p : posts)
        for (size_t i = 0; i < n; ++i) sum[i] += p[i];
    });
    if (!s.isOk()) return s;
    std::copy(sum.begin(), sum.end(), data);
    return Status::ok();
  }
  Status allGather(const float *in, size_t n, float *out, unsigned mask) override {
    return exchange(in, mask, [&](auto &posts, int) {
      for (size_t j = 0; j < posts.size(); ++j)
        std::copy(posts[j], posts[j] + n, out + j * n);
    });
  }
  Status allGatherRuns(const float *in, size_t rows, size_t run, float *out, unsigned mask) override {
    return gatherRunsTo(in, rows, run, out, mask, /*everyRank=*/true);
  }
  Status gatherRuns(const float *in, size_t rows, size_t run, float *out, unsigned mask) override {
    return gatherRunsTo(in, rows, run, out, mask, /*everyRank=*/false);
  }
  // allGatherRuns, or its gather onto the group's first rank.
  Status gatherRunsTo(const float *in, size_t rows, size_t run, float *out, unsigned mask, bool everyRank) {
    return exchange(in, mask, [&](auto &posts, int me) {
      if (!everyRank && me != 0) return;
      for (size_t j = 0; j < posts.size(); ++j)
        for (size_t r = 0; r < rows; ++r)
          std::copy(posts[j] + r * run, posts[j] + (r + 1) * run, out + (r * posts.size() + j) * run);
    });
  }
  Status reduceScatter(const float *in, float *out, size_t n, unsigned mask) override {
    return exchange(in, mask, [&](auto &posts, int me) {
      std::fill(out, out + n, 0.0f);
      for (const float *p : posts)
        for (size_t i = 0; i < n; ++i) out[i] += p[me * n + i];
    });
  }
  Status allToAll(const float *in, float *out, size_t n, unsigned mask) override {
    return exchange(in, mask, [&](auto &posts, int me) {
      for (size_t j = 0; j < posts.size(); ++j)
        std::copy(posts[j] + me * n, posts[j] + (me + 1) * n, out + j * n);
    });
  }
  Status allToAllv(const float *in, const std::vector<size_t> &sendCounts, float *out,
                   const std::vector<size_t> &recvCounts, unsigned mask) override {
    {
      std::lock_guard<std::mutex> lock(w_->mutex);
      w_->postedCounts[rank_] = &sendCounts; // read after exchange's first barrier
    }
    std::vector<int> group = w_->members(rank_, mask);
    Status bad = Status::ok();
    Status s = exchange(in, mask, [&](auto &posts, int me) {
      for (size_t j = 0; j < posts.size(); ++j) {
        const std::vector<size_t> &theirs = *w_->postedCounts[group[j]];
        size_t from = 0;
        for (int d = 0; d < me; ++d) from += theirs[d];
        if (theirs[me] != recvCounts[j])
          bad = Status::error("all_to_all: rank " + std::to_string(group[j]) + " sends " +
                              std::to_string(theirs[me]) + " values, " + std::to_string(recvCounts[j]) +
                              " expected");
        else
          std::copy(posts[j] + from, posts[j] + from + theirs[me], out);
        out += recvCounts[j];
      }
    });
    return s.isOk() ? bad : s;
  }
  Status send(const float *data, size_t n, int peer) override {
    std::lock_guard<std::mutex> lock(w_->mutex);
    w_->mailboxes[{rank_, peer}].emplace_back(data, data + n);
    w_->cv.notify_all();
    return Status::ok();
  }
  Status recv(float *data, size_t n, int peer) override {
    std::unique_lock<std::mutex> lock(w_->mutex);
    auto &box = w_->mailboxes[{peer, rank_}];
    w_->cv.wait(lock, [&] { return !box.empty() || w_->cancelled; });
    if (box.empty()) return cancelledError();
    if (box.front().size() != n)
      return Status::error("recv: expected " + std::to_string(n) + " values, got " +
                           std::to_string(box.front().size()));
    std::copy(box.front().begin(), box.front().end(), data);
    box.pop_front();
    return Status::ok();
  }
  [[noreturn]] void abort(const std::string &message) override {
    std::fprintf(stderr, "rank %d: %s\n", rank_, message.c_str());
    std::abort();
  }

  World &world() { return *w_; }

private:
  std::shared_ptr<World> w_;
  int rank_;
};

} // namespace

std::vector<std::unique_ptr<Communicator>>
createThreadCommunicators(const std::vector<int64_t> &shape) {
  auto world = std::make_shared<World>();
  world->shape = shape;
  world->size = 1;
  for (int64_t s : shape)
    world->size *= static_cast<int>(s);
  world->posted.assign(world->size, nullptr);
  world->postedCounts.assign(world->size, nullptr);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < world->size; ++r)
    comms.push_back(std::make_unique<ThreadCommunicator>(world, r));
  return comms;
}

void cancelThreadCommunicators(Communicator &any) {
  World &world = static_cast<ThreadCommunicator &>(any).world();
  std::lock_guard<std::mutex> lock(world.mutex);
  world.cancelled = true;
  world.cv.notify_all();
}

} // namespace parax::runtime
