"""``jupyter gpu-pool trace export`` and ``jupyter gpu-pool simulate``: the planner's command line.

The edge of the planning package: it reads settings, files and the ledger (or the pool service),
shows progress, and prints; the rest of the package is pure.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

from traitlets import Bool, Int, List, Unicode
from traitlets.config import Config
from traitlets.config.loader import JSONFileConfigLoader, PyFileConfigLoader

from ..cli import PoolCommand
from ..config import ConfigError, load_settings
from ..devices.nvml import discover
from ..local.pool import build_inventory
from ..pool import PoolError
from ..pool.rules import PolicyError, parse_policy
from ..pool.units import format_duration, parse_seconds, parse_size
from . import tables, tracefile
from .agreement import agreement
from .comparison import parse_policies, rows, variant
from .configuration import DEFAULT_GPU, Configuration, Hint, PlanError
from .costs import HIBERNATE, RESUME, GiB, Costs, parse_cost
from .plan import run, summary
from .synthetic import Hub, Lab, Week

PAGE = 2000  # trace events read per request


def parse_since(text: str, now: float) -> float:
    """``7d``, ``12h``, ``90m`` ago (or ``all``): the time the export starts from."""
    if text.strip().lower() == "all":
        return 0.0
    try:
        return now - parse_seconds(text, zero_allowed=False)
    except ValueError:
        raise PlanError(f"--since {text!r}: write how far back, such as 7d, 12h or 90m, or 'all'") from None


class TraceExportApp(PoolCommand):
    name = "jupyter-gpu-pool-trace-export"
    description = """Write the pool's activity trace as JSON lines to stdout (or --output): what the capacity
    planner replays (jupyter gpu-pool simulate --trace FILE).  Admins export everyone's kernels, users their own."""

    since = Unicode("30d", help="How far back: 7d, 12h, 90m, or 'all'.").tag(config=True)
    user = Unicode("", help="Only this user's kernels (admins; a user always gets only their own).").tag(config=True)
    output = Unicode("", help="Write to this file instead of stdout.").tag(config=True)
    aliases = {"since": "TraceExportApp.since", "user": "TraceExportApp.user", "output": "TraceExportApp.output"}
    flags = {}

    def start(self):
        pool = self.pool()
        now = time.time()
        try:
            since = parse_since(self.since, now)
        except PlanError as e:
            self.exit_error(str(e))
        me = pool.settings.owner
        admin = _administers(pool)
        if self.user and self.user != me and not admin:
            self.exit_error(f"Another user's activity is theirs to export (and the pool admins'): you are {me}; "
                            "leave out --user to export your own.")
        owner = self.user or (None if admin else me)

        def pages():
            after = None
            while True:
                try:
                    events, after = pool.ledger.trace_export(since=since, until=now, owner=owner, after=after,
                                                             limit=PAGE)
                except PoolError as e:
                    self.exit_error(str(e))
                yield from events
                if after is None:
                    return

        out = open(self.output, "w", encoding="utf-8") if self.output else sys.stdout
        try:
            n = tracefile.write(out, pages(), since=since, until=now, exported=now, users=owner or "all")
        finally:
            if self.output:
                out.close()
        if not pool.settings.trace_recording:
            print("note: recording is off (GPUPool.trace_recording = False): no new activity is recorded",
                  file=sys.stderr)
        start = time.strftime("%Y-%m-%d %H:%M", time.localtime(since)) if since else "the start"
        print(f"exported {n} event(s) of {owner or 'every user'} since {start}"
              + (f" to {self.output}" if self.output else ""), file=sys.stderr)


def _administers(pool) -> bool:
    """Whether the caller may export everyone's trace: the pool service's word, else (a ledger file
    this process opens itself) root or the file's owner."""
    if pool.admin is not None:
        return bool(pool.admin)
    try:
        return os.geteuid() in (0, os.stat(pool.ledger.path).st_uid)
    except OSError:
        return False


class TraceApp(PoolCommand):
    name = "jupyter-gpu-pool-trace"
    description = "The pool's activity trace, for the capacity planner: jupyter gpu-pool trace export [--since 7d]."
    subcommands = {"export": (TraceExportApp, "Write the activity trace as JSON lines (docs/planning.md).")}

    def start(self):
        if self.subapp is None:
            print("Usage: jupyter gpu-pool trace export [--since 7d] [--user NAME] [--output FILE] > trace.jsonl")
            self.exit(2)
        self.subapp.start()


