// ExpertChoice.h - which experts the router chooses for a token, shared by
// the CPU backend and the CUDA kernels so that both choose the same experts
// for every input, NaN scores included.
//
// Experts (and groups of experts) are ranked by value, larger first, equal
// values by lower index, and NaN after every number (by lower index among
// NaNs): a total order, so the top k are always k distinct experts. (Before
// this order, a token whose scores were NaN -- a diverging run's, or an
// executable whose epsilon was -1 -- was routed by whatever the sort made of
// NaN on the CPU, and on the GPU chose one expert k times, or, when a whole
// group's scores were NaN, wrote before its scratch.)

#ifndef PARAX_RUNTIME_EXPERTCHOICE_H
#define PARAX_RUNTIME_EXPERTCHOICE_H

#include <cstdint>

#ifdef __CUDACC__
#define PARAX_HOST_DEVICE __host__ __device__
#else
#define PARAX_HOST_DEVICE
#endif

namespace parax::runtime {

/// Groups of experts a router may have (kept groups are a bit mask).
constexpr int64_t kMaxExpertGroups = 64;

/// Whether item p, of value a, ranks before item q, of value b.
template <typename F>
PARAX_HOST_DEVICE inline bool ranksBefore(F a, int64_t p, F b, int64_t q) {
  bool aNan = a != a, bNan = b != b;
  if (aNan || bNan) return aNan == bNan ? p < q : bNan;
  return a > b || (a == b && p < q);
}

/// The best of items first .. last - 1 (of value value(i), an F) that
/// `keep(i)` admits and that rank after item `after` (none: -1); -1 if
/// there is none.
template <typename F, typename Keep, typename Value>
PARAX_HOST_DEVICE inline int64_t bestAfter(int64_t first, int64_t last, Keep keep, const Value &value,
                                           int64_t after) {
  int64_t best = -1;
  F afterValue = after >= 0 ? value(after) : F(0), bestValue = F(0);
  for (int64_t i = first; i < last; ++i) {
    if (!keep(i)) continue;
    F v = value(i);
    if (after >= 0 && !ranksBefore(afterValue, after, v, i)) continue;
    if (best < 0 || ranksBefore(v, i, bestValue, best)) best = i, bestValue = v;
  }
  return best;
}

/// A token's top-k experts, best first, into chosen[0 .. K): the experts of
/// the `topkGroups` best of `groups` equal groups (a group's value: the sum
/// of its two best choices, or its one), by choice[e] (score + bias).
/// Requires groups <= kMaxExpertGroups, E % groups == 0 and
/// K <= topkGroups * (E / groups) (OpShapes checks them).
template <typename F, typename I>
PARAX_HOST_DEVICE void chooseExperts(const F *choice, int64_t E, int64_t K, int64_t groups, int64_t topkGroups,
                                     I *chosen) {
  const int64_t per = E / groups;
  auto any = [](int64_t) { return true; };
  auto expertValue = [&](int64_t e) { return choice[e]; };
  uint64_t kept = ~uint64_t(0);
  if (groups > 1) {
    auto groupValue = [&](int64_t g) {
      int64_t top = bestAfter<F>(g * per, (g + 1) * per, any, expertValue, -1);
      int64_t second = per > 1 ? bestAfter<F>(g * per, (g + 1) * per, any, expertValue, top) : -1;
      return choice[top] + (second >= 0 ? choice[second] : F(0));
    };
    kept = 0;
    for (int64_t k = 0, g = -1; k < topkGroups; ++k) {
      g = bestAfter<F>(int64_t(0), groups, any, groupValue, g);
      kept |= uint64_t(1) << g;
    }
  }
  auto inKeptGroup = [&](int64_t e) { return ((kept >> (e / per)) & 1) != 0; };
  for (int64_t k = 0, e = -1; k < K; ++k) {
    e = bestAfter<F>(int64_t(0), E, inKeptGroup, expertValue, e);
    chosen[k] = static_cast<I>(e);
  }
}

} // namespace parax::runtime

#endif // PARAX_RUNTIME_EXPERTCHOICE_H
