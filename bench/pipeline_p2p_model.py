"""A model of the pipeline schedules' point-to-point traffic under rendezvous
sends (every send waits until its receive is posted, as an NCCL send may;
a group of sends and receives completes as a whole, as an NCCL group does),
to see which schedules can deadlock on the CUDA backend (docs/cuda.md,
"Pipeline training, 1F1B").

Each stage runs its halves in parax-run's order (1F1B: S - 1 - s forward
halves first, then one forward and one backward half in turn; GPipe: every
forward half first; the last stage each microbatch whole). A half receives
first (activations from the stage before, or gradients from the stage
after) and sends last. "grouped": each half's trailing sends are held and
issued in one group with the next half's leading receives (what
CudaExecutor::runRange does); "alone": each send and receive on its own.

Interleaved 1F1B (Megatron's virtual pipeline: `chunks` model chunks a
stage, virtual stage c * stages + s on stage s): each stage runs Megatron's
order of chunk passes (runtime::pipelineSteps), the last stage's last
chunk forward and backward in one range. "by step": a step's receives (a
forward and a backward range's) in one group with the step before's sends,
as parax-run and CudaExecutor::exchange do; "by range": each range's
receives with the range before's sends, as for 1F1B.
(test/unit/PipelineScheduleTest.cpp checks the runtime's own schedule the
same way.)

    python3 bench/pipeline_p2p_model.py
"""


def halves(stage, stages, micro, schedule):
    if stage == stages - 1:
        return [("whole", m) for m in range(micro)]
    warmup = micro if schedule == "gpipe" else min(stages - 1 - stage, micro)
    order = [("forward", m) for m in range(warmup)]
    for m in range(micro):
        if m + warmup < micro:
            order.append(("forward", m + warmup))
        order.append(("backward", m))
    return order


def transfers(stage, stages, half):
    """(leading receives, trailing sends) of one half: (direction, peer,
    what, microbatch)."""
    kind, m = half
    receives, sends = [], []
    if kind in ("forward", "whole") and stage > 0:
        receives.append(("recv", stage - 1, "activations", m))
    if kind == "backward":
        receives.append(("recv", stage + 1, "gradient", m))
    if kind == "forward" and stage < stages - 1:
        sends.append(("send", stage + 1, "activations", m))
    if kind in ("backward", "whole") and stage > 0:
        sends.append(("send", stage - 1, "gradient", m))
    return receives, sends


def groups(stage, stages, micro, schedule, grouped):
    """The stage's transfers as the groups it issues, in order."""
    out, held = [], []
    for half in halves(stage, stages, micro, schedule):
        receives, sends = transfers(stage, stages, half)
        if grouped:
            if held + receives:
                out.append(held + receives)
            held = sends
        else:
            out += [[t] for t in receives + sends]
    if held:
        out.append(held)
    return out


def runs_through(plan):
    """Whether every stage gets through its groups (plan[s]: stage s's, in
    order): a group completes once each of its transfers' peers has posted
    the matching one."""
    stages = len(plan)
    at = [0] * stages
    progress = True
    while progress:
        progress = False
        for s in range(stages):
            if at[s] == len(plan[s]):
                continue
            def posted(t):
                direction, peer, what, m = t
                match = ("recv" if direction == "send" else "send", s, what, m)
                return any(match in g for g in plan[peer][:at[peer] + 1])
            if all(posted(t) for t in plan[s][at[s]]):
                at[s] += 1
                progress = True
    return all(at[s] == len(plan[s]) for s in range(stages))


def completes(stages, micro, schedule, grouped):
    return runs_through([groups(s, stages, micro, schedule, grouped) for s in range(stages)])


def interleaved_steps(stage, stages, chunks, micro):
    """Megatron's interleaved order: a warm-up of forward passes, then a
    forward and a backward pass a step, then the backward passes left.
    An item: (kind, chunk, microbatch); kind "whole" for the last stage's
    last chunk (its backward runs with its forward)."""
    def nth(k, backward):
        chunk = k // stages % chunks
        return (chunks - 1 - chunk if backward else chunk), k // (stages * chunks) * stages + k % stages
    total = micro * chunks
    warmup = min(2 * (stages - 1 - stage) + (chunks - 1) * stages, total)
    steps = [[("forward",) + nth(k, False)] for k in range(warmup)]
    steps += [[("forward",) + nth(warmup + k, False), ("backward",) + nth(k, True)] for k in range(total - warmup)]
    steps += [[("backward",) + nth(k, True)] for k in range(max(total - warmup, 0), total)]
    out = []
    for step in steps:
        kept = []
        for kind, chunk, m in step:
            if stage == stages - 1 and chunk == chunks - 1:
                if kind == "forward":
                    kept.append(("whole", chunk, m))
            else:
                kept.append((kind, chunk, m))
        if kept:
            out.append(kept)
    return out


def interleaved_transfers(stage, stages, chunks, item):
    """(leading receives, trailing sends) of one range."""
    kind, chunk, m = item
    v, last = chunk * stages + stage, stages * chunks - 1
    receives, sends = [], []
    if kind in ("forward", "whole") and v > 0:
        receives.append(("recv", (v - 1) % stages, ("activations", v - 1), m))
    if kind == "backward":
        receives.append(("recv", (v + 1) % stages, ("gradient", v + 1), m))
    if kind == "forward" and v < last:
        sends.append(("send", (v + 1) % stages, ("activations", v), m))
    if kind in ("backward", "whole") and v > 0:
        sends.append(("send", (v - 1) % stages, ("gradient", v), m))
    return receives, sends


def interleaved_groups(stage, stages, chunks, micro, by_step):
    steps = interleaved_steps(stage, stages, chunks, micro)
    if not by_step:
        steps = [[item] for step in steps for item in step]
    out, held = [], []
    for step in steps:
        receives, sends = [], []
        for item in step:
            r, t = interleaved_transfers(stage, stages, chunks, item)
            receives += r
            sends += t
        if held + receives:
            out.append(held + receives)
        held = sends
    if held:
        out.append(held)
    return out


def interleaved_completes(stages, chunks, micro, by_step):
    return runs_through([interleaved_groups(s, stages, chunks, micro, by_step) for s in range(stages)])


if __name__ == "__main__":
    shapes = [(S, M) for S in range(2, 7) for M in range(1, 10)]
    for schedule in ("1f1b", "gpipe"):
        for grouped in (True, False):
            stuck = [shape for shape in shapes if not completes(*shape, schedule, grouped)]
            print(f"{schedule:5} {'grouped' if grouped else 'alone':7}: {len(stuck)} of {len(shapes)} "
                  f"(stages, microbatches) shapes deadlock{': ' + str(stuck[:6]) if stuck else ''}")
    shapes = [(S, v, M) for S in range(2, 7) for v in range(2, 5) for M in range(S, 4 * S + 1, S)]
    for by_step in (True, False):
        stuck = [shape for shape in shapes if not interleaved_completes(*shape, by_step)]
        print(f"interleaved {'by step' if by_step else 'by range'}: {len(stuck)} of {len(shapes)} "
              f"(stages, chunks, microbatches) shapes deadlock{': ' + str(stuck[:4]) if stuck else ''}")
