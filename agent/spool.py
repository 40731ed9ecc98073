"""The durable spool: nothing collected is lost while the server is away, the agent restarts or the host reboots.

Two stages, both on disk:
- the *journal* (`open.jsonl`): the batch being filled. Each interval is appended and flushed to disk as
  soon as it is collected, so `kill -9` costs at most the interval in progress. A torn last line (a crash
  mid-write) is ignored on recovery.
- *sealed batches* (`<seq>-<created ms>-<carried>.gz`): the exact gzip bodies to POST, in order. A file is
  deleted only after the server acknowledged it; the server stores a re-sent batch id once.

The spool is bounded by size and age. When it overflows, the oldest batches go first; they are counted,
and the count rides in the next batch sealed (`agent.dropped_batches`), so the server knows about the gap.
Batches the server calls bad are moved to `rejected/`, never retried. A batch the server keeps failing on
is moved to `aside/` by the sender, so the newer ones can go; it still counts toward both bounds.

The sender thread leaves agent events for the collecting thread in `events.json` (durable, so a restart
loses none); the collecting thread journals them into the open batch.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

log = logging.getLogger("gpufleet.agent.spool")

JOURNAL = "open.jsonl"
DROPPED = "dropped"
EVENTS = "events.json"
REJECTED_KEEP = 50
EVENTS_KEEP = 100  # events waiting to be journaled; beyond this the oldest go (one batch holds 100)


@dataclass(frozen=True, order=True)
class SpooledBatch:
    """One sealed batch on disk. `carried` is the drop count it reports, re-counted if it is dropped itself."""

    seq: int
    created_ms: int
    carried: int
    path: Path
    size: int = 0


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write, flush to disk, then rename into place: the file is either absent or complete."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class Spool:
    def __init__(
        self,
        directory: Path,
        *,
        max_bytes: int = 256 * 1024 * 1024,
        max_age_s: float = 7 * 86400,
        wall_clock: Callable[[], float] = time.time,
        tidy: bool = True,
    ) -> None:
        """`tidy=False` looks without touching: for `doctor`, which may run beside the service."""
        self.dir = directory
        self.rejected_dir = directory / "rejected"
        self.aside_dir = directory / "aside"
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.wall_clock = wall_clock
        self._lock = threading.Lock()
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if tidy:
            for stale in self.dir.glob(".*.tmp"):
                stale.unlink(missing_ok=True)
        self._batches = sorted(b for b in map(self._parse, self.dir.iterdir()) if b is not None)
        aside = self.aside_dir.iterdir() if self.aside_dir.is_dir() else iter(())
        self._aside = sorted(b for b in map(self._parse, aside) if b is not None)
        self._bytes = sum(b.size for b in self._batches) + sum(b.size for b in self._aside)
        self._next_seq = max((b.seq for b in self._batches + self._aside), default=0) + 1
        self._events_waiting = (self.dir / EVENTS).exists()  # spares a failing open() at every interval

    # -- sealed batches -------------------------------------------------------------------------------

    @staticmethod
    def _parse(path: Path) -> SpooledBatch | None:
        if path.suffix != ".gz" or path.name.startswith("."):
            return None
        parts = path.stem.split("-")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            return None
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return None
        return SpooledBatch(int(parts[0]), int(parts[1]), int(parts[2]), path, size)

    def put(self, body: bytes, *, carried: int = 0) -> SpooledBatch:
        """Store a sealed batch (gzip bytes) durably, then enforce the bounds."""
        with self._lock:
            created_ms = int(self.wall_clock() * 1000)
            path = self.dir / f"{self._next_seq:012d}-{created_ms}-{carried}.gz"
            write_atomic(path, body)
            batch = SpooledBatch(self._next_seq, created_ms, carried, path, len(body))
            self._next_seq += 1
            self._batches.append(batch)
            self._bytes += batch.size
            self._enforce_bounds()
            return batch

    def pending(self) -> list[SpooledBatch]:
        with self._lock:
            return list(self._batches)

    def oldest(self) -> SpooledBatch | None:
        with self._lock:
            self._enforce_age()
            return self._batches[0] if self._batches else None

    def read(self, batch: SpooledBatch) -> bytes | None:
        try:
            return batch.path.read_bytes()
        except FileNotFoundError:
            self.remove(batch)
            return None

    def remove(self, batch: SpooledBatch) -> None:
        """The server has the batch: forget it."""
        with self._lock:
            batch.path.unlink(missing_ok=True)
            self._forget(batch)

    def _forget(self, batch: SpooledBatch) -> None:
        for batches in (self._batches, self._aside):
            if batch in batches:
                batches.remove(batch)
                self._bytes -= batch.size

    def set_aside(self, batch: SpooledBatch) -> SpooledBatch | None:
        """Take a batch the server keeps failing on out of the queue, keeping it on disk for rarer retries.
        None if the batch is gone meanwhile (dropped by a bound)."""
        with self._lock:
            if batch not in self._batches:
                return None
            self.aside_dir.mkdir(exist_ok=True, mode=0o700)
            moved = replace(batch, path=self.aside_dir / batch.path.name)
            try:
                os.replace(batch.path, moved.path)
            except FileNotFoundError:
                self._forget(batch)
                return None
            _fsync_dir(self.aside_dir)
            _fsync_dir(self.dir)
            self._batches.remove(batch)
            self._aside.append(moved)
            self._aside.sort()
            return moved

    def aside(self) -> list[SpooledBatch]:
        """Batches set aside, oldest first (they leave by delivery, rejection or the age and size bounds)."""
        with self._lock:
            return list(self._aside)

    def reject(self, batch: SpooledBatch, reason: str) -> Path:
        """Move a batch the server refused as bad out of the queue, with the reason beside it."""
        with self._lock:
            self.rejected_dir.mkdir(exist_ok=True, mode=0o700)
            target = self.rejected_dir / batch.path.name
            if batch.path.exists():
                os.replace(batch.path, target)
            (self.rejected_dir / (batch.path.stem + ".reason.txt")).write_text(reason + "\n", encoding="utf-8")
            self._forget(batch)
            kept = sorted(self.rejected_dir.glob("*.gz"))
            for old in kept[:-REJECTED_KEEP]:
                old.unlink(missing_ok=True)
                (self.rejected_dir / (old.stem + ".reason.txt")).unlink(missing_ok=True)
            return target

    def size_bytes(self) -> int:
        with self._lock:
            return self._bytes

    def rejected(self) -> int:
        """Batches kept in `rejected/` for a person to look at."""
        return len(list(self.rejected_dir.glob("*.gz"))) if self.rejected_dir.is_dir() else 0

    def _oldest_of_all(self) -> SpooledBatch | None:
        """The oldest batch, queued or set aside: the bounds drop it first."""
        heads = [b[0] for b in (self._batches, self._aside) if b]
        return min(heads) if heads else None

    def _enforce_bounds(self) -> None:
        self._enforce_age()
        # The newest batch always stays, however small the bound.
        while self._bytes > self.max_bytes and len(self._batches) + len(self._aside) > 1:
            self._drop_oldest("spool over its size bound")

    def _enforce_age(self) -> None:
        cutoff_ms = (self.wall_clock() - self.max_age_s) * 1000
        while (oldest := self._oldest_of_all()) is not None and oldest.created_ms < cutoff_ms:
            self._drop_oldest("older than the spool's age bound")

    def _drop_oldest(self, why: str) -> None:
        batch = self._oldest_of_all()
        assert batch is not None
        self._forget(batch)
        batch.path.unlink(missing_ok=True)
        self._add_dropped(1 + batch.carried)
        log.warning("dropped spooled batch %s (%s)", batch.path.name, why)

    # -- the drop counter -------------------------------------------------------------------------------

    def _add_dropped(self, count: int) -> None:
        write_atomic(self.dir / DROPPED, str(self._read_dropped() + count).encode())

    def _read_dropped(self) -> int:
        try:
            return int((self.dir / DROPPED).read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def take_dropped(self) -> int:
        """Batches dropped since the last call: the figure the next sealed batch reports."""
        with self._lock:
            count = self._read_dropped()
            if count:
                (self.dir / DROPPED).unlink(missing_ok=True)
            return count

    def peek_dropped(self) -> int:
        with self._lock:
            return self._read_dropped()

    def restore_dropped(self, count: int) -> None:
        with self._lock:
            if count:
                self._add_dropped(count)

    # -- events from the sender ---------------------------------------------------------------------

    def add_event(self, event: dict[str, Any]) -> None:
        """Keep an event (`ts`, `kind`, `details`) durably until the collecting thread journals it."""
        with self._lock:
            events = [*self._read_events(), event]
            if len(events) > EVENTS_KEEP:
                log.warning("%d delivery events not yet journaled were dropped", len(events) - EVENTS_KEEP)
            write_atomic(self.dir / EVENTS, json.dumps(events[-EVENTS_KEEP:], separators=(",", ":")).encode())
            self._events_waiting = True

    def events(self) -> list[dict[str, Any]]:
        """Events waiting to be journaled, oldest first; they stay until `discard_events`."""
        with self._lock:
            return self._read_events() if self._events_waiting else []

    def discard_events(self, count: int) -> None:
        """Forget the first `count` events: they are in the journal now."""
        with self._lock:
            rest = self._read_events()[count:]
            if rest:
                write_atomic(self.dir / EVENTS, json.dumps(rest, separators=(",", ":")).encode())
            else:
                (self.dir / EVENTS).unlink(missing_ok=True)
                self._events_waiting = False

    def _read_events(self) -> list[dict[str, Any]]:
        try:
            events = json.loads((self.dir / EVENTS).read_bytes())
        except FileNotFoundError:
            return []
        except ValueError:
            log.warning("unreadable %s ignored", self.dir / EVENTS)
            return []
        return [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []


class Journal:
    """The batch being filled, one JSON line per record, flushed to disk on every append.

    Records: `head` (batch id, instance), `gpus` (the layout), `interval`, `event`. The whole batch is
    rebuilt from them by `load()`; a torn line (the process died mid-write, or the disk filled) is skipped.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: Any = None
        self.records: list[dict[str, Any]] = []

    def load(self) -> list[dict[str, Any]]:
        """Records left by a previous run (a torn last line is dropped), and forget them in memory."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        records = []
        for line in raw.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a torn write (crash, full disk); records after it are still whole
            if isinstance(record, dict):
                records.append(record)
        return records

    def append(self, record: dict[str, Any], encoded: dict[str, str] | None = None) -> None:
        """Write `record` as one line; `encoded` gives some of its values already in JSON (`dumps`)."""
        if self._file is None:
            new = not self.path.exists()
            self._file = open(self.path, "ab")  # noqa: SIM115 - stays open across appends
            if new:
                _fsync_dir(self.path.parent)
        self._file.write(dumps(record, encoded).encode() + b"\n")
        self._file.flush()
        os.fdatasync(self._file.fileno())
        self.records.append(record)

    def clear(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self.path.unlink(missing_ok=True)
        self.records = []

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def new_batch_id() -> str:
    return str(uuid.uuid4())


def dumps(document: dict[str, Any], encoded: dict[str, str] | None = None) -> str:
    """`document` as compact JSON. `encoded` holds some of its values already in JSON, as `json.dumps` with
    these separators writes them: those are put in as they are, which spares encoding again what the agent
    sends unchanged batch after batch (holder descriptions). The text is the same either way."""
    if not encoded:
        return json.dumps(document, separators=(",", ":"))
    return "{" + ",".join(_members(document, encoded)) + "}"


def _members(document: dict[str, Any], encoded: dict[str, str]) -> list[str]:
    return [
        f"{json.dumps(key)}:{encoded[key] if key in encoded else json.dumps(value, separators=(',', ':'))}"
        for key, value in document.items()
    ]


GZIP_LEVEL = 3
"""A batch of 3 intervals of 64 devices with holders (110 KB of JSON) takes about 0.5 ms at level 3 for 15.5 KB,
against 1.2 ms at level 6 for 13 KB: the CPU counts on every interval, the bytes hardly at all."""
_GZIP_HEADER = gzip.compress(b"", compresslevel=GZIP_LEVEL, mtime=0)[:10]
_TABLE = "holders"


_deflated: tuple[bytes, bytes] = (b"", b"")
"""The last holders table compressed, its bytes and their deflate piece (one tuple, so a reader on another thread
never pairs one table with another's piece): most batches send the one before's."""


def gzip_json(document: dict[str, Any], encoded: dict[str, str] | None = None) -> bytes:
    """`dumps(document, encoded)` gzipped. A holders table is compressed on its own, as a piece of the deflate
    stream that starts and ends on a byte boundary and refers to nothing outside it: a table sent unchanged
    batch after batch is compressed once, and the pieces cost less than the whole (half the batch is the table,
    whose repeats make long searches for the rest). The output depends on the text alone."""
    if _TABLE not in document:
        return gzip.compress(dumps(document, encoded).encode(), compresslevel=GZIP_LEVEL, mtime=0)
    encoded = encoded or {}
    members = _members({k: v for k, v in document.items() if k != _TABLE}, encoded)
    at = list(document).index(_TABLE)
    head = ("{" + "".join(m + "," for m in members[:at]) + f'"{_TABLE}":').encode()
    table = (encoded[_TABLE] if _TABLE in encoded else json.dumps(document[_TABLE], separators=(",", ":"))).encode()
    tail = ("".join("," + m for m in members[at:]) + "}").encode()
    global _deflated
    last = _deflated
    if table != last[0]:
        last = _deflated = (table, _deflate(table, zlib.Z_SYNC_FLUSH))
    crc = zlib.crc32(tail, zlib.crc32(table, zlib.crc32(head)))
    size = len(head) + len(table) + len(tail)
    trailer = struct.pack("<LL", crc, size & 0xFFFFFFFF)
    return b"".join((_GZIP_HEADER, _deflate(head, zlib.Z_SYNC_FLUSH), last[1], _deflate(tail, zlib.Z_FINISH), trailer))


def _deflate(data: bytes, flush: int) -> bytes:
    """`data` as raw deflate blocks made afresh, ending the stream (Z_FINISH) or on a byte boundary (Z_SYNC_FLUSH)."""
    compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush(flush)
