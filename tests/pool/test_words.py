"""Every sentence the server makes from the pool's catalogue of reasons and actions (``pool.words``),
rendered in every combination and checked for how it reads: the idle policy's warnings and records (each
reason with each action), the words of an action on request, a Keep alive, a queued start or resume, a
failed hibernation, every refusal of a start (each limit, scope and advice, with every kind of kernel the
user may hold: a slice held, hibernated, no GPU yet, one with no notebook), the refusals of a Keep alive,
and why a kernel cannot hibernate.  Not one example each: a new reason or action in the catalogue is
rendered here with all the others."""

from __future__ import annotations

import itertools
import re
import time
from dataclasses import replace

import pytest
from ledger_helpers import GiB

from jupyter_gpu_pool.devices.checkpoint import DriverInfo, capability
from jupyter_gpu_pool.pool import GPU, Lease, PoolExhausted, QuotaExceeded, UnknownProfile
from jupyter_gpu_pool.pool import policy as P
from jupyter_gpu_pool.pool.budgets import Budget, BudgetExceeded, Scope, Standing
from jupyter_gpu_pool.pool.errors import LeaseNotFound, MPSUserBusy
from jupyter_gpu_pool.pool.leases import FIRST_CELL
from jupyter_gpu_pool.pool.rules import parse_rule
from jupyter_gpu_pool.pool.units import format_clock
from jupyter_gpu_pool.cluster.hibernation import backend_support, refusal_words
from jupyter_gpu_pool.pool.words import (ACTIONS, MPS_CANNOT_HIBERNATE, ONLY_SHUT_DOWN, REASONS, cannot_hibernate,
                                         cannot_hibernate_sentence, driver_refuses, holding, kernel_name, not_done,
                                         why_clause)
from jupyter_gpu_pool.server_extension import messages

NOW = 1_750_000_000.0

# -- the checks ----------------------------------------------------------------------------------------

# nouns a count comes before, longest first; "GPU" only where it is the noun ("2 GPU kernels" is fine)
_NOUNS = r"(GPU kernel|whole GPU|other request|more Keep alive|Keep alive|kernel|request|second|minute|GPU(?![ -]\w))"
BAD = [
    (r"\{|\}", "a placeholder left unfilled"),
    (r"\bNone\b|\bnan\b|\binf\b", "a missing value written out"),
    (r"\d[eE][+-]?\d", "a number in scientific notation"),
    (r"\(s\)", "a lazy plural: say the count's own form"),
    (r"  ", "two spaces"),
    (r" [.,;:]", "a space before punctuation"),
    (r"[.,;:][.,;:]", "two punctuation marks"),
    (r"\(\)", "empty brackets"),
    (r"(?i)\b(\w+) \1\b", "a word twice"),
    (r"\b1 " + _NOUNS + r"s\b", "one of a plural noun"),
    (r"(?<![\d.])(0|[2-9]|\d\d+) " + _NOUNS + r"(?!\w)", "several of a singular noun"),
    (r"(?:^|[\s;:(])\.(?= \()", "a kernel named '.'"),
    (r"because it was (someone|is|are|a )", "a reason that does not follow 'it was'"),
    (r"CUDA error \d+|error \d{3}\b", "an error code where words belong"),
    (r"\w''s\b", "a quoted name with 's"),
    (r"\bthe never\b", "a limit that is not set, said as one"),
    (r"(cannot hibernate|unavailable|now)(: | \()(This|The|It|Its|Hibernation)\b", "a sentence where a clause belongs"),
    (r"\((This|The|It|Its|Hibernation)\b|\.\)", "a sentence in brackets"),
    (r"cannot hibernate.*cannot hibernate", "'cannot hibernate' said twice"),
    (r"\bthis day\b", "'this day' for today"),
]