class SimulateApp(PoolCommand):
    name = "jupyter-gpu-pool-simulate"
    description = """Replay a recorded trace (--trace FILE) or a synthetic workload (--synthetic lab|hub) through the
    pool's own allocation and idle policy in virtual time, on --gpus N or a range 1-8, under the admin's configuration
    or others (--config FILE, --compare-policy FILE); report waits, refusals, culls, hibernations, GPU-hours and the
    fewest GPUs meeting --slo-wait.  docs/planning.md"""

    trace = Unicode("", help="A trace written by jupyter gpu-pool trace export.").tag(config=True)
    synthetic = Unicode("", help="A synthetic workload instead of a trace: 'lab', 'hub' or 'week' (a class twice a "
                                 "week and a research group in between).").tag(config=True)
    students = Int(40, help="Synthetic lab: students.").tag(config=True)
    hours = Unicode("3", help="Synthetic lab: its length in hours.").tag(config=True)
    users = Int(500, help="Synthetic hub: users.").tag(config=True)
    days = Unicode("7", help="Synthetic hub and week: days.").tag(config=True)
    researchers = Int(12, help="Synthetic week: the research group's members.").tag(config=True)
    research_profile = Unicode("", help="Synthetic week: the profile the researchers' kernels ask for (default: the "
                                        "configuration's default profile).").tag(config=True)
    research_memory = Unicode("", help="Synthetic week: GPU memory a researcher's kernel holds, a range such as "
                                       "12-18GiB (the default).").tag(config=True)
    class_days = Unicode("tue,thu", help="Synthetic week: the class's days.").tag(config=True)
    class_time = Unicode("10:00-12:00", help="Synthetic week: the class's hours (UTC, as synthetic time is).").tag(
        config=True)
    seed = Int(0, help="Synthetic workloads: the random seed (the same seed, the same workload).").tag(config=True)
    arrive_within = Unicode("", help="Synthetic lab: students arrive within this much of its start (default 10m).").tag(
        config=True)
    think = Unicode("", help="Synthetic workloads: the median pause between two cells (lab 60s, hub 35s).").tag(
        config=True)
    cell = Unicode("", help="Synthetic workloads: the median run time of a cell (lab 5s, hub 10s).").tag(config=True)
    memory = Unicode("", help="Synthetic workloads: GPU memory a kernel holds, a range such as 1-6GiB (the "
                              "default).").tag(config=True)
    retry = Unicode("", help="Synthetic workloads: a refused user tries again this much later (lab 30s, "
                             "hub 60s).").tag(config=True)
    profile = Unicode("", help="Synthetic workloads: the profile every kernel asks for (default: the "
                               "configuration's default profile).").tag(config=True)
    gpus = Unicode("", help="GPU counts to replay on: 4, 1-8 or 1,2,4 (default: the configured pool).").tag(config=True)
    configs = List(Unicode(), help="Configuration files (jupyter_gpu_pool_config.py or .json) to replay under, each "
                                   "over the admin's settings (default: the admin's settings alone).").tag(config=True)
    compare_policy = Unicode("", help="A proposed policy (a JSON list of rules, or a config file setting "
                                      "GPUPool.policy) replayed beside the first configuration.").tag(config=True)
    policies = Unicode("", help="Policies to compare on the same workload, such as start,first-cell,first-cell+hint: "
                                "start (a kernel takes its slice at start), first-cell (at its first cell), "
                                "configured (as each rule's slice_at says), each +hint (the resume hint) or "
                                "not, and +after-cell (every hibernating rule hibernates --after-cell after each "
                                "cell, without a warning) or not; each replayed under the configuration's other "
                                "rules.").tag(config=True)
    after_cell = Unicode("20s", help="With +after-cell: a kernel hibernates this long after each cell ends when no "
                                     "cell started since (the rules' hibernate_after_cell).").tag(config=True)
    hint_lead = Unicode("3s", help="With +hint: how long before the cell that needs a hibernated kernel its user "
                                   "opens the notebook or starts typing (a trace does not record it).").tag(config=True)
    hint_hold = Unicode("60s", help="With +hint: a kernel a hint resumed that runs no cell within this long "
                                    "hibernates again.").tag(config=True)
    slo_wait = Unicode("30s", help="The wait goal: the fewest GPUs whose 95th-percentile wait for a slice is at "
                                   "most this.").tag(config=True)
    queue_timeout = Unicode("", help="Override GPUPool.start_queue_timeout (seconds a start waits in the queue; 0: "
                                     "refused at once).").tag(config=True)
    cull_interval = Unicode("", help="The culling interval of kernels whose culler the trace does not record "
                                     "(default: the trace's, else 30s).").tag(config=True)
    hibernate_cost = Unicode(str(HIBERNATE), help="Hibernation time: fixed seconds, seconds per GiB moved.").tag(
        config=True)
    resume_cost = Unicode(str(RESUME), help="Resume time: fixed seconds, seconds per GiB moved.").tag(config=True)
    as_json = Bool(False, help="Print one JSON object.").tag(config=True)
    decisions = Bool(False, help="With --json: every replay's warnings, actions and refusals.").tag(config=True)
    report = Unicode("", help="Write an HTML report with plots into this directory (needs matplotlib: "
                              "pip install 'jupyter-gpu-pool[plan]').").tag(config=True)
    progress = Bool(None, allow_none=True, help="Show a progress bar on stderr (default: when stderr is a "
                                                "terminal).").tag(config=True)

    aliases = {name.replace("_", "-"): f"SimulateApp.{trait}" for name, trait in (
        ("trace", "trace"), ("synthetic", "synthetic"), ("students", "students"), ("hours", "hours"),
        ("users", "users"), ("days", "days"), ("seed", "seed"), ("profile", "profile"), ("gpus", "gpus"),
        ("researchers", "researchers"), ("research_profile", "research_profile"), ("class_days", "class_days"),
        ("research_memory", "research_memory"),
        ("class_time", "class_time"),
        ("arrive_within", "arrive_within"), ("think", "think"), ("cell", "cell"), ("memory", "memory"),
        ("retry", "retry"),
        ("config", "configs"), ("compare_policy", "compare_policy"), ("slo_wait", "slo_wait"),
        ("policies", "policies"), ("hint_lead", "hint_lead"), ("hint_hold", "hint_hold"),
        ("after_cell", "after_cell"),
        ("queue_timeout", "queue_timeout"), ("cull_interval", "cull_interval"), ("hibernate_cost", "hibernate_cost"),
        ("resume_cost", "resume_cost"), ("report", "report"))}
    flags = {
        "json": ({"SimulateApp": {"as_json": True}}, "Print one JSON object."),
        "decisions": ({"SimulateApp": {"decisions": True}}, "With --json: every replay's decisions and refusals."),
        "progress": ({"SimulateApp": {"progress": True}}, "Show a progress bar on stderr."),
        "no-progress": ({"SimulateApp": {"progress": False}}, "Show no progress bar."),
    }

    def start(self):
        try:
            self._start()
        except PlanError as e:
            self.exit_error(str(e))

    def _start(self):
        if bool(self.trace) == bool(self.synthetic):
            raise PlanError("Give a workload: --trace FILE (from jupyter gpu-pool trace export) or --synthetic lab|hub")
        if self.report:
            _need_matplotlib()
        slo = _seconds(self.slo_wait, "--slo-wait", zero=True)
        costs = Costs(_cost(self.hibernate_cost, "hibernate"), _cost(self.resume_cost, "resume"))
        base = self.settings()
        configs = self._configurations(base)
        for option, name in (("--profile", self.profile), ("--research-profile", self.research_profile)):
            for config in configs if self.synthetic and name else ():
                try:
                    config.profile(name)
                except PlanError as e:
                    raise PlanError(f"{option}: {e}") from None
        workload = self._workload()
        counts = parse_counts(self.gpus) if self.gpus else [None]
        for config in configs if counts == [None] else ():
            if not config.gpus:
                where = "your jupyter_gpu_pool_config.py" if config.name == "current" else "its --config file"
                raise PlanError(f"configuration {config.name!r} has no GPUs to replay on (none was found on this "
                                "machine and GPUPool.inventory declares none): pass --gpus N to plan on N GPUs "
                                f"({DEFAULT_GPU.memory // 2**30} GiB H100s, as none is declared), or declare the "
                                f"inventory in {where}, e.g. c.GPUPool.inventory = [{{'name': 'NVIDIA A100', "
                                "'memory': '80GiB', 'count': 4}]")
        show = self.progress if self.progress is not None else sys.stderr.isatty()
        bar = _Progress(workload, len(configs) * len(counts)) if show else None
        try:
            outcomes = run(workload, configs, counts, costs=costs,
                           keep_decisions=self.decisions or bool(self.report) or bool(self.trace),
                           progress=bar.update if bar else None)
        finally:
            if bar:
                bar.close()
        result = summary(workload, outcomes, slo_wait=slo, costs=costs, decisions=self.decisions)
        if self.policies:
            result["policies"] = rows(outcomes, slo)
        if self.trace and counts == [None] and not self.policies:  # (--policies: no configuration is the record's)
            tally = next(iter(outcomes[0].tallies.values()))
            result["recorded"] = agreement(
                workload.recorded["decisions"], [d.to_dict() for d in tally.decisions], workload.interval,
                refused_recorded=[r for r in workload.recorded["refusals"] if r["what"] == "start"],
                refused_replayed=[{"kernel": k, "reason": r} for _, k, r, w in tally.refused_asks if w == "start"])
        if self.report:
            from .report import write_report

            path = write_report(self.report, result, outcomes, workload, slo)
            print(f"report: {path}", file=sys.stderr)
        if self.as_json:
            print(json.dumps(result, indent=None, separators=(",", ":")))
        else:
            print(render(result))

    # -- inputs --------------------------------------------------------------------------------

    def _configurations(self, base) -> list[Configuration]:
        found = []  # this machine's GPUs, asked of NVML once, whatever the configurations

        def gpus_of(settings, declares: bool):
            """A configuration's own pool: its file's declared GPUs where it declares some (a plan for GPUs
            this machine need not have), else what its settings find, as the pool would."""
            if declares:
                return settings.declared
            try:
                if not found and settings.gpu_discovery != "declared":
                    found.append(discover())
                return build_inventory(settings, found[0] if found else None).gpus
            except Exception as e:  # NVML trouble: plan on the declared or default GPU model
                self.log.warning("GPU discovery failed (%s): planning on the declared GPUs", e)
                return settings.declared

        configs = []
        for path in self.configs or [""]:
            if path:
                extra = _load_file(path).get("GPUPool", {})
                settings = self._settings_with(path, extra)
                declares = "inventory" in extra and "gpu_discovery" not in extra
            else:
                settings, declares = base, False
            name = Path(path).stem if path else "current"
            config = Configuration.of(name, settings, gpus_of(settings, declares))
            if self.queue_timeout:
                config = _replace(config, queue_timeout=_seconds(self.queue_timeout, "--queue-timeout", zero=True))
            configs.append(config)
        if self.compare_policy:
            configs = [configs[0], configs[0].with_policy(Path(self.compare_policy).stem,
                                                          read_policy(self.compare_policy, configs[0]))]
        if self.policies:
            if len(configs) > 1:
                raise PlanError("--policies compares policies under one configuration: leave out --compare-policy "
                                "and give at most one --config")
            hint = Hint(lead=_seconds(self.hint_lead, "--hint-lead", zero=True),
                        hold=_seconds(self.hint_hold, "--hint-hold"))
            after_cell = _seconds(self.after_cell, "--after-cell")
            configs = [variant(configs[0], name, hint, after_cell) for name in parse_policies(self.policies)]
        return configs

    def _settings_with(self, path: str, extra: dict):
        try:
            return load_settings(Config({"GPUPool": {**self.config.get("GPUPool", {}), **extra}}))
        except ConfigError as e:
            raise PlanError(f"--config {path}: {e}") from None

    def _workload(self):
        if self.trace:
            try:
                trace = tracefile.read(tracefile.lines_of(self.trace), name=self.trace)
            except OSError as e:
                raise PlanError(f"--trace {self.trace}: {e.strerror or e}") from None
            interval = _seconds(self.cull_interval, "--cull-interval") if self.cull_interval else None
            return tracefile.to_workload(trace, interval=interval)
        kind = self.synthetic
        profile = self.profile or None
        if kind == "lab":
            hours = _number(self.hours, "--hours")
            if self.students < 1:
                raise PlanError(f"--students must be 1 or more, not {self.students}")
            spec = Lab(students=self.students, hours=hours, profile=profile, seed=self.seed)
            if self.arrive_within:
                spec = _replace(spec, arrive_within=_seconds(self.arrive_within, "--arrive-within", zero=True))
        elif kind == "hub":
            if self.users < 1:
                raise PlanError(f"--users must be 1 or more, not {self.users}")
            spec = Hub(users=self.users, days=_number(self.days, "--days"), profile=profile, seed=self.seed)
        elif kind == "week":
            spec = self._week(profile)
        else:
            raise PlanError(f"--synthetic {kind!r}: the synthetic workloads are 'lab', 'hub' and 'week'")
        return _replace(spec, behaviour=self._behaviour(spec.behaviour),
                        retry=_seconds(self.retry, "--retry") if self.retry else spec.retry).workload()

    def _week(self, profile: str | None) -> Week:
        if self.students < 1 or self.researchers < 0:
            raise PlanError(f"--students must be 1 or more and --researchers 0 or more, not {self.students} and "
                            f"{self.researchers}")
        names = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
        days = [d.strip().lower()[:3] for d in self.class_days.split(",") if d.strip()]
        if not days or any(d not in names for d in days):
            raise PlanError(f"--class-days {self.class_days!r}: write days such as tue,thu")
        begin, _, finish = self.class_time.partition("-")
        try:
            start, end = (int(t.split(":")[0]) + int(t.split(":")[1]) / 60 for t in (begin, finish))
        except (ValueError, IndexError):
            start = end = math.nan
        if not 0 <= start < end <= 24:
            raise PlanError(f"--class-time {self.class_time!r}: write the hours it runs, such as 10:00-12:00")
        week = Week(students=self.students, researchers=self.researchers, days=_number(self.days, "--days"),
                    class_days=tuple(sorted({names.index(d) for d in days})), class_start=start,
                    class_hours=end - start, profile=profile, research_profile=self.research_profile or None,
                    seed=self.seed)
        if self.research_memory:
            low, high = parse_memory_range(self.research_memory)
            week = _replace(week, research=_replace(week.research, memory_min=low, memory_max=high))
        return week

    def _behaviour(self, behaviour):
        changes = {}
        if self.think:
            changes["think_median"] = _seconds(self.think, "--think")
        if self.cell:
            changes["cell_median"] = _seconds(self.cell, "--cell")
        if self.memory:
            changes["memory_min"], changes["memory_max"] = parse_memory_range(self.memory)
        return _replace(behaviour, **changes)


