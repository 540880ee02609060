//===- CalibrationTest.cpp - the fit recovers the figures that made the times -===//
//
// Run profiles written here from known figures (a GEMM rate and the
// bandwidth GEMMs stream at, the plain, the norms' and the cross-entropy's
// memory rates, the attention's forward and backward rates, a kernel's
// overhead, a collective's launch, ring step and bandwidth, the host's
// work a parameter), each
// instruction's time computed by the planner's own forms; calibrate() must
// give those figures back.
//
//===----------------------------------------------------------------------===//

#include "parax/Plan/Calibration.h"
#include "parax/Plan/CostModel.h"

#include "llvm/Support/FormatVariadic.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <regex>
#include <string>
#include <vector>

using namespace parax::plan;

namespace {

constexpr double kRate = 100e9, kStream = 10e9, kPlain = 1e9, kNorm = 2e9, kCrossEntropy = 0.5e9,
                 kAttention = 40e9, kAttentionGrad = 30e9, kOverhead = 3e-6, kLaunch = 20e-6, kStep = 5e-6, kWire = 2e9;

std::string shape(std::vector<int64_t> dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i)
    out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}

std::string inst(const std::string &op, const std::vector<std::vector<int64_t>> &operands,
                 const std::vector<int64_t> &result, double seconds, int group = 1,
                 const std::string &attrs = "{}") {
  std::string ops;
  for (size_t i = 0; i < operands.size(); ++i)
    ops += (i ? ", " : "") + shape(operands[i]);
  return llvm::formatv(R"({{"op": "{0}", "operands": [{1}], "results": [{2}], "dtype": "f32", "attrs": {3}, )"
                       R"("group": {4}, "runs": 3, "seconds_median": {5:e}})",
                       op, ops, shape(result), attrs, group, seconds)
      .str();
}

double elements(const std::vector<int64_t> &dims) {
  double n = 1;
  for (int64_t d : dims)
    n *= d;
  return n;
}

