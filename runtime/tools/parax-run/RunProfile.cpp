// RunProfile.cpp - parax-run --profile's file (RunProfile.h).

#include "RunProfile.h"

#include <algorithm>
#include <numeric>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace parax::runtime {

std::string jsonNumber(double x) {
  if (!std::isfinite(x)) return "null";
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", x);
  return text;
}

namespace {

std::string quoted(const std::string &text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out + "\"";
}

template <typename Range> std::string list(const Range &values) {
  std::string out = "[";
  bool first = true;
  for (const auto &v : values) {
    out += (first ? "" : ", ") + std::to_string(v);
    first = false;
  }
  return out + "]";
}

std::string attrJson(const pxe::Attr &a) {
  switch (a.value_case()) {
  case pxe::Attr::kI: return std::to_string(a.i());
  case pxe::Attr::kF: return jsonNumber(a.f());
  case pxe::Attr::kS: return quoted(a.s());
  case pxe::Attr::kB: return a.b() ? "true" : "false";
  case pxe::Attr::kInts: return list(a.ints().values());
  case pxe::Attr::kStrings: {
    std::string out = "[";
    for (int k = 0; k < a.strings().values_size(); ++k) out += (k ? ", " : "") + quoted(a.strings().values(k));
    return out + "]";
  }
  default: return "null";
  }
}

const char *dtypeName(pxe::DType t) {
  switch (t) {
  case pxe::F32: return "f32";
  case pxe::BF16: return "bf16";
  case pxe::F16: return "f16";
  case pxe::I32: return "i32";
  case pxe::I64: return "i64";
  default: return "?";
  }
}

} // namespace

Status writeRunProfile(const std::string &path, const pxe::Executable &exe, const Executor &executor,
                       const std::vector<std::vector<double>> &seconds, int rank, int ranks,
                       const std::string &device, const RunProfileTotals &totals) {
  const pxe::Stage &stage = executor.stageProgram();
  std::ostringstream os;
  os << "{\n  \"format\": \"parax-run-profile-1\",\n  \"device\": " << quoted(device) << ",\n  \"ranks\": " << ranks
     << ",\n  \"rank\": " << rank << ",\n  \"stage\": " << executor.stage()
     << ",\n  \"coordinates\": " << list(executor.coordinates()) << ",\n  \"grid\": {\"axes\": [";
  for (int k = 0; k < exe.grid().axis_names_size(); ++k) os << (k ? ", " : "") << quoted(exe.grid().axis_names(k));
  double parameters = 0; // the values of the stage's parameter buffers on this rank
  for (const pxe::Buffer &buffer : stage.buffers())
    if (buffer.role() == pxe::PARAMETER) {
      double n = 1;
      for (int64_t d : buffer.shape()) n *= d;
      parameters += n;
    }
  os << "], \"shape\": " << list(exe.grid().shape()) << "},\n  \"steps\": " << totals.steps
     << ",\n  \"step_seconds_median\": " << jsonNumber(totals.step) << ",\n  \"parameter_values\": "
     << jsonNumber(parameters) << ",\n  \"optimizer\": " << quoted(totals.optimizer)
     << ",\n  \"gradient_average_seconds_median\": " << jsonNumber(totals.gradientAverage)
     << ",\n  \"optimizer_seconds_median\": " << jsonNumber(totals.optimizerUpdate) << ",\n  \"gradient_all_reduces\": [";
  for (size_t k = 0; k < totals.gradientReduces.size(); ++k) {
    const RunProfileTotals::Reduce &r = totals.gradientReduces[k];
    os << (k ? ", " : "") << "{\"group\": " << r.ranks << ", \"bytes\": " << jsonNumber(r.bytes)
       << ", \"calls\": " << r.calls << ", \"seconds_median\": " << jsonNumber(r.seconds) << "}";
  }
  os << "],\n  \"instructions\": [";
  auto shapeOf = [&](int32_t id) { return list(stage.buffers(id).shape()); };
  bool first = true;
  for (int k = 0; k < stage.instructions_size(); ++k) {
    if (static_cast<size_t>(k) >= seconds.size() || seconds[k].empty()) continue; // hoisted, or never run
    // The mean leaves out the first run, a warm-up (oneDNN builds its
    // kernel for a shape at first use, the first writes fault memory in):
    // one run of a 2 x 128 prefill's first linear took 26 ms, the next 0.44.
    const std::vector<double> &runs = seconds[k];
    double mean = runs.size() > 1 ? std::accumulate(runs.begin() + 1, runs.end(), 0.0) / (runs.size() - 1) : runs[0];
    std::vector<double> times = runs;
    std::sort(times.begin(), times.end());
    const pxe::Instruction &inst = stage.instructions(k);
    os << (first ? "\n" : ",\n") << "    {\"index\": " << k << ", \"op\": " << quoted(opName(inst)) << ", \"operands\": [";
    first = false;
    for (int j = 0; j < inst.operands_size(); ++j) os << (j ? ", " : "") << shapeOf(inst.operands(j));
    os << "], \"results\": [";
    for (int j = 0; j < inst.results_size(); ++j) os << (j ? ", " : "") << shapeOf(inst.results(j));
    int32_t typed = inst.results_size() > 0 ? inst.results(0) : inst.operands_size() > 0 ? inst.operands(0) : -1;
    os << "], \"dtype\": " << quoted(typed >= 0 ? dtypeName(stage.buffers(typed).dtype()) : "?") << ", \"attrs\": {";
    // The attributes, in name order (a map's order is not stable).
    std::vector<std::string> names;
    for (const auto &entry : inst.attrs()) names.push_back(entry.first);
    std::sort(names.begin(), names.end());
    for (size_t j = 0; j < names.size(); ++j)
      os << (j ? ", " : "") << quoted(names[j]) << ": " << attrJson(inst.attrs().at(names[j]));
    // The ranks a collective spans: the product of its axes' sizes.
    int64_t group = 1;
    auto axes = inst.attrs().find("axes");
    if (axes != inst.attrs().end() && axes->second.value_case() == pxe::Attr::kStrings)
      for (const std::string &axis : axes->second.strings().values())
        for (int a = 0; a < exe.grid().axis_names_size(); ++a)
          if (exe.grid().axis_names(a) == axis) group *= exe.grid().shape(a);
    os << "}, \"group\": " << group << ", \"runs\": " << times.size()
       << ", \"seconds_median\": " << jsonNumber(times[times.size() / 2])
       << ", \"seconds_mean\": " << jsonNumber(mean) << "}";
  }
  os << "\n  ]\n}\n";
  std::ofstream file(path);
  if (!file) return Status::error("--profile: cannot write '" + path + "'");
  file << os.str();
  file.close();
  if (!file) return Status::error("--profile: writing '" + path + "' failed");
  return Status::ok();
}

} // namespace parax::runtime
