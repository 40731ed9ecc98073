"""Who holds each device: the processes a batch's samples refer to (docs/ingest-protocol.md, "Holders"), stored as
one row per process per instance (`holders`), what each held per device and UTC hour or day (`holder_rollups_hourly`,
`holder_rollups_daily`), the same per instance and value of each grouping by holder (app/store/holder_groups.py),
and each device's holders as of its newest sample (`device_holders_now`). See docs/storage.md, "Holders".

Written after `write_samples`, in the batch's transaction and in one round trip, only for a batch that has holders: a
batch without them costs nothing here. The holder rollups read the same new pieces (`ingest_piece`,
app/store/coverage.py) as the device rollups, so a holder's seconds are counted once exactly when its device's are: a
batch id seen before never gets here, and time already counted under another batch id adds nothing.

A device's seconds in an interval are split equally among the holders its sample lists: two processes on one GPU
for 10 s get 5 s each. Memory is each process's own, so `mem_mib_s` takes the whole seconds, not the share.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any, Protocol

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    ForeignKey,
    Identity,
    Integer,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, Session, mapped_column

from ..ingest.schemas import IngestBatchIn
from ..models import TZ, UTIL_BOUNDS, Base


class Holder(Base):
    """One process that held a device: known on its instance by its pid and start time, or, when the agent could
    not read the start, by its pid and executable name (`identity`). A later batch moves `last_seen` and fills what
    an earlier one left NULL (a pod name kubelet wrote after the process started); it never overwrites a value."""

    __tablename__ = "holders"
    # Every batch moves the last_seen of its holders. No index covers it, so with the free space fillfactor leaves on
    # each page those updates are HOT: no index entry per update. Retention scans the table instead, once a month.
    __table_args__ = (
        UniqueConstraint("instance_pk", "pid", "identity"),
        {"postgresql_with": {"fillfactor": 70}},
    )

    # Widest first, so no alignment padding between the fixed-width columns.
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    instance_pk: Mapped[int] = mapped_column(BigInteger, ForeignKey("instances.id", ondelete="CASCADE"))
    first_seen: Mapped[datetime] = mapped_column(TZ, comment="Start of the first interval it was seen in.")
    last_seen: Mapped[datetime] = mapped_column(TZ, comment="End of the last interval it was seen in.")
    started_at: Mapped[datetime | None] = mapped_column(TZ, comment="When the process started.")
    uid: Mapped[int | None] = mapped_column(BigInteger, comment="Real Unix user id.")
    pid: Mapped[int] = mapped_column(Integer, comment="Host process id.")
    identity: Mapped[str] = mapped_column(
        Text,
        comment="What tells the process apart from others of its pid: 'start:' and started_at in microseconds "
        "since 1970 when known, else 'exe:' and the executable name.",
    )
    executable: Mapped[str | None] = mapped_column(Text, comment="Executable name (/proc/<pid>/comm).")
    user_name: Mapped[str | None] = mapped_column(Text, comment="The host's name for uid.")
    container_id: Mapped[str | None] = mapped_column(Text, comment="Container id, from the cgroup.")
    pod_uid: Mapped[str | None] = mapped_column(Text, comment="Kubernetes pod UID, from the cgroup.")
    namespace: Mapped[str | None] = mapped_column(Text, comment="Kubernetes namespace.")
    pod: Mapped[str | None] = mapped_column(Text, comment="Kubernetes pod name.")
    job_id: Mapped[str | None] = mapped_column(Text, comment="Slurm job id.")
    job_step: Mapped[str | None] = mapped_column(Text, comment="Slurm job step.")
    command: Mapped[str | None] = mapped_column(Text, comment="Command line, arguments separated by spaces.")


DESCRIBED = (
    "executable",
    "user_name",
    "container_id",
    "pod_uid",
    "namespace",
    "pod",
    "job_id",
    "job_step",
    "command",
)
"""The text columns a batch describes, in the order write_holders passes them."""

SUMS = ("secs", "mem_known_s", "mem_mib_s", *[f"lt{b}_s" for b in UTIL_BOUNDS], "util_known_s", "util_sum")
"""The holder rollups' sum columns, in table order."""