// `averageSeconds`: the gradient averaging's time beyond its all-reduces;
// `wait`: what each collective waits for a later rank (0: the last to come);
// `slowBeyond`: two all-reduces more, of 16 and 32 MB, at half the
// bandwidth (a message past the cache).
// `unhidden`: the share of the smaller of a GEMM's FLOPs' and bytes' time
// added to the larger (0: the roofline; 1: their sum, a CPU BLAS packing
// its operands).
// `ranks` ranks on a node whose memory streams at `node` times one rank's
// rate (0: not shared): the memory-bound terms ranks / node times longer
// where that is more than 1.
// `keyOverhead`: attention's fixed cost a query, in keys (its FLOPs'
// time x (1 + keyOverhead / T), T the keys a query sees).
std::string runProfile(double optimizerSeconds, double parameters, double averageSeconds = 0, double wait = 0,
                       bool slowBeyond = false, double unhidden = 0, int ranks = 1, double node = 0,
                       double keyOverhead = 0) {
  double shared = node > 0 ? std::max(1.0, ranks / node) : 1;
  std::vector<std::string> list;
  // GEMMs y [m, n] = x [m, k] W [n, k]: the larger of FLOPs and bytes
  // (and a share of the smaller).
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1024, 512, 512},
                         {2048, 1024, 512},
                         {512, 2048, 256},
                         {1, 4096, 1024},
                         {2, 2048, 2048},
                         {4, 1024, 4096}}) {
    double flops = 2.0 * m * n * k, bytes = 4 * (m * k + n * k + m * n);
    double a = flops / kRate, b = bytes / kStream * shared;
    double seconds = std::max(a, b) + unhidden * std::min(a, b);
    list.push_back(inst("linear", {{m, k}, {n, k}}, {m, n}, seconds + kOverhead));
  }
  for (int64_t rows : {256, 1024, 4096}) {
    std::vector<int64_t> x = {rows, 512};
    list.push_back(inst("add", {x, x}, x, shared * 3 * 4 * elements(x) / kPlain + kOverhead));
    list.push_back(inst("rms_norm", {x, {512}}, x, shared * 4 * (2 * elements(x) + 512) / kNorm + kOverhead));
  }
  // The loss over [rows, V] logits: their bytes (and the labels') at its
  // rate; under a vocabulary split the logsumexp over a rank's columns is
  // that work, and the loss given it (a third operand) picks labels only:
  // not a sample (its time here would spoil the fit were it one).
  for (auto [rows, vocab] : {std::pair<int64_t, int64_t>{128, 4096}, {256, 8192}, {512, 2048}}) {
    double labels = 4.0 * rows;
    list.push_back(inst("cross_entropy", {{rows, vocab}, {rows}}, {},
                        shared * (4.0 * rows * vocab + labels + 4) / kCrossEntropy + kOverhead));
    list.push_back(inst("logsumexp", {{rows, vocab}}, {rows, 1},
                        shared * 4.0 * rows * (vocab + 1) / kCrossEntropy + kOverhead));
    list.push_back(inst("cross_entropy", {{rows, vocab}, {rows}, {rows, 1}}, {}, 1.0));
  }
  for (int64_t s : {64, 128, 256}) {
    // causal: s (s + 1) / 2 pairs of 2 heads of 64, 2 x 64 + 5 + 2 x 64
    // FLOPs a pair; a query sees (s + 1) / 2 keys on average
    double flops = 1 * 2 * (s * (s + 1) / 2.0) * (2 * 64 + 5 + 2 * 64);
    double longer = 1 + keyOverhead / ((s + 1) / 2.0);
    list.push_back(inst("attention", {{1, s, 2, 64}, {1, s, 2, 64}, {1, s, 2, 64}}, {1, s, 2, 64},
                        flops * longer / kAttention + kOverhead, 1, R"({"causal": true})"));
    // its gradient (q, k, v and the output's gradient in; dq, dk, dv
    // out): the scores again, then 2 x 64 + 5 + 4 x 64 FLOPs a pair
    double grad = flops + 1 * 2 * (s * (s + 1) / 2.0) * (2 * 64 + 5 + 4 * 64);
    list.push_back(inst("attention_grad", {{1, s, 2, 64}, {1, s, 2, 64}, {1, s, 2, 64}, {1, s, 2, 64}},
                        {1, s, 2, 64}, grad * longer / kAttentionGrad + kOverhead, 1, R"({"causal": true})"));
  }
  // All-gathers over 2 and 4 ranks ((n - 1)/n of the gathered bytes, n - 1
  // steps); all-reduces over 2 (2 (n - 1)/n, 2 (n - 1) steps).
  for (auto [n, in] : {std::pair<int64_t, int64_t>{2, 1 << 16}, {2, 1 << 20}, {4, 1 << 18}, {4, 1 << 20}}) {
    double bytes = 4.0 * in * n;
    list.push_back(inst("all_gather", {{in}}, {in * n},
                        wait + kLaunch + (n - 1) * kStep + (n - 1.0) / n * bytes / kWire, static_cast<int>(n)));
  }
  for (int64_t in : {1 << 16, 1 << 20}) {
    double bytes = 4.0 * in;
    list.push_back(inst("all_reduce", {{in}}, {in}, wait + kLaunch + 2 * kStep + bytes / kWire, 2));
  }
  if (slowBeyond) {
    for (int64_t in : {1 << 22, 1 << 23}) {
      double bytes = 4.0 * in;
      list.push_back(inst("all_reduce", {{in}}, {in}, wait + kLaunch + 2 * kStep + bytes / (0.5 * kWire), 2));
    }
    // (and messages too small to show a bandwidth: what pins the latency
    // while every size has a share of its own)
    for (int64_t n : {2, 4}) {
      list.push_back(inst("all_reduce", {{16}}, {16}, wait + kLaunch + 2 * (n - 1) * kStep + 2 * (n - 1.0) / n * 64 / kWire,
                          static_cast<int>(n)));
      list.push_back(inst("all_gather", {{16}}, {16 * n}, wait + kLaunch + (n - 1) * kStep + (n - 1.0) * 64 / kWire,
                          static_cast<int>(n)));
    }
  }
  std::string body;
  for (size_t i = 0; i < list.size(); ++i)
    body += (i ? ",\n" : "") + list[i];
  // A step's gradient averaging over 4 ranks: 9 all-reduces of 40 MB in
  // all, one a gradient tensor (a launch and 2 (n - 1) ring steps each).
  double reduced = 40e6, reduce = wait + 9 * kLaunch + 9 * 6 * kStep + 2 * 3.0 / 4 * reduced / kWire;
  return llvm::formatv(R"({{"format": "parax-run-profile-1", "device": "cpu", "ranks": {6}, "rank": 0, )"
                       R"("parameter_values": {0:e}, "optimizer": "adamw", "optimizer_seconds_median": {1:e}, )"
                       R"("gradient_average_seconds_median": {2:e}, )"
                       R"("gradient_all_reduces": [{{"group": 4, "bytes": {3:e}, "calls": 9, "seconds_median": {4:e}}], )"
                       R"("instructions": [{5}]})",
                       parameters, optimizerSeconds, reduce + averageSeconds, reduced, reduce, body, ranks)
      .str();
}

