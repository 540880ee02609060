"""parax-plan against the figures of the reference texts (../shared/seeds and
reference/hardware-and-formulas.md), through its JSON output."""

import json
import os
import subprocess

import pytest

from conftest import ROOT
from parax.models import PRESETS, build_model, load_config

CLUSTERS = ["dgx-a100-80gb", "dgx-h100", "dgx-h200", "hgx-h800", "dgx-b200", "gb200-nvl72"]


@pytest.fixture(scope="session")
def parax_plan(parax_opt):
    return os.path.join(os.path.dirname(parax_opt), "parax-plan")


@pytest.fixture(scope="session")
def model_file(tmp_path_factory):
    cache = {}

    def get(preset, seq=2048, layers=None, batch=1):
        key = (preset, seq, layers, batch)
        if key not in cache:
            path = tmp_path_factory.mktemp("models") / f"{preset}-{seq}-{layers}-{batch}.mlir"
            path.write_text(build_model(load_config(preset, layers=layers), batch=batch, seq=seq))
            cache[key] = str(path)
        return cache[key]
    return get


def plan(parax_plan, model, cluster, workload, *extra, expect=0):
    proc = subprocess.run([parax_plan, model, "--cluster", cluster, "--workload", workload,
                           "--json", *extra], capture_output=True, text=True, timeout=300)
    assert proc.returncode == expect, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def profiled(parax_plan, tmp_path, model, cluster, workload, **fields):
    """The best plan of `model` on `cluster` for `workload` under a profile
    of these fields (the roofline's for the rest)."""
    path = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}.json"
    path.write_text(json.dumps({"name": "p", **fields}))
    return plan(parax_plan, model, cluster, workload, "--profile", str(path))["plans"][0]


def two_stages(parax_plan, model_file, tmp_path, profile, workload):
    """The best plan of Llama-3-8B cut to 8 layers, sequences of 8,192, on
    two devices under `profile` (a dict of profile fields) for `workload`'s
    knobs (after train:batch=8,seq=8192,tp=1,pp=2,dp=1,mbs=1)."""
    path = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}.json"
    path.write_text(json.dumps({"name": "pipeline", **profile}))
    out = plan(parax_plan, model_file("llama3-8b", 8192, layers=8), "dgx-h100:devices_per_node=2",
               f"train:batch=8,seq=8192,tp=1,pp=2,dp=1,mbs=1,{workload}", "--profile", str(path), "--top", "1")
    return out["plans"][0]


def test_llama31_70b_figures(parax_plan, model_file):
    # 70.6 B parameters, 141 GB of bf16 weights, 320 KiB of KV cache per token.
    out = plan(parax_plan, model_file("llama3-70b", 16), "dgx-h100",
               "decode:batch=32,context=4096,tp=4,dp=1")
    model = out["model"]
    assert model["parameters"] == pytest.approx(70.6e9, rel=0.005)
    assert model["parameter_bytes"] == pytest.approx(141e9, rel=0.005)
    assert model["kv_bytes_per_token"] == 320 * 1024
    best = out["plans"][0]
    # Under TP a decode step does 2 all-reduces per layer: 160 for 80 layers.
    assert best["decoder_collectives_per_step"] == {"all_reduce": 160}
    # TP4 weight-read lower bound on H100: 141 GB less the 2.1 GB embedding
    # table (a step looks up 32 rows), / (4 x 3.35 TB/s) = 10.4 ms; on two
    # stages with two microbatches the heavier stage read twice: 10.5 ms.
    assert best["weight_read_bound_s"] == pytest.approx(10.5e-3, rel=0.01)
    assert best["step_time_s"] > best["weight_read_bound_s"]


# KV room: the usable memory (85.52 GB as the driver reports an H100, 90 %
# of it, less 1.5 GB reserved: 75.47 GB) less a rank's 16.06 GB / tp of
# weights, times tp: 59.4, 2 x 67.4, 4 x 71.4 GB. The weight-read bound:
# the 16.06 GB less the embedding table's 1.05 GB (a step looks up 4
# rows), 15.01 GB / tp, over 3.35 TB/s.
@pytest.mark.parametrize("tp,dp,bound_ms,room_gb", [
    (1, 4, 4.48, 59.4),  # four replicas; 59 GB of KV room each
    (2, 2, 2.24, 134.9), # TP2 x 2
    (4, 1, 1.12, 285.8), # one TP4 group: 286 GB of KV room together
])
def test_llama3_8b_on_four_h100(parax_plan, model_file, tp, dp, bound_ms, room_gb):
    out = plan(parax_plan, model_file("llama3-8b", 16), "dgx-h100:devices_per_node=4",
               f"decode:batch=4,context=4096,tp={tp},dp={dp}")
    best = out["plans"][0]
    assert best["weight_read_bound_s"] == pytest.approx(bound_ms * 1e-3, rel=0.03)
    assert best["kv_room_bytes"] == pytest.approx(room_gb * 1e9, rel=0.03)
    # "plus communication": above the bound, by the all-reduces when tp > 1.
    assert best["step_time_s"] > best["weight_read_bound_s"]
    assert (best["time_s"]["tp_comm"] > 0) == (tp > 1)


def test_too_big_for_a_node_gets_pipeline_stages_across_nodes(parax_plan, model_file):
    # 811 GB of bf16 weights do not fit one 8 x 80 GB node: serving it on two
    # nodes needs pipeline stages across them, tensor parallelism inside.
    out = plan(parax_plan, model_file("llama3-405b", 16), "dgx-h100:nodes=2",
               "decode:batch=8,context=4096", "--top", "20")
    assert out["plans"]
    for p in out["plans"]:
        assert p["tp"] <= 8
        assert p["pp"] >= 2
    # Training without ZeRO-3 (pinned to ZeRO-1) likewise takes stages.
    out = plan(parax_plan, model_file("llama3-405b", 4096), "dgx-h100:nodes=16",
               "train:batch=64,seq=4096,zero=1", "--top", "20")
    assert out["plans"]
    for p in out["plans"]:
        assert p["tp"] <= 8 and p["pp"] >= 2


