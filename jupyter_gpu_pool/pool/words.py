"""The pool's words: every reason it acts for and every action it takes, and the few pieces each sentence a
user reads is built from (a kernel's name, what it holds, a count, a time), in one catalogue.

The idle policy's warnings and records (``policy``), the server's words of an action on request
(``server_extension/messages``), the refusals' lists of what a user holds (``errors``) and the REST API's
refusals take their words from here, so one reason reads the same wherever it is said, and a test renders
every combination (tests/pool/test_words.py: every reason with every action and every state, each checked
for its grammar, not one example each).  A new reason is one :func:`reason` entry (a reservation's, say):
the test then renders it too.  Pure: nothing here does I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .leases import HIBERNATED, Lease
from .rules import HIBERNATE, SHUTDOWN
from .units import format_age, format_duration, format_size

# -- actions ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    """What the pool does to a kernel, in the forms sentences need."""

    key: str
    done: str  # "Hibernated": a record's first word
    will_be: str  # "hibernated (…)": what a warning says will be done, and what it costs
    outcome: str  # what it left, once done on request: "the GPU slice is back in the pool, …"
    then: str  # "hibernated": after "then …, if still idle"


ACTIONS: dict[str, Action] = {a.key: a for a in (
    Action(HIBERNATE, "Hibernated", "hibernated (its variables are kept; the GPU slice is given back)",
           "the GPU slice is back in the pool, your variables are kept", "hibernated"),
    Action(SHUTDOWN, "Shut down", "shut down to give its GPU slice back (its variables will be lost)",
           "the GPU slice is back in the pool, the kernel's variables are gone", "shut down"),
)}

# -- reasons ------------------------------------------------------------------------------------------

# The idle policy's reasons, as recorded and sent to the UI (``policy`` names them so too).
IDLE = "idle"
GPU_IDLE = "gpu_idle"
MAX_BUSY = "max_busy"
MAX_AGE = "max_age"
MAX_HIBERNATED = "max_hibernated"
OVER_MEMORY = "over_memory"
BUDGET = "budget"  # the owner's GPU-hour budget: warned at 90%, acted on at 100%
PRESSURE = "pressure"  # chosen (pool.reclaim) to give its slice back to someone waiting in the queue
RESERVED = "reserved"  # chosen (pool.reclaim) to give back room a reservation keeps for others (pool.reservations)


@dataclass(frozen=True)
class Reason:
    """Why the pool acts on a kernel.  ``fact``: what is true of the kernel, as a sentence's start, with
    the fields it names ("Idle for {idle}": :meth:`says`); ``unless``: what the user can still do, the
    end of a warning (", unless it is used again or snoozed."); ``short``: the reason in a few words
    ("idle too long")."""

    key: str
    fact: str
    unless: str
    short: str

    def says(self, **fields) -> str:
        """The fact with its fields filled (``policy`` gives them all: a reason uses those it names)."""
        return self.fact.format(**fields)


REASONS: dict[str, Reason] = {}


def reason(key: str, fact: str, short: str, unless: str = ", unless it is used again or snoozed.") -> Reason:
    """Put a reason in the catalogue (once per key) and return it."""
    if key in REASONS:
        raise ValueError(f"reason {key!r} is in the catalogue already")
    REASONS[key] = found = Reason(key, fact, unless, short)
    return found


reason(IDLE, "Idle for {idle}", "idle too long")
reason(GPU_IDLE, "Holding GPU memory with under {threshold:g}% GPU use for {gpu_idle}", "its GPU idle too long")
reason(MAX_BUSY, "Busy for {busy}, longer than the {max_busy} the pool allows", "busy too long")
reason(MAX_AGE, "Running for {age}, longer than the {max_age} the pool allows", "running too long")
reason(MAX_HIBERNATED, "Hibernated for {hibernated}, longer than the {max_hibernated} the pool allows",
       "hibernated too long")
reason(OVER_MEMORY, "Using {used} of GPU memory, more than its slice's {limit}", "over its GPU memory",
       unless=", unless it frees GPU memory first.")
reason(BUDGET, "{spent} of the {budget} GPU hours budgeted {this_period} are used", "GPU time used up",
       unless=" when the GPU time runs out; save your work.")
reason(PRESSURE, "Someone is waiting for a GPU slice and this kernel has been idle for {idle}",
       "someone waits for a GPU slice")
# {reserved}: the reservation's reason in words (pool.reservations.Slot.reason): "reserved for ML 101 lab from 10:00"
reason(RESERVED, "The GPU room this kernel holds is {reserved}", "its GPU room is reserved for others",
       unless=" (no snooze: the room is reserved).")

# -- the pieces of a sentence -------------------------------------------------------------------------


def this_period(period: str) -> str:
    """A budget's period as now: ``today``, ``this week``, ``this month``."""
    return "today" if period == "day" else f"this {period}"


def kernel_name(label: str, kernel_id: str) -> str:
    """A kernel as a sentence names it: its notebook, else its short id ("kernel 1a2b3c4d"; a kernel
    started over the REST API, with no notebook)."""
    return label if notebook_label(label) else f"kernel {kernel_id[:8]}"


def notebook_label(label: str) -> str:
    """``label`` where it names a notebook, else "" (a session on the server's root folder names "." or "/",
    which is no name)."""
    return "" if label.strip().strip("/") in ("", ".") else label


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``1 kernel``, ``2 kernels``: the number with its noun agreeing."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def seconds_text(seconds: float) -> str:
    """A number of seconds a user wrote, as a sentence quotes it back: ``500``, ``2.5``, never ``1e+300``."""
    if not math.isfinite(seconds):
        return "not a number"
    if abs(seconds) >= 10**9:
        return "more than 30 years" if seconds > 0 else "less than zero"
    return f"{seconds:.3f}".rstrip("0").rstrip(".")


