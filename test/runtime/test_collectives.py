"""The MPI communicator's all-reduce and reduce-scatter (MpiCommunicator.cpp:
rings of MPI_Sendrecv for large messages, MPI's own for small ones) and its
all-gather into an inner dimension's layout (a strided MPI datatype) against
exact sums under a real mpirun, on 2, 3 and 4 ranks: sizes on both sides of
the ring's threshold, divisible by the ranks and not, over the whole world
and over one axis of a 2 x 2 grid (parax-mpi-collectives-check)."""

import subprocess

import pytest

from conftest import MPI_ENV, tool


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_collectives_sum_exactly(ranks):
    proc = subprocess.run(["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none",
                           tool("parax-mpi-collectives-check")],
                          capture_output=True, text=True, timeout=120, env=MPI_ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ok: all_reduce, reduce_scatter and all_gather of runs on {ranks} ranks" in proc.stdout
