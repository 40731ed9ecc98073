from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from agent.batch import Batcher
from agent.collect.model import GpuInfo, Interval, Reading, SliceInfo
from agent.spool import Journal, Spool

INSTANCE = {"instance_id": "i-0abc", "tags": {}}
T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def layout(*slice_ids: str) -> tuple[GpuInfo, ...]:
    slices = tuple(SliceInfo(s, i + 1, 0, "1g.5gb", 1, 4864) for i, s in enumerate(slice_ids))
    return (GpuInfo("GPU-a", 0, "NVIDIA A100-SXM4-40GB", 40960, bool(slices), 7 - len(slices), None, slices),)


def interval(n: int, gpus: tuple[GpuInfo, ...] | None = None) -> Interval:
    gpus = gpus or layout()
    readings = [Reading(g.uuid, util=float(n), util_source="nvml.samples") for g in gpus]
    readings += [Reading(s.uuid) for g in gpus for s in g.slices]
    return Interval(T0 + timedelta(seconds=10 * n), 10.0, gpus, readings)


def batcher(tmp_path: Path, n: int = 3) -> Batcher:
    return Batcher(Spool(tmp_path / "spool"), Journal(tmp_path / "open.jsonl"), batch_intervals=n, interval_s=10)


def sealed(b: Batcher) -> list[dict[str, Any]]:
    out = []
    for item in b.spool.pending():
        body = b.spool.read(item)
        assert body is not None
        out.append(json.loads(gzip.decompress(body)))
    return out


def test_a_batch_is_sealed_every_n_intervals(tmp_path: Path) -> None:
    b = batcher(tmp_path, n=3)
    assert b.add(interval(0), INSTANCE, {}) == []
    assert b.add(interval(1), INSTANCE, {"nvmlDeviceGetPowerUsage:gpu_lost": 1}) == []
    assert len(b.add(interval(2), INSTANCE, {"nvmlDeviceGetPowerUsage:gpu_lost": 2})) == 1
    [doc] = sealed(b)
    assert doc["schema_version"] == 1
    assert [iv["samples"][0]["util"] for iv in doc["intervals"]] == [0.0, 1.0, 2.0]
    assert doc["intervals"][0]["start"] == "2026-11-21T12:00:00Z"
    assert doc["agent"]["errors"] == {"nvmlDeviceGetPowerUsage:gpu_lost": 3}
    assert doc["instance"] == INSTANCE
    assert not (tmp_path / "open.jsonl").exists()


def test_a_layout_change_seals_the_batch_first(tmp_path: Path) -> None:
    b = batcher(tmp_path, n=10)
    b.add(interval(0, layout("MIG-1")), INSTANCE, {})
    b.add(interval(1, layout("MIG-1")), INSTANCE, {})
    assert len(b.add(interval(2, layout("MIG-2")), INSTANCE, {})) == 1
    b.flush()
    first, second = sealed(b)
    assert [s["uuid"] for s in first["gpus"][0]["slices"]] == ["MIG-1"]
    assert len(first["intervals"]) == 2
    assert [s["uuid"] for s in second["gpus"][0]["slices"]] == ["MIG-2"]
    assert first["batch_id"] != second["batch_id"]


def test_an_identity_change_seals_the_batch_first(tmp_path: Path) -> None:
    b = batcher(tmp_path, n=10)
    b.add(interval(0), INSTANCE, {})
    b.add(interval(1), {"instance_id": "i-0abc", "tags": {"team": "ml"}}, {})
    b.flush()
    assert [d["instance"]["tags"] for d in sealed(b)] == [{}, {"team": "ml"}]


def test_a_spot_notice_leaves_at_once(tmp_path: Path) -> None:
    b = batcher(tmp_path, n=10)
    b.add(interval(0), INSTANCE, {})
    notice = {"ts": "2026-11-21T12:00:07Z", "kind": "spot_interruption", "details": {"action": "terminate"}}
    assert len(b.add_events([notice], INSTANCE)) == 1
    [doc] = sealed(b)
    assert doc["events"] == [notice] and len(doc["intervals"]) == 1


def test_a_killed_agent_s_journal_is_sealed_on_the_next_start(tmp_path: Path) -> None:
    b = batcher(tmp_path, n=10)
    b.add(interval(0), INSTANCE, {})
    b.add(interval(1), INSTANCE, {})
    b.journal.close()  # kill -9: nothing else runs
    again = batcher(tmp_path, n=10)
    assert again.recover() is not None
    [doc] = sealed(again)
    assert len(doc["intervals"]) == 2 and doc["gpus"][0]["uuid"] == "GPU-a"
    assert again.recover() is None


def test_the_drop_count_rides_in_the_next_sealed_batch(tmp_path: Path) -> None:
    b = batcher(tmp_path, n=1)
    b.spool.restore_dropped(4)
    b.add(interval(0), INSTANCE, {})
    b.add(interval(1), INSTANCE, {})
    assert [d["agent"]["dropped_batches"] for d in sealed(b)] == [4, 0]


def test_the_start_event_rides_with_the_first_intervals(tmp_path: Path) -> None:
    b = batcher(tmp_path, n=2)
    start = {"ts": "2026-11-21T12:00:00Z", "kind": "agent_start", "details": {"version": "0.1.0"}}
    assert b.add_events([start], INSTANCE) == []
    b.add(interval(0), INSTANCE, {})
    b.add(interval(1), INSTANCE, {})
    [doc] = sealed(b)
    assert doc["events"] == [start] and len(doc["intervals"]) == 2
