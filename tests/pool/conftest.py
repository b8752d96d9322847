import pytest
from ledger_helpers import Clock, gpus

from jupyter_gpu_pool.local import Ledger


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def ledger(tmp_path, clock):
    led = Ledger(tmp_path / "ledger.sqlite", clock=clock, holder_grace=30, launch_grace=120, waiter_ttl=15)
    led.sync_gpus(gpus(40, 40))
    yield led
    led.close()