def _holder_rollup_columns(time_name: str, time_comment: str) -> list[Column[Any]]:
    """Shared by the hourly and daily tables: a day's row is what its hours' rows add up to."""

    def seconds(name: str, comment: str) -> Column[float]:
        return Column(name, Float, nullable=False, server_default=text("0"), comment=comment)

    return [
        Column(time_name, TZ, nullable=False, comment=time_comment),
        Column("holder_id", BigInteger, nullable=False, comment="holders.id"),
        Column("device_id", Integer, nullable=False),
        Column("mem_max_mib", Integer, comment="Most memory the holder held on the device in one interval, MiB."),
        seconds("secs", "The holder's share of the device's seconds: each interval split equally among its holders."),
        seconds("mem_known_s", "Seconds (whole, not shared) with a memory figure for the holder."),
        seconds("mem_mib_s", "Sum of memory held x those seconds (MiB*s)."),
        *[
            seconds(f"lt{b}_s", f"Of secs, those with the device's utilization under {b}%: idle-held, s.")
            for b in UTIL_BOUNDS
        ],
        seconds("util_known_s", "Of secs, those with a utilization figure for the device, s."),
        seconds("util_sum", "The device's utilization x those seconds (%*s)."),
    ]


# Partitioned by month like rollups_hourly, with the same partitions and retention (app.store.partitions).
holder_rollups_hourly = Table(
    "holder_rollups_hourly",
    Base.metadata,
    *_holder_rollup_columns("hour", "Start of the UTC hour."),
    PrimaryKeyConstraint("hour", "device_id", "holder_id"),
    postgresql_partition_by="RANGE (hour)",
)
# Not partitioned, like rollups_daily: retention deletes old days. Rows are updated in place as batches arrive.
holder_rollups_daily = Table(
    "holder_rollups_daily",
    Base.metadata,
    *_holder_rollup_columns("day", "Start of the UTC day."),
    PrimaryKeyConstraint("day", "device_id", "holder_id"),
    postgresql_with={"fillfactor": 70},
)

# Each device's holders in its newest interval that listed any. A row is current while its `ts` is the device's
# newest sample (device_status.ts): a batch without holders writes nothing here, and its newer sample makes the
# older rows stale by that test alone. Rows are updated in place batch after batch; the free space keeps it HOT.
device_holders_now = Table(
    "device_holders_now",
    Base.metadata,
    Column("device_id", Integer, nullable=False),
    Column("holder_id", BigInteger, nullable=False, comment="holders.id"),
    Column("ts", TZ, nullable=False, comment="Start of the newest interval the holder was seen in on the device."),
    Column("since", TZ, nullable=False, comment="Start of the first interval the holder was seen in on the device."),
    Column("used_mib", Integer, comment="Memory held on the device in that newest interval, MiB."),
    PrimaryKeyConstraint("device_id", "holder_id"),
    postgresql_with={"fillfactor": 70},
)

_READY = "gpufleet_holders_ready"
"""Connection marker (app.db forgets it on rollback, which undoes the temporary tables too)."""
_DDL = (
    "CREATE TEMP TABLE IF NOT EXISTS ingest_holder_ref (ord int4 NOT NULL, slot int4 NOT NULL, used_mib int4, "
    "share float8 NOT NULL) ON COMMIT DELETE ROWS",
    "CREATE TEMP TABLE IF NOT EXISTS ingest_holder_map (slot int4 NOT NULL, holder_id int8 NOT NULL) "
    "ON COMMIT DELETE ROWS",
)
"""Per reference: the staged sample row's order (`ingest_stage.ord`), the holder's id in the batch (`slot`), the
memory it holds there, and its share of the row's seconds. Per slot: the `holders` row it is."""

_REFS_SQL = (
    "INSERT INTO ingest_holder_ref (ord, slot, used_mib, share) "
    "SELECT * FROM unnest(%(ord)b::int4[], %(slot)b::int4[], %(used)b::int4[], %(share)b::float8[])"
)

IDENTITY_SQL = (
    "CASE WHEN started_at IS NULL THEN 'exe:' || coalesce(executable, '') "
    "ELSE 'start:' || (extract(epoch FROM started_at) * 1000000)::int8 END"
)
"""`holders.identity` of a description with `started_at` and `executable`."""


