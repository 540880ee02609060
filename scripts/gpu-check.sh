#!/usr/bin/env bash
# Every GPU check, in one run (device time is short): the CUDA backend
# against the CPU backend and numpy on every case of
# test/runtime/cuda_cases.py (each op's kernel alone -- test/runtime/cuda_ops.py
# -- and the tiny models: --loss, MoE, MLA, TP, PP, DP, EP and their mix),
# then GEMM and copy figures, attention kernels, one Llama-3-8B layer
# (prefill 2048, decode steps over a 4096-token KV cache joined by a concat,
# and generation steps writing it in place) and DeepSeek-V3-shaped
# experts at decode size (grouped GEMM vs per-expert cuBLAS). Results and
# logs go to $OUT (default ./gpu-out), saved case by case; then PyTorch's
# SDPA backends on the bench's attention shapes (bench/torch_attention.py,
# the anchor); first, what cuDNN's attention finds (parax-cudnn-probe).
# Timeouts sum to 600 s (a device command may run 10 minutes).
#
# On this workplace's GPU machine (no compiler there): run
# scripts/gpu-bundle.sh here first, then carry gpu-bundle/. Where the whole
# toolchain is present, `ctest -R numerics` runs the same cases (test_cuda.py).
#
# A second run may retry a subset: PARAX_GPU_CASES (comma-separated check
# cases, or "none") and PARAX_GPU_BENCH (bench cases, or "none"); the
# cuda bench runs unless PARAX_GPU_BENCH is set; PARAX_GPU_BENCH_TIMEOUT
# (seconds, default 200) bounds the bench.
#
# PARAX_GPU_RATES=1 also times, at the end, the GEMMs and attentions of the
# Hopper validation rows' layers against the rates parax's cost model
# charges (bench/kernel_rates.py, PyTorch only, at most 170 s: give the
# bench a subset then); PARAX_GPU_RATES=only runs that alone, without the
# bundle, and exits.
#
# Exit status: 0 all cases pass, 1 a case failed, 77 no GPU (skip).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${OUT:-$root/gpu-out}"
bundle="$root/gpu-bundle"
mkdir -p "$out"
exec > >(tee "$out/gpu-check.log") 2>&1

if ! nvidia-smi -L >"$out/nvidia-smi.txt" 2>&1 || ! grep -q '^GPU ' "$out/nvidia-smi.txt"; then
  echo "gpu-check: no GPU here (nvidia-smi lists none): skipped"
  exit 77
fi
cat "$out/nvidia-smi.txt"
py="${PARAX_PYTHON:-python3}" # the image's python3 has numpy (and PyTorch)
kernel_rates() {
  date +"%T"; echo "== the validation rows' GEMMs and attentions against parax's rates (not pass/fail) =="
  timeout 170 "$py" "$root/bench/kernel_rates.py" measure "$root/bench/kernel_rates.json" \
    "$out/kernel-rates.json" --budget 130 2>&1 | tee "$out/kernel-rates.txt" || echo "gpu-check: kernel rates failed"
}
if [[ "${PARAX_GPU_RATES:-}" == only ]]; then
  kernel_rates
  exit 0
fi
# The executables, gzipped by gpu-bundle.sh (the device tool carries 64 MiB).
for gz in "$bundle"/bin/*.gz; do
  [[ -f "$gz" && ! -x "${gz%.gz}" ]] && gunzip -kf "$gz"
done
if [[ ! -x "$bundle/bin/parax-run" ]]; then
  echo "gpu-check: $bundle/bin/parax-run missing: run scripts/gpu-bundle.sh first"
  exit 1
fi

# Runtime libraries: the bundle's packages, never overwriting the image's.
stage="$(mktemp -d)"
for deb in "$bundle"/debs/*.deb; do dpkg -x "$deb" "$stage"; done
cp -rn "$stage"/. / 2>/dev/null || true
rm -rf "$stage"
ldconfig 2>/dev/null || true
libs=/usr/lib/x86_64-linux-gnu
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib \
         $(python3 -c 'import glob, site; print(" ".join(glob.glob(site.getsitepackages()[0] + "/nvidia/*/lib")))' 2>/dev/null); do
  [[ -d "$d" ]] && libs="$libs:$d"
