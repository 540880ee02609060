#!/usr/bin/env python3
"""The closed loop on this machine's CPU ranks: calibrate, then predict.

    .venv/bin/python bench/calibration.py [--build build] [--rounds 3]

1. Calibration runs (parax-run --profile): a small Llama's prefill on one
   rank at two sizes and under TP2 (its collectives), its training step
   with AdamW under TP2 with sequence parallelism and under DP2 (the
   gradient all-reduces), generation loops of a wider Llama (254 MB of
   weights, past the last-level cache) of 2 and of 8 rows (GEMMs
   streaming their weights, beside little and beside as much arithmetic)
   and of a row on each of 2 ranks (the memory two cores share), a small
   Mixtral's prefill on one rank and under EP2, and a sweep of each
   collective kind over message sizes (64 KB to 32 MB a rank), as
   nccl-tests measures NCCL.
2. parax-plan --calibrate fits a cluster and a profile to them
   (docs/cost-model.md, "Calibration").
3. Other plans -- other shapes, other layouts, other workloads: prefill,
   training with AdamW, generation; TP, PP, DP, CP, EP; a Llama and a
   Mixtral -- are each planned with the calibrated files (parax-plan
   --json: the predicted step), compiled with the same pins, and run
   (parax-run, the median step of several); rounds interleave the plans,
   and each round runs the calibration runs again: the predictions
   printed come from the fit to every round's calibration runs (the
   machine's speed drifts between invocations; a fit made before the
   plans ran carried that drift into every prediction). Each prediction
   is of the program the final fit chooses: a plan it partitions
   otherwise than the one that ran is compiled again and measured in as
   many rounds more (and the fit made again); one still otherwise is
   marked "*".
4. Printed: each plan's predicted and measured step and their error; for
   each group of plans of one workload on 2 ranks, whether the plan
   predicted fastest is the measured fastest or within 5 % of it; last,
   the largest |error| and the ranking agreement.

One GEMM thread a rank (OMP_NUM_THREADS=1), each rank bound to a core of its own, a
one-rank run to the slowest core (a synchronous step goes at its slowest
rank's pace; on this VM one core's memory streams up to 30 % slower).
Plans of more ranks than cores (4 on this machine's 2) run with
consecutive ranks on one core (a TP group together) and are costed on a
cluster whose every rate is cores / ranks of the calibrated one: the ranks
share the cores by time slicing.
"""

import argparse
import atexit
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), OMP_NUM_THREADS="1",
           OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_btl_vader_single_copy_mechanism="none")
PY = os.path.join(ROOT, ".venv", "bin", "python")

LLAMA = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 8192,
         "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "tie_word_embeddings": False}
# The generation runs' and plans' Llama: 254 MB of weights, so that even a
# TP2 rank's half streams from DRAM. This machine's last-level cache is 32
# MB, and a few-row GEMM over a weight set that fits it streams at 33-36
# GB/s against 13-20 from DRAM (session 54, one core, 4 rows, 8-128 MB of
# [1024, 512] blocks): the 64 MB Llama above, split over TP2, ran its
# generation step at 1.6-2.4 ms where the planner, which has no cache
# tier, said 2.4 (docs/cost-model.md, "Calibration").
LLAMA_GEN = dict(LLAMA, hidden_size=1024, intermediate_size=2816, num_attention_heads=16,
                 num_key_value_heads=8)
MIXTRAL = {"model_type": "mixtral", "hidden_size": 384, "intermediate_size": 768, "num_hidden_layers": 2,
           "num_attention_heads": 6, "num_key_value_heads": 2, "vocab_size": 8192,
           "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 1e6,
           "num_local_experts": 4, "num_experts_per_tok": 2, "tie_word_embeddings": False}
# A starting point for the fit: only its counts and memory are kept.
BASE_CLUSTER = {"name": "this-cpu", "device": "one core (oneDNN sgemm, one thread)", "devices_per_node": 2,
                "nodes": 1, "peak_tflops": {"f32": 0.1}, "hbm_gb": 8, "hbm_bandwidth_gbps": 5,
                "matmul_efficiency": 1, "memory_efficiency": 1,
                "intra_node": {"bandwidth_gbps": 5, "efficiency": 1, "hop_latency_us": 10},
                "inter_node": {"bandwidth_gbps": 5, "efficiency": 1, "hop_latency_us": 10},
                "collective_latency_us": 20}