def _holders_sql() -> str:
    """Upsert the batch's holders and map each slot to its row. Two descriptions of one process in a batch (the
    agent describes it again when, say, its pod name turns up) are one row. Seen times come from every staged row
    that refers to the holder, counted before or not. Rows are taken in key order, so two batches of one instance
    that meet lock them in the same order."""
    arrays = ", ".join(
        [
            "%(slot)b::int4[]",
            "%(instance_pk)b::int8[]",
            "%(pid)b::int4[]",
            "%(started_at)b::timestamptz[]",
            "%(uid)b::int8[]",
            *[f"%({c})b::text[]" for c in DESCRIBED],
        ]
    )
    columns = ", ".join(DESCRIBED)
    fill = ", ".join(f"{c} = coalesce(holders.{c}, excluded.{c})" for c in ("uid", *DESCRIBED))
    return (
        f"WITH d AS (SELECT * FROM unnest({arrays}) AS d(slot, instance_pk, pid, started_at, uid, {columns})), "
        f"k AS (SELECT d.*, {IDENTITY_SQL} AS identity FROM d), "
        "seen AS (SELECT r.slot, min(s.ts) AS first_seen, max(s.ts + s.dur * interval '1 second') AS last_seen "
        "FROM ingest_holder_ref r JOIN ingest_stage s ON s.ord = r.ord GROUP BY r.slot), "
        "u AS ("
        f"INSERT INTO holders (instance_pk, pid, identity, started_at, uid, {columns}, first_seen, last_seen) "
        "SELECT k.instance_pk, k.pid, k.identity, min(k.started_at), max(k.uid), "
        f"{', '.join(f'max(k.{c})' for c in DESCRIBED)}, min(seen.first_seen), max(seen.last_seen) "
        "FROM k JOIN seen ON seen.slot = k.slot GROUP BY 1, 2, 3 ORDER BY 1, 2, 3 "
        "ON CONFLICT (instance_pk, pid, identity) DO UPDATE SET "
        "first_seen = least(holders.first_seen, excluded.first_seen), "
        f"last_seen = greatest(holders.last_seen, excluded.last_seen), {fill} "
        "RETURNING id, instance_pk, pid, identity) "
        "INSERT INTO ingest_holder_map (slot, holder_id) "
        "SELECT k.slot, u.id FROM k JOIN u ON u.instance_pk = k.instance_pk AND u.pid = k.pid "
        "AND u.identity = k.identity"
    )


def _rollups_sql() -> str:
    """Fold the batch's new pieces of held devices into both holder rollup tables, in one statement: the hours' rows
    are made once and summed again per day. A device whose utilization is unknown counts in no `lt` column."""
    share = "p.new_s * r.share"
    exprs = {
        "mem_max_mib": "max(r.used_mib)",
        "secs": f"sum({share})",
        "mem_known_s": "sum(p.new_s) FILTER (WHERE r.used_mib IS NOT NULL)",
        "mem_mib_s": "sum(r.used_mib * p.new_s)",
        **{f"lt{b}_s": f"sum({share}) FILTER (WHERE p.util < {b})" for b in UTIL_BOUNDS},
        "util_known_s": f"sum({share}) FILTER (WHERE p.util IS NOT NULL)",
        "util_sum": f"sum({share} * p.util)",
    }
    names = [c.name for c in holder_rollups_hourly.c if c.name not in ("hour", "holder_id", "device_id")]
    hourly = ", ".join(f"coalesce({exprs[n]}, 0) AS {n}" if n in SUMS else f"{exprs[n]} AS {n}" for n in names)
    daily = ", ".join(f"sum({n})" if n in SUMS else f"max({n})" for n in names)

    def on_conflict(table: Table, time_column: str) -> str:
        updates = ", ".join(
            f"{n} = {table.name}.{n} + excluded.{n}" if n in SUMS else f"{n} = greatest({table.name}.{n}, excluded.{n})"
            for n in names
        )
        return f"ON CONFLICT ({time_column}, device_id, holder_id) DO UPDATE SET {updates}"

    columns = f"device_id, holder_id, {', '.join(names)}"
    return (
        f"WITH a AS (SELECT p.hour, p.device_id, m.holder_id, {hourly} FROM ingest_piece p "
        "JOIN ingest_holder_ref r ON r.ord = p.ord JOIN ingest_holder_map m ON m.slot = r.slot GROUP BY 1, 2, 3), "
        f"hourly AS (INSERT INTO {holder_rollups_hourly.name} (hour, {columns}) SELECT * FROM a "
        f"{on_conflict(holder_rollups_hourly, 'hour')}) "
        f"INSERT INTO {holder_rollups_daily.name} (day, {columns}) "
        f"SELECT date_trunc('day', hour), device_id, holder_id, {daily} FROM a GROUP BY 1, 2, 3 "
        f"{on_conflict(holder_rollups_daily, 'day')}"
    )