done
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ldd "$bundle/bin/parax-run" >"$out/ldd.txt" 2>&1
if grep -q "not found" "$out/ldd.txt"; then
  echo "gpu-check: parax-run has unresolved libraries:"; grep "not found" "$out/ldd.txt"
fi
(mpirun --version | head -1) 2>&1 || echo "gpu-check: no mpirun (multi-rank cases will fail)"

# The cases' shared weights and results, gzipped by gpu-bundle.sh (the
# device tool carries 64 MiB): unpacked once into the bundle.
if [[ -f "$bundle/shared.tar.gz" && ! -d "$bundle/shared" ]]; then
  tar -xzf "$bundle/shared.tar.gz" -C "$bundle" 2>/dev/null ||
    "$py" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      "$bundle/shared.tar.gz" "$bundle" ||
    { echo "gpu-check: cannot unpack $bundle/shared.tar.gz"; exit 1; }
fi
status=0
# What cuDNN's attention finds here (its version; whether the SDPA graphs of
# the bench's and the cases' shapes build), and cuDNN's description of the
# device: with it a machine without this GPU can build plans for it.
date +"%T"; echo "== cuDNN attention probe (not pass/fail) =="
timeout 60 "$bundle/bin/parax-cudnn-probe" "$out/cudnn-device-properties.json" 2>&1 | tee "$out/cudnn-probe.txt" ||
  echo "gpu-check: cuDNN probe exit ${PIPESTATUS[0]}"
date +"%T"; echo "== correctness: GPU vs CPU (and numpy for the models): 1e-4 fp32, 1e-5 relative per op, 3 % bf16 =="
# Every temporary turns to NaN after its last use (PARAX_CUDA_POISON_DEAD):
# on the GPU's real streams, a transfer or kernel that reads a temporary the
# shared arena may already have handed to another fails its case.
# (the cases the bundle holds: scripts/gpu-bundle.sh leaves one out for size)
cases="$(cd "$bundle/cases" && for d in */; do [ -f "$d/case.json" ] && printf '%s,' "${d%/}"; done)"
cases="${PARAX_GPU_CASES:-${cases%,}}"
if [[ "$cases" != none ]]; then
  PARAX_CUDA_POISON_DEAD=1 timeout 120 "$py" "$root/test/runtime/cuda_cases.py" check "$bundle/cases" \
    --bin "$bundle/bin" --json "$out/check.json" --case-timeout 60 --jobs 8 --cases "$cases" || status=1
fi
# Two ranks on the one GPU through NCCL itself (PARAX_COLLECTIVES=nccl: NCCL
# 2.30 or newer, NCCL_MULTI_RANK_GPU_ENABLE=1; an older NCCL stages them
# and the run names its version): TP2, PP2, EP2.
date +"%T"; echo "== ranks sharing the GPU through NCCL (PARAX_COLLECTIVES=nccl) =="
if [[ "${PARAX_GPU_CASES:-}" != none ]]; then
  PARAX_COLLECTIVES=nccl PARAX_CUDA_POISON_DEAD=1 timeout 50 "$py" "$root/test/runtime/cuda_cases.py" check \
    "$bundle/cases" --bin "$bundle/bin" --json "$out/check-nccl.json" --case-timeout 40 --jobs 3 \
    --cases llama-tp2,llama-pp2,qwen2-moe-ep2 || status=1
fi
date +"%T"; echo "== GEMM and HBM figures (not pass/fail) =="
if [[ -z "${PARAX_GPU_BENCH:-}" ]]; then
  timeout 80 "$bundle/bin/parax-cuda-bench" 2>&1 | tee "$out/cuda-bench.txt" || echo "gpu-check: cuda bench failed"
