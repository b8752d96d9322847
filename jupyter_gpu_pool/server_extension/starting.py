"""Kernels no client has talked to yet, which jupyter_server calls "starting" for ever.

jupyter_server's ``execution_state`` stays ``starting`` until a status message comes on the kernel's
IOPub after it started watching it, and a kernel publishes one only in answer to a request: JupyterLab's
websocket asks for ``kernel_info`` as it connects.  A GPU kernel started over the REST API with no
browser attached (a script, a hub's API) would show "starting" on its card until someone opened it.
:class:`StartingKernels` asks each such kernel once for its ``kernel_info``, as a browser's connection
would: its status in answer moves jupyter_server's ``execution_state`` on (to idle), and the card, the
REST API and the culler all read the truth.
"""

from __future__ import annotations

import asyncio
import logging
import time

from jupyter_client.asynchronous import AsyncKernelClient

from ..kernel_provisioner.base import PoolKernelProvisioner

log = logging.getLogger(__name__)

ASK_AGAIN = 30.0  # seconds before a kernel that did not answer is asked again


class StartingKernels:
    def __init__(self, kernel_manager, clock=time.monotonic):
        self.km = kernel_manager
        self.clock = clock
        self._asked: dict[str, tuple[float, asyncio.Task]] = {}  # kernel id -> (when asked, the ask)

    def ask(self) -> None:
        """Ask every pool kernel of this server still "starting" (launched: its manager is ready) for its
        ``kernel_info``, once (again after ``ASK_AGAIN`` where it did not answer).  Nothing waits for the
        answers: the next read (the UI polls every few seconds) finds the kernel's own state."""
        now = self.clock()
        for kid in list(self.km.list_kernel_ids()):
            try:
                kernel = self.km.get_kernel(kid)
            except KeyError:  # shut down meanwhile
                continue
            if (kernel.execution_state != "starting" or not kernel.ready.done()
                    or not isinstance(kernel.provisioner, PoolKernelProvisioner)):
                continue
            found = self._asked.get(kid)
            if found is None or (found[1].done() and now - found[0] >= ASK_AGAIN):
                self._asked[kid] = (now, asyncio.ensure_future(self._ask(kid, kernel, ASK_AGAIN)))
        for kid in set(self._asked) - set(self.km.list_kernel_ids()):
            self._asked.pop(kid)[1].cancel()

    async def stop(self) -> None:
        """The server stops: no ask outlives it."""
        for _when, task in self._asked.values():
            task.cancel()
        await asyncio.gather(*(task for _when, task in self._asked.values()), return_exceptions=True)
        self._asked.clear()

    @staticmethod
    async def _ask(kid: str, kernel, timeout: float) -> None:
        # an asyncio client of its own (the server's kernel manager makes IOLoop clients, which only call back)
        client = AsyncKernelClient(**kernel.get_connection_info(session=True))
        client.start_channels(shell=True, iopub=False, stdin=False, hb=False, control=False)
        try:
            client.kernel_info()
            await client.get_shell_msg(timeout=timeout)  # its status on IOPub reaches jupyter_server's watcher
        except Exception as e:  # no answer (yet): it shows "starting", which is then the truth
            log.info("GPU pool: kernel %s did not answer its first kernel_info request: %r", kid, e)
        finally:
            client.stop_channels()
