"""Running a cell in a real kernel for the benchmarks, as a frontend does (``execute_request``)."""

from __future__ import annotations


async def run(km, code: str, timeout: float = 1800) -> str:
    """Execute ``code`` in the kernel; return its stdout (raise with the traceback on error)."""
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=300)
        out: list[str] = []

        def hook(msg):
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                out.append("\n".join(msg["content"]["traceback"]))

        reply = await kc.execute_interactive(code, output_hook=hook, timeout=timeout)
        if reply["content"]["status"] != "ok":
            raise RuntimeError("".join(out))
        return "".join(out)
    finally:
        kc.stop_channels()