fi
date +"%T"; echo "== attention (and its gradient), Llama-3-8B layer, experts and training-step timings (not pass/fail) =="
if [[ "${PARAX_GPU_BENCH:-}" != none ]]; then
  timeout "${PARAX_GPU_BENCH_TIMEOUT:-200}" "$py" "$root/test/runtime/cuda_cases.py" bench "$bundle/cases" --bin "$bundle/bin" \
    --json "$out/bench.json" ${PARAX_GPU_BENCH:+--cases "$PARAX_GPU_BENCH"} || echo "gpu-check: bench failed"
fi
date +"%T"; echo "== PyTorch's SDPA backends on the bench's attention shapes (the anchor; not pass/fail) =="
if [[ "${PARAX_GPU_BENCH:-}" != none ]]; then
  timeout 90 "$py" "$root/bench/torch_attention.py" "$out/torch-attention.json" ||
    echo "gpu-check: torch attention failed"
fi
[[ "${PARAX_GPU_RATES:-}" == 1 ]] && kernel_rates
# Summary: pass counts, and each decode step against its HBM lower bound
# (weight and KV-cache bytes / the copy bandwidth measured above).
"$py" - "$out" "$bundle/cases" "$cases" >"$out/summary.txt" <<'PY' 2>&1
import json, os, re, sys
out, cases = sys.argv[1], sys.argv[2]
expected = 0 if sys.argv[3] == "none" else len(sys.argv[3].split(","))  # the cases asked for
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return []
check = load("check.json")
if check:
    print(f"correctness: {sum(r.get('ok', False) for r in check)} of {len(check)} cases pass "
          f"({sum(r.get('seconds', 0) for r in check):.0f} s)"
          + (f"; {expected - len(check)} of {expected} did not run" if expected else ""))
else:
    print("correctness: no results (the check did not run: see gpu-check.log)")
nccl = load("check-nccl.json")
if nccl:
    notes = sorted({r.get("collectives_note", "") for r in nccl} - {""})
    print(f"ranks sharing the GPU, PARAX_COLLECTIVES=nccl: {sum(r.get('ok', False) for r in nccl)} of {len(nccl)} "
          f"pass, {sum(not r.get('host_staged', True) for r in nccl)} through NCCL; " + ("; ".join(notes) or "no note"))
for r in check + nccl:
    if not r.get("ok"):
        error = r.get("error")
        print("  FAILED", r.get("case"), error[-400:].strip() if isinstance(error, str) else r)
bw = None
try:
    m = re.search(r"HBM: .* ([0-9.]+) TB/s", open(os.path.join(out, "cuda-bench.txt")).read())
    bw = float(m.group(1)) if m else None
except OSError:
    pass