# Per device of the batch with new time, its newest piece's start (what device_status.ts becomes, when it is newer
# than what that holds); the holders of that piece's row become the device's rows, and its other rows go. A replayed
# older batch changes no current row: its rows are older than the device's newest sample, so readers skip them, and
# the device's next batch with holders deletes them.
_NOW_SQL = (
    "WITH newest AS (SELECT device_id, max(ts) AS ts FROM ingest_piece GROUP BY device_id), "
    "held AS (SELECT p.device_id, m.holder_id, max(r.used_mib) AS used_mib FROM ingest_piece p "
    "JOIN newest n ON n.device_id = p.device_id AND n.ts = p.ts JOIN ingest_holder_ref r ON r.ord = p.ord "
    "JOIN ingest_holder_map m ON m.slot = r.slot GROUP BY 1, 2), "
    "began AS (SELECT s.device_id, m.holder_id, min(s.ts) AS since FROM ingest_stage s "
    "JOIN ingest_holder_ref r ON r.ord = s.ord JOIN ingest_holder_map m ON m.slot = r.slot GROUP BY 1, 2), "
    "gone AS (DELETE FROM device_holders_now o USING newest n WHERE o.device_id = n.device_id AND o.ts < n.ts "
    "AND NOT EXISTS (SELECT FROM held h WHERE h.device_id = o.device_id AND h.holder_id = o.holder_id)) "
    "INSERT INTO device_holders_now (device_id, holder_id, ts, since, used_mib) "
    "SELECT h.device_id, h.holder_id, n.ts, f.since, h.used_mib FROM held h JOIN newest n ON n.device_id = h.device_id "
    "JOIN began f ON f.device_id = h.device_id AND f.holder_id = h.holder_id "
    "ON CONFLICT (device_id, holder_id) DO UPDATE SET ts = excluded.ts, used_mib = excluded.used_mib, "
    "since = least(device_holders_now.since, excluded.since) WHERE excluded.ts > device_holders_now.ts"
)


@lru_cache(maxsize=1)
def _statements() -> tuple[str, ...]:
    """Made on first use: app.store.holder_groups and this module import each other through app.models."""
    from . import holder_groups

    return (
        _REFS_SQL,
        _holders_sql(),
        _rollups_sql(),
        holder_groups.UPSERT,
        _NOW_SQL,
    )


@dataclass(frozen=True, slots=True)
class HolderRow:
    """One process as the write path takes it: `slot` is its number among the holders of one call (a batch's holder
    id), `instance_pk` the instance it runs on; the text columns are DESCRIBED's."""

    slot: int
    instance_pk: int
    pid: int
    started_at: datetime | None
    uid: int | None
    executable: str | None
    user_name: str | None
    container_id: str | None = None
    pod_uid: str | None = None
    namespace: str | None = None
    pod: str | None = None
    job_id: str | None = None
    job_step: str | None = None
    command: str | None = None

    @classmethod
    def of(cls, slot: int, instance_pk: int, h: Described, started_at: datetime | None) -> HolderRow:
        """The row of a process as a batch (HolderIn) or the agent (agent.collect.holders.Holder) describes it."""
        return cls(
            slot,
            instance_pk,
            h.pid,
            started_at,
            h.uid,
            h.executable,
            h.user,
            h.container_id,
            h.pod_uid,
            h.namespace,
            h.pod,
            h.job_id,
            h.job_step,
            h.command,
        )


class Described(Protocol):
    """What a process's description has, on the wire and in the agent alike."""

    @property
    def pid(self) -> int: ...
    @property
    def uid(self) -> int | None: ...
    @property
    def executable(self) -> str | None: ...
    @property
    def user(self) -> str | None: ...
    @property
    def container_id(self) -> str | None: ...
    @property
    def pod_uid(self) -> str | None: ...
    @property
    def namespace(self) -> str | None: ...
    @property
    def pod(self) -> str | None: ...
    @property
    def job_id(self) -> str | None: ...
    @property
    def job_step(self) -> str | None: ...
    @property
    def command(self) -> str | None: ...


