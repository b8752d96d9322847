"""The plan's tables as cells of text: the terminal (``cli.render``) and the HTML report draw the same."""

from __future__ import annotations

from ..pool.units import format_duration

RESULT_HEADER = ["GPUs", "wait p50", "p95", "max", "refused", "shut down", "hibernated", "restarts", "GPU-h held",
                 "GPU-h busy", "peak", "mean"]
COMPARISON_HEADER = ["GPUs", "shut down", "hibernated", "refused", "p95 wait", "GPU-h held", "GPU-h busy"]
SHARING_HEADER = ["GPUs", "who", "asks", "wait mean", "p95", "never served", "fairness"]
POLICY_HEADER = ["policy", "GPUs for goal", "GPU-h held", "GPU-h busy", "held/busy", "resumes/user-h",
                 "resume wait mean", "p95", "cells >1.1x", "hints used/unused"]


def wait(value: float | None) -> str:
    """A wait in words; None is an ask that never got a slice."""
    return "never" if value is None else format_duration(value)


def results(config: dict) -> tuple[list[list[str]], list[bool]]:
    """A configuration's rows (under RESULT_HEADER), and which meet the goal."""
    rows = []
    for r in config["results"]:
        ws, hours, occupancy = r["wait_seconds"], r["gpu_hours"], r["occupancy"]
        rows.append([str(r["gpus"]), wait(ws["p50"]), wait(ws["p95"]), wait(ws["max"]), str(r["refusals"]["total"]),
                     str(r["shut_down"]), str(r["hibernated"]), str(r["restarts"]), f"{hours['held']:.1f}",
                     f"{hours['busy']:.1f}", f"{occupancy['peak']:.0%}", f"{occupancy['mean']:.0%}"])
    return rows, [bool(r.get("meets_slo")) for r in config["results"]]


def sharing(config: dict) -> list[list[str]]:
    """Each group's waits and Jain's index over their means, and each reservation's members' waits at its
    windows' starts, per GPU count (under SHARING_HEADER); none where the replay had one group and no
    reservation."""
    rows = []
    for r in config["results"]:
        for who, w in [*((f"group {g}", w) for g, w in r.get("groups", {}).items()),
                       *((f"{name}: its group at its start", w) for name, w in r.get("classes", {}).items()),
                       *((f"{name}: members at its start", w) for name, w in r.get("reservations", {}).items())]:
            mean = "n/a" if w["mean"] is None else format_duration(w["mean"])
            rows.append([str(r["gpus"]), who, str(w["asks"]), mean, wait(w["p95"]) if w["asks"] else "n/a",
                         str(w["never_served"]), ""])
        if r.get("fairness") is not None:
            rows.append([str(r["gpus"]), "Jain's index over the groups' mean waits", "", "", "", "",
                         f"{r['fairness']:.3f}"])
    return rows


def comparison(cmp: dict) -> list[list[str]]:
    """The second configuration minus the first, per GPU count (under COMPARISON_HEADER)."""
    return [[str(d["gpus"]), f"{d['shut_down']:+d}", f"{d['hibernated']:+d}", f"{d['refusals']:+d}",
             "n/a" if d["p95_wait_seconds"] is None else f"{_signed(d['p95_wait_seconds'])} s",
             _signed(d["gpu_hours_held"]), _signed(d["gpu_hours_busy"])] for d in cmp["difference"]]


def policies(rows: list[dict]) -> list[list[str]]:
    """One row per policy compared (under POLICY_HEADER); the figures after the GPU count are at that count
    (or, where no count replayed meets the goal, at the most GPUs replayed, marked "none; at N")."""
    out = []
    for r in rows:
        waits, hints = r["resume_wait_seconds"], r["hints"]
        ratio = r["held_over_busy"]
        gpus = str(r["gpus_for_goal"]) if r["gpus_for_goal"] is not None else f"none; at {r['at_gpus']}"
        out.append([r["policy"], gpus, f"{r['gpu_hours_held']:.2f}", f"{r['gpu_hours_busy']:.2f}",
                    "n/a" if ratio is None else f"{ratio:.2f}x",
                    f"{r['resumes_per_user_hour']:.2f}", "n/a" if waits["mean"] is None else f"{waits['mean']:.2f} s",
                    "n/a" if waits["p95"] is None else f"{waits['p95']:.2f} s",
                    f"{r['resumed_cells_over_goal']}/{r['resumed_cells']}",
                    f"{hints['resumed'] - hints['unused']}/{hints['unused']}" if r["hint"] else "-"])
    return out


def _signed(value: float) -> str:
    return f"{round(value, 1) + 0.0:+.1f}"  # (+ 0.0: never "-0.0")


def fewest(config: dict) -> str:
    n = config["fewest_gpus"]
    return str(n) if n is not None else "none of the counts replayed"


def agreement(recorded: dict) -> str:
    return (f"{recorded['matched']} decision(s) replayed as recorded (within one culling pass, "
            f"{format_duration(recorded['tolerance_seconds'])}), {len(recorded['missing'])} recorded but not "
            f"replayed, {len(recorded['extra'])} replayed but not recorded; refusals "
            f"{'agree' if recorded['refusals_agree'] else 'differ'}.")
