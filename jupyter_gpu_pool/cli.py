"""``jupyter gpu-pool``: see the pool, list profiles, install kernelspecs, start JupyterLab."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time

import jupyter_core.paths
from jupyter_core.application import JupyterApp
from traitlets import Bool, Unicode

from . import __version__
from .config import CONFIG_FILE, DEMO_INVENTORY, DEMO_POLICY, ConfigError, GPUPool, config_files, load_settings
from .devices.nvml import discover
from .local.pool import LocalPool, Pool, build_inventory
from .pools import open_pool
from .pool import PoolError, Snapshot, format_size
from .pool.budgets import Standing
from .pool.reservations import BEFORE, MAKING_ROOM, OPEN, Slot
from .pool.sharing import Sharing
from .pool.units import format_age


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), *(line(r) for r in rows)])


class PoolCommand(JupyterApp):
    """Base of every `jupyter gpu-pool` subcommand (the planner's too): the pool's own config loading,
    uniform errors."""

    classes = [GPUPool]
    version = __version__

    def load_config_file(self, *args, **kwargs):
        """The pool reads its config files itself (config.load_settings), alike for every entry point."""

    def settings(self):
        try:
            return load_settings(self.config)
        except ConfigError as e:
            self.exit_error(f"Bad GPU pool configuration: {e}")

    def pool(self) -> Pool:
        """The pool: through the pool service where one is configured, else this machine's ledger."""
        settings = self.settings()
        try:
            return open_pool(settings)
        except ConfigError as e:
            self.exit_error(f"Bad GPU pool configuration: {e}")
        except PoolError as e:  # the service is not answering, or refused
            self.exit_error(str(e))

    def exit_error(self, message: str):
        print(message, file=sys.stderr)
        self.exit(2)


def render_status(pool: Pool, snap: Snapshot) -> str:
    s = pool.settings
    out = [
        f"GPU pool · {pool.inventory.note}",
        f"{pool.ledger.where} · placement {s.placement} · {len(snap.leases)} lease(s) held",
        "",
    ]
    if not snap.gpus:
        out.append("No GPUs in the pool. Declare some in GPUPool.inventory or run on a machine with a GPU.")
    for usage in snap.gpus:
        g = usage.gpu
        sm = f" · {g.sm_count} SMs" if g.sm_count else ""
        out.append(f"{g.label}  {g.uuid}{sm}")
        out.append(
            f"  used {format_size(usage.memory)} of {format_size(g.memory)} · SM {usage.sm_percent}% of 100%"
            f"{' · exclusive' if usage.exclusive else ''} · {usage.leases} slice(s)"
        )
        leases = snap.leases_on(g.uuid)
        if leases:
            rows = [
                [lease.short_id, lease.owner, lease.kernel_id[:8], lease.profile,
                 "whole" if lease.whole else format_size(lease.memory) +
                 (f" · {lease.sm_percent}%" if lease.sm_percent else ""),
                 lease.isolation, lease.phase or lease.state, format_age(snap.at - lease.created), lease.label or "-"]
                for lease in leases
            ]
            table = _table(rows, ["LEASE", "OWNER", "KERNEL", "PROFILE", "SLICE", "ISOLATION", "STATE", "AGE",
                                  "NOTEBOOK"])
            out.extend("    " + line for line in table.splitlines())
        out.append("")
    unsliced = [lease for lease in snap.leases if lease.awaits_first_cell]
    if unsliced:
        out.append("No GPU yet (each takes its slice when its first cell runs):")
        rows = [[lease.short_id, lease.owner, lease.kernel_id[:8], lease.profile,
                 format_age(snap.at - lease.created), lease.phase or "-", lease.label or "-"] for lease in unsliced]
        out.extend("    " + line for line in _table(
            rows, ["LEASE", "OWNER", "KERNEL", "PROFILE", "AGE", "PHASE", "NOTEBOOK"]).splitlines())
        out.append("")
    hibernated = [lease for lease in snap.leases if not lease.gpus and not lease.awaits_first_cell]
    if hibernated:
        out.append("Hibernated (no GPU held; memory in host RAM):")
        rows = [[lease.short_id, lease.owner, lease.kernel_id[:8], lease.profile, format_size(lease.host_bytes),
                 format_age(snap.at - lease.state_since), lease.phase or "-", lease.label or "-"]
                for lease in hibernated]
        out.extend("    " + line for line in _table(
            rows, ["LEASE", "OWNER", "KERNEL", "PROFILE", "HOST RAM", "FOR", "PHASE", "NOTEBOOK"]).splitlines())
        out.append("")
    out.append(render_queue(snap))
    reservations = render_reservations(s.sharing, snap.at)
    return "\n".join(out + ([f"\n{reservations}"] if reservations else []))


def render_queue(snap: Snapshot) -> str:
    """The queue in the order it is served, with why each waits where it is where sharing orders it."""
    if not snap.waiters:
        return "Queue: empty"
    why = any(w.why for w in snap.waiters)
    rows = [[str(w.position), w.owner, w.kernel_id[:8], w.profile, str(w.slice), "resume" if w.lease_id else "start",
             format_age(snap.at - w.enqueued), *([w.why or "-"] if why else [])] for w in snap.waiters]
    table = _table(rows, ["#", "OWNER", "KERNEL", "PROFILE", "SLICE", "FOR", "WAITING", *(["WHY"] if why else [])])
    return "\n".join(["Queue:", *("    " + line for line in table.splitlines())])


def reservation_phase(slot: Slot, now: float) -> str:
    """Where a reservation stands at ``now``, in words: what it does now and what comes next."""
    r, clock = slot.reservation, slot.reservation.window.clock
    if slot.phase == OPEN:
        borrow = "others may borrow what members leave" if slot.borrowing else \
            f"members first; others may borrow from {clock(slot.start + r.lead, now)}"
        return f"open until {clock(slot.end, now)}: {borrow}"
    if slot.phase == MAKING_ROOM:
        return f"making room: non-members' kernels give it back; opens at {clock(slot.start, now)}"
    if slot.phase == BEFORE:
        return f"next {clock(slot.start, now)}-{clock(slot.end, slot.start)}, making room from " \
               f"{clock(slot.start - r.lead, now)}"
    return f"over (it ended {clock(slot.end, now)})"


def render_reservations(sharing: Sharing, now: float) -> str:
    """The admin's reservations (``GPUPool.reservations``): for whom, when, how much, and each one's phase."""
    slots = sharing.slots(now)
    if not slots:
        return ""
    rows = [[slot.reservation.name, ", ".join([*slot.reservation.groups, *slot.reservation.users]) or "-",
             slot.reservation.window.words(), slot.reservation.amount + (
                 f" on {', '.join(slot.reservation.models)}" if slot.reservation.models else ""),
             slot.phase.replace("_", " "), reservation_phase(slot, now)] for slot in slots]
    table = _table(rows, ["RESERVATION", "FOR", "WINDOW", "ROOM", "PHASE", "NOW"])
    return "\n".join(["Reservations:", *("    " + line for line in table.splitlines())])


def gpu_time(pool: Pool, snap: Snapshot) -> list[tuple[str, Standing]]:
    """Each user's GPU time against their budget, for those the caller may see (an admin: everyone): the
    users holding slices now and those who spent GPU time in the last month."""
    book = pool.settings.budget_book
    if not book.budgets:
        return []
    users = sorted({lease.owner for lease in snap.leases} | set(pool.ledger.spenders(snap.at - 31 * 86400)))
    standings = ((user, pool.ledger.budget_standing(user, pool.groups_of(user), book)) for user in users)
    return [(user, standing) for user, standing in standings if standing is not None]


def render_gpu_time(spent: list[tuple[str, Standing]]) -> str:
    rows = [[user, f"{s.spent:.1f} of {s.limit:g} h this {s.scope.budget.period}" + (" (used up)" if s.exhausted else ""),
             f"{s.scope.name} ({s.scope.kind})", time.strftime("%a %d %b %H:%M", time.localtime(s.period_end))]
            for user, s in spent]
    return "GPU time:\n" + "\n".join("    " + line for line in _table(rows, ["USER", "GPU TIME", "BUDGET", "RESETS"])
                                       .splitlines())


class StatusApp(PoolCommand):
    name = "jupyter-gpu-pool-status"
    description = "Print the pool: each GPU, its slices, the leases (owner, kernel, profile, age) and the queue."
    as_json = Bool(False, help="Print JSON instead of a table.").tag(config=True)
    flags = {"json": ({"StatusApp": {"as_json": True}}, "Print JSON instead of a table.")}

    def start(self):
        pool = self.pool()
        pool.reconcile()
        snap = pool.ledger.snapshot()
        spent = gpu_time(pool, snap)
        if self.as_json:
            print(json.dumps({
                "note": pool.inventory.note,
                "ledger": pool.ledger.path,
                "placement": pool.settings.placement,
                "gpus": [{**u.gpu.to_dict(), "used_memory": u.memory, "used_sm_percent": u.sm_percent,
                          "exclusive": u.exclusive, "slices": u.leases} for u in snap.gpus],
                "leases": [lease.to_dict() for lease in snap.leases],
                "queue": [w.to_dict() for w in snap.waiters],
                "reservations": [slot.listed(snap.at) for slot in pool.settings.sharing.slots(snap.at)],
                "gpu_time": [{"user": user, **standing.to_dict()} for user, standing in spent],
            }, indent=1))
        else:
            print(render_status(pool, snap))
            if spent:
                print("\n" + render_gpu_time(spent))


class ProfilesApp(PoolCommand):
    name = "jupyter-gpu-pool-profiles"
    description = "List the profiles users may pick."

    def start(self):
        s = self.settings()
        rows = [[p.name + (" (default)" if p.name == s.default_profile else ""), p.display_name,
                 p.slice.to_text(), p.isolation, "yes" if p.hibernation_possible else "no", p.description]
                for p in s.profiles.values()]
        print(_table(rows, ["PROFILE", "DISPLAY NAME", "SLICE", "ISOLATION", "HIBERNATE", "DESCRIPTION"]))


class KernelSpecInstallApp(PoolCommand):
    name = "jupyter-gpu-pool-kernelspec-install"
    description = "Install one kernelspec per profile (named <name>-<profile>)."
    user = Bool(False, help="Install for the current user instead of system-wide.").tag(config=True)
    sys_prefix = Bool(False, help="Install into sys.prefix (this environment).").tag(config=True)
    prefix = Unicode("", help="Install under this prefix (share/jupyter/kernels).").tag(config=True)
    kernel_name = Unicode("gpu-pool", help="Name prefix of the kernelspecs.").tag(config=True)
    kubernetes = Bool(False, help="""Kernelspecs of the gpu-pool-kubernetes provisioner: each kernel in a pod of the
        cluster (docs/kubernetes.md); named gpu-pool-kubernetes-<profile> unless --name is given.""").tag(config=True)
    flags = {
        "user": ({"KernelSpecInstallApp": {"user": True}}, "Install for the current user."),
        "sys-prefix": ({"KernelSpecInstallApp": {"sys_prefix": True}}, "Install into sys.prefix."),
        "kubernetes": ({"KernelSpecInstallApp": {"kubernetes": True}}, "Kernels in pods of a Kubernetes cluster."),
    }
    aliases = {"prefix": "KernelSpecInstallApp.prefix", "name": "KernelSpecInstallApp.kernel_name"}

    def start(self):
        s = self.settings()
        prefix = sys.prefix if self.sys_prefix else (self.prefix or None)
        from .kernel_provisioner import kernelspecs

        provisioner, name_prefix = kernelspecs.PROVISIONER, self.kernel_name
        if self.kubernetes:
            from .kernel_provisioner.kubernetes import PROVISIONER as provisioner

            name_prefix = provisioner if "kernel_name" not in self.config.KernelSpecInstallApp else name_prefix
        for name, dest in kernelspecs.install(list(s.profiles.values()), prefix_name=name_prefix,
                                              user=self.user, prefix=prefix, provisioner=provisioner):
            print(f"installed kernelspec {name} in {dest}")


class KernelSpecApp(JupyterApp):
    name = "jupyter-gpu-pool-kernelspec"
    description = "Manage the pool's kernelspecs."
    subcommands = {"install": (KernelSpecInstallApp, KernelSpecInstallApp.description)}

    def start(self):
        if self.subapp is None:
            print("Usage: jupyter gpu-pool kernelspec install [--user|--sys-prefix|--prefix=P] [--name=N]")
            self.exit(2)
        self.subapp.start()


def write_initial_config(directory: str, demo: bool) -> str:
    """Write a starting config an admin can edit; with ``demo``, a declared demo inventory and a short
    idle policy that hibernates."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{CONFIG_FILE}.json")
    from .config import DEFAULT_PROFILES, STARTING_POLICY

    body: dict = {"GPUPool": {"profiles": DEFAULT_PROFILES, "policy": STARTING_POLICY}}
    if demo:
        body["GPUPool"]["inventory"] = DEMO_INVENTORY
        body["GPUPool"]["policy"] = DEMO_POLICY
    with open(path, "w") as f:
        json.dump(body, f, indent=2)
    return path


class InitApp(PoolCommand):
    name = "jupyter-gpu-pool-init"
    description = "Write a starting jupyter_gpu_pool_config.json (with a demo inventory where no GPU is found)."
    directory = Unicode("", help="Directory for the config file (default: this environment's etc/jupyter).") \
        .tag(config=True)
    force = Bool(False, help="Overwrite an existing config file.").tag(config=True)
    aliases = {"dir": "InitApp.directory"}
    flags = {"force": ({"InitApp": {"force": True}}, "Overwrite an existing config file.")}

    def start(self):
        directory = self.directory or jupyter_core.paths.ENV_CONFIG_PATH[0]
        target = os.path.join(directory, f"{CONFIG_FILE}.json")
        if os.path.exists(target) and not self.force:
            self.exit_error(f"{target} exists; edit it, or pass --force to replace it")
        found = discover()
        path = write_initial_config(directory, demo=not found.gpus)
        print(f"wrote {path}")
        print(found.summary + ("" if found.gpus else "; the config declares a demo inventory (not real GPUs)"))


class PoolLabApp(PoolCommand):
    name = "jupyter-gpu-pool-lab"
    description = """Set up the pool on this machine and start JupyterLab: writes a config if there is
    none (a declared demo inventory where no GPU is found), installs a kernelspec per profile into this
    environment, then runs `jupyter lab` with every other argument (e.g. --port=8899 --no-browser), its
    terminals with this environment's bin first on PATH."""

    config_dir = Unicode("", help="Where to write the pool's config (default: this environment's etc/jupyter).")
    user_kernelspecs = Bool(False, help="Install the kernelspecs for the user instead of into this environment.")

    def parse_command_line(self, argv=None):
        """Take our two options; pass every other argument to `jupyter lab` untouched."""
        argv = list(sys.argv[1:] if argv is None else argv)
        rest = []
        for arg in argv:
            if arg.startswith("--pool-config-dir="):
                self.config_dir = arg.split("=", 1)[1]
            elif arg == "--user-kernelspecs":
                self.user_kernelspecs = True
            elif arg in ("-h", "--help", "--help-all"):
                print(self.description)
                print("Options: --pool-config-dir=DIR  --user-kernelspecs  (all others go to jupyter lab)")
                self.exit(0)
            else:
                rest.append(arg)
        self.extra_args = rest

    def start(self):
        config_dir = self.config_dir or jupyter_core.paths.ENV_CONFIG_PATH[0]
        config_path = os.path.join(config_dir, f"{CONFIG_FILE}.json")
        banner = []
        if not config_files():
            found = discover()
            write_initial_config(config_dir, demo=not found.gpus)
            banner.append(f"No GPU pool config found: wrote {config_path} (edit it to set profiles and quotas).")
        settings = self.settings()
        inventory = build_inventory(settings)
        if not inventory.gpus and not settings.declared:
            body = json.load(open(config_path)) if os.path.exists(config_path) else {}
            body.setdefault("GPUPool", {})["inventory"] = DEMO_INVENTORY
            os.makedirs(config_dir, exist_ok=True)
            with open(config_path, "w") as f:
                json.dump(body, f, indent=2)
            banner.append(f"No GPU found and none declared: added a declared demo inventory to {config_path}.")
            settings = self.settings()
            inventory = build_inventory(settings)
        pool = self.pool()
        if inventory.declared:
            banner.append("*** NO GPU DETECTED: the pool runs on a DECLARED DEMO INVENTORY. Its GPUs are not "
                          "real; kernels get slices in the ledger but no GPU memory. ***")
        from .kernel_provisioner import kernelspecs

        prefix = None if self.user_kernelspecs else sys.prefix
        wanted = {kernelspecs.kernelspec_name("gpu-pool", p) for p in settings.profiles.values()}
        for name, info in kernelspecs.installed_pool_kernelspecs().items():
            stale = name.startswith("gpu-pool-") and name not in wanted
            if stale and (self.user_kernelspecs or info["resource_dir"].startswith(sys.prefix)):
                kernelspecs.remove(name)
        installed = kernelspecs.install(list(settings.profiles.values()), prefix=prefix, user=self.user_kernelspecs)
        banner.append(f"GPU pool: {inventory.note}.")
        banner.append("Profiles: " + ", ".join(f"{p.name} ({p.slice}, {p.isolation})"
                                               for p in settings.profiles.values()))
        banner.append(f"Kernelspecs: {', '.join(n for n, _ in installed)}. Pool status: jupyter gpu-pool status")
        pool.reconcile()
        rule = "=" * min(max(len(line) for line in banner), 100)
        print("\n".join([rule, *banner, rule]), flush=True)
        jupyter = shutil.which("jupyter", path=os.path.dirname(sys.executable)) or "jupyter"
        os.execv(jupyter, [jupyter, "lab", *self.extra_args, *self.terminals_in_this_environment()])

    def terminals_in_this_environment(self) -> list[str]:
        """Let the lab's terminals find this environment's commands first (`jupyter gpu-pool status`): its
        bin goes first on PATH (scripts/lab runs .venv/bin/jupyter without activating the environment), and
        the terminals are interactive shells, not login shells, whose profile would set PATH afresh (what
        jupyter_server_terminals starts where the server's output is not a terminal).  An admin's own
        ``terminado_settings`` on the command line wins."""
        bin_dir = os.path.dirname(sys.executable)
        rest = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != bin_dir]
        os.environ["PATH"] = os.pathsep.join([bin_dir, *rest])
        if any("terminado_settings" in arg for arg in self.extra_args):
            return []
        shell = os.environ.get("SHELL") or shutil.which("sh") or "/bin/sh"
        return [f"--ServerApp.terminado_settings=shell_command={shlex.quote(shell)}"]


