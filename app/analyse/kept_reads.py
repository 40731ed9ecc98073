"""What a window's rollup reads before today sum to, kept in this process between views.

Days before today rarely change: their rows are written as their samples arrive, and a late batch or an agent's
spool replayed after an outage is the exception. A view reads the rows of today afresh, and the rows before today
only when they, or the prices over them, changed since they were last read. Whether they changed is asked of the
rows themselves: how many there are and the sum of their row versions (`xmin`, which any write to a row changes),
one scan of the rows' headers, several times cheaper than pricing them. Reading them again gives the same sums; the
memo only saves the time.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from operator import add
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..db import fetch_binary
from .device_money import DeviceMoney, plus, usage_and_money
from .price_classes import PriceClasses
from .usage import DeviceUsage
from .window import DAILY, RollupRead, floor_day

_TABLES = {
    "device": ("rollups_daily", "rollups_hourly"),
    "instance": ("instance_rollups_daily", "instance_rollups_hourly"),
    "holder": ("holder_groups_daily", "holder_groups_hourly"),
}
"""The daily and hourly rollup tables of each kind of row."""


class KeptReads:
    """Results kept by key (what was read, how, and the version of its rows and prices), the least recently used
    dropped first: at most `limit` results and `rows` rows in all (a result's rows: its devices, its chart rows and
    buckets, its values; about 1 KB each for the window analysis's devices, so the default keeps about 80 MB at
    most)."""

    def __init__(self, limit: int = 32, rows: int = 80_000) -> None:
        self._lock = threading.Lock()
        self._limit = limit
        self._rows_limit = rows
        self._found: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._rows = 0

    def __len__(self) -> int:
        return len(self._found)

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            found = self._found.get(key)
            if found is None:
                return None
            self._found.move_to_end(key)
            return found[0]

    def put(self, key: Hashable, value: Any, rows: int) -> None:
        """Keep `value`, of `rows` rows; one larger than the whole limit is not kept."""
        with self._lock:
            if rows > self._rows_limit:
                return
            old = self._found.pop(key, None)
            if old is not None:
                self._rows -= old[1]
            self._found[key] = (value, rows)
            self._rows += rows
            while len(self._found) > self._limit or self._rows > self._rows_limit:
                _key, (_value, n) = self._found.popitem(last=False)
                self._rows -= n


KEPT = KeptReads()


def split_reads(reads: Sequence[RollupRead], today: datetime) -> tuple[list[RollupRead], list[RollupRead]]:
    """`reads` cut at `today` (a UTC midnight): the reads before it, and those from it on."""
    before: list[RollupRead] = []
    after: list[RollupRead] = []
    for r in reads:
        if r.end <= today:
            before.append(r)
        elif r.start >= today:
            after.append(r)
        else:
            before.append(RollupRead(r.table, r.start, today, r.sign))
            after.append(RollupRead(r.table, today, r.end, r.sign))
    return before, after


@lru_cache(maxsize=64)
def _version_sql(rows: str, tables: tuple[str, ...], key: str | None, grouped: bool) -> str:
    daily, hourly = _TABLES[rows]
    only = f" AND {key} = ANY(CAST(:ids AS int8[]))" if key else ""
    only += " AND grouping = :grouping" if grouped else ""
    parts = []
    for i, table in enumerate(tables):
        name, t = (daily, "day") if table == DAILY else (hourly, "hour")
        parts.append(f"SELECT xmin FROM {name} WHERE {t} >= :t{i}a AND {t} < :t{i}b{only}")
    return f"SELECT count(*), coalesce(sum(CAST(CAST(xmin AS text) AS int8)), 0) FROM ({' UNION ALL '.join(parts)}) x"


def rows_version(
    session: Session,
    rows: str,
    reads: Sequence[RollupRead],
    *,
    ids: Sequence[int] | None = None,
    grouping: str | None = None,
) -> tuple[int, int]:
    """How many rows `reads` cover, and the sum of their row versions: a write to any of them, a row added or one
    taken away changes it. `rows`: "device" (app/models.py rollups), "instance" (app/store/instance_rollups.py) or
    "holder" (app/store/holder_groups.py, of one `grouping`); `ids`: only these devices or instances."""
    key = None if ids is None else ("device_id" if rows == "device" else "instance_pk")
    params: dict[str, Any] = {} if ids is None else {"ids": list(ids)}
    if grouping is not None:
        params["grouping"] = grouping
    for i, r in enumerate(reads):
        params[f"t{i}a"], params[f"t{i}b"] = r.start, r.end
    sql = _version_sql(rows, tuple(r.table for r in reads), key, grouping is not None)
    n, total = session.execute(text(sql), params).one()
    return int(n), int(total)


def kept_usage_and_money(
    session: Session,
    devices: Mapping[int, int],
    classes: PriceClasses,
    reads: Sequence[RollupRead],
    *,
    idle_util_pct: int,
    device_ids: Sequence[int] | None,
    now: datetime,
    kept: KeptReads | None = None,
) -> tuple[dict[int, DeviceUsage], dict[int, DeviceMoney]]:
    """app/analyse/device_money.py `usage_and_money` over `reads`, with what the reads before today sum to kept while
    those rows, the devices asked about and the prices over those days stay the same."""
    kept = KEPT if kept is None else kept
    before, after = split_reads(reads, floor_day(now))
    if not before:
        return usage_and_money(session, devices, classes, reads, idle_util_pct=idle_util_pct, device_ids=device_ids)
    span = int(min(r.start for r in before).timestamp()), int(max(r.end for r in before).timestamp())
    key = (
        "usage and money",
        str(session.get_bind().engine.url),
        idle_util_pct,
        tuple(before),
        None if device_ids is None else tuple(device_ids),
        hash(frozenset(devices.items())),
        classes.span_signature(*span),
        rows_version(session, "device", before, ids=device_ids),
    )
    found: tuple[dict[int, DeviceUsage], dict[int, DeviceMoney]] | None = kept.get(key)
    if found is None:
        found = usage_and_money(session, devices, classes, before, idle_util_pct=idle_util_pct, device_ids=device_ids)
        kept.put(key, found, len(found[0]))
    usage, money = dict(found[0]), dict(found[1])
    if after:
        today_usage, today_money = usage_and_money(
            session, devices, classes, after, idle_util_pct=idle_util_pct, device_ids=device_ids
        )
        for device_id, u in today_usage.items():
            was = usage.get(device_id)
            # Field by field; the device id is the first field of both.
            usage[device_id] = u if was is None else DeviceUsage._make((device_id, *map(add, was[1:], u[1:])))
        for device_id, m in today_money.items():
            was_money = money.get(device_id)
            money[device_id] = m if was_money is None else plus(was_money, m)
    return usage, money


def params_key(params: Mapping[str, Any]) -> Hashable:
    """Query parameters as a key: lists as tuples, the rest (numbers, texts, bytes, times) as they are."""
    return tuple(sorted((name, tuple(v) if isinstance(v, list) else v) for name, v in params.items()))


def kept_fetch(
    session: Session,
    sql: str,
    key: Hashable,
    params: Callable[[], Mapping[str, Any]],
    *,
    rows: str,
    reads: Sequence[RollupRead],
    ids: Sequence[int] | None = None,
    kept: KeptReads | None = None,
) -> list[tuple[Any, ...]]:
    """The rows of `sql` with `params()` (app/db.py `fetch_binary`), a query that reads only the rollup rows of
    `reads` (before today: `split_reads`) of `rows` ("device" or "instance"; `ids`: only those), kept while those
    rows stay as they were. `key`: all the parameters depend on (made only when the query runs: a price grid is
    larger than what it is made from)."""
    kept = KEPT if kept is None else kept
    whole_key = ("rows", str(session.get_bind().engine.url), sql, key, rows_version(session, rows, reads, ids=ids))
    found: list[tuple[Any, ...]] | None = kept.get(whole_key)
    if found is None:
        found = fetch_binary(session, sql, params())
        kept.put(whole_key, found, len(found))
    return found
