"""EC2 spot price history (docs/billing.md, "Spot price history"): what each spot pool (instance type and
availability zone, Linux/UNIX) cost per hour, read from EC2 `DescribeSpotPriceHistory` into `spot_prices`, with how
far each pool has been read in `spot_price_reads`.

`refresh_spot_prices` reads the pools the fleet's spot instances ran in: back `backfill_days` the first time, then
from where the last read ended. Each pool is read at most once an hour, in its own transaction; a failure backs that
pool off exponentially and is recorded, never raised. The read side is app/billing/spot_history.py.

AWS semantics relied on (EC2 API reference, DescribeSpotPriceHistory,
https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeSpotPriceHistory.html): the answer for a start
and end time holds the changes inside the range and also the last change before the start, the price in force at
the start; history goes back 90 days; the answer is paginated by NextToken. A price holds from its timestamp to the
next change, and a spot instance pays the price in force, by the second (AWS whitepaper "How Spot Instances Work",
https://docs.aws.amazon.com/whitepapers/latest/cost-optimization-leveraging-ec2-spot-instances/how-spot-instances-work.html).
The caller needs the IAM permission `ec2:DescribeSpotPriceHistory`, which takes no resource ARN (`"Resource": "*"`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    CredentialRetrievalError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
)
from sqlalchemy import Connection, Engine, and_, func, or_, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session, sessionmaker

from ..models import Instance
from .tables import spot_price_reads, spot_prices

log = logging.getLogger("gpufleet")

BACKFILL_DAYS = 90
"""How far back the first read of a pool goes, days: all the history EC2 keeps."""
REREAD_AFTER = timedelta(minutes=55)
"""A pool is read again once its last read is this old: every pass of an hourly schedule, whatever its jitter."""
BACKOFF_FIRST = timedelta(minutes=5)
"""Wait after a pool's first failed read; each further failure in a row doubles it..."""
BACKOFF_MAX = timedelta(hours=6)
"""...up to this."""
PRODUCT = "Linux/UNIX"
"""The product description asked for. Spot prices differ by operating system; the fleet's GPU hosts run Linux."""
PRODUCTS_ACCEPTED = frozenset({PRODUCT, "Linux/UNIX (Amazon VPC)"})
"""The labels under which an answer may give Linux/UNIX prices: the API knows both (its RIProductDescription type),
and moto answers with the VPC one."""
PAGE_SIZE = 1000
"""MaxResults per DescribeSpotPriceHistory call: the most EC2 allows."""
CONNECT_TIMEOUT_S = 3.0
"""Seconds to wait for a TCP connection to the EC2 endpoint."""
READ_TIMEOUT_S = 15.0
"""Seconds to wait for an answer once connected."""
ATTEMPTS = 3
"""Tries per API call, first one included; botocore's "standard" retry mode spaces them with jittered exponential
back-off and retries throttling, 5xx answers and connection errors only."""
ERROR_CHARS = 300
"""The most of an error message kept in `last_error` (an UnauthorizedOperation carries a long encoded message)."""
_LOCK = 0x7370_6F74
"""Advisory lock: one refresh at a time across server processes. Any fixed number works."""
# Error codes that say the region's request rate is spent: the region's other pools wait for the next pass.
# https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html
_THROTTLED = frozenset({"RequestLimitExceeded", "Throttling", "ThrottlingException"})
_SETUP_ERRORS = (NoCredentialsError, PartialCredentialsError, CredentialRetrievalError, NoRegionError)

ClientFactory = Callable[[str], Any]
"""Gives the EC2 client (boto3) of a region."""


class SpotPool(NamedTuple):
    """A spot pool as this module reads it: its Linux/UNIX prices are one series."""

    instance_type: str
    availability_zone: str


