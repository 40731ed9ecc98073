"""Intervals become batches in the server's wire format (`docs/ingest-protocol.md`, schema version 1).

The open batch lives in the journal, so it survives a crash. It is sealed into the spool when it holds
`batch_intervals` intervals, when the hardware layout or the host identity changes (every sample of a batch
must name a device of that batch's layout), when an urgent event such as a spot interruption notice
arrives, and when the agent stops.

Holders (who runs on each device) are described once per batch, in its `holders` table, and referred to by
number from each sample; a holder that runs on keeps its number from batch to batch where it can, so its
description and the references to it are made once, not once per batch (`HolderTable`). The journal carries
each description in the record of the interval that first had it in the batch, so a torn record loses its
references and its descriptions together, and sealing the same journal twice gives the same table.
"""

from __future__ import annotations

import json
import logging
import operator
from collections import Counter
from typing import Any

from . import __version__
from .collect.holders import Holder
from .collect.model import GpuInfo, Interval
from .spool import Journal, Spool, SpooledBatch, dumps, gzip_json, new_batch_id

log = logging.getLogger("gpufleet.agent.batch")

SCHEMA_VERSION = 1
MAX_EVENTS = 100  # the server's limit per batch
MAX_HOLDERS = 4096  # holder descriptions per batch, the server's limit too
MAX_ERROR_KEYS = 64
URGENT_EVENTS = frozenset({"spot_interruption"})


def layout_key(gpus: tuple[GpuInfo, ...]) -> tuple[Any, ...]:
    """What a batch's samples must agree with: which devices exist and which GPUs are in MIG mode."""
    return tuple((g.uuid, g.mig_mode, tuple(s.uuid for s in g.slices)) for g in gpus)


_Made = tuple[tuple[Any, ...], dict[str, Any], str, dict[str, Any], str]
"""A description: what tells the holder apart, its entry, the entry's JSON, and both without the number."""
_Listed = tuple[tuple[Holder, ...], list[dict[str, int]], tuple[int, ...]]
"""A device's holders listed whole: the tuple, its references, and the holders' numbers."""
_Carried = tuple[
    dict[int, tuple[Holder, int, tuple[Any, ...]]],
    dict[tuple[Any, ...], int],
    dict[int, _Made],
    dict[int, _Listed],
    dict[int, tuple[tuple[Holder, ...], str, list[dict[str, int]]]],
]
_NOTHING: _Carried = ({}, {}, {}, {}, {})


