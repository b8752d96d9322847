"""A stateful property test: random starts, stops, crashes, restarts, hibernations and
resumes against the ledger, checked step by step against an independent model of
what must fit where and who holds what."""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from ledger_helpers import GiB, gpus, request
from jupyter_gpu_pool.local import Ledger
from jupyter_gpu_pool.pool import ACTIVE, HIBERNATED, Holder, PoolExhausted, QuotaExceeded, build_quota_book
from jupyter_gpu_pool.pool.errors import MPSUserBusy

SLICES = ["4GiB", "10GiB", "10GiB,25%", "20GiB,50%", "24GiB", "whole"]
OWNERS = ["ann", "ben", "cat"]
SIZES = [40, 40, 24]
QUOTAS = build_quota_book({"cat": {"memory": "30GiB"}}, {}, {"kernels": 3}, {})
QUOTA_MEMORY = {"cat": 30 * GiB}


class Clock:
    now = 1_000_000.0

    def __call__(self):
        return self.now


class LedgerMachine(RuleBasedStateMachine):
    leases = Bundle("leases")

    def __init__(self):
        super().__init__()
        import tempfile

        self.dir = tempfile.TemporaryDirectory()
        self.clock = Clock()
        self.ledger = Ledger(f"{self.dir.name}/l.sqlite", clock=self.clock, holder_grace=5, launch_grace=60)
        self.ledger.sync_gpus(gpus(*SIZES))
        self.capacity = {f"GPU-{i}": s * GiB for i, s in enumerate(SIZES)}
        self.model: dict[str, dict] = {}  # lease id -> {owner, slice, gpus, state, pid}
        self.alive: set[int] = {1}  # pid 1 is the server; kernels get pids from 100
        self.next_pid = 100

    def teardown(self):
        self.ledger.close()
        self.dir.cleanup()

    # -- the model ---------------------------------------------------------------------------

    def _used(self):
        mem = {u: 0 for u in self.capacity}
        sm = {u: 0 for u in self.capacity}
        whole = {u: False for u in self.capacity}
        count = {u: 0 for u in self.capacity}
        for m in self.model.values():
            if m["state"] != ACTIVE:
                continue
            for g in m["gpus"]:
                spec = m["spec"]
                mem[g] += self.capacity[g] if spec.whole else spec.memory
                sm[g] += spec.sm_on()
                whole[g] |= spec.whole
                count[g] += 1
        return mem, sm, whole, count

    def _mps_others(self, owner):
        """GPUs that serve another owner's MPS slices (an SM share means MPS in these profiles)."""
        return {g for m in self.model.values() if m["state"] == ACTIVE and m["owner"] != owner
                and m["spec"].sm_percent is not None for g in m["gpus"]}

    def _fits_somewhere(self, spec, owner=None):
        """Room for the slice on some GPU; with ``owner``, an MPS slice only where no other owner's MPS runs."""
        mem, sm, whole, count = self._used()
        busy = self._mps_others(owner) if owner is not None and spec.sm_percent is not None else set()
        for g, cap in self.capacity.items():
            if whole[g] or g in busy:
                continue
            if spec.whole and count[g] == 0:
                return True
            if not spec.whole and mem[g] + spec.memory <= cap and sm[g] + spec.sm_on() <= 100:
                return True
        return False

    def _quota_allows(self, owner, spec, new_kernel):
        mine = [m for m in self.model.values() if m["owner"] == owner]
        # a user's own quota entry replaces the default one (cat's has no kernel limit)
        if new_kernel and owner not in QUOTA_MEMORY and len(mine) + 1 > 3:
            return False
        if owner in QUOTA_MEMORY:
            used = sum(self.capacity[g] if m["spec"].whole else m["spec"].memory
                       for m in mine if m["state"] == ACTIVE for g in m["gpus"])
            if spec.whole:  # binpack puts a whole-GPU request on the smallest empty GPU
                _, _, _, count = self._used()
                empty = [cap for g, cap in self.capacity.items() if count[g] == 0]
                asked = min(empty) if empty else max(self.capacity.values())
            else:
                asked = spec.memory
            return used + asked <= QUOTA_MEMORY[owner]
        return True

    # -- rules ---------------------------------------------------------------------------------

    @rule(target=leases, owner=st.sampled_from(OWNERS), slice_text=st.sampled_from(SLICES))
    def start(self, owner, slice_text):
        req = request(owner=owner, slice_text=slice_text, manager=Holder(1, 1.0))
        spec = req.profile.slice
        quota_ok = self._quota_allows(owner, spec, new_kernel=True)
        room, fits = self._fits_somewhere(spec), self._fits_somewhere(spec, owner)
        try:
            lease = self.ledger.allocate(req, QUOTAS)
        except QuotaExceeded:
            assert not quota_ok
            return None
        except PoolExhausted:
            assert quota_ok and not room
            return None
        except MPSUserBusy:
            assert quota_ok and room and not fits  # room only where another user's MPS server runs
            return None
        assert quota_ok and fits, "granted a slice the model says cannot be had"
        assert not set(lease.gpus) & (self._mps_others(owner) if spec.sm_percent is not None else set())
        pid = self.next_pid = self.next_pid + 1
        self.alive.add(pid)
        self.ledger.set_holder(lease.id, Holder(pid, float(pid)))
        self.model[lease.id] = {"owner": owner, "spec": spec, "gpus": lease.gpus, "state": ACTIVE, "pid": pid}
        return lease.id

    @rule(lease_id=consumes(leases))
    def stop(self, lease_id):
        if lease_id is None or lease_id not in self.model:
            return
        self.ledger.release(lease_id)
        del self.model[lease_id]

    @rule(lease_id=leases)
    def crash(self, lease_id):
        """kill -9 of the kernel: after the grace, reconcile must take the slice back."""
        if lease_id is None or lease_id not in self.model:
            return
        self.alive.discard(self.model[lease_id]["pid"])
        self.clock.now += 6
        is_alive = lambda pid, start: pid in self.alive  # noqa: E731
        reclaimed = {r.id for r in self.ledger.reconcile(is_alive)}
        assert lease_id in reclaimed
        for rid in reclaimed:
            self.model.pop(rid, None)

    @rule(lease_id=leases)
    def hibernate(self, lease_id):
        m = self.model.get(lease_id) if lease_id else None
        if not m or m["state"] != ACTIVE:
            return
        self.ledger.hibernate(lease_id, host_bytes=GiB)
        m["state"], m["gpus"] = HIBERNATED, ()

    @rule(lease_id=leases)
    def resume(self, lease_id):
        m = self.model.get(lease_id) if lease_id else None
        if not m or m["state"] != HIBERNATED:
            return
        quota_ok = self._quota_allows(m["owner"], m["spec"], new_kernel=False)
        room, fits = self._fits_somewhere(m["spec"]), self._fits_somewhere(m["spec"], m["owner"])
        try:
            lease = self.ledger.resume(lease_id, QUOTAS, same_model=False)
        except QuotaExceeded:
            assert not quota_ok
            return
        except PoolExhausted:
            assert quota_ok and not room
            return
        except MPSUserBusy:
            assert quota_ok and room and not fits
            return
        assert quota_ok and fits
        m["state"], m["gpus"] = ACTIVE, lease.gpus

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def never_overcommitted(self):
        assert self.ledger.overcommitted() == []

    @invariant()
    def the_ledger_holds_exactly_what_the_model_holds(self):
        held = {lease.id: lease for lease in self.ledger.leases()}
        assert set(held) == set(self.model)
        for lease_id, m in self.model.items():
            assert held[lease_id].state == m["state"]
            assert held[lease_id].gpus == tuple(sorted(m["gpus"]))


LedgerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestLedgerStateMachine = LedgerMachine.TestCase