def problems(text: str) -> list[str]:
    """What is wrong with how ``text`` reads (empty: nothing)."""
    found = [why for pattern, why in BAD if re.search(pattern, text)]
    if not text or not (text[0].isupper() or text[0] in "'\"" or text[0].isdigit()):
        found.append("does not start as a sentence")
    if not text.endswith((".", "?", "!")):
        found.append("does not end as a sentence")
    for after in re.findall(r"[.?!] (\S)", text):
        if not (after[0].isupper() or after[0] in "'\"(" or after[0].isdigit()):
            found.append(f"a sentence starts with {after!r}")
    return found


def check(texts: dict[str, str]) -> None:
    bad = {where: (text, problems(text)) for where, text in texts.items() if problems(text)}
    assert not bad, "\n".join(f"{where}: {why}\n    {text}" for where, (text, why) in bad.items())


def test_the_checks_catch_what_users_reported():
    """The checks themselves: each sentence reported as wrong in issue 28 fails one."""
    for text in ["Hibernated because it was someone is waiting for a GPU slice.",
                 "Your kernels holding the pool: . (10 GiB, slice held for 4m).",
                 "1 other request(s) are waiting in the queue.",
                 "A snooze must last at most 3.1536e+07 seconds.",
                 "It cannot hibernate: an MPS client cannot be checkpointed (CUDA error 801).",
                 "You hold 1 of your 1 GPU kernels.",
                 "Not hibernated: it cannot hibernate: The checkpoint API is missing.",
                 "This kernel cannot hibernate now: it cannot hibernate here.",
                 "Shut it down: it cannot hibernate (This kernel runs under NVIDIA MPS.).",
                 "GPU time this day: 9.1 of 10 h used: this kernel will be shut down in 5m."]:
        assert problems(text), text
    assert problems("A fine sentence, 2 GPU kernels and 1 GPU kernel; 3 more Keep alives allowed.") == []


# -- what a user may hold --------------------------------------------------------------------------------


def lease(label: str, *, state: str = "active", reason: str = "", sm: int | None = None, whole: int = 0,
          held_for: float = 240.0) -> Lease:
    return Lease(id=f"L-{label}-{state}", owner="alice", kernel_id=f"1a2b3c4d-{label or 'x'}-{state}", profile="p",
                 isolation="mps" if sm else "soft", memory=20 * GiB if sm else 10 * GiB, sm_percent=sm,
                 whole=bool(whole), gpu_count=whole or 1, state=state, gpus=("G0",) if state == "active" else (),
                 last_gpus=("G0",), groups=("lab",), label=label, created=NOW - 3600, updated=NOW,
                 state_since=NOW - held_for, reason=reason)


KINDS = {
    "slice held": lease("a.ipynb"),
    "hibernated": lease("b.ipynb", state="hibernated", reason="idle"),
    "no GPU yet": lease("third.ipynb", state="hibernated", reason=FIRST_CELL, sm=50),
    "whole GPUs": lease("w.ipynb", whole=2),
    "no notebook": lease(""),
    "root folder": lease("."),
}
HOLDINGS = {"nothing": [], **{k: [v] for k, v in KINDS.items()}, "all": list(KINDS.values())}


def test_each_kind_of_kernel_a_user_holds_is_said_as_what_it_is():
    said = {kind: holding(lease_, NOW) for kind, lease_ in KINDS.items()}
    assert said["slice held"] == "a.ipynb (10 GiB, slice held for 4m)"
    assert said["hibernated"] == "b.ipynb (10 GiB, hibernated for 4m)"
    assert said["no GPU yet"] == "third.ipynb (20 GiB · 50%, no GPU yet)"  # never "hibernated": nothing slept
    assert said["whole GPUs"] == "w.ipynb (2 whole GPUs, slice held for 4m)"
    assert said["no notebook"].startswith("kernel 1a2b3c4d (") and said["root folder"].startswith("kernel 1a2b3c4d (")
    assert kernel_name("notes/a.ipynb", "1a2b3c4d-e") == "notes/a.ipynb" and kernel_name("/", "1a2b3c4d") == \
        "kernel 1a2b3c4d"


# -- refusals of a start -------------------------------------------------------------------------------


