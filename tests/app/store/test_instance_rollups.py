"""Per-instance rollups: the ingest path folds each batch's new seconds into them, weighed as the window analysis
weighs each device, and migration 0010's back-fill gives the same rows from the device rollups."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, text

from app.store.instance_rollups import DEVICE_WEIGHTS_SQL, WEIGHED
from tests.factories import gpu, mig_slice, unsized_slice
from tests.feeding import Feeder, busy, held, idle, unknown

ROWS = f"SELECT hour, instance_pk, {', '.join(WEIGHED)} FROM instance_rollups_hourly ORDER BY 1, 2"
DAILY = f"SELECT day, instance_pk, {', '.join(WEIGHED)} FROM instance_rollups_daily ORDER BY 1, 2"
# Migration 0010's back-fill, as a query over the device rollups.
FROM_DEVICES = (
    "SELECT x.hour, r.instance_pk, sum(x.secs * r.w), sum(x.util_known_s * r.w), "
    + ", ".join(f"sum(x.util_lt{b}_s * r.w)" for b in (1, 5, 10, 25, 50))
    + ", "
    + ", ".join(f"sum(x.free_lt{b}_s * r.w)" for b in (1, 5, 10, 25, 50))
    + f", sum(x.secs * r.cap), sum(x.secs * r.sliced), sum(x.secs * r.own) FROM rollups_hourly x "
    f"JOIN ({DEVICE_WEIGHTS_SQL}) r ON r.device_id = x.device_id GROUP BY 1, 2 ORDER BY 1, 2"
)


def rows(engine: Engine, sql: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(zip(["t", "instance", *WEIGHED], r, strict=True)) for r in conn.execute(text(sql))]


def test_weighed_as_the_analysis_weighs(feeder: Feeder, engine: Engine) -> None:
    t0 = feeder.t0
    node = [
        gpu(0, uid="GPU-p"),
        gpu(1, uid="GPU-m", mig=True, slices=[mig_slice(1, "3g.20gb", uid="MIG-3g")], unpartitioned=4),
    ]
    feeder.feed(node, start=t0, hours=1, fn={"GPU-p": busy(60), "GPU-m": unknown, "MIG-3g": held})
    [hour] = rows(engine, ROWS)
    w = 3 / 7
    assert hour["secs_w"] == pytest.approx(3600 + 3600 * w)  # the passthrough GPU, and the slice at 3/7
    assert hour["known_w"] == pytest.approx(3600 + 3600 * w)
    assert hour["lt5_w"] == pytest.approx(3600 * w) and hour["free5_w"] == pytest.approx(0)  # held: not free
    assert hour["cap_s"] == pytest.approx(3600) and hour["sliced_w"] == pytest.approx(3600 * w)
    assert hour["gpu_s"] == pytest.approx(7200)
    [day] = rows(engine, DAILY)
    assert {k: v for k, v in day.items() if k != "t"} == pytest.approx({k: v for k, v in hour.items() if k != "t"})


def test_an_unsized_slice_leaves_the_layout_unknown(feeder: Feeder, engine: Engine) -> None:
    g = gpu(0, mig=True, slices=[mig_slice(1, "3g.20gb"), unsized_slice(2)], unpartitioned=2)
    feeder.feed([g], start=feeder.t0, hours=1, fn=idle)
    [hour] = rows(engine, ROWS)
    assert hour["secs_w"] == pytest.approx(3600 * 3 / 7)  # the sized slice only
    assert hour["cap_s"] == 0 and hour["sliced_w"] == 0  # nothing counts as free


def test_replayed_batches_add_nothing_and_backfill_agrees(feeder: Feeder, engine: Engine) -> None:
    t0 = feeder.t0
    node = [gpu(0, uid="GPU-a"), gpu(1, uid="GPU-b", mig=True, slices=[mig_slice(1, "2g.10gb", uid="MIG-2g")])]
    story = {"GPU-a": idle, "GPU-b": unknown, "MIG-2g": busy(30)}
    feeder.feed(node, start=t0, hours=3, fn=story, instance_id="i-one")
    feeder.feed([gpu(0, uid="GPU-c")], start=t0, hours=2, fn=held, instance_id="i-two")
    before = rows(engine, ROWS)
    # The same seconds again (an agent replaying its spool under new batch ids): counted once.
    feeder.feed(node, start=t0, hours=3, fn=story, instance_id="i-one")
    assert rows(engine, ROWS) == before
    assert len(before) == 5
    backfilled = rows(engine, FROM_DEVICES)
    for got, want in zip(before, backfilled, strict=True):
        assert (got.pop("t"), got.pop("instance")) == (want.pop("t"), want.pop("instance"))
        assert got == pytest.approx(want)
