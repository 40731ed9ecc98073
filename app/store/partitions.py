"""Time partitions of the samples and 5-minute rollups (daily) and the device and holder hourly rollups (monthly)
tables: made ahead, dropped whole at retention. The unpartitioned daily rollups lose their expired days in the same
pass, and holders their rows once no rollup can name them.

`samples` and `rollups_5m` have the same days and the same (raw) retention, `rollups_hourly`,
`holder_rollups_hourly` and `holder_groups_hourly` the same months and the same (rollup) retention: every function
below handles the daily tables as one list and the monthly tables as another, so a day's or a month's partitions
are made and dropped together.

The server does this itself because the embedded PostgreSQL has no pg_partman or cron.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import Connection, Engine, text

# Each daily table and the storage options of its partitions. Rollup rows are updated in place as batches
# arrive; free space on each page keeps those updates HOT. Samples are only inserted, so their pages are filled.
DAILY_TABLES: dict[str, str] = {"samples": "", "rollups_5m": "WITH (fillfactor = 70)"}
# Hourly rollup rows are updated in place too: the same free space for HOT updates.
MONTHLY_TABLES: dict[str, str] = {
    "rollups_hourly": "WITH (fillfactor = 70)",
    "holder_rollups_hourly": "WITH (fillfactor = 70)",
    "holder_groups_hourly": "WITH (fillfactor = 70)",
}
# Any fixed number works; it only keeps two server processes from running upkeep at the same moment.
_UPKEEP_LOCK = 0x6770_7566


def _month_start(day: date) -> date:
    return day.replace(day=1)


def _next_month(month: date) -> date:
    return (month.replace(day=28) + timedelta(days=4)).replace(day=1)


def _utc(day: date) -> str:
    return f"{day.isoformat()} 00:00:00+00"


def day_partition(table: str, day: date) -> str:
    """The partition of a daily table for one UTC day, e.g. samples_p20261121."""
    return f"{table}_p{day:%Y%m%d}"


def month_partition(table: str, month: date) -> str:
    """The partition of a monthly table for one UTC month, e.g. rollups_hourly_p202611."""
    return f"{table}_p{month:%Y%m}"


def create_day(conn: Connection, day: date, tables: Collection[str] | None = None) -> None:
    """The partition of every daily table for one UTC day, and of every monthly table for its month.

    `tables`: the partitioned tables the schema has, if the caller knows them (see _partitions); else they are
    looked up.
    """
    if tables is None:
        tables = _partitions(conn).keys()
    for table, options in DAILY_TABLES.items():
        if table in tables:
            conn.execute(
                text(
                    f"CREATE TABLE IF NOT EXISTS {day_partition(table, day)} PARTITION OF {table} "
                    f"FOR VALUES FROM ('{_utc(day)}') TO ('{_utc(day + timedelta(days=1))}') {options}"
                )
            )
    month = _month_start(day)
    for table, options in MONTHLY_TABLES.items():
        if table in tables:
            conn.execute(
                text(
                    f"CREATE TABLE IF NOT EXISTS {month_partition(table, month)} PARTITION OF {table} "
                    f"FOR VALUES FROM ('{_utc(month)}') TO ('{_utc(_next_month(month))}') {options}"
                )
            )


def _partitions(conn: Connection) -> dict[str, set[date]]:
    """Per partitioned table the schema has, the days (daily tables) or month starts (monthly tables) it has a
    partition for.

    Only tables that exist are keys: a schema older than migration 0005 has no rollups_5m, one older than 0011 no
    holder_rollups_hourly, and the migrations before them (and the tests of their back-fills) make partitions
    through create_day.
    """
    rows = conn.execute(
        text(
            "SELECT p.relname, c.relname FROM pg_class p LEFT JOIN pg_inherits i ON i.inhparent = p.oid "
            "LEFT JOIN pg_class c ON c.oid = i.inhrelid WHERE p.relkind = 'p' AND p.relname = ANY(:parents)"
        ),
        {"parents": [*DAILY_TABLES, *MONTHLY_TABLES]},
    )
    found: dict[str, set[date]] = {}
    for parent, name in rows:
        dates = found.setdefault(parent, set())
        fmt, digits = ("%Y%m", 6) if parent in MONTHLY_TABLES else ("%Y%m%d", 8)
        # A partition made by hand under another name is not ours to drop.
        if name is not None and (m := re.fullmatch(rf"{parent}_p(\d{{{digits}}})", name)):
            dates.add(datetime.strptime(m.group(1), fmt).date())
    return found


def _months(found: dict[str, set[date]]) -> set[date]:
    """Month starts with a partition in every monthly table."""
    months = [found[t] for t in MONTHLY_TABLES if t in found]
    return set.intersection(*months) if months else set()


def _complete(found: dict[str, set[date]]) -> set[date]:
    """Days with a partition in every daily table and, for their month, in every monthly table. A day that lacks one
    (a partition dropped by hand, say, or a monthly table newer than the day's partitions) counts as missing, so
    upkeep and the ingest path make the rest of it."""
    months = _months(found)
    days = set.intersection(*(found[t] for t in DAILY_TABLES if t in found))
    return {d for d in days if _month_start(d) in months}


def existing(conn: Connection) -> tuple[set[date], set[date]]:
    """Days that have a partition in every daily table (and their month in every monthly one), and months that have
    a partition in every monthly table."""
    found = _partitions(conn)
    return _complete(found), _months(found)


@dataclass(frozen=True)
class UpkeepResult:
    created_days: list[date]
    dropped: list[str]
    daily_deleted: int = 0  # rollups_daily rows of expired days


def upkeep(
    conn: Connection, *, now: datetime, raw_retention_days: int, rollup_retention_days: int, ahead_days: int
) -> UpkeepResult:
    """Make every day's partition from the retention horizon to `ahead_days` past today; drop expired ones,
    and delete the daily rollups of expired days.

    Past days inside retention get partitions too, so an agent replaying its spool after an outage finds
    somewhere to write. Runs in the caller's transaction, under an advisory lock.
    """
    if not conn.execute(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": _UPKEEP_LOCK}).scalar():
        return UpkeepResult([], [])
    today = now.astimezone(UTC).date()
    raw_horizon = now - timedelta(days=raw_retention_days)
    rollup_horizon = now - timedelta(days=rollup_retention_days)
    found = _partitions(conn)
    complete = _complete(found)
    created: list[date] = []
    day = raw_horizon.astimezone(UTC).date()
    while day <= today + timedelta(days=ahead_days):
        if day not in complete:
            create_day(conn, day, found.keys())
            created.append(day)
        day += timedelta(days=1)
    dropped: list[str] = []
    # Each daily table's own days, not only the complete ones: an expired partition goes whatever else exists.
    for table in DAILY_TABLES:
        for d in sorted(found.get(table, ())):
            if datetime.combine(d + timedelta(days=1), datetime.min.time(), UTC) <= raw_horizon:
                dropped.append(day_partition(table, d))
    for table in MONTHLY_TABLES:
        for m in sorted(found.get(table, ())):
            if datetime.combine(_next_month(m), datetime.min.time(), UTC) <= rollup_horizon:
                dropped.append(month_partition(table, m))
    for name in dropped:
        conn.execute(text(f"DROP TABLE IF EXISTS {name}"))
    if dropped:
        conn.execute(text("DELETE FROM ingest_batches WHERE received_at < :h"), {"h": raw_horizon})
    # rollups_daily is not partitioned (one row per device per day), so its expired days are deleted. A day
    # goes once it lies wholly before the horizon, as a samples partition does. The index on `day` keeps the
    # passes with nothing to delete cheap; about once a day one pass deletes a day of rows (one per device),
    # and autovacuum hands their space to the rows that arrive next.
    last = rollup_horizon - timedelta(days=1)
    daily_deleted = conn.execute(text("DELETE FROM rollups_daily WHERE day <= :last"), {"last": last}).rowcount
    # The per-instance rollups are small (one row per instance per hour or day) and go with the device rollups.
    conn.execute(text("DELETE FROM instance_rollups_daily WHERE day <= :last"), {"last": last})
    first_kept = datetime.combine(rollup_horizon.date(), datetime.min.time(), UTC)
    conn.execute(text("DELETE FROM instance_rollups_hourly WHERE hour < :h"), {"h": first_kept})
    conn.execute(text("DELETE FROM holder_rollups_daily WHERE day <= :last"), {"last": last})
    conn.execute(text("DELETE FROM holder_groups_daily WHERE day <= :last"), {"last": last})
    # A holder goes once no rollup can name it: its last hour lies before the oldest month partition kept. That
    # changes only when a month's partition goes, so only then is `holders` scanned (it has no index on last_seen,
    # which keeps the ingest path's updates HOT). Its rows in device_holders_now are older still; any row that old
    # is long stale, so all of them go.
    if any(name.startswith("holder_rollups_hourly_p") for name in dropped):
        oldest_month = datetime.combine(_month_start(rollup_horizon.astimezone(UTC).date()), datetime.min.time(), UTC)
        conn.execute(text("DELETE FROM device_holders_now WHERE ts < :m"), {"m": oldest_month})
        conn.execute(text("DELETE FROM holders WHERE last_seen < :m"), {"m": oldest_month})
    return UpkeepResult(created, dropped, daily_deleted)


class PartitionCache:
    """Days known to have a partition, so the ingest path asks the catalog only about new days."""

    def __init__(self) -> None:
        self._days: set[date] = set()
        self._lock = threading.Lock()

    def ensure(self, engine: Engine, days: set[date]) -> None:
        with self._lock:
            missing = days - self._days
        if not missing:
            return
        # Own short transaction: DDL inside the ingest transaction would block every other writer.
        with engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _UPKEEP_LOCK})
            found = _partitions(conn)
            for day in sorted(missing - _complete(found)):
                create_day(conn, day, found.keys())
        with self._lock:
            self._days |= missing

    def forget(self) -> None:
        with self._lock:
            self._days.clear()
