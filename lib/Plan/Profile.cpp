//===- Profile.cpp - software-stack profiles and their JSON form ----------===//
//
// Every figure of the shipped profiles is derived in docs/cost-model.md
// ("Profiles") from the stack's documented behaviour; none is fitted to a
// published end-to-end run.
//
//===----------------------------------------------------------------------===//

#include "parax/Plan/Profile.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"

#include <algorithm>
#include <cmath>

using namespace llvm;
using namespace parax::plan;

namespace {

// Units: microseconds, megabytes (1e6 bytes).
const std::pair<const char *, const char *> kProfiles[] = {
    {"roofline", R"json({"name": "roofline"})json"},
    {"megatron-2021", R"json({
  "name": "megatron-2021",
  "description": "Megatron-LM as Narayanan et al. 2021 ran it: cuBLAS GEMMs, the score matrix materialised (fused scale-mask-softmax, dropout), fused LayerNorm and bias-GeLU, no TP overlap, gradients all-reduced after the backward pass, pipeline boundaries sent in tp pieces and all-gathered on arrival, stages and interleaved chunks of equal layer counts; no sequence or context parallelism, no selective recomputation",
  "gemm_shapes": true, "gemm_k_overhead": 140,
  "attention": "materialized", "score_bytes": 13, "score_kept_bytes": 5,
  "selective_recompute": "none",
  "kernel_overhead_us": 2, "loss_buffers": 1, "runtime_buffers": false, "tp_all_to_all": false,
  "dp_overlap": false, "max_zero": 0, "sequence_parallel": false, "context_parallel": false,
  "pipeline_outputs_kept": true, "pipeline_gradient_sets": false,
  "pipeline_activation_slots": false, "pp_scatter_gather": true, "pipeline_even_split": true})json"},
    {"megatron-2022", R"json({
  "name": "megatron-2022", "extends": "megatron-2021",
  "description": "Megatron-LM as Korthikanti et al. 2022 ran it: the megatron-2021 kernels with sequence parallelism and selective recomputation of the core attention; no context parallelism",
  "selective_recompute": "core_attention", "sequence_parallel": true})json"},
    {"deepspeed-zero3-2021", R"json({
  "name": "deepspeed-zero3-2021",
  "description": "DeepSpeed ZeRO-3 (v0.3, spring 2021) on Megatron's GPT kernels (Narayanan et al. 2021, Table 2's baseline): one all-gather a parameter tensor, each after a device synchronisation (no prefetch overlap), tensors under 100K elements kept whole, parameters re-gathered for the backward beyond a reuse distance of 1e9 elements, one fp16 reduce-scatter a gradient tensor, torch.distributed's list forms; its gathers and reduce-scatters at 0.3 of NCCL's bus bandwidth, the one figure chosen on a published run (Table 2's 384-GPU row)",
  "gemm_shapes": true, "gemm_k_overhead": 140,
  "attention": "materialized", "score_bytes": 13, "score_kept_bytes": 5,
  "kernel_overhead_us": 2, "loss_buffers": 1, "runtime_buffers": false,
  "dp_overlap": true, "sequence_parallel": false, "context_parallel": false, "selective_recompute": "none", "tp_all_to_all": false,
  "zero3_prefetch_layers": 0, "zero3_tensor_messages": true,
  "zero3_persist_elements": 1e5, "zero3_reuse_elements": 1e9,
  "collective_list_copies": true, "reduce_bytes": 2,
  "collective_kinds": {"all_gather": 0.3, "reduce_scatter": 0.3}})json"},
    {"megatron-core", R"json({
  "name": "megatron-core",
  "description": "Megatron-Core with TransformerEngine: cuBLAS GEMMs, flash attention (cuDNN), fused norms and activations, distributed optimizer with gradient reduction overlapped in buckets of max(40M, 1M x DP) parameters and the updated parameters gathered bucket by bucket in the next forward (overlap_param_gather, as the Megatron-LM README's runs and Megatron-Bridge's recipes set it), NCCL's 16 channels (SMs) held while a data-parallel collective runs beside the compute, no TP communication overlap unless pinned, the loss as Megatron-Core's default unfused vocab-parallel cross-entropy (an fp32 copy of the logits, then max, subtract, exp, sum and divide in place, its gradient scaled and cast back: 52 bytes a bf16 logit against a fused kernel's 6), the expert all-to-all one copy an expert in the model's dtype, the experts' GEMMs one cuBLAS GEMM an expert on 4 streams (TransformerEngine's GroupedLinear on Hopper), each quantising its own rows under FP8, their gated pair and activation kept in bf16 for the backward, under FP8 the sequence-parallel gathers (inputs, output gradients) quantised first",
  "gemm_shapes": true, "gemm_k_overhead": 140,
  "attention": "flash", "flash_efficiency": 0.7, "flash_key_overhead": 135, "flash_backward_rate": 0.86,
  "selective_recompute": "core_attention",
  "elementwise_passes": {"cross_entropy": 8.67},
  "fp8_casts": {"activations": 2, "weights": 0}, "tp_gather_fp8": true, "tp_all_to_all": false, "ep_dispatch_fp8": false, "expert_gemm_streams": 4,
  "expert_folding": true, "expert_kept_bytes": 6,
  "kernel_overhead_us": 2, "loss_buffers": 1, "runtime_buffers": false,
  "dp_overlap": true, "dp_bucket_params": 4e7, "dp_bucket_params_per_rank": 1e6, "dp_param_gather_overlap": true,
  "dp_overlap_sms": 16,
  "max_zero": 1, "gradient_fusion": true, "pp_overlap": true,
  "pipeline_outputs_kept": false, "pipeline_gradient_sets": false,
  "pipeline_activation_slots": false})json"},
    {"megatron-bridge", R"json({
  "name": "megatron-bridge", "extends": "megatron-core",
  "description": "NVIDIA's Megatron-Bridge performance recipes (NeMo containers of 2026) on Megatron-Core with TransformerEngine: the megatron-core profile with the TP collectives decomposed with their GEMMs through userbuffers (sequence parallelism's all-gathers and reduce-scatters as ring exchanges beside the GEMM chunks, the reduce-scatters' GEMMs in 4 chunks leaving 16 SMs to them), pipeline exchanges overlapped with interleaved stages, FP8 with current scaling (each cast reads its bf16 operand twice, the amax then the cast-transpose: 3 passes), TransformerEngine's fused cross-entropy (two reads of the logits and the gradient written in the forward, scaled in the backward: 10 bytes a logit), gradients reduced in bf16 (every recipe's grad_reduce_in_fp32 = False)",
  "tp_overlap_gemms": true, "tp_overlap_sms": 16, "tp_overlap_splits": 4,
  "fp8_casts": {"activations": 3, "weights": 0}, "elementwise_passes": {"cross_entropy": 1.67},
  "reduce_bytes": 2})json"},
    {"deepseek-v3", R"json({
  "name": "deepseek-v3",
  "description": "DeepSeek's own stack as the DeepSeek-V3 report (sections 3.2-3.3) documents it: DualPipe overlapping the expert all-to-all with the other direction's compute (its bubble is costed as 1F1B's), 20 of 132 SMs given to communication, the dispatch sent once a node (group-limited routing: at most 4 nodes) and fanned out over NVLink, FP8 GEMMs with the activations quantised in the kernel before, RMSNorm and the up-projections recomputed, the experts' SwiGLU inputs cached in FP8 and their outputs recomputed, ZeRO-1",
  "gemm_shapes": true, "gemm_k_overhead": 140,
  "attention": "flash", "flash_efficiency": 0.7, "flash_key_overhead": 160, "flash_backward_rate": 0.86,
  "selective_recompute": "runtime",
  "fp8_casts": {"activations": 1, "weights": 0}, "expert_kept_bytes": 2, "tp_all_to_all": false,
  "kernel_overhead_us": 2, "loss_buffers": 1, "runtime_buffers": false,
  "ep_overlap": 1, "ep_node_dispatch": true, "compute_share": 0.848,
  "dp_overlap": true, "max_zero": 1, "gradient_fusion": true,
  "pipeline_outputs_kept": false, "pipeline_gradient_sets": false,
  "pipeline_activation_slots": false})json"},
    {"fsdp", R"json({
  "name": "fsdp",
  "description": "PyTorch FSDP2 in eager mode as torchtitan ran it in December 2024: cuBLAS GEMMs, SDPA's FlashAttention-2 kernels, RMSNorm, RoPE, SwiGLU and the fp32 loss as eager kernels, op-level selective checkpointing (every other GEMM and every elementwise op re-run), a layer's parameters gathered one layer ahead, copied out of the gather's buffer on the compute stream, and its gradients reduce-scattered as one message, NCCL's 16 channels (SMs) held while they run beside the compute; tensor parallelism as DTensor's, sequence parallelism on [batch, sequence, hidden] (each gather and reduce-scatter along the sequence a torch.cat of the pieces), Float8 tensorwise casting before its gathers",
  "gemm_shapes": true, "gemm_k_overhead": 140,
  "attention": "flash", "flash_efficiency": 0.465, "flash_key_overhead": 160, "flash_backward_rate": 0.86,
  "selective_recompute": "alternate_gemms",
  "elementwise_passes": {"norm": 9.5, "rope": 4, "swiglu": 1.7, "unary": 1, "cross_entropy": 6.7},
  "fp8_casts": {"activations": 3.75, "weights": 4}, "tp_gather_fp8": true, "sp_gather_copies": true, "tp_all_to_all": false,
  "kernel_overhead_us": 2, "loss_buffers": 3, "runtime_buffers": false,
  "dp_overlap": true, "dp_overlap_sms": 16,
  "zero3_prefetch_layers": 1, "zero3_pipeline_unsharded": true, "zero3_copy_out": true,
  "pipeline_activation_slots": false})json"},
    {"fsdp-compile", R"json({
  "name": "fsdp-compile", "extends": "fsdp",
  "description": "the fsdp profile (torchtitan, December 2024) with each transformer block compiled by torch.compile: Inductor fuses each RMSNorm, RoPE and SwiGLU into one kernel; the loss, outside the blocks, stays eager",
  "elementwise_passes": {"norm": 1, "rope": 1, "swiglu": 1}})json"},
    {"parax-cuda", R"json({
  "name": "parax-cuda",
  "description": "parax's own CUDA backend as measured on one H200 (docs/cuda.md, 2026-12-04): cuBLAS GEMMs, its tensor-core attention kernel (5.3 TFLOP/s forward), one kernel an op, CUDA graphs, gradient buckets during the last backward, ZeRO-3 gathers one layer ahead",
  "gemm_shapes": true, "gemm_k_overhead": 140,
  "attention": "flash", "flash_efficiency": 0.0075, "flash_backward_rate": 0.77,
  "kernel_overhead_us": 1,
  "dp_overlap": true,
  "zero3_prefetch_layers": 1})json"},
};