ClusterSpec base() { return llvm::cantFail(resolveCluster("dgx-a100-80gb")); }

TEST(CalibrationTest, TheFitGivesBackTheFiguresThatMadeTheTimes) {
  // An optimizer moving 48 bytes a parameter at the streaming rate, the
  // averaging's division 8 more.
  double parameters = 1e7;
  llvm::Expected<Calibration> fit = calibrate(
      base(), {runProfile(48 * parameters / kStream, parameters, 8 * parameters / kStream)}, {"p.json"});
  ASSERT_TRUE(static_cast<bool>(fit)) << llvm::toString(fit.takeError());
  const ClusterSpec &c = fit->cluster;
  const Profile &p = c.profile;
  auto near = [](double got, double want) { EXPECT_NEAR(got / want, 1.0, 1e-6) << got << " vs " << want; };
  near(c.peak("f32"), kRate);
  EXPECT_EQ(c.matmulEfficiency, 1);
  near(c.hbmBandwidth, kStream);
  near(p.addPasses, kStream / kPlain);
  near(p.normPasses, kStream / kNorm);
  near(p.crossEntropyPasses, kStream / kCrossEntropy);
  near(p.flashEfficiency, kAttention / kRate);
  near(p.flashBackwardRate, kAttentionGrad / kAttention);
  EXPECT_EQ(p.flashKeyOverhead, 0);
  near(p.kernelOverhead, kOverhead);
  near(p.optimizerBytes, 56);
  near(c.intraNode.bandwidth, kWire);
  near(c.collectiveLatency, kLaunch);
  near(c.intraNode.hopLatency, kStep);
  EXPECT_FALSE(p.ncclProtocols);
  EXPECT_EQ(p.gemmUnhidden, 0);
  // (parax-run's CPU path averages the gradients after the backward)
  EXPECT_FALSE(p.dpOverlap);
  // What is not the fit's is the base cluster's.
  EXPECT_EQ(c.devicesPerNode, 8);
  EXPECT_EQ(c.hbmBytes, base().hbmBytes);
  EXPECT_NE(fit->report.find("GEMMs: 100.00 GFLOP/s (f32), streaming 10.00 GB/s"), std::string::npos)
      << fit->report;
}

// GEMMs whose operand traffic adds to their arithmetic: the fit takes
// that form (gemm_unhidden 1) and gives the same figures back; the
// planner's gemmTime then adds the two terms.
TEST(CalibrationTest, GemmsThatPackTheirOperandsFitTheSumOfTheTerms) {
  double parameters = 1e7;
  llvm::Expected<Calibration> fit =
      calibrate(base(), {runProfile(48 * parameters / kStream, parameters, 0, 0, false, /*unhidden=*/1)},
                {"p.json"});
  ASSERT_TRUE(static_cast<bool>(fit)) << llvm::toString(fit.takeError());
  const ClusterSpec &c = fit->cluster;
  EXPECT_EQ(c.profile.gemmUnhidden, 1);
  EXPECT_NEAR(c.peak("f32") / kRate, 1.0, 1e-6);
  EXPECT_NEAR(c.hbmBandwidth / kStream, 1.0, 1e-6);
  EXPECT_NEAR(c.profile.kernelOverhead / kOverhead, 1.0, 1e-6);
  EXPECT_NE(fit->report.find("the larger time plus 1.00 of the smaller (gemm_unhidden)"), std::string::npos)
      << fit->report;
  // 1024 x 512 x 512: 0.537 GFLOP at 100 GFLOP/s, 5.24 MB at 10 GB/s.
  double flops = 2.0 * 1024 * 512 * 512, bytes = 4.0 * (1024 * 512 + 512 * 512 + 1024 * 512);
  EXPECT_NEAR(gemmTime(c, flops, bytes, c.peak("f32"), 1024, 512, 512) / (5.36870912e-3 + 5.24288e-4 + kOverhead),
              1.0, 1e-6);
}

