"""The API server's errors, answered as ``kind: Status`` bodies like a real server's."""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> dict:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "details": self.details, "code": self.code}


def not_found(plural: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{plural} "{name}" not found', {"name": name, "kind": plural})


def conflict(plural: str, name: str, why: str) -> ApiError:
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {plural} "{name}": {why}',
                    {"name": name, "kind": plural})


def invalid(kind: str, name: str, why: str) -> ApiError:
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {why}', {"name": name, "kind": kind})
