"""The write path counts a device's time once: overlaps inside a batch and across batches are cut away, and the
stored coverage stays one range per hour for an agent whose intervals meet with millisecond jitter."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from app.db import session_scope
from app.store.samples import StageRow, Written, write_samples

DEVICE = 900101


def row(ts: datetime, dur: float, util: float = 0.0, device: int = DEVICE) -> StageRow:
    return (ts, device, dur, 100, util, None, 200, 40, 0, 1, None, None, None, None)


def hour_ago(hours: int = 3) -> datetime:
    return datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=hours)


def write(sessions: sessionmaker[Session], rows: list[StageRow]) -> Written:
    with session_scope(sessions) as s:
        return write_samples(s, rows, mem_held_mib=256)


def hourly(sessions: sessionmaker[Session]) -> list[tuple[datetime, float, float, int]]:
    """(hour, secs, util_max, ranges in covered) per hour of DEVICE."""
    with sessions() as s:
        return [
            (r.hour, r.secs, r.util_max, r.ranges)
            for r in s.execute(
                text(
                    "SELECT hour, secs, util_max, (SELECT count(*) FROM unnest(covered)) AS ranges "
                    "FROM rollups_hourly WHERE device_id = :d ORDER BY hour"
                ),
                {"d": DEVICE},
            )
        ]


def test_within_a_batch_the_earlier_start_then_the_first_row_counts(sessions: sessionmaker[Session]) -> None:
    t = hour_ago()
    # Same start: the first row in the batch counts, the second adds only what reaches past it.
    written = write(sessions, [row(t, 60.0, util=0.0), row(t, 90.0, util=80.0), row(t, 30.0, util=100.0)])
    assert written == Written(samples=2, covered_s=90.0, checked=0)
    assert hourly(sessions) == [(t, 90.0, 80.0, 1)]
    with sessions() as s:
        status = s.execute(text("SELECT busy_until_5, quiet_s_5 FROM device_status")).one()
    assert tuple(status) == (t + timedelta(seconds=90), 0.0)


def test_time_already_stored_is_cut_from_a_later_batch(sessions: sessionmaker[Session]) -> None:
    t = hour_ago()
    write(sessions, [row(t + timedelta(minutes=10), 600.0)])
    # Covers [t, t + 30 min): only the first 10 and the last 10 minutes are new.
    written = write(sessions, [row(t, 1800.0, util=50.0)])
    assert written == Written(samples=1, covered_s=600.0, checked=1)
    assert hourly(sessions) == [(t, 1800.0, 50.0, 1)]
    with sessions() as s:
        secs = s.execute(text("SELECT bucket, secs FROM rollups_5m ORDER BY bucket")).all()
    # The two new pieces start at t and t + 20 min.
    assert [(b.bucket, b.secs) for b in secs] == [(t + timedelta(minutes=m), 600.0) for m in (0, 10, 20)]


def test_jittered_intervals_keep_one_range_per_hour(sessions: sessionmaker[Session]) -> None:
    """Two hours of 10 s intervals whose starts wander a few milliseconds off the previous end, in 60 s batches."""
    rng = random.Random(5)
    t = hour_ago() + timedelta(seconds=0.25)
    rows: list[StageRow] = []
    for _ in range(720):
        dur = 10.0 + rng.uniform(-0.004, 0.004)
        rows.append(row(t, dur))
        t += timedelta(seconds=dur + rng.uniform(-0.003, 0.003))
    for n in range(0, len(rows), 6):
        write(sessions, rows[n : n + 6])
    hours = hourly(sessions)
    assert [h[3] for h in hours] == [1, 1, 1]
    assert all(h[1] <= 3600.0 for h in hours)
    # Overlaps are cut exactly; gaps stay uncounted, though closed in the coverage.
    assert sum(h[1] for h in hours) == pytest.approx(7200.0, abs=3.0)


def test_a_gap_under_a_second_counts_as_covered(sessions: sessionmaker[Session]) -> None:
    t = hour_ago()
    write(sessions, [row(t, 10.0), row(t + timedelta(seconds=10.6), 10.0), row(t + timedelta(seconds=22), 10.0)])
    with sessions() as s:
        ranges = s.execute(text("SELECT covered::text FROM rollups_hourly")).scalar_one()
    start = t.strftime("%Y-%m-%d %H:%M")
    assert ranges == f'{{["{start}:00+00","{start}:20.6+00"),["{start}:22+00","{start}:32+00")}}'
    # A row inside the closed gap is taken as counted; one in the open gap is not.
    assert write(sessions, [row(t + timedelta(seconds=10.1), 0.4)]).samples == 0
    assert write(sessions, [row(t + timedelta(seconds=20.6), 1.4)]).samples == 1
    assert hourly(sessions) == [(t, 31.4, 0.0, 1)]


def test_an_hour_written_before_coverage_was_kept_is_not_checked(sessions: sessionmaker[Session]) -> None:
    t = hour_ago()
    write(sessions, [row(t, 600.0)])
    with sessions() as s, s.begin():
        s.execute(text("UPDATE rollups_hourly SET covered = NULL"))
        s.execute(text("UPDATE device_status SET covered_from = NULL, covered_until = NULL"))
    # Counted again, as before migration 0008; from now on the hour records what it gets.
    assert write(sessions, [row(t, 600.0)]).samples == 1
    assert write(sessions, [row(t, 600.0)]).samples == 0
    assert hourly(sessions) == [(t, 1200.0, 0.0, 1)]


def covered_text(sessions: sessionmaker[Session], device: int) -> list[tuple[datetime, float, str]]:
    with sessions() as s:
        return [
            (r.hour, r.secs, r.covered)
            for r in s.execute(
                text("SELECT hour, secs, covered::text AS covered FROM rollups_hourly WHERE device_id = :d ORDER BY 1"),
                {"d": device},
            )
        ]


def test_in_order_batches_take_the_fast_path_and_earlier_time_is_checked(sessions: sessionmaker[Session]) -> None:
    """An agent's batches, in order with millisecond jitter, are cut without a look at the stored coverage; a batch
    that carries earlier time is checked against it and trimmed."""
    rng = random.Random(11)
    t = hour_ago() + timedelta(minutes=59, seconds=20)  # the batches cross an hour
    rows: list[StageRow] = []
    for _ in range(24):
        dur = 10.0 + rng.uniform(-0.004, 0.004)
        rows.append(row(t, dur))
        rows.append(row(t, dur, device=DEVICE + 1))
        t += timedelta(seconds=dur + rng.uniform(-0.003, 0.003))
    batches = [rows[n : n + 12] for n in range(0, len(rows), 12)]
    assert [write(sessions, b).checked for b in batches] == [0, 0, 0, 0]
    # The second batch again, under another id: every row starts before the stretch known to be covered.
    again = write(sessions, batches[1])
    assert again == Written(samples=0, covered_s=pytest.approx(sum(r[2] for r in batches[1])), checked=12)
    # One row reaching back into a gap left open, one new row after the end: only the first is checked.
    end = t
    open_gap = [row(end + timedelta(seconds=5), 5.0), row(end + timedelta(seconds=20), 10.0)]
    written = write(sessions, [*open_gap, row(end - timedelta(seconds=30), 10.0)])
    assert written.checked == 3  # a batch out of order is checked whole
    assert written.samples == 2
    assert write(sessions, [row(end + timedelta(seconds=2), 4.0), row(end + timedelta(seconds=40), 5.0)]).checked == 1
    hours = hourly(sessions)
    assert [h[3] for h in hours] == [1, 4]
    assert sum(h[1] for h in hours) == pytest.approx(24 * 10.0 + 5.0 + 10.0 + 3.0 + 5.0, abs=0.2)


def test_a_longer_interval_that_ends_later_keeps_the_end_of_the_covered_time(sessions: sessionmaker[Session]) -> None:
    t = hour_ago()
    # The second row starts later but ends earlier: the device's time is counted up to t + 600 s, not t + 120 s.
    assert write(sessions, [row(t, 600.0), row(t + timedelta(seconds=60), 60.0)]) == Written(
        samples=1, covered_s=60.0, checked=0
    )
    written = write(sessions, [row(t + timedelta(seconds=300), 400.0)])
    assert written == Written(samples=1, covered_s=300.0, checked=0)
    assert hourly(sessions) == [(t, 700.0, 0.0, 1)]
    with sessions() as s:
        stretch = s.execute(text("SELECT covered_from, covered_until FROM device_status")).one()
    assert tuple(stretch) == (t + timedelta(seconds=300), t + timedelta(seconds=700))


def test_the_fast_path_cuts_where_the_check_would(sessions: sessionmaker[Session]) -> None:
    """The same intervals for two devices, one device's batches in order (fast path), the other's each reversed
    (checked whole): every table ends up the same."""
    rng = random.Random(7)
    t = hour_ago() + timedelta(minutes=50)
    fast: list[StageRow] = []
    for n in range(180):
        dur = rng.choice([10.0 + rng.uniform(-0.004, 0.004), 10.0, 2.5, 25.0, 0.3])
        fast.append(row(t, dur, util=float(n % 7), device=DEVICE))
        # Gaps and overlaps of every kind: milliseconds, under and over a second, and whole intervals.
        t += timedelta(seconds=dur + rng.choice([0.0, -0.002, 0.003, 0.6, 1.5, -min(dur / 2, 3.0), 40.0]))
    batches = [fast[n : n + 9] for n in range(0, len(fast), 9)]
    # Some time sent again under another id, and a batch with one row that starts before its neighbour.
    batches.insert(7, batches[5][3:])
    batches[12] = [batches[12][1], batches[12][0], *batches[12][2:]]
    checked = [write(sessions, b).checked for b in batches]
    for b in batches:
        write(sessions, [(*r[:1], DEVICE + 1, *r[2:]) for r in reversed(b)])
    assert checked.count(0) >= len(batches) - 4
    a, b = covered_text(sessions, DEVICE), covered_text(sessions, DEVICE + 1)
    assert [(h, c) for h, _, c in a] == [(h, c) for h, _, c in b]
    assert [s for _, s, _ in a] == pytest.approx([s for _, s, _ in b], abs=1e-6)
    with sessions() as s:
        per_device = [
            tuple(r)
            for r in s.execute(
                text(
                    "SELECT (SELECT count(*) FROM samples x WHERE x.device_id = d.device_id), "
                    "(SELECT round(sum(secs)::numeric, 6) FROM rollups_5m x WHERE x.device_id = d.device_id), "
                    "(SELECT round(sum(secs)::numeric, 6) FROM rollups_daily x WHERE x.device_id = d.device_id), "
                    "ts, dur, busy_until_5, round(quiet_s_5::numeric, 6), covered_until "
                    "FROM device_status d WHERE device_id IN (:a, :b) ORDER BY device_id"
                ),
                {"a": DEVICE, "b": DEVICE + 1},
            )
        ]
    assert per_device[0] == per_device[1]