class ReconcileApp(PoolCommand):
    name = "jupyter-gpu-pool-reconcile"
    description = "Release every lease whose kernel and server are gone."

    def start(self):
        pool = self.pool()
        reclaimed = pool.reconcile()
        for lease in reclaimed:
            print(f"reclaimed lease {lease.short_id} of {lease.owner} (kernel {lease.kernel_id[:8]}): {lease.reason}")
        print(f"{len(reclaimed)} lease(s) reclaimed")


class MPSApp(PoolCommand):
    name = "jupyter-gpu-pool-mps"
    description = "The pool's MPS control daemons, one per GPU: jupyter gpu-pool mps [status|start|stop]."

    def start(self):
        from .devices.mps import MPSUnavailable

        action = self.extra_args[0] if self.extra_args else "status"
        if action not in ("status", "start", "stop"):
            self.exit_error(f"unknown action {action!r}: use status, start or stop")
        pool = self.pool()
        if not isinstance(pool, LocalPool):
            self.exit_error(f"The pool service ({pool.ledger.where}) runs this machine's MPS daemons; its admin sees "
                            "them with: systemctl status jupyter-gpu-pool")
        try:
            for gpu in pool.gpus:
                daemon = pool.mps_daemon(gpu.uuid)
                if action == "start":
                    done = "started" if daemon.start() else "already running"
                elif action == "stop":
                    done = "stopped" if daemon.stop() else "not running"
                else:
                    done = "running" if daemon.running() else "not running"
                print(f"{gpu.label}: {done} ({daemon.pipe_directory})")
        except MPSUnavailable as e:
            self.exit_error(str(e))