class HolderTable:
    """A batch's holders: each described once, under a number unique within the batch (0 to MAX_HOLDERS - 1).
    `truncated` counts references refused because the table was full.

    Cheap for the processes that run on: a holder object already referred to costs a dictionary look-up, and a
    device's holders tuple already referred to in this batch gives the same list of references again. A holder
    the previous batch's table (`previous`) described keeps its number where it is free here, and with it that
    table's description and JSON; a tuple whose holders all kept their numbers keeps its references and their
    JSON. New holders take numbers neither table used, so those that run on can keep theirs."""

    def __init__(self, previous: HolderTable | None = None) -> None:
        self.entries: list[dict[str, Any]] = []
        self.encoded: list[str] = []
        """Each entry as JSON (`spool.dumps`), so what the journal and the sealed batch carry again and again is
        encoded once per process."""
        self.truncated = 0
        self._ids: dict[tuple[Any, ...], int] = {}  # what tells holders apart -> number
        self._made: dict[int, _Made] = {}  # number -> its description
        # id(holder) -> (holder, number, what tells it apart), the holder kept alive
        self._objects: dict[int, tuple[Holder, int, tuple[Any, ...]]] = {}
        # id(holders) -> (holders, their references, the numbers): the tuple kept alive. The lists are shared by
        # the samples of several intervals and batches, so nothing may change them in place.
        self._lists: dict[int, _Listed] = {}
        self._lists_json: dict[int, tuple[tuple[Holder, ...], str, list[dict[str, int]]]] = {}  # the lists in JSON
        self._next = 0  # numbers below it are this table's or the previous one's
        self._spare = 0  # when those run out: numbers below it are this table's
        # What the previous table made, without the table, so no chain of tables stays alive. An empty table (the
        # one a sealed batch leaves until the next opens) passes on what it was given.
        self._before: _Carried = (
            _NOTHING if previous is None else previous._before if not previous._made else previous._carried()
        )

    def __len__(self) -> int:
        return len(self.entries)

    def _carried(self) -> _Carried:
        return (self._objects, self._ids, self._made, self._lists, self._lists_json)

    def ref(self, holder: Holder) -> int | None:
        """`holder`'s number, described now if it is new; None when the table is full."""
        seen = self._objects.get(id(holder))
        if seen is not None and seen[0] is holder:
            return seen[1]
        before = self._before[0].get(id(holder))
        if before is not None and before[0] is holder:
            key = before[2]
            # Its number free here means its description is not here yet: that would hold the number, or one given
            # once the number was taken.
            number = self._take(key, before[1]) if before[1] not in self._made else self._ids.get(key)
        else:
            key = _described(holder)
            number = self._ids.get(key)
        if number is None:
            number = self._describe(key, holder)
            if number is None:
                self.truncated += 1
                return None
        self._objects[id(holder)] = (holder, number, key)
        return number

    def _describe(self, key: tuple[Any, ...], holder: Holder) -> int | None:
        """A number for the holder `key` tells apart, its description made or taken from the previous table."""
        made_before = self._before[2]
        number = self._before[1].get(key)
        if number is not None and number not in self._made:
            return self._take(key, number)
        if len(self.entries) >= MAX_HOLDERS:
            return None
        earlier = made_before.get(number) if number is not None else None
        number = self._free()
        if earlier is not None:  # described there under a number taken here since
            wire, members = earlier[3], earlier[4]
        else:
            wire = holder.to_wire()
            members = dumps(wire)[1:]  # "pid" always leads, so the members follow the id's
        self._add((key, {"id": number, **wire}, f'{{"id":{number},{members}', wire, members), number)
        return number

    def _take(self, key: tuple[Any, ...], number: int) -> int | None:
        """The previous table's description of `key` under its `number` there, free here."""
        if len(self.entries) >= MAX_HOLDERS:
            return None
        self._add(self._before[2][number], number)
        return number

    def _add(self, made: _Made, number: int) -> None:
        self._ids[made[0]] = number
        self._made[number] = made
        self.entries.append(made[1])
        self.encoded.append(made[2])

    def _free(self) -> int:
        """A number this table has not given, one the previous table did not give either while there is one."""
        mine, theirs = self._made, self._before[2]
        number = self._next
        while number < MAX_HOLDERS and (number in mine or number in theirs):
            number += 1
        if number < MAX_HOLDERS:
            self._next = number + 1
            return number
        self._next = MAX_HOLDERS
        number = self._spare
        while number in mine:
            number += 1
        self._spare = number + 1
        return number

    def encode(self, start: int = 0) -> str:
        """The entries from the `start`th on as a JSON array, as `spool.dumps` writes it."""
        return "[" + ",".join(self.encoded[start:]) + "]"

    def refs(self, holders: tuple[Holder, ...]) -> list[dict[str, int]]:
        """A sample's references to `holders` (number and memory), described now if they are new; those the
        full table cannot describe are left out."""
        seen = self._lists.get(id(holders))
        if seen is not None and seen[0] is holders:
            return seen[1]
        before = self._before[3].get(id(holders))
        if before is not None and before[0] is holders and self._carry(before):
            self._lists[id(holders)] = before
            return before[1]
        found = [self.ref(holder) for holder in holders]
        numbers = tuple([n for n in found if n is not None])  # not kept: each sample counts what it leaves out
        if before is not None and before[0] is holders and before[2] == numbers:
            held = before[1]
        else:
            held = [
                {"ref": n} if h.used_mib is None else {"ref": n, "used_mib": h.used_mib}
                for h, n in zip(holders, found, strict=True)
                if n is not None
            ]
        if len(numbers) == len(holders):
            self._lists[id(holders)] = (holders, held, numbers)
        return held

    def _carry(self, listed: _Listed) -> bool:
        """Whether the holders of a tuple the previous table listed whole could all keep their numbers here; if so
        they are described here under them. The common case, at the start of every batch, in one pass."""
        numbers = listed[2]
        # None of the numbers given here means none of the holders described here yet (see `ref`).
        if not self._made.keys().isdisjoint(numbers) or len(self.entries) + len(numbers) > MAX_HOLDERS:
            return False
        made_before, objects = self._before[2], self._objects
        for holder, number in zip(listed[0], numbers, strict=True):
            made = made_before[number]
            self._add(made, number)
            objects[id(holder)] = (holder, number, made[0])
        return True

    def refs_json(self, holders: tuple[Holder, ...]) -> str:
        """`refs(holders)` as a JSON array ("" when none is kept), made once per list of references."""
        seen = self._lists_json.get(id(holders))
        if seen is not None and seen[0] is holders:
            return seen[1]
        held = self.refs(holders)
        before = self._before[4].get(id(holders))
        if before is not None and before[0] is holders and before[2] is held:
            text = before[1]
        else:
            text = json.dumps(held, separators=(",", ":")) if held else ""
        if id(holders) in self._lists:  # kept whole: the same tuple gives the same references
            self._lists_json[id(holders)] = (holders, text, held)
        return text

    def missing(self, interval: Interval) -> int:
        """How many descriptions `interval` would add (at most; exact once it could fill the table)."""
        listed = sum(len(r.holders) for r in interval.readings)
        if len(self.entries) + listed <= MAX_HOLDERS:
            return listed
        return len({_described(h) for r in interval.readings for h in r.holders} - self._ids.keys())

    def forget_after(self, count: int) -> None:
        """Drop the descriptions from the `count`th on (the journal record that held them was not written)."""
        for entry in self.entries[count:]:
            del self._ids[self._made.pop(entry["id"])[0]]
        del self.entries[count:]
        del self.encoded[count:]
        self._objects = {k: seen for k, seen in self._objects.items() if seen[2] in self._ids}
        self._lists.clear()
        self._lists_json.clear()
        self._spare = 0  # the numbers dropped are free again, below the cursors


