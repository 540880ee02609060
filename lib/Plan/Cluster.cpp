//===- Cluster.cpp - cluster presets and their JSON form ------------------===//
//
// Every figure of the presets is cited in docs/cost-model.md.
//
//===----------------------------------------------------------------------===//

#include "parax/Plan/Cluster.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"

using namespace llvm;
using namespace parax::plan;

namespace {

// The presets, in the JSON format users write. Units: TFLOP/s, GB, GB/s
// (per device, one direction), microseconds. `hbm_gb` is the memory the
// driver reports (nvidia-smi's total, in 10^9 bytes), not the marketed
// size, which counts GiB as GB: A100 80GB 81,920 MiB = 85.89 GB, H100 80GB
// 81,559 MiB = 85.52 GB, H200 141GB 143,771 MiB = 150.75 GB (Modal,
// "Why does an NVIDIA H100 80GB card offer 85.52 GB?", and
// modal-labs/modal-client PR #2797). The H800 is taken as the H100's
// memory part; the B200 and GB200 figures are the marketed sizes (no
// reported total found), and so is Grand Teton's H100 96GB (96 GiB).
const std::pair<const char *, const char *> kPresets[] = {
    {"dgx-a100-80gb", R"json({
  "name": "dgx-a100-80gb", "multiprocessors": 108, "device": "A100 SXM4 80GB",
  "devices_per_node": 8, "nodes": 1,
  "peak_tflops": {"bf16": 312, "f16": 312, "f32": 156},
  "hbm_gb": 85.89, "hbm_bandwidth_gbps": 2039,
  "matmul_efficiency": 0.869, "memory_efficiency": 0.85,
  "intra_node": {"bandwidth_gbps": 300, "efficiency": 0.78, "hop_latency_us": 3.4},
  "inter_node": {"bandwidth_gbps": 25, "efficiency": 0.9, "hop_latency_us": 14},
  "collective_latency_us": 8.4})json"},
    {"dgx-h100", R"json({
  "name": "dgx-h100", "multiprocessors": 132, "device": "H100 SXM5 80GB",
  "devices_per_node": 8, "nodes": 1,
  "peak_tflops": {"bf16": 989, "f16": 989, "f32": 494.5, "fp8": 1979},
  "hbm_gb": 85.52, "hbm_bandwidth_gbps": 3350,
  "matmul_efficiency": 0.716, "fp8_matmul_efficiency": 0.651, "busy_node_matmul_share": 0.972,
  "memory_efficiency": 0.85,
  "intra_node": {"bandwidth_gbps": 450, "efficiency": 0.82, "hop_latency_us": 3.4},
  "inter_node": {"bandwidth_gbps": 50, "efficiency": 0.93, "hop_latency_us": 14},
  "collective_latency_us": 8.4})json"},
    {"dgx-h200", R"json({
  "name": "dgx-h200", "multiprocessors": 132, "device": "H200 SXM 141GB",
  "devices_per_node": 8, "nodes": 1,
  "peak_tflops": {"bf16": 989, "f16": 989, "f32": 494.5, "fp8": 1979},
  "hbm_gb": 150.75, "hbm_bandwidth_gbps": 4800,
  "matmul_efficiency": 0.716, "fp8_matmul_efficiency": 0.651, "busy_node_matmul_share": 0.972,
  "memory_efficiency": 0.85,
  "intra_node": {"bandwidth_gbps": 450, "efficiency": 0.82, "hop_latency_us": 3.4},
  "inter_node": {"bandwidth_gbps": 50, "efficiency": 0.93, "hop_latency_us": 14},
  "collective_latency_us": 8.4})json"},
    {"grand-teton-h100", R"json({
  "name": "grand-teton-h100", "multiprocessors": 132, "device": "H100 96GB HBM2e at 500 W",
  "devices_per_node": 8, "nodes": 1,
  "peak_tflops": {"bf16": 912, "f16": 912, "f32": 456, "fp8": 1824},
  "hbm_gb": 103.08, "hbm_bandwidth_gbps": 2400,
  "matmul_efficiency": 0.716, "fp8_matmul_efficiency": 0.651, "busy_node_matmul_share": 0.972,
  "memory_efficiency": 0.85,
  "intra_node": {"bandwidth_gbps": 450, "efficiency": 0.82, "hop_latency_us": 3.4},
  "inter_node": {"bandwidth_gbps": 50, "efficiency": 0.93, "hop_latency_us": 14},
  "collective_latency_us": 8.4})json"},
    {"hgx-h800", R"json({
  "name": "hgx-h800", "multiprocessors": 132, "device": "H800 SXM 80GB",
  "devices_per_node": 8, "nodes": 1,
  "peak_tflops": {"bf16": 989, "f16": 989, "f32": 494.5, "fp8": 1979},
  "hbm_gb": 85.52, "hbm_bandwidth_gbps": 3350,
  "matmul_efficiency": 0.716, "fp8_matmul_efficiency": 0.651, "busy_node_matmul_share": 0.972,
  "memory_efficiency": 0.85,
  "intra_node": {"bandwidth_gbps": 200, "efficiency": 0.8, "hop_latency_us": 3.4},
  "inter_node": {"bandwidth_gbps": 50, "efficiency": 0.93, "hop_latency_us": 14},
  "collective_latency_us": 8.4})json"},
    {"dgx-b200", R"json({
  "name": "dgx-b200", "multiprocessors": 148, "device": "B200 180GB",
  "devices_per_node": 8, "nodes": 1,
  "peak_tflops": {"bf16": 2250, "f16": 2250, "f32": 1125, "fp8": 4500},
  "hbm_gb": 180, "hbm_bandwidth_gbps": 8000,
  "matmul_efficiency": 0.647, "fp8_matmul_efficiency": 0.621, "busy_node_matmul_share": 0.929,
  "memory_efficiency": 0.85,
  "intra_node": {"bandwidth_gbps": 900, "efficiency": 0.94, "hop_latency_us": 3.4},
  "inter_node": {"bandwidth_gbps": 50, "efficiency": 0.74, "hop_latency_us": 14},
  "collective_latency_us": 8.4})json"},
    {"gb200-nvl72", R"json({
  "name": "gb200-nvl72", "multiprocessors": 148, "device": "GB200 (per GPU) 186GB",
  "devices_per_node": 72, "nodes": 1,
  "peak_tflops": {"bf16": 2500, "f16": 2500, "f32": 1250, "fp8": 5000},
  "hbm_gb": 186, "hbm_bandwidth_gbps": 8000,
  "matmul_efficiency": 0.647, "fp8_matmul_efficiency": 0.621, "busy_node_matmul_share": 0.929,
  "memory_efficiency": 0.85,
  "intra_node": {"bandwidth_gbps": 900, "efficiency": 0.9, "hop_latency_us": 3.4},
  "inter_node": {"bandwidth_gbps": 50, "efficiency": 0.9, "hop_latency_us": 14},
  "collective_latency_us": 8.4})json"},
};

