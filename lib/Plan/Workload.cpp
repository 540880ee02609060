//===- Workload.cpp - parsing workload descriptions -----------------------===//

#include "parax/Plan/Workload.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"

#include <cmath>

using namespace llvm;
using namespace parax::plan;

StringRef parax::plan::toString(WorkloadKind kind) {
  switch (kind) {
  case WorkloadKind::Train: return "train";
  case WorkloadKind::Prefill: return "prefill";
  case WorkloadKind::Decode: return "decode";
  }
  return "?";
}
StringRef parax::plan::toString(Objective objective) {
  return objective == Objective::Latency ? "latency" : "throughput";
}
StringRef parax::plan::toString(Schedule schedule) {
  switch (schedule) {
  case Schedule::GPipe: return "gpipe";
  case Schedule::OneFOneB: return "1f1b";
  case Schedule::Interleaved: return "interleaved";
  }
  return "?";
}
StringRef parax::plan::toString(Recompute recompute) {
  switch (recompute) {
  case Recompute::None: return "none";
  case Recompute::Selective: return "selective";
  case Recompute::Full: return "full";
  }
  return "?";
}

int64_t parax::plan::dtypeBytes(StringRef dtype) {
  return StringSwitch<int64_t>(dtype)
      .Cases({"bf16", "f16"}, 2)
      .Case("f32", 4)
      .Cases({"fp8", "int8"}, 1)
      .Default(0);
}

std::string Workload::toString() const {
  std::string text =
      formatv("{0}:batch={1}", plan::toString(kind), batch).str();
  if (kind == WorkloadKind::Decode)
    text += formatv(",context={0}", context).str() + (kvDtype.empty() ? "" : ",kv=" + kvDtype);
  else
    text += formatv(",seq={0}", seq).str();
  if (microBatch)
    text += formatv(",mbs={0}", microBatch).str();
  if (expertCapacity)
    text += formatv(",capacity={0}", format("%g", *expertCapacity)).str();
  if (!gemmDtype.empty())
    text += ",gemm=" + gemmDtype;
  if (sequenceParallel)
    text += *sequenceParallel ? ",sp=1" : ",sp=0";
  if (attention)
    text += ",attention=" + plan::toString(*attention).str();
  return text;
}

static Error workloadError(StringRef spec, const Twine &why) {
  return createStringError(inconvertibleErrorCode(), "workload '%s': %s",
                           spec.str().c_str(), why.str().c_str());
}