// collective_kinds' and collective_size_curves' keys, by CollectiveKind.
const char *const kKindNames[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"};

Error fieldError(StringRef source, const Twine &field, const Twine &why) {
  return createStringError(inconvertibleErrorCode(), "%s: profile field '%s' %s",
                           source.str().c_str(), field.str().c_str(), why.str().c_str());
}

// A number in [lo, hi] (absent: `fallback`).
Expected<double> number(const json::Object &object, StringRef key, double lo, double hi,
                        double fallback, StringRef source, StringRef path = "") {
  std::string field = path.empty() ? key.str() : (path + "." + key).str();
  const json::Value *value = object.get(key);
  if (!value)
    return fallback;
  std::optional<double> n = value->getAsNumber();
  if (!n || !std::isfinite(*n))
    return fieldError(source, field, "must be a number");
  if (*n < lo || *n > hi)
    return fieldError(source, field,
                      formatv("must be in [{0}, {1}], got {2}", format("%g", lo), format("%g", hi),
                              format("%g", *n)));
  return *n;
}

Expected<bool> boolean(const json::Object &object, StringRef key, bool fallback,
                       StringRef source) {
  const json::Value *value = object.get(key);
  if (!value)
    return fallback;
  std::optional<bool> b = value->getAsBoolean();
  if (!b)
    return fieldError(source, key, "must be true or false");
  return *b;
}

} // namespace

