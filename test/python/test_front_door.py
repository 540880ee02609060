"""python3 -m parax's helpers that need no tools: how a launcher line
becomes the command that starts the ranks, and how a plan's degrees are
pinned onto a workload (the program built with the batch one replica
runs); and compile's options that change the program."""
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


def test_pip_install_gives_the_parax_command_which_finds_the_tools_on_path(tmp_path):
    """`pip install .` (pyproject.toml) installs the package and a `parax`
    command; installed, the front door finds the C++ tools on PATH (no
    repository build folder beside the package). (Offline: the venv's
    setuptools and wheel, no build isolation.)"""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    build = os.environ.get("PARAX_BUILD_DIR", os.path.join(root, "build"))
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                           "--no-build-isolation", "--target", str(target), root],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (target / "parax" / "oracle-cluster.json").exists()
    assert not (target / "CMakeFiles").exists()  # (CMake's build folder is not the package's)
    env = {k: v for k, v in os.environ.items() if k != "PARAX_BUILD_DIR"}
    env.update(PYTHONPATH=str(target), PATH=os.path.join(os.path.abspath(build), "bin") + os.pathsep + env["PATH"])
    out = subprocess.run([str(target / "bin" / "parax"), "compile", "tiny-llama", "--cluster",
                          "dgx-h100:devices_per_node=2", "--workload", "prefill:batch=2,seq=8,tp=2", "--batch", "2",
                          "--seq", "8", "-o", str(tmp_path / "m.pxe")],
                         capture_output=True, text=True, timeout=120, env=env, cwd=str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "m.pxe").stat().st_size > 0


def test_compile_with_tp_overlap_chunks_the_gemms_beside_collectives(parax_opt, tmp_path):
    """`parax compile --tp-overlap 2` (the API's tp_overlap=2): the
    partitioned program holds the GEMMs beside its TP collectives in two row
    chunks (--parax-tp-overlap), joined by concats; without it, none."""
    import os
    import parax
    from conftest import ROOT
    cluster = os.path.join(ROOT, "python", "parax", "oracle-cluster.json") + ":devices_per_node=2"
    counts = {}
    for chunks in (0, 2):
        (tmp_path / str(chunks)).mkdir()
        exe = parax.compile("tiny-llama", cluster, "prefill:batch=2,seq=8,tp=2", str(tmp_path / f"m{chunks}.pxe"),
                            batch=2, seq=8, dtype="f32", tp_overlap=chunks, workdir=str(tmp_path / str(chunks)))
        with open(exe.partitioned) as f:
            counts[chunks] = f.read().count("parax.concat")
        assert exe.ranks == 2
    assert counts[0] == 0 and counts[2] >= 4, counts