class Bench:
    def __init__(self, build, work):
        self.bin = os.path.join(build, "bin")
        self.work = work
        self.core = None  # the core one-rank runs are bound to (None: any)

    def path(self, name):
        return os.path.join(self.work, name)

    def sh(self, cmd, timeout=600):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
        return out.stdout

    def model(self, name, config):
        with open(self.path(name + ".json"), "w") as f:
            json.dump(config, f)
        self.sh([PY, "-c", "import sys; from parax.checkpoint import random_weights, save_safetensors; "
                 "from parax.models import load_config; "
                 "save_safetensors(sys.argv[2], random_weights(load_config(sys.argv[1]), seed=1))",
                 self.path(name + ".json"), self.path(name + ".safetensors")])

    def ir(self, model, batch, seq, loss=False, cache=0):
        name = f"{model}-b{batch}-s{seq}{'-loss' if loss else ''}{f'-c{cache}' if cache else ''}.mlir"
        if not os.path.exists(self.path(name)):
            self.sh([PY, "-m", "parax.models", self.path(model + ".json"), "--batch", str(batch), "--seq",
                     str(seq), "--dtype", "f32"] + (["--loss"] if loss else []) +
                    (["--cache", str(cache)] if cache else []) + ["-o", self.path(name)])
        return self.path(name)

    def collective_sweep(self):
        """A program of collectives only, over 2 ranks -- all-reduce,
        all-gather, reduce-scatter and all-to-all of 4 KB to 32 MB a rank,
        a power of two apart (what nccl-tests measures for NCCL) -- with
        its inputs and an empty weights file: (exe, inputs, weights)."""
        args, body, results, types, inputs = [], [], [], [], []
        for i, k in enumerate(range(10, 24)):
            half = 2 ** k // 2
            t = f"tensor<2x{half}xf32>"
            args.append(f"%x{i}: {t} {{parax.input = {i} : i64}}")
            body += [f'%r{i} = parax.all_reduce %x{i} over @g ["tp"] : {t} -> {t}',
                     f'%g{i} = parax.all_gather %x{i} over @g ["tp"] dim 0 : {t} -> tensor<4x{half}xf32>',
                     f'%s{i} = parax.reduce_scatter %g{i} over @g ["tp"] dim 0 : tensor<4x{half}xf32> -> {t}',
                     f'%a{i} = parax.all_to_all %x{i} over @g ["tp"] split 1 concat 0 : {t} -> '
                     f'tensor<4x{half // 2}xf32>']
            results += [f"%r{i}", f"%s{i}", f"%a{i}"]
            types += [t, t, f"tensor<4x{half // 2}xf32>"]
            inputs.append(self.path(f"sweep-{i}.npy"))
            self.sh([PY, "-c", "import sys, numpy as np; np.save(sys.argv[1], np.random.default_rng(int(sys.argv[3]))"
                     ".standard_normal((2, int(sys.argv[2]))).astype(np.float32))", inputs[-1], str(half), str(i)])
        text = ("module {\n  parax.grid @g (tp = 2)\n  func.func @forward(" + ", ".join(args) + ") -> (" +
                ", ".join(types) + ") {\n" + "".join(f"    {line}\n" for line in body) + "    return " +
                ", ".join(results) + " : " + ", ".join(types) + "\n  }\n}\n")
        with open(self.path("sweep.mlir"), "w") as f:
            f.write(text)
        self.sh([os.path.join(self.bin, "parax-translate"), "--to-executable", self.path("sweep.mlir"), "-o",
                 self.path("sweep.pxe")])
        with open(self.path("empty.safetensors"), "wb") as f:  # (no parameters)
            f.write((8).to_bytes(8, "little") + b"{}      ")
        return self.path("sweep.pxe"), inputs, self.path("empty.safetensors")

    def tokens(self, name, rows, cols, seed):
        path = self.path(name + ".npy")
        self.sh([PY, "-c", "import sys, numpy as np; np.save(sys.argv[1], np.random.default_rng("
                 "int(sys.argv[4])).integers(0, 8192, size=(int(sys.argv[2]), int(sys.argv[3])))"
                 ".astype(np.int32))", path, str(rows), str(cols), str(seed)])
        return path

    def run_arguments(self, kind, rows, seq, prompt, steps):
        """parax-run's inputs and arguments for `rows` rows: a generation
        loop of `prompt` tokens then as many generated, or `steps` steps of
        a prefill or of training with AdamW ({inputs}, {arguments})."""
        if kind == "generate":
            return [self.tokens(f"prompt-{rows}x{prompt}", rows, prompt, 4)], ["--generate", str(prompt)]
        inputs, extra = [self.tokens(f"tok-{rows}x{seq}", rows, seq, 2)], ["--steps", str(steps)]
        if kind == "train":
            inputs.append(self.tokens(f"lab-{rows}x{seq}", rows, seq, 3))
            extra += ["--optimizer", "adamw"]
        return inputs, extra

    def partition(self, ir, name, cluster, profile, workload, train):
        """The plan the search picks for `workload` written onto `ir` and
        partitioned: NAME.mlir."""
        passes = [f"--parax-plan=cluster={cluster} profile={profile} workload={workload}"]
        if train:
            passes.append("--parax-autodiff")
        self.sh([os.path.join(self.bin, "parax-opt"), ir] + passes +
                ["--parax-partition", "-o", self.path(name + ".mlir")])
        return self.path(name + ".mlir")

    def compile(self, ir, name, cluster, profile, workload, train):
        """... and translated: NAME.pxe."""
        self.partition(ir, name, cluster, profile, workload, train)
        self.sh([os.path.join(self.bin, "parax-translate"), "--to-executable", self.path(name + ".mlir"),
                 "-o", self.path(name + ".pxe")])
        return self.path(name + ".pxe")

    def predict(self, ir, cluster, profile, workload):
        out = json.loads(self.sh([os.path.join(self.bin, "parax-plan"), ir, "--cluster", cluster,
                                  "--profile", profile, "--workload", workload, "--json", "--top", "1"]))
        if not out["plans"]:
            raise RuntimeError(f"no plan for {workload}: {out.get('explanation')}")
        return out["plans"][0]

    def run(self, exe, ranks, weights, inputs, extra=(), profile=None, core=None):
        """parax-run's step time: each rank bound to a core of its own
        (rank r to core r), a one-rank run to `core` (default self.core);
        more ranks than cores share them unbound."""
        core = self.core if core is None else core
        run = [os.path.join(self.bin, "parax-run"), exe, "--weights", weights] + list(extra)
        if ranks > CORES:
            # More ranks than cores: consecutive ranks share a core (rank r
            # on core r x cores / ranks), so that a TP group (the grid's
            # minor axis) time-slices one core and a rank waiting for its
            # partner yields to it. Unbound, a waiting rank yielded beside
            # another group's rank on the other core and took its turns
            # there: a TP2 x DP2 prefill 235-271 ms a step against 197-208
            # paired (TP4 215-261 against 215-228; DP4 alike), session 54.
            bind = ["--oversubscribe", "--bind-to", "none", "sh", "-c",
                    f'exec taskset -c $((OMPI_COMM_WORLD_RANK * {CORES} / {ranks})) "$@"', "sh"]
        else:
            bind = ["--bind-to", "core"] + (["--cpu-set", str(core)] if ranks == 1 and core is not None else [])
        cmd = ["timeout", "600", "mpirun", "-np", str(ranks)] + bind + run
        for path in inputs:
            cmd += ["--input", path]
        if profile:
            cmd += ["--profile", profile]
        text = self.sh(cmd)
        found = re.search(r"step time ([0-9.]+) ms", text)
        if not found:
            raise RuntimeError(f"no step time in: {text[-500:]}")
        return float(found.group(1)) / 1e3


