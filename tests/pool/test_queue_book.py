"""``local.waiting`` declares what it needs of a lease store's queue (``QueueBook``); every store it is
handed (the SQLite ledger, the pool service's proxy, both ``LeaseStore``s) keeps those methods with
the same signatures."""

import inspect
import re

import pytest

from jupyter_gpu_pool.local.ledger import Ledger
from jupyter_gpu_pool.local.store import LeaseStore
from jupyter_gpu_pool.local.waiting import QueueBook
from jupyter_gpu_pool.service.client import ServiceLedger

NEEDED = ("enqueue", "heartbeat", "dequeue")


def test_the_queue_book_declares_what_waiting_calls():
    source = inspect.getsource(inspect.getmodule(QueueBook))
    assert set(re.findall(r"\bledger\.(\w+)", source)) == set(NEEDED)
    assert {n for n in vars(QueueBook) if not n.startswith("_")} == set(NEEDED)


@pytest.mark.parametrize("store", [LeaseStore, Ledger, ServiceLedger])
@pytest.mark.parametrize("name", NEEDED)
def test_every_lease_store_keeps_the_queue_book(store, name):
    assert issubclass(store, LeaseStore)
    wanted = inspect.signature(getattr(QueueBook, name))
    kept = inspect.signature(getattr(store, name))
    assert list(kept.parameters) == list(wanted.parameters)
