"""The operator's work queue (operator/workqueue.py) takes its lanes in order: what finishes work under way
(``first``: a kernel admitted already, whose pod changed), then new work (a kernel to admit), then the
sweep's marks; a key is queued once, in the earliest lane any mark asked, and one marked during its pass
goes back in that lane.  Real asyncio, the real queue, one worker so that the order is the queue's."""

from __future__ import annotations

import asyncio
from typing import Callable


from jupyter_gpu_pool.operator.workqueue import WorkQueue


class Recorder:
    """The work: records the keys in the order they are worked on; ``during`` runs inside a key's pass."""

    def __init__(self):
        self.order: list[str] = []
        self.during: dict[str, Callable[[], object]] = {}
        self.done = asyncio.Event()
        self.expected = 0

    async def __call__(self, key: str) -> None:
        self.order.append(key)
        if key in self.during:
            self.during.pop(key)()
        await asyncio.sleep(0)
        if len(self.order) >= self.expected:
            self.done.set()


async def worked(queue: WorkQueue, recorder: Recorder, expected: int) -> list[str]:
    recorder.expected = expected
    queue.start()
    try:
        await asyncio.wait_for(recorder.done.wait(), 10)
        await asyncio.sleep(0.05)  # nothing more comes
    finally:
        await queue.stop()
    return recorder.order


async def test_finishing_work_goes_before_new_work_and_new_work_before_the_sweep():
    recorder = Recorder()
    queue = WorkQueue(recorder, workers=1)
    for k in ("sweep-1", "sweep-2"):
        queue.add(k, sweep=True)
    for k in ("new-1", "new-2", "new-3"):
        queue.add(k)
    queue.add("running-1", first=True)
    queue.add("running-2", first=True)
    assert await worked(queue, recorder, 7) == ["running-1", "running-2", "new-1", "new-2", "new-3", "sweep-1",
                                                "sweep-2"]


async def test_a_key_is_queued_once_in_the_earliest_lane_any_mark_asked():
    recorder = Recorder()
    queue = WorkQueue(recorder, workers=1)
    queue.add("a", sweep=True)
    queue.add("b")
    queue.add("a")  # moves up from the sweep's lane
    queue.add("c")
    queue.add("c", first=True)  # moves up from new work
    queue.add("c", sweep=True)  # a later lane changes nothing
    queue.add("b")
    assert len(queue) == 3
    assert await worked(queue, recorder, 3) == ["c", "b", "a"]


async def test_a_key_marked_first_during_its_pass_goes_back_before_the_new_work_waiting():
    recorder = Recorder()
    queue = WorkQueue(recorder, workers=1)
    queue.add("starting")
    queue.add("new-1")
    queue.add("new-2")
    recorder.during["starting"] = lambda: (queue.add("starting"), queue.add("starting", first=True))
    assert await worked(queue, recorder, 4) == ["starting", "starting", "new-1", "new-2"]