bench = load("bench.json")
for r in bench:
    if "error" in r:
        print(f"{r['case']}: FAILED {r['error'][-400:].strip()}")
        continue
    if "host_ms" in r:  # a training step: the optimizer on the device and on the host
        # (The gradients alone: their step reads every gradient back to the
        # host; the device's own time for them is the profiled step's.)
        grads = r.get("gradients_device_ms")
        line = (f"{r['case']}: {r['params'] / 1e6:.0f}M parameters; a step's gradients {r['gradients_ms']:.3f} ms "
                f"read back to the host"
                + (f" ({grads:.3f} ms on the device, op by op)" if grads else "")
                + f", with AdamW on the device {r['device_ms']:.3f} ms"
                f"{'' if r['on_device'] else ' (NOT on the device)'}, on the host {r['host_ms']:.3f} ms"
                + (f": the optimizer about {r['device_ms'] - grads:.3f} ms on the device" if grads else ""))
        if bw:
            line += f"; HBM bound of the update {r['update_bytes'] / (bw * 1e12) * 1e3:.3f} ms"
        print(line)
        continue
    if "prefill_ms" in r:  # a whole generation loop
        line = (f"{r['case']}: prefill {r['prefill_ms']:.3f} ms, then {r['steps']} steps of "
                f"{r['step_ms_median']:.3f} ms (median), {r['tokens_per_s']} tokens/s; the step borrowed "
                f"{r['shared_parameters']} parameters and {r['shared_caches']} caches of the prefill program")
        if bw:
            bound_ms = (r["weight_bytes"] + r["kv_bytes"]) / (bw * 1e12) * 1e3
            line += f"; HBM bound of a step {bound_ms:.3f} ms ({r['step_ms_median'] / bound_ms:.2f}x)"
        print(line)
        continue
    line = f"{r['case']}: {r['step_ms_median_of_10']:.3f} ms, {r['tflops']:.1f} TFLOP/s"
    if r.get("kernel_ms"):  # a one-op bench: the step also reads its result back to the host
        line += (f" (the step, its result read back to the host); the kernel alone {r['kernel_ms']:.3f} ms, "
                 f"{r['kernel_tflops']:.1f} TFLOP/s")
    if "rows_vs_numpy" in r:  # the kernel checked at this shape too
        line += (f", sampled rows vs numpy {r['rows_vs_numpy']:.2e} (tolerance {r['tolerance']:.1e}) "
                 + ("ok" if r["ok"] else "FAILED"))
    if bw and "decode" in r["case"]:  # bytes it must read: weights (a layer's step) and KV cache
        read = r.get("weight_bytes", 0) + r.get("kv_bytes", 0)
        bound_ms = read / (bw * 1e12) * 1e3
        line += (f", HBM bound {bound_ms:.3f} ms for {read / 1e9:.3f} GB (weights "
                 f"{r.get('weight_bytes', 0) / 1e9:.3f}, KV cache {r.get('kv_bytes', 0) / 1e9:.3f}): the step takes "
                 f"{r['step_ms_median_of_10'] / bound_ms:.2f}x the bound")
    print(line)
    t = r.get("temporaries")
    if t:  # device memory of the step's temporaries
        print(f"    temporaries: {t['arena_bytes'] / 2**20:.1f} MiB shared (live at once "
              f"{t['live_bytes'] / 2**20:.1f} MiB, one allocation each {t['unshared_bytes'] / 2**20:.1f} MiB; "
              f"{t['in_place']} more written in place)")
    if r.get("device_bytes") and r.get("planned_bytes"):  # the planner's memory model, checked
        print(f"    device memory: {r['device_bytes'] / 1e9:.3f} GB allocated by parax-run; the planner "
              f"expected {(r['planned_bytes'] - 1.5e9) / 1e9:.3f} GB (+ its 1.5 GB reserve)")
    device_ms = r.get("profile_ms", {}).get("total")
    if r.get("planned_step_ms"):  # the planner's cost model (dgx-h200, one GPU), checked
        print(f"    step time: the planner expected {r['planned_step_ms']:.3f} ms; measured "
              f"{r['step_ms_median_of_10'] / r['planned_step_ms']:.2f}x that"
              + (f" (the device's work, op by op, {device_ms:.3f} ms: {device_ms / r['planned_step_ms']:.2f}x)"
                 if device_ms else ""))
    ops = {op: ms for op, ms in r.get("profile_ms", {}).items() if op != "total"}
    if ops:  # one extra step, kernel by kernel: where the time goes
        top = sorted(ops.items(), key=lambda kv: -kv[1])[:4]
        print("    by op: " + ", ".join(f"{op} {ms:.3f} ms" for op, ms in top))
# Attention: which ops went through cuDNN in the correctness cases, and the
# bench's attention against PyTorch's fastest SDPA backend at the shape.
paths = [r["attention_path"] for r in check if r.get("attention_path")]
if paths:
    reasons = sorted({p[2] for p in paths if p[2]})
    print(f"attention in the correctness cases: {sum(p[0] for p in paths)} of {sum(p[1] for p in paths)} op(s) "
          f"through cuDNN over {len(paths)} case(s); parax's kernels for: " + ("; ".join(reasons) or "none"))