class ReleaseApp(PoolCommand):
    name = "jupyter-gpu-pool-release"
    description = """Give a kernel's GPU slice back now: jupyter gpu-pool release KERNEL_ID (the id, or its first
    characters as status shows them).  Your own kernels only; admins: any.  The kernel process itself keeps
    running until its server shuts it down."""

    def start(self):
        if len(self.extra_args) != 1:
            self.exit_error("Usage: jupyter gpu-pool release KERNEL_ID")
        wanted = self.extra_args[0].strip()
        pool = self.pool()
        try:
            mine = [lease for lease in pool.ledger.leases() if lease.kernel_id.startswith(wanted) and wanted]
            if len(mine) > 1:
                self.exit_error(f"{wanted!r} names {len(mine)} kernels; give more of the kernel id")
            if not mine:
                self.exit_error(f"No GPU kernel {wanted!r} holds a slice that you may release (it ended, it is not a "
                                "GPU pool kernel, or it is not yours).")
            [lease] = mine
            if lease.owner != pool.settings.owner and not pool.admin:
                self.exit_error(f"Kernel {lease.kernel_id} is {lease.owner}'s, not yours: you can release your own "
                                "kernels only (admins: any).")
            released = pool.ledger.release(lease.id, "released from the command line")
        except PoolError as e:
            self.exit_error(str(e))
        if released is None:
            print(f"kernel {lease.kernel_id[:8]}'s slice was released already")
        else:
            print(f"released the {lease.profile} slice of kernel {lease.kernel_id[:8]} ({lease.owner}); its process "
                  "keeps running until its server shuts it down")


