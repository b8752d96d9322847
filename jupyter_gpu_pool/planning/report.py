"""The plan as a page a person reads: ``index.html`` and its plots (matplotlib, PNG) in one directory.

Plots: the 95th-percentile wait against GPU count (one line per configuration, the goal drawn
across), occupancy over time, the distribution of waits, and the configurations side by side (kernels
shut down, hibernated, GPU-hours held and busy).  Each configuration is drawn at the fewest GPUs that
meet the goal (or, where none does, the most replayed).
"""

from __future__ import annotations

import html
import math
import os

from matplotlib.figure import Figure

from ..pool.units import format_duration
from . import tables
from .plan import Outcome
from .workload import Workload

_COLOURS = ("#1f6fb4", "#d9730d", "#2e8b57", "#8e44ad", "#c0392b", "#7f8c8d")


def write_report(directory: str, result: dict, outcomes: list[Outcome], workload: Workload, slo_wait: float) -> str:
    os.makedirs(directory, exist_ok=True)
    shown = {o.config.name: _shown_count(o, slo_wait) for o in outcomes}
    plots = [
        ("p95-wait.png", "95th-percentile wait for a slice against GPU count", _p95_plot(outcomes, slo_wait)),
        ("occupancy.png", "Occupancy over time", _occupancy_plot(outcomes, shown, workload)),
        ("waits.png", "Distribution of waits for a slice", _waits_plot(outcomes, shown, slo_wait)),
        ("side-by-side.png", "The configurations side by side", _side_by_side(outcomes, shown)),
    ]
    for name, _title, fig in plots:
        fig.savefig(os.path.join(directory, name), dpi=110, bbox_inches="tight")
    path = os.path.join(directory, "index.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(_page(result, plots, shown))
    return path


def _shown_count(outcome: Outcome, slo_wait: float) -> int:
    fewest = outcome.fewest(slo_wait)
    return fewest if fewest is not None else max(outcome.tallies)


def _figure(width: float = 8.0, height: float = 4.0):
    fig = Figure(figsize=(width, height))
    return fig, fig.add_subplot()


def _p95_plot(outcomes: list[Outcome], slo_wait: float) -> Figure:
    fig, ax = _figure()
    finite = [t.wait(95) for o in outcomes for t in o.tallies.values() if math.isfinite(t.wait(95))]
    ceiling = max([*finite, slo_wait, 1.0]) * 1.15
    for i, o in enumerate(outcomes):
        counts = sorted(o.tallies)
        waits = [o.tallies[n].wait(95) for n in counts]
        colour = _COLOURS[i % len(_COLOURS)]
        ax.plot(counts, [min(w, ceiling) for w in waits], marker="o", color=colour, label=o.config.name)
        never = [n for n, w in zip(counts, waits) if math.isinf(w)]
        if never:
            ax.scatter(never, [ceiling] * len(never), marker="^", s=70, color=colour, zorder=3)
    ax.axhline(slo_wait, color="#444", linestyle="--", linewidth=1, label=f"goal: {format_duration(slo_wait)}")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("p95 wait (s)")
    ax.set_ylim(bottom=0, top=ceiling * 1.05)
    ax.set_title("p95 wait for a slice (▲: some asks never got one)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def _occupancy_plot(outcomes: list[Outcome], shown: dict[str, int], workload: Workload) -> Figure:
    fig = Figure(figsize=(8.0, 2.6 * len(outcomes) + 0.6))
    axes = fig.subplots(len(outcomes), 1, squeeze=False, sharex=True)[:, 0]
    for i, (ax, o) in enumerate(zip(axes, outcomes)):
        n = shown[o.config.name]
        timeline = o.tallies[n].timeline
        hours = [(t - workload.start) / 3600 for t, *_ in timeline]
        colour = _COLOURS[i % len(_COLOURS)]
        ax.step(hours, [h for _, h, *_ in timeline], where="post", color=colour, label="GPUs held")
        ax.step(hours, [b for _, _, b, *_ in timeline], where="post", color="#555", linewidth=1, label="GPUs busy")
        ax.axhline(n, color="#999", linestyle=":", linewidth=1, label=f"pool: {n} GPU(s)")
        ax.set_ylim(0, n * 1.1)
        ax.set_ylabel("GPUs")
        ax.set_title(f"{o.config.name} on {n} GPU(s)", fontsize=10)
        queued = [q for *_, q, _ in timeline]
        if any(queued):
            queue = ax.twinx()
            queue.step(hours, queued, where="post", color="#c0392b", alpha=0.6, linewidth=1)
            queue.set_ylim(0, max(queued) * 1.1)
            queue.set_ylabel("waiting in the queue", color="#c0392b")
            queue.yaxis.get_major_locator().set_params(integer=True)
        ax.legend(loc="upper right", fontsize=8)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("hours")
    return fig


def _waits_plot(outcomes: list[Outcome], shown: dict[str, int], slo_wait: float) -> Figure:
    """Each configuration at its shown count (solid) and one GPU fewer (dashed), where waits begin."""
    fig, ax = _figure()
    for i, o in enumerate(outcomes):
        n = shown[o.config.name]
        for count, style in ((n, "-"), (n - 1, "--")):
            if count not in o.tallies:
                continue
            waits = sorted(o.tallies[count].all_waits)
            finite = [w for w in waits if math.isfinite(w)]
            if not finite:
                continue
            xs = [max(w, 0.1) for w in finite]
            ys = [(j + 1) / len(waits) for j in range(len(finite))]
            ax.step(xs, ys, where="post", linestyle=style, color=_COLOURS[i % len(_COLOURS)],
                    label=f"{o.config.name} ({count} GPUs)")
    ax.axvline(max(slo_wait, 0.1), color="#444", linestyle="--", linewidth=1, label="goal")
    ax.axhline(0.95, color="#aaa", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("wait for a slice (s, log; waits under 0.1 s drawn at 0.1 s)")
    ax.set_ylabel("share of asks")
    ax.set_ylim(0, 1.02)
    ax.set_title("Waits: the share of asks served within a time (dashed: one GPU fewer)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _side_by_side(outcomes: list[Outcome], shown: dict[str, int]) -> Figure:
    fig = Figure(figsize=(9.0, 3.4))
    left, right = fig.subplots(1, 2)
    names = [f"{o.config.name}\n({shown[o.config.name]} GPUs)" for o in outcomes]
    tallies = [o.tallies[shown[o.config.name]] for o in outcomes]
    width = 0.38
    xs = range(len(outcomes))
    left.bar([x - width / 2 for x in xs], [t.shut_down for t in tallies], width, color="#c0392b",
             label="shut down (state lost)")
    left.bar([x + width / 2 for x in xs], [t.hibernated for t in tallies], width, color="#1f6fb4", label="hibernated")
    left.set_xticks(list(xs), names, fontsize=8)
    left.set_title("Kernels the policy released", fontsize=10)
    left.legend(fontsize=8)
    right.bar([x - width / 2 for x in xs], [t.held_seconds / 3600 for t in tallies], width, color="#7f8c8d",
              label="held")
    right.bar([x + width / 2 for x in xs], [t.busy_seconds / 3600 for t in tallies], width, color="#2e8b57",
              label="busy")
    right.set_xticks(list(xs), names, fontsize=8)
    right.set_title("GPU-hours", fontsize=10)
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _page(result: dict, plots, shown: dict[str, int]) -> str:
    e = html.escape
    w = result["workload"]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>GPU pool capacity plan</title><style>",
        "body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}",
        "table{border-collapse:collapse;margin:.5rem 0 1.5rem}td,th{border:1px solid #ccc;padding:.2rem .5rem;"
        "text-align:right}th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}"
        ".met{background:#e6f4ea}.answer{font-size:1.15rem}img{max-width:100%}</style></head><body>",
        "<h1>GPU pool capacity plan</h1>",
        f"<p>Workload: <b>{e(str(w.get('kind')))}</b>, {w['sessions']} kernel session(s) over {w['hours']:g} h "
        f"(culling interval {e(format_duration(w['culling_interval']))}). Goal: 95% of asks for a slice wait at most "
        f"<b>{e(format_duration(result['slo']['wait_seconds']))}</b>. Hibernation costs "
        f"{e(result['costs']['hibernate'])} (s, s/GiB), resume {e(result['costs']['resume'])}.</p>",
    ]
    for c in result["configurations"]:
        parts.append(f"<h2>{e(c['name'])}</h2><p class='answer'>Fewest GPUs meeting the goal: "
                     f"<b>{e(tables.fewest(c))}</b></p>")
        queue = format_duration(c["queue_timeout"]) if c["queue_timeout"] else "0 (refused at once)"
        parts.append("<p>Profiles: " + ", ".join(f"{e(n)} ({e(p['slice'])}, {e(p['isolation'])})"
                                                  for n, p in c["profiles"].items())
                     + f". Start queue timeout {e(queue)}.</p>")
        rows, met = tables.results(c)
        parts.append(_html_table(tables.RESULT_HEADER, rows, met))
    if "comparison" in result:
        cmp = result["comparison"]
        parts.append(f"<h2>{e(cmp['proposed'])} against {e(cmp['base'])}</h2>")
        parts.append(_html_table(tables.COMPARISON_HEADER, tables.comparison(cmp)))
    if "recorded" in result:
        parts.append(f"<h2>Against the record</h2><p>{e(tables.agreement(result['recorded']))}</p>")
    for name, title, _fig in plots:
        parts.append(f"<h2>{e(title)}</h2><img src='{e(name)}' alt='{e(title)}'>")
    parts.append("<p><small>Drawn at: " + ", ".join(f"{e(k)} on {v} GPU(s)" for k, v in shown.items())
                 + ". Made by jupyter gpu-pool simulate (docs/planning.md).</small></p></body></html>")
    return "\n".join(parts)


def _html_table(header: list[str], rows: list[list[str]], met: list[bool] | None = None) -> str:
    e = html.escape
    out = ["<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>"]
    for i, row in enumerate(rows):
        mark = " class='met'" if met and met[i] else ""
        out.append(f"<tr{mark}>" + "".join(f"<td>{e(v)}</td>" for v in row) + "</tr>")
    return "".join(out) + "</table>"
