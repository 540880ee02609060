# lit configuration for parax.
import os

import lit.formats
from lit.llvm import llvm_config

config.name = "parax"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".test"]
config.excludes = ["CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py", "unit", "python", "runtime", "embed", "Inputs"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.parax_obj_root, "test")

llvm_config.use_default_substitutions()
llvm_config.with_environment("PYTHONPATH", config.parax_python_dir, append_path=True)
# Tools: ours first, then LLVM 22's (FileCheck, not, count, split-file).
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
llvm_config.with_environment("PATH", config.parax_tools_dir, append_path=True)
config.substitutions.append(("%python", config.python_executable))
config.substitutions.append(("%parax_src", config.parax_src_root))

# cuda-build: parax-run has the CUDA backend; cuda: and a GPU answers here.
if config.parax_cuda:
    config.available_features.add("cuda-build")
    import subprocess
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        listed = ""
    if any(line.startswith("GPU ") for line in listed.splitlines()):
        config.available_features.add("cuda")
