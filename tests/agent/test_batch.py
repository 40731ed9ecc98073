from __future__ import annotations

import gc
import gzip
import json
import random
import shutil
import weakref
import zlib
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agent import spool
from agent.batch import MAX_HOLDERS, Batcher, HolderTable, build_batch, link_holders
from agent.collect.holders import Holder
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


# --- holders -----------------------------------------------------------------------------------------------

STARTED = 1_795_000_000.0  # 2026-11-18T11:06:40Z


def holder(pid: int, used_mib: int | None = 1000, **context: str) -> Holder:
    return Holder(pid, "python3", 1207, "mchen", STARTED + pid, used_mib, **context)


def held(n: int, by_device: dict[str, tuple[Holder, ...]], gpus: tuple[GpuInfo, ...] | None = None) -> Interval:
    """Interval `n` with the holders given per device UUID."""
    iv = interval(n, gpus)
    for reading in iv.readings:
        reading.holders = by_device.get(reading.uuid, ())
    return iv


def test_a_holder_is_described_once_per_batch_and_referred_to_from_each_sample(tmp_path: Path) -> None:
    gpus = layout("MIG-1", "MIG-2")
    b = batcher(tmp_path, n=3)
    job = holder(11, job_id="48213", job_step="0")
    pod = holder(12, 500, container_id="c" * 64, pod_uid="u", namespace="inference", pod="vllm-0")
    b.add(held(0, {"MIG-1": (job,)}, gpus), INSTANCE, {})
    b.add(held(1, {"MIG-1": (replace(job, used_mib=1200),), "MIG-2": (pod,)}, gpus), INSTANCE, {})
    b.add(held(2, {"MIG-1": (replace(job, used_mib=None),), "MIG-2": (pod,)}, gpus), INSTANCE, {})
    [doc] = sealed(b)
    assert doc["holders"] == [
        {
            "id": 0,
            "pid": 11,
            "executable": "python3",
            "uid": 1207,
            "user": "mchen",
            "started_at": "2026-11-18T11:06:51Z",
            "job_id": "48213",
            "job_step": "0",
        },
        {
            "id": 1,
            "pid": 12,
            "executable": "python3",
            "uid": 1207,
            "user": "mchen",
            "started_at": "2026-11-18T11:06:52Z",
            "container_id": "c" * 64,
            "pod_uid": "u",
            "namespace": "inference",
            "pod": "vllm-0",
        },
    ]
    refs = [{s["uuid"]: s.get("holders") for s in iv["samples"]} for iv in doc["intervals"]]
    assert refs == [
        {"GPU-a": None, "MIG-1": [{"ref": 0, "used_mib": 1000}], "MIG-2": None},
        {"GPU-a": None, "MIG-1": [{"ref": 0, "used_mib": 1200}], "MIG-2": [{"ref": 1, "used_mib": 500}]},
        {"GPU-a": None, "MIG-1": [{"ref": 0}], "MIG-2": [{"ref": 1, "used_mib": 500}]},
    ]
    assert list(doc) == ["schema_version", "batch_id", "agent", "instance", "gpus", "holders", "intervals", "events"]


def test_each_batch_describes_its_holders_again_under_the_numbers_they_had(tmp_path: Path) -> None:
    b = batcher(tmp_path, n=1)
    b.add(held(0, {"GPU-a": (holder(1),)}), INSTANCE, {})
    b.add(held(1, {"GPU-a": (holder(2), holder(1))}), INSTANCE, {})
    first, second = sealed(b)
    assert [(h["id"], h["pid"]) for h in first["holders"]] == [(0, 1)]
    assert [(h["id"], h["pid"]) for h in second["holders"]] == [(1, 2), (0, 1)], "the newcomer takes a free number"
    assert second["intervals"][0]["samples"][0]["holders"] == [
        {"ref": 1, "used_mib": 1000},
        {"ref": 0, "used_mib": 1000},
    ]


