"""The CUDA backend against the CPU backend and numpy: the same executables,
run with `parax-run --device cuda`. Skipped where nvidia-smi lists no GPU
(the CI machines); run by scripts/gpu-check.sh on a GPU machine.

Tolerances (fp32 storage and math on both backends, no TF32): single rank vs
numpy 1e-4 absolute, as on the CPU; GPU vs CPU 1e-4 (cuBLAS and the kernels
sum in other orders than OpenBLAS and the CPU loops).

On a machine with fewer GPUs than ranks (one H200), sharded programs run
with collectives staged through host memory and MPI (NCCL allows one rank
per GPU); with enough GPUs they use NCCL.
"""

import numpy as np
import pytest

from conftest import Model, cuda_devices

TOL = 1e-4

pytestmark = pytest.mark.skipif(cuda_devices() == 0, reason="no CUDA device (nvidia-smi lists none)")

PRESETS = ["tiny-llama", "tiny-gpt2", "tiny-mixtral", "tiny-qwen2-moe", "tiny-deepseek-v3"]


def run_both(model, exe, ranks):
    cpu = model.run(exe, ranks)
    gpu = model.run(exe, ranks, extra=("--device", "cuda"))
    return cpu, gpu


@pytest.mark.parametrize("preset", PRESETS)
def test_single_rank_gpu_matches_cpu_and_numpy(tmp_path, preset):
    model = Model(str(tmp_path), preset)
    cpu, gpu = run_both(model, model.compile("single"), 1)
    assert gpu.shape == cpu.shape
    assert np.abs(gpu - cpu).max() < TOL
    assert np.abs(gpu - model.reference()).max() < TOL


def test_long_sequence_attention(tmp_path):
    """More keys than one attention tile: the streamed softmax crosses tiles."""
    model = Model(str(tmp_path), "tiny-llama", batch=1, seq=200)
    cpu, gpu = run_both(model, model.compile("single"), 1)
    assert np.abs(gpu - cpu).max() < TOL


def test_loss_on_gpu(tmp_path):
    model = Model(str(tmp_path), "tiny-llama", loss=True)
    cpu, gpu = run_both(model, model.compile("single"), 1)
    assert abs(float(gpu) - float(cpu)) < TOL
    assert abs(float(gpu) - model.reference_loss()) < TOL


PLANS = [
    ("tiny-llama", None, "tp=2,dp=1", 2),
    ("tiny-llama", None, "pp=2,dp=1", 2),
    ("tiny-llama", None, "dp=2", 2),
    ("tiny-llama", None, "dp=2,tp=2,pp=2", 8),
    ("tiny-gpt2", None, "tp=2,dp=1", 2),
    ("tiny-mixtral", None, "ep=2,tp=2,dp=1", 4),
    ("tiny-qwen2-moe", None, "ep=2,dp=1", 2),
    ("tiny-deepseek-v3", None, "ep=2,dp=1", 2),
    ("tiny-deepseek-v3", None, "tp=2,dp=1", 2),
]


@pytest.mark.parametrize("preset,layers,pins,ranks", PLANS,
                         ids=[f"{p[0]}-{p[2]}" for p in PLANS])
def test_sharded_gpu_matches_single_rank_cpu(tmp_path, preset, layers, pins, ranks):
    model = Model(str(tmp_path), preset, layers=layers)
    single = model.run(model.compile("single"), 1)
    workload = f"prefill:batch={max(2, ranks)},seq=8,{pins}"
    gpu = model.run(model.compile("sharded", workload, ranks), ranks, extra=("--device", "cuda"))
    assert np.abs(gpu - single).max() < TOL
