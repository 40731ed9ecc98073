"""The inventory an analysis covers, read through the per-process cache of GPU and slice rows."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app.analyse.fleet import DeviceRowsCache, PermissionDenied, free_slices, load_fleet
from app.analyse.states import Thresholds
from app.analyse.window import Filters
from app.pricing.resolve import Pricer
from tests.factories import gpu, mig_slice, unsized_slice
from tests.feeding import Feeder, busy

H = timedelta(hours=1)


def _layout(sessions: sessionmaker[Session], cache: DeviceRowsCache, feeder: Feeder) -> dict[str, list[str]]:
    """Live slice profiles per GPU uuid, as a page would see them now."""
    now = feeder.t0 + 10 * H
    with sessions() as session:
        fleet = load_fleet(
            session, filters=Filters(), pricer=Pricer(), thresholds=Thresholds(), now=now, since=now, cache=cache
        )
    return {g.uuid: [s.profile for s in fleet.live_slices(g.pk)] for g in fleet.gpus.values()}


def test_cached_rows_follow_a_mig_reconfiguration_and_a_new_gpu(
    feeder: Feeder, sessions: sessionmaker[Session]
) -> None:
    t0, cache = feeder.t0, DeviceRowsCache()
    before = gpu(0, uid="GPU-a", mig=True, slices=[mig_slice(i, "1g.5gb") for i in range(1, 8)], unpartitioned=0)
    feeder.feed([before], start=t0, hours=1, fn=busy(50.0), instance_id="i-a")
    assert _layout(sessions, cache, feeder) == {"GPU-a": ["1g.5gb"] * 7}

    after = gpu(0, uid="GPU-a", mig=True, slices=[mig_slice(1, "4g.20gb"), mig_slice(2, "2g.10gb")], unpartitioned=1)
    feeder.feed([after], start=t0 + H, hours=1, fn=busy(50.0), instance_id="i-a")
    assert _layout(sessions, cache, feeder) == {"GPU-a": ["4g.20gb", "2g.10gb"]}

    feeder.feed([gpu(0, uid="GPU-b")], start=t0 + 2 * H, hours=1, fn=busy(50.0), instance_id="i-b")
    assert _layout(sessions, cache, feeder) == {"GPU-a": ["4g.20gb", "2g.10gb"], "GPU-b": []}


def test_unchanged_tables_are_not_read_again(feeder: Feeder, sessions: sessionmaker[Session]) -> None:
    feeder.feed([gpu(0, uid="GPU-a")], start=feeder.t0, hours=1, fn=busy(50.0), instance_id="i-a")
    cache = DeviceRowsCache()
    with sessions() as session:
        first = cache.rows(session)
        # More samples change no inventory row: the same lists come back.
        feeder.feed([gpu(0, uid="GPU-a")], start=feeder.t0 + H, hours=1, fn=busy(50.0), instance_id="i-a")
    with sessions() as session:
        assert cache.rows(session) is first


def _gpus(sessions: sessionmaker[Session], cache: DeviceRowsCache, feeder: Feeder) -> dict[str, Any]:
    now = feeder.t0 + 10 * H
    with sessions() as session:
        fleet = load_fleet(
            session, filters=Filters(), pricer=Pricer(), thresholds=Thresholds(), now=now, since=now, cache=cache
        )
    return {g.uuid: (g, free_slices(g, fleet.live_slices(g.pk))) for g in fleet.gpus.values()}


def test_cached_rows_follow_layout_and_permission_gaps(feeder: Feeder, sessions: sessionmaker[Session]) -> None:
    t0, cache = feeder.t0, DeviceRowsCache()
    plain = gpu(0, uid="GPU-a", mig=True, slices=[mig_slice(1, "3g.20gb")], unpartitioned=4)
    feeder.feed([plain], start=t0, hours=1, fn=busy(50.0), instance_id="i-a")
    g, free = _gpus(sessions, cache, feeder)["GPU-a"]
    assert (g.layout_complete, g.permission_denied, free) == (True, (), 4)

    refused = {"figure": "procs", "call": "nvmlDeviceGetComputeRunningProcesses_v3", "grant": "mig-monitor"}
    gaps = dict(plain, layout_complete=False, permission_denied=[refused])
    feeder.feed([gaps], start=t0 + H, hours=1, fn=busy(50.0), instance_id="i-a")
    g, free = _gpus(sessions, cache, feeder)["GPU-a"]
    assert g.layout_complete is False and free is None  # not 4: what the agent could not size may be anywhere
    assert g.permission_denied == (PermissionDenied("procs", "nvmlDeviceGetComputeRunningProcesses_v3", "mig-monitor"),)


def test_free_slices_are_unknown_while_a_live_slice_has_no_size(
    feeder: Feeder, sessions: sessionmaker[Session]
) -> None:
    g = gpu(0, uid="GPU-a", mig=True, slices=[mig_slice(1, "3g.20gb"), unsized_slice(2)], unpartitioned=2)
    feeder.feed([g], start=feeder.t0, hours=1, fn=busy(50.0), instance_id="i-a")
    feeder.feed([gpu(0, uid="GPU-b")], start=feeder.t0, hours=1, fn=busy(50.0), instance_id="i-b")
    gpus = _gpus(sessions, DeviceRowsCache(), feeder)
    assert gpus["GPU-a"][1] is None
    assert gpus["GPU-b"][1] == 0  # not in MIG mode: nothing to be free