def parse_memory_range(text: str) -> tuple[float, float]:
    """``1-6GiB`` (or ``4GiB``): GiB a synthetic kernel holds, drawn uniformly from the range."""
    low, _, high = text.partition("-")
    try:
        lo = parse_size(low if high else text) if low.strip()[-1:].isalpha() else parse_size(low + "GiB")
        hi = parse_size(high) if high else lo
    except (ValueError, IndexError):
        raise PlanError(f"--memory {text!r}: write a size or a range, such as 4GiB or 1-6GiB") from None
    if lo > hi:
        raise PlanError(f"--memory {text!r}: the range goes from the smaller size to the larger")
    return lo / GiB, hi / GiB


def parse_counts(text: str) -> list[int]:
    """``4``, ``1-8`` or ``1,2,4``: the GPU counts to replay on."""
    counts: list[int] = []
    try:
        for part in text.split(","):
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-"))
                counts += range(lo, hi + 1)
            else:
                counts.append(int(part))
    except ValueError:
        raise PlanError(f"--gpus {text!r}: write a count (4), a range (1-8) or a list (1,2,4)") from None
    if not counts or any(n < 1 for n in counts) or max(counts) > 4096:
        raise PlanError(f"--gpus {text!r}: counts go from 1 to 4096")
    return sorted(set(counts))


