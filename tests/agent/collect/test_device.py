from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pynvml
import pytest

from agent.collect import Interval
from agent.collect.holders import SAMPLE_HOLDERS, Holder, HolderReader

from .conftest import Host
from .test_holders import CID, POD, V1_DOCKER, V2_KUBEPODS_SYSTEMD, V2_SLURM, Proc, names


def test_memory_uses_v2_so_reserved_memory_is_not_counted(host: Callable[[str], Host]) -> None:
    h = host("g5-idle")
    interval = h.interval()
    handle = h.lib.nvmlDeviceGetHandleByIndex(0)
    v1 = h.lib.nvmlDeviceGetMemoryInfo(handle)
    v2 = h.lib.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    assert v1.used > v2.used
    assert h.reading(interval, interval.gpus[0].uuid)["mem_used_mib"] == v2.used // 2**20


def test_slices_report_their_own_memory_and_processes(host: Callable[[str], Host]) -> None:
    h = host("p4d-mig")
    h.lib.add_process(1, 4242, 1000, slice_index=2)
    interval = h.interval()
    gpu1 = interval.gpus[1]
    by_profile = {s.profile: h.reading(interval, s.uuid) for s in gpu1.slices}
    assert by_profile["1g.5gb"]["procs"] == 1 and by_profile["1g.5gb"]["procs_mem_mib"] == 1000
    assert by_profile["3g.20gb"]["mem_used_mib"] == 15000
    assert gpu1.slices[0].memory_total_mib is not None


def test_board_figures(host: Callable[[str], Host]) -> None:
    h = host("p5")
    interval = h.interval()
    wire = h.reading(interval, interval.gpus[0].uuid)
    assert {"temp_c", "sm_clock_mhz", "ecc_uncorrected", "procs", "procs_mem_mib", "mem_used_mib"} <= set(wire)


def test_ecc_off_is_absent_and_counted_once(host: Callable[[str], Host]) -> None:
    h = host("g6e-busy")
    for _ in range(3):
        interval = h.interval()
    assert "ecc_uncorrected" not in h.reading(interval, interval.gpus[2].uuid)
    assert h.reading(interval, interval.gpus[0].uuid)["ecc_uncorrected"] == 0
    assert h.nvml.take_errors() == {"nvmlDeviceGetTotalEccErrors:not_supported": 1}


def _process_figures(h: Host, interval: Interval) -> dict[str, tuple[object, object]]:
    return {r.uuid: (r.procs, r.procs_mem_mib) for r in interval.readings}


def _true_process_figures(h: Host, interval: Interval) -> dict[str, tuple[object, object]]:
    t1 = h.clock.t
    truth = h.lib.truth(t1 - interval.duration_s, t1)
    return {uuid: (t.procs, t.procs_mem_mib) for uuid, t in truth.items()}


@pytest.mark.parametrize(
    ("driver", "symbol", "record_bytes"),
    [
        ("470.256.02", "nvmlDeviceGetComputeRunningProcesses_v2", 24),
        ("535.54.03", "nvmlDeviceGetComputeRunningProcesses_v3", 32),
        ("535.98", "nvmlDeviceGetComputeRunningProcesses_v2", 24),
        ("535.183.01", "nvmlDeviceGetComputeRunningProcesses_v3", 24),
        ("550.127.05", "nvmlDeviceGetComputeRunningProcesses_v3", 24),
        ("550.127.08", "nvmlDeviceGetComputeRunningProcesses_v3", 16),
        ("570.172.08", "nvmlDeviceGetComputeRunningProcesses_v3", 24),
        ("580.105.08", "nvmlDeviceGetComputeRunningProcesses_v3", 24),
    ],
)
def test_process_counts_and_memory_are_right_on_every_driver_layout(
    host: Callable[..., Host], driver: str, symbol: str, record_bytes: int
) -> None:
    """The drivers write the records of one entry point in three sizes; the agent reads each one right, on whole
    GPUs (several processes each) and on MIG slices."""
    h = host("p4d-mig", driver=driver)
    interval = h.interval()
    assert _process_figures(h, interval) == _true_process_figures(h, interval)
    reader = h.collector.device.processes
    assert (reader.symbol, reader.record_bytes) == (symbol, record_bytes)
    assert h.nvml.take_errors() == {}


