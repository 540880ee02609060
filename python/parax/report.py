"""Pictures of a plan and of a training run, as self-contained SVG and HTML.

plan_html(plan_json, trace_json) -> an HTML page for `parax plan --html`:
the chosen plan's degrees and step, its time by term, each pipeline
stage's memory by kind against the usable memory, the step's pipeline
timeline (parax-plan --timeline's Chrome trace events) and the forward
collectives a step. loss_svg(steps) -> the loss curve of a `--log-json`
file for `parax run --plot`. No plotting library: the figures are a few
rectangles and a polyline each.
"""

import html
import json

MEMORY_KINDS = [("weights", "#4e79a7"), ("gradients", "#f28e2b"), ("optimizer", "#e15759"),
                ("activations", "#76b7b2"), ("kv_cache", "#59a14f"), ("scratch", "#edc948"),
                ("reserved", "#bab0ac")]
TIME_TERMS = [("compute", "#4e79a7"), ("bubble", "#bab0ac"), ("tp_comm", "#f28e2b"), ("pp_comm", "#e15759"),
              ("dp_comm", "#76b7b2"), ("ep_comm", "#59a14f"), ("cp_comm", "#edc948"), ("optimizer", "#b07aa1")]
PASS_COLOURS = {"forward": "#4e79a7", "backward": "#f28e2b", "forward+backward": "#76b7b2", "tail": "#bab0ac"}


def _esc(text):
    return html.escape(str(text), quote=True)


def _gb(n):
    return f"{n / 1e9:.1f} GB"


def _seconds(s):
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.3f} s"


def _legend(items, x, y):
    out, dx = [], 0
    for name, colour in items:
        out.append(f'<rect x="{x + dx}" y="{y}" width="10" height="10" fill="{colour}"/>'
                   f'<text x="{x + dx + 14}" y="{y + 9}" font-size="11">{_esc(name)}</text>')
        dx += 24 + 7 * len(name)
    return "".join(out)


def memory_svg(plan):
    """Each stage's memory a device, stacked by kind, against the usable."""
    stages = plan.get("stage_memory_bytes") or [plan["memory_bytes"]]
    usable = plan["memory_bytes"]["usable"] + plan["memory_bytes"]["reserved"]
    top = max([usable] + [s["total"] for s in stages]) or 1
    bar, gap, height, left = 36, 18, 220, 60
    width = left + len(stages) * (bar + gap) + 40
    scale = height / top
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{max(width, 520)}" height="{height + 70}" '
           f'font-family="sans-serif">']
    for i, stage in enumerate(stages):
        x, y = left + i * (bar + gap), 20 + height
        for kind, colour in MEMORY_KINDS:
            h = stage.get(kind, 0) * scale
            if h <= 0:
                continue
            y -= h
            out.append(f'<rect x="{x}" y="{y:.1f}" width="{bar}" height="{h:.1f}" fill="{colour}">'
                       f'<title>stage {i}: {kind} {_gb(stage.get(kind, 0))}</title></rect>')
        out.append(f'<text x="{x + bar / 2}" y="{height + 34}" font-size="11" text-anchor="middle">{i}</text>')
    line = 20 + height - usable * scale
    out.append(f'<line x1="{left - 5}" x2="{width - 20}" y1="{line:.1f}" y2="{line:.1f}" stroke="black" '
               f'stroke-dasharray="4 3"/><text x="{left - 8}" y="{line + 4:.1f}" font-size="11" '
               f'text-anchor="end">{usable / 1e9:.0f} GB</text>')
    out.append(f'<text x="{left}" y="12" font-size="12">memory a device, by pipeline stage '
               f'(the dashed line: usable plus the runtime\'s reserve)</text>')
    out.append(_legend([(k, c) for k, c in MEMORY_KINDS if any(s.get(k, 0) > 0 for s in stages)],
                       left, height + 48))
    out.append("</svg>")
    return "".join(out)


def time_svg(plan):
    """The step's time by term, one stacked bar."""
    terms = plan["time_s"]
    total = sum(max(0, terms.get(k, 0)) for k, _ in TIME_TERMS) or 1
    width, left = 640, 10
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + 20}" height="70" font-family="sans-serif">',
           f'<text x="{left}" y="12" font-size="12">the step, {_seconds(plan["step_time_s"])}, by term</text>']
    x = left
    for kind, colour in TIME_TERMS:
        w = max(0, terms.get(kind, 0)) / total * width
        if w <= 0:
            continue
        out.append(f'<rect x="{x:.1f}" y="20" width="{w:.1f}" height="22" fill="{colour}">'
                   f'<title>{kind}: {_seconds(terms[kind])}</title></rect>')
        x += w
    out.append(_legend([(k, c) for k, c in TIME_TERMS if terms.get(k, 0) > 0], left, 50))
    out.append("</svg>")
    return "".join(out)