@dataclass
class SpotRefresh:
    """What one `refresh_spot_prices` pass did."""

    read: list[SpotPool] = field(default_factory=list)
    """Pools read to `now`."""
    stored: int = 0
    """Prices new to `spot_prices`."""
    failed: dict[SpotPool, str] = field(default_factory=dict)
    """Pools whose read failed, with why (one line)."""
    waiting: list[SpotPool] = field(default_factory=list)
    """Pools not asked: backing off after failures until their `next_try`."""
    skipped: list[SpotPool] = field(default_factory=list)
    """Pools due but not asked this pass: their region was throttled; they stay due."""
    unavailable: str | None = None
    """Why AWS could not be asked at all (no credentials, say); recorded on every due pool."""
    busy: bool = False
    """Another process was refreshing: nothing done."""


class _Due(NamedTuple):
    pool: SpotPool
    region: str
    read_until: datetime | None
    failures: int
    last_error: str | None


@dataclass(frozen=True)
class _Failure:
    """Why a read failed, in one line; `throttled` (the region's rate is spent) and `setup` (AWS cannot be asked
    at all) say what becomes of the pools not read yet."""

    reason: str
    throttled: bool = False
    setup: bool = False


def ec2_clients(
    *,
    attempts: int = ATTEMPTS,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    read_timeout_s: float = READ_TIMEOUT_S,
) -> ClientFactory:
    """EC2 clients, one per region, from one boto3 session and the standard credential chain (environment,
    shared config, container or instance role). A session per call of this function: boto3 sessions are not
    thread-safe, and credentials are looked up again each pass."""
    session = boto3.session.Session()
    config = Config(
        connect_timeout=connect_timeout_s,
        read_timeout=read_timeout_s,
        retries={"mode": "standard", "total_max_attempts": attempts},
    )
    clients: dict[str, Any] = {}

    def client_for_region(region: str) -> Any:
        if region not in clients:
            clients[region] = session.client("ec2", region_name=region, config=config)
        return clients[region]

    return client_for_region


def backoff(failures: int) -> timedelta:
    """How long a pool waits after `failures` failed reads in a row."""
    return min(BACKOFF_FIRST * (1 << min(max(failures - 1, 0), 16)), BACKOFF_MAX)


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= ERROR_CHARS else line[: ERROR_CHARS - 3] + "..."