torch_cases = load("torch-attention.json")
if isinstance(torch_cases, dict):
    print(f"PyTorch {torch_cases.get('torch')} (cuDNN {torch_cases.get('cudnn')}) on {torch_cases.get('device')}")
    best = {}
    for c in torch_cases.get("cases", []):
        if "error" in c:
            print(f"    torch {c['backend']} at {c['seq']}: refused ({c['error'][-120:]})")
            continue
        print(f"    torch {c['backend']} at {c['seq']}: forward {c['forward_ms']:.3f} ms "
              f"({c['forward_tflops']:.0f} TFLOP/s), backward {c['backward_ms']:.3f} ms "
              f"({c['backward_tflops']:.0f} TFLOP/s){'' if c['gqa'] else ', KV heads repeated'}")
        for kind in ("forward", "backward"):
            key = (c["seq"], kind)
            if key not in best or c[kind + "_ms"] < best[key][0]:
                best[key] = (c[kind + "_ms"], c["backend"])
    for r in bench:
        m = re.match(r"attention-(grad-)?llama3-8b-prefill(\d+)-bf16(-kernels)?$", r.get("case", ""))
        if not m or "error" in r:
            continue
        key = (int(m.group(2)), "backward" if m.group(1) else "forward")
        ms = r.get("kernel_ms") or r["step_ms_median_of_10"]
        path = r.get("attention_path")
        how = ("cuDNN" if path and path[0] else "parax's kernels") if path else "?"
        if key in best:
            print(f"{r['case']} ({how}): {ms:.3f} ms, {best[key][0] / ms:.2f}x the speed of torch's fastest "
                  f"{key[1]} ({best[key][1]}, {best[key][0]:.3f} ms)"
                  + (" [the grad op also re-runs the forward]" if key[1] == "backward" and how == "cuDNN" else ""))
# The same rows generated in one batch and as microbatches (each re-reads
# the weights): the planner's trade-off for inference, measured.
loops = [r for r in bench if "prefill_ms" in r and "error" not in r]
for r in loops:
    for q in loops:
        if q is not r and q.get("rows") == r.get("rows") and q.get("micro", 1) == 1 < r.get("micro", 1):
            print(f"{r['rows']} rows: {r['micro']} microbatches of {r['rows'] // r['micro']} take "
                  f"{r['step_ms_median']:.3f} ms a step, one batch {q['step_ms_median']:.3f} ms "
                  f"({r['step_ms_median'] / q['step_ms_median']:.2f}x); the planner expected "
                  f"{r.get('planned_step_ms', 0):.3f} and {q.get('planned_step_ms', 0):.3f} ms")
# A generation step (cache written in place at a run-time position) beside
# the decode step over the same cache joined by a concat: same bytes to read.
# (a one-op bench's kernel time where profiled: its step also reads the result back)
times = {r["case"]: r.get("kernel_ms") or r["step_ms_median_of_10"] for r in bench if "step_ms_median_of_10" in r}
for name, ms in times.items():
    forward = name.replace("attention-grad-", "attention-")
    if name != forward and forward in times:  # FlashAttention-2's backward takes about 2.5x its forward
        print(f"{name}: {ms:.3f} ms, {ms / times[forward]:.2f}x the forward's {times[forward]:.3f} ms")
    if name + "-cuda-cores" in times:  # the same kernel's work without tensor cores
        slow = times[name + "-cuda-cores"]
        print(f"{name}: tensor cores {ms:.3f} ms, CUDA cores {slow:.3f} ms ({slow / ms:.2f}x faster)")
    joined = name.replace("-generate", "")
    if "-generate" in name and joined in times:
        print(f"{name}: {ms:.3f} ms beside {times[joined]:.3f} ms for {joined} ({ms / times[joined]:.2f}x)")
PY
cat "$out/summary.txt"
grep -q "vs numpy .* FAILED" "$out/summary.txt" && status=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv >>"$out/nvidia-smi.txt" 2>&1
echo "gpu-check: exit $status"
exit $status
