// ExecutorImpl.h - the CPU executor's insides (private to runtime/src):
// Executor::Impl, whose members are the kernels (one a file of op family,
// runtime/src/kernels/), and the helpers they share. Executor.cpp holds
// the instruction loop and the table that resolves each op to its kernel
// once, at prepare.

#ifndef PARAX_RUNTIME_EXECUTORIMPL_H
#define PARAX_RUNTIME_EXECUTORIMPL_H

#include "parax/runtime/Executable.h"
#include "parax/runtime/Executor.h"

#include "Gemm.h"
#include "GradientKernels.h"
#include "MoeKernels.h"
#include "VectorMath.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>
#include <optional>

namespace parax::runtime {

namespace kernels {

// Rows of the leading dims and the last dim.
inline std::pair<int64_t, int64_t> rowsCols(const Tensor &t) {
  int64_t cols = t.shape.empty() ? 1 : t.shape.back();
  return {t.numel() / std::max<int64_t>(cols, 1), cols};
}

// Splits `t` into `parts` equal pieces along `dim`, concatenated piece-major.
template <typename T>
inline std::vector<T> piecesAlong(const Tensor &t, const std::vector<T> &values, int dim, int parts) {
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d) outer *= t.shape[d];
  for (size_t d = dim + 1; d < t.shape.size(); ++d) inner *= t.shape[d];
  int64_t len = t.shape[dim], chunk = len / parts;
  std::vector<T> out(t.numel());
  size_t k = 0;
  for (int p = 0; p < parts; ++p)
    for (int64_t o = 0; o < outer; ++o) { // (a piece's rows of one outer index are contiguous)
      const T *src = &values[(o * len + p * chunk) * inner];
      std::copy(src, src + chunk * inner, &out[k]);
      k += chunk * inner;
    }
  return out;
}

// The inverse: `parts` pieces (piece-major) joined along `dim` into `out`.
inline void joinAlong(const std::vector<float> &pieces, int dim, int parts, Tensor &out) {
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d) outer *= out.shape[d];
  for (size_t d = dim + 1; d < out.shape.size(); ++d) inner *= out.shape[d];
  int64_t len = out.shape[dim], chunk = len / parts;
  size_t k = 0;
  for (int p = 0; p < parts; ++p)
    for (int64_t o = 0; o < outer; ++o) {
      std::copy(&pieces[k], &pieces[k] + chunk * inner, &out.f[(o * len + p * chunk) * inner]);
      k += chunk * inner;
    }
}

// The cross-entropy's mean: its divisor (with ignore_index, label_count's
// count, 1 where it is 0; else num_tokens or this rank's rows; over the
// loss's weight) and the label it skips.
struct CountedLabels {
  double divisor = 1;
  std::optional<int32_t> ignore;
  const Tensor *labels = nullptr;
  // Every counted label inside the vocabulary of V.
  Status check(int64_t V) const {
    for (size_t t = 0; t < labels->i.size(); ++t)
      if (int32_t label = labels->i[t]; (!ignore || label != *ignore) && (label < 0 || label >= V))
        return Status::error("label out of range at token " + std::to_string(t) + " (" + std::to_string(label) +
                             ", vocabulary " + std::to_string(V) +
                             (ignore ? ", ignore_index " + std::to_string(*ignore) : std::string()) + ")");
    return Status::ok();
  }
};
inline CountedLabels countedLabels(const Attrs &a, const Tensor &labels, const Tensor *count) {
  CountedLabels counted;
  counted.labels = &labels;
  if (count) {
    counted.divisor = count->f[0] > 0 ? static_cast<double>(count->f[0]) : 1.0; // (none counted: a loss of 0)
    counted.ignore = static_cast<int32_t>(attrInt(a, "ignore_index"));
  } else {
    counted.divisor = static_cast<double>(attrInt(a, "num_tokens", labels.numel()));
  }
  counted.divisor /= attrFloat(a, "weight", 1.0); // (a multi-token prediction depth's share)
  return counted;
}