def quota_refusals():
    for scope, resource, (holds, hold_name), starts, never in itertools.product(
            ("user", "lab"), ("kernels", "GPU memory", "SM share"), [(v, k) for k, v in HOLDINGS.items()],
            ((), ("Python 3 · GPU 10 GiB",), ("Python 3 · GPU 10 GiB", "Python 3 · GPU 20 GiB")), (False, True)):
        if scope == "user" and not holds and not never:
            continue  # a limit the user passes with nothing held can never fit: never_fits
        limit, used, asked = {"kernels": ("2", str(max(len(holds), 2)), "1"), "GPU memory": ("30 GiB", "20 GiB", "20 GiB"),
                              "SM share": ("60%", "50%", "20%")}[resource]
        for limit_ in ((limit, "1") if resource == "kernels" else (limit,)):
            yield (f"quota {scope} {resource} limit {limit_} holding {hold_name} starts {len(starts)} never {never}",
                   QuotaExceeded(owner="alice", profile="p", scope=scope, resource=resource, limit=limit_, used=used,
                                 asked=asked, holdings=holds, now=NOW, launcher_name="Python 3 · GPU 20 GiB",
                                 starts_now=starts, never_fits=never))


def pool_refusals():
    for gpus, largest, (holds, hold_name), queued, starts in itertools.product(
            (0, 2), (None, "10 GiB on GPU 0"), [(v, k) for k, v in HOLDINGS.items()], (0, 1, 3),
            ((), ("Python 3 · GPU 10 GiB",))):
        yield (f"pool gpus {gpus} largest {largest} holding {hold_name} queued {queued} starts {len(starts)}",
               PoolExhausted(profile="p", slice_text="20 GiB", gpu_count=gpus, largest=largest, holdings=holds,
                             queued=queued, now=NOW, launcher_name="Python 3 · GPU 20 GiB", starts_now=starts))


def budget_refusals():
    for kind, (holds, hold_name) in itertools.product(("user", "member", "shared"),
                                                      [(v, k) for k, v in HOLDINGS.items()]):
        standing = Standing(Scope("lab" if kind != "user" else "alice", kind, Budget(10.0)), 10.2, 0.5,
                            NOW + 86400, NOW)
        yield (f"budget {kind} holding {hold_name}",
               BudgetExceeded(owner="alice", profile="p", standing=standing, holdings=holds, now=NOW,
                              launcher_name="Python 3 · GPU 20 GiB"))


def test_every_refusal_of_a_start_reads_right():
    refusals = dict(itertools.chain(quota_refusals(), pool_refusals(), budget_refusals()))
    refusals["mps"] = MPSUserBusy(profile="p", users=["bob"], launcher_name="Python 3 · GPU 20 GiB · 50%")
    refusals["unknown"] = UnknownProfile("gpu-99g", ["gpu-10g", "gpu-20g"])
    refusals["lease"] = LeaseNotFound("L-1")
    assert len(refusals) > 300
    check({where: str(refusal) for where, refusal in refusals.items()})


@pytest.mark.parametrize("make", [quota_refusals, pool_refusals])
def test_a_refusal_advises_shutting_down_only_what_the_user_holds_and_would_make_room(make):
    for where, refusal in make():
        text = str(refusal)
        holds = refusal.holdings
        slices = [h for h in holds if h.state == "active"]
        if "shut down a kernel you no longer need" in text.lower():
            assert slices, f"{where}: {text}"  # shutting down a hibernated or slice-less kernel frees no GPU
        if "Shut one down" in text:
            assert holds, f"{where}: {text}"  # a kernel count: any kernel of theirs counts
        if not holds:
            assert "You hold no GPU kernel right now." in text or "cannot start: the pool has no GPUs" in text or \
                refusal.never_fits if isinstance(refusal, QuotaExceeded) else True, f"{where}: {text}"
        for h in holds:
            if h.awaits_first_cell:
                assert f"{h.label} (20 GiB · 50%, no GPU yet)" in text or "pool has no GPUs" in text or \
                    getattr(refusal, "never_fits", False), f"{where}: {text}"