def test_infeasible_says_why_and_what_would_fit(parax_plan, model_file):
    proc = subprocess.run([parax_plan, model_file("llama3-70b", 4096), "--cluster",
                           "dgx-h100:devices_per_node=1", "--workload", "train:batch=8,seq=4096"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "no plan: nothing fits in 85.5 GB per device" in proc.stdout
    assert "its largest term is" in proc.stdout
    assert "Smallest change that fits:" in proc.stdout


def test_pipeline_stages_that_do_not_fit_say_what_overflows(parax_plan, model_file):
    """Llama-3-70B pinned to two pipeline stages on two GPUs: no split of
    its layers fits, and the answer says what overflows (the plan used to
    be dropped, and the answer was that no configuration applies)."""
    proc = subprocess.run([parax_plan, model_file("llama3-70b", 4096), "--cluster",
                           "dgx-h100:devices_per_node=2", "--workload", "train:batch=8,seq=4096,pp=2"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "no plan: nothing fits in 85.5 GB per device" in proc.stdout, proc.stdout
    assert "the least demanding plan (pp2 dp1 ep1 tp1)" in proc.stdout
    assert "Smallest change that fits:" in proc.stdout
    # ... with the split of its layers that needs the least memory: about
    # half the model's 70.6 B parameters at 20 bytes each (bf16 weights and
    # gradients, fp32 master, moments and gradient sums: 706 GB a half) and
    # its activations, not the fastest split's 734 GB.
    import re
    needs = float(re.search(r"needs ([0-9.]+) GB", proc.stdout).group(1))
    assert 706 < needs < 725, proc.stdout


def test_a_stage_split_that_overflows_is_split_again(parax_plan, model_file, tmp_path):
    """DeepSeek-V3 on 2,048 H800 of 80 GB under megatron-core (no bf16
    gradients held): the split by time under the memory the split counts
    puts too many layers on a stage whose working sets then overflow (by
    2.9 GB of 70.5 usable), and the search used to answer that nothing
    fits; split again with the overflow taken off the room, it fits. (The
    preset's 85.5 GB, the memory the driver reports, fits at once: the
    cluster here is the preset with 80 GB.)"""
    cluster = json.loads(subprocess.run([parax_plan, "--print-cluster", "--cluster", "hgx-h800:nodes=256"],
                                        capture_output=True, text=True, timeout=60, check=True).stdout)
    cluster["hbm_gb"] = 80
    (tmp_path / "h800-80.json").write_text(json.dumps(cluster))
    out = plan(parax_plan, model_file("deepseek-v3", 4096), str(tmp_path / "h800-80.json"),
               "train:batch=15360,seq=4096,tp=1,pp=16,ep=64,dp=2,zero=1,capacity=2,gemm=fp8,"
               "recompute=selective,mbs=1", "--profile", "megatron-core", "--top", "1")
    assert out["plans"], out.get("explanation")
    memory = out["plans"][0]["memory_bytes"]
    assert memory["total"] - memory["reserved"] <= memory["usable"]
    assert memory["gradients"] == 0


def test_same_input_same_output(parax_plan, model_file):
    model = model_file("mixtral-8x7b", 4096)
    runs = [subprocess.run([parax_plan, model, "--cluster", "dgx-h100:nodes=2", "--workload",
                            "train:batch=64,seq=4096", *extra], capture_output=True,
                           timeout=300).stdout for extra in ([], [], ["--json"], ["--json"])]
    assert runs[0] == runs[1] and runs[0]
    assert runs[2] == runs[3] and runs[2]


def test_expert_parallelism_is_searched(parax_plan, model_file):
    out = plan(parax_plan, model_file("mixtral-8x7b", 4096), "dgx-h100:nodes=2",
               "train:batch=64,seq=4096,ep=8")
    best = out["plans"][0]
    assert best["ep"] == 8
    assert best["time_s"]["ep_comm"] > 0
    # Dispatch and combine in each of the 32 MoE layers (forward).
    assert best["decoder_collectives_per_step"]["all_to_all"] >= 64


def test_expert_capacity_shrinks_the_dispatched_rows(parax_plan, parax_opt, model_file):
    """Mixtral-8x7B over EP8 (4 x 8 H100, one sequence of 4,096 tokens a
    microbatch): a rank keeps, in each of the 32 MoE layers, the rows its
    experts' gradient reads -- each row [4,096 features, its router weight]
    in bf16 and its local expert (i32) -- sized for every rank's 4,096 x 2
    (token, choice) pairs (8x its own), or capacity x its own. capacity=1.25
    keeps 6.75 x those rows fewer; the backward pass's peak, where the last
    expert layer's gradient is made (the output's gradient rows dispatched
    in and the input's gradient rows, bf16, both of the dispatch's size),
    is lower by 2 x 6.75 x its own rows too; the experts' scratch shrinks
    too; the plan records the capacity for the partitioner (whose IR holds
    a microbatch of each of the 8 EP ranks of a replica: batch 8)."""
    model = model_file("mixtral-8x7b", 4096)
    pins = "train:batch=64,seq=4096,ep=8,dp=4,pp=1,tp=1,mbs=1,recompute=selective,zero=3"
    every, capped = (plan(parax_plan, model, "dgx-h100:nodes=4", pins + extra)["plans"][0]
                     for extra in ("", ",capacity=1.25"))
    rows = 32 * 4096 * 2 * (8 - 1.25)
    transient = 2 * (4096 * 2 * (8 - 1.25)) * 4096 * 2
    assert every["memory_bytes"]["activations"] - capped["memory_bytes"]["activations"] == \
        pytest.approx(rows * (4096 * 2 + 2 + 4) + transient, rel=1e-6)
    assert capped["memory_bytes"]["scratch"] < every["memory_bytes"]["scratch"] / 4
    assert capped["memory_bytes"]["weights"] == every["memory_bytes"]["weights"]
    ir = subprocess.run([parax_opt, model_file("mixtral-8x7b", 4096, batch=8),
                         f"--parax-plan=cluster=dgx-h100:nodes=4 workload={pins},capacity=1.25"],
                        capture_output=True, text=True, timeout=300)
    assert ir.returncode == 0, ir.stderr
    assert "expert_capacity = 1.250000e+00 : f64" in ir.stdout


def test_an_expert_capacity_is_suggested_when_nothing_fits(parax_plan, model_file):
    """DeepSeek-V3 pinned to PP16 x EP64 on 2,048 H800 (its published
    layout): every rank's dispatch sized for all 64 ranks' tokens does not
    fit; the explanation names an expert capacity that does, and planning
    with it finds that plan."""
    model = model_file("deepseek-v3", 4096)
    pins = "train:batch=15360,seq=4096,pp=16,ep=64"
    out = plan(parax_plan, model, "hgx-h800:nodes=256", pins, expect=2)
    import re
    found = re.search(r"or on this cluster, capacity=([0-9.]+) \(a rank's expert dispatch holds .*?\), "
                      r"e\.g\. (pp16 dp\d+ ep64[^,]*) at", out["explanation"])
    assert found, out["explanation"]
    best = plan(parax_plan, model, "hgx-h800:nodes=256", f"{pins},capacity={found.group(1)}")["plans"][0]
    assert best["ep"] == 64 and best["pp"] == 16


def test_context_parallelism_takes_long_prompts(parax_plan, model_file):
    """A 128K-token prompt on 2 x 8 H100: the planner splits it over cp
    ranks, which beats every plan without (PP2 x TP8 at about 1.47 s);
    the keys and values of each layer are gathered (two all-gathers)."""
    model = model_file("llama3-8b", 131072)
    best = plan(parax_plan, model, "dgx-h100:nodes=2", "prefill:batch=1,seq=131072")["plans"][0]
    without = plan(parax_plan, model, "dgx-h100:nodes=2", "prefill:batch=1,seq=131072,cp=1")["plans"][0]
    assert best["cp"] > 1 and without["cp"] == 1
    assert best["step_time_s"] < 0.8 * without["step_time_s"]
    assert best["time_s"]["cp_comm"] > 0 and without["time_s"]["cp_comm"] == 0
    # Each device holds a cp-th of the activations.
    assert best["memory_bytes"]["activations"] < without["memory_bytes"]["activations"]
    # A decode step has no sequence to split; an 8K prompt is not split
    # below 1,024 tokens a rank; an MoE model splits one sequence a
    # microbatch only.
    out = plan(parax_plan, model, "dgx-h100:nodes=2", "prefill:batch=1,seq=8192")
    assert all(p["cp"] <= 8 for p in out["plans"])
    moe = model_file("mixtral-8x7b", 4096)
    out = plan(parax_plan, moe, "dgx-h100", "prefill:batch=2,seq=4096,cp=2,dp=1,ep=1,pp=1", expect=2)
    assert "under an MoE model, with one sequence a microbatch" in out["explanation"], out
    assert plan(parax_plan, moe, "dgx-h100", "prefill:batch=1,seq=4096,cp=2")["plans"][0]["cp"] == 2


def test_bad_arguments(parax_plan, model_file):
    for args, message in [
        (["--cluster", "dgx-h100", "--workload", "train:batch=8"], "needs seq=N"),
        (["--cluster", "dgx-h100:nodes=x", "--workload", "train:batch=8,seq=16"], "positive integer"),
    ]:
        proc = subprocess.run([parax_plan, model_file("tiny-llama", 16), *args],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1
        assert message in proc.stderr


@pytest.mark.parametrize("preset", sorted(p for p in PRESETS if not p.startswith("tiny")))
def test_every_preset_on_every_cluster_answers(parax_plan, model_file, preset):
    seq = min(2048, load_config(preset).sliding_window or 2048)  # (Phi-3's window: 2047)
    for cluster in CLUSTERS:
        proc = subprocess.run([parax_plan, model_file(preset, seq), "--cluster", f"{cluster}:nodes=4",
                               "--workload", f"train:batch=256,seq={seq}", "--top", "1"],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode in (0, 2), proc.stderr
        assert ("MFU" in proc.stdout) if proc.returncode == 0 else ("no plan:" in proc.stdout)


@pytest.mark.parametrize("kind", ["past", "cache"])
def test_decode_step_with_its_kv_cache_plans_like_the_cache_free_graph(parax_plan, model_file, tmp_path,
                                                                       kind):
    """A decode step built over its KV cache (--past) reads the cache through
    a concat the CUDA backend does not issue: the planner must cost it as the
    cache-free graph (the KV-cache account and the attention's cache read),
    not as a copy of the cache plus live cache inputs (then 2.48 ms, 2.7 GB
    a device instead of 1.92 ms, 2.5 GB). So must a generation step
    (--cache), whose cache_update writes one row in place."""
    cached = tmp_path / "decode.mlir"
    cached.write_text(build_model(load_config("llama3-8b"), batch=8, seq=1, **{kind: 4096}))
    workload = "decode:batch=8,context=4096,tp=8"
    with_cache = plan(parax_plan, str(cached), "dgx-h100", workload)["plans"][0]
    without = plan(parax_plan, model_file("llama3-8b", 1), "dgx-h100", workload)["plans"][0]
    assert with_cache["step_time_s"] == pytest.approx(without["step_time_s"], rel=1e-3)
    for part in ("total", "kv_cache", "activations"):
        assert with_cache["memory_bytes"][part] == pytest.approx(without["memory_bytes"][part], rel=1e-3), part


def test_generation_step_memory_counts_its_caches_capacity(parax_plan, tmp_path):
    """A generation step allocates its caches at their capacity: planned at a
    shorter context, its KV-cache memory is the capacity's, its step time the
    context's (the attention stops at the position)."""
    cfg = load_config("llama3-8b")
    short, long = tmp_path / "c4096.mlir", tmp_path / "c8192.mlir"
    short.write_text(build_model(cfg, batch=8, seq=1, cache=4096))
    long.write_text(build_model(cfg, batch=8, seq=1, cache=8192))
    workload = "decode:batch=8,context=4095,tp=8"
    at4096 = plan(parax_plan, str(short), "dgx-h100", workload)["plans"][0]
    at8192 = plan(parax_plan, str(long), "dgx-h100", workload)["plans"][0]
    assert at8192["memory_bytes"]["kv_cache"] == pytest.approx(2 * at4096["memory_bytes"]["kv_cache"], rel=1e-6)
    assert at8192["step_time_s"] == pytest.approx(at4096["step_time_s"], rel=1e-3)


def test_pipelined_inference_runs_microbatches_through_the_stages(parax_plan, model_file):
    """Under PP a replica's requests may run as m microbatches, each taken
    in turn by every stage (a plain run, or parax-run --generate, with m
    batches a replica). A prefill pass then takes one microbatch's trip
    through the stages plus m - 1 turns of the slowest stage, not pp turns
    of stages each m times as large; a decode step's period is m turns of
    the slowest stage, or one microbatch's trip when that is longer."""
    cluster = "dgx-h100:nodes=2"
    prefill = "prefill:batch=8,seq=4096,pp=2,tp=8,dp=1"
    model = model_file("llama3-70b", 4096)
    best = plan(parax_plan, model, cluster, prefill)["plans"][0]
    whole = plan(parax_plan, model, cluster, prefill + ",mbs=8")["plans"][0]
    assert whole["micro_batches"] == 1 and whole["micro_batch"] == 8
    assert best["micro_batches"] > 1 and best["micro_batch"] * best["micro_batches"] == 8
    # Compute-bound: the second stage no longer waits for the whole batch
    # (1287 ms -> 775 ms), and no pipeline beats a stage's share of the work.
    assert whole["step_time_s"] / 2 < best["step_time_s"] < 0.7 * whole["step_time_s"]
    decode = "decode:batch=64,context=4096,pp=2,tp=8,dp=1"
    model = model_file("llama3-70b", 1)
    steps = {m: plan(parax_plan, model, cluster, f"{decode},mbs={64 // m}")["plans"][0]["step_time_s"]
             for m in (1, 2, 4)}
    best = plan(parax_plan, model, cluster, decode)["plans"][0]
    # Two microbatches keep both stages busy (14.6 -> 11.7 ms); four read
    # every weight four times a step, which costs more than it overlaps.
    assert best["micro_batches"] == 2 and best["step_time_s"] == pytest.approx(steps[2])
    assert steps[2] < 0.85 * steps[1] and steps[4] > steps[2]
    # Without stages, microbatches only take turns: never the planner's choice.
    for p in plan(parax_plan, model, cluster, "decode:batch=64,context=4096,pp=1", "--top", "20")["plans"]:
        assert p["micro_batches"] == 1


def test_absorbed_latent_attention_caches_the_latent(parax_plan, tmp_path):
    """DeepSeek-V3 decoding with its weight-absorbed attention (--mla
    absorbed) caches one 576-wide latent row a layer (its values are the
    keys' first 512 channels) instead of 128 heads of 192 + 128: 61 x 576 x
    2 bytes a token instead of 61 x 128 x 320 x 2 (71x less). At a context
    of 32768 for 64 sequences on 32 H800, the explicit form's caches do not
    fit, the latent ones do. Its prefill (--mla expanded) writes the same
    cache, though its attention reads every latent expanded per head: the
    cache counts what is written."""
    cfg = load_config("deepseek-v3")
    paths = {}
    for form in ("explicit", "absorbed"):
        paths[form] = tmp_path / f"{form}.mlir"
        paths[form].write_text(build_model(cfg, batch=8, seq=1, cache=32768, mla=form))
    workload = "decode:batch=64,context=32768"
    explicit = plan(parax_plan, str(paths["explicit"]), "hgx-h800:nodes=4", workload, expect=2)
    assert explicit["model"]["kv_bytes_per_token"] == 61 * 128 * (192 + 128) * 2
    assert not explicit["plans"]
    latent = plan(parax_plan, str(paths["absorbed"]), "hgx-h800:nodes=4", workload)
    assert latent["model"]["kv_bytes_per_token"] == 61 * 576 * 2
    best = latent["plans"][0]
    assert best["memory_bytes"]["total"] < 80e9
    # The prefill: 4096 tokens written into the latent cache. Its attention
    # reads them expanded (128 heads x 320 channels), yet the cache the plan
    # holds is the latent's, as the absorbed step's is.
    expanded = tmp_path / "expanded.mlir"
    expanded.write_text(build_model(cfg, batch=1, seq=4096, cache=4096, last_logits=True, mla="expanded"))
    prefill = plan(parax_plan, str(expanded), "hgx-h800:nodes=4", "prefill:batch=1,seq=4096")
    assert prefill["model"]["kv_bytes_per_token"] == 61 * 576 * 2
    for p in prefill["plans"]:
        tokens_held = p["memory_bytes"]["kv_cache"] / (61 * 576 * 2)
        assert 0 < tokens_held <= 4096, p


def test_fp8_gemms(parax_plan, model_file):
    """gemm=fp8: the GEMMs run at the device's FP8 peak, reading FP8 weights.
    Pinned to one plan, a compute-bound training step takes less time, not
    half (attention and the elementwise ops keep bf16); decoding holds and
    reads the GEMMs' weights at one byte (the embedding and the output head
    keep two); the
    expert exchange sends the dispatched rows in FP8, the combined ones in
    bf16 (3/4 of the bytes). A device without an FP8 figure: see
    test/Plan/parax-plan-gemm-error.mlir."""
    dense = model_file("llama3-8b", 4096)
    pins = "tp=8,pp=1,dp=1,mbs=1,zero=1,recompute=none"
    bf16 = plan(parax_plan, dense, "dgx-h100", f"train:batch=8,seq=4096,{pins}")["plans"][0]
    fp8 = plan(parax_plan, dense, "dgx-h100", f"train:batch=8,seq=4096,{pins},gemm=fp8")["plans"][0]
    ratio = fp8["time_s"]["compute"] / bf16["time_s"]["compute"]
    assert 0.5 < ratio < 0.8, ratio
    assert fp8["memory_bytes"]["weights"] == bf16["memory_bytes"]["weights"]  # masters as before
    decode = "decode:batch=8,context=4096,tp=1,dp=8"
    bf16 = plan(parax_plan, dense, "dgx-h100", decode)["plans"][0]
    out = plan(parax_plan, dense, "dgx-h100", decode + ",gemm=fp8")
    assert out["workload"].endswith(",gemm=fp8")
    fp8 = out["plans"][0]
    # 8.03 B parameters, 0.525 B of them the embedding's and as many the
    # output head's, both kept in bf16 (as DeepSeek-V3 keeps them)
    weights = fp8["memory_bytes"]["weights"] / bf16["memory_bytes"]["weights"]
    assert weights == pytest.approx((8.03 - 2 * 0.525 + 2 * 2 * 0.525) / (2 * 8.03), rel=0.01)
    assert fp8["weight_read_bound_s"] < 0.6 * bf16["weight_read_bound_s"]
    moe = model_file("mixtral-8x7b", 4096)
    pins = "tp=1,pp=4,ep=8,dp=1,mbs=1,zero=1,recompute=full,schedule=1f1b"
    bf16 = plan(parax_plan, moe, "dgx-h100:nodes=4", f"train:batch=8,seq=4096,{pins}")["plans"][0]
    fp8 = plan(parax_plan, moe, "dgx-h100:nodes=4", f"train:batch=8,seq=4096,{pins},gemm=fp8")["plans"][0]
    # 3/4 of the bytes; each exchange's latency stays
    assert 0.75 < fp8["time_s"]["ep_comm"] / bf16["time_s"]["ep_comm"] < 0.8


def test_fp8_training_keeps_the_gemm_inputs_in_fp8(parax_plan, model_file):
    """gemm=fp8 training keeps what only the GEMMs' gradients read in FP8, as
    DeepSeek-V3 caches the linears' inputs (§3.3.3), and the rows an expert
    dispatch holds for the experts' gradient; what another gradient reads too
    stays bf16, as does the output head's input (the head stays bf16).
    Llama-3-8B without recompute: in each of the 32 layers the two norms'
    outputs, the attention's output and SwiGLU's (3 x 4,096 + 14,336 values
    a token), a byte each instead of two.
    Mixtral-8x7B over EP8 under selective recompute (the norms' outputs made
    again, the attention's too): the dispatched rows alone, 8 ranks' 4,096 x 2
    pairs of 4,096 features in each of 32 layers."""
    dense = model_file("llama3-8b", 4096)
    pins = "train:batch=8,seq=4096,tp=1,pp=1,dp=8,mbs=1,zero=3,recompute=none"
    bf16, fp8 = (plan(parax_plan, dense, "dgx-h100", pins + extra)["plans"][0]["memory_bytes"]
                 for extra in ("", ",gemm=fp8"))
    assert bf16["activations"] - fp8["activations"] == 4096 * 32 * (3 * 4096 + 14336)
    assert bf16["weights"] == fp8["weights"] and bf16["optimizer"] == fp8["optimizer"]
    moe = model_file("mixtral-8x7b", 4096)
    pins = "train:batch=64,seq=4096,ep=8,dp=4,pp=1,tp=1,mbs=1,recompute=selective,zero=3"
    bf16, fp8 = (plan(parax_plan, moe, "dgx-h100:nodes=4", pins + extra)["plans"][0]["memory_bytes"]
                 for extra in ("", ",gemm=fp8"))
    assert bf16["activations"] - fp8["activations"] == 32 * (8 * 4096 * 2) * 4096


# (preset, workload pins): 4 layers of each, IRs of a batch the EP ranks
# divide (8: micro_batch x ep).
COUNTED = [
    ("llama3-8b", "train:batch=16,seq=2048,tp=8"),  # a vocab-parallel loss, summed over tp
    ("llama3-8b", "train:batch=16,seq=2048,tp=4,cp=2"),  # ... over cp and tp
    ("llama3-8b", "prefill:batch=8,seq=2048,pp=2,tp=4"),
    ("llama3-8b", "decode:batch=16,context=2048,pp=2,tp=4"),
    ("mixtral-8x7b", "prefill:batch=8,seq=2048,pp=2,tp=4"),  # the embedding's gathered copy sliced
    ("mixtral-8x7b", "train:batch=16,seq=2048,ep=4,tp=2"),
    ("mixtral-8x7b", "decode:batch=16,context=2048,ep=2,tp=4"),
    ("deepseek-v3", "train:batch=16,seq=2048,tp=4,dp=2"),
    ("deepseek-v3", "prefill:batch=8,seq=2048,cp=2,tp=2,pp=2"),
    ("deepseek-v3", "prefill:batch=8,seq=2048,ep=4,tp=2"),
    ("gpt3-175b", "train:batch=16,seq=2048,tp=4,cp=2"),  # a row-parallel head (50,257 columns)
    ("gpt3-175b", "prefill:batch=8,seq=2048,cp=2,tp=2,pp=2"),
]


@pytest.mark.parametrize("preset,workload", COUNTED, ids=[f"{p}-{w}" for p, w in COUNTED])
def test_counted_collectives_are_the_programs(parax_plan, parax_opt, tmp_path, preset, workload):
    """The forward collectives the planner counts for its best plan (JSON
    `collectives_per_step`) are those of the program --parax-partition
    makes of that plan, kind by kind (an expert exchange's dispatch and
    combine are all-to-alls; send/recv aside). Each kind of disagreement
    found so far was a cost the planner did not charge or charged twice:
    the loss's all-reduce, the logits' gathers, an all-to-all where the
    program sliced a gathered copy (or the reverse)."""
    import re
    from collections import Counter
    cfg = load_config(preset, layers=4)
    train = workload.startswith("train")
    decode = workload.startswith("decode")
    ir = tmp_path / "model.mlir"
    ir.write_text(build_model(cfg, batch=8, seq=1 if decode else 2048, past=2048 if decode else 0,
                              loss=train))
    counted = plan(parax_plan, str(ir), "dgx-h100", workload)["plans"][0]["collectives_per_step"]
    counted.pop("send_recv", None)
    proc = subprocess.run([parax_opt, str(ir), f"--parax-plan=cluster=dgx-h100 workload={workload}",
                           "--parax-partition"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    program = Counter()
    for op in re.findall(r"parax\.(all_gather|all_reduce|reduce_scatter|all_to_all|moe_dispatch|moe_combine) ",
                         proc.stdout):
        program["all_to_all" if op.startswith("moe_") else op] += 1
    assert counted == dict(program)
    assert sum(program.values()) > 0


# (preset, workload): tensor parallelism with pipeline and data
# parallelism, each microbatch the IR's batch of 8.
TP_BYTES = [
    ("llama3-8b", "train:batch=16,seq=2048,tp=8,mbs=8"),
    ("llama3-8b", "prefill:batch=8,seq=2048,tp=4,pp=2,mbs=8"),
    ("llama3-8b", "decode:batch=8,context=2000,tp=8,mbs=8"),
    ("mixtral-8x7b", "train:batch=16,seq=2048,tp=4,dp=2,mbs=8"),
    ("deepseek-v3", "prefill:batch=8,seq=2048,tp=8,mbs=8"),
    ("deepseek-v3", "decode:batch=8,context=2000,tp=8,mbs=8"),
    ("gpt3-175b", "train:batch=16,seq=2048,tp=4,pp=2,mbs=8"),  # a row-parallel head
]


@pytest.mark.parametrize("preset,workload", TP_BYTES, ids=[f"{p}-{w}" for p, w in TP_BYTES])
def test_tp_collective_bytes_are_the_programs(parax_plan, parax_opt, tmp_path, preset, workload):
    """The bytes the layer solver costs for each kind of collective over
    the tp group (JSON `tp_collective_bytes_per_microbatch`: an
    all-gather's gathered value, a reduce-scatter's and an all-reduce's
    input, an all-to-all's value whole over tp) are those of the program's
    collectives over ["tp"], read from their tensor types (the loss's
    scalar all-reduce aside: lit LOSS). Under cp or ep the program gathers
    the results over cp or ep before tp, the planner after: the same bytes
    on the wire, split otherwise between the axes."""
    import re
    from collections import Counter
    cfg = load_config(preset, layers=4)
    decode = workload.startswith("decode")
    ir = tmp_path / "model.mlir"
    ir.write_text(build_model(cfg, batch=8, seq=1 if decode else 2048, past=2000 if decode else 0,
                              loss=workload.startswith("train")))
    best = plan(parax_plan, str(ir), "dgx-h100", workload)["plans"][0]
    assert best["micro_batch"] == 8
    costed = best["tp_collective_bytes_per_microbatch"]
    proc = subprocess.run([parax_opt, str(ir), f"--parax-plan=cluster=dgx-h100 workload={workload}",
                           "--parax-partition"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    sizes = {"bf16": 2, "f32": 4}

    def nbytes(t):
        dims, dtype = re.match(r"tensor<((?:\d+x)*)(\w+)>", t).groups()
        n = sizes[dtype]
        for d in dims.split("x")[:-1]:
            n *= int(d)
        return n

    program = Counter()
    for kind, src, dst in re.findall(r"parax\.(all_gather|all_reduce|reduce_scatter|all_to_all) \S+ over @\w+ "
                                     r"\[\"tp\"\][^:]*: (tensor<[^>]*>) -> (tensor<[^>]*>)", proc.stdout):
        if src == "tensor<f32>":
            continue  # the loss
        program[kind] += {"all_gather": nbytes(dst), "all_to_all": nbytes(src) * best["tp"]}.get(kind, nbytes(src))
    assert {kind for kind, total in costed.items() if total} == set(program)
    for kind, total in program.items():
        assert costed[kind] == pytest.approx(total, rel=1e-9), kind


def test_pipeline_exchange_memory_follows_the_stack(parax_plan, model_file, tmp_path):
    """A training pipeline's exchange buffers as each stack holds them.
    Llama-3-8B cut to 8 layers on two stages, one sequence of 8,192 a microbatch, 1F1B: the
    first stage has 2 microbatches in flight and sends a [8192 x 4096] bf16
    activation, X = 67.1 MB, on; it receives no input. parax's runtime
    (kept, a gradient set a microbatch) holds 2X kept + 2X received
    gradients; Megatron-LM 2021 (kept, one set) 2X + X; Megatron-Core
    (freed once sent, one set) X. The stages are pinned (same split)."""
    seq, hidden = 8192, 4096
    x = seq * hidden * 2
    used = {}
    for kept, sets in [(True, True), (True, False), (False, False)]:
        best = two_stages(parax_plan, model_file, tmp_path,
                          {"pipeline_outputs_kept": kept, "pipeline_gradient_sets": sets},
                          "schedule=1f1b,recompute=full")
        used[(kept, sets)] = (best["memory_bytes"]["activations"], best["stage_start"])
    # the same split each time, so the differences are the exchanges alone
    assert len({tuple(start) for _, start in used.values()}) == 1, used
    base = used[(False, False)][0]
    assert used[(True, False)][0] - base == pytest.approx(2 * x, rel=1e-6)
    assert used[(True, True)][0] - base == pytest.approx(3 * x, rel=1e-6)


def test_interleaved_activations_follow_the_stacks_allocator(parax_plan, model_file, tmp_path):
    """An interleaved stage's activations as each stack holds them.
    Llama-3-8B cut to 8 layers on two stages of two chunks, 8 microbatches
    of one sequence: stage 0 (the fuller) warms up by 2 (p - 1) + (v - 1) p
    = 4 chunk passes and holds 5 at once, 2.5 microbatches' worth of its
    layers (Korthikanti et al. 2022: p (1 + (p - 1) / (p v))), where a
    caching allocator frees each pass after its backward; parax's runtime,
    a slot a microbatch in each chunk, holds chunk 0's 4 and chunk 1's 2:
    3. 1F1B holds p = 2. With the exchanges' buffers the same (freed once
    sent, one set), the slots lie twice as far above 1F1B as the peak."""
    used = {}
    for slots in (True, False):
        for schedule in ("1f1b", "interleaved,chunks=2"):
            best = two_stages(parax_plan, model_file, tmp_path,
                              {"pipeline_outputs_kept": False, "pipeline_gradient_sets": False,
                               "pipeline_activation_slots": slots},
                              f"schedule={schedule},recompute=none")
            used[(slots, schedule)] = (best["memory_bytes"]["activations"], best["stage_start"])
    assert len({tuple(start) for _, start in used.values()}) == 1, used
    one_f_one_b = used[(True, "1f1b")][0]
    assert used[(False, "1f1b")][0] == one_f_one_b
    slots = used[(True, "interleaved,chunks=2")][0] - one_f_one_b
    peak = used[(False, "interleaved,chunks=2")][0] - one_f_one_b
    assert peak > 0
    assert slots == pytest.approx(2 * peak, rel=1e-6)


def test_overlapped_pipeline_exchanges_wait_along_the_fill_and_drain(parax_plan, model_file, tmp_path):
    """Each chunk pass of an interleaved schedule sends its activation on
    and its gradient back: 2 (m v + p - 1) transfers in a row on the
    critical path (m = 8 microbatches, v = 2 chunks, p = 2 stages: 34).
    A stack that overlaps them with the next chunk's compute
    (Megatron-Core's overlap_p2p_comm) waits for the 2 (p - 1) = 2 along
    the fill and drain alone, each transfer here far shorter than a
    chunk's forward pass. 1F1B is not overlapped either way."""
    got = {}
    for overlap in (False, True):
        for schedule in ("1f1b", "interleaved,chunks=2"):
            best = two_stages(parax_plan, model_file, tmp_path, {"pp_overlap": overlap},
                              f"schedule={schedule},recompute=full")
            got[(overlap, schedule)] = (best["time_s"]["pp_comm"], best["transfer_s"])
    for (overlap, schedule), (pp_comm, transfer) in got.items():
        assert transfer > 0
        if schedule == "1f1b":
            assert pp_comm == pytest.approx(2 * (8 + 1) * transfer, rel=1e-9)
        else:
            assert pp_comm == pytest.approx(2 * (1 if overlap else 8 * 2 + 1) * transfer, rel=1e-9)


def test_a_replicated_boundary_sent_in_tp_pieces(parax_plan, model_file, tmp_path):
    # Megatron-LM's scatter/gather of a pipeline boundary (Narayanan et al.
    # 2021, section 4.1; pp_scatter_gather): without sequence parallelism
    # each of the tp ranks holds the whole boundary (4,096 tokens x 4,096 x
    # 2 bytes here) and sends only its 1/tp piece over its own NIC, then the
    # receiving stage all-gathers the pieces over NVLink. Llama-3-8B cut to
    # 4 layers, tp2 inside a node of 2, pp2 over 2 nodes. Off the node:
    # 8.4 us of launch, 14 us a hop, 50 GB/s x 0.93; the all-gather over 2
    # NVLink ranks: 8.4 + 3.4 us, half the bytes at 450 GB/s x 0.82. Under
    # sequence parallelism each rank already holds a piece: sent as it is.
    model = model_file("llama3-8b", 4096, layers=4)
    boundary = 4096 * 4096 * 2

    def transfer(scatter_gather, sp):
        return profiled(parax_plan, tmp_path, model, "dgx-h100:devices_per_node=2,nodes=2",
                        f"train:batch=4,seq=4096,tp=2,pp=2,dp=1,mbs=1,sp={sp},recompute=full,schedule=1f1b",
                        pp_scatter_gather=scatter_gather)["transfer_s"]

    def off(bytes_):
        return 8.4e-6 + 14e-6 + bytes_ / (50e9 * 0.93)

    gather = 8.4e-6 + 3.4e-6 + boundary / 2 / (450e9 * 0.82)
    assert transfer(False, 0) == pytest.approx(off(boundary), rel=1e-6)
    assert transfer(True, 0) == pytest.approx(off(boundary / 2) + gather, rel=1e-6)
    assert transfer(True, 1) == pytest.approx(off(boundary / 2), rel=1e-6)
    assert transfer(False, 1) == pytest.approx(off(boundary / 2), rel=1e-6)
    # --explain says how a transfer went
    path = tmp_path / "scatter.json"
    path.write_text(json.dumps({"name": "scatter", "pp_scatter_gather": True}))
    proc = subprocess.run([parax_plan, model, "--cluster", "dgx-h100:devices_per_node=2,nodes=2", "--profile", str(path),
                           "--workload", "train:batch=4,seq=4096,tp=2,pp=2,dp=1,mbs=1,sp=0,recompute=full,"
                           "schedule=1f1b", "--explain"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if "pipeline: each transfer between stages" in line)
    assert f"{1e3 * (off(boundary / 2) + gather):.3f} ms" in line and "sent in 2 pieces" in line


def test_a_stack_that_splits_the_layers_evenly(parax_plan, model_file, tmp_path):
    # Megatron-LM gives each pipeline stage num_layers / pp decoder layers
    # (the embedding on the first beside them, the output head and loss on
    # the last) and each interleaved chunk a stage's layers / v
    # (pipeline_even_split); parax's runtime splits by time. Llama-3-8B cut
    # to 4 layers on 2 stages: its 128K-row output head outweighs a layer,
    # so the split by time puts 3 layers on the first stage (layers index
    # 0 the embedding, 1-4 the decoder layers, 5 the head), the even split
    # 2 and 2, with the head on a stage of 2 layers: slower.
    model = model_file("llama3-8b", 4096, layers=4)
    work = "train:batch=8,seq=4096,tp=1,pp=2,dp=1,mbs=1,recompute=full,schedule=1f1b"
    even = profiled(parax_plan, tmp_path, model, "dgx-h100:devices_per_node=2", work, pipeline_even_split=True)
    timed = profiled(parax_plan, tmp_path, model, "dgx-h100:devices_per_node=2", work)
    assert even["stage_start"] == [0, 3]
    assert timed["stage_start"] == [0, 4]
    assert even["step_time_s"] > timed["step_time_s"]
    # Six layers on 8 devices: the even stack never takes 4 or 8 stages,
    # nor 2 chunks of a stage's 3 layers; the other takes them pinned.
    six = model_file("llama3-8b", 4096, layers=6)
    path = tmp_path / "even.json"
    path.write_text(json.dumps({"name": "even", "pipeline_even_split": True}))
    free = plan(parax_plan, six, "dgx-h100", "train:batch=8,seq=4096", "--profile", str(path), "--top", "200")["plans"]
    assert free and all(6 % p["pp"] == 0 for p in free)
    assert all(p["schedule"] != "interleaved" or (6 // p["pp"]) % p["virtual_stages"] == 0 for p in free)
    # ... and tries the v that do divide a stage's layers beyond 2, 4, 8:
    # 2 stages of 3 layers interleaved in 3 chunks of one
    three = plan(parax_plan, six, "dgx-h100", "train:batch=8,seq=4096,pp=2,schedule=interleaved", "--profile",
                 str(path), "--top", "50")["plans"]
    assert three and {p["virtual_stages"] for p in three} == {3}
    refused = plan(parax_plan, six, "dgx-h100", "train:batch=8,seq=4096,pp=4", "--profile", str(path), expect=2)
    assert not refused["plans"] and "pp=4 does not divide the model's 6 decoder layers" in refused["explanation"]
    assert plan(parax_plan, six, "dgx-h100", "train:batch=8,seq=4096,pp=4")["plans"]


def test_expert_exchanges_beside_another_microbatchs_compute(parax_plan, model_file, tmp_path):
    # ep_overlap_compute (Megatron-Core's overlap_moe_expert_parallel_comm):
    # a layer's four exchanges hide behind its forward and backward
    # compute, exposed only where they outlast it; the compute beside a
    # hidden exchange runs on the SMs the exchange kernels leave
    # (ep_overlap_sms of an H100's 132: HybridEP's 32 in Megatron-Bridge's
    # recipes), so each hidden second adds 32/132 s of compute. Qwen3-30B-A3B
    # cut to 2 layers, EP8 in one node (exchanges far shorter than the
    # compute: all hidden) and EP16 over two, a copy an expert (the
    # network's exchanges outlast it: partly exposed).
    model = model_file("qwen3-30b-a3b", 4096, layers=2)
    for cluster, ep in (("dgx-h100", 8), ("dgx-h100:nodes=2", 16)):
        work = f"train:batch={ep},seq=4096,tp=1,pp=1,dp=1,ep={ep},mbs=1,recompute=none,zero=1"
        runs = {key: profiled(parax_plan, tmp_path, model, cluster, work, ep_node_dispatch=False, **fields)["time_s"]
                for key, fields in (("off", {}), ("on", {"ep_overlap_compute": True}),
                                    ("sms", {"ep_overlap_compute": True, "ep_overlap_sms": 32}),
                                    ("all", {"ep_overlap_compute": True, "ep_overlap_sms": 1000}))}
        assert runs["off"]["ep_comm"] > 0
        assert runs["on"]["compute"] == pytest.approx(runs["off"]["compute"], rel=1e-12)
        assert runs["sms"]["ep_comm"] == pytest.approx(runs["on"]["ep_comm"], rel=1e-12)
        hidden = runs["off"]["ep_comm"] - runs["on"]["ep_comm"]
        assert runs["sms"]["compute"] - runs["on"]["compute"] == pytest.approx(hidden * 32 / 132, rel=1e-9)
        # more SMs than the device has: the compute waits out the exchange, no more
        assert runs["all"]["compute"] - runs["on"]["compute"] == pytest.approx(hidden, rel=1e-9)
        if ep == 8:
            assert runs["on"]["ep_comm"] == 0
        else:
            assert 0 < runs["on"]["ep_comm"] < runs["off"]["ep_comm"]


def test_flash_attentions_backward_at_its_own_rate(parax_plan, model_file, tmp_path):
    # A flash kernel's backward re-forms the scores and makes dv, dP, dq
    # and dk: (2d + 5 + 2dv) + (2dv + 5 + 4d) FLOPs a pair against the
    # forward's 2d + 5 + 2dv (d = dv = 128: 1290 / 517, about 2.5x), at
    # flash_backward_rate of the forward's FLOP/s (about 0.86 for
    # FlashAttention-2, cuDNN and FlashAttention-3 on an H100). So halving
    # flash_efficiency adds the attention's forward time T once in the
    # forward and r T in the backward (r = 1290 / 517), and halving
    # flash_backward_rate adds r T in the backward alone.
    # Llama-3-8B cut to 2 layers, 8,192 tokens on one H100, no recompute.
    model = model_file("llama3-8b", 8192, layers=2)
    work = "train:batch=1,seq=8192,tp=1,pp=1,dp=1,mbs=1,recompute=none"

    def compute(**fields):
        return profiled(parax_plan, tmp_path, model, "dgx-h100:devices_per_node=1", work, kernel_overhead_us=0,
                        **fields)["time_s"]["compute"]

    base = compute(flash_efficiency=0.5)
    slower_forward = compute(flash_efficiency=0.25) - base
    slower_backward = compute(flash_efficiency=0.5, flash_backward_rate=0.5) - base
    assert slower_forward > 0
    r = 1290 / 517
    assert slower_backward / slower_forward == pytest.approx(r / (1 + r), rel=1e-9)


def test_fsdp_copies_each_gathered_layer_out_on_the_compute_stream(parax_plan, model_file, tmp_path):
    # FSDP2 (zero3_copy_out) copies a layer's gathered parameters out of
    # the all-gather's buffer on the compute stream before the layer runs
    # (foreach_all_gather_copy_out): a read and a write of them, bf16, once
    # for the forward and once for the backward's gather. Llama-3-8B cut to
    # 2 layers under ZeRO-3 over 2 ranks whose links are all but free (the
    # gathers themselves cost nothing to hide): the step grows by those
    # copies exactly, every parameter twice, at HBM 3,350 GB/s x 0.85.
    model = model_file("llama3-8b", 4096, layers=2)
    cluster = tmp_path / "fast.json"
    cluster.write_text(json.dumps({
        "name": "fast", "multiprocessors": 132, "devices_per_node": 2, "nodes": 1, "peak_tflops": {"bf16": 989},
        "hbm_gb": 80, "hbm_bandwidth_gbps": 3350, "matmul_efficiency": 1, "memory_efficiency": 0.85,
        "intra_node": {"bandwidth_gbps": 1e7, "efficiency": 1, "hop_latency_us": 0.001},
        "inter_node": {"bandwidth_gbps": 50, "efficiency": 1, "hop_latency_us": 0.001},
        "collective_latency_us": 0.001}))
    work = "train:batch=2,seq=4096,tp=1,pp=1,dp=2,mbs=1,zero=3,recompute=none"
    steps = {copy: profiled(parax_plan, tmp_path, model, str(cluster), work, zero3_prefetch_layers=1,
                            zero3_copy_out=copy)["step_time_s"] for copy in (False, True)}
    h, f, v, kv = 4096, 14336, 128256, 1024
    params = 2 * (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h) + 2 * v * h + h
    assert steps[True] - steps[False] == pytest.approx(2 * 2 * 2 * params / (3350e9 * 0.85), rel=1e-4)


def test_a_sliding_window_costs_the_pairs_it_sees(parax_plan, tmp_path):
    """Mistral's attention over a window of 1,024 keys in a prefill of 8,192
    tokens: a query at position p sees min(p + 1, 1024) keys, 7,864,832
    pairs in all (the causal triangle without it: 33,558,528), so the model
    FLOPs a token drop by 2 layers x 4 heads x (33,558,528 - 7,864,832) /
    8,192 pairs x (2 x 16 + 5 + 2 x 16) FLOPs = 1,731,313.5; and the step
    with them."""
    flops, steps = {}, {}
    for window in (None, 1024):
        config = tmp_path / f"config-{window}.json"
        config.write_text(json.dumps(dict(PRESETS["tiny-mistral"], sliding_window=window,
                                          max_position_embeddings=8192)))
        model = tmp_path / f"model-{window}.mlir"
        model.write_text(build_model(load_config(str(config)), seq=8192))
        out = plan(parax_plan, str(model), "dgx-h100:devices_per_node=1", "prefill:batch=1,seq=8192")
        flops[window], steps[window] = out["model"]["flops_per_token"], out["plans"][0]["step_time_s"]
    assert flops[None] - flops[1024] == pytest.approx(2 * 4 * (33558528 - 7864832) / 8192 * 69, rel=1e-12)
    assert steps[1024] < steps[None]


def test_zero3_under_a_pipeline_kept_gathered(parax_plan, model_file, tmp_path):
    # torchtitan's FSDP under PP (reshard_after_forward=False, the schedule's
    # no-sync microbatches): a stage's parameters gathered once a step and
    # kept in bf16, its gradients unsharded in fp32 until the last of the 4
    # microbatches, gathered and reduced once. Llama 3 8B cut to 4 layers on
    # pp2 x dp4: the fuller stage holds the embedding (128256 x 4096) and 3
    # decoder layers (218,112,000 parameters each): 1,179,672,576 in all.
    model = model_file("llama3-8b", 2048, layers=4)
    work = "train:batch=16,seq=2048,dp=4,tp=1,pp=2,mbs=1,zero=3,recompute=none,schedule=1f1b"
    plans = {kept: profiled(parax_plan, tmp_path, model, "dgx-h100", work, zero3_prefetch_layers=1,
                            runtime_buffers=False, zero3_pipeline_unsharded=kept) for kept in (False, True)}
    each, once = plans[False], plans[True]
    assert each["stage_start"] == once["stage_start"] == [0, 4]
    assert once["time_s"]["dp_comm"] * 4 == pytest.approx(each["time_s"]["dp_comm"], rel=1e-9)
    stage = (128256 * 4096 + 3 * 218_112_000) * 2
    # the stage whole in bf16 instead of its largest layer (the embedding)
    # twice (this one and the prefetched next)
    assert once["memory_bytes"]["weights"] - each["memory_bytes"]["weights"] == pytest.approx(
        stage - 2 * 128256 * 4096 * 2, rel=1e-6)
    assert once["memory_bytes"]["gradients"] - each["memory_bytes"]["gradients"] == pytest.approx(2 * stage, rel=1e-6)


def test_a_node_deduplicating_dispatch_sends_a_token_once_a_node(parax_plan, model_file, tmp_path):
    # DeepEP's dispatch (the deepseek-v3 profile's ep_node_dispatch): a token
    # goes once over the network to each other node holding one of its 8
    # experts and is copied there over NVLink. DeepSeek-V3 cut to 4 layers
    # (its last the one MoE layer) on EP16 over 2 H100 nodes, one sequence
    # of 4096 tokens a rank, bf16 rows of 7168: 58,720,256 bytes. Its 8
    # groups, 4 a node, 4 reachable: a token misses a node with probability
    # C(4,4)/C(8,4) = 1/70, so it reaches 2 x 69/70 nodes, the other one's
    # share 1/2. Off the node: 22.4 us of latency and hops plus those bytes
    # at 50 GB/s x 0.93; on it, 8 x 7/8 copies at 450 GB/s x 0.82, at once.
    # A layer's step: dispatch and combine, forward and backward.
    model = model_file("deepseek-v3", 4096, layers=4)
    work = "train:batch=16,seq=4096,dp=1,ep=16,tp=1,pp=1,mbs=1,zero=1,recompute=full,capacity=2"
    runs = {dedup: profiled(parax_plan, tmp_path, model, "dgx-h100:nodes=2", work, ep_node_dispatch=dedup,
                            runtime_buffers=False) for dedup in (False, True)}
    best, plain = runs[True], runs[False]
    rows = 4096 * 7168 * 2
    off = 8.4e-6 + 14e-6 + rows * (2 * 69 / 70) / 2 / (50e9 * 0.93)
    on = rows * 8 * 7 / 8 / (450e9 * 0.82)
    assert off > on
    assert best["time_s"]["ep_comm"] == pytest.approx(4 * off, rel=1e-6)
    # the all-to-all of one copy an expert sends 8 copies, half of them off
    # the node: about twice the time
    assert plain["time_s"]["ep_comm"] > 1.8 * best["time_s"]["ep_comm"]


def test_a_dispatch_in_the_models_dtype_under_fp8_gemms(parax_plan, model_file, tmp_path):
    # With gemm=fp8, DeepSeek-V3 quantises the dispatched rows before they
    # leave (1 byte an element); Megatron-Core's dispatchers send the bf16
    # hidden states and quantise in the experts' GEMMs (ep_dispatch_fp8
    # false, as megatron-core and megatron-bridge set it). The combine is
    # bf16 either way. The previous test's DeepSeek-V3 layer on EP16 over 2
    # H100 nodes, the dispatch once a node: off the node 22.4 us of latency
    # and hops plus the rows' bytes, 2 x 69/70 nodes reached, half of them
    # the other node, at 50 GB/s x 0.93 (NVLink's copies take less time).
    model = model_file("deepseek-v3", 4096, layers=4)
    work = "train:batch=16,seq=4096,dp=1,ep=16,tp=1,pp=1,mbs=1,zero=1,recompute=full,capacity=2,gemm=fp8"
    runs = {fp8: profiled(parax_plan, tmp_path, model, "dgx-h100:nodes=2", work, ep_node_dispatch=True,
                          ep_dispatch_fp8=fp8, runtime_buffers=False) for fp8 in (False, True)}

    def off(element_bytes):
        return 8.4e-6 + 14e-6 + 4096 * 7168 * element_bytes * (2 * 69 / 70) / 2 / (50e9 * 0.93)

    # forward and backward, each a dispatch and a combine
    assert runs[True]["time_s"]["ep_comm"] == pytest.approx(2 * (off(1) + off(2)), rel=1e-6)
    assert runs[False]["time_s"]["ep_comm"] == pytest.approx(4 * off(2), rel=1e-6)
    # megatron-core says so, and its report says which
    shipped = subprocess.run([parax_plan, "--profile", "megatron-bridge", "--print-profile"],
                             capture_output=True, text=True, timeout=60)
    printed = json.loads(shipped.stdout)
    assert printed["ep_dispatch_fp8"] is False and printed["reduce_bytes"] == 2


def test_a_gemm_an_expert_on_a_few_streams(parax_plan, model_file, tmp_path):
    # TransformerEngine's GroupedLinear on Hopper runs one cuBLAS GEMM an
    # expert on 4 streams (expert_gemm_streams), not one grouped kernel:
    # each of a rank's 128 Qwen3-30B-A3B experts launches its 2 GEMMs on
    # its own. A prefill of 16,384 tokens through 2 MoE layers on one H100:
    # 2 x (2 x 128 - 1) launches of 2 us more than the grouped kernel's one.
    model = model_file("qwen3-30b-a3b", 16384, layers=2)
    work = "prefill:batch=1,seq=16384,tp=1,pp=1,dp=1,ep=1"

    def step(**fields):
        return profiled(parax_plan, tmp_path, model, "dgx-h100:devices_per_node=1", work, kernel_overhead_us=2,
                        **fields)["step_time_s"]

    assert step(expert_gemm_streams=1) - step() == pytest.approx(2 * 255 * 2e-6, rel=1e-6)
    # by shape (compute-bound: 1.2 TFLOP a layer against 1.2 GB of expert
    # weights): an expert's 1,024 x 768 output is 48 tiles of 128 x 128,
    # split-K in 2 to 96 of the 132 SMs (0.73); 4 at once, 192 tiles in 2
    # waves (0.73 again); the grouped kernel's 128 experts, 47 waves
    # nearly full
    one, four, grouped = (step(gemm_shapes=True, expert_gemm_streams=n) for n in (1, 4, 0))
    assert one == pytest.approx(four, rel=1e-9)
    assert four - 2 * 255 * 2e-6 > grouped * 1.02


def test_the_experts_memory_bound_kernels(parax_plan, model_file, tmp_path):
    # A grouped MLP gathers its (token, choice) rows into expert order,
    # runs the gated activation between its GEMMs and scatters the rows
    # back: 4 hidden rows a pair and 3 expert widths a pair, at the plain
    # memory-bound ops' passes. Mixtral (top 2, hidden 4,096, experts
    # 14,336 wide), a prefill of 128 tokens through 2 layers on one H100:
    # raising the plain ops' passes from 1 to 3 adds, a layer, 2 passes
    # over those bytes and over the 2 residual adds' (2 operands and a
    # result of 128 x 4,096, bf16), at 3,350 GB/s x 0.85.
    model = model_file("mixtral-8x7b", 128, layers=2)
    work = "prefill:batch=1,seq=128,tp=1,pp=1,dp=1,ep=1"
    steps = [profiled(parax_plan, tmp_path, model, "dgx-h100:devices_per_node=1", work,
                      elementwise_passes={"add": passes})["step_time_s"] for passes in (1, 3)]
    experts = 128 * 2 * (4 * 4096 + 3 * 14336) * 2
    adds = 2 * 3 * 128 * 4096 * 2
    assert steps[1] - steps[0] == pytest.approx(2 * 2 * (experts + adds) / (3350e9 * 0.85), rel=1e-6)


def test_gemms_beside_a_decomposed_reduce_scatter_leave_it_sms(parax_plan, model_file, tmp_path):
    # TransformerEngine's userbuffers "pipeline" overlap runs the GEMM that
    # writes a reduce-scattered value on the SMs its communication leaves
    # (num_sm 16, set_sm_margin): Llama-3-8B cut to 2 layers, TP2 with
    # sequence parallelism on two H100s, 1,024 tokens: the attention's
    # output projection and the MLP's down projection (row-parallel,
    # 2 x 1024 x (4096 x 4096 + 14336 x 4096) / 2 FLOPs a layer, bound by
    # their FLOPs at 989 TF x 0.716 x 0.972, the slowest of a busy node's
    # devices) take 132/116 as long in the forward;
    # their backward's data gradients gather instead (no SMs held).
    model = model_file("llama3-8b", 1024, layers=2)
    work = "train:batch=1,seq=1024,tp=2,pp=1,dp=1,sp=1,recompute=none"

    def compute(sms):
        return profiled(parax_plan, tmp_path, model, "dgx-h100:devices_per_node=2", work, gemm_shapes=False,
                        kernel_overhead_us=0, tp_overlap_gemms=True, tp_overlap_sms=sms)["time_s"]["compute"]

    rows = 2 * 1024 * (4096 * 4096 + 14336 * 4096) / 2 / (989e12 * 0.716 * 0.972)
    assert compute(16) - compute(0) == pytest.approx(2 * rows * (132 / 116 - 1), rel=1e-6)


def test_a_decomposed_gemm_runs_in_chunks(parax_plan, model_file, tmp_path):
    # Decomposed with its TP collective, a GEMM runs as tp GEMMs, one a
    # peer's rows, each a kernel: TP2 (one kernel more, 1 us), Llama-3-8B
    # cut to 2 layers, 8,192 tokens (every GEMM bound by its FLOPs, which
    # the chunks split). Forward, a layer: q, k, v, gate and up read a
    # gathered value, o and down write a reduce-scattered one: 7 more
    # kernels. Backward: o's and down's data gradients gather their input
    # in chunks (2 more); the others' gradients run whole.
    model = model_file("llama3-8b", 8192, layers=2)
    work = "train:batch=1,seq=8192,tp=2,pp=1,dp=1,sp=1,recompute=none"

    def compute(decomposed):
        return profiled(parax_plan, tmp_path, model, "dgx-h100:devices_per_node=2", work, gemm_shapes=False,
                        kernel_overhead_us=1, tp_overlap_gemms=decomposed)["time_s"]["compute"]

    assert compute(True) - compute(False) == pytest.approx(2 * (7 + 2) * 1e-6, rel=1e-6)


def test_gradient_sums_in_the_reduction_type_where_the_gemms_add_into_them(parax_plan, model_file, tmp_path):
    # Megatron-Core's weight-gradient GEMMs add into its DDP buffer, which
    # is bf16 under grad_reduce_in_fp32 = False (reduce_bytes 2): the
    # step's gradient sums take 2 bytes a parameter, not 4. A stack that
    # does not fuse keeps fp32 sums whatever it reduces in.
    model = model_file("llama3-8b", 128, layers=2)
    work = "train:batch=1,seq=128,tp=1,pp=1,dp=1,zero=1,recompute=none"
    out = plan(parax_plan, model, "dgx-h100:devices_per_node=1", work)
    params = out["model"]["parameters"]

    def optimizer(**fields):
        return profiled(parax_plan, tmp_path, model, "dgx-h100:devices_per_node=1", work,
                        **fields)["memory_bytes"]["optimizer"]

    assert optimizer(gradient_fusion=True, reduce_bytes=4) - optimizer(gradient_fusion=True, reduce_bytes=2) == \
        pytest.approx(2 * params, rel=1e-6)
    assert optimizer(gradient_fusion=False, reduce_bytes=2) == optimizer(gradient_fusion=False, reduce_bytes=4)


def test_the_experts_kept_intermediates(parax_plan, model_file, tmp_path):
    # Megatron-Core's grouped MLP keeps each pair's gated pair and
    # activation in bf16 for its backward (expert_kept_bytes 6 an element
    # of the expert's width); parax's runtime recomputes them (0). Mixtral
    # training, one microbatch of 256 tokens, top 2 of 8 experts 14,336
    # wide, 2 layers on one H100: 2 x 6 x 256 x 2 x 14,336 bytes more, and
    # without expert parallelism the rows permuted into expert order (256
    # x 2 rows of 4,096, bf16) that the first GEMM's weight gradient reads.
    model = model_file("mixtral-8x7b", 256, layers=2)
    work = "train:batch=1,seq=256,tp=1,pp=1,dp=1,ep=1,recompute=none"
    kept = [profiled(parax_plan, tmp_path, model, "dgx-h100:devices_per_node=1", work,
                     expert_kept_bytes=b)["memory_bytes"]["activations"] for b in (0, 6)]
    assert kept[1] - kept[0] == pytest.approx(2 * (6 * 256 * 2 * 14336 + 256 * 2 * 4096 * 2), rel=1e-9)
    shipped = {name: json.loads(subprocess.run([parax_plan, "--profile", name, "--print-profile"],
                                               capture_output=True, text=True, timeout=60).stdout)
               for name in ("megatron-core", "deepseek-v3", "roofline")}
    assert [shipped[n]["expert_kept_bytes"] for n in ("megatron-core", "deepseek-v3", "roofline")] == [6, 2, 0]


def test_experts_quantising_their_own_rows(parax_plan, model_file, tmp_path):
    # gemm=fp8 where the dispatch leaves the rows in bf16 (ep_dispatch_fp8
    # false): the experts' GEMMs quantise their inputs themselves, 2 passes
    # (megatron-core's fp8_casts) over the 2 x 128 dispatched rows of 4096
    # and the down-projection's 2 x 128 rows of 14,336, bf16, at 3,350 GB/s
    # x 0.85, in each of 2 layers of a Mixtral prefill on one H100.
    model = model_file("mixtral-8x7b", 128, layers=2)
    work = "prefill:batch=1,seq=128,tp=1,pp=1,dp=1,ep=1,gemm=fp8"
    steps = {fp8: profiled(parax_plan, tmp_path, model, "dgx-h100:devices_per_node=1", work,
                           fp8_casts={"activations": 2}, ep_dispatch_fp8=fp8)["step_time_s"] for fp8 in (True, False)}
    casts = 2 * 2 * 128 * (4096 + 14336) * 2 / (3350e9 * 0.85)
    assert steps[False] - steps[True] == pytest.approx(2 * casts, rel=1e-6)


def test_experts_folded_over_the_tp_ranks(parax_plan, model_file, tmp_path):
    # etp=1 (Megatron's expert_tensor_parallel_size = 1): each expert whole
    # on one of ep x tp ranks, each rank dispatching its sequence shard;
    # etp=tp splits every expert over the TP ranks, each of them sending
    # the whole sequence. Qwen3-30B-A3B cut to 2 layers (both MoE) on 2
    # H100 nodes, tp2 ep8 (grid [pp, dp, ep, cp, tp]), one sequence of 4096
    # a rank. Split: the all-to-all over the 8 ep ranks at stride 2, 4 a
    # node, 4096 x 8 choices x 2048 x 2 bytes a rank, half of it off the
    # node. Folded: over all 16 ranks, 8 a node, half the rows, half of
    # them off the node. Off the node 8.4 us of launch and 14 us a hop,
    # the bytes at 50 GB/s x 0.93 (NVLink's share takes less); a layer's
    # dispatch and combine, forward and backward.
    model = model_file("qwen3-30b-a3b", 4096, layers=2)
    runs = {etp: profiled(parax_plan, tmp_path, model, "dgx-h100:nodes=2",
                          f"train:batch=8,seq=4096,tp=2,ep=8,dp=1,pp=1,mbs=1,sp=1,etp={etp}", expert_folding=True,
                          runtime_buffers=False) for etp in (1, 2)}
    rows = 4096 * 8 * 2048 * 2

    def off(bytes_):
        return 8.4e-6 + 14e-6 + bytes_ / (50e9 * 0.93)

    assert runs[2]["experts_folded"] is False and runs[1]["experts_folded"] is True
    assert runs[2]["time_s"]["ep_comm"] == pytest.approx(2 * 4 * off(rows / 2), rel=1e-6)
    assert runs[1]["time_s"]["ep_comm"] == pytest.approx(2 * 4 * off(rows / 2 / 2), rel=1e-6)
    # the experts' weights a rank holds are the same share (1/16 of them,
    # whole or halved), and so is its compute
    assert runs[1]["memory_bytes"]["weights"] == pytest.approx(runs[2]["memory_bytes"]["weights"], rel=1e-9)
    # a stack without folding: etp=1 is refused, the free search does not fold
    stock = tmp_path / "stock.json"
    stock.write_text(json.dumps({"name": "stock"}))
    free = plan(parax_plan, model, "dgx-h100:nodes=2", "train:batch=8,seq=4096", "--profile", str(stock),
                "--top", "50")["plans"]
    assert free and not any(p["experts_folded"] for p in free)


def test_a_decode_step_reads_the_chosen_experts_only(parax_plan, model_file):
    # One token, 2 of Mixtral's 8 experts chosen: a decode step reads those
    # 2 experts' weights (3 x 4096 x 14336 bf16 each), every FFN split over
    # tp2 (each rank its half of both): 2 x 352,321,536 / 2 bytes at
    # 3,350 GB/s x 0.85 = 0.124 ms a rank, the token's own rows beside them
    # negligible.
    import re
    model = model_file("mixtral-8x7b", 128, layers=1)
    proc = subprocess.run([parax_plan, model, "--cluster", "dgx-h100:devices_per_node=2", "--workload",
                           "decode:batch=1,context=128,tp=2", "--explain"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    ms = float(re.search(r"parax\.experts\s+ffn\s+([0-9.]+)", proc.stdout).group(1))
    assert ms == pytest.approx(2 * 3 * 4096 * 14336 * 2 / 2 / (3350e9 * 0.85) * 1e3, abs=0.0015)


def test_the_front_doors_plan_page_draws_the_best_plan(tmp_path):
    # `parax plan --html`: the best plan's time by term, each of its two
    # stages' memory by kind (the JSON's per-stage figures, stacked to their
    # totals) and the pipeline timeline, a rectangle a simulated pass.
    import re
    import sys
    page = tmp_path / "plan.html"
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    args = ["llama3-8b", "--cluster", "dgx-h100", "--workload", "train:batch=8,seq=1024,pp=2,tp=4,dp=1,mbs=1",
            "--layers", "4", "--profile", "megatron-core"]
    proc = subprocess.run([sys.executable, "-m", "parax", "plan", *args, "--html", str(page), "--top", "1"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pp2 dp1 ep1 tp4" in proc.stdout
    text = page.read_text()
    memory = re.findall(r"<title>stage (\d): (\w+) ([0-9.]+) GB</title>", text)
    assert {stage for stage, _, _ in memory} == {"0", "1"}
    assert {kind for _, kind, _ in memory} >= {"weights", "optimizer", "activations", "reserved"}
    passes = re.findall(r"<title>([FB]+\d+)(?: c\d+)?: [0-9.]+ ms</title>", text)
    # 8 microbatches on 2 stages: forward and backward each, the last
    # stage's as one pass
    assert len(passes) == 8 * 2 + 8, passes
    assert "the step, " in text and "by term" in text


def test_the_python_api_returns_plans_as_objects():
    # parax.plan: parax-plan's ranked plans as Plan objects; a pinned
    # workload gives back the pinned plan, and a plan's pins reproduce it.
    import parax
    result = parax.plan("llama3-8b", "dgx-h100:nodes=2", "train:batch=64,seq=4096,tp=2,pp=2,cp=1",
                        profile="megatron-core", layers=4, top=3)
    best = result.best
    assert (best.tp, best.pp, best.dp, best.ep, best.cp) == (2, 2, 4, 1, 1)
    assert best.degrees.startswith("pp2 dp4 ep1 cp1 tp2")
    assert best.step_time_s == best.json["step_time_s"] > 0
    assert len(best.stage_memory_bytes) == 2
    again = parax.plan("llama3-8b", "dgx-h100:nodes=2", "train:batch=64,seq=4096," + best.pins,
                       profile="megatron-core", layers=4, top=1).best
    assert again.degrees == best.degrees
    nothing = parax.plan("llama3-70b", "dgx-h100:devices_per_node=1", "train:batch=8,seq=4096")
    assert nothing.plans == [] and "nothing fits" in nothing.explanation
    with pytest.raises(ValueError, match="no plan"):
        nothing.best


def test_a_sliding_window_keeps_its_windows_tokens_in_the_kv_cache(parax_plan, tmp_path):
    """Decoding Mistral (2 layers, 2 KV heads of 16, bf16 caches) at a
    context of 8,192 with a window of 1,024: each layer's cache holds the
    window's tokens (parax's generation step keeps a ring), 2 layers x
    (keys + values) x 2 heads x 16 x 2 bytes = 256 bytes a token, by 1,024
    tokens by 4 sequences = 1,048,576 bytes; without the window the
    context's and the step's 8,193 tokens: 8,389,632. The generation step built over its rings plans the
    same: each ring of 1,023 tokens, plus nothing a token."""
    kv = {}
    for window in (None, 1024):
        config = tmp_path / f"config-{window}.json"
        config.write_text(json.dumps(dict(PRESETS["tiny-mistral"], sliding_window=window,
                                          max_position_embeddings=8192)))
        model = tmp_path / f"model-{window}.mlir"
        model.write_text(build_model(load_config(str(config)), batch=4, seq=1))
        out = plan(parax_plan, str(model), "dgx-h100:devices_per_node=1", "decode:batch=4,context=8192")
        kv[window] = out["plans"][0]["memory_bytes"]["kv_cache"]
    assert kv[None] == pytest.approx(2 * 2 * 2 * 16 * 2 * 8193 * 4, rel=1e-9)
    assert kv[1024] == pytest.approx(2 * 2 * 2 * 16 * 2 * 1024 * 4, rel=1e-9)
    step = tmp_path / "step.mlir"
    step.write_text(build_model(load_config(str(tmp_path / "config-1024.json")), batch=4, seq=1, cache=8192))
    assert "parax.ring_cache_update" in step.read_text()
    out = plan(parax_plan, str(step), "dgx-h100:devices_per_node=1", "decode:batch=4,context=8192")
    assert out["plans"][0]["memory_bytes"]["kv_cache"] == pytest.approx(2 * 2 * 2 * 16 * 2 * 1023 * 4, rel=1e-9)