// Broadcasting index of `out` flat index k into `in` (same rank, dims 1 or equal).
inline int64_t broadcastIndex(const Tensor &in, const Tensor &out, int64_t k) {
  int64_t index = 0, stride = 1;
  for (int64_t d = out.shape.size() - 1; d >= 0; --d) {
    int64_t coord = k % out.shape[d];
    k /= out.shape[d];
    if (in.shape[d] != 1)
      index += coord * stride;
    stride *= in.shape[d];
  }
  return index;
}

} // namespace kernels

using namespace kernels;

struct Executor::Impl {
  Executor &e;
  const pxe::Executable &exe;
  std::vector<std::pair<int32_t, int32_t>> lentCaches; // (cache input, result) of in-place cache_updates

  // This rank's place in the group of `axes`, its ranks (Executable.h).
  int64_t groupIndex(const std::vector<std::string> &axes) { return runtime::groupIndex(exe, e.coords_, axes); }
  int64_t groupSizeOf(const std::vector<std::string> &axes) { return groupSize(exe, axes); }

  SequenceRows rowsOf(const Attrs &a, int64_t rows) { return sequenceRows(exe, e.coords_, a, rows); }

  int peerRank(const std::string &axis, int64_t peer) { return runtime::peerRank(exe, e.coords_, axis, peer); }

  Status needComm(int64_t groupSize) {
    if (groupSize > 1 && !e.comm_)
      return Status::error("a collective over several ranks needs a communicator");
    return Status::ok();
  }

  // Query s sees keys 0 .. position(s) + (T - S): its own position in the
  // whole sequence (a rank's part of it split over N ranks: T - N * S
  // earlier keys), or over a cache from a run-time position, 0 ..
  // position + s. Query head h reads KV head (headOffset + h) / group.
  StatusOr<AttentionGeometry> attentionGeometry(const pxe::Instruction &inst, const Tensor &q, const Tensor &k) {
    const Attrs &a = inst.attrs();
    int64_t S = q.shape[1], H = q.shape[2], T = k.shape[1], KH = k.shape[2];
    SequenceRows rows = rowsOf(a, S);
    int64_t edge = T - S * rows.pieces;
    int64_t floor = 0;
    if (inst.kind() == pxe::OP_ATTENTION && inst.operands_size() == 4 && attrFlag(a, "ring")) {
      // A ring's window (ring_cache_update): row r at position p - (T - S) + r; those of
      // negative position (the ring not yet full) are not seen.
      floor = std::max<int64_t>(0, T - S - e.buffers_[inst.operands(3)].i[0]);
    } else if (inst.kind() == pxe::OP_ATTENTION && inst.operands_size() == 4) { // (attention_grad's fourth: dout)
      rows = SequenceRows{e.buffers_[inst.operands(3)].i[0], 1, 1};
      edge = 0;
      if (rows.start < 0 || rows.start + S > T)
        return Status::error("position " + std::to_string(rows.start) + " + " + std::to_string(S) +
                             " queries exceed the " + std::to_string(T) + " keys");
    }
    AttentionGeometry g;
    g.scale = static_cast<float>(attrFloat(a, "scale"));
    bool causal = attrFlag(a, "causal");
    g.visible = [causal, rows, edge, T](int64_t s) { return causal ? std::min(T, rows.position(s) + edge + 1) : T; };
    g.window = attrInt(a, "window"); // (a sliding window: the last keys alone)
    g.floor = floor;
    g.softcap = attrFloat(a, "softcap"); // (Gemma 2: scores squashed into (-c, c))
    std::vector<std::string> headAxes = attrStrings(a, "head_axes");
    int64_t totalHeads = H;
    if (!headAxes.empty()) {
      g.headOffset = groupIndex(headAxes) * H;
      totalHeads = H * groupSizeOf(headAxes);
    }
    g.group = totalHeads / KH;
    return g;
  }