Error fieldError(StringRef source, const Twine &field, const Twine &why) {
  return createStringError(inconvertibleErrorCode(),
                           "%s: field '%s' %s", source.str().c_str(),
                           field.str().c_str(), why.str().c_str());
}

// Reads a positive number `key` of `object` (named `path` in errors).
Expected<double> positive(const json::Object &object, StringRef key,
                          StringRef path, StringRef source) {
  std::string field = path.empty() ? key.str() : (path + "." + key).str();
  const json::Value *value = object.get(key);
  if (!value)
    return fieldError(source, field, "is missing");
  std::optional<double> number = value->getAsNumber();
  if (!number)
    return fieldError(source, field, "must be a number");
  if (!(*number > 0) || !std::isfinite(*number))
    return fieldError(source, field,
                      "must be positive, got " + std::to_string(*number));
  return *number;
}

Error checkKeys(const json::Object &object, ArrayRef<StringRef> known,
                StringRef path, StringRef source) {
  for (const auto &entry : object) {
    StringRef key = entry.first;
    if (!is_contained(known, key))
      return fieldError(source, path.empty() ? key.str() : (path + "." + key).str(),
                        "is not a cluster field (known: " + join(known, ", ") + ")");
  }
  return Error::success();
}

Expected<LinkSpec> parseLink(const json::Object &root, StringRef key,
                             StringRef source) {
  const json::Object *object = root.getObject(key);
  if (!object)
    return fieldError(source, key, "is missing or not an object");
  if (Error e = checkKeys(*object, {"bandwidth_gbps", "efficiency", "hop_latency_us"},
                          key, source))
    return std::move(e);
  LinkSpec link;
  auto bw = positive(*object, "bandwidth_gbps", key, source);
  auto eff = positive(*object, "efficiency", key, source);
  auto hop = positive(*object, "hop_latency_us", key, source);
  if (!bw) return bw.takeError();
  if (!eff) return eff.takeError();
  if (!hop) return hop.takeError();
  if (*eff > 1.2)
    return fieldError(source, key + ".efficiency", "must be at most 1.2");
  link.bandwidth = *bw * 1e9;
  link.efficiency = *eff;
  link.hopLatency = *hop * 1e-6;
  return link;
}

// The most devices a cluster may have (2^24: far past any machine, and
// every count and product of counts the search forms stays exact).
constexpr int64_t kMaxDevices = int64_t(1) << 24;

