import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))


def _build_dir():
    return os.environ.get("PARAX_BUILD_DIR", os.path.join(ROOT, "build"))


@pytest.fixture(scope="session")
def parax_opt():
    """Path of the built parax-opt. Under ctest (PARAX_COMPILER=ON) a missing
    tool is a failure, not a skip."""
    path = os.path.join(_build_dir(), "bin", "parax-opt")
    if not os.path.exists(path):
        if os.environ.get("PARAX_COMPILER", "").upper() in ("ON", "1", "TRUE"):
            pytest.fail(f"parax-opt not found at {path}")
        pytest.skip("compiler not built")
    return path


def run_summary(parax_opt, text):
    """Runs --parax-model-summary on IR text; returns {key: int}."""
    proc = subprocess.run([parax_opt, "--parax-model-summary", "-o", os.devnull],
                          input=text, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    values = {}
    for line in proc.stdout.splitlines()[1:]:
        key, _, rest = line.strip().partition("  ")
        values[key.strip()] = int(rest.split()[0])
    return values
