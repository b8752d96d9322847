"""The pool's jupyter_events: one schema, ``kernel-action`` (see docs/api.md).

Emitted on the server's event bus, so the JupyterLab extension receives them
through ``/api/events/subscribe`` and any configured event handler (a log
file, say) records them.
"""

from __future__ import annotations

from pathlib import Path

SCHEMA_ID = "https://jupyter-gpu-pool.readthedocs.io/events/kernel-action"
SCHEMA_VERSION = "1"
SCHEMA_PATH = Path(__file__).parent / "event_schemas" / "kernel-action.yaml"


def register(event_logger) -> None:
    if SCHEMA_ID not in event_logger.schemas:
        event_logger.register_event_schema(SCHEMA_PATH)


def kernel_action(action: str, *, kernel_id: str, user: str, reason: str, message: str, profile: str | None = None,
                  deadline: float | None = None, dry_run: bool = False, duration: float | None = None,
                  bytes: int | None = None, declared: bool = False) -> dict:
    """The event's data, with only the fields that apply."""
    data: dict = {"action": action, "kernel_id": kernel_id, "user": user, "reason": reason, "message": message,
                  "dry_run": dry_run}
    if profile:
        data["profile"] = profile
    if deadline is not None:
        data["deadline"] = deadline
    if duration is not None:
        data["duration"] = duration
    if bytes is not None:
        data["bytes"] = bytes
    if declared:
        data["declared"] = True
    return data


def emit(event_logger, data: dict) -> None:
    if event_logger is not None:
        event_logger.emit(schema_id=SCHEMA_ID, data=data)
