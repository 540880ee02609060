// OpShapes.cpp - what every op's kernels assume of its buffers, checked
// before anything runs (Executable.h: checkOpShapes). A file whose shapes,
// dtypes or attributes do not fit an op gets an error naming the
// instruction; no kernel of either backend reads or writes past a buffer.

#include "parax/runtime/Executable.h"
#include "parax/runtime/ExpertChoice.h"

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <set>
#include <sstream>

namespace parax::runtime {

namespace {

using Shape = std::vector<int64_t>;

std::string text(const Shape &s) {
  std::string t = "[";
  for (size_t d = 0; d < s.size(); ++d) t += (d ? ", " : "") + std::to_string(s[d]);
  return t + "]";
}

// A number as a person writes it: -1, 1e-05, nan.
std::string shortest(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

// Whether rows first .. first + n - 1 lie in 0 .. size - 1 (n >= 0), without
// overflowing: a start of INT64_MAX wrapped `start + n` below the size and
// read before the tensor (parax-pxe-fuzz, 2026-12-01).
bool rowsFit(int64_t first, int64_t n, int64_t size) { return first >= 0 && n <= size && first <= size - n; }

// A position table's rows offset .. offset + n - 1 (every rank's piece) that
// it does not have.
std::string positionsPastTable(int64_t offset, int64_t n, int64_t rows) {
  std::string last = offset <= INT64_MAX - n ? std::to_string(offset + n - 1) : "beyond";
  return "positions " + std::to_string(offset) + " .. " + last + " exceed the table's " + std::to_string(rows) +
         " rows";
}

int64_t count(const Shape &s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

bool isInteger(pxe::DType t) { return t == pxe::I32 || t == pxe::I64; }

// One instruction's check: its op, attributes, operand and result shapes,
// and where it is (the start of every error).
struct OpCheck {
  const pxe::Executable &exe;
  const pxe::Stage &stage;
  const pxe::Instruction &inst;
  const std::string &op;
  const Attrs &a;
  const std::string &where;
  std::vector<Shape> in, out;

  Status fail(const std::string &what) const { return Status::error(where + ": " + what); }
  // The group of a collective (or of a split op's axes attribute).
  int64_t groupOf(const std::string &key) const {
    int64_t n = 1;
    for (const std::string &axis : attrStrings(a, key)) n *= std::max<int64_t>(1, axisSize(exe, axis));
    return n;
  }
  bool dimAttr(const std::string &key, const Shape &s, int &dim) const {
    int64_t d = attrInt(a, key, -1);
    if (d < 0 || d >= static_cast<int64_t>(s.size())) return false;
    dim = static_cast<int>(d);
    return true;
  }
  // Equal except along `dim` (every dimension when dim < 0).
  static bool alike(const Shape &x, const Shape &y, int dim) {
    if (x.size() != y.size()) return false;
    for (size_t d = 0; d < x.size(); ++d)
      if (static_cast<int>(d) != dim && x[d] != y[d]) return false;
    return true;
  }
  static bool broadcastsTo(const Shape &x, const Shape &y) {
    if (x.size() != y.size()) return false;
    for (size_t d = 0; d < x.size(); ++d)
      if (x[d] != y[d] && x[d] != 1) return false;
    return true;
  }
  static int64_t lastOf(const Shape &s) { return s.empty() ? int64_t(1) : s.back(); }

  Status attributeValues() const;
  Status dtypes() const;
  Status layerShapes() const;
  Status elementwiseShapes() const;
  Status moeShapes() const;
  Status lossAndGradientShapes() const;
  Status collectiveShapes() const;
};

Status OpCheck::attributeValues() const {
  // Attribute values the dialect's verifiers require (ParaxOps.cpp), checked
  // again for an executable that did not come from verified IR: an eps of
  // -1 or a scale of NaN computed NaN without a word (parax-pxe-fuzz).
  for (const char *key : {"eps", "theta", "scale", "scaling_factor", "scaling.factor", "coefficient", "weight",
                          "cap", "softcap"}) {
    auto it = a.find(key);
    if (it == a.end()) continue;
    double v = it->second.f();
    bool zeroAllowed = std::string(key) == "coefficient";
    if (it->second.value_case() != pxe::Attr::kF || !std::isfinite(v) || v < 0 || (v == 0 && !zeroAllowed))
      return fail(std::string(key) + " must be a finite " + (zeroAllowed ? "non-negative" : "positive") +
                  " number" + (it->second.value_case() == pxe::Attr::kF ? ", got " + shortest(v) : ""));
  }

  if (auto it = a.find("window"); it != a.end() && (op == "attention" || op == "attention_grad") &&
      (it->second.value_case() != pxe::Attr::kI || it->second.i() <= 0 || !attrFlag(a, "causal")))
    return fail("window must be a positive count of keys, on a causal attention");
  if (auto it = a.find("offset"); it != a.end() && (op == "rms_norm" || op == "rms_norm_grad") &&
      (it->second.value_case() != pxe::Attr::kF || !std::isfinite(it->second.f())))
    return fail("offset must be a finite number");
  return Status::ok();
}

Status OpCheck::dtypes() const {
  // Dtypes: the kernels read token ids, positions, labels and expert
  // indices as integers, everything else as floating point.
  std::set<int> intOperands, intResults;
  if (op == "embedding" || op == "embedding_grad") intOperands = {0};
  else if (op == "experts" || op == "experts_grad") intOperands = {2};
  else if (op == "cross_entropy" || op == "cross_entropy_grad") intOperands = {1};
  else if (op == "label_count") intOperands = {0};
  else if (op == "shift") intOperands = {0}, intResults = {0};
  else if (op == "moe_dispatch") intOperands = {2}, intResults = {2};
  else if (op == "moe_combine") intOperands = {1};
  else if (op == "router") intResults = {1};
  else if ((op == "reshape" || op == "shard_slice") && inst.operands_size() == 1 &&
           isInteger(stage.buffers(inst.operands(0)).dtype()))
    intOperands = {0}, intResults = {0}; // (labels dealt out: moved, never computed on)
  if (int p = positionOperand(inst); p >= 0) intOperands.insert(p);
  for (int k = 0; k < inst.operands_size(); ++k)
    if (isInteger(stage.buffers(inst.operands(k)).dtype()) != (intOperands.count(k) > 0))
      return fail("operand " + std::to_string(k) + " must be " + (intOperands.count(k) ? "integer" : "floating point"));
  for (int k = 0; k < inst.results_size(); ++k)
    if (isInteger(stage.buffers(inst.results(k)).dtype()) != (intResults.count(k) > 0))
      return fail("result " + std::to_string(k) + " must be " + (intResults.count(k) ? "integer" : "floating point"));
  // Floating point: one type for an op's operands and results (what the
  // dialect's verifiers require; a CUDA kernel reads them all as one type),
  // but the fp32 of a loss, an experts' load and the load-balancing terms.
  std::set<int> f32Operands, f32Results;
  if (op == "cross_entropy" || op == "router_load" || op == "label_count" || op == "logsumexp") f32Results = {0};
  if (op == "cross_entropy" || op == "cross_entropy_grad")
    for (int k = 2; k < inst.operands_size(); ++k) f32Operands.insert(k); // a count, an lse
  else if (op == "router_aux_grad") f32Operands = {2};
  else if (op == "balance_loss") f32Operands = {0, 1}, f32Results = {0};
  std::string first; // the first float operand or result, which sets the type
  pxe::DType floatType = pxe::F32;
  auto oneFloatType = [&](const std::string &what, int32_t id, bool fp32) -> Status {
    pxe::DType t = stage.buffers(id).dtype();
    if (isInteger(t)) return Status::ok();
    if (fp32 && t != pxe::F32) return fail(what + " must be fp32, got " + pxe::DType_Name(t));
    if (fp32) return Status::ok();
    if (first.empty()) {
      first = what, floatType = t;
      return Status::ok();
    }
    if (t == floatType) return Status::ok();
    return fail(what + " is " + pxe::DType_Name(t) + " but " + first + " is " + pxe::DType_Name(floatType) +
                ": an op's floating-point operands and results have one type");
  };
  for (int k = 0; k < inst.operands_size(); ++k)
    if (Status st = oneFloatType("operand " + std::to_string(k), inst.operands(k), f32Operands.count(k)); !st.isOk())
      return st;
  for (int k = 0; k < inst.results_size(); ++k)
    if (Status st = oneFloatType("result " + std::to_string(k), inst.results(k), f32Results.count(k)); !st.isOk())
      return st;
  return Status::ok();
}

// Embeddings, projections, norms, rope, attention.
Status OpCheck::layerShapes() const {
  if (op == "embedding") {
    Shape want = in[0];
    if (in[1].size() != 2) return fail("the table must be [vocabulary, hidden], got " + text(in[1]));
    want.push_back(in[1][1]);
    if (out[0] != want) return fail("the result must be " + text(want) + ", got " + text(out[0]));
  } else if (op == "position_embedding") {
    if (in[0].size() != 2 || out[0].size() != 3 || out[0][0] != 1 || out[0][2] != in[0][1])
      return fail("the table [positions, hidden] and result [1, S, hidden] do not fit: " + text(in[0]) + ", " +
                  text(out[0]));
    int64_t offset = attrInt(a, "offset"), rows = out[0][1] * groupOf("seq_axes"); // (every rank's piece)
    if (in.size() == 1 && !rowsFit(offset, rows, in[0][0]))
      return fail(positionsPastTable(offset, rows, in[0][0]));
  } else if (op == "linear") {
    const Shape &x = in[0], &w = in[1], &y = out[0];
    if (x.empty() || w.size() != 2 || !alike(x, y, static_cast<int>(x.size()) - 1))
      return fail("x " + text(x) + ", weight " + text(w) + " and result " + text(y) + " do not fit");
    int64_t k = x.back(), n = y.back();
    Shape want = attrFlag(a, "transpose_w") ? Shape{n, k} : Shape{k, n};
    if (w != want) return fail("the weight must be " + text(want) + ", got " + text(w));
    if (in.size() == 3 && in[2] != Shape{n}) return fail("the bias must be [" + std::to_string(n) + "]");
  } else if (op == "head_linear") {
    const Shape &x = in[0], &w = in[1], &y = out[0];
    if (x.size() < 2 || w.size() != 3 || !alike(x, y, static_cast<int>(x.size()) - 1))
      return fail("x [..., G, in], weight [G, in, out] and result [..., G, out] do not fit: " + text(x) + ", " +
                  text(w) + ", " + text(y));
    int64_t g = x[x.size() - 2], k = x.back(), n = y.back();
    Shape want = attrFlag(a, "transpose_w") ? Shape{g, n, k} : Shape{g, k, n};
    if (w != want) return fail("the weight must be " + text(want) + ", got " + text(w));
  } else if (op == "rms_norm" || op == "layer_norm") {
    if (in[0].empty() || out[0] != in[0]) return fail("the result must be the input's shape " + text(in[0]));
    for (size_t k = 1; k < in.size(); ++k)
      if (in[k] != Shape{in[0].back()}) return fail("the weight and bias must be [" + std::to_string(in[0].back()) + "]");
  } else if (op == "rope") {
    int64_t rotary = attrInt(a, "rotary_dim"), offset = attrInt(a, "position_offset");
    if (offset < 0 || offset > INT32_MAX) // (positions are int32 everywhere else)
      return fail("position_offset must be in [0, 2^31), got " + std::to_string(offset));
    if (in[0].size() != 4 || out[0] != in[0] || rotary <= 0 || rotary % 2 || rotary > in[0][3])
      return fail("x [B, S, heads, D] and an even rotary_dim <= D, got " + text(in[0]) + " and " +
                  std::to_string(rotary));
    // (its scaling's fields: the frequencies the kernels will compute)
    StatusOr<std::vector<double>> frequencies = ropeInverseFrequencies(a);
    if (!frequencies.isOk()) return fail(frequencies.status().message());
    double factor = ropeRotatedFactor(a);
    if (!std::isfinite(factor) || factor <= 0)
      return fail("scaling.attention_factor must be finite and positive, got " + std::to_string(factor));
  } else if (op == "attention" || op == "attention_grad") {
    // (the gradient: `dout` in the result's place, dq, dk, dv of q's, k's, v's shapes)
    bool grad = op == "attention_grad";
    const Shape &q = in[0], &k = in[1], &v = in[2], &y = grad ? in[3] : out[0];
    if (grad && (out[0] != q || out[1] != k || out[2] != v))
      return fail("dq, dk and dv must have the shapes of q, k and v");
    // (value_dim: the values are v's first DV channels)
    int64_t valueDim = grad ? 0 : attrInt(a, "value_dim");
    if (v.size() == 4 && (valueDim < 0 || valueDim > v[3]))
      return fail("value_dim " + std::to_string(valueDim) + " is not within v's " + std::to_string(v[3]) +
                  " channels");
    int64_t DV = valueDim > 0 ? valueDim : v.size() == 4 ? v[3] : 0;
    bool shaped = q.size() == 4 && k.size() == 4 && v.size() == 4 && k[0] == q[0] && v[0] == q[0] &&
                  k[1] == v[1] && k[2] == v[2] && k[3] == q[3] && y == Shape{q[0], q[1], q[2], DV};
    if (!shaped)
      return fail("q [B, S, H, D], k [B, T, KH, D], v [B, T, KH, DV] and result [B, S, H, DV] do not fit: " +
                  text(q) + ", " + text(k) + ", " + text(v) + ", " + text(y));
    int64_t heads = q[2] * groupOf("head_axes");
    if (heads % k[2]) return fail(std::to_string(heads) + " heads do not share " + std::to_string(k[2]) + " KV heads");
    int64_t queries = q[1] * groupOf("seq_axes"); // every rank's, when split over seq_axes
    if (attrFlag(a, "causal") && positionOperand(inst) < 0 && k[1] < queries)
      return fail("causal attention of " + std::to_string(queries) + " queries over " + std::to_string(k[1]) +
                  " keys");
    // A ring's window (ring_cache_update's: the cache's last tokens, then
    // the step's) holds every key the window sees.
    if (!grad && attrFlag(a, "ring") &&
        (positionOperand(inst) < 0 || attrInt(a, "window") <= 0 || k[1] - q[1] < attrInt(a, "window") - 1))
      return fail("ring needs a position, a window and at least window - 1 cached rows, got " +
                  std::to_string(k[1] - q[1]) + " for a window of " + std::to_string(attrInt(a, "window")));
  }
  if ((op == "attention" || op == "rope" || op == "position_embedding") && positionOperand(inst) >= 0 &&
      a.count("seq_axes"))
    return fail("a sequence split over ranks (seq_axes) takes no run-time position");
  return Status::ok();
}

// Elementwise ops and moves of data within a rank.
Status OpCheck::elementwiseShapes() const {
  if (op == "add" || op == "mul" || op == "broadcast") {
    for (const Shape &x : in)
      if (!broadcastsTo(x, out[0])) return fail(text(x) + " does not broadcast to the result " + text(out[0]));
  } else if (op == "silu" || op == "sigmoid" || op == "gelu" || op == "softcap" || op == "all_reduce" ||
             op == "to_partial") {
    if (out[0] != in[0]) return fail("the result must be the input's shape " + text(in[0]));
  } else if (op == "swiglu") {
    if (in[1] != in[0] || out[0] != in[0]) return fail("gate, up and result must have one shape");
  } else if (op == "reshape") {
    if (count(in[0]) != count(out[0])) return fail(text(in[0]) + " cannot be reshaped to " + text(out[0]));
  } else if (op == "transpose") {
    std::vector<int64_t> perm;
    auto it = a.find("permutation");
    if (it == a.end()) return fail("has no permutation attribute");
    perm.assign(it->second.ints().values().begin(), it->second.ints().values().end());
    std::vector<int64_t> sorted = perm;
    std::sort(sorted.begin(), sorted.end());
    bool permutes = perm.size() == in[0].size() && out[0].size() == in[0].size();
    for (size_t d = 0; permutes && d < perm.size(); ++d)
      permutes = sorted[d] == static_cast<int64_t>(d) && out[0][d] == in[0][perm[d]];
    if (!permutes) return fail("the permutation does not take " + text(in[0]) + " to " + text(out[0]));
  } else if (op == "slice") {
    int dim = -1;
    int64_t start = attrInt(a, "start", -1);
    if (!dimAttr("dim", in[0], dim) || !alike(in[0], out[0], dim) || !rowsFit(start, out[0][dim], in[0][dim]))
      return fail("the slice from " + std::to_string(start) + " does not fit " + text(in[0]) + " -> " + text(out[0]));
  } else if (op == "concat") {
    int dim = -1;
    if (!dimAttr("dim", out[0], dim)) return fail("dim is outside the result");
    int64_t total = 0;
    for (const Shape &x : in) {
      if (!alike(x, out[0], dim)) return fail(text(x) + " does not join " + text(out[0]));
      total += x[dim];
    }
    if (total != out[0][dim]) return fail("the parts do not add up to " + text(out[0]));
  }
  return Status::ok();
}

// The router, its load-balancing terms and the experts.
Status OpCheck::moeShapes() const {
  if (op == "balance_loss") {
    if (in[0].empty() || in[0].size() > 2 || in[1] != in[0] || !out[0].empty())
      return fail("the load and the scores must be [experts] or [sequences, experts] alike, the result a scalar");
    if (attrInt(a, "num_tokens") < 1 || attrInt(a, "num_sequences", 1) < 1)
      return fail("num_tokens and num_sequences must be positive");
  } else if (op == "router_aux_grad") {
    int64_t h = lastOf(in[0]), tokens = count(in[0]) / h, E = in[1].empty() ? 0 : in[1][0];
    bool perSequence = in[0].size() == 3 && in[2] == Shape{in[0][0], E};
    if (in[1] != Shape{E, h} || (in[2] != Shape{E} && !perSequence) || count(out[0]) != tokens * E ||
        lastOf(out[0]) != E)
      return fail("the gate [experts, " + std::to_string(h) + "], the load [experts] (or [sequences, experts] for x "
                  "[sequences, tokens, " + std::to_string(h) + "]) and the result [tokens, experts] do not fit");
    if (attrInt(a, "num_tokens") < 1 || attrInt(a, "num_sequences", 1) < 1)
      return fail("num_tokens and num_sequences must be positive");
  } else if (op == "router" || op == "router_grad" || op == "router_load") {
    int64_t h = lastOf(in[0]), tokens = count(in[0]) / h, K = attrInt(a, "top_k");
    if (in[1].size() != 2 || in[1][1] != h) return fail("the gate must be [experts, " + std::to_string(h) + "]");
    int64_t E = in[1][0], groups = attrInt(a, "num_groups", 1), topGroups = attrInt(a, "topk_groups", 1);
    if (groups > kMaxExpertGroups)
      return fail("num_groups " + std::to_string(groups) + " is above " + std::to_string(kMaxExpertGroups));
    if (K < 1 || K > E || groups < 1 || E % groups || topGroups < 1 || topGroups > groups ||
        topGroups * (E / groups) < K)
      return fail("top_k " + std::to_string(K) + " of " + std::to_string(E) + " experts in " +
                  std::to_string(groups) + " group(s), " + std::to_string(topGroups) + " kept, cannot be chosen");
    size_t biasAt = op == "router_grad" ? 3 : 2;
    if (in.size() > biasAt && in[biasAt] != Shape{E}) return fail("the bias must be [" + std::to_string(E) + "]");
    if (op == "router" && (count(out[0]) != tokens * K || count(out[1]) != tokens * K))
      return fail("the weights and indices must hold " + std::to_string(tokens * K) + " values");
    if (op == "router_load" && out[0] != Shape{E} && !(in[0].size() == 3 && out[0] == Shape{in[0][0], E}))
      return fail("the load must be [" + std::to_string(E) + "] or, per sequence, [" +
                  std::to_string(in[0].size() == 3 ? in[0][0] : 0) + ", " + std::to_string(E) + "]");
    if (op == "router_grad" && (count(in[2]) != tokens * K || count(out[0]) != tokens * E || lastOf(out[0]) != E))
      return fail("dweights must hold " + std::to_string(tokens * K) + " values and the result [tokens, " +
                  std::to_string(E) + "]");
  } else if (op == "experts" || op == "experts_grad") {
    int64_t h = lastOf(in[0]), K = lastOf(in[2]), tokens = count(in[0]) / h;
    bool shaped = in[3].size() == 3 && in[4] == in[3] && in[3][2] == h &&
                  in[5] == Shape{in[3][0], h, in[3][1]} && count(in[1]) == tokens * K &&
                  count(in[2]) == tokens * K && out[0] == in[0];
    if (op == "experts_grad")
      shaped = shaped && in[6] == in[0] && out[1] == in[1] && out[2] == in[3] && out[3] == in[4] && out[4] == in[5];
    if (!shaped)
      return fail("x [.., H], weights and indices [tokens, K], gate/up [E, F, H], down [E, H, F] and the result "
                  "do not fit");
  }
  return Status::ok();
}

// The loss and the gradient ops.
Status OpCheck::lossAndGradientShapes() const {
  if (op == "cross_entropy" || op == "cross_entropy_grad") {
    int64_t V = lastOf(in[0]);
    if (in[0].empty() || count(in[1]) != count(in[0]) / V)
      return fail("logits [.., V] and one label per row do not fit");
    if (op == "cross_entropy" ? count(out[0]) != 1 : out[0] != in[0])
      return fail(op == "cross_entropy" ? "the loss must be a scalar" : "the result must be the logits' shape");
    if (attrInt(a, "num_tokens", count(in[1])) < count(in[1]))
      return fail("num_tokens must be at least the " + std::to_string(count(in[1])) + " rows of the logits");
    // After the labels: a count (a scalar) with ignore_index, then an lse
    // ([.., 1]) with vocab_axes (vocab-parallel), each only then.
    bool counted = a.count("ignore_index") > 0, vocab = a.count("vocab_axes") > 0;
    if (in.size() != 2 + size_t(counted) + size_t(vocab) || (counted && !in[2].empty()))
      return fail("a count of the labels (a scalar) must come with ignore_index and only then, "
                  "then an lse with vocab_axes and only then");
    if (vocab) {
      std::vector<int64_t> row = in[0];
      row.back() = 1;
      if (in.back() != row) return fail("lse must have the logits' shape with a last dimension of 1");
    }
  } else if (op == "logsumexp") {
    std::vector<int64_t> row = in[0];
    if (!row.empty()) row.back() = 1;
    if (in[0].empty() || out[0] != row)
      return fail("the result must have x's shape with a last dimension of 1");
  } else if (op == "label_count") {
    if (!out[0].empty() || !a.count("ignore_index")) return fail("the count must be a scalar, with ignore_index");
  } else if (op == "shift") {
    if (in[0].size() != 2 || out[0] != in[0] ||
        stage.buffers(inst.operands(0)).dtype() != stage.buffers(inst.results(0)).dtype())
      return fail("x must be [batch, sequence] and the result of its type");
    int64_t shift = attrInt(a, "shift", 0);
    if (shift <= 0 || shift >= in[0][1] || !a.count("fill"))
      return fail("shift must be in (0, " + std::to_string(in[0][1]) + "), the sequence, with a fill, got " +
                  std::to_string(shift));
  } else if (op == "linear_weight_grad") {
    const Shape &x = in[0], &dy = in[1];
    if (x.size() < 2 || !alike(x, dy, static_cast<int>(x.size()) - 1))
      return fail("x " + text(x) + " and dy " + text(dy) + " must agree but on their last dimension");
    Shape want = attrFlag(a, "transpose_w") ? Shape{dy.back(), x.back()} : Shape{x.back(), dy.back()};
    if (out[0] != want) return fail("the result must be " + text(want) + ", got " + text(out[0]));
  } else if (op == "rms_norm_grad" || op == "rms_norm_weight_grad" || op == "layer_norm_grad" ||
             op == "layer_norm_weight_grad") {
    bool input = op == "rms_norm_grad" || op == "layer_norm_grad";
    const Shape &x = in[0], &dy = in[input ? 2 : 1];
    if (x.empty() || dy != x || (input ? out[0] != x || in[1] != Shape{x.back()} : out[0] != Shape{x.back()}))
      return fail("x, dy, the weight [H] and the result do not fit: x " + text(x) + ", result " + text(out[0]));
  } else if (op == "swiglu_grad") {
    int64_t operand = attrInt(a, "operand", -1);
    if (in[1] != in[0] || in[2] != in[0] || out[0] != in[0] || (operand != 0 && operand != 1))
      return fail("gate, up, dy and the result must have one shape, operand 0 or 1");
  } else if (op == "sum_to") {
    if (out[0].size() != in[0].size() || !broadcastsTo(out[0], in[0]))
      return fail(text(in[0]) + " cannot be summed to " + text(out[0]));
  } else if (op == "gelu_grad" || op == "sigmoid_grad" || op == "softcap_grad") {
    if (in[1] != in[0] || out[0] != in[0]) return fail("x, dy and the result must have one shape");
  } else if (op == "position_embedding_grad") {
    if (in[0].size() != 3 || out[0].size() != 2 || in[0][0] != 1 || in[0][2] != out[0][1])
      return fail("dy [1, S, hidden] and the table [positions, hidden] do not fit: " + text(in[0]) + ", " +
                  text(out[0]));
    int64_t offset = attrInt(a, "offset"), rows = in[0][1] * groupOf("seq_axes"); // (every rank's piece)
    if (!rowsFit(offset, rows, out[0][0]))
      return fail(positionsPastTable(offset, rows, out[0][0]));
  } else if (op == "embedding_grad") {
    Shape want = in[0];
    if (out[0].size() != 2) return fail("the table's gradient must be [vocabulary, hidden], got " + text(out[0]));
    want.push_back(out[0][1]);
    if (in[1] != want) return fail("dy must be " + text(want) + ", got " + text(in[1]));
  }
  return Status::ok();
}

// Collectives and the MoE exchanges: parts of the group's.
Status OpCheck::collectiveShapes() const {
  if (op == "shard_slice" || op == "all_gather" || op == "reduce_scatter") {
    int dim = -1;
    int64_t P = groupOf("axes");
    bool gathers = op == "all_gather";
    const Shape &part = gathers ? in[0] : out[0], &whole = gathers ? out[0] : in[0];
    if (!dimAttr("dim", whole, dim) || !alike(part, whole, dim) || part[dim] * P != whole[dim])
      return fail(text(whole) + " is not " + std::to_string(P) + " parts " + text(part) + " along dim " +
                  std::to_string(attrInt(a, "dim", -1)));
  } else if (op == "all_to_all") {
    int split = -1, concat = -1;
    int64_t P = groupOf("axes");
    if (!dimAttr("split_dim", in[0], split) || !dimAttr("concat_dim", in[0], concat) || in[0][split] % P)
      return fail("split_dim and concat_dim must be dimensions of " + text(in[0]) + ", the split a multiple of " +
                  std::to_string(P));
    Shape want = in[0];
    want[split] /= P;
    want[concat] *= P;
    if (out[0] != want) return fail("the result must be " + text(want) + ", got " + text(out[0]));
  } else if (op == "moe_dispatch" || op == "moe_combine") {
    int64_t P = groupOf("axes"), E = attrInt(a, "num_experts");
    if (E < 1 || E % P) return fail("num_experts must be a positive multiple of the group's " + std::to_string(P));
    bool dispatch = op == "moe_dispatch";
    const Shape &idx = in[dispatch ? 2 : 1];
    int64_t pairs = count(idx), K = lastOf(idx);
    if (dispatch) {
      int64_t h = lastOf(in[0]);
      int64_t R = out[0].empty() ? 0 : out[0][0]; // rows a member holds: pairs .. P * pairs
      bool shaped = !in[0].empty() && count(in[0]) / h * K == pairs && count(in[1]) == pairs &&
                    out[0].size() == 2 && lastOf(out[0]) == h && R >= pairs && R <= P * pairs &&
                    out[1] == Shape{R, 1} && out[2] == Shape{R, 1};
      if (!shaped)
        return fail("tokens, weights, indices and the rows sent do not fit (the rows: [R, h] with R from the " +
                    std::to_string(pairs) + " (token, choice) pairs to " + std::to_string(P) + " times that)");
    } else {
      int64_t h = lastOf(in[0]);
      int64_t rowsOut = attrFlag(a, "per_choice") ? pairs : pairs / std::max<int64_t>(K, 1);
      int64_t R = in[0].empty() ? 0 : in[0][0];
      bool shaped = in[0].size() == 2 && R >= pairs && R <= P * pairs && K >= 1 && pairs % K == 0 &&
                    count(out[0]) == rowsOut * h && lastOf(out[0]) == h;
      if (!shaped) return fail("the rows back, the indices and the result do not fit");
    }
  }
  return Status::ok();
}

} // namespace

Status checkOpShapes(const pxe::Executable &exe, const pxe::Stage &stage, const pxe::Instruction &inst,
                     const std::string &where) {
  OpCheck check{exe, stage, inst, opName(inst), inst.attrs(), where, {}, {}};
  auto shapeOf = [&](int32_t id) { return Shape(stage.buffers(id).shape().begin(), stage.buffers(id).shape().end()); };
  for (int32_t id : inst.operands()) check.in.push_back(shapeOf(id));
  for (int32_t id : inst.results()) check.out.push_back(shapeOf(id));
  for (Status (OpCheck::*part)() const :
       {&OpCheck::attributeValues, &OpCheck::dtypes, &OpCheck::layerShapes, &OpCheck::elementwiseShapes,
        &OpCheck::moeShapes, &OpCheck::lossAndGradientShapes, &OpCheck::collectiveShapes})
    if (Status st = (check.*part)(); !st.isOk())
      return st;
  return Status::ok();
}

} // namespace parax::runtime
