"""bench/kernel_rates.py: the kernels it takes from a validation row's
--explain, parax's rate for each (derived here by hand), and the
comparison it prints from a measurement (the GPU side needs PyTorch and a
card; its arithmetic is what is checked here)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

SCRIPT = os.path.join(ROOT, "bench", "kernel_rates.py")
ROW = "Megatron-Core GPT 1.7B, 48 H100"


def run(*args, timeout=300):
    proc = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def shapes(parax_opt, tmp_path_factory):
    out = tmp_path_factory.mktemp("rates") / "shapes.json"
    build = os.path.dirname(os.path.dirname(parax_opt))
    run("shapes", "--build", build, "--only", ROW, "--out", str(out))
    return json.loads(out.read_text())


def test_a_rows_gemms_and_attention_with_parax_rates(shapes):
    # Megatron-Core r0.8.0's GPT 1.7B (hidden 2048, 16 heads, FFN 8192,
    # 24 layers, vocabulary 131,072) at seq 4096; the search's microbatch
    # of 4 sequences: 16,384 rows a GEMM.
    entries = {(e["kind"], e.get("m"), e.get("k"), e.get("n")): e for e in shapes["entries"]}
    assert len(shapes["entries"]) == 5
    qkvo = entries[("gemm", 16384, 2048, 2048)]
    (use,) = qkvo["uses"]
    assert use["count"] == 4 * 24  # q, k, v and the output projection, 24 layers
    # By hand: the tile/wave model's best, 256x128 or 128x128 tiles, 1,024
    # or 2,048 of them on 132 SMs: 1024 / (8 x 132) = 0.9697; k / (k + 140)
    # (the profile's gemm_k_overhead) = 0.936; 989 x 0.716 TFLOP/s alone
    # (no busy node): 643 TFLOP/s of arithmetic, plus the profile's 2 us a
    # kernel over 137.4 GFLOP: 213.8 + 2 us, 637 TFLOP/s.
    assert use["parax_tflops"] == {"dgx-h100": 637, "dgx-h200": 637}
    # Its backward by the two gradients' shapes: the data gradient
    # [16384 x 2048] x [2048 x 2048] as the forward (215.8 us); the
    # weight's [2048 x 2048] x [2048 x 16384], 128 or 256 tiles (0.9697)
    # and k / (k + 140) = 0.9915: 680.8 TFLOP/s, 201.8 + 2 us. 419.6 us
    # over 215.8: 1.94x.
    assert use["parax_backward"] == {"dgx-h100": 1.94, "dgx-h200": 1.94}
    assert entries[("gemm", 16384, 2048, 8192)]["uses"][0]["count"] == 24
    down = entries[("gemm", 16384, 8192, 2048)]["uses"][0]
    assert down["count"] == 24
    # The MLP's down-projection, 549.8 GFLOP: forward 128 x 128 tiles
    # (0.9697) at k = 8192 (0.9832), 675.1 TFLOP/s, 814.4 + 2 us (673);
    # its data gradient [16384 x 2048] x [2048 x 8192], 8,192 tiles in 63
    # waves (0.9851) at k = 2048 (0.936), 842.0 + 2 us; its weight's [8192 x
    # 2048] x [2048 x 16384], 0.9697 at k = 16384 (0.9915), 807.6 + 2 us:
    # 1653.6 over 816.4, 2.03x.
    assert down["parax_tflops"]["dgx-h100"] == 673 and down["parax_backward"]["dgx-h100"] == 2.03
    assert entries[("gemm", 16384, 2048, 131072)]["uses"][0]["count"] == 1  # the output head
    (attention,) = [e for e in shapes["entries"] if e["kind"] == "attention"]
    assert (attention["batch"], attention["queries"], attention["keys"], attention["causal"],
            attention["head_width"]) == (64, 4096, 4096, True, 128)  # 4 sequences x 16 heads
    # 0.70 of 708.1 x 2048.5 / (2048.5 + 135), the keys a query sees on
    # average: 465.1 TFLOP/s over 64 x 4096 x 4097 / 2 pairs x 517 FLOPs
    # (0.597 ms), plus 2 us: 463.
    assert attention["uses"][0]["parax_tflops"]["dgx-h100"] == 463
    assert shapes["flash_backward_rate"] == {"megatron-core": 0.86}


def test_the_comparison_of_a_measurement(shapes, tmp_path):
    # A card 0.8x parax's rate on every kernel, its GEMMs' backward 2.2x
    # the forward (parax's 1.94x, above), cuDNN's attention backward 3x.
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import kernel_rates
    measured = []
    for e in shapes["entries"]:
        r = dict(e)
        seconds = kernel_rates.flops(e) / (0.8 * e["uses"][0]["parax_tflops"]["dgx-h100"] * 1e12)
        if e["kind"] == "gemm":
            r.update(forward_s=seconds, dgrad_s=1.1 * seconds, wgrad_s=1.1 * seconds)
        else:
            r.update(cudnn_forward_s=seconds, cudnn_backward_s=3 * seconds, flash_error="refused")
        measured.append(r)
    path = tmp_path / "measured.json"
    path.write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3", "preset": "dgx-h100", "torch": "x",
                                "cuda": "x", "cudnn": 0, "flash_backward_rate": shapes["flash_backward_rate"],
                                "entries": measured}))
    out = run("compare", str(path))
    lines = out.splitlines()
    qkvo = next(l for l in lines if "[16384 x 2048] x [2048 x 2048]" in l)
    assert [c.strip() for c in qkvo.split("|")][4:8] == ["637 (megatron-core)", "510", "0.80", "2.20 (parax 1.94)"]
    attention = next(l for l in lines if l.startswith("| attention (cudnn)"))
    assert "| 0.80 | 3.00 (parax 2.5x the FLOPs at 0.86 of the rate) |" in attention
    assert "  GEMM bf16: 0.80" in lines and "  attention (cudnn) bf16: 0.80" in lines
    assert any(l.startswith("  0.80  Megatron-Core GPT 1.7B") for l in lines)


def test_a_measurement_against_todays_rates(shapes, tmp_path):
    # `compare --shapes`: a measurement taken against other rates, read
    # against the shapes file's (here: every kernel timed at 637 TFLOP/s
    # of parax's FLOPs, and the shapes' rates as made above).
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import kernel_rates
    measured = []
    for e in shapes["entries"]:
        r = {k: v for k, v in e.items() if k != "uses"}
        r["uses"] = [dict(u, parax_tflops={"dgx-h100": 1}) for u in e["uses"]]  # stale
        seconds = kernel_rates.flops(e) / 637e12
        if e["kind"] == "gemm":
            r.update(forward_s=seconds, dgrad_s=seconds, wgrad_s=seconds)
        else:
            r.update(cudnn_forward_s=seconds, cudnn_backward_s=seconds)
        measured.append(r)
    measured_path, shapes_path = tmp_path / "measured.json", tmp_path / "shapes.json"
    measured_path.write_text(json.dumps({"device": "H100", "preset": "dgx-h100", "torch": "x", "cuda": "x",
                                         "cudnn": 0, "flash_backward_rate": {}, "entries": measured}))
    shapes_path.write_text(json.dumps(shapes))
    lines = run("compare", str(measured_path), "--shapes", str(shapes_path)).splitlines()
    qkvo = next(l for l in lines if "[16384 x 2048] x [2048 x 2048]" in l)
    assert [c.strip() for c in qkvo.split("|")][4:7] == ["637 (megatron-core)", "637", "1.00"]
    attention = next(l for l in lines if l.startswith("| attention (cudnn)"))
    assert [c.strip() for c in attention.split("|")][4:7] == ["463 (megatron-core)", "637", "1.38"]
