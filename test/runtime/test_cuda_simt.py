"""The CUDA backend's source on the SIMT emulator (runtime/cuda/simt: the
kernels run as CPU fibers, cuBLAS on OpenBLAS, NCCL on MPI), so that every
build checks its kernels, launches and collectives without a GPU: each model
and one-op case of cuda_cases.py against the CPU backend and numpy, twice --
NCCL collectives with threads run in order, then as on the one-GPU machine
(PARAX_SIMT_DEVICES=1: more ranks than GPUs, so collectives are staged
through host memory and MPI) with the threads between barriers run in
reverse, which exposes a missing __syncthreads() the first order hides.
"""

import pytest

import cuda_cases
from conftest import BIN, tool


@pytest.mark.parametrize("name", cuda_cases.all_cases())
def test_simt_matches_cpu_and_numpy(tmp_path, name):
    tool("parax-run-simt")
    cuda_cases.prepare_any(name, str(tmp_path), BIN)
    for env in ({}, {"PARAX_SIMT_DEVICES": "1", "PARAX_SIMT_ORDER": "reverse"}):
        result = cuda_cases.check(name, str(tmp_path), BIN, tool="parax-run-simt", env=env)
        assert result["ok"], (env, result)
        ranks = result["ranks"]
        assert result["host_staged"] == (ranks > 1 and bool(env)), result
