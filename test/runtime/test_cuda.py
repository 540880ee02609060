"""The CUDA backend against the CPU backend and numpy (cuda_cases.py): the
same executables, run with `parax-run --device cuda`, model by model and op
by op (cuda_ops.py). Skipped where nvidia-smi lists no GPU (the CI
machines; test_cuda_simt.py runs the same source there on the SIMT
emulator). scripts/gpu-check.sh runs the same cases on a GPU machine that
has no compiler.

On a machine with fewer GPUs than ranks (one H200), sharded programs run
with collectives staged through host memory and MPI (NCCL allows one rank
per GPU); with enough GPUs they use NCCL.
"""

import pytest

import cuda_cases
from conftest import BIN, cuda_devices

pytestmark = pytest.mark.skipif(cuda_devices() == 0, reason="no CUDA device (nvidia-smi lists none)")


@pytest.mark.parametrize("name", cuda_cases.all_cases())
def test_gpu_matches_cpu_and_numpy(tmp_path, name):
    cuda_cases.prepare_any(name, str(tmp_path), BIN)
    result = cuda_cases.check(name, str(tmp_path), BIN)
    assert result["ok"], result