def read_policy(path: str, base: Configuration):
    """A proposed policy: a JSON list of rules, or a config file setting GPUPool.policy."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise PlanError(f"--compare-policy {path}: {e.strerror or e}") from None
    rules, dry_run = None, False
    if path.endswith(".json"):
        try:
            loaded = json.loads(text)
        except ValueError as e:
            raise PlanError(f"--compare-policy {path} is not JSON ({e})") from None
        if isinstance(loaded, list):
            rules = loaded
    if rules is None:
        section = _load_file(path).get("GPUPool", {})
        if "policy" not in section:
            raise PlanError(f"--compare-policy {path} sets no GPUPool.policy (write c.GPUPool.policy = [...], or a "
                            "JSON list of rules)")
        rules, dry_run = section["policy"], section.get("policy_dry_run", False)
    try:
        return parse_policy(rules, dry_run=dry_run, profiles=tuple(base.profiles))
    except PolicyError as e:
        raise PlanError(f"--compare-policy {path}: policy{e}" if str(e).startswith("[")
                        else f"--compare-policy {path}: {e}") from None


def _load_file(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise PlanError(f"{path}: no such file")
    loader = PyFileConfigLoader if p.suffix == ".py" else JSONFileConfigLoader
    try:
        return loader(p.name, path=str(p.parent)).load_config()
    except Exception as e:
        raise PlanError(f"cannot read {path}: {e}") from None


def _replace(config: Configuration, **changes) -> Configuration:
    import dataclasses

    return dataclasses.replace(config, **changes)


def _seconds(text: str, option: str, zero: bool = False) -> float:
    try:
        value: str | float = float(text)  # a plain number of seconds, as traitlets' Seconds reads one
    except ValueError:
        value = text
    try:
        return parse_seconds(value, zero_allowed=zero)
    except ValueError as e:
        raise PlanError(f"{option} {text!r}: {e}") from None


def _number(text: str, option: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise PlanError(f"{option} {text!r}: write a number above 0")
    return value


def _cost(text: str, what: str):
    try:
        return parse_cost(text, what)
    except ValueError as e:
        raise PlanError(f"--{what}-cost: {e}") from None


def _need_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlanError("--report draws its plots with matplotlib, which is not installed: pip install "
                        "'jupyter-gpu-pool[plan]' (or leave out --report; --json needs nothing more)") from None


class _Progress:
    """A progress bar over the replays' virtual time (tqdm, on stderr)."""

    def __init__(self, workload, replays: int):
        try:
            from tqdm import tqdm
        except ImportError:
            raise PlanError("the progress bar needs tqdm: pip install 'jupyter-gpu-pool[plan]' (or --no-progress)") \
                from None
        self.start, self.span = workload.start, max(workload.end - workload.start, 1e-9)
        self.bar = tqdm(total=replays * 100, unit="%", file=sys.stderr, desc="replaying",
                        bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining}")
        self.done = 0.0
        self.label = None

    def update(self, label: str, at: float) -> None:
        if label != self.label:
            if self.label is not None:
                self.done += 100
            self.label = label
            self.bar.set_description(label)
        target = self.done + 100 * min(max((at - self.start) / self.span, 0.0), 1.0)
        if target > self.bar.n:
            self.bar.update(target - self.bar.n)

    def close(self) -> None:
        self.bar.close()


