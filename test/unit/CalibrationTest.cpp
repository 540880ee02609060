//===- CalibrationTest.cpp - the fit recovers the figures that made the times -===//
//
// Run profiles written here from known figures (a GEMM rate and the
// bandwidth GEMMs stream at, the plain and the norms' memory rates, the
// attention's rate, a kernel's overhead, a collective's launch, ring step
// and bandwidth), each instruction's time computed by the planner's own
// forms; calibrate() must give those figures back.
//
//===----------------------------------------------------------------------===//

#include "parax/Plan/Calibration.h"

#include "llvm/Support/FormatVariadic.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

using namespace parax::plan;

namespace {

constexpr double kRate = 100e9, kStream = 10e9, kPlain = 1e9, kNorm = 2e9, kAttention = 40e9,
                 kOverhead = 3e-6, kLaunch = 20e-6, kStep = 5e-6, kWire = 2e9;

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

std::string runProfile(double optimizerSeconds, double parameters) {
  std::vector<std::string> list;
  // GEMMs y [m, n] = x [m, k] W [n, k]: the larger of FLOPs and bytes.
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1024, 512, 512},
                         {2048, 1024, 512},
                         {512, 2048, 256},
                         {1, 4096, 1024},
                         {2, 2048, 2048},
                         {4, 1024, 4096}}) {
    double flops = 2.0 * m * n * k, bytes = 4 * (m * k + n * k + m * n);
    list.push_back(inst("linear", {{m, k}, {n, k}}, {m, n}, std::max(flops / kRate, bytes / kStream) + kOverhead));
  }
  for (int64_t rows : {256, 1024, 4096}) {
    std::vector<int64_t> x = {rows, 512};
    list.push_back(inst("add", {x, x}, x, 3 * 4 * elements(x) / kPlain + kOverhead));
    list.push_back(inst("rms_norm", {x, {512}}, x, 4 * (2 * elements(x) + 512) / kNorm + kOverhead));
  }
  for (int64_t s : {64, 128, 256}) {
    // causal: s (s + 1) / 2 pairs of 2 heads of 64, 2 x 64 + 5 + 2 x 64 FLOPs a pair
    double flops = 1 * 2 * (s * (s + 1) / 2.0) * (2 * 64 + 5 + 2 * 64);
    list.push_back(inst("attention", {{1, s, 2, 64}, {1, s, 2, 64}, {1, s, 2, 64}}, {1, s, 2, 64},
                        flops / kAttention + kOverhead, 1, R"({"causal": true})"));
  }
  // All-gathers over 2 and 4 ranks ((n - 1)/n of the gathered bytes, n - 1
  // steps); all-reduces over 2 (2 (n - 1)/n, 2 (n - 1) steps).
  for (auto [n, in] : {std::pair<int64_t, int64_t>{2, 1 << 16}, {2, 1 << 20}, {4, 1 << 18}, {4, 1 << 20}}) {
    double bytes = 4.0 * in * n;
    list.push_back(inst("all_gather", {{in}}, {in * n}, kLaunch + (n - 1) * kStep + (n - 1.0) / n * bytes / kWire,
                        static_cast<int>(n)));
  }
  for (int64_t in : {1 << 16, 1 << 20}) {
    double bytes = 4.0 * in;
    list.push_back(inst("all_reduce", {{in}}, {in}, kLaunch + 2 * kStep + bytes / kWire, 2));
  }
  std::string body;
  for (size_t i = 0; i < list.size(); ++i)
    body += (i ? ",\n" : "") + list[i];
  return llvm::formatv(R"({{"format": "parax-run-profile-1", "device": "cpu", "ranks": 1, "rank": 0, )"
                       R"("parameter_values": {0:e}, "optimizer": "adamw", "optimizer_seconds_median": {1:e}, )"
                       R"("instructions": [{2}]})",
                       parameters, optimizerSeconds, body)
      .str();
}

ClusterSpec base() { return llvm::cantFail(resolveCluster("dgx-a100-80gb")); }

TEST(CalibrationTest, TheFitGivesBackTheFiguresThatMadeTheTimes) {
  // An optimizer moving 48 bytes a parameter at the streaming rate.
  double parameters = 1e7;
  llvm::Expected<Calibration> fit = calibrate(base(), {runProfile(48 * parameters / kStream, parameters)}, {"p.json"});
  ASSERT_TRUE(static_cast<bool>(fit)) << llvm::toString(fit.takeError());
  const ClusterSpec &c = fit->cluster;
  const Profile &p = c.profile;
  auto near = [](double got, double want) { EXPECT_NEAR(got / want, 1.0, 1e-6) << got << " vs " << want; };
  near(c.peak("f32"), kRate);
  EXPECT_EQ(c.matmulEfficiency, 1);
  near(c.hbmBandwidth, kStream);
  near(p.addPasses, kStream / kPlain);
  near(p.normPasses, kStream / kNorm);
  near(p.flashEfficiency, kAttention / kRate);
  near(p.kernelOverhead, kOverhead);
  near(p.optimizerBytes, 48);
  near(c.intraNode.bandwidth, kWire);
  near(c.collectiveLatency, kLaunch);
  near(c.intraNode.hopLatency, kStep);
  EXPECT_FALSE(p.ncclProtocols);
  // What is not the fit's is the base cluster's.
  EXPECT_EQ(c.devicesPerNode, 8);
  EXPECT_EQ(c.hbmBytes, base().hbmBytes);
  EXPECT_NE(fit->report.find("GEMMs: 100.00 GFLOP/s (f32), streaming 10.00 GB/s"), std::string::npos)
      << fit->report;
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