Error checkSize(const ClusterSpec &spec, StringRef source) {
  if (spec.devicesPerNode > kMaxDevices || spec.nodes > kMaxDevices ||
      spec.devicesPerNode * spec.nodes > kMaxDevices)
    return createStringError(inconvertibleErrorCode(),
                             "%s: %lld nodes of %lld devices are more than parax plans for (%lld devices at most)",
                             source.str().c_str(), static_cast<long long>(spec.nodes),
                             static_cast<long long>(spec.devicesPerNode), static_cast<long long>(kMaxDevices));
  return Error::success();
}

} // namespace

double ClusterSpec::peak(StringRef dtype) const {
  auto it = peakFlops.find(dtype.str());
  return it == peakFlops.end() ? 0 : it->second;
}

double ClusterSpec::gemmPeak(StringRef dtype) const {
  if (dtype == "fp8" && fp8MatmulEfficiency > 0)
    return peak(dtype) * fp8MatmulEfficiency / matmulEfficiency;
  return peak(dtype);
}

double ClusterSpec::sustainedMatmulEfficiency() const {
  return matmulEfficiency * (devicesPerNode > 1 ? busyNodeMatmulShare : 1.0);
}

double ClusterSpec::memoryBandwidth() const {
  if (nodeMemoryBandwidth > 0 && devicesPerNode > 0)
    return std::min(hbmBandwidth, nodeMemoryBandwidth / devicesPerNode);
  return hbmBandwidth;
}

std::string ClusterSpec::toJson() const {
  json::Object peaks;
  for (const auto &[dtype, flops] : peakFlops)
    peaks[dtype] = flops / 1e12;
  auto link = [](const LinkSpec &l) {
    return json::Object{{"bandwidth_gbps", l.bandwidth / 1e9},
                        {"efficiency", l.efficiency},
                        {"hop_latency_us", l.hopLatency * 1e6}};
  };
  json::Object root{
      {"name", name},
      {"device", device},
      {"devices_per_node", devicesPerNode},
      {"nodes", nodes},
      {"peak_tflops", std::move(peaks)},
      {"hbm_gb", hbmBytes / 1e9},
      {"hbm_bandwidth_gbps", hbmBandwidth / 1e9},
      {"matmul_efficiency", matmulEfficiency},
      {"memory_efficiency", memoryEfficiency},
      {"intra_node", link(intraNode)},
      {"inter_node", link(interNode)},
      {"collective_latency_us", collectiveLatency * 1e6}};
  if (multiprocessors > 0)
    root["multiprocessors"] = multiprocessors;
  if (fp8MatmulEfficiency > 0)
    root["fp8_matmul_efficiency"] = fp8MatmulEfficiency;
  if (busyNodeMatmulShare != 1)
    root["busy_node_matmul_share"] = busyNodeMatmulShare;
  if (nodeMemoryBandwidth > 0)
    root["node_memory_bandwidth_gbps"] = nodeMemoryBandwidth / 1e9;
  return formatv("{0:2}", json::Value(std::move(root))).str();
}

