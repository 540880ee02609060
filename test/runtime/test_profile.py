"""parax-run --profile and parax-plan --calibrate: what a run measured,
and the cluster and profile fitted to it (docs/cost-model.md,
Calibration)."""
import json
import os
import subprocess

from conftest import Model, run, tool


def test_profile_times_every_instruction_and_calibrate_reads_it(tmp_path):
    """Each rank's file holds each instruction the rank ran -- its shapes,
    dtype, the ranks a collective spans -- with the median of one wall
    time a step; a training step adds the optimizer's update and the
    parameter values it updated. --calibrate fits a cluster and a profile
    that parax-plan then reads back."""
    # (64 positions: the GEMMs' FLOPs, not only their bytes, show in their
    # times on a busy machine -- at 8 the fit found no FLOP rate under load)
    model = Model(str(tmp_path), "tiny-llama", batch=2, seq=64, loss=True)
    exe = model.compile("tp", "train:batch=2,seq=64,tp=2,sp=0,recompute=none", 2, autodiff=True)
    profile = os.path.join(model.dir, "run.json")
    model.run(exe, 2, extra=["--steps", "3", "--optimizer", "adamw", "--profile", profile], outputs=0)
    files = [profile, profile + ".rank1"]
    for rank, path in enumerate(files):
        data = json.load(open(path))
        assert data["format"] == "parax-run-profile-1" and data["rank"] == rank and data["ranks"] == 2
        assert data["steps"] == 3 and data["step_seconds_median"] > 0
        assert data["optimizer"] == "adamw" and data["optimizer_seconds_median"] > 0
        ops = {inst["op"] for inst in data["instructions"]}
        assert {"linear", "linear_weight_grad", "attention", "rms_norm"} <= ops, ops
        for inst in data["instructions"]:
            assert inst["runs"] == 3 and inst["seconds_median"] >= 0, inst
            assert inst["dtype"] == "f32"
            if inst["op"] in ("all_reduce", "all_gather", "reduce_scatter"):
                assert inst["group"] == 2, inst
        # The rank's parameters: half of each split weight, all of a replicated one.
        assert 0 < data["parameter_values"] < sum(w.size for w in model.weights.values())
    base = os.path.join(os.path.dirname(os.path.abspath(__file__)), "oracle-cluster.json")
    prefix = os.path.join(model.dir, "fit")
    out = run([tool("parax-plan"), "--cluster", base, "--calibrate", ",".join(files), "--calibrated", prefix]).stdout
    assert "GEMMs:" in out and "wrote" in out, out
    cluster, fitted = json.load(open(prefix + ".cluster.json")), json.load(open(prefix + ".profile.json"))
    assert cluster["peak_tflops"]["f32"] > 0 and fitted["name"] == "calibrated" and not fitted["nccl_protocols"]
    plan = json.loads(run([tool("parax-plan"), model.ir, "--cluster", prefix + ".cluster.json:devices_per_node=2",
                           "--profile", prefix + ".profile.json", "--workload", "train:batch=2,seq=64", "--json"]).stdout)
    assert plan["plans"] and plan["profile"]["name"] == "calibrated"


def test_calibrate_refuses_what_is_no_run_profile(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    base = os.path.join(os.path.dirname(os.path.abspath(__file__)), "oracle-cluster.json")
    proc = subprocess.run([tool("parax-plan"), "--cluster", base, "--calibrate", str(bad), "--calibrated",
                           str(tmp_path / "fit")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "bad.json: not a parax-run --profile file" in proc.stderr, proc.stderr
    proc = subprocess.run([tool("parax-plan"), "--cluster", base, "--calibrate", str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "--calibrate needs --calibrated PREFIX" in proc.stderr, proc.stderr


def test_profile_on_the_cuda_backend_times_instructions_on_the_device(tmp_path):
    """--device cuda (the CUDA backend's source on the SIMT emulator): three
    more steps, each instruction timed by device events; the same file."""
    model = Model(str(tmp_path), "tiny-llama", batch=2)
    exe = model.compile("single")
    profile = os.path.join(model.dir, "cuda.json")
    proc = subprocess.run([tool("parax-run-simt"), exe, "--weights", model.checkpoint,
                           *[arg for path in model.inputs for arg in ("--input", path)],
                           "--device", "cuda", "--steps", "1", "--profile", profile],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.load(open(profile))
    assert data["device"] == "cuda" and data["ranks"] == 1
    runs = {inst["runs"] for inst in data["instructions"]}
    assert runs == {3}, runs
    assert {"linear", "attention", "rms_norm"} <= {inst["op"] for inst in data["instructions"]}
    assert all(inst["seconds_median"] >= 0 for inst in data["instructions"])


def test_profile_records_the_data_parallel_gradient_all_reduces(tmp_path):
    """A DP2 training step averages each gradient with one MPI_Allreduce
    over the two replicas: the profile records their bytes (every
    parameter's gradient in fp32), their count (one a tensor) and their
    time, which is part of the averaging's; --calibrate takes them as
    all-reduce samples and, for a run on parax-run's CPU path, a profile
    whose gradient averaging follows the backward."""
    model = Model(str(tmp_path), "tiny-llama", batch=1, seq=64, loss=True, rows=2)
    exe = model.compile("dp", "train:batch=2,seq=64,tp=1,pp=1,dp=2,mbs=1,recompute=none,zero=0", 2, autodiff=True)
    profile = os.path.join(model.dir, "run.json")
    model.run(exe, 2, extra=["--steps", "2", "--optimizer", "adamw", "--profile", profile], outputs=0)
    for path in (profile, profile + ".rank1"):
        data = json.load(open(path))
        # (an entry a message size: the gradients of that many values)
        reduces = data["gradient_all_reduces"]
        sizes = sorted({4 * w.size for w in model.weights.values()})
        assert sorted(r["bytes"] / r["calls"] for r in reduces) == sizes, reduces
        for r in reduces:
            assert r["group"] == 2 and r["calls"] == sum(4 * w.size == r["bytes"] / r["calls"]
                                                         for w in model.weights.values()), r
        assert all(r["seconds_median"] > 0 for r in reduces), reduces
        assert sum(r["seconds_median"] for r in reduces) < data["step_seconds_median"], data
    base = os.path.join(os.path.dirname(os.path.abspath(__file__)), "oracle-cluster.json")
    prefix = os.path.join(model.dir, "fit")
    out = run([tool("parax-plan"), "--cluster", base, "--calibrate", f"{profile},{profile}.rank1",
               "--calibrated", prefix]).stdout
    assert "gradient averaging: after the backward" in out, out
    assert json.load(open(prefix + ".profile.json"))["dp_overlap"] is False