StringRef parax::plan::toString(AttentionKernel kind) {
  return kind == AttentionKernel::Flash ? "flash" : "materialized";
}

StringRef parax::plan::toString(SelectiveRecompute policy) {
  switch (policy) {
  case SelectiveRecompute::Runtime: return "runtime";
  case SelectiveRecompute::CoreAttention: return "core_attention";
  case SelectiveRecompute::AlternateGemms: return "alternate_gemms";
  case SelectiveRecompute::None: return "none";
  }
  return "runtime";
}

Expected<Profile> parax::plan::parseProfile(StringRef text, StringRef source) {
  Expected<json::Value> parsed = json::parse(text);
  if (!parsed)
    return createStringError(inconvertibleErrorCode(), "%s: invalid JSON: %s",
                             source.str().c_str(), toString(parsed.takeError()).c_str());
  const json::Object *root = parsed->getAsObject();
  if (!root)
    return createStringError(inconvertibleErrorCode(), "%s: a profile must be a JSON object",
                             source.str().c_str());
  static const StringRef known[] = {
      "name", "extends", "description", "gemm_shapes", "gemm_k_overhead", "gemm_unhidden", "attention", "selective_recompute",
      "flash_efficiency", "flash_key_overhead", "flash_backward_rate", "score_bytes", "score_kept_bytes", "expert_kept_bytes", "elementwise_passes", "kernel_overhead_us",
      "collective_efficiency", "tp_overlap", "ep_overlap", "dp_overlap", "dp_bucket_params",
      "dp_bucket_params_per_rank", "dp_param_gather_overlap", "dp_overlap_sms",
      "zero3_prefetch_layers", "zero3_bucket_mb", "reduce_bucket_mb", "max_zero",
      "nccl_protocols", "optimizer_bytes", "experts_efficiency", "expert_imbalance", "expert_gemm_streams", "collective_kinds", "collective_size_curves",
      "zero3_tensor_messages", "zero3_persist_elements", "zero3_reuse_elements",
      "collective_list_copies", "reduce_bytes", "gradient_fusion",
      "pipeline_outputs_kept", "pipeline_gradient_sets", "pipeline_activation_slots", "fp8_casts", "loss_buffers",
      "runtime_buffers", "zero3_pipeline_unsharded", "zero3_copy_out", "tp_gather_fp8", "sp_gather_copies", "tp_all_to_all", "ep_node_dispatch", "ep_dispatch_fp8", "expert_folding", "ep_overlap_compute", "tp_overlap_backward", "tp_overlap_sms", "tp_overlap_splits", "ep_overlap_sms", "pp_overlap", "pp_scatter_gather", "pipeline_even_split", "tp_overlap_gemms", "sequence_parallel", "context_parallel",
      "compute_share"};
  for (const auto &entry : *root)
    if (!is_contained(known, StringRef(entry.first)))
      return fieldError(source, entry.first.str(),
                        "is not a profile field (known: " + join(ArrayRef<StringRef>(known), ", ") + ")");
  Profile p;
  std::optional<StringRef> name = root->getString("name");
  if (!name || name->empty())
    return fieldError(source, "name", "is missing (a profile must be named)");
  // "extends": a shipped profile's fields, those given here replacing them.
  const json::Value *base = root->get("extends");
  if (base) {
    std::optional<StringRef> baseName = base->getAsString();
    std::vector<std::string> shipped = profileNames();
    if (!baseName || !is_contained(shipped, baseName->str()))
      return fieldError(source, "extends", "must name a shipped profile (" + join(shipped, ", ") + ")");
    Expected<Profile> from = resolveProfile(*baseName);
    if (!from)
      return from.takeError();
    p = std::move(*from);
  }
  p.name = name->str();
  if (const json::Value *d = root->get("description")) {
    if (!d->getAsString())
      return fieldError(source, "description", "must be a string");
    p.description = d->getAsString()->str();
  } else if (!base && !p.isRoofline()) {
    p.description = "";
  }
  auto shapes = boolean(*root, "gemm_shapes", p.gemmShapes, source);
  if (!shapes)
    return shapes.takeError();
  p.gemmShapes = *shapes;
  struct Field {
    StringRef key;
    double *target;
    double lo, hi, scale;
  };
  double bucket = p.zero3BucketBytes / 1e6, reduce = p.reduceBucketBytes / 1e6,
         overheadUs = p.kernelOverhead * 1e6, prefetch = p.zero3Prefetch,
         maxZero = p.maxZero, streams = p.expertGemmStreams, overlapSms = p.tpOverlapSms,
         overlapSplits = p.tpOverlapSplits, epSms = p.epOverlapSms, dpSms = p.dpOverlapSms;
  Field fields[] = {
      {"gemm_k_overhead", &p.gemmKOverhead, 0, 1e5, 1},
      {"gemm_unhidden", &p.gemmUnhidden, 0, 1, 1},
      {"flash_efficiency", &p.flashEfficiency, 1e-4, 1, 1},
      {"flash_key_overhead", &p.flashKeyOverhead, 0, 1e6, 1},
      {"flash_backward_rate", &p.flashBackwardRate, 0.01, 10, 1},
      {"score_bytes", &p.scoreBytes, 0, 1e3, 1},
      {"score_kept_bytes", &p.scoreKeptBytes, 0, 1e3, 1},
      {"expert_kept_bytes", &p.expertKeptBytes, 0, 1e3, 1},
      {"kernel_overhead_us", &overheadUs, 0, 1e4, 1},
      {"collective_efficiency", &p.collectiveEfficiency, 1e-3, 1, 1},
      {"tp_overlap", &p.tpOverlap, 0, 1, 1},
      {"ep_overlap", &p.epOverlap, 0, 1, 1},
      {"zero3_prefetch_layers", &prefetch, 0, 64, 1},
      {"zero3_bucket_mb", &bucket, 0, 1e7, 1},
      {"reduce_bucket_mb", &reduce, 0, 1e7, 1},
      {"max_zero", &maxZero, 0, 3, 1},
      {"optimizer_bytes", &p.optimizerBytes, 1e-3, 1e6, 1},
      {"experts_efficiency", &p.expertsEfficiency, 1e-3, 1, 1},
      {"expert_imbalance", &p.expertImbalance, 1, 100, 1},
      {"expert_gemm_streams", &streams, 0, 1024, 1},
      {"tp_overlap_sms", &overlapSms, 0, 1024, 1},
      {"tp_overlap_splits", &overlapSplits, 0, 1024, 1},
      {"ep_overlap_sms", &epSms, 0, 1024, 1},
      {"dp_overlap_sms", &dpSms, 0, 1024, 1},
      {"loss_buffers", &p.lossBuffers, 0, 100, 1},
      {"compute_share", &p.computeShare, 0.05, 1, 1},
      {"zero3_persist_elements", &p.zero3PersistElements, 0, 1e15, 1},
      {"zero3_reuse_elements", &p.zero3ReuseElements, 0, 1e15, 1},
      {"reduce_bytes", &p.reduceBytes, 0.5, 8, 1},
      {"dp_bucket_params", &p.dpBucketParams, 0, 1e15, 1},
      {"dp_bucket_params_per_rank", &p.dpBucketParamsPerRank, 0, 1e15, 1},
  };
  for (Field &f : fields) {
    auto v = number(*root, f.key, f.lo, f.hi, *f.target, source);
    if (!v)
      return v.takeError();
    *f.target = *v;
  }
  // The counts (read as numbers above): whole.
  struct Count {
    StringRef key;
    double value;
    int *target;
    StringRef rule;
  };
  Count counts[] = {
      {"zero3_prefetch_layers", prefetch, &p.zero3Prefetch, "must be a whole number"},
      {"max_zero", maxZero, &p.maxZero, "must be 0, 1, 2 or 3"},
      {"expert_gemm_streams", streams, &p.expertGemmStreams, "must be a whole number"},
      {"tp_overlap_sms", overlapSms, &p.tpOverlapSms, "must be a whole number"},
      {"tp_overlap_splits", overlapSplits, &p.tpOverlapSplits, "must be a whole number"},
      {"ep_overlap_sms", epSms, &p.epOverlapSms, "must be a whole number"},
      {"dp_overlap_sms", dpSms, &p.dpOverlapSms, "must be a whole number"},
  };
  for (const Count &c : counts) {
    if (c.value != std::floor(c.value))
      return fieldError(source, c.key.str(), c.rule.str());
    *c.target = static_cast<int>(c.value);
  }
  p.kernelOverhead = overheadUs * 1e-6;
  p.zero3BucketBytes = bucket * 1e6;
  p.reduceBucketBytes = reduce * 1e6;
  if (const json::Value *a = root->get("attention")) {
    std::optional<StringRef> kind = a->getAsString();
    if (!kind || (*kind != "flash" && *kind != "materialized"))
      return fieldError(source, "attention", "must be \"flash\" or \"materialized\"");
    p.attention = *kind == "flash" ? AttentionKernel::Flash : AttentionKernel::Materialized;
  }
  if (const json::Value *a = root->get("selective_recompute")) {
    std::optional<StringRef> policy = a->getAsString();
    auto parsed = policy ? StringSwitch<std::optional<SelectiveRecompute>>(*policy)
                               .Case("runtime", SelectiveRecompute::Runtime)
                               .Case("core_attention", SelectiveRecompute::CoreAttention)
                               .Case("alternate_gemms", SelectiveRecompute::AlternateGemms)
                               .Case("none", SelectiveRecompute::None)
                               .Default(std::nullopt)
                         : std::nullopt;
    if (!parsed)
      return fieldError(source, "selective_recompute",
                        "must be \"runtime\", \"core_attention\", \"alternate_gemms\" or \"none\"");
    p.selectiveRecompute = *parsed;
  }
  if (p.attention == AttentionKernel::Materialized && p.scoreBytes <= 0)
    return fieldError(source, "score_bytes",
                      "must be positive for a materialized attention (the bytes a score "
                      "element moves)");
  if (p.attention == AttentionKernel::Materialized && p.scoreKeptBytes <= 0)
    return fieldError(source, "score_kept_bytes",
                      "must be positive for a materialized attention (the bytes a score "
                      "element keeps for the backward pass)");
  if (const json::Value *passes = root->get("elementwise_passes")) {
    const json::Object *object = passes->getAsObject();
    if (!object)
      return fieldError(source, "elementwise_passes",
                        "must map op classes (norm, rope, swiglu, unary, add, cross_entropy) to numbers");
    for (const auto &entry : *object) {
      StringRef key = entry.first;
      double *target = key == "norm"     ? &p.normPasses
                       : key == "rope"   ? &p.ropePasses
                       : key == "swiglu" ? &p.swigluPasses
                       : key == "unary"  ? &p.unaryPasses
                       : key == "add"    ? &p.addPasses
                       : key == "cross_entropy" ? &p.crossEntropyPasses
                                         : nullptr;
      if (!target)
        return fieldError(source, ("elementwise_passes." + key).str(),
                          "is not an op class (known: norm, rope, swiglu, unary, add, cross_entropy)");
      auto v = number(*object, key, 0.01, 100, 1, source, "elementwise_passes");
      if (!v)
        return v.takeError();
      *target = *v;
    }
  }
  if (const json::Value *casts = root->get("fp8_casts")) {
    const json::Object *object = casts->getAsObject();
    if (!object)
      return fieldError(source, "fp8_casts",
                        "must be an object, e.g. {\"activations\": 2, \"weights\": 0}");
    for (const auto &entry : *object) {
      StringRef key = entry.first;
      if (key != "activations" && key != "weights")
        return fieldError(source, ("fp8_casts." + key).str(),
                          "is not an fp8 cast (known: activations, weights)");
      auto passes = number(*object, key, 0, 1e3, 0, source, "fp8_casts");
      if (!passes)
        return passes.takeError();
      (key == "activations" ? p.fp8ActivationPasses : p.fp8WeightPasses) = *passes;
    }
  }
  if (const json::Value *value = root->get("collective_kinds")) {
    const json::Object *object = value->getAsObject();
    if (!object)
      return fieldError(source, "collective_kinds",
                        "must map collective kinds (all_reduce, all_gather, reduce_scatter, all_to_all, "
                        "send_recv) to shares of the bus bandwidth");
    for (const auto &entry : *object) {
      const char *const *found = llvm::find(kKindNames, entry.first.str());
      if (found == std::end(kKindNames))
        return fieldError(source, ("collective_kinds." + entry.first.str()),
                          "is not a collective kind (known: all_reduce, all_gather, reduce_scatter, "
                          "all_to_all, send_recv)");
      auto v = number(*object, entry.first, 1e-4, 100, 1, source, "collective_kinds");
      if (!v)
        return v.takeError();
      p.kindEfficiency[found - std::begin(kKindNames)] = *v;
    }
  }
  if (const json::Value *value = root->get("collective_size_curves")) {
    const json::Object *object = value->getAsObject();
    if (!object)
      return fieldError(source, "collective_size_curves",
                        "must map collective kinds to lists of [MB, share] pairs");
    for (const auto &entry : *object) {
      const char *const *found = llvm::find(kKindNames, entry.first.str());
      std::string field = "collective_size_curves." + entry.first.str();
      auto bad = [&](const Twine &why) { return fieldError(source, field, why); };
      if (found == std::end(kKindNames))
        return bad("is not a collective kind (known: all_reduce, all_gather, reduce_scatter, all_to_all, "
                   "send_recv)");
      std::vector<std::pair<double, double>> &curve = p.sizeCurves[found - std::begin(kKindNames)];
      const json::Array *points = entry.second.getAsArray();
      if (!points)
        return bad("must be a list of [MB, share] pairs");
      for (auto [i, point] : llvm::enumerate(*points)) {
        const json::Array *pair = point.getAsArray();
        std::optional<double> mb = pair && pair->size() == 2 ? (*pair)[0].getAsNumber() : std::nullopt,
                              share = pair && pair->size() == 2 ? (*pair)[1].getAsNumber() : std::nullopt;
        if (!mb || !share)
          return bad(formatv("[{0}] must be an [MB, share] pair of numbers", i));
        if (!(*mb > 0) || !std::isfinite(*mb) || !(*share > 0) || !(*share <= 1))
          return bad(formatv("[{0}]: MB must be positive and the share in (0, 1], got [{1}, {2}]", i,
                             format("%g", *mb), format("%g", *share)));
        if (!curve.empty() && !(*mb * 1e6 > curve.back().first))
          return bad(formatv("[{0}]: MB must ascend ({1} after {2})", i, format("%g", *mb),
                             format("%g", curve.back().first / 1e6)));
        curve.emplace_back(*mb * 1e6, *share);
      }
    }
  }
  auto nccl = boolean(*root, "nccl_protocols", p.ncclProtocols, source);
  if (!nccl)
    return nccl.takeError();
  p.ncclProtocols = *nccl;
  for (auto [key, target] : {std::pair{"dp_overlap", &p.dpOverlap},
                             std::pair{"dp_param_gather_overlap", &p.dpParamGatherOverlap},
                             std::pair{"zero3_tensor_messages", &p.zero3TensorMessages},
                             std::pair{"collective_list_copies", &p.collectiveListCopies},
                             std::pair{"gradient_fusion", &p.gradientFusion},
                             std::pair{"pipeline_outputs_kept", &p.pipelineOutputsKept},
                             std::pair{"pipeline_gradient_sets", &p.pipelineGradientSets},
                             std::pair{"pipeline_activation_slots", &p.pipelineActivationSlots},
                             std::pair{"runtime_buffers", &p.runtimeBuffers},
                             std::pair{"zero3_pipeline_unsharded", &p.zero3PipelineUnsharded},
                             std::pair{"zero3_copy_out", &p.zero3CopyOut},
                             std::pair{"tp_gather_fp8", &p.tpGatherFp8},
                             std::pair{"sp_gather_copies", &p.spGatherCopies},
                             std::pair{"tp_all_to_all", &p.tpAllToAll},
                             std::pair{"ep_node_dispatch", &p.epNodeDispatch},
                             std::pair{"ep_dispatch_fp8", &p.epDispatchFp8},
                             std::pair{"expert_folding", &p.expertFolding},
                             std::pair{"ep_overlap_compute", &p.epOverlapCompute},
                             std::pair{"pp_overlap", &p.ppOverlap},
                             std::pair{"pp_scatter_gather", &p.ppScatterGather},
                             std::pair{"pipeline_even_split", &p.pipelineEvenSplit},
                             std::pair{"tp_overlap_gemms", &p.tpOverlapGemms},
                             std::pair{"tp_overlap_backward", &p.tpOverlapBackward},
                             std::pair{"sequence_parallel", &p.sequenceParallel},
                             std::pair{"context_parallel", &p.contextParallel}}) {
    auto flag = boolean(*root, key, *target, source);
    if (!flag)
      return flag.takeError();
    *target = *flag;
  }
  return p;
}

