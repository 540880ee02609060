"""python3 -m parax's helpers that need no tools: how a launcher line
becomes the command that starts the ranks, and how a plan's degrees are
pinned onto a workload (the program built with the batch one replica
runs)."""
import pytest

from parax.__main__ import ToolError, _pinned, launcher_command


def test_a_launcher_line_takes_the_rank_count_where_it_says():
    assert launcher_command("srun -n {ranks}", 4) == ["srun", "-n", "4"]
    assert launcher_command("mpirun -np {ranks} --hostfile 'my hosts' --map-by ppr:8:node", 16) == \
        ["mpirun", "-np", "16", "--hostfile", "my hosts", "--map-by", "ppr:8:node"]


def test_a_launcher_line_without_the_rank_count_is_refused():
    with pytest.raises(ToolError, match=r"--launcher 'srun -n 4': no \{ranks\} in it"):
        launcher_command("srun -n 4", 4)


def test_pins_replace_what_the_workload_said_and_keep_the_rest():
    assert _pinned("prefill:batch=4,seq=32,tp=1", {"tp": 2, "dp": 1, "mbs": 4}) == \
        "prefill:batch=4,seq=32,tp=2,dp=1,mbs=4"
    assert _pinned("train:batch=8", {"zero": 1}) == "train:batch=8,zero=1"
