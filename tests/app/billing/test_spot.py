"""EC2 spot price history: reading DescribeSpotPriceHistory (through the local AWS server, tests/spot_history.py)
into spot_prices, backing off on errors, and the prices in force over a range."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import Engine, event, insert, select, text
from sqlalchemy.orm import Session, sessionmaker

from app.billing import spot
from app.billing.spot import BACKOFF_MAX, SpotPool, backoff, ec2_clients, prices_from_answer, refresh_spot_prices
from app.billing.spot_history import PriceSegment, spot_price_segments
from app.billing.tables import spot_price_reads, spot_prices
from app.models import Instance

if TYPE_CHECKING:
    from tests.spot_history import SpotHistory

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
P4D = SpotPool("p4d.24xlarge", "us-east-1a")
_ids = iter(range(1, 1_000_000))


def add_instance(
    sessions: sessionmaker[Session],
    pool: SpotPool,
    *,
    lifecycle: str = "spot",
    region: str | None = "us-east-1",
    last_seen: datetime = NOW - timedelta(hours=1),
) -> None:
    with sessions.begin() as s:
        s.add(
            Instance(
                instance_id=f"i-{next(_ids):017x}",
                instance_type=pool.instance_type,
                availability_zone=pool.availability_zone,
                region=region,
                lifecycle=lifecycle,
                first_seen=last_seen - timedelta(days=1),
                last_seen=last_seen,
            )
        )


def stored(engine: Engine, pool: SpotPool = P4D) -> list[tuple[datetime, float]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(spot_prices.c.ts, spot_prices.c.usd_per_hour)
            .where(
                spot_prices.c.instance_type == pool.instance_type,
                spot_prices.c.availability_zone == pool.availability_zone,
            )
            .order_by(spot_prices.c.ts)
        ).all()
    return [(r.ts, r.usd_per_hour) for r in rows]


def read_state(engine: Engine, pool: SpotPool = P4D) -> dict[str, Any] | None:
    with engine.connect() as conn:
        row = (
            conn.execute(
                select(spot_price_reads).where(
                    spot_price_reads.c.instance_type == pool.instance_type,
                    spot_price_reads.c.availability_zone == pool.availability_zone,
                )
            )
            .mappings()
            .first()
        )
    return dict(row) if row else None


def one_try() -> spot.ClientFactory:
    """Clients that do not retry: one seeded fault fails one read."""
    return ec2_clients(attempts=1)


# --- reading ------------------------------------------------------------------------------------------------------


def test_first_read_backfills_90_days_with_the_price_in_force_at_the_start(
    engine: Engine, sessions: sessionmaker[Session], spot_history: SpotHistory
) -> None:
    add_instance(sessions, P4D)
    spot_history.seed(
        [
            ("p4d.24xlarge", "us-east-1a", NOW - timedelta(days=120), 9.0),  # superseded before the start
            ("p4d.24xlarge", "us-east-1a", NOW - timedelta(days=100), 10.5),  # in force 90 days back
            ("p4d.24xlarge", "us-east-1a", NOW - timedelta(days=60), 11.25),
            ("p4d.24xlarge", "us-east-1a", NOW - timedelta(days=1), 12.0),
            ("p4d.24xlarge", "us-east-1a", NOW + timedelta(hours=1), 13.0),  # after the end
            ("p4d.24xlarge", "us-east-1b", NOW - timedelta(days=2), 8.0),  # another zone
            ("p5.48xlarge", "us-east-1a", NOW - timedelta(days=2), 30.0),  # another type
        ]
    )
    spot_history.add("p4d.24xlarge", "us-east-1a", NOW - timedelta(days=3), 40.0, product="Windows")

    result = refresh_spot_prices(engine, now=NOW)

    assert result.read == [P4D]
    assert result.stored == 3
    assert not result.failed and not result.waiting and result.unavailable is None
    assert stored(engine) == [
        (NOW - timedelta(days=100), 10.5),
        (NOW - timedelta(days=60), 11.25),
        (NOW - timedelta(days=1), 12.0),
    ]
    state = read_state(engine)
    assert state is not None
    assert (state["read_until"], state["read_at"], state["failures"], state["next_try"], state["last_error"]) == (
        NOW,
        NOW,
        0,
        None,
        None,
    )
    [call] = spot_history.calls
    assert (call.region, call.instance_types, call.availability_zone, call.products) == (
        "us-east-1",
        ("p4d.24xlarge",),
        "us-east-1a",
        ("Linux/UNIX",),
    )
    assert (call.start, call.end) == (NOW - timedelta(days=90), NOW)


def test_later_read_asks_only_from_read_until_and_not_within_the_hour(
    engine: Engine, sessions: sessionmaker[Session], spot_history: SpotHistory
) -> None:
    add_instance(sessions, P4D)
    spot_history.add(*P4D, NOW - timedelta(days=5), 10.0)
    assert refresh_spot_prices(engine, now=NOW).stored == 1

    # Read 30 minutes ago: not due, AWS not asked.
    assert refresh_spot_prices(engine, now=NOW + timedelta(minutes=30)).read == []
    assert len(spot_history.calls) == 1

    spot_history.add(*P4D, NOW + timedelta(minutes=20), 10.75)
    later = NOW + timedelta(hours=1)
    result = refresh_spot_prices(engine, now=later)

    assert result.read == [P4D]
    assert result.stored == 1  # the price in force at the start comes again, and is stored once
    assert spot_history.calls[-1].start == NOW
    assert spot_history.calls[-1].end == later
    assert stored(engine) == [(NOW - timedelta(days=5), 10.0), (NOW + timedelta(minutes=20), 10.75)]
    state = read_state(engine)
    assert state is not None and state["read_until"] == later


def test_reads_every_page(engine: Engine, sessions: sessionmaker[Session], spot_history: SpotHistory) -> None:
    add_instance(sessions, P4D)
    # A price change every hour for 89 days: more than two pages of 1000.
    changes = [(NOW - timedelta(days=89) + timedelta(hours=h), round(10 + (h % 97) / 100, 2)) for h in range(2136)]
    spot_history.seed((*P4D, ts, usd) for ts, usd in changes)

    result = refresh_spot_prices(engine, now=NOW)

    assert result.stored == len(changes)
    assert stored(engine) == changes
    assert [(c.next_token, c.answered) for c in spot_history.calls] == [(None, 1000), ("1000", 1000), ("2000", 136)]
    assert {c.max_results for c in spot_history.calls} == {1000}


def test_only_pools_of_spot_instances_seen_lately_are_read(
    engine: Engine, sessions: sessionmaker[Session], spot_history: SpotHistory
) -> None:
    on_demand = SpotPool("g5.xlarge", "us-east-1b")
    on_prem = SpotPool("g6.xlarge", "us-east-1c")
    long_gone = SpotPool("g4dn.xlarge", "us-east-1d")
    no_region = SpotPool("g5.2xlarge", "us-west-2b")
    add_instance(sessions, P4D)
    add_instance(sessions, P4D)  # two instances, one pool
    add_instance(sessions, on_demand, lifecycle="on-demand")
    add_instance(sessions, on_prem, lifecycle="on-prem")
    add_instance(sessions, long_gone, last_seen=NOW - timedelta(days=91))
    add_instance(sessions, no_region, region=None)
    for pool in (P4D, on_demand, on_prem, long_gone, no_region):
        spot_history.add(*pool, NOW - timedelta(days=1), 1.0)

    result = refresh_spot_prices(engine, now=NOW)

    assert sorted(result.read) == sorted([P4D, no_region])
    asked = {(c.region, c.instance_types, c.availability_zone) for c in spot_history.calls}
    assert asked == {("us-east-1", ("p4d.24xlarge",), "us-east-1a"), ("us-west-2", ("g5.2xlarge",), "us-west-2b")}
    with engine.connect() as conn:
        pools = conn.execute(select(spot_price_reads.c.instance_type, spot_price_reads.c.availability_zone)).all()
    assert sorted(SpotPool(*p) for p in pools) == sorted([P4D, no_region])


def test_answer_parsing_keeps_the_pools_linux_prices() -> None:
    t = datetime(2026, 11, 1, tzinfo=UTC)

    def entry(product: str, price: str, ts: datetime, zone: str = "us-east-1a") -> dict[str, Any]:
        return {
            "InstanceType": "p4d.24xlarge",
            "AvailabilityZone": zone,
            "ProductDescription": product,
            "SpotPrice": price,
            "Timestamp": ts,
        }

    entries = [
        entry("Linux/UNIX (Amazon VPC)", "9.000000", t),
        entry("Linux/UNIX", "10.000000", t),  # the plain label wins over the VPC one at the same time
        entry("Linux/UNIX (Amazon VPC)", "11.000000", t + timedelta(hours=1)),
        entry("Windows", "20.000000", t + timedelta(hours=2)),
        entry("Linux/UNIX", "5.000000", t + timedelta(hours=3), zone="us-east-1b"),
        entry("Linux/UNIX", "n/a", t + timedelta(hours=4)),
        entry("Linux/UNIX", "12.5", datetime(2026, 11, 1, 5)),  # no zone: UTC
    ]
    assert prices_from_answer(P4D, entries) == {t: 10.0, t + timedelta(hours=1): 11.0, t + timedelta(hours=5): 12.5}


# --- errors -------------------------------------------------------------------------------------------------------


def test_backoff_doubles_from_5_minutes_up_to_6_hours() -> None:
    assert [backoff(n) for n in (1, 2, 3, 7)] == [timedelta(minutes=m) for m in (5, 10, 20, 320)]
    assert backoff(8) == backoff(1000) == BACKOFF_MAX == timedelta(hours=6)


def test_throttling_backs_off_then_the_read_completes(
    engine: Engine, sessions: sessionmaker[Session], spot_history: SpotHistory
) -> None:
    add_instance(sessions, P4D)
    spot_history.add(*P4D, NOW - timedelta(days=1), 10.0)
    spot_history.fail_next(1, "throttle")

    result = refresh_spot_prices(engine, now=NOW, client_for_region=one_try())

    assert result.read == [] and list(result.failed) == [P4D]
    assert result.failed[P4D].startswith("RequestLimitExceeded: ")
    state = read_state(engine)
    assert state is not None
    assert (state["failures"], state["next_try"], state["read_until"]) == (1, NOW + timedelta(minutes=5), None)
    assert state["last_error"] == result.failed[P4D]
    assert stored(engine) == []

    # Backing off: not asked before next_try.
    calls = len(spot_history.calls)
    result = refresh_spot_prices(engine, now=NOW + timedelta(minutes=4), client_for_region=one_try())
    assert result.waiting == [P4D] and result.read == [] and len(spot_history.calls) == calls

    # Throttled again: the wait doubles.
    spot_history.fail_next(1, "throttle")
    refresh_spot_prices(engine, now=NOW + timedelta(minutes=5), client_for_region=one_try())
    state = read_state(engine)
    assert state is not None
    assert (state["failures"], state["next_try"]) == (2, NOW + timedelta(minutes=15))

    then = NOW + timedelta(minutes=15)
    result = refresh_spot_prices(engine, now=then, client_for_region=one_try())

    assert result.read == [P4D] and not result.failed
    assert spot_history.calls[-1].start == then - timedelta(days=90)  # nothing was read before: still the backfill
    assert stored(engine) == [(NOW - timedelta(days=1), 10.0)]
    state = read_state(engine)
    assert state is not None
    assert (state["failures"], state["next_try"], state["last_error"], state["read_until"]) == (0, None, None, then)


def test_a_throttled_region_leaves_its_other_pools_for_the_next_pass(
    engine: Engine, sessions: sessionmaker[Session], spot_history: SpotHistory
) -> None:
    other = SpotPool("p5.48xlarge", "us-east-1b")
    elsewhere = SpotPool("p5.48xlarge", "us-west-2a")
    for pool in (P4D, other, elsewhere):
        add_instance(sessions, pool, region=None)
        spot_history.add(*pool, NOW - timedelta(days=1), 10.0)
    spot_history.fail_next(1, "throttle")

    result = refresh_spot_prices(engine, now=NOW, client_for_region=one_try())

    # Pools are read by region, then type: us-east-1's p4d (throttled), its p5 (skipped), then us-west-2's.
    assert result.read == [elsewhere]
    assert list(result.failed) == [P4D]
    assert result.skipped == [other]
    assert read_state(engine, other) is None  # still due
    assert refresh_spot_prices(engine, now=NOW + timedelta(minutes=1), client_for_region=one_try()).read == [other]


def test_the_sdk_retries_a_throttled_call_itself(
    engine: Engine, sessions: sessionmaker[Session], spot_history: SpotHistory
) -> None:
    add_instance(sessions, P4D)
    spot_history.add(*P4D, NOW - timedelta(days=1), 10.0)
    spot_history.fail_next(1, "throttle")

    result = refresh_spot_prices(engine, now=NOW)  # the default clients: standard retry mode

    assert result.read == [P4D]
    assert [c.fault for c in spot_history.calls] == ["throttle", None]


def test_unauthorized_gives_one_line_and_one_warning(
    engine: Engine,
    sessions: sessionmaker[Session],
    spot_history: SpotHistory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    add_instance(sessions, P4D)
    spot_history.fail_next(2, "unauthorized")

    with caplog.at_level(logging.WARNING, logger="gpufleet"):
        first = refresh_spot_prices(engine, now=NOW)
        again = refresh_spot_prices(engine, now=NOW + timedelta(minutes=5))

    reason = "UnauthorizedOperation: You are not authorized to perform this operation (injected by the test)."
    assert first.failed == again.failed == {P4D: reason}
    assert [c.fault for c in spot_history.calls] == ["unauthorized", "unauthorized"]  # not retried by the SDK
    state = read_state(engine)
    assert state is not None
    assert (state["failures"], state["last_error"]) == (2, reason)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "p4d.24xlarge" in warnings[0] and reason in warnings[0]


def test_server_errors_are_retried_then_recorded(
    engine: Engine, sessions: sessionmaker[Session], spot_history: SpotHistory
) -> None:
    add_instance(sessions, P4D)
    spot_history.fail_next(3, "server-error")

    result = refresh_spot_prices(engine, now=NOW)

    assert result.failed[P4D].startswith("InternalError: The service had an internal error")
    assert spot_history.faults_left == 0  # three attempts
    state = read_state(engine)
    assert state is not None and state["failures"] == 1


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_a_down_endpoint_gives_one_line_and_no_exception(
    engine: Engine, sessions: sessionmaker[Session], spot_history: SpotHistory, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_instance(sessions, P4D)
    url = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)

    result = refresh_spot_prices(engine, now=NOW)

    reason = result.failed[P4D]
    assert reason.startswith("EndpointConnectionError: ") and url in reason and "\n" not in reason
    state = read_state(engine)
    assert state is not None and (state["failures"], state["last_error"]) == (1, reason)
    assert spot_history.calls == []


def test_without_credentials_no_pool_is_asked(
    engine: Engine,
    sessions: sessionmaker[Session],
    spot_history: SpotHistory,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
) -> None:
    other = SpotPool("p5.48xlarge", "us-west-2a")
    add_instance(sessions, P4D)
    add_instance(sessions, other, region="us-west-2")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")

    result = refresh_spot_prices(engine, now=NOW)

    assert result.unavailable is not None and result.unavailable.startswith("no AWS credentials found")
    assert result.failed == {P4D: result.unavailable, other: result.unavailable}
    assert spot_history.calls == []
    for pool in (P4D, other):
        state = read_state(engine, pool)
        assert state is not None
        assert (state["failures"], state["next_try"]) == (1, NOW + timedelta(minutes=5))
    # Backing off: the next pass within 5 minutes does not look for credentials again.
    assert refresh_spot_prices(engine, now=NOW + timedelta(minutes=1)).waiting == sorted([P4D, other])


def test_one_refresh_at_a_time(engine: Engine, sessions: sessionmaker[Session], spot_history: SpotHistory) -> None:
    add_instance(sessions, P4D)
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": spot._LOCK})
        try:
            result = refresh_spot_prices(engine, now=NOW)
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": spot._LOCK})
            conn.commit()
    assert result.busy and result.read == [] and spot_history.calls == []
    assert refresh_spot_prices(sessions, now=NOW).read == [P4D]  # a sessionmaker does as well as an engine


# --- prices over a range ------------------------------------------------------------------------------------------

H0 = datetime(2026, 11, 18, 10, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)
HOUR = timedelta(hours=1)
BOUNDED = SpotPool("p5.48xlarge", "us-east-1a")
LATE = SpotPool("g5.xlarge", "us-east-1a")
NONE = SpotPool("g6.xlarge", "us-east-1a")


@pytest.fixture
def history(engine: Engine) -> None:
    prices = [
        (P4D, H0 - 5 * HOUR, 9.0),  # superseded before the range
        (P4D, H0 - 2 * HOUR, 1.0),  # in force at the start
        (P4D, H0 + 15 * MIN, 2.5),  # a change inside the first hour
        (P4D, H0 + 45 * MIN, 2.5),  # the same price again: merged
        (P4D, H0 + 2 * HOUR, 0.5),
        (P4D, H0 + 5 * HOUR, 7.0),  # after the range
        (BOUNDED, H0 - 24 * HOUR, 3.0),
        (LATE, H0 + 30 * MIN, 4.0),  # history starts inside the range
    ]
    reads = [(P4D, H0 + 6 * HOUR), (BOUNDED, H0 + 2 * HOUR + 30 * MIN), (LATE, H0 + 6 * HOUR)]
    with engine.begin() as conn:
        conn.execute(
            insert(spot_prices),
            [
                {"instance_type": p[0], "availability_zone": p[1], "ts": ts, "usd_per_hour": usd}
                for p, ts, usd in prices
            ],
        )
        conn.execute(
            insert(spot_price_reads),
            [
                {"instance_type": p[0], "availability_zone": p[1], "read_until": until, "read_at": until}
                for p, until in reads
            ],
        )


@pytest.fixture
def statements(engine: Engine) -> Iterator[list[str]]:
    seen: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    yield seen
    event.remove(engine, "before_cursor_execute", count)


@pytest.mark.usefixtures("history")
def test_segments_cover_the_range_from_the_price_in_force(session: Session, statements: list[str]) -> None:
    segments = spot_price_segments(session, [P4D, BOUNDED, LATE, NONE], H0, H0 + 3 * HOUR)

    assert len(statements) == 1
    assert segments == {
        P4D: [
            PriceSegment(H0, H0 + 15 * MIN, 1.0),
            PriceSegment(H0 + 15 * MIN, H0 + 2 * HOUR, 2.5),
            PriceSegment(H0 + 2 * HOUR, H0 + 3 * HOUR, 0.5),
        ],
        # Known only up to its read_until.
        BOUNDED: [PriceSegment(H0, H0 + 2 * HOUR + 30 * MIN, 3.0)],
        LATE: [PriceSegment(H0 + 30 * MIN, H0 + 3 * HOUR, 4.0)],
        NONE: [],
    }
