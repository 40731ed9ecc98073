"""An earlier run of bench/pages.py or bench/report.py against this one: p95 per URL and way.

A run's result is the last line of its output that parses as a JSON object, so a file holding its stdout (or
stdout and stderr together) will do. The timing tables of both benchmarks are known, those of earlier versions
included: "pages" (full pages), "fragments" (htmx), "json" (`Accept: application/json`) and "reports"; each maps
a URL (a report: "window grouping format") to its figures. An entry counts as slower when its p95 rose by more
than 10 % and more than 5 ms, and its status is what it was.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness import BenchError, log

WAYS = {"pages": "page", "fragments": "fragment", "json": "json", "reports": "report"}
"""Timing table of a result -> the way its entries were asked for."""
SLOWER_RATIO = 1.10
SLOWER_MS = 5.0


def last_json(path: Path) -> dict[str, Any]:
    """The last line of `path` that parses as a JSON object."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        raise BenchError(f"cannot read {path}: {exc}") from exc
    for line in reversed(lines):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict):
            return found
    raise BenchError(f"{path} holds no result line (a JSON object)")


def _p95s(result: dict[str, Any]) -> dict[tuple[str, str], tuple[float, int | None]]:
    """(url, way) -> (p95 ms, status) of every timing in a result."""
    out: dict[tuple[str, str], tuple[float, int | None]] = {}
    for table, way in WAYS.items():
        entries = result.get(table)
        if not isinstance(entries, dict):
            continue
        for url, figures in entries.items():
            p95 = figures.get("p95_ms") if isinstance(figures, dict) else None
            if isinstance(p95, int | float) and math.isfinite(p95):
                status = figures.get("status")
                out[(str(url), way)] = (float(p95), status if isinstance(status, int) else None)
    return out


@dataclass(frozen=True)
class Change:
    """One URL asked for one way, in both runs."""

    url: str
    way: str
    old_p95_ms: float
    new_p95_ms: float
    old_status: int | None
    new_status: int | None

    @property
    def ratio(self) -> float | None:
        """New p95 / old p95."""
        return round(self.new_p95_ms / self.old_p95_ms, 3) if self.old_p95_ms > 0 else None

    @property
    def slower(self) -> bool:
        rose = self.new_p95_ms - self.old_p95_ms
        return (
            self.old_status == self.new_status and rose > SLOWER_MS and self.new_p95_ms > self.old_p95_ms * SLOWER_RATIO
        )


def changes(old: dict[str, Any], new: dict[str, Any]) -> list[Change]:
    """Every URL and way timed in both results, in the new result's order."""
    before = _p95s(old)
    return [
        Change(url, way, before[(url, way)][0], p95, before[(url, way)][1], status)
        for (url, way), (p95, status) in _p95s(new).items()
        if (url, way) in before
    ]


def table(found: list[Change]) -> str:
    """The changes as a text table, slower ones and changed statuses marked."""
    if not found:
        return "nothing timed in both runs"
    width = max(len("url"), *(len(c.url) for c in found))
    lines = [f"{'url':<{width}}  {'way':<8}  {'old p95 ms':>10}  {'new p95 ms':>10}  {'ratio':>6}"]
    for c in found:
        ratio = f"{c.ratio:.2f}" if c.ratio is not None else "-"
        line = f"{c.url:<{width}}  {c.way:<8}  {c.old_p95_ms:>10.2f}  {c.new_p95_ms:>10.2f}  {ratio:>6}"
        if c.old_status != c.new_status:
            line += f"  status {c.old_status} -> {c.new_status}"
        elif c.slower:
            line += "  slower"
        lines.append(line)
    return "\n".join(lines)


def summary(found: list[Change], against: Path) -> dict[str, Any]:
    """The result line's "compare": the earlier run, how many entries were compared, the URLs that got slower
    (each once, whatever way) and the slower entries' figures."""
    slower = [c for c in found if c.slower]
    return {
        "against": str(against),
        "compared": len(found),
        "slower": list(dict.fromkeys(c.url for c in slower)),
        "slower_ways": [
            {"url": c.url, "way": c.way, "old_p95_ms": c.old_p95_ms, "new_p95_ms": c.new_p95_ms, "ratio": c.ratio}
            for c in slower
        ],
    }


def against(path: Path, old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Print the table of `new` against `old` (read from `path`) to stderr; return the result line's "compare"."""
    found = changes(old, new)
    log(f"p95 against {path}:")
    print(table(found), file=sys.stderr, flush=True)
    result = summary(found, path)
    if result["slower"]:
        log(f"slower than before: {', '.join(result['slower'])}")
    return result