# -- the idle policy's words: every reason with every action -------------------------------------------


FACTS = P.Facts(kernel_id="k", state="active", execution_state="idle", last_activity=NOW - 1500, started=NOW - 7200,
                state_since=NOW - 3000, busy_since=NOW - 5000, memory_used=12 * GiB, memory_limit=10 * GiB,
                gpu_idle_since=NOW - 1800, budget_used=9.1, budget_limit=10.0, budget_period="week")


def _reservation_reasons() -> dict[str, str]:
    """A reservation's reason in each phase a kernel is reclaimed in (before the window, open, borrowed)."""
    from jupyter_gpu_pool.pool.reservations import parse_reservations

    [r] = parse_reservations([{"name": "ML 101 lab", "groups": ["ml101"], "start": "2025-06-15 10:00",
                               "end": "2025-06-15 12:00", "timezone": "UTC", "memory": "160GiB"}])
    start = r.window.once[0]
    return {phase: r.slot(at).reason(at) for phase, at in (("making room", start - 300), ("open", start + 60),
                                                           ("borrowing", start + 1200))}


RESERVED_REASONS = _reservation_reasons()


def test_what_a_reservation_says_reads_right_to_members_and_others():
    from jupyter_gpu_pool.pool.reservations import parse_reservations

    said = {}
    for memory, gpus in (("160GiB", None), (None, 1), (None, 2), ("40GiB", 2)):
        [r] = parse_reservations([{"name": "ML 101 lab", "groups": ["ml101"], "days": ["tue"], "start": "10:00",
                                   "end": "12:00", "timezone": "UTC", "memory": memory, "gpus": gpus}])
        start = next(r.window.occurrences(NOW, NOW + 8 * 86400))[0]
        for at in (start - 86400, start - 300, start + 60, start + 1200):
            slot = r.slot(at)
            for member in (True, False):
                said[f"{memory} {gpus} {at - start} {member}"] = slot.words(at, member) + "."
            said[f"borrowed {memory} {gpus} {at - start}"] = slot.borrowed(at)
    check(said)
    assert set(RESERVED_REASONS.values()) == {"reserved for ML 101 lab from 10:00", "reserved for ML 101 lab until 12:00",
                                              "reserved for ML 101 lab until 12:00, and a member needs it"}


@pytest.mark.parametrize("rule_name", ["students", "rule 3"])
def test_every_reason_with_every_action_reads_right_warned_and_done(rule_name):
    limits = {"idle_timeout": "30m", "max_busy": "1h", "max_age": "8h", "max_hibernated": "1d",
              "gpu_idle_timeout": "20m"}  # every reason's limit is set: a reason arises only where it is
    entry = {"name": rule_name, **limits} if rule_name != "rule 3" else {"match": {"group": "students"}, **limits}
    rule = parse_rule(2, entry)
    said = {}
    reserved = {reason: RESERVED_REASONS[reason] for reason in RESERVED_REASONS}  # a reservation's, each phase
    for (key, _reason), action, lead, why in itertools.product(REASONS.items(), ACTIONS, (1.5, 42, 90, 3600),
                                                               reserved.values()):
        said[f"warned {key} {action} in {lead} {why}"] = P._warning_message(key, action, FACTS, rule, NOW,
                                                                            NOW + lead, why)
        said[f"done {key} {action} {why}"] = P._action_message(key, action, FACTS, rule, NOW, why)
    for period, action in itertools.product(("day", "week", "month"), ACTIONS):  # a budget's, each period
        facts = replace(FACTS, budget_period=period)
        said[f"warned budget {period} {action}"] = P._warning_message(P.BUDGET, action, facts, rule, NOW, NOW + 90)
        said[f"done budget {period} {action}"] = P._action_message(P.BUDGET, action, facts, rule, NOW)
    check(said)
    # one sentence: what is true, then what follows (no fact that is itself "label: value")
    assert [w for w, text in said.items()
            if w.startswith("warned") and re.sub(r"\([^()]*\)", "", text).count(": ") != 1] == []
    first = next(iter(reserved.values()))
    assert all(ACTIONS[a].will_be in said[f"warned idle {a} in 90 {first}"] for a in ACTIONS)
    assert "variables will be lost" in said[f"warned idle shutdown in 90 {first}"]  # a shutdown says what it costs