std::string Profile::toJson() const {
  json::Object root{
      {"name", name},
      {"description", description},
      {"gemm_shapes", gemmShapes},
      {"gemm_k_overhead", gemmKOverhead},
      {"gemm_unhidden", gemmUnhidden},
      {"attention", toString(attention)},
      {"selective_recompute", toString(selectiveRecompute)},
      {"flash_efficiency", flashEfficiency},
      {"flash_key_overhead", flashKeyOverhead},
      {"flash_backward_rate", flashBackwardRate},
      {"score_bytes", scoreBytes},
      {"score_kept_bytes", scoreKeptBytes},
      {"expert_kept_bytes", expertKeptBytes},
      {"elementwise_passes",
       json::Object{{"norm", normPasses}, {"rope", ropePasses}, {"swiglu", swigluPasses},
                    {"unary", unaryPasses}, {"add", addPasses}, {"cross_entropy", crossEntropyPasses}}},
      {"fp8_casts", json::Object{{"activations", fp8ActivationPasses}, {"weights", fp8WeightPasses}}},
      {"optimizer_bytes", optimizerBytes},
      {"experts_efficiency", expertsEfficiency},
      {"expert_imbalance", expertImbalance},
      {"expert_gemm_streams", expertGemmStreams},
      {"kernel_overhead_us", kernelOverhead * 1e6},
      {"collective_efficiency", collectiveEfficiency},
      {"nccl_protocols", ncclProtocols},
      {"collective_kinds",
       json::Object{{"all_reduce", kindEfficiency[0]}, {"all_gather", kindEfficiency[1]},
                    {"reduce_scatter", kindEfficiency[2]}, {"all_to_all", kindEfficiency[3]},
                    {"send_recv", kindEfficiency[4]}}},
      {"collective_size_curves", [&] {
         json::Object curves;
         for (int k = 0; k < 5; ++k)
           if (!sizeCurves[k].empty()) {
             json::Array points;
             for (auto [bytes, share] : sizeCurves[k])
               points.push_back(json::Array{bytes / 1e6, share});
             curves[kKindNames[k]] = std::move(points);
           }
         return curves;
       }()},
      {"tp_overlap", tpOverlap},
      {"ep_overlap", epOverlap},
      {"dp_overlap", dpOverlap},
      {"dp_bucket_params", dpBucketParams},
      {"dp_bucket_params_per_rank", dpBucketParamsPerRank},
      {"dp_param_gather_overlap", dpParamGatherOverlap},
      {"zero3_prefetch_layers", zero3Prefetch},
      {"zero3_bucket_mb", zero3BucketBytes / 1e6},
      {"reduce_bucket_mb", reduceBucketBytes / 1e6},
      {"zero3_tensor_messages", zero3TensorMessages},
      {"zero3_persist_elements", zero3PersistElements},
      {"zero3_reuse_elements", zero3ReuseElements},
      {"collective_list_copies", collectiveListCopies},
      {"reduce_bytes", reduceBytes},
      {"gradient_fusion", gradientFusion},
      {"pipeline_outputs_kept", pipelineOutputsKept},
      {"pipeline_gradient_sets", pipelineGradientSets},
      {"pipeline_activation_slots", pipelineActivationSlots},
      {"loss_buffers", lossBuffers},
      {"runtime_buffers", runtimeBuffers},
      {"zero3_pipeline_unsharded", zero3PipelineUnsharded},
      {"zero3_copy_out", zero3CopyOut},
      {"tp_gather_fp8", tpGatherFp8},
      {"sp_gather_copies", spGatherCopies},
      {"tp_all_to_all", tpAllToAll},
      {"ep_node_dispatch", epNodeDispatch},
      {"ep_dispatch_fp8", epDispatchFp8},
      {"expert_folding", expertFolding},
      {"ep_overlap_compute", epOverlapCompute},
      {"pp_overlap", ppOverlap},
      {"pp_scatter_gather", ppScatterGather},
      {"pipeline_even_split", pipelineEvenSplit},
      {"tp_overlap_gemms", tpOverlapGemms},
      {"tp_overlap_backward", tpOverlapBackward},
      {"tp_overlap_sms", tpOverlapSms},
      {"tp_overlap_splits", tpOverlapSplits},
      {"ep_overlap_sms", epOverlapSms},
      {"dp_overlap_sms", dpOverlapSms},
      {"sequence_parallel", sequenceParallel},
      {"context_parallel", contextParallel},
      {"compute_share", computeShare},
      {"max_zero", maxZero}};
  return formatv("{0:2}", json::Value(std::move(root))).str();
}