def test_holders_kept_from_batch_to_batch_are_described_as_new_ones_would_be(tmp_path: Path) -> None:
    """The table reuses a holder object's number and the previous batch's descriptions: the batches are the same
    as with a fresh object and description each time, and a holder whose description changed is described anew."""
    kept, fresh = batcher(tmp_path / "kept", n=2), batcher(tmp_path / "fresh", n=2)
    job = holder(11, job_id="48213")
    pod = holder(12, pod_uid="u")
    named = replace(pod, namespace="inference", pod="vllm-0")
    steps: list[dict[str, tuple[Holder, ...]]] = [
        {"GPU-a": (job, pod)},
        {"GPU-a": (job, pod)},
        {"GPU-a": (job, named)},
        {"GPU-a": (named, job)},
    ]
    for n, by_device in enumerate(steps):
        kept.add(held(n, by_device), INSTANCE, {})
        copies = {uuid: tuple(replace(h) for h in hs) for uuid, hs in by_device.items()}
        fresh.add(held(n, copies), INSTANCE, {})
    documents = [[{k: v for k, v in doc.items() if k != "batch_id"} for doc in sealed(b)] for b in (kept, fresh)]
    assert documents[0] == documents[1]
    second = documents[0][1]
    assert [(h["id"], h["pid"], h.get("pod")) for h in second["holders"]] == [(0, 11, None), (2, 12, "vllm-0")]
    assert [s["holders"] for s in second["intervals"][1]["samples"]] == [
        [{"ref": 2, "used_mib": 1000}, {"ref": 0, "used_mib": 1000}]
    ]


def test_a_holder_keeps_its_number_and_its_json_from_batch_to_batch(tmp_path: Path) -> None:
    b = batcher(tmp_path, n=1)
    gpus = layout("MIG-1")
    on_a = (holder(11, job_id="48213"), holder(12, pod_uid="u"))
    b.add(held(0, {"GPU-a": on_a}, gpus), INSTANCE, {})
    before = b._holders._before  # what the sealed batch's table made, carried to the next
    b.add(held(1, {"GPU-a": on_a, "MIG-1": (holder(13),)}, gpus), INSTANCE, {})
    table = HolderTable(b._holders)  # the table of the batch after: what it made for GPU-a is from the first
    text = table.refs_json(on_a)
    assert text == '[{"ref":0,"used_mib":1000},{"ref":1,"used_mib":1000}]'
    assert text is before[4][id(on_a)][1], "the references' JSON is made once, not once per batch"
    assert table.encoded[0] is before[2][0][2], "and so is each description's"
    first, second = sealed(b)
    assert first["holders"] == second["holders"][:2]
    assert second["intervals"][0]["samples"][0]["holders"] == first["intervals"][0]["samples"][0]["holders"]


def test_numbers_stay_unique_and_in_bounds_under_churn(tmp_path: Path) -> None:
    """Thousands of processes come and go across batches, some batches fuller than the table: every batch numbers
    its holders 0 to MAX_HOLDERS - 1, no two alike, every reference names its own process, and a process that runs
    on keeps its number while the numbers suffice."""
    b = batcher(tmp_path, n=2)
    rng = random.Random(7)
    running = [holder(pid) for pid in range(1, 400)]
    next_pid = 400
    numbers: dict[int, int] = {}  # pid -> number in the last batch
    listed_in: dict[float, dict[str, tuple[Holder, ...]]] = {}  # the holders each interval listed, by its util
    for n in range(40):
        if n % 10 == 9:  # a crowd: fills the table and pushes a batch past it
            crowd = [holder(next_pid + i) for i in range(MAX_HOLDERS - 200)]
            next_pid += len(crowd)
        else:
            crowd = []
        gone = set(rng.sample(range(len(running)), 60))
        running = [h for i, h in enumerate(running) if i not in gone] + [holder(next_pid + i) for i in range(60)]
        next_pid += 60
        devices = {"GPU-a": tuple(running[:200]), "MIG-1": tuple(running[200:]), "MIG-2": tuple(crowd)}
        listed_in[float(n)] = devices
        b.add(held(n, devices, layout("MIG-1", "MIG-2")), INSTANCE, {})
        for item in b.spool.pending():
            body = b.spool.read(item)
            assert body is not None
            doc = json.loads(gzip.decompress(body))
            b.spool.remove(item)
            pid_of = {h["id"]: h["pid"] for h in doc["holders"]}
            assert len(pid_of) == len(doc["holders"]) <= MAX_HOLDERS
            assert all(0 <= number < MAX_HOLDERS for number in pid_of)
            described = set(pid_of.values())
            listed: dict[int, int] = {}  # pid -> number
            for interval in doc["intervals"]:
                devices = listed_in[interval["samples"][0]["util"]]
                for sample in interval["samples"]:
                    refs = sample.get("holders", [])
                    wanted = [h.pid for h in devices.get(sample["uuid"], ()) if h.pid in described]
                    assert [pid_of[r["ref"]] for r in refs] == wanted
                    listed |= {pid_of[r["ref"]]: r["ref"] for r in refs}
            assert set(listed) == described, "each described holder is referred to"
            if numbers and len(pid_of) < MAX_HOLDERS // 2 and len(numbers) < MAX_HOLDERS // 2:
                kept = [pid for pid in listed if pid in numbers]
                assert kept and all(listed[pid] == numbers[pid] for pid in kept)
            numbers = listed
    b.journal.close()
    assert next_pid > 10_000