def test_every_action_on_request_a_keep_alive_a_queue_place_and_a_failed_hibernation_read_right():
    said = {f"on request {a} by {by}": messages.on_request(a, by) for a in ACTIONS for by in (None, "root")}
    for until, left, then in itertools.product((30, 110, 600, 7200), (0, 1, 2), (None, *ACTIONS)):
        said[f"kept alive {until} {left} {then}"] = messages.kept_alive(NOW + until, NOW, left, then)
    for resume, name, launcher, position in itertools.product((True, False), ("a.ipynb", "", ".", "/"),
                                                              (None, "Python 3 · GPU 10 GiB"), (1, 3)):
        said[f"queued {resume} {name!r} {launcher} {position}"] = messages.queued(resume, name, launcher, position)
    for why in ("The kernel's GPU work did not finish within 10 s.", "host RAM is full"):
        said[f"failed {why}"] = messages.hibernation_failed(why, NOW + 60, NOW)
        said[f"failed later {why}"] = messages.hibernation_failed(why, NOW + 1800, NOW)
    said["server stopped"] = messages.SERVER_STOPPED
    check(said)
    assert all("'.'" not in text and " . " not in text for text in said.values())


def test_every_refusal_of_a_keep_alive_reads_right_and_says_the_limit_one_way():
    said = {}
    for snoozes, snooze in itertools.product((0, 1, 3), (120, 600)):
        rule = parse_rule(0, {"name": "lab", "max_snoozes": snoozes, "snooze": snooze, "idle_timeout": "30m"})
        used = P.KernelState(snoozes_used=snoozes)
        for asked in (0, -5, 10**300, float("nan"), snooze * 2, 2.5):
            try:
                P.snooze(used if snoozes else P.FRESH, rule, NOW, asked)
            except P.SnoozeRefused as e:
                said[f"{snoozes} snoozes of {snooze} asked {asked}"] = e.message
        said[f"bad body {snooze}"] = P.bad_snooze(rule, "'ten'").message
        for reason in (P.OVER_MEMORY, P.BUDGET):
            warned = P.KernelState(warning=P.Warning(reason, P.SHUTDOWN, NOW, NOW + 60, ""))
            with pytest.raises(P.SnoozeRefused) as refused:
                P.snooze(warned, rule, NOW, 60)
            said[f"{reason} {snooze}"] = refused.value.message
    check(said)
    limits = {m.group(0) for text in said.values() for m in [re.search(r"at most [^,]*\)", text)] if m}
    assert limits == {"at most 120 seconds (2m)", "at most 600 seconds (10m)"}, limits


def _whys() -> dict[str, str]:
    """Every way a part of the pool says why a kernel cannot hibernate: the local capability (each isolation
    mode, GPU kind and driver), the driver's own refusal, the server's own reasons, each cluster backend that
    hands nothing back, and the operator's refusals (sentences of its status, which the server embeds)."""
    declared = GPU("G0", "Demo", 40 * GiB, index=0, source="declared")
    real = GPU("G1", "H100", 80 * GiB, index=1, source="detected")
    mig = GPU("G2", "A100", 40 * GiB, index=2, source="detected", mig=True)
    drivers = {"ok": DriverInfo(available=True, reason="", remap=True),
               "none": DriverInfo(available=False, reason="libcuda.so.1 not found (no NVIDIA driver on this machine)")}
    whys = {"mps": MPS_CANNOT_HIBERNATE, "801": driver_refuses("CUDA_ERROR_NOT_SUPPORTED"),
            "not here": "the kernel runs in another server", "failed": "the hibernator failed: boom"}
    for (isolation, gpus, (name, info), version) in itertools.product(
            ("mps", "soft", "exclusive"), ([], [declared], [real], [mig]), drivers.items(), ("580.1", "550.54")):
        found = capability(isolation, gpus, info, version)
        if not found.available:
            whys[f"{isolation} {[g.name for g in gpus]} {name} {version}"] = found.why
    for backend in ("mps", "mig", "whole", "dra", "hami", "unknown"):
        whys[f"cluster {backend}"] = backend_support(backend, memory_scaling=1.0).why
    whys["operator host memory"] = (
        "This kernel cannot hibernate: its 8 GiB of GPU memory would land in its pod's host memory, and the pod's "
        "memory limit (12 GiB) cannot hold it on top of the 6 GiB it is sized to use: the kernel would be killed "
        "for running out of memory. It keeps running. Ask your admin to size kernel pods for hibernation.")
    whys["operator backend"] = refusal_words(backend_support("mps"))
    return whys


