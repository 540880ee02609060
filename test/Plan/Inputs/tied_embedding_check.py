"""tied-embedding.test: compares parax-plan's JSON plans of a model with and
without a tied embedding (argv: untied PP2, tied PP2, untied PP1, tied PP1,
each the same pinned plan) and prints what FileCheck checks."""

import json
import sys

untied, tied, untied1, tied1 = (json.load(open(path))["plans"][0] for path in sys.argv[1:5])
assert untied["stage_start"] == tied["stage_start"], (untied["stage_start"], tied["stage_start"])
extra = tied["time_s"]["pp_comm"] - untied["time_s"]["pp_comm"]
print(f"pp2: the tie adds {extra * 1e3:.3f} ms of pp time" if extra > 0 else f"pp2: the tie adds {extra}")
step = tied["step_time_s"] - untied["step_time_s"]
print("pp2: step difference equals it" if abs(step - extra) < 1e-12 else f"pp2: step difference {step}")
# Under PP1 the one stage holds the tied weight once (bf16 weights: 2
# bytes; fp32 master, moments and sums: 16), a TP box of it: 128256 x 4096
# / 8 elements less than the untied model's two tensors; its gradient is
# made in two parts (the head's, held through the backward pass, and the
# embedding's), where the untied model holds one gradient at a time.
box = 128256 * 4096 / 8
for field in ("weights", "gradients", "optimizer"):
    saved = untied1["memory_bytes"][field] - tied1["memory_bytes"][field]
    print(f"pp1: the tie saves {saved / box:g} bytes a box element of {field}")
print("pp1: no slower" if tied1["step_time_s"] <= untied1["step_time_s"] else
      f"pp1: {tied1['step_time_s']} vs {untied1['step_time_s']}")
