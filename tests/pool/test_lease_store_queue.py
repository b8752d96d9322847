"""``local.waiting`` takes any ``LeaseStore``: what it calls of the store's queue is declared there, and
every store it is handed (the SQLite ledger, the pool service's proxy) keeps those methods with the same
signatures."""

import inspect
import re

import pytest

from jupyter_gpu_pool.local import waiting
from jupyter_gpu_pool.local.ledger import Ledger
from jupyter_gpu_pool.local.store import LeaseStore
from jupyter_gpu_pool.service.client import ServiceLedger

NEEDED = ("enqueue", "heartbeat", "dequeue")


def test_waiting_calls_only_the_queue_methods_the_lease_store_declares():
    called = set(re.findall(r"\bledger\.(\w+)", inspect.getsource(waiting)))
    assert called == set(NEEDED)
    assert all(name in LeaseStore.__abstractmethods__ for name in called)


@pytest.mark.parametrize("store", [Ledger, ServiceLedger])
@pytest.mark.parametrize("name", NEEDED)
def test_every_lease_store_keeps_the_queue_methods_as_declared(store, name):
    assert issubclass(store, LeaseStore)
    wanted = inspect.signature(getattr(LeaseStore, name))
    kept = inspect.signature(getattr(store, name))
    assert list(kept.parameters) == list(wanted.parameters)