Expected<Workload> parax::plan::parseWorkload(StringRef spec) {
  auto [kindText, rest] = spec.split(':');
  Workload w;
  if (kindText == "train")
    w.kind = WorkloadKind::Train;
  else if (kindText == "prefill")
    w.kind = WorkloadKind::Prefill;
  else if (kindText == "decode")
    w.kind = WorkloadKind::Decode;
  else
    return workloadError(spec, "kind must be train, prefill or decode, got '" +
                                   kindText + "'");
  if (w.kind != WorkloadKind::Train)
    w.objective = Objective::Latency;

  SmallVector<StringRef> items;
  rest.split(items, ',', -1, /*KeepEmpty=*/false);
  for (StringRef item : items) {
    auto [key, value] = item.split('=');
    // (at most 2^31: counts beyond any cluster, whose products in bytes
    // and FLOPs would overflow the search's arithmetic)
    auto integer = [&](int64_t &out, int64_t minimum) -> Error {
      constexpr int64_t kMost = int64_t(1) << 31;
      if (value.getAsInteger(10, out) || out < minimum || out > kMost)
        return workloadError(spec, "'" + key + "' needs an integer in [" + Twine(minimum) + ", " +
                                       Twine(kMost) + "], got '" + value + "'");
      return Error::success();
    };
    auto pin = [&](std::optional<int64_t> &out) -> Error {
      int64_t number = 0;
      if (Error e = integer(number, 1))
        return e;
      out = number;
      return Error::success();
    };
    Error error = Error::success();
    if (key == "batch")
      error = integer(w.batch, 1);
    else if (key == "seq")
      error = integer(w.seq, 1);
    else if (key == "context")
      error = integer(w.context, 0);
    else if (key == "mbs")
      error = integer(w.microBatch, 1);
    else if (key == "tp")
      error = pin(w.tp);
    else if (key == "pp")
      error = pin(w.pp);
    else if (key == "dp")
      error = pin(w.dp);
    else if (key == "ep")
      error = pin(w.ep);
    else if (key == "cp")
      error = pin(w.cp);
    else if (key == "etp")
      error = pin(w.etp);
    else if (key == "kv") {
      if (!dtypeBytes(value))
        return workloadError(spec, "kv dtype must be bf16, f16, f32, fp8 or "
                                   "int8, got '" + value + "'");
      w.kvDtype = value.str();
    } else if (key == "objective") {
      if (value != "latency" && value != "throughput")
        return workloadError(spec, "objective must be latency or throughput");
      w.objective = value == "latency" ? Objective::Latency
                                       : Objective::Throughput;
    } else if (key == "latency_ms") {
      double ms;
      if (value.getAsDouble(ms) || !(ms > 0))
        return workloadError(spec, "latency_ms must be a positive number");
      w.latencyBound = ms * 1e-3;
    } else if (key == "zero") {
      int64_t stage;
      if (Error e = integer(stage, 0))
        return std::move(e);
      if (stage > 3)
        return workloadError(spec, "zero must be 0, 1, 2 or 3");
      w.zero = static_cast<int>(stage);
    } else if (key == "recompute") {
      auto r = StringSwitch<std::optional<Recompute>>(value)
                   .Case("none", Recompute::None)
                   .Case("selective", Recompute::Selective)
                   .Case("full", Recompute::Full)
                   .Default(std::nullopt);
      if (!r)
        return workloadError(spec, "recompute must be none, selective or full");
      w.recompute = *r;
    } else if (key == "schedule") {
      auto s = StringSwitch<std::optional<Schedule>>(value)
                   .Case("gpipe", Schedule::GPipe)
                   .Case("1f1b", Schedule::OneFOneB)
                   .Case("interleaved", Schedule::Interleaved)
                   .Default(std::nullopt);
      if (!s)
        return workloadError(spec, "schedule must be gpipe, 1f1b or interleaved");
      w.schedule = *s;
    } else if (key == "capacity") {
      double factor;
      if (value.getAsDouble(factor) || !(factor >= 1) || !std::isfinite(factor))
        return workloadError(
            spec,
            "capacity (the expert capacity: rows a rank's expert dispatch "
            "holds, per (token, choice) pair of its own) must be a number "
            ">= 1, got '" +
                value + "'");
      w.expertCapacity = factor;
    } else if (key == "gemm") {
      if (!StringSwitch<bool>(value)
               .Cases({"fp8", "bf16", "f16", "f32"}, true)
               .Default(false))
        return workloadError(spec, "gemm (the GEMMs' dtype) must be fp8, bf16, "
                                   "f16 or f32, got '" +
                                       value + "'");
      w.gemmDtype = value.str();
    } else if (key == "sp") {
      if (value != "0" && value != "1")
        return workloadError(spec, "sp (sequence parallelism) must be 0 or 1, got '" + value + "'");
      w.sequenceParallel = value == "1";
    } else if (key == "attention") {
      if (value != "flash" && value != "materialized")
        return workloadError(spec, "attention (the kernel kind) must be flash or "
                                   "materialized, got '" + value + "'");
      w.attention = value == "flash" ? AttentionKernel::Flash : AttentionKernel::Materialized;
    } else if (key == "chunks") {
      int64_t chunks;
      if (Error e = integer(chunks, 2))
        return std::move(e);
      w.chunks = chunks;
    } else {
      return workloadError(spec, "unknown key '" + key + "'");
    }
    if (error)
      return std::move(error);
  }
  if (w.batch <= 0)
    return workloadError(spec, "needs batch=N");
  int64_t tokens = w.batch * std::max<int64_t>(1, std::max(w.seq, w.context));
  if (tokens > (int64_t(1) << 40))
    return workloadError(spec, "batch x sequence (or context) is " + Twine(tokens) +
                                   " tokens a step, more than 2^40");
  if (w.kind == WorkloadKind::Decode) {
    if (w.context <= 0)
      return workloadError(spec, "decode needs context=N (tokens in the KV cache)");
  } else if (w.seq <= 0) {
    return workloadError(spec, toString(w.kind) + Twine(" needs seq=N"));
  }
  if (w.chunks && w.schedule && *w.schedule != Schedule::Interleaved)
    return workloadError(spec, "chunks is interleaved 1F1B's: schedule=" +
                                   Twine(plan::toString(*w.schedule)) + " has one a stage");
  if (w.microBatch && w.batch % w.microBatch)
    return workloadError(spec, "mbs must divide batch");
  if (w.cp && *w.cp > 1 && w.kind == WorkloadKind::Decode)
    return workloadError(spec, "context parallelism (cp) splits a prompt or a training "
                               "sequence; a decode step has one token a sequence");
  if (w.cp && w.seq % *w.cp)
    return workloadError(spec, "cp must divide seq");
  return w;
}
