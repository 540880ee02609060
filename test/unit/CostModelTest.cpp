//===- CostModelTest.cpp - collective, GEMM and stream costs by hand -------===//
//
// Every expected value here is written out from the formula of
// docs/cost-model.md with the preset's figures as numbers (dgx-h100: NVLink
// 450 GB/s at 0.82 = 369 GB/s, 3.4 us a step; the network 50 GB/s a GPU
// at 0.93 = 46.5 GB/s, 14 us a step; 8.4 us a launch), never with
// collectiveTime itself, so a wrong link, step count or placement fails.
//
//===----------------------------------------------------------------------===//

#include "parax/Plan/CostModel.h"
#include "parax/Plan/Profile.h"

#include <gtest/gtest.h>

using namespace parax::plan;

namespace {

ClusterSpec h100(int nodes) {
  return llvm::cantFail(resolveCluster("dgx-h100:nodes=" + std::to_string(nodes)));
}

constexpr double kNvlink = 369e9, kNic = 46.5e9;

TEST(CostModelTest, AllGatherInsideANodeIsOneNvlinkRing) {
  // 7 steps of 3.4 us after the 8.4 us launch; 7/8 of 1 GB over NVLink.
  ClusterSpec c = h100(1);
  double expected = 8.4e-6 + 7 * 3.4e-6 + 7.0 / 8 * 1e9 / kNvlink;
  EXPECT_NEAR(collectiveTime(c, CollectiveKind::AllGather, 1e9, makeGroup(c, 8, 1)), expected, 1e-9);
  EXPECT_NEAR(collectiveTime(c, CollectiveKind::ReduceScatter, 1e9, makeGroup(c, 8, 1)), expected, 1e-9);
}

TEST(CostModelTest, AllGatherOverNodesIsOneRingThroughEveryNic) {
  // 32 ranks, 8 a node on 4 nodes: 31 steps, 3 of them between nodes; the
  // ring's bus bandwidth is the lesser of NVLink (369) and 8 NICs (372).
  ClusterSpec c = h100(4);
  Group g = makeGroup(c, 32, 1);
  ASSERT_EQ(g.nodes(), 4);
  double expected = 8.4e-6 + 28 * 3.4e-6 + 3 * 14e-6 + 31.0 / 32 * 1e9 / kNvlink;
  EXPECT_NEAR(collectiveTime(c, CollectiveKind::AllGather, 1e9, g), expected, 1e-9);
  // One rank a node (a data-parallel group of stride 8): one NIC's rate.
  Group dp = makeGroup(c, 4, 8);
  ASSERT_EQ(dp.perNode, 1);
  double one = 8.4e-6 + 3 * 14e-6 + 3.0 / 4 * 1e9 / kNic;
  EXPECT_NEAR(collectiveTime(c, CollectiveKind::AllGather, 1e9, dp), one, 1e-9);
}

TEST(CostModelTest, AllReduceOverNodesTakesTheFasterOfRingAndTree) {
  ClusterSpec c = h100(4);
  Group g = makeGroup(c, 32, 1);
  // 1 GB: the ring (62 steps, 6 between nodes), Simple protocol.
  double ring = 8.4e-6 + 56 * 3.4e-6 + 6 * 14e-6 + 2.0 * 31 / 32 * 1e9 / kNvlink;
  EXPECT_NEAR(collectiveTime(c, CollectiveKind::AllReduce, 1e9, g), ring, 1e-9);
  // 64 KiB: the tree (7 NVLink steps up and down, 2 levels over 4 nodes
  // up and down) in the LL protocol: 6.6 us, a 5.7th of the step
  // latencies, half of 0.92 of the bus bandwidth.
  double tree = 6.6e-6 + (14 * 3.4e-6 + 4 * 14e-6) / 5.7 + 2.0 * 65536 / (0.5 * 0.92 * kNvlink);
  EXPECT_NEAR(collectiveTime(c, CollectiveKind::AllReduce, 65536, g), tree, 1e-10);
}

TEST(CostModelTest, AllToAllOverNodesSendsTheOffNodeShareOverTheNics) {
  // 16 ranks on 2 nodes, 1 GB a rank: half leaves the node over its NIC
  // (the bound), 7/16 stays on NVLink at the same time.
  ClusterSpec c = h100(2);
  double expected = 8.4e-6 + 14e-6 + 0.5e9 / kNic;
  EXPECT_NEAR(collectiveTime(c, CollectiveKind::AllToAll, 1e9, makeGroup(c, 16, 1)), expected, 1e-9);
  // Priced at NVLink's rate it would be 8x faster: the bug this catches.
  EXPECT_GT(collectiveTime(c, CollectiveKind::AllToAll, 1e9, makeGroup(c, 16, 1)), 0.5e9 / kNvlink * 7);
}

TEST(CostModelTest, SendRecvBetweenNodesUsesOneNic) {
  ClusterSpec c = h100(2);
  double expected = 8.4e-6 + 14e-6 + 1e8 / kNic;
  EXPECT_NEAR(collectiveTime(c, CollectiveKind::SendRecv, 1e8, makeGroup(c, 2, 8)), expected, 1e-9);
}

TEST(CostModelTest, AProfilesCollectiveEfficiencyScalesTheBandwidth) {
  ClusterSpec c = h100(1);
  c.profile.collectiveEfficiency = 0.5;
  double expected = 8.4e-6 + 7 * 3.4e-6 + 7.0 / 8 * 1e9 / (0.5 * kNvlink);
  EXPECT_NEAR(collectiveTime(c, CollectiveKind::AllGather, 1e9, makeGroup(c, 8, 1)), expected, 1e-9);
}

TEST(CostModelTest, AKindsSizeCurveScalesItsBandwidthByTheMessage) {
  // The all-gather's curve: share 1 to 100 MB, 0.5 from 400 MB, log-linear
  // between (at 200 MB half way in log: 0.75). The all-reduce has none.
  ClusterSpec c = h100(1);
  c.profile.sizeCurves[static_cast<int>(CollectiveKind::AllGather)] = {{100e6, 1.0}, {400e6, 0.5}};
  auto gather = [&](double bytes, double share) {
    return 8.4e-6 + 7 * 3.4e-6 + 7.0 / 8 * bytes / (share * kNvlink);
  };
  for (auto [bytes, share] : {std::pair<double, double>{50e6, 1.0}, {100e6, 1.0}, {200e6, 0.75}, {1e9, 0.5}})
    EXPECT_NEAR(collectiveTime(c, CollectiveKind::AllGather, bytes, makeGroup(c, 8, 1)), gather(bytes, share), 1e-9)
        << bytes;
  // (NCCL's LL protocol does not win at these sizes: Simple's time above)
  double reduce = 8.4e-6 + 14 * 3.4e-6 + 2 * 7.0 / 8 * 1e9 / kNvlink;
  EXPECT_NEAR(collectiveTime(c, CollectiveKind::AllReduce, 1e9, makeGroup(c, 8, 1)), reduce, 1e-9);
}

TEST(CostModelTest, GemmEfficiencyFollowsTilesAndWaves) {
  // 4096^3 on 132 SMs: 512 tiles of 256 x 128 in 4 waves of 132 (the last
  // short), times 4096 / (4096 + 64).
  EXPECT_NEAR(gemmShapeEfficiency(4096, 4096, 4096, 132, 64), 512.0 / 528 * 4096 / 4160, 1e-12);
  // 100 rows: a 128-row tile is 100/128 full; 32 column tiles split 4
  // ways along k fill 128 of 132 SMs.
  EXPECT_NEAR(gemmShapeEfficiency(100, 4096, 4096, 132, 64), 100.0 / 128 * 128 / 132 * 4096 / 4160,
              1e-12);
  // A shape that fills whole waves of full tiles, no k overhead: 1.
  EXPECT_DOUBLE_EQ(gemmShapeEfficiency(256 * 12, 128 * 11, 8192, 132, 0), 1.0);
}

TEST(CostModelTest, GemmTimeUsesTheShapeOnlyUnderAShapeProfile) {
  ClusterSpec c = h100(1);
  // (a node of 8 busy H100s: 0.716 of the peak, times the slowest
  // device's 0.972 of that)
  double flops = 2.0 * 100 * 4096 * 4096, peak = 989e12;
  double fixed = flops / (peak * 0.716 * 0.972);
  EXPECT_NEAR(gemmTime(c, flops, 0, peak, 100, 4096, 4096), fixed, 1e-15);
  c.profile = llvm::cantFail(resolveProfile("megatron-core"));
  // (megatron-core's gemm_k_overhead: 140)
  double shaped = flops / (peak * 0.716 * 0.972 * (100.0 / 128 * 128 / 132 * 4096 / 4236)) + 2e-6;
  EXPECT_NEAR(gemmTime(c, flops, 0, peak, 100, 4096, 4096), shaped, 1e-12);
  // A dtype twice as fast (kScale 2: fp8 on a bf16 model) has a tile's
  // fixed time over twice the k steps, 280: 4096 / 4376.
  double doubled = flops / (peak * 0.716 * 0.972 * (100.0 / 128 * 128 / 132 * 4096 / 4376)) + 2e-6;
  EXPECT_NEAR(gemmTime(c, flops, 0, peak, 100, 4096, 4096, 1, 2), doubled, 1e-12);
}

TEST(CostModelTest, ABusyNodesSlowestDeviceSetsTheGemmRate) {
  // mamf-finder's all-8 run on an H200 (its benchmarks README, branch
  // fast-mamf): mean 698.6 against 702.9 alone, the 40 samples 4.5 %
  // apart; the slowest device (half the spread below the mean) keeps
  // 698.6 / 702.9 x (1 - 0.045 / 2) = 0.9715 of the rate alone.
  ClusterSpec node = h100(2);
  EXPECT_NEAR(node.busyNodeMatmulShare, 698.6 / 702.9 * (1 - 0.045 / 2), 5e-4);
  double flops = 2.0 * 8192 * 8192 * 8192, peak = 989e12;
  EXPECT_NEAR(rooflineTime(node, flops, 0, peak), flops / (peak * 0.716 * 0.972), 1e-12);
  // One device alone keeps its own rate.
  ClusterSpec alone = llvm::cantFail(resolveCluster("dgx-h100:devices_per_node=1"));
  EXPECT_NEAR(rooflineTime(alone, flops, 0, peak), flops / (peak * 0.716), 1e-12);
  // B200 (the same protocol: 1426.4 against 1455.7, 10.4 % apart).
  ClusterSpec b200 = llvm::cantFail(resolveCluster("dgx-b200"));
  EXPECT_NEAR(b200.busyNodeMatmulShare, 1426.4 / 1455.7 * (1 - 0.104 / 2), 5e-4);
  // A burst figure (no sustained one measured: A100) is not scaled:
  // bursts draw far below the board's limit.
  EXPECT_EQ(llvm::cantFail(resolveCluster("dgx-a100-80gb")).sustainedMatmulEfficiency(), 0.869);
  // GB200 (its sustained rate not measured) takes the B200's, the same
  // die: 1456.3 / 2250 of its peak, and the B200's busy-node share.
  EXPECT_NEAR(llvm::cantFail(resolveCluster("gb200-nvl72")).sustainedMatmulEfficiency(),
              1456.3 / 2250 * 1426.4 / 1455.7 * (1 - 0.104 / 2), 5e-4);
}

TEST(CostModelTest, ABusyNodeShareOutOfRangeIsNamed) {
  std::string json = llvm::cantFail(resolveCluster("dgx-h100")).toJson();
  const std::string key = "\"busy_node_matmul_share\": ";
  size_t at = json.find(key);
  ASSERT_NE(at, std::string::npos);
  at += key.size();
  size_t end = json.find(',', at);
  EXPECT_NEAR(std::stod(json.substr(at, end - at)), 0.972, 1e-12); // (printed back)
  for (const char *bad : {"1.5", "0", "-0.5", "\"x\""}) {
    std::string text = json;
    text.replace(at, end - at, bad);
    llvm::Expected<ClusterSpec> parsed = parseCluster(text, "c.json");
    ASSERT_FALSE(static_cast<bool>(parsed)) << bad;
    std::string message = llvm::toString(parsed.takeError());
    EXPECT_NE(message.find("c.json: field 'busy_node_matmul_share'"), std::string::npos) << message;
  }
}

TEST(CostModelTest, StreamedGathersHideBehindTheLayerBefore) {
  // Four layers of 10 ms, gathers of 4 ms one layer ahead: only the first
  // gather waits.
  EXPECT_DOUBLE_EQ(streamedPassOverhead({4, 4, 4, 4}, {}, {10, 10, 10, 10}, 1), 4);
  // Gathers of 15 ms: each layer waits 5 ms more than the one before.
  EXPECT_DOUBLE_EQ(streamedPassOverhead({15, 15, 15, 15}, {}, {10, 10, 10, 10}, 1), 15 + 3 * 5);
  // No prefetch: every gather waits.
  EXPECT_DOUBLE_EQ(streamedPassOverhead({4, 4, 4, 4}, {}, {10, 10, 10, 10}, 0), 16);
  // Backward: the reduce-scatter of each layer follows it on the same
  // stream; the last one is exposed (and delays nothing else here).
  // gathers 2, reduces 3, work 10: g0 [0,2], L0 [2,12] (g1 [2,4]), r0
  // [12,15], g2 [15,17], L1 [12,22], r1 [22,25], g3 [25,27], L2 [22,32],
  // r2 [32,35], L3 [32,42], r3 [42,45]: 45 - 40.
  EXPECT_DOUBLE_EQ(streamedPassOverhead({2, 2, 2, 2}, {3, 3, 3, 3}, {10, 10, 10, 10}, 1), 5);
}

TEST(CostModelTest, StreamedGathersWaitForTheLinksALayerHolds) {
  // Layers of 10 ms whose own collectives hold the gathers' links 8 ms of
  // the 10 (2 ms free, spread over the layer): a gather of 4 ms issued as
  // a layer starts gets 2 ms of link in it and finishes 2 ms after it.
  // g0 [0,4]; L0 [4,14], g1 2 ms in L0, done 16; L1 [16,26], g2 done 28;
  // L2 [28,38], g3 done 40; L3 [40,50]: 50 - 40.
  EXPECT_DOUBLE_EQ(streamedPassOverhead({4, 4, 4, 4}, {}, {10, 10, 10, 10}, 1, {8, 8, 8, 8}), 10);
  // Held 4 of 10: 6 ms free, at 0.6 of the link a gather of 4 ms takes
  // 6.67 ms of the layer's 10: hidden, as without the layer's collectives.
  EXPECT_DOUBLE_EQ(streamedPassOverhead({4, 4, 4, 4}, {}, {10, 10, 10, 10}, 1, {4, 4, 4, 4}), 4);
  // Held on a link the stream does not use: nothing (the planner passes
  // only the links its group needs).
  EXPECT_DOUBLE_EQ(streamedPassOverhead({4, 4, 4, 4}, {}, {10, 10, 10, 10}, 1, {0, 0, 0, 0}), 4);
  // Backward with reduce-scatters (the case above, 5 ms), each layer's
  // links held 9 of 10 ms: g0 [0,2]; L0 [2,12]: g1 needs 2, 1 free ->
  // done 13; r0 [13,16]; L1 [13,23]: g2 issued at 13 behind r0 (ends 16),
  // so r0's last 3 ms and g2's 2 need 5, 1 free -> done 23 + 4 = 27;
  // r1 [27,30]; L2 [27,37]: g3 behind r1: 3 + 2 = 5 -> 37 + 4 = 41; r2
  // [41,44]; L3 [41,51]: r2's 3, 1 free -> 51 + 2 = 53; r3 [53,56]:
  // 56 - 40.
  EXPECT_DOUBLE_EQ(streamedPassOverhead({2, 2, 2, 2}, {3, 3, 3, 3}, {10, 10, 10, 10}, 1, {9, 9, 9, 9}),
                   16);
}

TEST(CostModelTest, ProfilesParseAndBadOnesNameTheField) {
  for (const std::string &name : profileNames()) {
    llvm::Expected<Profile> p = resolveProfile(name);
    ASSERT_TRUE(static_cast<bool>(p)) << name << ": " << llvm::toString(p.takeError());
    // What toJson writes, parseProfile reads back.
    llvm::Expected<Profile> again = parseProfile(p->toJson());
    ASSERT_TRUE(static_cast<bool>(again)) << llvm::toString(again.takeError());
    EXPECT_EQ(again->toJson(), p->toJson());
  }
  auto error = [](llvm::StringRef json) {
    llvm::Expected<Profile> p = parseProfile(json, "p.json");
    return p ? std::string() : llvm::toString(p.takeError());
  };
  EXPECT_NE(error(R"({"name": "x", "gemm_shape": true})").find("'gemm_shape' is not a profile field"),
            std::string::npos);
  EXPECT_NE(error(R"({"gemm_shapes": true})").find("'name' is missing"), std::string::npos);
  EXPECT_NE(error(R"({"name": "x", "attention": "paged"})").find("'attention' must be"),
            std::string::npos);
  EXPECT_NE(error(R"({"name": "x", "attention": "materialized"})").find("'score_bytes'"),
            std::string::npos);
  EXPECT_NE(error(R"({"name": "x", "attention": "materialized", "score_bytes": 13})")
                .find("'score_kept_bytes' must be positive for a materialized attention"),
            std::string::npos);
  EXPECT_NE(error(R"({"name": "x", "selective_recompute": "most"})").find("\"none\""), std::string::npos);
  EXPECT_NE(error(R"({"name": "x", "tp_overlap": 1.5})").find("'tp_overlap' must be in [0, 1]"),
            std::string::npos);
  EXPECT_NE(error(R"({"name": "x", "elementwise_passes": {"softmax": 2}})")
                .find("'elementwise_passes.softmax' is not an op class"),
            std::string::npos);
  EXPECT_NE(error(R"({"name": "x", "max_zero": 2.5})").find("'max_zero'"), std::string::npos);
  EXPECT_NE(error(R"({"name": "x", "collective_size_curves": {"all_reduce": [[4, 1], [2, 0.5]]}})")
                .find("'collective_size_curves.all_reduce' [1]: MB must ascend (2 after 4)"),
            std::string::npos);
  EXPECT_NE(error(R"({"name": "x", "collective_size_curves": {"all_reduce": [[4, 1.5]]}})")
                .find("the share in (0, 1], got [4, 1.5]"),
            std::string::npos);
  EXPECT_NE(error(R"({"name": "x", "collective_size_curves": {"broadcast": []}})")
                .find("'collective_size_curves.broadcast' is not a collective kind"),
            std::string::npos);
  EXPECT_NE(llvm::toString(resolveProfile("no-such-stack").takeError()).find("neither a shipped profile"),
            std::string::npos);
}

TEST(CostModelTest, AProfileExtendsAShippedOneFieldByField) {
  // A user's profile on top of a shipped one: its fields replace the
  // base's, the rest (and the description, unless given) are the base's.
  llvm::Expected<Profile> base = resolveProfile("megatron-core");
  ASSERT_TRUE(static_cast<bool>(base)) << llvm::toString(base.takeError());
  llvm::Expected<Profile> mine =
      parseProfile(R"({"name": "mine", "extends": "megatron-core", "tp_overlap": 0.5, "kernel_overhead_us": 3})");
  ASSERT_TRUE(static_cast<bool>(mine)) << llvm::toString(mine.takeError());
  EXPECT_EQ(mine->name, "mine");
  EXPECT_EQ(mine->description, base->description);
  EXPECT_EQ(mine->tpOverlap, 0.5);
  EXPECT_DOUBLE_EQ(mine->kernelOverhead, 3e-6);
  // everything else as the base's
  Profile same = *mine;
  same.name = base->name;
  same.tpOverlap = base->tpOverlap;
  same.kernelOverhead = base->kernelOverhead;
  EXPECT_EQ(same.toJson(), base->toJson());
  // the base's values that are not the defaults stay (megatron-core's)
  EXPECT_FALSE(mine->pipelineOutputsKept);
  EXPECT_EQ(mine->maxZero, 1);
  auto error = [](llvm::StringRef json) {
    llvm::Expected<Profile> p = parseProfile(json, "p.json");
    return p ? std::string() : llvm::toString(p.takeError());
  };
  EXPECT_NE(error(R"({"name": "x", "extends": "megatron-1999"})").find("'extends' must name a shipped profile ("),
            std::string::npos);
  EXPECT_NE(error(R"({"name": "x", "extends": 3})").find("'extends' must name a shipped profile"),
            std::string::npos);
}

} // namespace