def _described(h: Holder) -> tuple[Any, ...]:
    """What the table tells holders apart by: everything but memory, which is the sample's."""
    return (
        h.pid,
        h.started_at,
        h.executable,
        h.uid,
        h.user,
        h.container_id,
        h.pod_uid,
        h.namespace,
        h.pod,
        h.job_id,
        h.job_step,
        h.command,
    )


def link_holders(intervals: list[dict[str, Any]], entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The batch's holders table from the descriptions its journal held, under the numbers the live table gave
    them, so sealing on recovery gives the batch that sealing live would have. References to a description that
    was lost (a torn journal line) are dropped from the samples, in place. Of two descriptions under one number (a
    line that reached the disk though its write failed, whose numbers were given again) the later stands."""
    last = {e["id"]: n for n, e in enumerate(entries)}
    if len(last) < len(entries):
        entries = [e for n, e in enumerate(entries) if last[e["id"]] == n]
    for interval in intervals:
        for sample in interval["samples"]:
            refs = sample.get("holders")
            if refs is None or all(h["ref"] in last for h in refs):
                continue
            kept = [h for h in refs if h["ref"] in last]
            if kept:
                sample["holders"] = kept
            else:
                del sample["holders"]
    return entries


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
    holders: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The batch document. `holders` (the table the samples refer to) is left out when empty, so a batch
    without holders is what it was before they existed."""
    counts = Counter(errors or {})
    agent: dict[str, Any] = {"version": __version__, "dropped_batches": dropped_batches}
    if interval_s is not None:
        agent["interval_s"] = interval_s
    if counts:
        agent["errors"] = dict(counts.most_common(MAX_ERROR_KEYS))
    document: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "batch_id": batch_id,
        "agent": agent,
        "instance": instance,
        "gpus": gpus,
    }
    if holders:
        document["holders"] = holders
    document["intervals"] = intervals
    document["events"] = events[:MAX_EVENTS]
    return document


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
        self._gpus_info: tuple[GpuInfo, ...] | None = None
        self._gpus_key: tuple[Any, ...] = ()
        self._gpus_made: list[dict[str, Any]] = []
        self._intervals = 0
        self._events = 0
        self._holders = HolderTable()

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
        if interval.gpus != self._gpus_info:  # mostly equal: then the key and the wire form are those made last
            self._gpus_info = interval.gpus
            self._gpus_key = layout_key(interval.gpus)
            self._gpus_made = [g.to_wire() for g in interval.gpus]
        key = self._gpus_key
        layout_changed = self._layout is not None and key != self._layout
        # A batch describes at most MAX_HOLDERS holders: one that could not describe this interval's is full.
        full = self._intervals > 0 and len(self._holders) + self._holders.missing(interval) > MAX_HOLDERS
        if self._instance is not None and (instance != self._instance or layout_changed or full):
            sealed += self._seal_open()
        if self._instance is None:
            self._open(instance)
        gpus = self._gpus_made
        if gpus != self._gpus_wire:
            self.journal.append({"t": "gpus", "gpus": gpus})
            self._gpus_wire = gpus
            self._layout = key
        table = self._holders
        described = len(table)
        # The journal keeps this batch's samples as their JSON (`_seal_records`, `live`): written once, here.
        record: dict[str, Any] = {"t": "interval", **interval.to_record(table.refs_json)}
        encoded = {"samples": record["samples"]}
        if len(table) > described:
            record["holders"] = table.entries[described:]
            encoded["holders"] = table.encode(described)
        if table.truncated:
            errors = {**errors, "holders:truncated": errors.get("holders:truncated", 0) + table.truncated}
            table.truncated = 0
        if errors:
            record["errors"] = errors
        try:
            self.journal.append(record, encoded)
        except OSError:
            table.forget_after(described)
            raise
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
        self._holders = HolderTable(self._holders)
        if self._gpus_wire is not None:
            self.journal.append({"t": "gpus", "gpus": self._gpus_wire})
        self._instance = instance

    def _seal_open(self) -> list[SpooledBatch]:
        records = self.journal.records
        filled = any(r.get("t") in ("interval", "event") for r in records)
        sealed = self._seal_records(records, self._holders) if filled else None
        self.journal.clear()
        self._instance = None
        self._intervals = 0
        self._events = 0
        self._holders = HolderTable(self._holders)
        return [sealed] if sealed is not None else []

    def _seal_records(self, records: list[dict[str, Any]], table: HolderTable | None = None) -> SpooledBatch | None:
        """The batch the journal's `records` make, into the spool. `table` is the open batch's (the records are
        the ones `add` made, not a journal read back from disk): their samples are JSON already, their holder
        references whole and numbered as the table, and the table lends the JSON of its entries."""
        head = next((r for r in records if r.get("t") == "head"), None)
        if head is None:
            log.warning("journal without a head record: %d records discarded", len(records))
            return None
        gpus: list[dict[str, Any]] = []
        intervals: list[dict[str, Any]] = []
        events: list[dict[str, Any]] = []
        holders: list[dict[str, Any]] = []
        errors: Counter[str] = Counter()
        for r in records:
            kind = r.get("t")
            if kind == "gpus":
                gpus = r["gpus"]
            elif kind == "interval":
                errors.update(r.get("errors", {}))
                holders += r.get("holders", ())
                intervals.append({k: v for k, v in r.items() if k not in ("t", "errors", "holders")})
            elif kind == "event":
                events.append(r["event"])
        # Only a journal read back from disk can have lost a description (a torn line) that samples refer to.
        linked = holders if table is not None else link_holders(intervals, holders)
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
            holders=linked,
        )
        encoded: dict[str, str] = {}
        if table is not None:
            encoded["intervals"] = "[" + ",".join(dumps(iv, {"samples": iv["samples"]}) for iv in intervals) + "]"
        held = document.get("holders")
        if (
            table is not None
            and held
            and len(held) == len(table.entries)
            and all(map(operator.is_, held, table.entries))
        ):
            encoded["holders"] = table.encode()
        try:
            return self.spool.put(gzip_json(document, encoded), carried=dropped)
        except OSError:
            self.spool.restore_dropped(dropped)
            raise