def test_a_process_list_costs_one_call_once_the_room_is_known(host: Callable[..., Host]) -> None:
    """The first list asks how many processes there are; after that the buffer has room, and each device's list
    is one call, with the same figures."""
    h = host("p4d-mig")
    h.interval()
    symbol = h.collector.device.processes.symbol
    assert symbol is not None
    before = h.lib.calls[symbol]
    interval = h.interval()
    listed = 8 + sum(len(g.slices) for g in interval.gpus)
    assert h.lib.calls[symbol] - before <= listed
    assert _process_figures(h, interval) == _true_process_figures(h, interval)


def test_the_binding_s_own_reader_misreads_early_r535_records(host: Callable[..., Host]) -> None:
    """Why the agent reads the C entry point itself: nvidia-ml-py reads fixed-size records, and 535.43-535.86
    wrote bigger ones, so every record after the first is misread (XuehaiPan/nvitop#75)."""
    h = host("p4d-mig", driver="535.54.03")
    listed = h.lib.nvmlDeviceGetComputeRunningProcesses(h.lib.nvmlDeviceGetHandleByIndex(4))
    true_pids = sorted(p.pid for p in h.lib._gpus[4].procs)
    assert len(listed) == 2 and sorted(p.pid for p in listed) != true_pids
    assert listed[1].pid == 0 or listed[1].usedGpuMemory != h.lib._gpus[4].procs[1].used_bytes


