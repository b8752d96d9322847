"""Helpers for the pool tests (a module of its own: every conftest.py is named conftest)."""

from jupyter_gpu_pool.pool import GPU, Holder, LeaseRequest, build_quota_book, parse_profile

GiB = 2**30


class Clock:
    """The ledger takes its time from a callable: tests move it by hand."""

    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def gpus(*sizes_gib, name="Test GPU"):
    return [GPU(uuid=f"GPU-{i}", name=name, memory=s * GiB, index=i, source="declared") for i, s in enumerate(sizes_gib)]


NO_QUOTA = build_quota_book({}, {}, {}, {})


def request(owner="alice", slice_text="10GiB", kernel=None, groups=(), manager=None, label=""):
    profile = parse_profile(f"p-{slice_text.replace(',', '-').replace('%', '').replace(' ', '').lower()}", slice_text)
    request.counter += 1
    return LeaseRequest(owner=owner, kernel_id=kernel or f"k{request.counter}", profile=profile,
                        groups=tuple(groups), label=label, manager=manager or Holder(100, 1.0, "here"))


request.counter = 0
