#!/usr/bin/env python3
"""The GEMMs and attentions of published runs' layers, timed on the card,
against the rate parax's cost model charges for each (issue 43).

parax's Hopper validation rows (bench/validate.py) are 10-20 % optimistic
and every figure behind them is a kernel's best alone: mamf-finder's
GEMMs, FlashAttention-3's paper's attention rates. This bench holds those
figures to the card's own kernels at the rows' own shapes: each distinct
GEMM (bf16 or fp8) and attention of a row's decoder layer, as
`parax-plan --explain` gives it (the work on one device and the rate it
is costed at), timed alone on one GPU with PyTorch (cuBLAS through
torch.matmul and torch._scaled_mm; SDPA's FlashAttention-2 and cuDNN
backends), after the GPU has run GEMMs for a few seconds (the clocks
settled at the power limit, as in a training step).

  shapes  [--out F]   here, with the build: the rows' entries with parax's
                      rate on dgx-h100 and on dgx-h200 for one device (no
                      busy node: busy_node_matmul_share 1) -> F (default
                      bench/kernel_rates.json, committed; run it again
                      when the cost model changes)
  measure F OUT.json  on the GPU machine (PyTorch, no parax build):
                      times every entry (--budget seconds at most), writes
                      OUT.json and prints the comparison
  compare OUT.json [--shapes F]
                      the comparison again, from a measurement (with
                      parax's rates of a shapes file made since)

The comparison: each entry's measured forward TFLOP/s against parax's
(the same FLOP count for both: 2mnk a GEMM, parax's (2d + 5 + 2d) a
(query, key) pair an attention), the measured backward against the
forward (parax: a GEMM's data and weight gradients by their own shapes,
as --explain's "backward Nx" says; an attention's 2.5x the FLOPs at the
profile's flash_backward_rate of the forward's rate), and
per row, parax's time for its layer's timed kernels over the measured:
below 1, parax is optimistic about these kernels by that much.
What it leaves out: the experts' grouped GEMMs and the CP rows'
attention (a ring of chunks, not one kernel), the element-wise kernels,
everything a node of busy GPUs and the communication add. An attention
runs as one sequence of batch x heads (the kernels' grid is the same)
with as many KV heads as query heads.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_SHAPES = os.path.join(HERE, "kernel_rates.json")
# The card's preset, by the name CUDA gives it.
PRESETS = {"H100": "dgx-h100", "H200": "dgx-h200"}
DEVICE = "cuda"  # (a dry run of `measure` elsewhere sets another)
# The attention kernel a stack runs (TransformerEngine's fused attention
# is cuDNN's; torchtitan's SDPA on Hopper picks FlashAttention-2).
STACK_KERNEL = {"megatron-core": "cudnn", "megatron-bridge": "cudnn", "fsdp": "flash", "fsdp-compile": "flash"}

GEMM_LINE = re.compile(r"^\s+parax\.(linear|head_linear)\s+\S+\s+[0-9.]+\s+(?:(\d+) x )?\[(\d+) x (\d+)\] x "
                       r"\[\d+ x (\d+)\] (\S+), (\d+) TFLOP/s(?:, backward ([0-9.]+)x)?$")
ATTENTION_LINE = re.compile(r"^\s+parax\.attention\s+\S+\s+[0-9.]+\s+(?:(\d+) x )?(\d+) queries over (\d+) keys"
                            r"(, causal|, window \d+)?, head width (\d+) (\S+), (\d+) TFLOP/s$")


def gemm_flops(e):
    return 2.0 * e["batch"] * e["m"] * e["n"] * e["k"]


def attention_flops(e):
    """parax's count (LayerSolver's attentionFlops, value width = head
    width): the (query, key) pairs times 2d + 5 + 2d."""
    q, keys = e["queries"], e["keys"]
    pairs = q * keys - q * (q - 1) / 2 if e["causal"] else q * keys
    return e["batch"] * pairs * (4.0 * e["head_width"] + 5)


def flops(e):
    return gemm_flops(e) if e["kind"] == "gemm" else attention_flops(e)


def selected_rows(only=None):
    """The validation rows on Hopper whose stack's kernels PyTorch has
    (`only`: those whose name contains it)."""
    sys.path.insert(0, HERE)
    import validate
    out = []
    for row in validate.rows():
        if only and only not in row["name"]:
            continue
        base = row["profile"]
        if base in STACK_KERNEL and re.match(r"(dgx-h100|dgx-h200|grand-teton-h100)", row["cluster"]):
            out.append(row)
    return out, validate


def explain(tool, path, cluster, profile, workload):
    done = subprocess.run([tool, path, "--cluster", cluster, "--profile", profile, "--workload", workload,
                           "--top", "1", "--explain"], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"parax-plan {cluster} {workload}: {(done.stderr or done.stdout).strip()[-400:]}")
    return done.stdout


def parse_layers(text):
    """The decoder layers' GEMMs and attentions of an --explain: (entry,
    parax's forward TFLOP/s, how many of it the model runs, a GEMM's
    backward over its forward where the explain gives it, else None);
    the attention left out where the plan splits the sequence (cp > 1)."""
    best = re.search(r"^best: (.*?);", text, re.M)
    cp = bool(best and re.search(r"\bcp([2-9]|\d\d+)\b", best.group(1)))
    found = []
    layers = 1
    for line in text.splitlines():
        layer = re.match(r"^\s+layer (-?\d+) \((\d+) like it\)", line)
        if layer:
            layers = int(layer.group(2))
            continue
        g = GEMM_LINE.match(line)
        if g:
            found.append(({"kind": "gemm", "batch": int(g.group(2) or 1), "m": int(g.group(3)),
                           "k": int(g.group(4)), "n": int(g.group(5)), "dtype": g.group(6)},
                          int(g.group(7)), layers, float(g.group(8)) if g.group(8) else None))
            continue
        a = ATTENTION_LINE.match(line)
        if a and not cp:
            if a.group(4) and "window" in a.group(4):
                continue  # (no sliding window among the rows; SDPA has no such mask)
            found.append(({"kind": "attention", "batch": int(a.group(1) or 1), "queries": int(a.group(2)),
                           "keys": int(a.group(3)), "causal": bool(a.group(4)), "head_width": int(a.group(5)),
                           "dtype": a.group(6)}, int(a.group(7)), layers, None))
    return found


# What makes a kernel's rate: taken from the measured card's preset into
# the row's cluster (whose memory, links and counts keep the row's plan).
RATE_FIELDS = ("peak_tflops", "matmul_efficiency", "fp8_matmul_efficiency", "hbm_bandwidth_gbps",
               "memory_efficiency", "multiprocessors")


def print_cluster(tool, cluster):
    return json.loads(subprocess.run([tool, "--cluster", cluster, "--print-cluster"], capture_output=True,
                                     text=True, check=True, timeout=60).stdout)


def one_device_cluster(tool, cluster, preset, tmp):
    """The row's cluster with `preset`'s kernel rates, as a device alone
    runs them (busy_node_matmul_share 1)."""
    spec = print_cluster(tool, cluster)
    rates = print_cluster(tool, preset)
    for field in RATE_FIELDS:
        if field in rates:
            spec[field] = rates[field]
        else:
            spec.pop(field, None)
    spec["busy_node_matmul_share"] = 1
    path = os.path.join(tmp, f"{preset}.cluster.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    return path


def shapes(args):
    tool = os.path.join(args.build, "bin", "parax-plan")
    rows, validate = selected_rows(args.only)
    entries = {}
    flash_rates = {}
    for row in rows:
        with tempfile.TemporaryDirectory() as tmp:
            path, profile, _, _ = validate.prepare(row, tmp)
            uses = {}  # entry key -> this row's use of it
            for preset in PRESETS.values():
                cluster = one_device_cluster(tool, row["cluster"], preset, tmp)
                counted = {}
                for entry, rate, count, backward in parse_layers(
                        explain(tool, path, cluster, profile, row["workload"])):
                    key = json.dumps(entry, sort_keys=True)
                    entries.setdefault(key, dict(entry, uses=[]))
                    use = uses.setdefault(key, {"row": row["name"], "profile": row["profile"], "count": 0,
                                                "parax_tflops": {}})
                    use["parax_tflops"][preset] = rate
                    if backward:  # (its backward over its forward)
                        use.setdefault("parax_backward", {})[preset] = backward
                    counted[key] = counted.get(key, 0) + count
                for key, count in counted.items():
                    uses[key]["count"] = count
            for key, use in uses.items():
                entries[key]["uses"].append(use)
            if row["profile"] not in flash_rates:
                printed = subprocess.run([tool, "--profile", profile, "--print-profile"], capture_output=True,
                                         text=True, check=True, timeout=60).stdout
                flash_rates[row["profile"]] = json.loads(printed).get("flash_backward_rate", 1)
    out = {"about": "bench/kernel_rates.py shapes: the decoder layers' GEMMs and attentions of the Hopper "
                    "validation rows, parax's forward rate for one device of each preset",
           "flash_backward_rate": flash_rates,
           "entries": sorted(entries.values(), key=lambda e: (e["kind"], -flops(e)))}
    with open(args.out, "w") as f:  # (an entry a line)
        f.write("{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in out.items() if k != "entries")
                + ',\n "entries": [\n' + ",\n".join("  " + json.dumps(e) for e in out["entries"]) + "\n ]\n}\n")
    print(f"{len(out['entries'])} entries from {len(rows)} rows -> {args.out}")


# ---------------------------------------------------------------- measure


def timed(fn, torch, batch_s=0.02, batches=5):
    """Seconds a call, the median over `batches` batches of CUDA-event
    timed calls, each batch about `batch_s` long."""
    for _ in range(2):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    once = max(start.elapsed_time(end) / 1e3, 1e-6)
    n = max(1, min(200, int(batch_s / once)))
    samples = []
    for _ in range(batches):
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / n)
    return statistics.median(samples)


def gemm_calls(e, torch):
    """Forward, input-gradient and weight-gradient calls of a linear's
    GEMMs (y = x W^T, W [n, k] as nn.Linear and TransformerEngine hold it;
    batch > 1: a head linear's heads side by side)."""
    b, m, n, k = e["batch"], e["m"], e["n"], e["k"]
    dev = DEVICE
    if e["dtype"] != "fp8":
        dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[e["dtype"]]
        x = torch.randn(b, m, k, device=dev, dtype=dt)
        w = torch.randn(b, n, k, device=dev, dtype=dt)
        dy = torch.randn(b, m, n, device=dev, dtype=dt)
        if b == 1:
            x, w, dy = x[0], w[0], dy[0]
            return (lambda: x @ w.t(), lambda: dy @ w, lambda: dy.t() @ x)
        return (lambda: torch.bmm(x, w.transpose(1, 2)), lambda: torch.bmm(dy, w),
                lambda: torch.bmm(dy.transpose(1, 2), x))
    if b != 1:
        raise RuntimeError("batched fp8 GEMMs are not timed")
    # torch._scaled_mm: A row-major, B column-major; e4m3 forward, the
    # gradient in e5m2 against e4m3 (TransformerEngine's hybrid format),
    # the transposed copies made beforehand (TE's cast-transpose, which
    # parax costs apart).
    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    one = torch.ones((), device=dev)
    x = (torch.randn(m, k, device=dev) * 0.5).to(e4)
    xt = x.t().contiguous()
    w = (torch.randn(n, k, device=dev) * 0.5).to(e4)
    wt = w.t().contiguous()
    dy = (torch.randn(m, n, device=dev) * 0.5).to(e5)
    dyt = dy.t().contiguous()

    def mm(a, bmat):
        return torch._scaled_mm(a, bmat, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    return (lambda: mm(x, w.t()), lambda: mm(dy, wt.t()), lambda: mm(dyt, xt.t()))


def attention_calls(e, torch, kernel):
    """Forward and backward of SDPA on one backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[kernel]
    dt = {"bf16": torch.bfloat16, "f16": torch.float16}[e["dtype"]]
    h, d = e["batch"], e["head_width"]
    q = torch.randn(1, h, e["queries"], d, device=DEVICE, dtype=dt, requires_grad=True)
    k = torch.randn(1, h, e["keys"], d, device=DEVICE, dtype=dt, requires_grad=True)
    v = torch.randn(1, h, e["keys"], d, device=DEVICE, dtype=dt, requires_grad=True)
    causal = e["causal"]

    def forward():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out = forward()
    grad = torch.randn_like(out)

    def backward():
        with sdpa_kernel([backend]):
            return torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
    return forward, backward


def gpu_state():
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,"
                            "temperature.gpu", "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        return q.stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"nvidia-smi: {e}"


def measure(args):
    import torch
    if not torch.cuda.is_available():
        print("kernel_rates: no CUDA device")
        return 77
    with open(args.shapes) as f:
        spec = json.load(f)
    name = torch.cuda.get_device_name()
    preset = next((p for d, p in PRESETS.items() if d in name), None)
    result = {"device": name, "preset": preset, "torch": torch.__version__,
              "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
              "shapes": os.path.relpath(args.shapes, ROOT), "flash_backward_rate": spec["flash_backward_rate"],
              "entries": []}
    # Settle the clocks: a large GEMM for a few seconds (the power limit).
    a = torch.randn(8192, 8192, device=DEVICE, dtype=torch.bfloat16)
    end = time.time() + args.heat
    while time.time() < end:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()
    result["gpu_after_heat"] = gpu_state()
    started = time.time()
    for e in spec["entries"]:
        if time.time() - started > args.budget:
            result.setdefault("skipped", 0)
            result["skipped"] += 1
            continue
        r = dict(e)
        try:
            if e["kind"] == "gemm":
                fwd, dgrad, wgrad = gemm_calls(e, torch)
                r["forward_s"] = timed(fwd, torch)
                r["dgrad_s"] = timed(dgrad, torch)
                r["wgrad_s"] = timed(wgrad, torch)
            else:
                for kernel in ("cudnn", "flash"):
                    try:
                        fwd, bwd = attention_calls(e, torch, kernel)
                        r[f"{kernel}_forward_s"] = timed(fwd, torch)
                        r[f"{kernel}_backward_s"] = timed(bwd, torch)
                    except Exception as err:  # a backend that refuses the shape
                        r[f"{kernel}_error"] = str(err)[-300:]
        except Exception as err:
            r["error"] = str(err)[-300:]
        torch.cuda.empty_cache()
        result["entries"].append(r)
    result["gpu_at_end"] = gpu_state()
    result["seconds"] = time.time() - started
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    report(result)
    return 0


# ---------------------------------------------------------------- compare


def report(result):
    preset = result.get("preset")
    print(f"device {result['device']} (parax's preset {preset}), torch {result['torch']}, CUDA {result['cuda']}, "
          f"cuDNN {result['cudnn']}; after the heat: {result.get('gpu_after_heat')}; at the end: "
          f"{result.get('gpu_at_end')}")
    if not preset:
        print("no parax preset for this device: measured rates only")
    print("| kernel | shape | dtype | parax TFLOP/s (stack) | measured | measured / parax | backward / forward |")
    print("|---|---|---|---|---|---|---|")
    by_class = {}  # kind and dtype (an attention: its kernel) -> [parax's seconds, measured]
    by_row = {}
    for r in result["entries"]:
        if r["kind"] == "gemm":
            shape = f"{r['batch']} x " * (r["batch"] > 1) + f"[{r['m']} x {r['k']}] x [{r['k']} x {r['n']}]"
        else:
            shape = (f"{r['batch']} x {r['queries']} queries over {r['keys']} keys"
                     f"{', causal' if r['causal'] else ''}, d {r['head_width']}")
        # Each stack that runs it: its rate against its kernel's time.
        seen = set()
        for use in r["uses"]:
            kernel = STACK_KERNEL.get(use["profile"], "cudnn")
            what = "GEMM" if r["kind"] == "gemm" else f"attention ({kernel})"
            fwd = r.get("forward_s") if r["kind"] == "gemm" else r.get(f"{kernel}_forward_s")
            parax = use["parax_tflops"].get(preset) if preset else None
            line_key = (what, use["profile"], parax)
            if not fwd:
                error = r.get("error") or r.get(f"{kernel}_error") or "not timed"
                if line_key not in seen:
                    print(f"| {what} | {shape} | {r['dtype']} | {parax or ''} ({use['profile']}) | {error} | | |")
                seen.add(line_key)
                continue
            if r["kind"] == "gemm":
                ratio = use.get("parax_backward", {}).get(preset) if preset else None
                back = f"{(r['dgrad_s'] + r['wgrad_s']) / fwd:.2f} (parax {f'{ratio:.2f}' if ratio else '2.00'})"
            else:
                rate = result["flash_backward_rate"].get(use["profile"], 1)
                back = f"{r[f'{kernel}_backward_s'] / fwd:.2f} (parax 2.5x the FLOPs at {rate:g} of the rate)"
            measured = flops(r) / fwd / 1e12
            if line_key not in seen:
                ratio = f"{measured / parax:.2f}" if parax else ""
                print(f"| {what} | {shape} | {r['dtype']} | {parax or ''} ({use['profile']}) | {measured:.0f} | "
                      f"{ratio} | {back} |")
            seen.add(line_key)
            if not parax:
                continue
            t_parax = flops(r) / (parax * 1e12)
            cls = f"{what} {r['dtype']}"
            c = by_class.setdefault(cls, [0.0, 0.0])
            c[0] += t_parax
            c[1] += fwd
            w = by_row.setdefault(use["row"], [0.0, 0.0])
            w[0] += use["count"] * t_parax
            w[1] += use["count"] * fwd
    if by_class:
        print("\nparax's forward time over the measured, summed (below 1: parax optimistic about these kernels):")
        for cls, (p, m) in sorted(by_class.items()):
            print(f"  {cls}: {p / m:.2f}")
    if by_row:
        print("\nby row, its decoder layers' timed kernels (each as many times as the model runs it):")
        for row, (p, m) in sorted(by_row.items(), key=lambda kv: kv[1][0] / kv[1][1]):
            print(f"  {p / m:.2f}  {row}")
    if result.get("skipped"):
        print(f"\n{result['skipped']} entries not timed (the budget)")


def entry_key(e):
    """An entry's kernel: its shape and dtype."""
    return json.dumps({k: v for k, v in e.items() if k not in ("uses",) and not k.endswith(("_s", "_error"))
                       and k != "error"}, sort_keys=True)


def compare(args):
    with open(args.measured) as f:
        result = json.load(f)
    if args.shapes:
        # Today's rates (a shapes file made since) for the kernels timed then.
        with open(args.shapes) as f:
            spec = json.load(f)
        uses = {entry_key(e): e["uses"] for e in spec["entries"]}
        result["flash_backward_rate"] = spec["flash_backward_rate"]
        result["entries"] = [dict(r, uses=uses[entry_key(r)]) for r in result["entries"] if entry_key(r) in uses]
    report(result)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("shapes")
    s.add_argument("--build", default=os.path.join(ROOT, "build"))
    s.add_argument("--out", default=DEFAULT_SHAPES)
    s.add_argument("--only", help="rows whose name contains this")
    m = sub.add_parser("measure")
    m.add_argument("shapes", nargs="?", default=DEFAULT_SHAPES)
    m.add_argument("out")
    m.add_argument("--budget", type=float, default=150, help="seconds of timing at most")
    m.add_argument("--heat", type=float, default=5, help="seconds of GEMMs first")
    c = sub.add_parser("compare")
    c.add_argument("measured")
    c.add_argument("--shapes", help="parax's rates from this shapes file (made since the measurement)")
    args = parser.parse_args()
    if args.command == "shapes":
        return shapes(args)
    if args.command == "measure":
        return measure(args)
    return compare(args)


if __name__ == "__main__":
    sys.exit(main() or 0)