def test_a_table_keeps_nothing_of_the_batches_before_the_last(tmp_path: Path) -> None:
    class Name(str):
        """A name the test can watch: a weak reference says when nothing holds the holder any more."""

    b = batcher(tmp_path, n=1)

    def add_gone(n: int) -> weakref.ref[Name]:
        name = Name("gone")
        b.add(held(n, {"GPU-a": (Holder(5, name, 0, "root", STARTED, 10),)}), INSTANCE, {})
        return weakref.ref(name)

    watched = add_gone(0)
    gc.collect()
    assert watched() is not None, "what the sealed batch's table made is carried to the next"
    b.add(held(1, {"GPU-a": (holder(1),)}), INSTANCE, {})
    gc.collect()
    assert watched() is None, "but no further"


def test_a_journal_with_carried_numbers_seals_on_recovery_as_it_would_live(tmp_path: Path) -> None:
    b = batcher(tmp_path, n=2)
    b.add(held(0, {"GPU-a": (holder(1), holder(2))}), INSTANCE, {})
    b.add(held(1, {"GPU-a": (holder(1), holder(2))}), INSTANCE, {})
    b.add(held(2, {"GPU-a": (holder(3), holder(2))}), INSTANCE, {})
    b.journal.close()
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(tmp_path / "open.jsonl", copy / "open.jsonl")
    b.flush()
    again = batcher(copy, n=2)
    assert again.recover() is not None  # killed before it could seal, with the same journal on disk
    [_, live], [recovered] = b.spool.pending(), again.spool.pending()
    assert b.spool.read(live) == again.spool.read(recovered)
    doc = sealed(again)[0]
    assert [(h["id"], h["pid"]) for h in doc["holders"]] == [(2, 3), (1, 2)]
    assert doc["intervals"][0]["samples"][0]["holders"] == [{"ref": 2, "used_mib": 1000}, {"ref": 1, "used_mib": 1000}]


def test_recovery_keeps_the_later_of_two_descriptions_under_one_number() -> None:
    intervals = [
        {"samples": [{"uuid": "GPU-a", "holders": [{"ref": 4}, {"ref": 7}]}]},
        {"samples": [{"uuid": "GPU-a", "holders": [{"ref": 4}]}, {"uuid": "GPU-b", "holders": [{"ref": 9}]}]},
    ]
    entries = [{"id": 4, "pid": 1}, {"id": 7, "pid": 2}, {"id": 4, "pid": 3}]
    assert link_holders(intervals, entries) == [{"id": 7, "pid": 2}, {"id": 4, "pid": 3}]
    assert intervals == [
        {"samples": [{"uuid": "GPU-a", "holders": [{"ref": 4}, {"ref": 7}]}]},
        {"samples": [{"uuid": "GPU-a", "holders": [{"ref": 4}]}, {"uuid": "GPU-b"}]},
    ], "a reference to no description is dropped"