  // The kernels (Executor::Impl::run calls them by index).
  using Kernel = Status (Impl::*)(const pxe::Instruction &, int variant);
  struct Entry {
    const char *op;
    Kernel run;
    int variant; // which of the kernel's ops (add 0, mul 1, ...)
  };
  static const Entry kKernels[];
  /// kKernels' index of `op`, -1 if it has no CPU kernel.
  static int kernelIndex(const std::string &op);
  /// Instruction k of the stage.
  Status run(int k);
  // An instruction's attributes, and its operands and results by place
  // (each kernel's first line: `auto [a, in, out] = io(inst);`).
  struct Pick {
    std::vector<Tensor> &b;
    const google::protobuf::RepeatedField<int32_t> &ids;
    Tensor &operator()(int k = 0) const { return b[ids[k]]; }
  };
  struct Io {
    const Attrs &a;
    Pick in, out;
  };
  Io io(const pxe::Instruction &inst) { return {inst.attrs(), {e.buffers_, inst.operands()}, {e.buffers_, inst.results()}}; }
  // A collective's group: its axes, their mask and size.
  struct Group {
    std::vector<std::string> axes;
    unsigned mask = 0;
    int64_t size = 1;
  };
  Status groupOf(const Attrs &a, bool needsComm, Group &group);
  Status runEmbedding(const pxe::Instruction &inst, int variant);
  Status runPositionEmbedding(const pxe::Instruction &inst, int variant);
  Status runLinear(const pxe::Instruction &inst, int variant);
  Status runHeadLinear(const pxe::Instruction &inst, int variant);
  Status runRmsNorm(const pxe::Instruction &inst, int variant);
  Status runRope(const pxe::Instruction &inst, int variant);
  Status runAttention(const pxe::Instruction &inst, int variant);
  Status runCacheUpdate(const pxe::Instruction &inst, int variant);
  Status runRingCacheUpdate(const pxe::Instruction &inst, int variant);
  // What a cache update writes: its cache input itself when that is the
  // generation loop's state (in place), else its result, a copy of it.
  Tensor &cacheTarget(const pxe::Instruction &inst, Tensor &cache, Tensor &y);
  // After an in-place update, the result takes the cache input's storage.
  void lendCache(const pxe::Instruction &inst, Tensor &cache, Tensor &y, int result);
  Status runAdd(const pxe::Instruction &inst, int variant);
  Status runSilu(const pxe::Instruction &inst, int variant);
  Status runSoftcap(const pxe::Instruction &inst, int variant);
  Status runSwiglu(const pxe::Instruction &inst, int variant);
  Status runReshape(const pxe::Instruction &inst, int variant);
  Status runTranspose(const pxe::Instruction &inst, int variant);
  Status runSlice(const pxe::Instruction &inst, int variant);
  Status runBalanceLoss(const pxe::Instruction &inst, int variant);
  Status runRouterAuxGrad(const pxe::Instruction &inst, int variant);
  Status runRouter(const pxe::Instruction &inst, int variant);
  Status runExperts(const pxe::Instruction &inst, int variant);
  Status runExpertsGrad(const pxe::Instruction &inst, int variant);
  Status runCrossEntropy(const pxe::Instruction &inst, int variant);
  Status runLogsumexp(const pxe::Instruction &inst, int variant);
  Status runLabelCount(const pxe::Instruction &inst, int variant);
  Status runShift(const pxe::Instruction &inst, int variant);
  Status runLinearWeightGrad(const pxe::Instruction &inst, int variant);
  Status runRmsNormGrad(const pxe::Instruction &inst, int variant);
  Status runRmsNormWeightGrad(const pxe::Instruction &inst, int variant);
  Status runSumTo(const pxe::Instruction &inst, int variant);
  Status runSoftcapGrad(const pxe::Instruction &inst, int variant);
  Status runSigmoidGrad(const pxe::Instruction &inst, int variant);
  Status runGeluGrad(const pxe::Instruction &inst, int variant);
  Status runPositionEmbeddingGrad(const pxe::Instruction &inst, int variant);
  Status runSwigluGrad(const pxe::Instruction &inst, int variant);
  Status runAttentionGrad(const pxe::Instruction &inst, int variant);
  Status runEmbeddingGrad(const pxe::Instruction &inst, int variant);
  Status runAllReduce(const pxe::Instruction &inst, int variant);
  Status runShardSlice(const pxe::Instruction &inst, int variant);
  Status runAllToAll(const pxe::Instruction &inst, int variant);
  Status runToPartial(const pxe::Instruction &inst, int variant);
  Status runSend(const pxe::Instruction &inst, int variant);
  Status runRecv(const pxe::Instruction &inst, int variant);
  Status runMoeDispatch(const pxe::Instruction &inst, int variant);

};

} // namespace parax::runtime

#endif // PARAX_RUNTIME_EXECUTORIMPL_H