def timeline_svg(trace):
    """The pipeline's passes (a Chrome trace from parax-plan --timeline):
    a row a stage, a rectangle a pass."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    if not events:
        return ""
    stages = 1 + max(e["pid"] for e in events)
    end = max(e["ts"] + e["dur"] for e in events) or 1
    width, row, left = 760, 26, 70
    scale = width / end
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 20}" '
           f'height="{40 + stages * row + 30}" font-family="sans-serif">',
           f'<text x="{left}" y="12" font-size="12">the step\'s pipeline, simulated with the plan\'s costs '
           f'({_seconds(end / 1e6)})</text>']
    for s in range(stages):
        out.append(f'<text x="{left - 6}" y="{30 + s * row + 15}" font-size="11" text-anchor="end">stage {s}</text>')
    for e in events:
        x, w = left + e["ts"] * scale, max(e["dur"] * scale, 0.5)
        y = 30 + e["pid"] * row
        colour = PASS_COLOURS.get(e.get("cat"), "#999")
        out.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row - 6}" fill="{colour}" '
                   f'stroke="white" stroke-width="0.5"><title>{_esc(e["name"])}: '
                   f'{e["dur"] / 1e3:.3f} ms</title></rect>')
        if w > 8 * len(e["name"]):
            out.append(f'<text x="{x + w / 2:.2f}" y="{y + 14}" font-size="10" fill="white" '
                       f'text-anchor="middle">{_esc(e["name"])}</text>')
    cats = sorted({e.get("cat") for e in events}, key=list(PASS_COLOURS).index)
    out.append(_legend([(c, PASS_COLOURS[c]) for c in cats], left, 36 + stages * row))
    out.append("</svg>")
    return "".join(out)


def plan_html(result, trace=None):
    """An HTML page of the best plan in parax-plan's JSON `result`."""
    if not result.get("plans"):
        raise ValueError("no plan to draw: " + str(result.get("explanation", "")))
    plan = result["plans"][0]
    degrees = " ".join(f"{axis}{plan[axis]}" for axis in ("pp", "dp", "ep", "cp", "tp")) + \
        (" sp" if plan.get("sequence_parallel") else "")
    collectives = plan.get("collectives_per_step", {})
    rows = "".join(f"<tr><td>{_esc(k)}</td><td>{v}</td></tr>" for k, v in sorted(collectives.items()))
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>parax plan</title>",
        "<style>body{font-family:sans-serif;max-width:900px;margin:2em auto}"
        "td,th{padding:2px 10px;text-align:left}</style></head><body>",
        f"<h1>{_esc(degrees)}</h1>",
        f"<p>{_esc(result.get('workload', ''))} on {_esc(result.get('cluster', ''))} "
        f"({result.get('devices', '')} devices), profile {_esc(result.get('profile', {}).get('name', ''))}: "
        f"{_esc(_seconds(plan['step_time_s']))} a step, MFU {100 * plan.get('mfu', 0):.1f} %, "
        f"{plan.get('tokens_per_s', 0):,.0f} tokens/s; microbatches {plan['micro_batch']} x "
        f"{plan['micro_batches']}, {_esc(plan['schedule'])}, ZeRO-{plan['zero']}, "
        f"recompute {_esc(plan['recompute'])}.</p>",
        time_svg(plan),
        memory_svg(plan),
    ]
    if trace:
        parts.append(timeline_svg(trace))
    if rows:
        parts.append(f"<h2>forward collectives a step</h2><table><tr><th>kind</th><th>calls</th></tr>{rows}</table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def read_log(path):
    """The steps of a parax-run --log-json file (one JSON object a line)."""
    steps = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                steps.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: not a JSON line ({e.msg})") from None
    return steps


def loss_svg(steps):
    """The loss a step, a polyline, from read_log's steps."""
    points = [(s["step"], s["loss"]) for s in steps if isinstance(s.get("loss"), (int, float))]
    if not points:
        raise ValueError("no step with a loss to plot")
    width, height, left, top = 560, 240, 60, 24
    first, last = points[0][0], points[-1][0]
    low, high = min(p[1] for p in points), max(p[1] for p in points)
    span_x, span_y = (last - first) or 1, (high - low) or abs(high) or 1
    def xy(step, loss):
        return (left + (step - first) / span_x * width, top + (high - loss) / span_y * height)
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(*p) for p in points))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 30}" height="{top + height + 40}" '
           f'font-family="sans-serif">',
           f'<text x="{left}" y="14" font-size="12">training loss by step</text>',
           f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + height}" stroke="black"/>',
           f'<line x1="{left}" x2="{left + width}" y1="{top + height}" y2="{top + height}" stroke="black"/>',
           f'<text x="{left - 4}" y="{top + 4}" font-size="10" text-anchor="end">{high:.4g}</text>',
           f'<text x="{left - 4}" y="{top + height}" font-size="10" text-anchor="end">{low:.4g}</text>',
           f'<text x="{left}" y="{top + height + 14}" font-size="10">{first}</text>',
           f'<text x="{left + width}" y="{top + height + 14}" font-size="10" text-anchor="end">{last}</text>',
           f'<polyline fill="none" stroke="#4e79a7" stroke-width="1.5" points="{line}"/>']
    out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2" fill="#4e79a7"><title>step {s}: {loss:.6g}</title></circle>'
            for (s, loss), (x, y) in zip(points, (xy(*p) for p in points))]
    out.append("</svg>")
    return "".join(out)