def render(result: dict) -> str:
    """The plan as a person reads it in a terminal."""
    w = result["workload"]
    lines = [f"Workload: {w.get('kind')} — {w['sessions']} kernel session(s) over {w['hours']:g} h "
             f"(culling interval {format_duration(w['culling_interval'])})",
             f"Goal: 95% of asks for a slice wait at most {format_duration(result['slo']['wait_seconds'])}", ""]
    for c in result["configurations"]:
        lines.append(f"Configuration {c['name']!r}: " + ", ".join(
            f"{name} {p['slice']} ({p['isolation']})" for name, p in c["profiles"].items()))
        rows, met = tables.results(c)
        lines += _text_table(tables.RESULT_HEADER + ["goal"],
                             [row + ["met" if ok else "-"] for row, ok in zip(rows, met)])
        shared = tables.sharing(c)
        if shared:
            lines += _text_table(tables.SHARING_HEADER, shared)
        lines += [f"  fewest GPUs meeting the goal: {tables.fewest(c)}", ""]
    if "comparison" in result:
        cmp = result["comparison"]
        lines.append(f"{cmp['proposed']!r} against {cmp['base']!r} (proposed minus base):")
        lines += _text_table(tables.COMPARISON_HEADER, tables.comparison(cmp)) + [""]
    if "policies" in result:
        lines.append("Policies compared (figures at each policy's GPUs for the goal):")
        lines += _text_table(tables.POLICY_HEADER, tables.policies(result["policies"])) + [""]
    if "recorded" in result:
        lines.append("Against the record: " + tables.agreement(result["recorded"]))
    return "\n".join(lines).rstrip()


def _text_table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return ["  " + "  ".join(v.rjust(widths[i]) for i, v in enumerate(row)) for row in [header, *rows]]