def slice_words(lease: Lease) -> str:
    """``10 GiB``, ``20 GiB · 50%``, ``1 whole GPU``: the slice a kernel's profile holds."""
    if lease.whole:
        return count(lease.gpu_count, "whole GPU")
    words = format_size(lease.memory)
    return f"{words} · {lease.sm_percent}%" if lease.sm_percent else words


def holding(lease: Lease, now: float) -> str:
    """What one of a user's kernels holds now, for a list of them: ``a.ipynb (10 GiB, slice held for 4m)``,
    ``b.ipynb (10 GiB, hibernated for 2m)``, ``c.ipynb (20 GiB · 50%, no GPU yet)`` (it has never held a
    slice: nothing to hibernate, nothing to give back).  How long, not "active", which the user's panel
    would contradict with "idle since 19:26"."""
    age = format_age(now - lease.state_since)
    if lease.awaits_first_cell:
        held = "no GPU yet"
    elif lease.state == HIBERNATED:
        held = f"hibernated for {age}"
    else:
        held = f"slice held for {age}"
    return f"{kernel_name(lease.label, lease.kernel_id)} ({slice_words(lease)}, {held})"


def holds_a_slice(leases: list[Lease]) -> bool:
    """Whether any of these kernels holds GPU memory now (shutting one down would free room on a GPU)."""
    return any(lease.state != HIBERNATED for lease in leases)


def snooze_limit(limit: float) -> str:
    """``at most 120 seconds (2m)``: the longest Keep alive a rule allows, said one way everywhere."""
    return f"at most {seconds_text(limit)} seconds ({format_duration(limit)})"


# -- why a kernel cannot hibernate ------------------------------------------------------------------------
# Whoever knows why a kernel cannot hibernate (the local hibernator's capability, a cluster's sharing backend,
# the server where it cannot ask) says it as a clause: lower case but for a name, no final stop, one sentence's
# worth.  The sentences below embed it (a refusal, a record's note, the hibernator's own refusal), and so does
# the Release GPU button's tooltip ("… it cannot hibernate (<why>).", labextension's view.ts).

# An MPS client cannot be checkpointed (the CUDA driver refuses it, error 801).
MPS_CANNOT_HIBERNATE = ("it runs under NVIDIA MPS, which guarantees its profile a share of the GPU's compute, and "
                        "the CUDA driver cannot checkpoint an MPS kernel's GPU memory")
MIG_CANNOT_HIBERNATE = "its GPU is in MIG mode, and the CUDA driver cannot checkpoint processes on MIG instances"
NOTHING_TO_HIBERNATE = "it holds no GPU right now, so there is nothing to hibernate"
# What follows a refusal where the kernel can only be shut down (a sentence of its own).
ONLY_SHUT_DOWN = "It can only be shut down to free its slice."


def no_checkpoint_driver(reason: str) -> str:
    """The machine's CUDA driver has no checkpoint API (``reason``: the loader's words)."""
    return f"hibernation is unavailable on this machine: {why_clause(reason)}"


def old_checkpoint_driver(minimum: int, found: str) -> str:
    return f"hibernation needs NVIDIA driver {minimum} or newer; this machine has {found}"


def driver_refuses(error_name: str) -> str:
    """The CUDA driver refused to lock the kernel's processes as not supported (an MPS client, MIG, IPC…)."""
    return (f"the CUDA driver answers {error_name} to a checkpoint of it, as it does for a kernel that uses MPS, "
            "MIG, CUDA IPC or multi-process NCCL")


_SENTENCE_STARTS = ("this kernel cannot hibernate now:", "this kernel cannot hibernate:",
                    "this cluster cannot hibernate kernels:", "it cannot hibernate:")


def why_clause(text: str) -> str:
    """``text`` saying why a kernel cannot hibernate, as the clause the sentences here embed: a sentence
    another part wrote (the operator's status: "This kernel cannot hibernate: its 8 GiB … memory. It keeps
    running. …") keeps its first sentence, without "This kernel cannot hibernate:" or its final stop, and
    starts in lower case unless its first word is a name (MPS, NVIDIA, HAMi)."""
    clause = " ".join(text.split())
    for start in _SENTENCE_STARTS:
        if clause.lower().startswith(start):
            clause = clause[len(start):].lstrip()
            break
    first = next((i for i in range(len(clause) - 2) if clause[i] == "." and clause[i + 1] == " "
                  and clause[i + 2].isupper()), None)
    clause = (clause[:first] if first is not None else clause).rstrip(". ")
    word = clause.split(" ", 1)[0]
    if word[:1].isupper() and word[1:] == word[1:].lower():  # "This", "Hibernation"; not "MPS", "HAMi"
        clause = clause[:1].lower() + clause[1:]
    return clause


def cannot_hibernate(why: str) -> str:
    """The kernel's refusal as a clause, for after a colon: "it cannot hibernate (<why>)"."""
    return f"it cannot hibernate ({why_clause(why)})"


def cannot_hibernate_sentence(why: str, then: str = "") -> str:
    """"This kernel cannot hibernate: <why>." and ``then`` (what follows: a sentence of its own)."""
    return " ".join(filter(None, (f"This kernel cannot hibernate: {why_clause(why)}.", then)))


def not_done(action: str, why: str) -> str:
    """A request (``action``: release, hibernate or shutdown) that was not carried out, and why (a clause)."""
    done = {"release": "Not released", "hibernate": "Not hibernated", "shutdown": "Not shut down"}[action]
    return f"{done}: {why}."


def shut_down_instead(why: str | None) -> str:
    """A record's note where a rule's hibernation became a shutdown."""
    return f"hibernation unavailable ({why_clause(why) if why else 'unknown reason'}), so shut down instead"