double Profile::sizeShare(int kind, double bytes) const {
  const std::vector<std::pair<double, double>> &sizeCurve = sizeCurves[kind];
  if (sizeCurve.empty())
    return 1;
  if (bytes <= sizeCurve.front().first)
    return sizeCurve.front().second;
  if (bytes >= sizeCurve.back().first)
    return sizeCurve.back().second;
  auto above = llvm::find_if(sizeCurve, [&](const auto &point) { return point.first >= bytes; });
  auto below = std::prev(above);
  double t = std::log(bytes / below->first) / std::log(above->first / below->first);
  return below->second + t * (above->second - below->second);
}

std::string Profile::summary() const {
  std::string attentionText =
      attention == AttentionKernel::Flash
          ? formatv("flash attention at {0:2} of the GEMM rate", flashEfficiency).str() +
                (flashKeyOverhead > 0
                     ? formatv(" times T / (T + {0}), T the keys a query sees", format("%g", flashKeyOverhead)).str()
                     : "") +
                (flashBackwardRate != 1 ? formatv(" (its backward at {0:2} of that)", flashBackwardRate).str() : "")
          : formatv("materialised attention ({0} bytes a score)", format("%g", scoreBytes)).str();
  std::string tpText =
      tpOverlapGemms ? std::string(tpOverlapBackward ? "TP collectives behind their GEMMs"
                                                     : "forward TP collectives behind their GEMMs") +
                           " (in chunks" +
                           (tpOverlapSms > 0 ? formatv(", {0} SMs to a reduce-scatter", tpOverlapSms).str()
                                             : std::string()) +
                           ")"
                     : formatv("TP overlap {0:2}", tpOverlap).str();
  // What the stack lacks, which the search then does not try.
  SmallVector<StringRef, 3> lacks;
  if (!sequenceParallel)
    lacks.push_back("sequence parallelism");
  if (!contextParallel)
    lacks.push_back("context parallelism");
  if (selectiveRecompute == SelectiveRecompute::None)
    lacks.push_back("selective recomputation");
  if (!lacks.empty())
    tpText += ", no " + join(lacks, ", no ");
  if (maxZero < 3)
    tpText += formatv(", ZeRO up to {0}", maxZero).str();
  return formatv("profile {0}: GEMMs {1}, {2}, {3} us a kernel, DP sync {4}, {5}{7}{6}",
                 name, gemmShapes ? "by shape (tile/wave quantisation)" : "at a fixed efficiency",
                 attentionText, format("%g", kernelOverhead * 1e6),
                 !dpOverlap ? std::string("after the backward")
                 : dpBucketParams > 0 || dpBucketParamsPerRank > 0
                     ? formatv("behind the last backward in buckets of max({0}, {1} x DP) parameters, the first "
                               "layers' exposed{2}",
                               format("%g", dpBucketParams), format("%g", dpBucketParamsPerRank),
                               dpParamGatherOverlap ? ", the parameters gathered in the next forward" : "")
                           .str()
                     : std::string("behind the last backward"),
                 tpText,
                 isRoofline() ? " -- ideal kernels, a lower bound on the step; --profile megatron-core, fsdp, "
                                "... for a real stack's costs"
                              : "",
                 std::string(ppOverlap ? ", interleaved stages' exchanges overlapped" : "") +
                     (ppScatterGather ? ", pipeline boundaries sent in tp pieces" : "") +
                     (pipelineEvenSplit ? ", stages of equal layer counts" : ""))
      .str();
}