def test_a_table_sent_again_is_compressed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The holders table is a deflate piece of its own, kept while the table stays the same: the body is still a
    gzip of exactly what `json.dumps` writes, whole for the server's reader (zlib, gzip wrapping)."""
    made: list[bytes] = []
    real_deflate = spool._deflate

    def deflate(data: bytes, flush: int) -> bytes:
        made.append(data)
        return real_deflate(data, flush)

    monkeypatch.setattr(spool, "_deflate", deflate)
    monkeypatch.setattr(spool, "_deflated", (b"", b""))  # whatever table another test sealed last
    b = batcher(tmp_path, n=1)
    on_a = (holder(1, pod_uid="u", namespace="inference", pod="vllm-0"), holder(2))
    for n in range(3):
        b.add(held(n, {"GPU-a": on_a}), INSTANCE, {})
    tables = [data for data in made if data.startswith(b'[{"id":')]
    assert len(tables) == 1 and len(made) == 7, "head and tail each batch, the table once"
    for item in b.spool.pending():
        body = b.spool.read(item)
        assert body is not None
        text = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(body)
        assert text == gzip.decompress(body) == json.dumps(json.loads(text), separators=(",", ":")).encode()
        assert tables[0] in text


def test_a_batch_without_holders_is_what_it_was() -> None:
    doc = build_batch(batch_id="b", instance=INSTANCE, gpus=[], intervals=[], events=[], interval_s=10, holders=[])
    assert "holders" not in doc


def test_a_batch_describes_at_most_max_holders(tmp_path: Path) -> None:
    b = batcher(tmp_path, n=10)
    half = MAX_HOLDERS // 2
    b.add(held(0, {"GPU-a": tuple(holder(pid) for pid in range(half))}), INSTANCE, {})
    b.add(held(1, {"GPU-a": tuple(holder(pid) for pid in range(half, 2 * half))}), INSTANCE, {})
    assert b.add(held(2, {"GPU-a": (holder(1), holder(2))}), INSTANCE, {}) == [], "nothing new: it fits"
    assert len(b.add(held(3, {"GPU-a": (holder(1), holder(-1))}), INSTANCE, {})) == 1, "one more seals first"
    b.flush()
    full, rest = sealed(b)
    assert len(full["holders"]) == MAX_HOLDERS and len(full["intervals"]) == 3
    assert [h["pid"] for h in rest["holders"]] == [1, -1] and "errors" not in rest["agent"]

    b = batcher(tmp_path / "one", n=10)
    b.add(held(0, {"GPU-a": tuple(holder(pid) for pid in range(MAX_HOLDERS + 3))}), INSTANCE, {"x:y": 1})
    b.flush()
    [doc] = sealed(b)
    assert len(doc["holders"]) == MAX_HOLDERS == len(doc["intervals"][0]["samples"][0]["holders"])
    assert doc["agent"]["errors"] == {"x:y": 1, "holders:truncated": 3}


def test_a_re_sealed_journal_gives_the_same_bytes(tmp_path: Path) -> None:
    b = batcher(tmp_path, n=10)
    b.add(held(0, {"GPU-a": (holder(1), holder(2, None))}), INSTANCE, {})
    b.add(held(1, {"GPU-a": (holder(2, 300), holder(3))}), INSTANCE, {})
    b.journal.close()
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(tmp_path / "open.jsonl", copy / "open.jsonl")
    b.flush()
    again = batcher(copy, n=10)
    assert again.recover() is not None  # the agent was killed with the same journal on disk
    [first], [second] = [b.spool.pending()], [again.spool.pending()]
    assert b.spool.read(first[0]) == again.spool.read(second[0])
    [doc] = sealed(again)
    assert [h["pid"] for h in doc["holders"]] == [1, 2, 3]
    assert [[h["ref"] for h in iv["samples"][0]["holders"]] for iv in doc["intervals"]] == [[0, 1], [1, 2]]


