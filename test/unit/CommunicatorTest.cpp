// Group semantics of the communicators, on in-process ranks (threads): a
// group is the ranks differing only along the given grid axes, ordered by
// their coordinates on them.

#include "parax/runtime/Communicator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

using namespace parax::runtime;

namespace {

// Runs `body(rank, comm)` on one thread per rank of a grid of `shape`.
void onRanks(const std::vector<int64_t> &shape,
             const std::function<void(int, Communicator &)> &body) {
  auto comms = createThreadCommunicators(shape);
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r)
    threads.emplace_back([&, r] { body(static_cast<int>(r), *comms[r]); });
  for (auto &t : threads)
    t.join();
}

// Grid [dp = 2, tp = 2]: ranks 0..3 with coordinates (r / 2, r % 2).
constexpr unsigned kDp = 1, kTp = 2;

TEST(Communicator, AllReduceSumsWithinTheGroup) {
  std::vector<std::vector<float>> out(4);
  onRanks({2, 2}, [&](int rank, Communicator &c) {
    std::vector<float> v = {float(rank), 1.0f};
    ASSERT_TRUE(c.allReduce(v.data(), 2, kTp).isOk());
    out[rank] = v;
  });
  // tp groups: {0, 1} and {2, 3}.
  EXPECT_EQ(out[0], std::vector<float>({1, 2}));
  EXPECT_EQ(out[1], std::vector<float>({1, 2}));
  EXPECT_EQ(out[2], std::vector<float>({5, 2}));
  EXPECT_EQ(out[3], std::vector<float>({5, 2}));
}

TEST(Communicator, AllGatherOrdersByCoordinate) {
  std::vector<std::vector<float>> out(4);
  onRanks({2, 2}, [&](int rank, Communicator &c) {
    float mine = float(10 * rank);
    std::vector<float> all(2);
    ASSERT_TRUE(c.allGather(&mine, 1, all.data(), kDp).isOk());
    out[rank] = all;
  });
  // dp groups: {0, 2} and {1, 3}.
  EXPECT_EQ(out[0], std::vector<float>({0, 20}));
  EXPECT_EQ(out[3], std::vector<float>({10, 30}));
}

// Two runs of 2 values a rank, into runs of 4: run r of rank g at (2r + g) * 2.
TEST(Communicator, AllGatherRunsInterleavesTheRuns) {
  std::vector<std::vector<float>> out(4);
  onRanks({2, 2}, [&](int rank, Communicator &c) {
    std::vector<float> mine = {10.0f * rank, 10.0f * rank + 1, 10.0f * rank + 2, 10.0f * rank + 3};
    std::vector<float> all(8, -1);
    ASSERT_TRUE(c.allGatherRuns(mine.data(), 2, 2, all.data(), kTp).isOk());
    out[rank] = all;
  });
  // tp group {2, 3}: rank 2's first run, rank 3's first run, then the second
  // runs.
  EXPECT_EQ(out[2], std::vector<float>({20, 21, 30, 31, 22, 23, 32, 33}));
  EXPECT_EQ(out[3], out[2]);
}

TEST(Communicator, ReduceScatterAndAllToAll) {
  std::vector<std::vector<float>> rs(4), a2a(4);
  onRanks({2, 2}, [&](int rank, Communicator &c) {
    std::vector<float> in = {float(rank), float(100 + rank)};
    std::vector<float> piece(1), swapped(2);
    ASSERT_TRUE(c.reduceScatter(in.data(), piece.data(), 1, kTp).isOk());
    ASSERT_TRUE(c.allToAll(in.data(), swapped.data(), 1, kTp).isOk());
    rs[rank] = piece;
    a2a[rank] = swapped;
  });
  // Group {0, 1}: rank 0 keeps the sum of block 0 (0 + 1), rank 1 of block 1.
  EXPECT_EQ(rs[0], std::vector<float>({1}));
  EXPECT_EQ(rs[1], std::vector<float>({201}));
  // all_to_all: rank 0 gets block 0 of ranks 0 and 1; rank 1 their block 1.
  EXPECT_EQ(a2a[0], std::vector<float>({0, 1}));
  EXPECT_EQ(a2a[1], std::vector<float>({100, 101}));
}

TEST(Communicator, SendRecvBetweenStages) {
  std::vector<float> got(2, -1);
  onRanks({2, 1}, [&](int rank, Communicator &c) {
    if (rank == 0) {
      std::vector<float> v = {3, 4};
      ASSERT_TRUE(c.send(v.data(), 2, 1).isOk());
    } else {
      ASSERT_TRUE(c.recv(got.data(), 2, 0).isOk());
    }
  });
  EXPECT_EQ(got, std::vector<float>({3, 4}));
}

} // namespace

TEST(Communicator, CancellingEndsEveryWaitInAnError) {
  // Rank 0 waits for rank 1 in an all-reduce and in a recv that never come;
  // cancelling the world (what a failed rank or a watchdog does) ends both.
  auto comms = createThreadCommunicators({2});
  Status reduced = Status::ok(), received = Status::ok();
  std::thread waiting([&] {
    float x = 1, y = 0;
    reduced = comms[0]->allReduce(&x, 1, 1u);
    received = comms[0]->recv(&y, 1, 1);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  cancelThreadCommunicators(*comms[1]);
  waiting.join();
  ASSERT_FALSE(reduced.isOk());
  EXPECT_NE(reduced.message().find("another rank failed"), std::string::npos) << reduced.message();
  EXPECT_FALSE(received.isOk());
}