def test_an_old_driver_without_the_versioned_temperature_call_falls_back(host: Callable[[str], Host]) -> None:
    h = host("p5")
    h.lib.fail("nvmlDeviceGetTemperatureV", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    interval = h.interval()
    assert all("temp_c" in h.reading(interval, g.uuid) for g in interval.gpus)


@pytest.mark.parametrize(
    "function",
    [
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetTotalEccErrors",
    ],
)
@pytest.mark.parametrize(
    "error", [pynvml.NVML_ERROR_NO_PERMISSION, pynvml.NVML_ERROR_UNKNOWN, pynvml.NVML_ERROR_TIMEOUT]
)
def test_any_call_failing_on_one_gpu_costs_that_figure_only(
    host: Callable[[str], Host], function: str, error: int
) -> None:
    h = host("p5")
    healthy = h.interval()
    h.lib.fail(function, error, gpu=3)
    interval = h.interval()
    broken = h.reading(interval, interval.gpus[3].uuid)
    before = h.reading(healthy, healthy.gpus[3].uuid)
    lost = set(before) - set(broken)
    assert len(lost) in (1, 2), lost  # processes carry two figures
    for g in interval.gpus[:3]:
        assert set(h.reading(interval, g.uuid)) == set(h.reading(healthy, g.uuid))
    assert sum(h.nvml.take_errors().values()) == 1


def test_a_lost_gpu_is_reported_and_the_rest_go_on(host: Callable[[str], Host]) -> None:
    h = host("p5")
    h.interval()
    h.lib.fail("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_GPU_IS_LOST, gpu=5)
    h.lib.fail("nvmlDeviceGetTemperatureV", pynvml.NVML_ERROR_GPU_IS_LOST, gpu=5)
    h.interval()
    interval = h.interval()
    assert interval.gpus[5].util_unavailable_reason == "gpu_lost"
    assert set(h.reading(interval, interval.gpus[5].uuid)) == {"uuid", "util_source"}
    assert all("util" in h.reading(interval, g.uuid) for g in interval.gpus if g.index != 5)


# --- holders -----------------------------------------------------------------------------------------------


def proc_tree(tmp_path: Path) -> tuple[Proc, HolderReader]:
    """A /proc tree of the test's own in a temporary folder, and a reader of it."""
    proc = Proc(tmp_path / "proc")
    (tmp_path / "pods").mkdir()
    return proc, HolderReader(proc.root, tmp_path / "pods", user_of=names)


def holders_of(interval: Interval, uuid: str) -> tuple[Holder, ...]:
    [reading] = [r for r in interval.readings if r.uuid == uuid]
    return reading.holders


def test_holders_are_read_on_slices_and_whole_gpus_never_on_a_mig_parent(tmp_path: Path) -> None:
    proc, reader = proc_tree(tmp_path)
    proc.add(4242, comm="python3", uid=1000, cgroup=V1_DOCKER)  # cgroup v1
    proc.add(4343, comm="vllm", uid=0, cgroup=V2_KUBEPODS_SYSTEMD)  # cgroup v2
    (tmp_path / "pods" / f"serve_vllm-0_{POD}").mkdir()
    h = Host("p4d-mig", holders=reader)
    scenario_procs = sum(len(g.procs) for g in h.lib._gpus)
    h.lib.add_process(4, 4242, 20_000)
    h.lib.add_process(1, 4343, 1_000, slice_index=2)
    interval = h.interval()
    gpu1, gpu4 = interval.gpus[1], interval.gpus[4]
    [whole] = holders_of(interval, gpu4.uuid)
    assert (whole.pid, whole.executable, whole.user, whole.container_id, whole.used_mib) == (
        4242,
        "python3",
        "alice",
        CID,
        20_000,
    )
    [on_slice] = holders_of(interval, gpu1.slices[2].uuid)
    assert (on_slice.pid, on_slice.user, on_slice.namespace, on_slice.pod, on_slice.used_mib) == (
        4343,
        "root",
        "serve",
        "vllm-0",
        1_000,
    )
    assert h.reading(interval, gpu1.uuid)["procs"] == 4, "the MIG parent counts its slices' processes"
    assert holders_of(interval, gpu1.uuid) == (), "but they are the slices' holders, not the parent's"
    assert sum(len(r.holders) for r in interval.readings) == 2
    # The scenario's own processes have no entry in this tree: to the agent they have exited.
    assert h.nvml.take_errors() == {"holders:exited": scenario_procs}


def test_a_process_gone_from_proc_is_no_holder_and_raises_nothing(tmp_path: Path) -> None:
    proc, reader = proc_tree(tmp_path)
    h = Host("g5-idle", holders=reader)
    h.lib.add_process(0, 777, 500)  # NVML lists it; /proc has no entry
    interval = h.interval()
    uuid = interval.gpus[0].uuid
    assert h.reading(interval, uuid)["procs"] == 1 and holders_of(interval, uuid) == ()
    assert "holders" not in interval.readings[0].to_wire(lambda holders: [{"ref": 0}] * len(holders))
    assert h.nvml.take_errors() == {"holders:exited": 1}
    proc.add(777, cgroup=V2_SLURM)
    [holder] = holders_of(h.interval(), uuid)
    assert (holder.job_id, holder.job_step) == ("12345", "batch")


def test_without_holder_args_no_command_line_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    real_open = os.open

    def recording(path: str, flags: int, *args: int, **kwargs: int) -> int:
        opened.append(path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording)
    proc, reader = proc_tree(tmp_path)
    proc.add(31, cmdline=b"python3\0train.py\0--token\0s3cr3t\0")
    h = Host("g5-idle", holders=reader)
    h.lib.add_process(0, 31, 100)
    [holder] = holders_of(h.interval(), h.lib._gpus[0].uuid)
    assert holder.command is None and holder.executable == "python3"
    assert any(p.endswith("/31/stat") for p in opened) and not any(p.endswith("cmdline") for p in opened)

    h = Host("g5-idle", holders=HolderReader(proc.root, tmp_path / "pods", user_of=names, with_args=True))
    h.lib.add_process(0, 31, 100)
    [holder] = holders_of(h.interval(), h.lib._gpus[0].uuid)
    assert holder.command == "python3 train.py --token s3cr3t"


def test_a_crowded_device_lists_the_holders_of_the_most_memory(tmp_path: Path) -> None:
    proc, reader = proc_tree(tmp_path)
    h = Host("p5", holders=reader)
    for i in range(SAMPLE_HOLDERS + 6):
        proc.add(5000 + i)
        h.lib.add_process(6, 5000 + i, 100 + i)  # GPU 6 runs nothing else
    interval = h.interval()
    listed = holders_of(interval, interval.gpus[6].uuid)
    assert [x.pid for x in listed] == [5000 + i for i in range(SAMPLE_HOLDERS + 5, 5, -1)]
    assert h.reading(interval, interval.gpus[6].uuid)["procs"] == SAMPLE_HOLDERS + 6
    assert h.nvml.take_errors()["holders:truncated"] == 6


def test_a_device_whose_holders_did_not_change_gives_the_same_tuple(tmp_path: Path) -> None:
    proc, reader = proc_tree(tmp_path)
    h = Host("g5-idle", holders=reader)
    for pid in (41, 42):
        proc.add(pid)
        h.lib.add_process(0, pid, 100)
    uuid = h.lib._gpus[0].uuid
    first = holders_of(h.interval(), uuid)
    assert len(first) == 2
    assert holders_of(h.interval(), uuid) is first, "the batch reuses the references of an unchanged tuple"
    proc.add(43)
    h.lib.add_process(0, 43, 300)
    changed = holders_of(h.interval(), uuid)
    assert [x.pid for x in changed] == [43, 41, 42] and changed[1:] == first


def test_unchanged_devices_keep_their_holders_without_reading_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc, reader = proc_tree(tmp_path)
    h = Host("p5", holders=reader)
    for p in list(h.lib._gpus[7].procs):
        h.lib.remove_process(7, p.pid)  # the scenario's own: not in this /proc tree, read every time
    for gpu, pid in ((6, 61), (7, 71)):
        proc.add(pid)
        h.lib.add_process(gpu, pid, 100)
    first = h.interval()
    uuids = [first.gpus[i].uuid for i in (6, 7)]
    asked: list[int] = []
    real_read = reader.read

    def read(pid: int, used_mib: int | None) -> Holder | None:
        asked.append(pid)
        return real_read(pid, used_mib)

    monkeypatch.setattr(reader, "read", read)
    second = h.interval()
    assert all(holders_of(second, u) is holders_of(first, u) for u in uuids)
    assert not {61, 71} & set(asked), "nothing changed: not even looked up"
    h.lib.remove_process(7, 71)
    h.lib.add_process(7, 71, 200)
    third = h.interval()
    assert holders_of(third, uuids[0]) is holders_of(first, uuids[0]), "another device's change leaves this one be"
    assert [x.used_mib for x in holders_of(third, uuids[1])] == [200]
    assert 61 not in asked and 71 in asked


WORK_HOURS = datetime(2026, 11, 24, 17, 0, tzinfo=UTC).timestamp()  # a Tuesday, noon in UTC-5


def test_simulated_hosts_say_who_holds_their_gpus() -> None:
    h = Host("p4d-train", simulated_holders=True, start=WORK_HOURS)
    interval = h.interval()
    train = [holders_of(interval, g.uuid) for g in interval.gpus]
    assert all(len(x) == 1 for x in train)
    assert {(x[0].user, x[0].uid, x[0].executable, x[0].job_id) for x in train} == {("mchen", 1207, "python3", "48213")}
    assert h.nvml.take_errors() == {}

    h = Host("p5-inference", simulated_holders=True)
    interval = h.interval()
    assert all(holders_of(interval, g.uuid) == () for g in interval.gpus)
    pods = [x for g in interval.gpus for s in g.slices for x in holders_of(interval, s.uuid)]
    assert len(pods) == 25 and len({x.pod for x in pods}) == 25
    assert all(x.namespace == "inference" and (x.pod or "").startswith("vllm-") for x in pods)
    assert h.nvml.take_errors() == {}