def test_why_a_kernel_cannot_hibernate_reads_right_wherever_it_is_embedded():
    """Each reason, in each sentence that embeds it: the hibernator's refusal ("This kernel cannot hibernate:
    <why>."), a refused Hibernate (the REST API's 409 and an admin's request: "Not hibernated: it cannot
    hibernate (<why>)."), a record's note where the rule's hibernation became a shutdown, and the Release GPU
    button's tooltip (labextension's view.ts: "… (its variables are lost): it cannot hibernate (<why>).").  No
    sentence where a clause belongs, no sentence in brackets, no "cannot hibernate" said twice."""
    rule = parse_rule(0, {"action": "hibernate"})
    said = {}
    for where, why in _whys().items():
        said[f"refusal {where}"] = cannot_hibernate_sentence(why, ONLY_SHUT_DOWN)
        said[f"409 {where}"] = not_done("hibernate", cannot_hibernate(why))
        said[f"note {where}"] = f"Shut down: {P.release_action(rule, False, why)[1]}."
        said[f"tooltip {where}"] = ("Shut the kernel down now to give its GPU slice back (its variables are lost): "
                                    f"it cannot hibernate ({why_clause(why)}).")
    check(said)
    assert why_clause("MPS: the CUDA driver cannot checkpoint an MPS client") == \
        "MPS: the CUDA driver cannot checkpoint an MPS client"  # a name keeps its capitals
    assert why_clause("This kernel cannot hibernate: Its memory. Ask.") == "its memory"


# -- times -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ahead, seconds", [(0, True), (55, True), (119, True), (120, False), (600, False)])
def test_a_deadline_under_two_minutes_away_is_said_to_the_second(ahead, seconds):
    at = NOW + ahead
    said = format_clock(at, NOW)
    assert said == time.strftime("%H:%M:%S" if seconds else "%H:%M", time.localtime(at))
    assert format_clock(at) == time.strftime("%H:%M", time.localtime(at))  # no "now": a time of day
    kept = messages.kept_alive(at, NOW, 1, None)
    assert f"until {said};" in kept


def test_the_catalogue_takes_a_new_reason_and_refuses_one_twice():
    from jupyter_gpu_pool.pool import words

    added = words.reason("test_reservation", "A reservation of {idle} begins", "a reservation begins")
    try:
        check({"warned": P._warning_message("test_reservation", P.HIBERNATE, FACTS, parse_rule(0, {}), NOW, NOW + 60)})
        with pytest.raises(ValueError, match="in the catalogue already"):
            words.reason("test_reservation", "x", "x")
    finally:
        del words.REASONS[added.key]


def test_the_admins_table_and_the_views_never_name_a_kernel_dot():
    from jupyter_gpu_pool.server_extension.notebooks import name_of

    assert name_of(replace(KINDS["slice held"], label="."), {}) == ""
    assert name_of(replace(KINDS["slice held"], label="."), {KINDS["slice held"].kernel_id: "nb.ipynb"}) == "nb.ipynb"