// The fitted rate is what the runs' devices reached; the base cluster's
// share for a node whose devices all compute at once stays (runs of one
// GPU, planned for a node of eight), and says so in the written JSON.
TEST(CalibrationTest, TheBaseClustersBusyNodeShareStays) {
  double parameters = 1e7;
  ClusterSpec node = base();
  node.busyNodeMatmulShare = 0.9;
  llvm::Expected<Calibration> fit =
      calibrate(node, {runProfile(48 * parameters / kStream, parameters, 0, 0, false, /*unhidden=*/1)}, {"p.json"});
  ASSERT_TRUE(static_cast<bool>(fit)) << llvm::toString(fit.takeError());
  EXPECT_EQ(fit->cluster.busyNodeMatmulShare, 0.9);
  EXPECT_EQ(fit->cluster.sustainedMatmulEfficiency(), 0.9); // (the fitted peak is the rate: efficiency 1)
  EXPECT_NE(fit->cluster.toJson().find("\"busy_node_matmul_share\": 0.9"), std::string::npos);
}

// GEMMs that hide part of the smaller term (a core streaming a weight
// while it multiplies, until the arithmetic takes most of its time): the
// fit finds the share, 0.4, and the figures; gemmTime adds 0.4 of the
// smaller term to the larger.
TEST(CalibrationTest, TheShareOfAGemmsSmallerTimeLeftUnhiddenIsFitted) {
  double parameters = 1e7;
  llvm::Expected<Calibration> fit =
      calibrate(base(), {runProfile(48 * parameters / kStream, parameters, 0, 0, false, /*unhidden=*/0.4)},
                {"p.json"});
  ASSERT_TRUE(static_cast<bool>(fit)) << llvm::toString(fit.takeError());
  const ClusterSpec &c = fit->cluster;
  EXPECT_NEAR(c.profile.gemmUnhidden, 0.4, 1e-12);
  EXPECT_NEAR(c.peak("f32") / kRate, 1.0, 1e-6);
  EXPECT_NEAR(c.hbmBandwidth / kStream, 1.0, 1e-6);
  EXPECT_NE(fit->report.find("the larger time plus 0.40 of the smaller (gemm_unhidden)"), std::string::npos)
      << fit->report;
  // 4 x 1024 x 4096 (a decode step's GEMM): 33.6 MFLOP at 100 GFLOP/s =
  // 0.336 ms; 16.9 MB at 10 GB/s = 1.687 ms; 1.687 + 0.4 x 0.336 = 1.822.
  double flops = 2.0 * 4 * 1024 * 4096, bytes = 4.0 * (4 * 4096 + 1024 * 4096 + 4 * 1024);
  EXPECT_NEAR(gemmTime(c, flops, bytes, c.peak("f32"), 4, 1024, 4096) / (1.6859136e-3 + 0.4 * 3.3554432e-4 + kOverhead),
              1.0, 1e-6);
}

