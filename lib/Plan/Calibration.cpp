//===- Calibration.cpp - a cluster and profile fitted to measured runs ----===//

#include "parax/Plan/Calibration.h"
#include "parax/Plan/CostModel.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>
#include <vector>

using namespace llvm;
using namespace parax::plan;

namespace {

// The memory-bound classes have a rate each (a profile's
// elementwise_passes relative to the plain ones'): Memory is the plain.
enum class Kind {
  Gemm, Memory, Norm, Rope, Swiglu, Unary, CrossEntropy, Attention, Experts, AttentionGrad, Collective, Skip
};
// Columns of the compute fit: a kind's work (in Kind's order, to
// AttentionGrad), a GEMM's bytes, the overhead.
constexpr int kGemmBytes = 10, kOverhead = 11, kColumns = 12;

// What the planner prices as a GEMM, as HBM traffic, as attention or as a
// collective; the rest (views, sends and receives whose time is the
// pipeline's waiting, integer bookkeeping) is not fitted.
Kind kindOf(StringRef op) {
  return StringSwitch<Kind>(op)
      .Cases({"linear", "head_linear", "linear_weight_grad"}, Kind::Gemm)
      .Case("attention", Kind::Attention)
      .Case("attention_grad", Kind::AttentionGrad)
      .Case("experts", Kind::Experts)
      .Cases({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "moe_dispatch", "moe_combine"},
             Kind::Collective)
      .Cases({"add", "mul", "transpose", "concat"}, Kind::Memory)
      .Cases({"rms_norm", "layer_norm"}, Kind::Norm)
      .Case("rope", Kind::Rope)
      .Case("swiglu", Kind::Swiglu)
      .Cases({"silu", "sigmoid", "gelu"}, Kind::Unary)
      // (under a vocabulary split the logsumexp over a rank's columns is the
      // loss's work; its cross_entropy only picks the labels)
      .Cases({"cross_entropy", "logsumexp"}, Kind::CrossEntropy)
      .Default(Kind::Skip);
}

// The kinds priced by their bytes alone.
bool memoryBound(Kind kind) {
  return kind == Kind::Memory || kind == Kind::Norm || kind == Kind::Rope || kind == Kind::Swiglu ||
         kind == Kind::Unary || kind == Kind::CrossEntropy;
}

struct Sample {
  Kind kind;
  double x = 0;       // FLOPs (GEMM, attention) or bytes (memory)
  double keys = 0;    // attention: the keys a query sees, on average
  double bytes = 0;   // GEMM: the bytes it reads and writes
  double passes = 0;  // experts: their memory-bound kernels' bytes (at the plain ops' rate)
  double sharers = 1; // the run's ranks on one node (a memory they may share)
  double calls = 1;   // collectives: launches (a step's gradient all-reduces: one a tensor)
  double steps = 0;   // collectives: ring steps
  double wire = 0;    // collectives: bus-bandwidth factor x bytes
  double message = 0; // collectives: a call's buffer (collectiveTime's bytes)
  bool gradient = false; // a step's gradient all-reduces (one a tensor of that size)
  CollectiveKind collective = CollectiveKind::AllReduce;
  double seconds = 0;
  int run = -1; // the run it came from (its ranks' files one run)
};

// A run's name: its rank-0 file's (P.json for P.json.rank<r>).
StringRef runOf(StringRef file) {
  size_t at = file.rfind(".rank");
  if (at != StringRef::npos && at + 5 < file.size() &&
      llvm::all_of(file.drop_front(at + 5), [](char c) { return c >= '0' && c <= '9'; }))
    return file.take_front(at);
  return file;
}

double numel(const json::Array &shape) {
  double n = 1;
  for (const json::Value &d : shape)
    n *= d.getAsNumber().value_or(0);
  return n;
}

double last(const json::Array &shape) {
  return shape.empty() ? 1 : shape.back().getAsNumber().value_or(1);
}

// Solves the weighted least squares min sum w_i (a_i . theta - t_i)^2 over
// the columns in `use` (the others 0), by the normal equations. Returns
// false when they are singular.
bool leastSquares(const std::vector<std::vector<double>> &rows, const std::vector<double> &t,
                  const std::vector<double> &w, const std::vector<bool> &use,
                  std::vector<double> &theta) {
  size_t p = use.size();
  std::vector<size_t> cols;
  for (size_t j = 0; j < p; ++j)
    if (use[j])
      cols.push_back(j);
  size_t q = cols.size();
  std::vector<std::vector<double>> m(q, std::vector<double>(q + 1, 0));
  for (size_t i = 0; i < rows.size(); ++i)
    for (size_t a = 0; a < q; ++a) {
      for (size_t b = 0; b < q; ++b)
        m[a][b] += w[i] * rows[i][cols[a]] * rows[i][cols[b]];
      m[a][q] += w[i] * rows[i][cols[a]] * t[i];
    }
  // Scale each column to unit diagonal (the columns differ by 1e12).
  std::vector<double> scale(q, 1);
  for (size_t a = 0; a < q; ++a)
    scale[a] = m[a][a] > 0 ? 1 / std::sqrt(m[a][a]) : 1;
  for (size_t a = 0; a < q; ++a) {
    for (size_t b = 0; b < q; ++b)
      m[a][b] *= scale[a] * scale[b];
    m[a][q] *= scale[a];
  }
  for (size_t a = 0; a < q; ++a) { // Gaussian elimination, partial pivoting
    size_t pivot = a;
    for (size_t r = a + 1; r < q; ++r)
      if (std::abs(m[r][a]) > std::abs(m[pivot][a]))
        pivot = r;
    if (std::abs(m[pivot][a]) < 1e-9)
      return false;
    std::swap(m[a], m[pivot]);
    for (size_t r = 0; r < q; ++r)
      if (r != a) {
        double f = m[r][a] / m[a][a];
        for (size_t c = a; c <= q; ++c)
          m[r][c] -= f * m[a][c];
      }
  }
  theta.assign(p, 0);
  for (size_t a = 0; a < q; ++a)
    theta[cols[a]] = m[a][q] / m[a][a] * scale[a];
  return true;
}

// The fit with every coefficient >= 0: a negative one is dropped (its
// column fixed at 0) and the rest fitted again.
// `relative`: each sample's error relative to its time (else absolute: the
// long ones weigh most, as in a step's sum).
Expected<std::vector<double>> nonNegative(const std::vector<std::vector<double>> &rows,
                                          const std::vector<double> &t, std::vector<bool> use,
                                          StringRef what, bool relative = true) {
  std::vector<double> theta, weights;
  for (double s : t)
    weights.push_back(relative ? 1 / (s * s) : 1);
  for (size_t round = 0; round <= use.size(); ++round) {
    if (!leastSquares(rows, t, weights, use, theta)) {
      // A column the samples cannot tell apart from another (collective
      // steps when every group has one size): drop the last one in use
      // but the first.
      bool dropped = false;
      for (size_t j = use.size(); j-- > 1;)
        if (use[j]) {
          use[j] = false;
          dropped = true;
          break;
        }
      if (!dropped)
        return createStringError(inconvertibleErrorCode(), "--calibrate: the %s samples do not determine a fit",
                                 what.str().c_str());
      continue;
    }
    size_t worst = use.size();
    for (size_t j = 0; j < use.size(); ++j)
      if (use[j] && theta[j] < 0 && (worst == use.size() || theta[j] < theta[worst]))
        worst = j;
    if (worst == use.size())
      return theta;
    use[worst] = false;
  }
  return theta;
}

} // namespace

