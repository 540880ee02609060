"""parax: auto-parallelization compiler for Transformer models (Python side).

Debian's MLIR has no Python bindings, so this package is pure Python: it
writes parax IR as text and drives the C++ tools.
"""

__version__ = "0.1.0"


def __getattr__(name):
    # parax.plan / parax.compile / parax.run and their objects (parax/api.py),
    # imported on first use so that `import parax` stays light.
    if name in ("plan", "compile", "run", "Plan", "PlanResult", "Executable"):
        from . import api
        return getattr(api, name)
    raise AttributeError(f"module 'parax' has no attribute {name!r}")
