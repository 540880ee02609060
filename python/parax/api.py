"""parax from Python: plans, executables and runs as objects.

    import parax
    result = parax.plan("llama3-8b", "dgx-h100:nodes=2", "train:batch=64,seq=4096",
                        profile="megatron-core")
    best = result.best                      # a Plan: best.degrees, best.step_time_s, ...
    exe = parax.compile("tiny-llama", "dgx-h100:devices_per_node=2",
                        "prefill:batch=4,seq=32", "model.pxe", batch=4, seq=32, dtype="f32")
    logits = parax.run(exe, "weights.safetensors", [tokens])[0]

The objects hold what parax-plan's JSON says (`Plan.json`, `PlanResult.json`
for the rest); the C++ tools are found as the `parax` command finds them.
"""

import dataclasses
import json
import os
import subprocess
import tempfile

import numpy as np

from . import __main__ as front


@dataclasses.dataclass
class Plan:
    """One ranked plan: its degrees, schedule and costs (seconds, bytes)."""
    pp: int
    dp: int
    ep: int
    cp: int
    tp: int
    sequence_parallel: bool
    experts_folded: bool
    micro_batch: int
    micro_batches: int
    schedule: str
    virtual_stages: int
    zero: int
    recompute: str
    step_time_s: float
    mfu: float
    tokens_per_s: float
    time_s: dict
    memory_bytes: dict
    stage_memory_bytes: list
    json: dict = dataclasses.field(repr=False)

    @property
    def degrees(self):
        """"pp2 dp4 ep1 cp1 tp8" (and " sp" with sequence parallelism, " etp1"
        with the experts folded over the TP ranks)."""
        return " ".join(f"{axis}{getattr(self, axis)}" for axis in ("pp", "dp", "ep", "cp", "tp")) + \
            (" sp" if self.sequence_parallel else "") + (" etp1" if self.experts_folded else "")

    @property
    def pins(self):
        """The workload keys that pin this plan (`parax.plan(..., workload + "," + pins)`)."""
        keys = [f"{k}={getattr(self, k)}" for k in ("tp", "pp", "dp", "ep", "cp")]
        keys += [f"mbs={self.micro_batch}", f"sp={int(self.sequence_parallel)}"]
        if self.experts_folded:
            keys.append("etp=1")
        return ",".join(keys)

    @classmethod
    def from_json(cls, p):
        fields = {f.name for f in dataclasses.fields(cls)} - {"json"}
        return cls(**{k: p.get(k) for k in fields}, json=p)


@dataclasses.dataclass
class PlanResult:
    """parax-plan's answer: the plans best first (empty when nothing fits:
    `explanation` says why and what would)."""
    plans: list
    model: dict
    cluster: str
    workload: str
    explanation: str
    json: dict = dataclasses.field(repr=False)

    @property
    def best(self):
        if not self.plans:
            raise ValueError(f"no plan: {self.explanation}")
        return self.plans[0]


@dataclasses.dataclass
class Executable:
    """A translated program: its file, the ranks it runs on (its grid) and
    the partitioned IR it was translated from."""
    path: str
    ranks: int
    partitioned: str


def plan(model, cluster, workload, profile=None, seq=None, layers=None, dtype="bf16", top=5):
    """Ranks the plans of `model` (a preset, config.json, Hugging Face
    folder or .mlir file) on `cluster` for `workload` (parax-plan's
    --workload), under `profile` (a stack's name or a profile JSON)."""
    with tempfile.TemporaryDirectory(prefix="parax-") as work:
        ir = front.planned_ir(model, workload, seq, layers, dtype, work)
        cmd = [front._tool("parax-plan"), ir, "--cluster", cluster, "--workload", workload, "--json", "--top", str(top)]
        if profile:
            cmd += ["--profile", profile]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode not in (0, 2):  # 2: nothing fits, explained in the JSON
        raise front.ToolError(f"parax-plan failed:\n{proc.stdout}{proc.stderr}")
    result = json.loads(proc.stdout)
    return PlanResult(plans=[Plan.from_json(p) for p in result.get("plans", [])], model=result.get("model", {}),
                      cluster=result.get("cluster", cluster), workload=result.get("workload", workload),
                      explanation=result.get("explanation", ""), json=result)


def compile(model, cluster, workload, output, **options):
    """Plans, partitions and translates `model` (as `parax compile`;
    `options`: batch, seq, layers, dtype, train, cache, ... of
    compile_model) into `output`; returns the Executable."""
    options.setdefault("show_plans", False)
    partitioned = front.compile_model(model, cluster, workload, output, **options)
    return Executable(path=output, ranks=front.grid_size(partitioned), partitioned=partitioned)


def run(executable, weights, inputs, launcher=front.DEFAULT_LAUNCHER, **options):
    """Runs `executable` (an Executable or a .pxe path with `ranks=`) on
    `inputs` (numpy arrays, in the program's order) with `weights` (a
    checkpoint path); returns its results as numpy arrays. `options`:
    ranks, steps, generate, ... of run_model."""
    path = executable.path if isinstance(executable, Executable) else executable
    ranks = options.pop("ranks", executable.ranks if isinstance(executable, Executable) else 1)
    results = options.pop("results", 1)
    with tempfile.TemporaryDirectory(prefix="parax-") as work:
        paths = []
        for i, array in enumerate(inputs):
            paths.append(os.path.join(work, f"input{i}.npy"))
            np.save(paths[-1], array)
        outputs = [os.path.join(work, f"output{i}.npy") for i in range(results)]
        front.run_model(path, weights, paths, outputs, ranks=ranks, launcher=launcher, **options)
        return [np.load(p) for p in outputs]