@dataclass
class HolderRefs:
    """References from staged sample rows to holders, column by column: the row's place in the order write_samples
    staged the rows (`ord`), the holder's slot, the memory it holds there (MiB) and its share of the row's seconds."""

    ords: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    used_mib: list[int | None] = field(default_factory=list)
    shares: list[float] = field(default_factory=list)

    def add_sample(self, ord_: int, held: Sequence[tuple[int, int | None]]) -> None:
        """The (slot, used MiB) of every holder of one staged row; they share its seconds equally."""
        if not held:
            return
        share = 1.0 / len(held)
        for slot, used in held:
            self.ords.append(ord_)
            self.slots.append(slot)
            self.used_mib.append(used)
            self.shares.append(share)


def write_holders(session: Session, batch: IngestBatchIn, instance_pk: int) -> None:
    """Store the batch's holders (see store_holders). Call after write_samples, in the same transaction, with the
    batch's samples staged in the order it staged them (intervals, then samples).

    The batch must have passed app.ingest.parse.check_batch: holder ids unique, every reference naming one, none
    twice in a sample."""
    if not batch.holders:
        return
    refs = HolderRefs()
    order = 0
    for interval in batch.intervals:
        for sample in interval.samples:
            if sample.holders:
                refs.add_sample(order, [(r.ref, r.used_mib) for r in sample.holders])
            order += 1
    rows = [HolderRow.of(h.id, instance_pk, h, h.started_at) for h in batch.holders]
    store_holders(session, rows, refs)


def store_holders(session: Session, holders: Sequence[HolderRow], refs: HolderRefs) -> None:
    """Upsert `holders` and fold each holder's share of the new pieces of the rows that refer to it into the holder
    rollups and device_holders_now. Call after write_samples, in its transaction: `refs` name its staged rows. Slots
    are unique among `holders`, and every reference names one."""
    if not refs.ords:
        return
    described: dict[str, Any] = {
        "slot": [h.slot for h in holders],
        "instance_pk": [h.instance_pk for h in holders],
        "pid": [h.pid for h in holders],
        "started_at": [h.started_at for h in holders],
        "uid": [h.uid for h in holders],
        **{c: [getattr(h, c) for h in holders] for c in DESCRIBED},
    }
    refs_params = {"ord": refs.ords, "slot": refs.slots, "used": refs.used_mib, "share": refs.shares}
    statements = _statements()
    params = (refs_params, described, *[None] * (len(statements) - 2))
    dbapi: Any = session.connection().connection
    info = dbapi.info
    with dbapi.cursor() as cur:
        if not info.get(_READY):
            for ddl in _DDL:
                cur.execute(ddl)
            info[_READY] = True
        # One round trip; prepared, as the sample statements are: these take longer to plan than to run.
        with dbapi.pipeline():
            for statement, values in zip(statements, params, strict=True):
                cur.execute(statement, values, prepare=True)


@dataclass(frozen=True, slots=True)
class HeldNow:
    """One holder of a device as of the device's newest sample: memory it holds there (MiB, None when the driver
    hides it) and since when it has held the device (the start of the first interval it was seen in there)."""

    device_id: int
    holder_id: int
    pid: int
    executable: str | None
    uid: int | None
    user_name: str | None
    started_at: datetime | None
    container_id: str | None
    pod_uid: str | None
    namespace: str | None
    pod: str | None
    job_id: str | None
    job_step: str | None
    command: str | None
    used_mib: int | None
    since: datetime


# Two primary-key lookups per device: its status row, then its holder rows of that same newest interval.
HOLDERS_NOW_SQL = (
    "SELECT n.device_id, h.id, h.pid, h.executable, h.uid, h.user_name, h.started_at, h.container_id, h.pod_uid, "
    "h.namespace, h.pod, h.job_id, h.job_step, h.command, n.used_mib, n.since "
    "FROM device_status d JOIN device_holders_now n ON n.device_id = d.device_id AND n.ts = d.ts "
    "JOIN holders h ON h.id = n.holder_id WHERE d.device_id = ANY(CAST(:devices AS int4[])) "
    "ORDER BY n.device_id, n.used_mib DESC NULLS LAST, h.pid"
)


def holders_now(session: Session, device_ids: list[int]) -> dict[int, list[HeldNow]]:
    """Each device's holders as of its newest sample, most memory first; a device with none is left out."""
    out: dict[int, list[HeldNow]] = {}
    for row in session.execute(text(HOLDERS_NOW_SQL), {"devices": device_ids}):
        out.setdefault(row[0], []).append(HeldNow(*row))
    return out