Expected<ClusterSpec> parax::plan::parseCluster(StringRef text,
                                                StringRef source) {
  Expected<json::Value> parsed = json::parse(text);
  if (!parsed)
    return createStringError(inconvertibleErrorCode(), "%s: invalid JSON: %s",
                             source.str().c_str(),
                             toString(parsed.takeError()).c_str());
  const json::Object *root = parsed->getAsObject();
  if (!root)
    return createStringError(inconvertibleErrorCode(),
                             "%s: a cluster must be a JSON object",
                             source.str().c_str());
  if (Error e = checkKeys(*root,
                          {"name", "device", "devices_per_node", "nodes",
                           "peak_tflops", "hbm_gb", "hbm_bandwidth_gbps",
                           "matmul_efficiency", "fp8_matmul_efficiency", "busy_node_matmul_share",
                           "memory_efficiency", "intra_node", "inter_node", "collective_latency_us",
                           "multiprocessors", "node_memory_bandwidth_gbps"},
                          "", source))
    return std::move(e);

  ClusterSpec spec;
  spec.name = root->getString("name").value_or("custom").str();
  spec.device = root->getString("device").value_or("").str();
  for (StringRef key : {"devices_per_node", "nodes"}) {
    std::optional<int64_t> value = root->getInteger(key);
    if (!value || *value <= 0)
      return fieldError(source, key, "must be a positive integer");
    (key == "nodes" ? spec.nodes : spec.devicesPerNode) = *value;
  }
  const json::Object *peaks = root->getObject("peak_tflops");
  if (!peaks || peaks->empty())
    return fieldError(source, "peak_tflops",
                      "must map dtypes to TFLOP/s, e.g. {\"bf16\": 989}");
  for (const auto &entry : *peaks) {
    auto tflops = positive(*peaks, entry.first, "peak_tflops", source);
    if (!tflops)
      return tflops.takeError();
    spec.peakFlops[entry.first.str()] = *tflops * 1e12;
  }
  if (root->get("multiprocessors")) {
    std::optional<int64_t> sms = root->getInteger("multiprocessors");
    if (!sms || *sms <= 0)
      return fieldError(source, "multiprocessors", "must be a positive integer");
    spec.multiprocessors = *sms;
  }
  auto hbm = positive(*root, "hbm_gb", "", source);
  auto hbmBw = positive(*root, "hbm_bandwidth_gbps", "", source);
  auto mm = positive(*root, "matmul_efficiency", "", source);
  auto mem = positive(*root, "memory_efficiency", "", source);
  auto lat = positive(*root, "collective_latency_us", "", source);
  for (Expected<double> *value : {&hbm, &hbmBw, &mm, &mem, &lat})
    if (!*value)
      return value->takeError();
  if (*mm > 1 || *mem > 1)
    return fieldError(source, *mm > 1 ? "matmul_efficiency" : "memory_efficiency",
                      "must be at most 1");
  spec.hbmBytes = *hbm * 1e9;
  spec.hbmBandwidth = *hbmBw * 1e9;
  spec.matmulEfficiency = *mm;
  spec.memoryEfficiency = *mem;
  // Optional shares: in (0, 1] where given.
  for (auto [key, field] : {std::pair<StringRef, double *>{"fp8_matmul_efficiency", &spec.fp8MatmulEfficiency},
                            {"busy_node_matmul_share", &spec.busyNodeMatmulShare}}) {
    if (!root->get(key))
      continue;
    auto share = positive(*root, key, "", source);
    if (!share)
      return share.takeError();
    if (*share > 1)
      return fieldError(source, key, "must be at most 1");
    *field = *share;
  }
  if (root->get("node_memory_bandwidth_gbps")) {
    auto node = positive(*root, "node_memory_bandwidth_gbps", "", source);
    if (!node)
      return node.takeError();
    spec.nodeMemoryBandwidth = *node * 1e9;
  }
  spec.collectiveLatency = *lat * 1e-6;
  auto intra = parseLink(*root, "intra_node", source);
  if (!intra)
    return intra.takeError();
  auto inter = parseLink(*root, "inter_node", source);
  if (!inter)
    return inter.takeError();
  spec.intraNode = *intra;
  spec.interNode = *inter;
  if (Error e = checkSize(spec, source))
    return std::move(e);
  return spec;
}

std::vector<std::string> parax::plan::clusterPresetNames() {
  std::vector<std::string> names;
  for (const auto &preset : kPresets)
    names.push_back(preset.first);
  llvm::sort(names);
  return names;
}

Expected<ClusterSpec> parax::plan::resolveCluster(StringRef spec) {
  auto [base, overrides] = spec.split(':');
  auto load = [&]() -> Expected<ClusterSpec> {
    for (const auto &preset : kPresets)
      if (base == preset.first)
        return parseCluster(preset.second, preset.first);
    ErrorOr<std::unique_ptr<MemoryBuffer>> file = MemoryBuffer::getFile(base);
    if (!file)
      return createStringError(
          inconvertibleErrorCode(),
          "cluster '%s' is neither a preset (%s) nor a readable JSON file",
          base.str().c_str(), join(clusterPresetNames(), ", ").c_str());
    return parseCluster((*file)->getBuffer(), base);
  };
  Expected<ClusterSpec> cluster = load();
  if (!cluster)
    return cluster.takeError();
  SmallVector<StringRef> items;
  overrides.split(items, ',', -1, /*KeepEmpty=*/false);
  for (StringRef item : items) {
    auto [key, value] = item.split('=');
    int64_t number = 0;
    if (value.getAsInteger(10, number) || number <= 0)
      return createStringError(inconvertibleErrorCode(),
                               "cluster '%s': '%s' needs a positive integer",
                               spec.str().c_str(), item.str().c_str());
    if (key == "nodes")
      cluster->nodes = number;
    else if (key == "devices_per_node")
      cluster->devicesPerNode = number;
    else
      return createStringError(inconvertibleErrorCode(),
                               "cluster '%s': unknown option '%s' (known: "
                               "nodes, devices_per_node)",
                               spec.str().c_str(), key.str().c_str());
  }
  if (Error e = checkSize(*cluster, ("cluster '" + spec + "'").str()))
    return std::move(e);
  return cluster;
}
