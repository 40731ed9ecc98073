"""Errors that become a clear 4xx answer: `{"error": "...", "detail": [{"field": ..., "message": ...}]}`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FieldProblem:
    field: str
    message: str


@dataclass
class ApiError(Exception):
    status_code: int
    error: str
    detail: list[FieldProblem] = field(default_factory=list)
    headers: dict[str, str] | None = None

    def __str__(self) -> str:
        parts = [f"{p.field}: {p.message}" for p in self.detail]
        return self.error + (" (" + "; ".join(parts) + ")" if parts else "")

    def body(self) -> dict[str, object]:
        return {"error": self.error, "detail": [{"field": p.field, "message": p.message} for p in self.detail]}
