"""The CUDA backend against the CPU backend and numpy (cuda_cases.py): the
same executables, run with `parax-run --device cuda`. Skipped where
nvidia-smi lists no GPU (the CI machines). scripts/gpu-check.sh runs the same
cases on a GPU machine that has no compiler.

On a machine with fewer GPUs than ranks (one H200), sharded programs run
with collectives staged through host memory and MPI (NCCL allows one rank
per GPU); with enough GPUs they use NCCL.
"""

import pytest

import cuda_cases
from conftest import BIN, cuda_devices

pytestmark = pytest.mark.skipif(cuda_devices() == 0, reason="no CUDA device (nvidia-smi lists none)")


@pytest.mark.parametrize("name", list(cuda_cases.CASES))
def test_gpu_matches_cpu_and_numpy(tmp_path, name):
    cuda_cases.prepare(name, str(tmp_path))
    result = cuda_cases.check(name, str(tmp_path), BIN)
    assert result["ok"], result
