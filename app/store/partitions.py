"""Time partitions of the samples (daily) and rollups (monthly) tables: made ahead, dropped whole at retention.
The unpartitioned daily rollups lose their expired days in the same pass.

The server does this itself because the embedded PostgreSQL has no pg_partman or cron.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import Connection, Engine, text

SAMPLES_PREFIX = "samples_p"
ROLLUPS_PREFIX = "rollups_hourly_p"
_DAY = re.compile(r"^samples_p(\d{8})$")
_MONTH = re.compile(r"^rollups_hourly_p(\d{6})$")
# Any fixed number works; it only keeps two server processes from running upkeep at the same moment.
_UPKEEP_LOCK = 0x6770_7566


def _month_start(day: date) -> date:
    return day.replace(day=1)


def _next_month(month: date) -> date:
    return (month.replace(day=28) + timedelta(days=4)).replace(day=1)


def _utc(day: date) -> str:
    return f"{day.isoformat()} 00:00:00+00"


def samples_partition(day: date) -> str:
    return f"{SAMPLES_PREFIX}{day:%Y%m%d}"


def rollups_partition(month: date) -> str:
    return f"{ROLLUPS_PREFIX}{month:%Y%m}"


def create_day(conn: Connection, day: date) -> None:
    """The samples partition for one UTC day, and the rollups partition for its month."""
    conn.execute(
        text(
            f"CREATE TABLE IF NOT EXISTS {samples_partition(day)} PARTITION OF samples "
            f"FOR VALUES FROM ('{_utc(day)}') TO ('{_utc(day + timedelta(days=1))}')"
        )
    )
    month = _month_start(day)
    # Rollup rows are updated in place as data arrives; free space on each page keeps those updates HOT.
    conn.execute(
        text(
            f"CREATE TABLE IF NOT EXISTS {rollups_partition(month)} PARTITION OF rollups_hourly "
            f"FOR VALUES FROM ('{_utc(month)}') TO ('{_utc(_next_month(month))}') WITH (fillfactor = 70)"
        )
    )


def existing(conn: Connection) -> tuple[set[date], set[date]]:
    """Days that have a samples partition, and months that have a rollups partition."""
    rows = conn.execute(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname IN ('samples', 'rollups_hourly')"
        )
    ).scalars()
    days: set[date] = set()
    months: set[date] = set()
    for name in rows:
        if m := _DAY.match(name):
            days.add(datetime.strptime(m.group(1), "%Y%m%d").date())
        elif m := _MONTH.match(name):
            months.add(datetime.strptime(m.group(1), "%Y%m").date())
    return days, months


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
    days, months = existing(conn)
    created: list[date] = []
    day = raw_horizon.astimezone(UTC).date()
    while day <= today + timedelta(days=ahead_days):
        if day not in days:
            create_day(conn, day)
            created.append(day)
        day += timedelta(days=1)
    dropped: list[str] = []
    for d in sorted(days):
        if datetime.combine(d + timedelta(days=1), datetime.min.time(), UTC) <= raw_horizon:
            dropped.append(samples_partition(d))
    for m in sorted(months):
        if datetime.combine(_next_month(m), datetime.min.time(), UTC) <= rollup_horizon:
            dropped.append(rollups_partition(m))
    for name in dropped:
        conn.execute(text(f"DROP TABLE IF EXISTS {name}"))
    if dropped:
        conn.execute(text("DELETE FROM ingest_batches WHERE received_at < :h"), {"h": raw_horizon})
    # rollups_daily is not partitioned (one row per device per day), so its expired days are deleted. A day
    # goes once it lies wholly before the horizon, as a samples partition does. The index on `day` keeps the
    # passes with nothing to delete cheap; about once a day one pass deletes a day of rows (one per device),
    # and autovacuum hands their space to the rows that arrive next.
    daily_deleted = conn.execute(
        text("DELETE FROM rollups_daily WHERE day <= :last"), {"last": rollup_horizon - timedelta(days=1)}
    ).rowcount
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
            have, _months = existing(conn)
            for day in sorted(missing - have):
                create_day(conn, day)
        with self._lock:
            self._days |= missing

    def forget(self) -> None:
        with self._lock:
            self._days.clear()