// Attention whose rate grows with the keys a query sees (a fixed cost a
// query of 96 keys: at 64 tokens, 32.5 keys on average, 3.95x its FLOPs'
// time): the fit finds the 96 and the rates (a fit without it gave the
// shared overhead 17x its value and the attention 0.71x its rate).
TEST(CalibrationTest, AttentionsFixedCostAQueryIsFitted) {
  double parameters = 1e7;
  llvm::Expected<Calibration> fit = calibrate(
      base(), {runProfile(48 * parameters / kStream, parameters, 0, 0, false, 0, 1, 0, /*keyOverhead=*/96)},
      {"p.json"});
  ASSERT_TRUE(static_cast<bool>(fit)) << llvm::toString(fit.takeError());
  const Profile &p = fit->cluster.profile;
  EXPECT_EQ(p.flashKeyOverhead, 96);
  EXPECT_NEAR(p.flashEfficiency / (kAttention / kRate), 1.0, 1e-6);
  EXPECT_NEAR(p.flashBackwardRate / (kAttentionGrad / kAttention), 1.0, 1e-6);
  EXPECT_NEAR(p.kernelOverhead / kOverhead, 1.0, 1e-6);
  EXPECT_NE(fit->report.find("attention: 40.00 GFLOP/s times T / (T + 96), T the keys a query sees"),
            std::string::npos)
      << fit->report;
}

// A run profile with its EP rank's experts: two layers' dispatched rows
// (the routing's last dimension 1: rows an expert rank holds), `seconds`
// each.
std::string withExperts(std::string profile, double seconds) {
  std::string experts;
  for (int layer = 0; layer < 2; ++layer)
    experts += ",\n" + inst("experts", {{64, 32}, {64, 1}, {64, 1}, {4, 48, 32}, {4, 48, 32}, {4, 32, 48}},
                            {64, 32}, seconds);
  size_t end = profile.rfind("]}");
  return profile.insert(end, experts);
}

// Under EP each rank's experts take its share of the routing: the busiest
// rank's time over the ranks' mean is the router's imbalance on the run's
// data. Two EP2 runs whose rank 1 takes 1.2x and 1.5x rank 0's, and one
// 1.3x: the median run's, 1.3 / 1.15. Runs without EP leave it balanced.
TEST(CalibrationTest, TheBusiestExpertRanksShareIsMeasured) {
  double parameters = 1e7, update = 48 * parameters / kStream;
  std::string plain = runProfile(update, parameters);
  std::vector<std::string> files, names;
  for (auto [run, ratio] : {std::pair<const char *, double>{"a.json", 1.2}, {"b.json", 1.5}, {"c.json", 1.3}}) {
    files.push_back(withExperts(plain, 1e-3));
    names.push_back(run);
    files.push_back(withExperts(plain, ratio * 1e-3));
    names.push_back(std::string(run) + ".rank1");
  }
  llvm::Expected<Calibration> fit = calibrate(base(), files, names);
  ASSERT_TRUE(static_cast<bool>(fit)) << llvm::toString(fit.takeError());
  EXPECT_NEAR(fit->cluster.profile.expertImbalance, 1.3 / 1.15, 1e-9);
  EXPECT_NE(fit->report.find("experts under EP: the busiest rank's time 1.130x the mean's (3 run(s), 1.091 to "
                             "1.200)"),
            std::string::npos)
      << fit->report;
  // (the dispatched rows are no sample of the experts' rate: the fit of
  // the rest is the figures')
  EXPECT_NEAR(fit->cluster.peakFlops["f32"] / kRate, 1.0, 1e-6);
  llvm::Expected<Calibration> balanced = calibrate(base(), {plain}, {"p.json"});
  ASSERT_TRUE(static_cast<bool>(balanced)) << llvm::toString(balanced.takeError());
  EXPECT_EQ(balanced->cluster.profile.expertImbalance, 1);
  EXPECT_NE(balanced->report.find("experts under EP: no run (balanced routing kept)"), std::string::npos);
}