class GPUPoolApp(JupyterApp):
    name = "jupyter-gpu-pool"
    version = __version__
    description = "Elastic GPU kernels for Jupyter: the pool on this machine."
    subcommands = {
        "status": (StatusApp, StatusApp.description),
        "profiles": (ProfilesApp, ProfilesApp.description),
        "kernelspec": (KernelSpecApp, KernelSpecApp.description),
        "init": (InitApp, InitApp.description),
        "lab": (PoolLabApp, PoolLabApp.description),
        "reconcile": (ReconcileApp, ReconcileApp.description),
        "mps": (MPSApp, MPSApp.description),
        "release": (ReleaseApp, ReleaseApp.description.split(":")[0] + "."),
        "serve": ("jupyter_gpu_pool.service.app.ServeApp", "Run the GPU pool service (a machine several users share)."),
        "trace": ("jupyter_gpu_pool.planning.cli.TraceApp", "The activity trace the capacity planner replays (export)."),
        "simulate": ("jupyter_gpu_pool.planning.cli.SimulateApp", "Plan capacity: replay a trace or a synthetic lab."),
    }

    def start(self):
        if self.subapp is None:
            print(f"{self.description}\n\nSubcommands:")
            for name, (_, help_text) in self.subcommands.items():
                print(f"  {name:<12} {help_text.splitlines()[0]}")
            self.exit(2)
        self.subapp.start()


main = launch_new_instance = GPUPoolApp.launch_instance

if __name__ == "__main__":
    main()