std::vector<std::string> parax::plan::profileNames() {
  std::vector<std::string> names;
  for (const auto &profile : kProfiles)
    names.push_back(profile.first);
  llvm::sort(names);
  return names;
}

Expected<Profile> parax::plan::resolveProfile(StringRef spec) {
  for (const auto &profile : kProfiles)
    if (spec == profile.first)
      return parseProfile(profile.second, profile.first);
  ErrorOr<std::unique_ptr<MemoryBuffer>> file = MemoryBuffer::getFile(spec);
  if (!file)
    return createStringError(inconvertibleErrorCode(),
                             "profile '%s' is neither a shipped profile (%s) nor a readable "
                             "JSON file",
                             spec.str().c_str(), join(profileNames(), ", ").c_str());
  return parseProfile((*file)->getBuffer(), spec);
}

double parax::plan::gemmShapeEfficiency(double m, double n, double k, int64_t multiprocessors,
                                        double kOverhead) {
  if (m <= 0 || n <= 0 || k <= 0)
    return 1;
  // The output tiles a GEMM library picks from; a tile's own efficiency is
  // its arithmetic intensity (mt x nt / (mt + nt) multiply-adds a loaded
  // element) over that of a 128 x 128 tile, at most 1 (docs/cost-model.md).
  static const double tiles[][2] = {{256, 128}, {128, 256}, {128, 128},
                                    {128, 64},  {64, 128},  {64, 64}};
  double sms = std::max<int64_t>(multiprocessors, 1), best = 0;
  for (const auto &tile : tiles) {
    double mt = tile[0], nt = tile[1];
    double own = std::min(1.0, (mt * nt / (mt + nt)) / 64.0);
    double rows = std::ceil(m / mt), cols = std::ceil(n / nt);
    double quantised = (m * n) / (rows * mt * cols * nt);
    // Too few tiles to fill the device: the library splits k (split-K),
    // into pieces of at least 512.
    double splits = std::max(1.0, std::min(std::floor(sms / (rows * cols)), std::floor(k / 512)));
    double count = rows * cols * splits;
    double waves = std::ceil(count / sms);
    double occupancy = count / (waves * sms);
    best = std::max(best, own * quantised * occupancy);
  }
  return best * k / (k + kOverhead);
}