// Two ranks on a node whose memory streams at 1.5 times one rank's rate
// (a run alone beside a run of two): their memory-bound terms 2 / 1.5
// times longer. The fit finds the node's rate, 15 GB/s (1.5 x 10), and
// one rank's alone; without the one-rank run nothing says what is shared.
TEST(CalibrationTest, TheMemoryANodesRanksShareIsFitted) {
  double parameters = 1e7;
  std::string alone = runProfile(48 * parameters / kStream, parameters);
  std::string pair = runProfile(48 * parameters / kStream, parameters, 0, 0, false, 0, /*ranks=*/2, /*node=*/1.5);
  llvm::Expected<Calibration> fit = calibrate(base(), {alone, pair}, {"one.json", "two.json"});
  ASSERT_TRUE(static_cast<bool>(fit)) << llvm::toString(fit.takeError());
  const ClusterSpec &c = fit->cluster;
  EXPECT_NEAR(c.hbmBandwidth / kStream, 1.0, 1e-6);
  EXPECT_NEAR(c.nodeMemoryBandwidth / (1.5 * kStream), 1.0, 1e-6);
  EXPECT_NEAR(c.peak("f32") / kRate, 1.0, 1e-6);
  EXPECT_NEAR(c.profile.normPasses, kStream / kNorm, 1e-6);
  EXPECT_NE(fit->report.find("memory: a node's ranks share 15.00 GB/s (1.50 x one rank's; 7.50 GB/s a rank when 2 "
                             "stream at once)"),
            std::string::npos)
      << fit->report;
  // A node whose two ranks each stream at one rank's rate: not shared.
  std::string unshared = runProfile(48 * parameters / kStream, parameters, 0, 0, false, 0, 2, 0);
  llvm::Expected<Calibration> free = calibrate(base(), {alone, unshared}, {"one.json", "two.json"});
  ASSERT_TRUE(static_cast<bool>(free)) << llvm::toString(free.takeError());
  EXPECT_EQ(free->cluster.nodeMemoryBandwidth, 0);
  EXPECT_NE(free->report.find("memory: 2 ranks on a node stream each at one rank's rate (not shared)"),
            std::string::npos)
      << free->report;
}

// Where a profile has each instruction's mean beside its median, the fit
// reads the means (they add up to the step; medians do not): the same
// figures come back with every median halved.
TEST(CalibrationTest, AnInstructionsMeanIsItsTimeWhereTheProfileHasIt) {
  double parameters = 1e7;
  std::string text = runProfile(48 * parameters / kStream, parameters, 8 * parameters / kStream);
  std::regex median(R"("runs": 3, "seconds_median": ([0-9.e+-]+)\})");
  std::string withMeans;
  auto end = std::sregex_iterator();
  size_t last = 0, replaced = 0;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), median); it != end; ++it, ++replaced) {
    double seconds = std::stod((*it)[1].str());
    withMeans += text.substr(last, it->position() - last) +
                 llvm::formatv(R"("runs": 3, "seconds_median": {0:e}, "seconds_mean": {1:e}})", seconds / 2, seconds)
                     .str();
    last = it->position() + it->length();
  }
  withMeans += text.substr(last);
  ASSERT_GT(replaced, 20u);
  llvm::Expected<Calibration> fit = calibrate(base(), {withMeans}, {"m.json"});
  ASSERT_TRUE(static_cast<bool>(fit)) << llvm::toString(fit.takeError());
  auto near = [](double got, double want) { EXPECT_NEAR(got / want, 1.0, 1e-6) << got << " vs " << want; };
  near(fit->cluster.peak("f32"), kRate);
  near(fit->cluster.hbmBandwidth, kStream);
  near(fit->cluster.profile.flashEfficiency, kAttention / kRate);
  near(fit->cluster.intraNode.bandwidth, kWire);
}

TEST(CalibrationTest, ACollectiveIsTheLastRanksTimeNotTheWaitOfTheOthers) {
  // Rank 1 of the same run reaches every collective 0.4 ms before rank 0
  // and waits for it: the fit takes each collective at rank 0's time.
  double parameters = 1e7, update = 48 * parameters / kStream;
  auto fitted = [&](const std::string &second) {
    return calibrate(base(), {runProfile(update, parameters), runProfile(update, parameters, 0, 4e-4)},
                     {"p.json", second});
  };
  llvm::Expected<Calibration> fit = fitted("p.json.rank1");
  ASSERT_TRUE(static_cast<bool>(fit)) << llvm::toString(fit.takeError());
  EXPECT_NEAR(fit->cluster.intraNode.bandwidth / kWire, 1.0, 1e-6);
  EXPECT_NEAR(fit->cluster.collectiveLatency / kLaunch, 1.0, 1e-6);
  // (the same files as two runs: both times are samples, and the fit is not the figures')
  llvm::Expected<Calibration> apart = fitted("q.json");
  ASSERT_TRUE(static_cast<bool>(apart)) << llvm::toString(apart.takeError());
  EXPECT_GT(std::abs(apart->cluster.collectiveLatency / kLaunch - 1), 0.5);
}