def _failure(exc: BaseException) -> _Failure:
    """What went wrong, in one line: the AWS error code and message, or the client's own error."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code") or "")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        reason = f"{code or f'HTTP {status}'}: {error.get('Message') or exc}"
        return _Failure(_one_line(reason), throttled=code in _THROTTLED)
    if isinstance(exc, NoCredentialsError):
        return _Failure("no AWS credentials found (environment, shared config, container or instance role)", setup=True)
    return _Failure(_one_line(f"{type(exc).__name__}: {exc}"), setup=isinstance(exc, _SETUP_ERRORS))


def _utc(value: datetime) -> datetime:
    # botocore parses a timestamp without a zone as local time; EC2 always sends UTC.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def prices_from_answer(pool: SpotPool, entries: Iterable[Mapping[str, Any]]) -> dict[datetime, float]:
    """The Linux/UNIX prices of `pool` in DescribeSpotPriceHistory answer entries, by the time each took effect.
    Entries of other pools or products, and prices that are not finite non-negative numbers, are left out; of two
    labels for the same time, the plain "Linux/UNIX" one wins."""
    prices: dict[datetime, float] = {}
    exact: set[datetime] = set()
    for entry in entries:
        product = entry.get("ProductDescription")
        if product not in PRODUCTS_ACCEPTED:
            continue
        if entry.get("InstanceType") != pool.instance_type or entry.get("AvailabilityZone") != pool.availability_zone:
            continue
        when = entry.get("Timestamp")
        try:
            usd = float(entry.get("SpotPrice", ""))
        except (TypeError, ValueError):
            continue
        if not isinstance(when, datetime) or not math.isfinite(usd) or usd < 0:
            continue
        when = _utc(when)
        if when in exact:
            continue
        prices[when] = usd
        if product == PRODUCT:
            exact.add(when)
    return prices


def _read_pool(client: Any, pool: SpotPool, start: datetime, end: datetime) -> dict[datetime, float]:
    """Every price of `pool` in force from `start` to `end`, all pages. Raises what botocore raises."""
    pages: Iterator[Mapping[str, Any]] = client.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=[pool.instance_type],
        AvailabilityZone=pool.availability_zone,
        ProductDescriptions=[PRODUCT],
        StartTime=start,
        EndTime=end,
        PaginationConfig={"PageSize": PAGE_SIZE},
    )
    prices: dict[datetime, float] = {}
    for page in pages:
        prices.update(prices_from_answer(pool, page.get("SpotPriceHistory", [])))
    return prices


def _engine(db: Engine | sessionmaker[Session]) -> Engine:
    if isinstance(db, Engine):
        return db
    bind = db.kw.get("bind")
    assert isinstance(bind, Engine), "the sessionmaker must be bound to an engine"
    return bind


def _pools(conn: Connection, now: datetime, since: datetime) -> tuple[list[_Due], list[SpotPool]]:
    """The pools spot instances seen since `since` ran in, in region order: those due, and those backing off.
    Pools read less than REREAD_AFTER ago are neither."""
    zone = Instance.availability_zone
    # An instance without a region: its zone's, the zone's name less its letter (us-east-1a -> us-east-1).
    region = func.coalesce(func.nullif(Instance.region, ""), func.left(zone, func.length(zone) - 1))
    pools = (
        select(Instance.instance_type, zone.label("availability_zone"), func.max(region).label("region"))
        .where(
            Instance.lifecycle == "spot",
            Instance.last_seen >= since,
            Instance.instance_type.is_not(None),
            func.length(zone) > 1,
        )
        .group_by(Instance.instance_type, zone)
        .subquery()
    )
    r = spot_price_reads.c
    rows = conn.execute(
        select(pools, r.read_until, r.read_at, r.failures, r.next_try, r.last_error)
        .select_from(
            pools.outerjoin(
                spot_price_reads,
                and_(r.instance_type == pools.c.instance_type, r.availability_zone == pools.c.availability_zone),
            )
        )
        .where(or_(r.read_at.is_(None), r.read_at <= now - REREAD_AFTER, r.next_try > now))
        .order_by(pools.c.region, pools.c.instance_type, pools.c.availability_zone)
    ).all()
    due: list[_Due] = []
    waiting: list[SpotPool] = []
    for row in rows:
        pool = SpotPool(row.instance_type, row.availability_zone)
        if row.next_try is not None and row.next_try > now:
            waiting.append(pool)
        else:
            due.append(_Due(pool, row.region, row.read_until, row.failures or 0, row.last_error))
    return due, waiting


def _store(conn: Connection, pool: SpotPool, prices: Mapping[datetime, float], now: datetime) -> int:
    """Insert the prices not stored yet and mark the pool read to `now`; returns how many were new."""
    new = 0
    if prices:
        rows = [
            {
                "instance_type": pool.instance_type,
                "availability_zone": pool.availability_zone,
                "ts": ts,
                "usd_per_hour": usd,
            }
            for ts, usd in prices.items()
        ]
        stmt = insert(spot_prices).on_conflict_do_nothing().returning(spot_prices.c.ts)
        new = len(conn.execute(stmt, rows).all())
    done = {"read_until": now, "read_at": now, "failures": 0, "next_try": None, "last_error": None}
    conn.execute(
        insert(spot_price_reads)
        .values(instance_type=pool.instance_type, availability_zone=pool.availability_zone, **done)
        .on_conflict_do_update(index_elements=["instance_type", "availability_zone"], set_=done)
    )
    return new


def _record_failure(conn: Connection, due: _Due, reason: str, now: datetime) -> None:
    failures = due.failures + 1
    failed = {"failures": failures, "next_try": now + backoff(failures), "last_error": reason}
    conn.execute(
        insert(spot_price_reads)
        .values(instance_type=due.pool.instance_type, availability_zone=due.pool.availability_zone, **failed)
        .on_conflict_do_update(index_elements=["instance_type", "availability_zone"], set_=failed)
    )


@contextmanager
def _refresh_lock(engine: Engine) -> Iterator[bool]:
    # A connection of its own, outside any transaction, holds the lock while AWS is asked: no transaction stays
    # open across network calls.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        got = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": _LOCK}).scalar())
        try:
            yield got
        finally:
            if got:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _LOCK})


def refresh_spot_prices(
    db: Engine | sessionmaker[Session],
    *,
    now: datetime,
    backfill_days: int = BACKFILL_DAYS,
    client_for_region: ClientFactory | None = None,
) -> SpotRefresh:
    """Read the spot price history of every pool (instance type, zone) a spot instance seen in the last
    `backfill_days` ran in, up to `now` (UTC-aware), and store it.

    A pool is due when it is not backing off and was last read REREAD_AFTER ago or more (or never): call this as
    often as suits (every few minutes is fine), it asks AWS at most once an hour per pool. A pool is read from where
    its last read ended, or `backfill_days` back the first time, and stored in its own transaction. A failed read
    adds one to the pool's failures and backs it off (`backoff`), with the reason in `last_error`; a warning is
    logged when a pool's reason changes. Throttling leaves the region's remaining pools for the next pass; missing
    credentials stop the pass and are recorded on every due pool. AWS errors are never raised; database errors are.
    `client_for_region` defaults to `ec2_clients()`."""
    assert now.tzinfo is not None, "now must be timezone-aware"
    result = SpotRefresh()
    engine = _engine(db)
    horizon = now - timedelta(days=backfill_days)
    with _refresh_lock(engine) as got:
        if not got:
            result.busy = True
            return result
        with engine.connect() as conn:
            due, result.waiting = _pools(conn, now, horizon)
        if not due:
            return result
        clients = client_for_region or ec2_clients()
        throttled: set[str] = set()
        for index, pool in enumerate(due):
            if pool.region in throttled:
                result.skipped.append(pool.pool)
                continue
            # From where the last read ended: the answer starts with the price in force then, so a change EC2
            # published late, stamped before that, is still caught.
            start = max(pool.read_until or horizon, horizon)
            try:
                prices = _read_pool(clients(pool.region), pool.pool, start, now)
            except (BotoCoreError, ClientError) as exc:
                failure = _failure(exc)
                if failure.setup:
                    _give_up(engine, due[index:], failure.reason, now, result)
                    break
                _failed(engine, pool, failure.reason, now, result)
                if failure.throttled:
                    throttled.add(pool.region)
                continue
            with engine.begin() as conn:
                result.stored += _store(conn, pool.pool, prices, now)
            result.read.append(pool.pool)
            if pool.failures:
                log.info(
                    "spot prices of %s in %s: read again after %d failure(s)",
                    pool.pool.instance_type,
                    pool.pool.availability_zone,
                    pool.failures,
                )
    return result


def _failed(engine: Engine, pool: _Due, reason: str, now: datetime, result: SpotRefresh) -> None:
    """Record a failed read; warn when the pool's reason is new (not every pass while it lasts)."""
    with engine.begin() as conn:
        _record_failure(conn, pool, reason, now)
    result.failed[pool.pool] = reason
    if reason != pool.last_error:
        failures = pool.failures + 1
        log.warning(
            "spot prices of %s in %s: read failed (%d in a row), next try in %s: %s",
            pool.pool.instance_type,
            pool.pool.availability_zone,
            failures,
            backoff(failures),
            reason,
        )


def _give_up(engine: Engine, pools: Sequence[_Due], reason: str, now: datetime, result: SpotRefresh) -> None:
    """AWS cannot be asked at all: the same reason on every due pool, each backing off; one warning."""
    for pool in pools:
        with engine.begin() as conn:
            _record_failure(conn, pool, reason, now)
        result.failed[pool.pool] = reason
    result.unavailable = reason
    if any(pool.last_error != reason for pool in pools):
        log.warning("spot prices: cannot ask AWS (%d pool(s) waiting): %s", len(pools), reason)


# One query for both read functions: per pool, the newest price at or before the start and every change after it,
# each with the next change, cut at where the pool's history is known to be complete (read_until).
