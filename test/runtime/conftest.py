import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

from parax import reference  # noqa: E402
from parax.checkpoint import random_weights, round_to_bf16, save_safetensors  # noqa: E402
from parax.models import build_model, load_config  # noqa: E402

BUILD = os.environ.get("PARAX_BUILD_DIR", os.path.join(ROOT, "build"))
BIN = os.path.join(BUILD, "bin")
# A slow device on a fast network: the planner then splits even tiny models,
# so the real plan -> partition -> translate path is what runs.
ORACLE_CLUSTER = os.path.join(ROOT, "test", "runtime", "oracle-cluster.json")
# mpirun's environment: defined in cuda_cases.py, whose GPU half runs
# without pytest (so it cannot import this file).
from cuda_cases import MPI_ENV  # noqa: E402


def tool(name):
    path = os.path.join(BIN, name)
    if not os.path.exists(path):
        if os.environ.get("PARAX_COMPILER", "").upper() in ("ON", "1", "TRUE"):
            pytest.fail(f"{path} is not built")
        pytest.skip(f"{name} not built")
    return path


class Model:
    """A tiny preset with random weights, tokens and the numpy reference.

    With `past` > 0, a step over a KV cache: `seq` tokens after `past` earlier
    ones, whose keys and values (the numpy reference's, of the earlier
    tokens alone) are the inputs after the tokens; the reference is then the
    whole sequence's forward pass, its last `seq` positions. `rows`: the
    inputs' rows (default `batch`; a multiple of it runs as microbatches,
    or as the data-parallel replicas' shares). With `cache` > 0, a generation
    step over KV caches of that capacity (`generate` runs it); with `past`
    too, its inputs are those of the step at position `past`: the position,
    and caches holding numpy's keys and values of the `past` earlier tokens
    (noise beyond: rows no step may read). `mla`: DeepSeek-V3's attention
    form (the absorbed one's caches hold the latent); `overrides`: config
    fields set after the preset's (e.g. widths that differ from each other)."""

    def __init__(self, tmp, preset, layers=None, batch=2, seq=8, seed=0, loss=False,
                 dtype="f32", past=0, return_kv=False, rows=None, cache=0, last_logits=False, aux_loss=0.0,
                 mla="explicit", overrides=None, ignore_index=None, mtp_weight=None):
        self.preset = preset
        self.cfg = load_config(preset, layers=layers)
        for field, value in (overrides or {}).items():
            setattr(self.cfg, field, value)
        self.cfg.router_aux_loss_coef = aux_loss  # an MoE's load-balancing loss in training
        self.ignore_index = ignore_index  # labels the loss does not count
        self.dir = tmp
        os.makedirs(tmp, exist_ok=True)
        self.past = past
        self.ir = os.path.join(tmp, "model.mlir")
        with open(self.ir, "w") as f:
            f.write(build_model(self.cfg, batch=batch, seq=seq, dtype=dtype, loss=loss,
                                past=0 if cache else past, return_kv=return_kv, cache=cache,
                                last_logits=last_logits, mla=mla, ignore_index=ignore_index,
                                mtp_weight=mtp_weight))
        # multi-token prediction (the config's depths), its loss weighted mtp_weight
        self.mtp_weight = mtp_weight
        self.mtp_depths = self.cfg.mtp_layers if mtp_weight else 0
        self.weights = random_weights(self.cfg, seed=seed, mtp_depths=self.mtp_depths)
        rng = np.random.default_rng(seed + 1)
        rows = rows or batch
        every = rng.integers(0, self.cfg.vocab, size=(rows, past + seq)).astype(np.int32)
        self.past_tokens, self.tokens = every[:, :past], every[:, past:]
        if self.cfg.router_bias:  # DeepSeek-V3: routing that spreads over experts and groups
            self.weights = reference.balanced_router_bias(self.cfg, self.weights, every)
        if dtype == "bf16":  # the values a bf16 checkpoint holds, for numpy too
            self.weights = {k: round_to_bf16(v) for k, v in self.weights.items()}
        self.checkpoint = os.path.join(tmp, "weights.safetensors")
        save_safetensors(self.checkpoint, self.weights, dtype=dtype)
        self.tokens_path = os.path.join(tmp, "tokens.npy")
        np.save(self.tokens_path, self.tokens)
        self.inputs = [self.tokens_path]
        if cache:
            position = os.path.join(tmp, "position.npy")
            np.save(position, np.array(past, dtype=np.int32))
            self.inputs.append(position)
        if past:
            kv = reference.KVCache(latent=mla != "explicit")
            reference.forward(self.cfg, self.weights, self.past_tokens, kv)
            for layer in range(self.cfg.layers):
                for name, t in (("key", kv.keys.get(layer)), ("value", kv.values.get(layer))):
                    if t is None:  # (the absorbed form's latents: keys alone)
                        continue
                    if cache:  # the first `past` rows of a cache of that capacity
                        noise = rng.standard_normal((t.shape[0], cache - past) + t.shape[2:])
                        t = np.concatenate([t, noise], axis=1)
                    path = os.path.join(tmp, f"past_{layer}_{name}.npy")
                    np.save(path, t.astype(np.float32))
                    self.inputs.append(path)
        if loss:
            self.labels = rng.integers(0, self.cfg.vocab, size=(rows, seq)).astype(np.int32)
            if ignore_index is not None:  # a fine-tuning batch: each row's prompt, and some padding, not counted
                self.labels[:, :3] = ignore_index
                self.labels[0, -2:] = ignore_index
            self.labels_path = os.path.join(tmp, "labels.npy")
            np.save(self.labels_path, self.labels)
            self.inputs.append(self.labels_path)

    def generate(self, exe, ranks, prompt, tokens, extra=(), expect_ok=True, prefill=None,
                 tool_name="parax-run"):
        """parax-run --generate (with `prefill`: --prefill that executable):
        (all tokens [rows, L + tokens], each position's logits [rows, L +
        tokens - 1, V]), or the finished process."""
        prompt_path = os.path.join(self.dir, "prompt.npy")
        np.save(prompt_path, prompt.astype(np.int32))
        outs = [os.path.join(self.dir, name) for name in ("generated.npy", "step_logits.npy")]
        for out in outs:
            if os.path.exists(out):
                os.remove(out)
        proc = subprocess.run(
            ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none",
             tool(tool_name), exe, "--weights", self.checkpoint, "--input", prompt_path,
             "--generate", str(tokens), *(["--prefill", prefill] if prefill else []),
             *[arg for out in outs for arg in ("--output", out)], *extra],
            capture_output=True, text=True, timeout=180, env=MPI_ENV)
        if not expect_ok:
            return proc
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return np.load(outs[0]), np.load(outs[1])

    def reference(self):
        if not self.past:
            return reference.forward(self.cfg, self.weights, self.tokens)
        every = np.concatenate([self.past_tokens, self.tokens], axis=1)
        return reference.forward(self.cfg, self.weights, every)[:, self.past:]

    def reference_loss(self, weights=None):
        """Mean token cross-entropy of the numpy logits against the labels,
        plus multi-token prediction's weighted losses and an MoE's
        load-balancing loss when it has them (as parax's training loss);
        of `weights` (float64 for finite differences) if given."""
        weights = self.weights if weights is None else weights
        routers, trunk = [], []
        logits = reference.forward(self.cfg, weights, self.tokens, routers=routers,
                                   trunk=trunk).astype(np.float64) \
            if not self.past else self.reference().astype(np.float64)
        mtp = 0.0
        if self.mtp_depths:
            ignore = -100 if self.ignore_index is None else self.ignore_index
            mtp = self.mtp_weight / self.mtp_depths * sum(reference.multi_token_prediction(
                self.cfg, weights, self.tokens, self.labels, trunk[0], self.mtp_depths, ignore, routers))
        balance = reference.load_balancing_loss(self.cfg, routers, len(self.tokens)) if routers and self.cfg.router_aux_loss_coef else 0.0
        return reference.cross_entropy(logits, self.labels, self.ignore_index) + mtp + balance

    def counted(self):
        """Which labels the loss counts (all but ignore_index's)."""
        return self.labels != self.ignore_index if self.ignore_index is not None else np.ones(self.labels.shape, bool)

    def compile(self, name, workload=None, devices=1, autodiff=False, recompute=None, after=()):
        """plan (oracle cluster) -> partition -> translate; returns the .pxe.
        With `autodiff`, a training step (--parax-autodiff after the plan):
        the loss, then every parameter's gradient; `recompute`: then
        --parax-recompute in that mode; `after`: passes after the partition
        (its IR is `name`.mlir)."""
        ir = self.ir
        passes = ["--parax-autodiff"] if autodiff else []
        if recompute:
            passes.append(f"--parax-recompute=mode={recompute}")
        if workload:
            passes = [f"--parax-plan=cluster={ORACLE_CLUSTER}:devices_per_node={devices} "
                      f"workload={workload}"] + passes + ["--parax-partition", *after]
        if passes:
            ir = os.path.join(self.dir, f"{name}.mlir")
            run([tool("parax-opt"), self.ir, *passes, "-o", ir])
        exe = os.path.join(self.dir, f"{name}.pxe")
        run([tool("parax-translate"), "--to-executable", ir, "-o", exe])
        return exe

    def run(self, exe, ranks, extra=(), expect_ok=True, outputs=1):
        """The executable's first result (a list of the first `outputs`)."""
        outs = [os.path.join(self.dir, f"out{k if k else ''}.npy") for k in range(outputs)]
        for out in outs:
            if os.path.exists(out):
                os.remove(out)
        proc = subprocess.run(
            ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none",
             tool("parax-run"), exe, "--weights", self.checkpoint,
             *[arg for path in self.inputs for arg in ("--input", path)],
             *[arg for out in outs for arg in ("--output", out)], *extra],
            capture_output=True, text=True, timeout=180, env=MPI_ENV)
        if not expect_ok:
            return proc
        assert proc.returncode == 0, proc.stdout + proc.stderr
        self.stdout = proc.stdout  # (what the run reported: parameter values loaded, ...)
        if outputs == 0:
            return None
        return np.load(outs[0]) if outputs == 1 else [np.load(out) for out in outs]


    def run_to_dir(self, exe, ranks, extra=()):
        """Every result (--output-dir): {file name without .npy: array}."""
        folder = os.path.join(self.dir, "results")
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        self.run(exe, ranks, extra=["--output-dir", folder, *extra], outputs=0)
        return {name[:-4]: np.load(os.path.join(folder, name)) for name in os.listdir(folder)}