TEST(CalibrationTest, AKindsBandwidthByMessageSizeIsItsOwnCurve) {
  // All-reduces of 0.26, 4 and 4.4 MB (the gradients') at the link's rate,
  // of 16 and 32 MB at half of it: the all-reduce's curve is 1 to 4.4 MB
  // and 0.5 from 16 MB, the link's rate still kWire; the all-gathers
  // (0.5 to 16 MB, all at the link's rate) keep share 1 throughout. (The
  // latency, the line and the shares are fitted in turns: within 1 %.)
  llvm::Expected<Calibration> fit = calibrate(base(), {runProfile(1e-3, 1e7, 0, 0, true)}, {"s.json"});
  ASSERT_TRUE(static_cast<bool>(fit)) << llvm::toString(fit.takeError());
  const Profile &p = fit->cluster.profile;
  EXPECT_NEAR(fit->cluster.intraNode.bandwidth / kWire, 1.0, 1e-2) << fit->report;
  int reduce = static_cast<int>(CollectiveKind::AllReduce), gather = static_cast<int>(CollectiveKind::AllGather);
  EXPECT_NEAR(p.sizeShare(reduce, 4.0 * (1 << 20)), 1.0, 1e-2);
  EXPECT_NEAR(p.sizeShare(reduce, 16.0 * (1 << 20)), 0.5, 1e-2);
  EXPECT_NEAR(p.sizeShare(reduce, 64.0 * (1 << 20)), 0.5, 1e-2);
  for (double bytes : {0.5e6, 4e6, 16e6})
    EXPECT_NEAR(p.sizeShare(gather, bytes), 1.0, 1e-2);
  // The gradients' reduction in messages of their size (40 MB in 9).
  EXPECT_NEAR(p.reduceBucketBytes, 40e6 / 9, 1);
}

TEST(CalibrationTest, RunsOnTheCudaBackendOverlapTheGradientAveraging) {
  std::string text = runProfile(1e-3, 1e7);
  size_t at = text.find(R"("device": "cpu")");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 15, R"("device": "cuda")");
  llvm::Expected<Calibration> fit = calibrate(base(), {text}, {"g.json"});
  ASSERT_TRUE(static_cast<bool>(fit)) << llvm::toString(fit.takeError());
  EXPECT_TRUE(fit->cluster.profile.dpOverlap);
  EXPECT_NE(fit->report.find("gradient averaging: overlapped with the last backward"), std::string::npos);
}

TEST(CalibrationTest, AGradientAllReduceWithoutItsFiguresIsRefusedByIndex) {
  std::string text = runProfile(1e-3, 1e7);
  size_t at = text.find(R"("calls": 9)");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 10, R"("calls": 0)");
  llvm::Expected<Calibration> fit = calibrate(base(), {text}, {"r.json"});
  ASSERT_FALSE(static_cast<bool>(fit));
  EXPECT_NE(llvm::toString(fit.takeError()).find("r.json: gradient_all_reduces[0]: needs group in [1, 1e6], bytes "
                                                 "in [0, 1e15], calls in [1, 1e9]"),
            std::string::npos);
}

TEST(CalibrationTest, TooFewTimingsAreRefusedNamingWhatIsMissing) {
  std::string onlyCollectives = R"({"format": "parax-run-profile-1", "instructions": [)" +
                                inst("all_gather", {{16}}, {32}, 1e-5, 2) + "]}";
  llvm::Expected<Calibration> fit = calibrate(base(), {onlyCollectives}, {"c.json"});
  ASSERT_FALSE(static_cast<bool>(fit));
  EXPECT_NE(llvm::toString(fit.takeError()).find("0 GEMM and 0 memory-bound timings"), std::string::npos);
  llvm::Expected<Calibration> bad = calibrate(base(), {R"({"format": "parax-run-profile-1", "instructions": [{"op": "add"}]})"},
                                              {"d.json"});
  ASSERT_FALSE(static_cast<bool>(bad));
  EXPECT_NE(llvm::toString(bad.takeError()).find("d.json: instruction 0: needs op, seconds_median"),
            std::string::npos);
}

} // namespace
