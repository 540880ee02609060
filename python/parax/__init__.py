"""parax: auto-parallelization compiler for Transformer models (Python side).

Debian's MLIR has no Python bindings, so this package is pure Python: it
writes parax IR as text and drives the C++ tools.
"""

__version__ = "0.1.0"
