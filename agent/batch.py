"""Intervals become batches in the server's wire format (`docs/ingest-protocol.md`, schema version 1).

The open batch lives in the journal, so it survives a crash. It is sealed into the spool when it holds
`batch_intervals` intervals, when the hardware layout or the host identity changes (every sample of a batch
must name a device of that batch's layout), when an urgent event such as a spot interruption notice
arrives, and when the agent stops.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from . import __version__
from .collect.model import GpuInfo, Interval
from .spool import Journal, Spool, SpooledBatch, gzip_json, new_batch_id

log = logging.getLogger("gpufleet.agent.batch")

SCHEMA_VERSION = 1
MAX_EVENTS = 100  # the server's limit per batch
MAX_ERROR_KEYS = 64
URGENT_EVENTS = frozenset({"spot_interruption"})


def layout_key(gpus: tuple[GpuInfo, ...]) -> tuple[Any, ...]:
    """What a batch's samples must agree with: which devices exist and which GPUs are in MIG mode."""
    return tuple((g.uuid, g.mig_mode, tuple(s.uuid for s in g.slices)) for g in gpus)


def build_batch(
    *,
    batch_id: str,
    instance: dict[str, Any],
    gpus: list[dict[str, Any]],
    intervals: list[dict[str, Any]],
    events: list[dict[str, Any]],
    interval_s: float | None,
    dropped_batches: int = 0,
    errors: dict[str, int] | None = None,
) -> dict[str, Any]:
    counts = Counter(errors or {})
    agent: dict[str, Any] = {"version": __version__, "dropped_batches": dropped_batches}
    if interval_s is not None:
        agent["interval_s"] = interval_s
    if counts:
        agent["errors"] = dict(counts.most_common(MAX_ERROR_KEYS))
    return {
        "schema_version": SCHEMA_VERSION,
        "batch_id": batch_id,
        "agent": agent,
        "instance": instance,
        "gpus": gpus,
        "intervals": intervals,
        "events": events[:MAX_EVENTS],
    }


class Batcher:
    """Fills the journal interval by interval and seals it into the spool."""

    def __init__(self, spool: Spool, journal: Journal, *, batch_intervals: int, interval_s: float) -> None:
        self.spool = spool
        self.journal = journal
        self.batch_intervals = batch_intervals
        self.interval_s = interval_s
        self._instance: dict[str, Any] | None = None
        self._layout: tuple[Any, ...] | None = None
        self._gpus_wire: list[dict[str, Any]] | None = None
        self._intervals = 0
        self._events = 0

    def recover(self) -> SpooledBatch | None:
        """Seal what a previous run left in the journal (killed, or the host went down)."""
        records = self.journal.load()
        if not any(r.get("t") in ("interval", "event") for r in records):
            self.journal.clear()
            return None
        sealed = self._seal_records(records)
        self.journal.clear()
        log.info("recovered %d journal records from the previous run", len(records))
        return sealed

    def add(self, interval: Interval, instance: dict[str, Any], errors: dict[str, int]) -> list[SpooledBatch]:
        """Journal one interval; returns the batches this sealed (usually none, or one)."""
        sealed: list[SpooledBatch] = []
        key = layout_key(interval.gpus)
        layout_changed = self._layout is not None and key != self._layout
        if self._instance is not None and (instance != self._instance or layout_changed):
            sealed += self._seal_open()
        if self._instance is None:
            self._open(instance)
        gpus = [g.to_wire() for g in interval.gpus]
        if gpus != self._gpus_wire:
            self.journal.append({"t": "gpus", "gpus": gpus})
            self._gpus_wire = gpus
            self._layout = key
        record: dict[str, Any] = {"t": "interval", **interval.to_wire()}
        if errors:
            record["errors"] = errors
        self.journal.append(record)
        self._intervals += 1
        if self._intervals >= self.batch_intervals:
            sealed += self._seal_open()
        return sealed

    def add_events(self, events: list[dict[str, Any]], instance: dict[str, Any]) -> list[SpooledBatch]:
        """Journal events; an urgent one (spot interruption) seals the batch at once so it leaves now."""
        if not events:
            return []
        sealed: list[SpooledBatch] = []
        if self._instance is not None and instance != self._instance:
            sealed += self._seal_open()
        if self._instance is None:
            self._open(instance)
        for event in events:
            if self._events >= MAX_EVENTS:
                sealed += self._seal_open()
                self._open(instance)
            self.journal.append({"t": "event", "event": event})
            self._events += 1
        if any(e.get("kind") in URGENT_EVENTS for e in events):
            sealed += self._seal_open()
        return sealed

    def flush(self) -> list[SpooledBatch]:
        """Seal whatever the open batch holds (on stop)."""
        return self._seal_open() if self._instance is not None else []

    def _open(self, instance: dict[str, Any]) -> None:
        self.journal.append({"t": "head", "batch_id": new_batch_id(), "instance": instance})
        if self._gpus_wire is not None:
            self.journal.append({"t": "gpus", "gpus": self._gpus_wire})
        self._instance = instance

    def _seal_open(self) -> list[SpooledBatch]:
        records = self.journal.records
        sealed = self._seal_records(records) if any(r.get("t") in ("interval", "event") for r in records) else None
        self.journal.clear()
        self._instance = None
        self._intervals = 0
        self._events = 0
        return [sealed] if sealed is not None else []

    def _seal_records(self, records: list[dict[str, Any]]) -> SpooledBatch | None:
        head = next((r for r in records if r.get("t") == "head"), None)
        if head is None:
            log.warning("journal without a head record: %d records discarded", len(records))
            return None
        gpus: list[dict[str, Any]] = []
        intervals: list[dict[str, Any]] = []
        events: list[dict[str, Any]] = []
        errors: Counter[str] = Counter()
        for r in records:
            kind = r.get("t")
            if kind == "gpus":
                gpus = r["gpus"]
            elif kind == "interval":
                errors.update(r.get("errors", {}))
                intervals.append({k: v for k, v in r.items() if k not in ("t", "errors")})
            elif kind == "event":
                events.append(r["event"])
        dropped = self.spool.take_dropped()
        document = build_batch(
            batch_id=head["batch_id"],
            instance=head["instance"],
            gpus=gpus,
            intervals=intervals,
            events=events,
            interval_s=self.interval_s,
            dropped_batches=dropped,
            errors=dict(errors),
        )
        try:
            return self.spool.put(gzip_json(document), carried=dropped)
        except OSError:
            self.spool.restore_dropped(dropped)
            raise
