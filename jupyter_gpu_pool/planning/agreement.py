"""Does a replay decide what the live pool decided?  Its warnings and actions against the recorded
ones, kernel by kernel and in order, each at most one culling pass away, and its refusals against the
recorded refusals.

A replay decides on its passes' scheduled times; the live culler on the time its pass actually ran
(a few milliseconds late) and on the readings its sampler had stored by then, so a reading taken just
before a pass can count one pass later live than in the replay.  Time apart is therefore counted in
passes (rounded): one pass apart is 1.0 interval give or take the live pass's lateness."""

from __future__ import annotations

from collections import defaultdict


def agreement(recorded: list[dict], replayed: list[dict], tolerance: float, *, refused_recorded: list[dict] = (),
              refused_replayed: list[dict] = ()) -> dict:
    """``recorded`` and ``replayed``: decisions as dicts with t, kernel, verb, reason, action (dry runs
    left out); ``tolerance``: the culling interval.  Returns what matched, what only one side has, and
    the largest time apart of a match."""
    mine, theirs = _by_kernel(recorded), _by_kernel(replayed)
    matched, missing, extra, worst = 0, [], [], 0.0
    for kernel in sorted(set(mine) | set(theirs)):
        a, b = mine.get(kernel, []), theirs.get(kernel, [])
        i = j = 0
        while i < len(a) and j < len(b):
            if _same(a[i], b[j]) and passes_apart(a[i]["t"], b[j]["t"], tolerance) <= 1:
                worst = max(worst, abs(a[i]["t"] - b[j]["t"]))
                matched, i, j = matched + 1, i + 1, j + 1
            elif a[i]["t"] <= b[j]["t"]:
                missing.append(a[i])
                i += 1
            else:
                extra.append(b[j])
                j += 1
        missing += a[i:]
        extra += b[j:]
    refusals_recorded = sorted((r["kernel"], r["reason"]) for r in refused_recorded)
    refusals_replayed = sorted((r["kernel"], r["reason"]) for r in refused_replayed)
    return {"tolerance_seconds": tolerance, "matched": matched, "missing": missing, "extra": extra,
            "largest_offset_seconds": round(worst, 3), "refusals_agree": refusals_recorded == refusals_replayed,
            "refusals": {"recorded": len(refusals_recorded), "replayed": len(refusals_replayed)},
            "agrees": not missing and not extra and refusals_recorded == refusals_replayed}


def passes_apart(a: float, b: float, interval: float) -> int:
    """How many culling passes apart two decisions are."""
    return round(abs(a - b) / interval)


def _by_kernel(decisions: list[dict]) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = defaultdict(list)
    for d in sorted(decisions, key=lambda d: d["t"]):
        if not d.get("dry_run"):
            found[d["kernel"]].append(d)
    return found


def _same(a: dict, b: dict) -> bool:
    return (a["verb"], a["reason"], a["action"]) == (b["verb"], b["reason"], b["action"])