CORES = os.cpu_count() or 2


def cluster_file(bench, calibrated, ranks):
    """The calibrated cluster for `ranks` ranks a node. More ranks than
    cores share them: each rank computes, streams memory and copies
    messages at cores / ranks of its own rate (time slicing), which the
    cluster says so (a derived file); the memory the node's cores share
    (node_memory_bandwidth_gbps) stays the node's, shared by the ranks."""
    if ranks <= CORES:
        return f"{calibrated}.cluster.json:devices_per_node={ranks}"
    share = CORES / ranks
    with open(calibrated + ".cluster.json") as f:
        cluster = json.load(f)
    cluster["peak_tflops"] = {k: v * share for k, v in cluster["peak_tflops"].items()}
    cluster["hbm_bandwidth_gbps"] *= share
    for link in ("intra_node", "inter_node"):
        cluster[link]["bandwidth_gbps"] *= share
    cluster["devices_per_node"] = ranks
    path = f"{calibrated}-{ranks}-ranks.cluster.json"
    with open(path, "w") as f:
        json.dump(cluster, f)
    return path


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", help="a folder to work in and keep")
    args = parser.parse_args()
    work = args.keep or tempfile.mkdtemp(prefix="parax-calibration.")
    os.makedirs(work, exist_ok=True)
    if not args.keep:  # (a run's programs, profiles and weights: about 500 MB)
        atexit.register(shutil.rmtree, work, ignore_errors=True)
    b = Bench(args.build, work)
    b.model("llama", LLAMA)
    b.model("llama-gen", LLAMA_GEN)
    b.model("mixtral", MIXTRAL)
    with open(b.path("base.json"), "w") as f:
        json.dump(BASE_CLUSTER, f)
    weights_of = {name: b.path(name + ".safetensors") for name in ("llama", "llama-gen", "mixtral")}
    oracle = os.path.join(ROOT, "python", "parax", "oracle-cluster.json")

    # 1. Calibration runs, each profiled (the plans pinned, on the base
    # cluster). They run again in every round of the plans below, and the
    # final fit takes every round's profiles: the machine's speed drifts
    # (other tenants), and a fit made only before the plans ran would carry
    # the drift into every prediction.
    print("== calibration runs (parax-run --profile)", flush=True)
    cal_runs = []
    for name, (model, batch, seq, ranks, workload, train) in {
        "cal-prefill-small": ("llama", 2, 128, 1, "prefill:batch=2,seq=128", False),
        "cal-prefill-large": ("llama", 4, 512, 1, "prefill:batch=4,seq=512", False),
        "cal-prefill-tp2": ("llama", 2, 512, 2, "prefill:batch=2,seq=512,tp=2,sp=0", False),
        "cal-train-tp2-sp": ("llama", 2, 128, 2, "train:batch=2,seq=128,tp=2,sp=1,mbs=2,recompute=none", True),
        # A data-parallel training step: its gradient all-reduces (one a
        # tensor, 80 MB in all) are the only all-reduces of more than a few
        # MB; the TP runs' all-reduce 2 MB at most.
        "cal-train-dp2": ("llama", 1, 64, 2, "train:batch=2,seq=64,tp=1,pp=1,dp=2,mbs=1,recompute=none,zero=0", True),
        "cal-mixtral-prefill": ("mixtral", 2, 128, 1, "prefill:batch=2,seq=128", False),
        "cal-mixtral-prefill-ep2": ("mixtral", 4, 128, 2, "prefill:batch=4,seq=128,ep=2,tp=1,pp=1,dp=1", False),
        # A generation step of 2 rows: GEMMs that stream their weights.
        "cal-generate": ("llama-gen", 2, 1, 1, "decode:batch=2,context=48", False),
        # ... and of 8: the weights' stream beside as much arithmetic,
        # which one core does not wholly hide (the GEMMs' gemm_unhidden).
        "cal-generate-8": ("llama-gen", 8, 1, 1, "decode:batch=8,context=48", False),
        # ... and a row on each of 2 ranks at once: both cores streaming
        # the whole weight, the memory they share.
        "cal-generate-dp2": ("llama-gen", 1, 1, 2, "decode:batch=2,context=48,tp=1,pp=1,dp=2", False),
    }.items():
        generate = workload.startswith("decode")
        ir = b.ir(model, batch, 1, cache=128) if generate else b.ir(model, batch, seq, loss=train)
        cluster = f"{oracle}:devices_per_node={ranks}"
        exe = b.compile(ir, name, cluster, "roofline", workload + ("" if ranks > 1 else ",tp=1,pp=1,dp=1"), train)
        rows = int(re.search(r"batch=(\d+)", workload).group(1))  # (the IR's batch is a replica's)
        inputs, extra = b.run_arguments("generate" if generate else "train" if train else "prefill", rows, seq,
                                        prompt=32, steps=5)
        cal_runs.append(dict(name=name, exe=exe, ranks=ranks, weights=weights_of[model],
                             inputs=inputs, extra=extra))

    # Each collective kind over message sizes (on this VM an all-reduce
    # past the 32 MB last-level cache runs at a third of its rate, an
    # all-gather keeps its own): no model's collectives span them all.
    sweep, sweep_inputs, no_weights = b.collective_sweep()
    cal_runs.append(dict(name="cal-collectives", exe=sweep, ranks=2, weights=no_weights, inputs=sweep_inputs,
                         extra=["--steps", "5"]))

    # The slowest core: a synchronous step over several ranks goes at its
    # slowest rank's pace, so the one-rank runs (most calibration runs)
    # are bound to the slowest core -- on this VM its memory streams up to
    # 30 % slower than the other's (a generation step 6.2 against 4.8 ms);
    # unbound, a one-rank run landed on either, by chance.
    streaming = next(c for c in cal_runs if c["name"] == "cal-generate")
    pace = {core: statistics.median(b.run(streaming["exe"], 1, streaming["weights"], streaming["inputs"],
                                          streaming["extra"], core=core) for _ in range(3))
            for core in range(CORES)}
    b.core = max(pace, key=pace.get)
    print("one-rank runs bound to core %d (a 2-row generation step: %s)" % (
        b.core, ", ".join(f"core {c} {1e3 * t:.2f} ms" for c, t in sorted(pace.items()))), flush=True)

    def profile_round(round_):
        """Every calibration run once, profiled: the files' paths."""
        files = []
        for c in cal_runs:
            prof = b.path(f"{c['name']}.round{round_}.profile.json")
            b.run(c["exe"], c["ranks"], c["weights"], c["inputs"], c["extra"], profile=prof)
            files += [prof] + [f"{prof}.rank{r}" for r in range(1, c["ranks"])]
        return files

    def calibrate(files, prefix):
        print(b.sh([os.path.join(b.bin, "parax-plan"), "--cluster", b.path("base.json"), "--calibrate",
                    ",".join(files), "--calibrated", prefix]), flush=True)
        return prefix

    profiles = profile_round(0)
    calibrated = calibrate(profiles, b.path("calibrated"))
    profile = calibrated + ".profile.json"

    # 2. The plans predicted and run. (group -- plans of one workload on one
    # rank count --, name, model, IR batch, seq, ranks, workload, kind,
    # rows a step)
    plans = [
        ("prefill 4x256", "1 rank", "llama", 4, 256, 1, "prefill:batch=4,seq=256,tp=1,pp=1,dp=1", "prefill", 4),
        ("prefill 4x256", "TP2", "llama", 4, 256, 2, "prefill:batch=4,seq=256,tp=2,pp=1,dp=1,cp=1,sp=0", "prefill", 4),
        ("prefill 4x256", "TP2 SP", "llama", 4, 256, 2, "prefill:batch=4,seq=256,tp=2,pp=1,dp=1,cp=1,sp=1", "prefill", 4),
        ("prefill 4x256", "PP2", "llama", 4, 256, 2, "prefill:batch=4,seq=256,tp=1,pp=2,dp=1,cp=1,mbs=4", "prefill", 4),
        ("prefill 4x256", "DP2", "llama", 2, 256, 2, "prefill:batch=4,seq=256,tp=1,pp=1,dp=2,cp=1", "prefill", 4),
        ("prefill 1x1024", "1 rank", "llama", 1, 1024, 1, "prefill:batch=1,seq=1024,tp=1,pp=1,dp=1", "prefill", 1),
        ("prefill 1x1024", "CP2", "llama", 1, 1024, 2, "prefill:batch=1,seq=1024,tp=1,pp=1,dp=1,cp=2", "prefill", 1),
        ("prefill 1x1024", "TP2", "llama", 1, 1024, 2, "prefill:batch=1,seq=1024,tp=2,pp=1,dp=1,cp=1,sp=0", "prefill", 1),
        ("train 4x128", "1 rank", "llama", 4, 128, 1, "train:batch=4,seq=128,tp=1,pp=1,dp=1,mbs=4,recompute=none,zero=0", "train", 4),
        ("train 4x128", "TP2", "llama", 4, 128, 2, "train:batch=4,seq=128,tp=2,pp=1,dp=1,mbs=4,sp=0,recompute=none,zero=0", "train", 4),
        ("train 4x128", "DP2", "llama", 2, 128, 2, "train:batch=4,seq=128,tp=1,pp=1,dp=2,mbs=2,recompute=none,zero=0", "train", 4),
        ("train 4x128", "PP2", "llama", 4, 128, 2, "train:batch=4,seq=128,tp=1,pp=2,dp=1,mbs=4,recompute=none,zero=0", "train", 4),
        ("prefill 4x256, 4 ranks", "TP4", "llama", 4, 256, 4, "prefill:batch=4,seq=256,tp=4,pp=1,dp=1,cp=1,sp=0", "prefill", 4),
        ("prefill 4x256, 4 ranks", "TP2 DP2", "llama", 2, 256, 4, "prefill:batch=4,seq=256,tp=2,pp=1,dp=2,cp=1,sp=0", "prefill", 4),
        ("prefill 4x256, 4 ranks", "DP4", "llama", 1, 256, 4, "prefill:batch=4,seq=256,tp=1,pp=1,dp=4,cp=1", "prefill", 4),
        ("generate 4 rows", "1 rank", "llama-gen", 4, 1, 1, "decode:batch=4,context=96,tp=1,pp=1,dp=1", "generate", 4),
        ("generate 4 rows", "TP2", "llama-gen", 4, 1, 2, "decode:batch=4,context=96,tp=2,pp=1,dp=1", "generate", 4),
        ("mixtral prefill 4x256", "1 rank", "mixtral", 4, 256, 1, "prefill:batch=4,seq=256,tp=1,pp=1,dp=1,ep=1", "prefill", 4),
        ("mixtral prefill 4x256", "EP2", "mixtral", 4, 256, 2, "prefill:batch=4,seq=256,tp=1,pp=1,dp=1,ep=2", "prefill", 4),
        ("mixtral prefill 4x256", "TP2", "mixtral", 4, 256, 2, "prefill:batch=4,seq=256,tp=2,pp=1,dp=1,ep=1,sp=0", "prefill", 4),
        ("mixtral train 4x128", "EP2", "mixtral", 4, 128, 2, "train:batch=4,seq=128,tp=1,pp=1,dp=1,ep=2,mbs=2,recompute=none,zero=0", "train", 4),
    ]
    prepared = []
    for group, name, model, batch, seq, ranks, workload, kind, rows in plans:
        train = kind == "train"
        ir = (b.ir(model, batch, 1, cache=128) if kind == "generate"
              else b.ir(model, batch, seq, loss=train))
        cluster = cluster_file(b, calibrated, ranks)
        stem = f"{group}-{name}".replace(" ", "_")
        exe = b.compile(ir, stem, cluster, profile, workload, train)
        weights = weights_of[model]
        # (generation: a prompt of 64, 64 tokens generated: contexts 1 ..
        # 128, 96 on average over the generated half, the median step's)
        inputs, extra = b.run_arguments(kind, rows, seq, prompt=64, steps=4)
        prepared.append(dict(group=group, name=name, ranks=ranks, exe=exe, weights=weights, inputs=inputs,
                             extra=extra, ir=ir, workload=workload, stem=stem, train=train, measured=[]))
    def run_rounds(plans, rounds, first):
        """`rounds` rounds of the calibration runs (profiled) and `plans`
        (measured): the profiles' paths."""
        files = []
        for round_ in range(first, first + rounds):
            files += profile_round(round_)
            for p in plans:
                p["measured"].append(b.run(p["exe"], p["ranks"], p["weights"], p["inputs"], p["extra"]))
            print(f"round {round_} done", flush=True)
        return files

    def same_program(p, fit):
        """Whether `fit` partitions plan p as the program that ran (the
        plan's own summary, its predicted figures, aside)."""
        cluster = cluster_file(b, fit, p["ranks"])
        chosen = b.partition(p["ir"], p["stem"] + ".check", cluster, fit + ".profile.json", p["workload"], p["train"])
        texts = []
        for path in (p["ran"], chosen):
            with open(path) as f:
                texts.append(re.sub(r"parax\.plan = #parax\.plan<[^>]*>", "", f.read()))
        return texts[0] == texts[1]

    print(f"== {len(prepared)} plans, {args.rounds} rounds (each with the calibration runs again)", flush=True)
    for p in prepared:
        p["ran"] = b.path(p["stem"] + ".mlir")
    profiles += run_rounds(prepared, args.rounds, 1)
    # The final fit, on every round's calibration runs, predicts the plans:
    # each the program it would choose. Where that is not the program that
    # ran (compiled on the first fit; a layout near a tie -- a head split
    # by rows or by columns -- flips between fits), the chosen program is
    # compiled and measured in as many rounds more, beside the calibration
    # runs again, and the fit made once more.
    print("== the fit on every round's calibration runs", flush=True)
    final = calibrate(profiles, b.path("final"))
    changed = [p for p in prepared if not same_program(p, final)]
    if changed:
        print(f"== {len(changed)} plan(s) the fit partitions otherwise ({', '.join(p['stem'] for p in changed)}): "
              f"compiled again and measured, {args.rounds} rounds", flush=True)
        for p in changed:
            p["ran"] = b.path(p["stem"] + ".v2.mlir")
            os.replace(b.path(p["stem"] + ".check.mlir"), p["ran"])
            b.sh([os.path.join(b.bin, "parax-translate"), "--to-executable", p["ran"], "-o",
                  b.path(p["stem"] + ".v2.pxe")])
            p["exe"], p["measured"] = b.path(p["stem"] + ".v2.pxe"), []
        profiles += run_rounds(changed, args.rounds, args.rounds + 1)
        final = calibrate(profiles, b.path("final2"))
    for p in prepared:
        cluster = cluster_file(b, final, p["ranks"])
        p["predicted"] = b.predict(p["ir"], cluster, final + ".profile.json", p["workload"])["step_time_s"]
        p["same"] = same_program(p, final)

    print("\n| workload | plan | ranks | predicted ms | measured ms (median) | rounds' range ms | error |")
    print("|---|---|---|---|---|---|---|")
    errors = []
    for p in prepared:
        m = statistics.median(p["measured"])
        p["median"] = m
        e = p["predicted"] / m - 1
        errors.append(abs(e))
        print(f"| {p['group']} | {p['name']}{'' if p['same'] else ' *'} | {p['ranks']} | "
              f"{1e3 * p['predicted']:.1f} | {1e3 * m:.1f} | {1e3 * min(p['measured']):.1f}-{1e3 * max(p['measured']):.1f} | "
              f"{100 * e:+.1f} % |")
    differ = [p for p in prepared if not p["same"]]
    print(f"\n* the final fit would partition it otherwise than the program that ran: {len(differ)} plan(s)"
          if differ else "\n(each prediction is of the program that ran: the final fit partitions it alike)")
    print()
    agree, groups = 0, 0
    for group in dict.fromkeys(p["group"] for p in prepared):  # each group: one rank count
        two = [p for p in prepared if p["group"] == group and p["ranks"] > 1]
        if len(two) < 2:
            continue
        groups += 1
        best_predicted = min(two, key=lambda p: p["predicted"])
        best_measured = min(two, key=lambda p: p["median"])
        ok = best_predicted["median"] <= 1.05 * best_measured["median"]
        agree += ok
        print(f"{group}: predicted best {best_predicted['name']}, measured best {best_measured['name']} "
              f"({'within 5 %' if ok else 'NOT within 5 %'}: {1e3 * best_predicted['median']:.1f} vs "
              f"{1e3 * best_measured['median']:.1f} ms)")
    print(f"\n{len(errors)} plans: largest |error| {100 * max(errors):.1f} %, mean {100 * statistics.mean(errors):.1f} %, "
          f"within +-15 %: {sum(e <= 0.15 for e in errors)}; best plan found in {agree} of {groups} groups")


if __name__ == "__main__":
    main()