def replicas(pins):
    """The data-parallel degree workload pins ask for (each replica takes its
    own rows: the tests give that many times the executable's batch)."""
    import re
    found = re.search(r"\bdp=(\d+)", pins or "")
    return int(found.group(1)) if found else 1


def run(cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, " ".join(cmd) + "\n" + proc.stdout + proc.stderr
    return proc


def cuda_devices():
    """GPUs nvidia-smi lists here (0 without a driver)."""
    try:
        proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if proc.returncode != 0:
        return 0
    return sum(1 for line in proc.stdout.splitlines() if line.startswith("GPU "))


def run_with_a_stalled_rank(cmd, env, program="parax-run", settle=1.0):
    """Starts `cmd` (mpirun ... of `program` with many steps), stops one of
    its ranks with SIGSTOP once each has run `settle` seconds of CPU -- a rank
    that stalls, as a hung process or a dead node does -- and returns the
    finished process (stdout, stderr, returncode). Never waits more than
    180 s."""
    import signal
    import time
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def stat(pid, *fields):  # fields of /proc/pid/stat after the name, as ints (0 if it has gone)
        try:
            with open(f"/proc/{pid}/stat") as f:
                values = f.read().rsplit(")", 1)[1].split()
            return [int(values[i]) for i in fields]
        except (OSError, ValueError, IndexError):
            return [0] * len(fields)

    def parent(pid):
        return stat(pid, 1)[0]

    def ours(pid):  # a descendant of this mpirun, not another test's rank
        while pid > 1:
            pid = parent(pid)
            if pid == proc.pid:
                return True
        return False

    def ranks():
        pids = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv0 = f.read().split(b"\0")[0].decode()
            except OSError:
                continue
            if os.path.basename(argv0) == program and ours(int(pid)):
                pids.append(int(pid))
        return pids

    def cpu_seconds(pid):  # user + system time: work done, however loaded the machine
        return sum(stat(pid, 11, 12)) / os.sysconf("SC_CLK_TCK")

    deadline = time.time() + 60
    while len(ranks()) < 2 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    # `settle` seconds of CPU in each rank (1 s: both past start-up and inside
    # their steps). Counted in CPU time, not wall time: on a loaded machine a
    # rank can spend seconds of wall time in its set-up.
    while (time.time() < deadline and proc.poll() is None and
           min((cpu_seconds(pid) for pid in ranks()), default=0.0) < settle):
        time.sleep(0.05)
    running = ranks()
    if len(running) < 2:
        proc.kill()
        out, err = proc.communicate(timeout=60)
        raise AssertionError(f"{program}: {len(running)} rank(s) of this mpirun found\n{out}{err}")
    stalled = max(running)
    os.kill(stalled, signal.SIGSTOP)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        try:
            os.kill(stalled, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return out, err, proc.returncode


def uneven_boxes(weights, files=3):
    """Each tensor cut into boxes no plan's split matches: dimension 0 at a
    third and past two thirds, the first piece of a matrix also cut along
    dimension 1 at a third, the last piece held as two runs of its
    elements (as ZeRO's chunks are: row-major, cut at 7/13 of them); the
    boxes dealt over `files` files."""
    boxes, k = {}, 0
    for name, w in sorted(weights.items()):
        cuts = sorted({0, w.shape[0] // 3, min(w.shape[0], 2 * w.shape[0] // 3 + 1), w.shape[0]})
        listed = []
        for lo, hi in zip(cuts, cuts[1:]):
            start, size = [lo, *[0] * (w.ndim - 1)], [hi - lo, *w.shape[1:]]
            if lo == 0 and w.ndim >= 2 and w.shape[1] >= 3:
                third = w.shape[1] // 3
                for c0, c1 in ((0, third), (third, w.shape[1])):
                    listed.append(([lo, c0, *[0] * (w.ndim - 2)], [hi - lo, c1 - c0, *w.shape[2:]], k % files))
                    k += 1
            elif hi == w.shape[0] and int(np.prod(size)) >= 2:
                n = int(np.prod(size))
                cut = max(1, 7 * n // 13)
                for run in ((0, cut), (cut, n)):
                    listed.append((start, size, k % files, run))
                    k += 1
            else:
                listed.append((start, size, k % files))
                k += 1
        boxes[name] = (w, listed)
    return boxes
