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


def completes(stages, micro, schedule, grouped):
    """Whether every stage gets through its groups: a group completes once
    each of its transfers' peers has posted the matching one."""
    plan = [groups(s, stages, micro, schedule, grouped) for s in range(stages)]
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


if __name__ == "__main__":
    shapes = [(S, M) for S in range(2, 7) for M in range(1, 10)]
    for schedule in ("1f1b", "gpipe"):
        for grouped in (True, False):
            stuck = [shape for shape in shapes if not completes(*shape, schedule, grouped)]
            print(f"{schedule:5} {'grouped' if grouped else 'alone':7}: {len(stuck)} of {len(shapes)} "
                  f"(stages, microbatches) shapes deadlock{': ' + str(stuck[:6]) if stuck else ''}")
