import pytest
from jupyter_client.manager import AsyncKernelManager


@pytest.fixture
async def managers():
    """Kernel managers a test starts; shut down whatever is left at the end."""
    started: list[AsyncKernelManager] = []

    def make(kernel_name: str, **kwargs) -> AsyncKernelManager:
        km = AsyncKernelManager(kernel_name=kernel_name, **kwargs)
        started.append(km)
        return km

    yield make
    for km in started:
        if km.has_kernel:
            await km.shutdown_kernel(now=True)