Expected<Calibration> parax::plan::calibrate(const ClusterSpec &base, ArrayRef<std::string> files,
                                             ArrayRef<std::string> names) {
  std::vector<Sample> samples;
  std::string dtype;
  // Each run's measured optimizer update and the parameter values it held.
  std::vector<std::pair<double, double>> updates;
  bool cpuRuns = false; // a run on parax-run's CPU path (its averaging follows the backward)
  // A collective ends when its last rank arrives: the others' times hold
  // their wait for it. Each collective of a run (its ranks' files: P.json,
  // P.json.rank<r>) is taken at its least time over the ranks running the
  // same stage program -- the last arrival's.
  std::map<std::tuple<std::string, int64_t, int64_t>, Sample> collectives;
  std::map<std::string, int> runs; // a run's name -> its index
  // Under expert parallelism, each rank's experts' seconds (its file's),
  // by run and stage: the busiest rank's over the mean is the router's
  // imbalance on that run's data.
  std::map<std::pair<std::string, int64_t>, std::map<std::string, double>> expertSeconds;
  auto collective = [&](StringRef file, int64_t stage, int64_t index, const Sample &s) {
    auto [it, added] = collectives.try_emplace({runOf(file).str(), stage, index}, s);
    if (!added && s.seconds < it->second.seconds)
      it->second = s;
  };
  for (auto [text, name] : llvm::zip(files, names)) {
    auto fail = [&, name = name](const Twine &why) {
      return createStringError(inconvertibleErrorCode(), "%s: %s", name.c_str(), why.str().c_str());
    };
    Expected<json::Value> parsed = json::parse(text);
    if (!parsed)
      return fail("invalid JSON: " + toString(parsed.takeError()));
    const json::Object *root = parsed->getAsObject();
    if (!root || root->getString("format") != std::optional<StringRef>("parax-run-profile-1"))
      return fail("not a parax-run --profile file (format parax-run-profile-1)");
    const json::Array *instructions = root->getArray("instructions");
    if (!instructions)
      return fail("no 'instructions' array");
    if (root->getString("device") == std::optional<StringRef>("cpu"))
      cpuRuns = true;
    int64_t stage = static_cast<int64_t>(root->getNumber("stage").value_or(0));
    // The run's ranks on a node of the base cluster: they stream from one
    // memory where the node's devices share it (CPU cores).
    double sharers = std::clamp(root->getNumber("ranks").value_or(1), 1.0,
                                double(std::max<int64_t>(base.devicesPerNode, 1)));
    // The gradient averaging's all-reduces (MPI_Allreduce a gradient
    // tensor): collective samples of `calls` launches each. The rest of the
    // averaging (the division by the microbatches and replicas, a pass over
    // the gradients) is host work a parameter, counted with the update.
    double reduceSeconds = 0;
    if (const json::Value *list = root->get("gradient_all_reduces")) {
      const json::Array *reduces = list->getAsArray();
      if (!reduces)
        return fail("'gradient_all_reduces' is not an array");
      for (auto [i, value] : llvm::enumerate(*reduces)) {
        const json::Object *r = value.getAsObject();
        std::optional<double> n = r ? r->getNumber("group") : std::nullopt,
                              bytes = r ? r->getNumber("bytes") : std::nullopt,
                              calls = r ? r->getNumber("calls") : std::nullopt,
                              seconds = r ? r->getNumber("seconds_median") : std::nullopt;
        if (!n || !bytes || !calls || !seconds || !(*n >= 1 && *n <= 1e6) || !(*bytes >= 0 && *bytes <= 1e15) ||
            !(*calls >= 1 && *calls <= 1e9) || !(*seconds >= 0) || !std::isfinite(*seconds))
          return fail(formatv("gradient_all_reduces[{0}]: needs group in [1, 1e6], bytes in [0, 1e15], calls in "
                              "[1, 1e9] and seconds_median >= 0",
                              i));
        reduceSeconds += *seconds;
        if (*n <= 1 || !(*seconds > 0))
          continue;
        Sample s{Kind::Collective};
        s.collective = CollectiveKind::AllReduce;
        s.calls = *calls;
        s.steps = *calls * 2 * (*n - 1);
        s.wire = 2 * (*n - 1) / *n * *bytes;
        s.message = *bytes / *calls;
        s.gradient = true;
        s.seconds = *seconds;
        // (a step's, by the ranks it spans and its message's size)
        collective(name, stage, -1 - static_cast<int64_t>(s.message) * 1024 - static_cast<int64_t>(*n), s);
      }
    }
    double averaged = root->getNumber("gradient_average_seconds_median").value_or(0);
    double updated = root->getNumber("optimizer_seconds_median").value_or(0);
    double values = root->getNumber("parameter_values").value_or(0);
    if (updated > 0 && values > 0)
      updates.emplace_back(updated + std::max(0.0, averaged - reduceSeconds), values);
    for (auto [i, value] : llvm::enumerate(*instructions)) {
      const json::Object *inst = value.getAsObject();
      auto where = [&, i = i](const Twine &why) { return fail(formatv("instruction {0}: ", i) + why); };
      if (!inst)
        return where("not an object");
      std::optional<StringRef> op = inst->getString("op");
      std::optional<double> seconds = inst->getNumber("seconds_median");
      // The mean where the profile has it: a step is the sum of its
      // instructions, and means add where medians do not (a step that ran
      // slow counts in the step's time, not in any instruction's median).
      if (std::optional<double> mean = inst->getNumber("seconds_mean"); seconds && mean && std::isfinite(*mean))
        seconds = mean;
      const json::Array *operands = inst->getArray("operands");
      const json::Array *results = inst->getArray("results");
      if (!op || !seconds || !operands || !results)
        return where("needs op, seconds_median, operands and results");
      if (!(*seconds > 0) || !std::isfinite(*seconds))
        continue; // (a time too short for the clock)
      Kind kind = kindOf(*op);
      if (kind == Kind::Skip || (*op == "cross_entropy" && operands->size() > 2))
        continue; // (a loss given its logsumexp: the labels' pick)
      auto shape = [&](const json::Array &list, size_t k) -> const json::Array * {
        return k < list.size() ? list[k].getAsArray() : nullptr;
      };
      if (kind != Kind::Collective && (!shape(*operands, 0) || !shape(*results, 0)))
        return where("'" + *op + "' needs its operands' and results' shapes");
      std::optional<StringRef> type = inst->getString("dtype");
      double element = type == std::optional<StringRef>("f32") ? 4 : 2;
      if (kind == Kind::Gemm && type)
        dtype = type->str();
      Sample s{kind};
      s.seconds = *seconds;
      s.sharers = sharers;
      s.run = runs.try_emplace(runOf(name).str(), static_cast<int>(runs.size())).first->second;
      if (kind == Kind::Gemm) {
        const json::Array &x = *shape(*operands, 0), &y = *shape(*results, 0);
        s.x = *op == "linear_weight_grad" ? 2 * numel(y) * (numel(x) / last(x)) : 2 * numel(y) * last(x);
        for (const json::Array *list : {operands, results})
          for (const json::Value &v : *list)
            if (const json::Array *a = v.getAsArray())
              s.bytes += element * numel(*a);
      } else if (kind == Kind::Attention || kind == Kind::AttentionGrad) {
        const json::Array *q = shape(*operands, 0), *k = shape(*operands, 1), *v = shape(*operands, 2);
        if (!q || !k || !v || q->size() != 4 || k->size() != 4 || v->size() != 4)
          return where(*op + " needs q, k and v of rank 4");
        if ((*q)[1].getAsNumber().value_or(0) < 8)
          continue; // a decode step's: it reads its cache up to a run-time position, not its shape
        double b = (*q)[0].getAsNumber().value_or(0), sq = (*q)[1].getAsNumber().value_or(0),
               h = (*q)[2].getAsNumber().value_or(0), d = last(*q), skv = (*k)[1].getAsNumber().value_or(0),
               dv = last(*v);
        const json::Object *attrs = inst->getObject("attrs");
        bool causal = attrs && attrs->getBoolean("causal").value_or(false);
        double pairs = causal ? sq * (skv - sq) + sq * (sq + 1) / 2 : sq * skv;
        s.x = b * h * pairs * (2 * d + 5 + 2 * dv);
        s.keys = pairs / sq;
        // (the backward: the scores again, then dv, dP, dq and dk: the
        // planner's LayerSolver count)
        if (kind == Kind::AttentionGrad)
          s.x += b * h * pairs * (2 * dv + 5 + 4 * d);
      } else if (kind == Kind::Experts) {
        // x [.., H], the routing [.., k], the gate stack [E, F, H]: the
        // planner's T k (6 H F + 5 F + 2 H).
        const json::Array *x = shape(*operands, 0), *routing = shape(*operands, 1), *gate = shape(*operands, 3);
        if (!x || !routing || !gate || gate->size() != 3)
          return where("experts needs x, the routing and the expert stacks");
        if (last(*routing) == 1) {
          // rows dispatched to this rank's experts (capacity rows, not the
          // pairs routed): its time is the rank's share of the routing
          expertSeconds[{runOf(name).str(), stage}][name] += *seconds;
          continue;
        }
        double h = last(*x), f = (*gate)[1].getAsNumber().value_or(0);
        s.x = numel(*routing) * (6 * h * f + 5 * f + 2 * h);
        // (the planner's expertPassesTime: rows into expert order and
        // back, the gated activation)
        s.passes = numel(*routing) * (4 * h + 3 * f) * element;
      } else if (kind != Kind::Collective) { // memory-bound
        for (const json::Value &o : *operands)
          if (const json::Array *a = o.getAsArray())
            s.x += element * numel(*a);
        for (const json::Value &r : *results)
          if (const json::Array *a = r.getAsArray())
            s.x += element * numel(*a);
      } else {
        double n = inst->getNumber("group").value_or(1);
        if (n <= 1)
          continue;
        const json::Array *in = shape(*operands, 0), *out = shape(*results, 0);
        if (!in || !out)
          return where("a collective needs its operand's and result's shapes");
        // The planner's bytes: all-gather the gathered value, the others
        // their input; an expert exchange (an all-to-all) the rank's own
        // (token, choice) rows.
        double bytes = element * (*op == "all_gather" ? numel(*out) : numel(*in));
        if (*op == "moe_dispatch" || *op == "moe_combine") {
          const json::Array *routing = shape(*operands, 1);
          if (!routing)
            return where("an expert exchange needs its routing");
          bytes = element * numel(*routing) * last(*in);
        }
        bool reduce = *op == "all_reduce";
        s.collective = reduce                       ? CollectiveKind::AllReduce
                       : *op == "all_gather"        ? CollectiveKind::AllGather
                       : *op == "reduce_scatter"    ? CollectiveKind::ReduceScatter
                                                    : CollectiveKind::AllToAll;
        s.steps = reduce ? 2 * (n - 1) : n - 1;
        s.wire = (reduce ? 2 * (n - 1) / n : (n - 1) / n) * bytes;
        s.message = bytes;
        collective(name, stage, static_cast<int64_t>(i), s);
        continue;
      }
      samples.push_back(s);
    }
  }
  for (const auto &entry : collectives)
    samples.push_back(entry.second);
  auto count = [&](Kind k) { return llvm::count_if(samples, [&](const Sample &s) { return s.kind == k; }); };
  if (count(Kind::Gemm) < 2 || count(Kind::Memory) < 2)
    return createStringError(inconvertibleErrorCode(),
                             "--calibrate: the runs hold %d GEMM and %d memory-bound timings; at least 2 "
                             "of each are needed",
                             int(count(Kind::Gemm)), int(count(Kind::Memory)));

  // Compute: theta = [1/R, 1/B (plain), 1/B (norm, rope, swiglu, unary),
  // 1/A, 1/E (experts), 1/B (GEMM bytes), c]: a column a kind, in Kind's
  // order, then the GEMMs' bytes and the overhead. A GEMM's time: the
  // larger of its FLOPs' and its bytes' time plus a share u of the smaller
  // (the profile's gemm_unhidden: 0 a GPU's roofline, 1 a CPU BLAS that
  // packs its operands, then multiplies). For each u of 0, 0.05, ..., 1 a
  // fit, each GEMM taken by the term the fit before says is the larger
  // (both at first) until that stops changing; the u kept is the one whose
  // GEMMs add up closest to the runs' (below).
  std::vector<bool> use(kColumns, false);
  use[kOverhead] = true;
  std::vector<const Sample *> fitted;
  for (const Sample &s : samples)
    if (s.kind != Kind::Collective) {
      fitted.push_back(&s);
      use[static_cast<int>(s.kind)] = true;
      use[kGemmBytes] = use[kGemmBytes] || s.bytes > 0;
    }
  std::vector<double> t;
  for (const Sample *s : fitted)
    t.push_back(s->seconds);
  // A node whose ranks share one memory (CPU cores): a run of r ranks a
  // node streams at the node's rate over r where that is less than one
  // rank's alone, n = the node's rate over one rank's (1 .. the most ranks
  // a run has on a node): its memory-bound terms (a GEMM's bytes, the
  // memory-bound classes, the experts' passes) r / n times longer.
  auto slower = [](const Sample &s, double n) { return std::max(1.0, s.sharers / n); };
  auto fitFor = [&](double u, double n) -> Expected<std::vector<double>> {
    std::vector<int> bound(fitted.size(), 2); // a GEMM's larger term: 0 FLOPs, 1 bytes, 2 not yet known
    Expected<std::vector<double>> theta = std::vector<double>();
    for (int round = 0; round < 8; ++round) {
      std::vector<std::vector<double>> rows;
      for (auto [i, s] : llvm::enumerate(fitted)) {
        std::vector<double> row(kColumns, 0);
        double shared = slower(*s, n);
        row[static_cast<int>(s->kind)] = s->x * (bound[i] == 1 ? u : 1) * (memoryBound(s->kind) ? shared : 1);
        row[static_cast<int>(Kind::Memory)] += s->passes * shared;
        row[kGemmBytes] = s->bytes * shared * (bound[i] == 0 ? u : 1);
        row[kOverhead] = 1;
        rows.push_back(row);
      }
      theta = nonNegative(rows, t, use, "compute");
      // (No positive FLOP rate -- GEMMs too small to tell their arithmetic
      // from their bytes -- leaves nothing to take a GEMM's term by; the
      // check below names it.)
      if (!theta || !((*theta)[0] > 0))
        return theta;
      bool changed = false;
      for (auto [i, s] : llvm::enumerate(fitted)) {
        if (s->kind != Kind::Gemm)
          continue;
        int term = s->x * (*theta)[0] >= s->bytes * slower(*s, n) * (*theta)[kGemmBytes] ? 0 : 1;
        changed = changed || term != bound[i];
        bound[i] = term;
      }
      if (!changed)
        break;
    }
    return theta;
  };
  // An instruction's seconds under a fit (not a collective's).
  auto computeSeconds = [&](const Sample &s, const std::vector<double> &theta, double u, double n) {
    double shared = slower(s, n), tail = s.passes * shared * theta[static_cast<int>(Kind::Memory)] + theta[kOverhead];
    if (s.kind != Kind::Gemm)
      return s.x * theta[static_cast<int>(s.kind)] * (memoryBound(s.kind) ? shared : 1) + tail;
    double flops = s.x * theta[0], bytes = s.bytes * shared * theta[kGemmBytes];
    return std::max(flops, bytes) + u * std::min(flops, bytes) + tail;
  };
  // A fit's error: each run's instructions together (their predicted
  // seconds against their measured sum), the mean |relative error| over
  // the runs; `gemms`: their GEMMs alone. Run by run, not instruction by
  // instruction: a median over the GEMMs follows the runs with the most of
  // them (the prefills'), where the shares differ by a few percent, and
  // not a decode step's few-row GEMMs, which stream their weights beside
  // arithmetic and where they differ most (a 4-row generation step here
  // 1.27x its prediction under the larger time).
  auto residual = [&](const std::vector<double> &theta, double u, double n, bool gemms) {
    std::map<int, std::pair<double, double>> byRun; // predicted, measured
    for (const Sample *s : fitted)
      if (!gemms || s->kind == Kind::Gemm) {
        byRun[s->run].first += computeSeconds(*s, theta, u, n);
        byRun[s->run].second += s->seconds;
      }
    double total = 0;
    for (const auto &entry : byRun)
      total += std::abs(entry.second.first / entry.second.second - 1);
    return byRun.empty() ? 0.0 : total / byRun.size();
  };
  // The share u of 0, 0.05, ..., 1 whose GEMMs add up closest to the
  // runs' (a tie keeps the smaller); for each node rate n of 1, 1.05, ...,
  // up to the most ranks a run has on a node, the u so kept and the n
  // whose instructions add up closest (a tie keeps the larger: no sharing
  // where the runs do not show it).
  double most = 1;
  for (const Sample *s : fitted)
    most = std::max(most, s->sharers);
  std::vector<double> th;
  double unhidden = 0, nodeRate = most, closestNode = std::numeric_limits<double>::infinity();
  for (int nStep = static_cast<int>(std::round((most - 1) * 20)); nStep >= 0; --nStep) {
    double n = 1 + nStep / 20.0;
    std::vector<double> best;
    double bestU = 0, closest = std::numeric_limits<double>::infinity();
    for (int step = 0; step <= 20; ++step) {
      double u = step / 20.0;
      Expected<std::vector<double>> theta = fitFor(u, n);
      if (!theta)
        return theta.takeError();
      if (best.empty())
        best = *theta; // (the roofline's, should no share give a positive rate)
      if (!((*theta)[0] > 0))
        continue;
      double r = residual(*theta, u, n, true);
      if (r < closest - 1e-9) {
        closest = r;
        best = *theta;
        bestU = u;
      }
    }
    double r = best[0] > 0 ? residual(best, bestU, n, false) : std::numeric_limits<double>::infinity();
    if (th.empty() || r < closestNode - 1e-9) {
      closestNode = r;
      th = best;
      unhidden = bestU;
      nodeRate = n;
    }
  }
  // Flash attention's fixed cost a query (the profile's
  // flash_key_overhead): an attention's FLOPs taken as x (1 + k / T), T
  // the keys a query sees, for k of 0, 8, ..., 1,024 keys, the whole fit
  // made again for each (the shared overhead otherwise takes up the
  // attention's fixed cost); the k kept is the one whose attention
  // timings (forward and backward) fit closest, relative. (A CPU's
  // kernel: a block of queries against the keys its last one sees, then
  // each row normalised.)
  double keyOverhead = 0;
  std::vector<std::pair<Sample *, double>> attentions; // (sample, its FLOPs)
  for (Sample &s : samples)
    if (s.keys > 0)
      attentions.push_back({&s, s.x});
  if (!attentions.empty()) {
    auto scaled = [&](double k) {
      for (auto [s, flops] : attentions)
        s->x = flops * (1 + k / s->keys);
    };
    double closest = std::numeric_limits<double>::infinity();
    std::vector<double> kept = th;
    for (int k = 0; k <= 1024; k += 8) {
      scaled(k);
      Expected<std::vector<double>> theta = fitFor(unhidden, nodeRate);
      if (!theta)
        return theta.takeError();
      if (!((*theta)[0] > 0))
        continue;
      double error = 0;
      for (auto [s, flops] : attentions)
        error += std::pow(computeSeconds(*s, *theta, unhidden, nodeRate) / s->seconds - 1, 2);
      if (error < closest - 1e-12) {
        closest = error;
        keyOverhead = k;
        kept = *theta;
      }
    }
    scaled(keyOverhead);
    th = kept;
  }
  auto slope = [&](Kind k) { return th[static_cast<int>(k)]; };
  if (!(slope(Kind::Gemm) > 0) || !(slope(Kind::Memory) > 0))
    return createStringError(inconvertibleErrorCode(),
                             "--calibrate: the GEMM or the plain memory-bound timings (add, mul, ...) do "
                             "not grow with their work (no positive rate fits)");
  Calibration out;
  ClusterSpec &c = out.cluster;
  c = base;
  Profile &p = c.profile;
  p = Profile();
  p.name = "calibrated";
  p.description = formatv("fitted by parax-plan --calibrate to {0} run profile(s)", files.size()).str();
  double rate = 1 / slope(Kind::Gemm);
  std::string type = dtype.empty() ? "f32" : dtype;
  c.peakFlops.clear();
  c.peakFlops[type] = rate;
  if (type != "bf16")
    c.peakFlops["bf16"] = rate; // (a model's other dtype runs no faster here)
  c.matmulEfficiency = 1;
  c.fp8MatmulEfficiency = 0; // (no fp8 peak fitted)
  // (the base's busy_node_matmul_share stays: the fitted rate is what the
  // runs' devices reached, and a base whose runs filled a node says 1)
  // The memory's bandwidth: what the GEMMs stream at (their bytes' slope),
  // or where no GEMM fits one, the plain ops'; a class's passes: its time a
  // byte over that (a class with no samples keeps 1).
  double perByte = th[kGemmBytes] > 0 ? th[kGemmBytes] : slope(Kind::Memory);
  c.hbmBandwidth = 1 / perByte;
  c.memoryEfficiency = 1;
  c.nodeMemoryBandwidth = nodeRate < most ? nodeRate * c.hbmBandwidth : 0;
  for (auto [kind, passes] : {std::pair<Kind, double *>{Kind::Memory, &p.addPasses},
                              {Kind::Norm, &p.normPasses},
                              {Kind::CrossEntropy, &p.crossEntropyPasses},
                              {Kind::Rope, &p.ropePasses},
                              {Kind::Swiglu, &p.swigluPasses},
                              {Kind::Unary, &p.unaryPasses}})
    if (slope(kind) > 0)
      *passes = std::clamp(slope(kind) / perByte, 0.01, 100.0);
  p.kernelOverhead = th[kOverhead];
  // The optimizer's bytes a parameter: its measured update over the
  // parameters the rank holds, at that bandwidth (the median over the runs
  // that updated).
  std::vector<double> optimizerBytes;
  for (auto [seconds, values] : updates)
    optimizerBytes.push_back(seconds * c.hbmBandwidth / values);
  if (!optimizerBytes.empty()) {
    llvm::sort(optimizerBytes);
    p.optimizerBytes = optimizerBytes[optimizerBytes.size() / 2];
  }
  if (slope(Kind::Attention) > 0)
    p.flashEfficiency = std::min(1.0, slope(Kind::Gemm) / slope(Kind::Attention));
  p.flashKeyOverhead = keyOverhead;
  if (slope(Kind::Attention) > 0 && slope(Kind::AttentionGrad) > 0)
    p.flashBackwardRate = std::clamp(slope(Kind::Attention) / slope(Kind::AttentionGrad), 0.01, 10.0);
  if (slope(Kind::Experts) > 0)
    p.expertsEfficiency = std::min(1.0, slope(Kind::Gemm) / slope(Kind::Experts));
  // The routing's imbalance: each EP run's busiest rank's experts' time
  // over its ranks' mean, the median over the runs (none: the base's).
  std::vector<double> imbalances;
  for (const auto &entry : expertSeconds) {
    const std::map<std::string, double> &ranks = entry.second;
    if (ranks.size() < 2)
      continue;
    double most = 0, sum = 0;
    for (const auto &rank : ranks) {
      most = std::max(most, rank.second);
      sum += rank.second;
    }
    if (sum > 0)
      imbalances.push_back(most * ranks.size() / sum);
  }
  if (!imbalances.empty()) {
    llvm::sort(imbalances);
    p.expertImbalance = imbalances[imbalances.size() / 2];
  }
  p.ncclProtocols = false;
  // parax-run's CPU path averages a step's gradients after its backward
  // (Training::averageGradients); the CUDA backend streams them in buckets
  // during the last backward.
  p.dpOverlap = !cpuRuns;
  p.gemmUnhidden = unhidden;

  // Collectives: theta = [L, h, 1/W a kind (all-reduce, all-gather,
  // reduce-scatter, all-to-all)]; the link's bandwidth is the fastest
  // kind's, the others a share of it (the profile's collective_kinds).
  // A message's size changes its bandwidth, differently for each kind: on
  // a CPU node MPI copies through the last-level cache, and an all-reduce
  // beyond it moves at a third of its pace while an all-gather keeps its
  // own. Each kind's size curve: its median rate (wire bytes over its time
  // less the line's latency) a power of two of message bytes, as a share of
  // its fastest such rate; the line is fitted on each sample's wire over
  // its share, the rates read again with the line's latency, until the
  // shares settle. A kind whose messages fill one power of two has none.
  std::vector<bool> cuse = {true, true, false, false, false, false};
  // A kind's bandwidth is fitted only where some message of it is large
  // enough to show one (64 KB on the wire): a loss's scalar all-reduce
  // says only latency.
  for (const Sample &s : samples)
    if (s.kind == Kind::Collective && s.wire >= 65536)
      cuse[2 + static_cast<int>(s.collective)] = true;
  auto share = [&](const Sample &s) { return p.sizeShare(static_cast<int>(s.collective), s.message); };
  std::vector<double> cth;
  auto fitLine = [&]() -> Error {
    std::vector<std::vector<double>> rows;
    std::vector<double> t;
    for (const Sample &s : samples)
      if (s.kind == Kind::Collective) {
        std::vector<double> row = {s.calls, s.steps, 0, 0, 0, 0};
        if (cuse[2 + static_cast<int>(s.collective)])
          row[2 + static_cast<int>(s.collective)] = s.wire / share(s);
        rows.push_back(row);
        t.push_back(s.seconds);
      }
    if (rows.empty())
      return Error::success();
    Expected<std::vector<double>> fit = nonNegative(rows, t, cuse, "collective");
    if (!fit)
      return fit.takeError();
    cth = *fit;
    return Error::success();
  };
  if (Error e = fitLine())
    return std::move(e);
  for (int round = 0; round < 100 && !cth.empty(); ++round) {
    bool settled = true;
    for (int k = 0; k < 4; ++k) {
      std::map<int, std::vector<std::pair<double, double>>> bins; // log2 bytes: (bytes, rate)
      for (const Sample &s : samples) {
        double wireTime = s.seconds - s.calls * cth[0] - s.steps * cth[1];
        if (s.kind == Kind::Collective && static_cast<int>(s.collective) == k && s.wire >= 65536 &&
            wireTime > 0)
          bins[static_cast<int>(std::floor(std::log2(s.message)))].emplace_back(s.message, s.wire / wireTime);
      }
      std::vector<std::pair<double, double>> curve;
      if (bins.size() >= 2) {
        double top = 0;
        for (auto &[bin, points] : bins) {
          double logs = 0;
          std::vector<double> rates;
          for (auto [bytes, rate] : points) {
            logs += std::log(bytes);
            rates.push_back(rate);
          }
          llvm::sort(rates);
          curve.emplace_back(std::exp(logs / points.size()), rates[rates.size() / 2]);
          top = std::max(top, curve.back().second);
        }
        for (auto &point : curve)
          point.second = std::clamp(point.second / top, 0.01, 1.0);
      }
      std::vector<std::pair<double, double>> &old = p.sizeCurves[k];
      settled = settled && curve.size() == old.size();
      for (size_t i = 0; settled && i < curve.size(); ++i)
        settled = std::abs(curve[i].second / old[i].second - 1) < 1e-9;
      old = curve;
    }
    if (Error e = fitLine())
      return std::move(e);
    if (settled)
      break;
  }
  // A step's gradient reduction goes in messages of at most its largest
  // gradient (one a tensor, as parax-run averages them).
  for (const Sample &s : samples)
    if (s.kind == Kind::Collective && s.gradient)
      p.reduceBucketBytes = std::max(p.reduceBucketBytes, s.message);
  std::string collectiveLine = "collectives: none measured (the base cluster's links kept)";
  if (!cth.empty()) {
    double fastest = 0; // the least seconds a byte among the kinds fitted
    for (int k = 2; k < 6; ++k)
      if (cth[k] > 0 && (fastest == 0 || cth[k] < fastest))
        fastest = cth[k];
    LinkSpec link;
    link.bandwidth = fastest > 0 ? 1 / fastest : 1e15;
    link.efficiency = 1;
    link.hopLatency = std::max(cth[1], 1e-9);
    c.intraNode = c.interNode = link;
    c.collectiveLatency = std::max(cth[0], 1e-9);
    for (int k = 0; k < 4; ++k)
      if (cth[2 + k] > 0)
        p.kindEfficiency[k] = fastest / cth[2 + k];
  }

  // The residuals, a line a class.
  auto predict = [&](const Sample &s) {
    if (s.kind == Kind::Collective)
      return s.calls * cth[0] + s.steps * cth[1] +
             s.wire * cth[2 + static_cast<int>(s.collective)] / share(s);
    return computeSeconds(s, th, unhidden, nodeRate);
  };
  auto line = [&](Kind kind, const std::string &head) {
    std::vector<double> r;
    for (const Sample &s : samples)
      if (s.kind == kind)
        r.push_back(std::abs(predict(s) / s.seconds - 1));
    if (r.empty())
      return head + ": no samples\n";
    llvm::sort(r);
    return formatv("{0}: {1} samples, |relative residual| median {2:P1}, largest {3:P1}\n", head, r.size(),
                   r[r.size() / 2], r.back())
        .str();
  };
  auto passesLine = [&](Kind kind, const char *name, double passes) {
    return line(kind, formatv("{0}: {1:F2} passes ({2:F2} GB/s)", name, passes,
                              c.hbmBandwidth / passes / 1e9)
                          .str());
  };
  out.report = line(Kind::Gemm, formatv("GEMMs: {0:F2} GFLOP/s ({1}), streaming {2:F2} GB/s, the larger time plus "
                                        "{3:F2} of the smaller (gemm_unhidden)",
                                        rate / 1e9, type, c.hbmBandwidth / 1e9, unhidden)
                                    .str()) +
               (most <= 1 ? std::string("memory: no run of several ranks on a node (not known if they share it)\n")
                : c.nodeMemoryBandwidth > 0
                    ? formatv("memory: a node's ranks share {0:F2} GB/s ({1:F2} x one rank's; {2:F2} GB/s a rank "
                              "when {3} stream at once)\n",
                              c.nodeMemoryBandwidth / 1e9, nodeRate, c.nodeMemoryBandwidth / most / 1e9,
                              static_cast<int>(most))
                          .str()
                    : formatv("memory: {0} ranks on a node stream each at one rank's rate (not shared)\n",
                              static_cast<int>(most))
                          .str()) +
               passesLine(Kind::Memory, "plain memory-bound ops (add, mul, ...)", p.addPasses) +
               passesLine(Kind::Norm, "norms", p.normPasses) + passesLine(Kind::Rope, "rope", p.ropePasses) +
               passesLine(Kind::Swiglu, "swiglu", p.swigluPasses) +
               passesLine(Kind::Unary, "activations", p.unaryPasses) +
               passesLine(Kind::CrossEntropy, "cross-entropy", p.crossEntropyPasses) +
               line(Kind::Experts, slope(Kind::Experts) > 0
                                       ? formatv("experts: {0:F2} GFLOP/s", 1 / slope(Kind::Experts) / 1e9).str()
                                       : std::string("experts: not fitted")) +
               (imbalances.empty()
                    ? std::string("experts under EP: no run (balanced routing kept)\n")
                    : formatv("experts under EP: the busiest rank's time {0:F3}x the mean's ({1} run(s), {2:F3} to "
                              "{3:F3})\n",
                              p.expertImbalance, imbalances.size(), imbalances.front(), imbalances.back())
                          .str()) +
               line(Kind::Attention, slope(Kind::Attention) > 0
                                         ? formatv("attention: {0:F2} GFLOP/s", 1 / slope(Kind::Attention) / 1e9).str() +
                                               (keyOverhead > 0
                                                    ? formatv(" times T / (T + {0}), T the keys a query sees",
                                                              format("%g", keyOverhead))
                                                          .str()
                                                    : std::string())
                                         : std::string("attention: not fitted")) +
               line(Kind::AttentionGrad,
                    slope(Kind::AttentionGrad) > 0
                        ? formatv("attention backward: {0:F2} GFLOP/s ({1:F2} of the forward's rate)",
                                  1 / slope(Kind::AttentionGrad) / 1e9, p.flashBackwardRate)
                              .str()
                        : std::string("attention backward: not fitted")) +
               formatv("kernel overhead: {0:F2} us an instruction\n", th[kOverhead] * 1e6).str() +
               (optimizerBytes.empty() ? std::string("optimizer: not measured (16 bytes a parameter kept)\n")
                                       : formatv("optimizer: {0:F1} bytes a parameter at that bandwidth ({1} "
                                                 "run(s))\n",
                                                 p.optimizerBytes, optimizerBytes.size())
                                             .str()) +
               (p.dpOverlap ? "gradient averaging: overlapped with the last backward (the CUDA backend's buckets)\n"
                            : "gradient averaging: after the backward (parax-run's CPU path)\n") +
               (cth.empty() ? collectiveLine + "\n"
                              : line(Kind::Collective,
                                     formatv("collectives: launch {0:F1} us, {1:F1} us a ring step, {2:F3} GB/s "
                                             "(all-reduce x {3:F2}, all-gather x {4:F2}, reduce-scatter x {5:F2}, "
                                             "all-to-all x {6:F2})",
                                             cth[0] * 1e6, cth[1] * 1e6, c.intraNode.bandwidth / 1e9,
                                             p.kindEfficiency[0], p.kindEfficiency[1], p.kindEfficiency[2],
                                             p.kindEfficiency[3])
                                         .str()));
  static const char *const kindNames[] = {"all-reduce", "all-gather", "reduce-scatter", "all-to-all"};
  for (int k = 0; k < 4; ++k)
    if (!p.sizeCurves[k].empty()) {
      out.report += formatv("{0} by message size (share of its bandwidth):", kindNames[k]).str();
      for (auto [bytes, fraction] : p.sizeCurves[k])
        out.report += formatv(" {0:F2} MB {1:F2};", bytes / 1e6, fraction).str();
      out.report.back() = '\n';
    }
  if (p.reduceBucketBytes > 0)
    out.report += formatv("gradient reduction: in messages of at most {0:F2} MB (its largest gradient's)\n",
                          p.reduceBucketBytes / 1e6)
                      .str();
  return out;
}
