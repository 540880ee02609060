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
print("pp1: same step" if tied1["step_time_s"] == untied1["step_time_s"] else
      f"pp1: {tied1['step_time_s']} vs {untied1['step_time_s']}")