def test_a_description_lost_with_its_journal_line_takes_its_references_along(tmp_path: Path) -> None:
    b = batcher(tmp_path, n=10)
    b.add(held(0, {"GPU-a": (holder(1),)}), INSTANCE, {})
    b.add(held(1, {"GPU-a": (holder(1), holder(2))}), INSTANCE, {})
    b.add(held(2, {"GPU-a": (holder(2), holder(3))}), INSTANCE, {})
    b.journal.close()
    lines = (tmp_path / "open.jsonl").read_bytes().splitlines(keepends=True)
    torn = [line if b'"holders":[{"id":1' not in line else line[:40] + b"\n" for line in lines]
    (tmp_path / "open.jsonl").write_bytes(b"".join(torn))  # the interval that described holder 2 is torn
    again = batcher(tmp_path, n=10)
    again.recover()
    [doc] = sealed(again)
    assert [(h["id"], h["pid"]) for h in doc["holders"]] == [(0, 1), (2, 3)]
    assert [iv["samples"][0].get("holders") for iv in doc["intervals"]] == [
        [{"ref": 0, "used_mib": 1000}],
        [{"ref": 2, "used_mib": 1000}],
    ]


def test_a_journal_write_that_failed_describes_its_holders_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = batcher(tmp_path, n=10)
    b.add(held(0, {"GPU-a": (holder(1),)}), INSTANCE, {})
    real_append = Journal.append

    def full_disk(self: Journal, record: dict[str, Any], encoded: dict[str, str] | None = None) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Journal, "append", full_disk)
    with pytest.raises(OSError):
        b.add(held(1, {"GPU-a": (holder(1), holder(2))}), INSTANCE, {})
    monkeypatch.setattr(Journal, "append", real_append)
    b.add(held(2, {"GPU-a": (holder(2),)}), INSTANCE, {})
    b.flush()
    [doc] = sealed(b)
    assert [(h["id"], h["pid"]) for h in doc["holders"]] == [(0, 1), (2, 2)], "number 1 may be on the disk"
    assert doc["intervals"][1]["samples"][0]["holders"] == [{"ref": 2, "used_mib": 1000}]


def test_a_device_s_unchanged_holders_share_one_list_of_references(tmp_path: Path) -> None:
    b = batcher(tmp_path, n=3)
    on_a = (holder(1), holder(2, None))
    for n in range(3):
        b.add(held(n, {"GPU-a": on_a}), INSTANCE, {})
    [doc] = sealed(b)
    assert [iv["samples"][0]["holders"] for iv in doc["intervals"]] == [[{"ref": 0, "used_mib": 1000}, {"ref": 1}]] * 3
    b.add(held(3, {"GPU-a": on_a}), INSTANCE, {})
    table = b._holders
    assert table.refs_json(on_a) is table.refs_json(on_a), "the references' JSON is made once per batch"
    b.add(held(4, {"GPU-a": on_a}), INSTANCE, {})
    b.flush()
    later = sealed(b)[-1]
    assert [iv["samples"][0]["holders"] for iv in later["intervals"]] == [
        [{"ref": 0, "used_mib": 1000}, {"ref": 1}]
    ] * 2
    b.journal.close()


def test_the_holders_json_written_once_is_what_json_would_write(tmp_path: Path) -> None:
    """The journal line and the sealed body put in the table's own JSON of each description: the text is the one
    `json.dumps` writes for the whole record, escapes and all."""
    b = batcher(tmp_path, n=2)
    odd = holder(7, pod_uid="u", namespace='é\u00e9"x', pod="pod-ü", job_id="line\nbreak")
    b.add(held(0, {"GPU-a": (holder(1), odd)}), INSTANCE, {"x:y": 1})
    lines = (tmp_path / "open.jsonl").read_bytes().splitlines()
    assert [json.dumps(json.loads(line), separators=(",", ":")).encode() for line in lines] == lines
    b.add(held(1, {"GPU-a": (odd, holder(3))}), INSTANCE, {})
    [item] = b.spool.pending()
    body = b.spool.read(item)
    assert body is not None
    text = gzip.decompress(body)
    doc = json.loads(text)
    assert json.dumps(doc, separators=(",", ":")).encode() == text
    assert [h["pid"] for h in doc["holders"]] == [1, 7, 3] and doc["holders"][1]["namespace"] == 'é\u00e9"x'
