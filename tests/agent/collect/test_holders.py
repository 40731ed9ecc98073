from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from agent.collect.cgroups import NOTHING, CgroupIds, cgroup_paths, parse_cgroup
from agent.collect.holders import (
    COMMAND_CHARS,
    ID_CHARS,
    NAME_CHARS,
    Holder,
    HolderReader,
    parse_btime,
    parse_cmdline,
    parse_pod_dirs,
    parse_stat,
    parse_uid,
    passwd_name,
)

HZ = os.sysconf("SC_CLK_TCK")
BTIME = 1_700_000_000
CID = "4f1c8d0e9b7a6c5d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d"
CID2 = "a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2"
POD = "7e1d0c2b-3a4f-4e5d-9c8b-0a1f2e3d4c5b"
SESSION = "0::/user.slice/user-1000.slice/session-3.scope\n"

# One file per layout, as a process in it would show them on the host.
V1_DOCKER = (
    "".join(
        f"{n}:{c}:/docker/{CID}\n" for n, c in [(11, "pids"), (10, "memory"), (4, "cpu,cpuacct"), (1, "name=systemd")]
    )
    + "12:rdma:/\n0::/system.slice/containerd.service\n"
)
V1_KUBEPODS_CGROUPFS = "".join(
    f"{n}:{c}:/kubepods/besteffort/pod{POD}/{CID}\n" for n, c in [(9, "memory"), (6, "devices"), (1, "name=systemd")]
)
V1_KUBEPODS_SYSTEMD = (
    "7:memory:/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{POD.replace('-', '_')}.slice/docker-{CID}.scope\n"
    "1:name=systemd:/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{POD.replace('-', '_')}.slice/docker-{CID}.scope\n"
)
V2_KUBEPODS_SYSTEMD = (
    "0::/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{POD.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n"
)
V2_KUBEPODS_GUARANTEED = f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n"
V2_KUBEPODS_CRIO = (
    "0::/kubepods.slice/kubepods-besteffort.slice/"
    f"kubepods-besteffort-pod{POD.replace('-', '_')}.slice/crio-{CID}.scope/container\n"
)
V2_KUBEPODS_CGROUPFS = f"0::/kubepods/burstable/pod{POD}/{CID}\n"
V2_DOCKER_SYSTEMD = f"0::/system.slice/docker-{CID}.scope\n"
V2_DOCKER_CGROUPFS = f"0::/docker/{CID}\n"
V2_PODMAN = f"0::/machine.slice/libpod-{CID}.scope\n"
V2_PODMAN_CONMON = f"0::/machine.slice/libpod-conmon-{CID}.scope\n"
V1_SLURM = (
    "10:devices:/slurm/uid_1000/job_12345/step_0/task_0\n"
    "9:memory:/slurm/uid_1000/job_12345/step_0/task_0\n"
    "4:cpuset:/slurm/uid_1000/job_12345/step_0\n"
    "1:name=systemd:/system.slice/slurmd.service\n"
)
V2_SLURM = "0::/system.slice/slurmstepd.scope/job_12345/step_batch/user/task_0\n"
V2_SLURM_MULTIPLE_SLURMD = "0::/system.slice/gpu-node-7_slurmstepd.scope/job_98/step_extern/user/task_special\n"
KIND_NODE = f"0::/docker/{CID2}/kubepods/besteffort/pod{POD}/{CID}\n"


LAYOUTS = [
    ("v1-docker", V1_DOCKER, CgroupIds(container_id=CID)),
    ("v1-kubepods-cgroupfs", V1_KUBEPODS_CGROUPFS, CgroupIds(container_id=CID, pod_uid=POD)),
    ("v1-kubepods-systemd", V1_KUBEPODS_SYSTEMD, CgroupIds(container_id=CID, pod_uid=POD)),
    ("v2-kubepods-systemd", V2_KUBEPODS_SYSTEMD, CgroupIds(container_id=CID, pod_uid=POD)),
    ("v2-kubepods-guaranteed", V2_KUBEPODS_GUARANTEED, CgroupIds(container_id=CID, pod_uid=POD)),
    ("v2-kubepods-crio", V2_KUBEPODS_CRIO, CgroupIds(container_id=CID, pod_uid=POD)),
    ("v2-kubepods-cgroupfs", V2_KUBEPODS_CGROUPFS, CgroupIds(container_id=CID, pod_uid=POD)),
    ("v2-docker-systemd", V2_DOCKER_SYSTEMD, CgroupIds(container_id=CID)),
    ("v2-docker-cgroupfs", V2_DOCKER_CGROUPFS, CgroupIds(container_id=CID)),
    ("v2-podman", V2_PODMAN, CgroupIds(container_id=CID)),
    ("v2-podman-conmon", V2_PODMAN_CONMON, NOTHING),
    ("v1-podman-cgroupfs", f"3:memory:/libpod_parent/libpod-{CID}\n", CgroupIds(container_id=CID)),
    ("v1-slurm", V1_SLURM, CgroupIds(job_id="12345", job_step="0")),
    ("v2-slurm", V2_SLURM, CgroupIds(job_id="12345", job_step="batch")),
    ("v2-slurm-multiple-slurmd", V2_SLURM_MULTIPLE_SLURMD, CgroupIds(job_id="98", job_step="extern")),
    ("v2-slurm-job-level", "0::/system.slice/slurmstepd.scope/job_5\n", CgroupIds(job_id="5")),
    ("kind-node", KIND_NODE, CgroupIds(container_id=CID, pod_uid=POD)),
    ("user-session", SESSION, NOTHING),
    ("root", "0::/\n", NOTHING),
    ("empty", "", NOTHING),
    ("job-outside-slurm", "0::/user.slice/job_123/step_0\n", NOTHING),
    ("short-container-id", f"0::/system.slice/docker-{CID[:12]}.scope\n", NOTHING),
    ("qos-level-only", "0::/kubepods.slice/kubepods-burstable.slice\n", NOTHING),
]


@pytest.mark.parametrize(("text", "expected"), [pytest.param(t, e, id=i) for i, t, e in LAYOUTS])
def test_cgroup_layouts(text: str, expected: CgroupIds) -> None:
    assert parse_cgroup(text) == expected


def test_cgroup_paths_keep_colons_and_drop_repeats() -> None:
    assert cgroup_paths("3:memory:/a:b\n2:cpu:/a:b\n1:name=systemd:/c\nnot a line\n") == ["/a:b", "/c"]


def stat_line(pid: int, comm: str, start: int) -> str:
    after = ["S", "1", str(pid), str(pid), "0", "-1", "4194560"] + ["0"] * 43
    after[19] = str(start)
    return f"{pid} ({comm}) {' '.join(after)}\n"


def test_parse_stat_splits_at_the_last_parenthesis() -> None:
    assert parse_stat(stat_line(42, "a b) (c) S 1 2", 987654)) == 987654
    assert parse_stat(stat_line(42, "python3", 5)) == 5
    assert parse_stat("42 (python3 S 1") is None
    assert parse_stat("42 (python3) S 1 2 3") is None
    assert parse_stat("") is None


def test_parse_small_files() -> None:
    status = "Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t1001\t0\t0\t0\nGid:\t1001\t1001\t1001\t1001\n"
    assert parse_uid(status) == 1001
    assert parse_uid("Name:\tx\n") is None
    assert parse_btime("cpu  1 2 3\nintr 9\nbtime 1700000000\nprocesses 7\n") == 1_700_000_000
    assert parse_btime("cpu 1\n") is None
    assert parse_cmdline(b"python3\0train.py\0--lr\x000.1\0") == "python3 train.py --lr 0.1"
    assert parse_cmdline(b"") is None
    assert parse_cmdline(b"x" * 5000) == "x" * COMMAND_CHARS
    assert parse_pod_dirs(["ml_trainer-0_" + POD, "kube-system_dcgm-exporter-x7k2p_abc", POD, "a__b", "x_y_z_w"]) == {
        POD: ("ml", "trainer-0"),
        "abc": ("kube-system", "dcgm-exporter-x7k2p"),
    }


def test_passwd_name_looks_up_the_host_and_knows_no_one_for_a_stranger() -> None:
    assert passwd_name(0) == "root"
    assert passwd_name(3_999_999_999) is None


class Proc:
    """A proc tree in a folder: `/proc/stat` and, per process, the files the reader looks at."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()
        (root / "stat").write_text(f"cpu  10 0 20 300 0 0 0 0 0 0\nintr 1 2\nctxt 99\nbtime {BTIME}\nprocesses 500\n")

    def add(
        self,
        pid: int,
        *,
        comm: str = "python3",
        uid: int = 1000,
        start: int = 360_000,
        cgroup: str = SESSION,
        cmdline: bytes = b"python3\0train.py\0--epochs\x0010\0",
    ) -> Path:
        folder = self.root / str(pid)
        folder.mkdir(exist_ok=True)
        (folder / "comm").write_text(comm + "\n")
        (folder / "stat").write_text(stat_line(pid, comm, start))
        (folder / "status").write_text(
            f"Name:\t{comm}\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{pid}\nPid:\t{pid}\nPPid:\t1\n"
            f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{uid}\t{uid}\t{uid}\t{uid}\nThreads:\t12\n"
        )
        (folder / "cgroup").write_text(cgroup)
        (folder / "cmdline").write_bytes(cmdline)
        return folder


@pytest.fixture
def proc(tmp_path: Path) -> Proc:
    return Proc(tmp_path / "proc")


def names(uid: int) -> str | None:
    return {1000: "alice", 0: "root"}.get(uid)


def reader(tmp_path: Path, **kwargs: object) -> HolderReader:
    r = HolderReader(tmp_path / "proc", tmp_path / "pods", user_of=names, **kwargs)  # type: ignore[arg-type]
    r.begin_interval()
    return r


def test_a_pod_process_is_read_whole(tmp_path: Path, proc: Proc) -> None:
    proc.add(4242, start=123_456, cgroup=V2_KUBEPODS_SYSTEMD)
    (tmp_path / "pods" / f"ml_trainer-0_{POD}" / "trainer").mkdir(parents=True)
    (tmp_path / "pods" / f"ml_other_{'0' * 8}-0000-0000-0000-{'0' * 12}").mkdir()
    r = reader(tmp_path)
    holder = r.read(4242, 20_480)
    assert holder == Holder(
        pid=4242,
        executable="python3",
        uid=1000,
        user="alice",
        started_at=BTIME + 123_456 / HZ,
        used_mib=20_480,
        container_id=CID,
        pod_uid=POD,
        namespace="ml",
        pod="trainer-0",
    )
    assert r.errors == {}


def test_a_slurm_task_names_its_job_and_step(tmp_path: Path, proc: Proc) -> None:
    proc.add(7, cgroup=V2_SLURM)
    holder = reader(tmp_path).read(7, None)
    assert holder is not None
    assert (holder.job_id, holder.job_step, holder.container_id, holder.pod_uid) == ("12345", "batch", None, None)


def test_the_command_line_is_read_only_when_asked(tmp_path: Path, proc: Proc) -> None:
    (proc.add(10) / "cmdline").unlink()
    holder = reader(tmp_path).read(10, 100)
    assert holder is not None and holder.command is None and holder.executable == "python3"

    proc.add(11, cmdline=b"python3\0-c\0" + b"y" * 3000 + b"\0")
    holder = reader(tmp_path, with_args=True).read(11, 100)
    assert holder is not None and holder.command is not None
    assert holder.command.startswith("python3 -c yyy") and len(holder.command) == COMMAND_CHARS
    proc.add(12)
    assert reader(tmp_path, with_args=True).read(12, 1) == Holder(
        12, "python3", 1000, "alice", BTIME + 360_000 / HZ, 1, command="python3 train.py --epochs 10"
    )


def test_a_command_name_with_spaces_and_parentheses(tmp_path: Path, proc: Proc) -> None:
    proc.add(13, comm="my) (job x", start=777)
    holder = reader(tmp_path).read(13, None)
    assert holder is not None
    assert (holder.executable, holder.started_at) == ("my) (job x", BTIME + 777 / HZ)


def test_an_exited_process_is_no_holder(tmp_path: Path, proc: Proc) -> None:
    r = reader(tmp_path)
    assert r.read(99, 10) is None
    (proc.add(100) / "status").unlink()  # exited between the stat and the status reads
    assert r.read(100, 10) is None
    assert r.errors == {"holders:exited": 2}


def test_an_unreadable_file_leaves_only_its_figure_out(
    tmp_path: Path, proc: Proc, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = proc.add(20, cgroup=V2_DOCKER_SYSTEMD)
    real_open = os.open
    denied = {str(folder / "status"), str(folder / "cgroup")}

    def guarded(path: str, flags: int, *args: int, **kwargs: int) -> int:
        if path in denied:
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", guarded)
    holder = reader(tmp_path).read(20, 5)
    assert holder == Holder(20, "python3", None, None, BTIME + 360_000 / HZ, 5)
    (folder / "comm").unlink()
    (folder / "comm").mkdir()  # reading a folder fails with another OSError
    r = reader(tmp_path)
    holder = r.read(20, 5)
    assert holder is not None and holder.executable is None and holder.started_at is not None
    assert r.errors == {"holders:permission_denied": 2, "holders:unreadable": 1}


def test_a_bad_stat_or_boot_time_leaves_the_start_out(tmp_path: Path, proc: Proc) -> None:
    folder = proc.add(30)
    (folder / "stat").write_text("30 (python3) S 1\n")
    r = reader(tmp_path)
    holder = r.read(30, 1)
    assert holder is not None and holder.started_at is None and holder.user == "alice"
    (folder / "comm").unlink()
    assert r.read(30, 1) is None, "a process whose start is unknown is read afresh, not kept"
    assert r.errors == {"holders:unparsable": 2, "holders:exited": 1}

    proc.add(31)
    (proc.root / "stat").write_text("cpu 1 2 3\n")
    r = reader(tmp_path)
    holder = r.read(31, 1)
    assert holder is not None and holder.started_at is None and holder.executable == "python3"
    assert r.errors == {"holders:unparsable": 1}


def test_pod_names_come_from_the_pods_folder_when_it_exists(tmp_path: Path, proc: Proc) -> None:
    proc.add(40, cgroup=V1_KUBEPODS_CGROUPFS)
    r = reader(tmp_path)
    holder = r.read(40, 1)
    assert holder is not None and (holder.pod_uid, holder.namespace, holder.pod) == (POD, None, None)
    assert r.errors == {}, "no pods folder is not an error"

    (tmp_path / "pods" / f"team-a_llm-serve-6d5f_{POD}").mkdir(parents=True)
    assert r.read(40, 1) == holder, "the folder is listed at most once an interval"
    r.begin_interval()
    named = r.read(40, 1)
    assert named is not None and (named.namespace, named.pod) == ("team-a", "llm-serve-6d5f")
    for name in ("comm", "status", "cgroup"):
        (proc.root / "40" / name).unlink()
    r.begin_interval()
    assert r.read(40, 1) == named

    (tmp_path / "pods2").write_text("not a folder")
    r = HolderReader(proc.root, tmp_path / "pods2", user_of=names)
    proc.add(40, cgroup=V1_KUBEPODS_CGROUPFS)
    holder = r.read(40, 1)
    assert holder is not None and holder.pod_uid == POD and holder.pod is None
    assert r.errors == {"holders:pods_unreadable": 1}


def test_a_known_process_costs_one_stat_read(tmp_path: Path, proc: Proc) -> None:
    folder = proc.add(50, cgroup=V2_KUBEPODS_CGROUPFS)
    (tmp_path / "pods" / f"ml_trainer-0_{POD}").mkdir(parents=True)
    r = reader(tmp_path, with_args=True)
    first = r.read(50, 1000)
    assert first is not None and first.command is not None and first.pod == "trainer-0"
    for name in ("comm", "status", "cgroup", "cmdline"):
        (folder / name).unlink()
    (tmp_path / "pods" / f"ml_trainer-0_{POD}").rmdir()
    for _ in range(3):
        r.begin_interval()
        assert r.read(50, 1000) == first
    assert r.read(50, 1200) == replace(first, used_mib=1200)
    assert r.errors == {}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def counted_opens(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths `os.open` is asked for from now on."""
    opened: list[str] = []
    real_open = os.open

    def counting(path: str, flags: int, *args: int, **kwargs: int) -> int:
        opened.append(str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting)
    return opened


def test_a_known_pid_is_not_read_again_within_the_cadence(
    tmp_path: Path, proc: Proc, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc.add(55)
    clock = Clock()
    r = reader(tmp_path, revalidate_s=60.0, clock=clock)
    first = r.read(55, 100)
    assert first is not None
    opened = counted_opens(monkeypatch)
    for _ in range(10):
        clock.now += 5.9
        r.begin_interval()
        assert r.read(55, 100) is first
    assert r.read(55, 120) == replace(first, used_mib=120)
    assert opened == [], "listed interval after interval: no /proc read until the cadence is due"

    proc.add(56)
    assert r.read(56, 1) is not None
    assert opened == [str(proc.root / "56" / name) for name in ("stat", "comm", "status", "cgroup")], "a new pid is"

    clock.now += 1.0  # 60.0 s since pid 55 was checked
    r.begin_interval()
    opened.clear()
    assert r.read(55, 120) == replace(first, used_mib=120)
    assert opened == [str(proc.root / "55" / "stat")], "after the cadence, one stat read re-validates it"


def test_a_pid_missing_from_one_interval_is_read_again(
    tmp_path: Path, proc: Proc, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc.add(57)
    r = reader(tmp_path, clock=Clock())
    assert r.read(57, 1) is not None
    r.begin_interval()  # NVML did not list it in this interval
    r.begin_interval()
    opened = counted_opens(monkeypatch)
    assert r.read(57, 1) is not None
    assert opened == [str(proc.root / "57" / name) for name in ("stat", "comm", "status", "cgroup")], "forgotten"


def test_a_reused_pid_becomes_a_new_holder_after_the_cadence(tmp_path: Path, proc: Proc) -> None:
    proc.add(60, comm="python3", start=1000, cgroup=V2_DOCKER_CGROUPFS)
    clock = Clock()
    r = reader(tmp_path, revalidate_s=60.0, clock=clock)
    old = r.read(60, 1)
    assert old is not None and old.executable == "python3"
    proc.add(60, comm="ollama", uid=0, start=5000, cgroup=V2_SLURM)
    clock.now += 30.0
    r.begin_interval()
    assert r.read(60, 1) is old, "within the cadence a pid listed again is taken for the same process"
    clock.now += 30.0
    r.begin_interval()
    holder = r.read(60, 2)
    assert holder == Holder(
        60, "ollama", 0, "root", BTIME + 5000 / HZ, 2, job_id="12345", job_step="batch", container_id=None
    )
    clock.now += 1.0
    r.begin_interval()
    assert r.read(60, 2) is holder


def test_holders_vouched_for_are_kept_until_one_changes_or_is_due(tmp_path: Path, proc: Proc) -> None:
    for pid in (81, 82, 83):
        proc.add(pid)
    clock = Clock()
    r = reader(tmp_path, revalidate_s=60.0, clock=clock)
    a, b, c = (r.read(pid, 100) for pid in (81, 82, 83))
    assert a is not None and b is not None and c is not None
    vouched = r.vouch((a, b))
    assert vouched is not None
    for _ in range(3):
        clock.now += 10.0
        r.begin_interval()
        assert r.keep(vouched), "nothing changed"
        assert r.read(83, 100) is c
    assert r.read(83, 200) is not c
    r.begin_interval()
    assert r.keep(vouched), "another pid's holder changed: these are still what a read gives"
    assert r.read(82, 300) is not b
    r.begin_interval()
    assert not r.keep(vouched), "one of them changed"

    again = (r.read(81, 100), r.read(82, 300))
    assert again[0] is a and again[1] is not None
    fresh = r.vouch(again)  # type: ignore[arg-type]
    assert fresh is not None and r.keep(fresh)
    clock.now += 30.0  # 60 s since 81 was checked
    r.begin_interval()
    assert not r.keep(fresh), "due for a check"
    assert r.read(81, 100) is a, "which finds the same process"
    assert r.vouch((a, b)) is None, "b is no longer what a read gives"


def test_a_kept_holder_counts_as_read_in_its_interval(tmp_path: Path, proc: Proc) -> None:
    proc.add(84)
    r = reader(tmp_path, clock=Clock())
    holder = r.read(84, 1)
    assert holder is not None
    vouched = r.vouch((holder,))
    assert vouched is not None
    for _ in range(3):
        r.begin_interval()
        assert r.keep(vouched)
    r.begin_interval()
    r.begin_interval()  # neither kept nor read in the interval before: forgotten
    assert not r.keep(vouched)


def test_a_pod_not_yet_named_is_not_vouched_for(tmp_path: Path, proc: Proc) -> None:
    proc.add(85, cgroup=V2_KUBEPODS_CGROUPFS)
    r = reader(tmp_path)
    holder = r.read(85, 1)
    assert holder is not None and holder.pod_uid == POD and holder.pod is None
    assert r.vouch((holder,)) is None, "kubelet may write the pod's folder later"


def test_processes_not_seen_in_an_interval_are_forgotten(tmp_path: Path, proc: Proc) -> None:
    folder = proc.add(70)
    r = reader(tmp_path)
    assert r.read(70, 1) is not None
    r.begin_interval()
    r.begin_interval()
    (folder / "comm").unlink()
    assert r.read(70, 1) is None, "forgotten, so read afresh, and its comm is gone"


def test_user_names_are_looked_up_once_per_uid(tmp_path: Path, proc: Proc) -> None:
    asked: list[int] = []

    def lookup(uid: int) -> str | None:
        asked.append(uid)
        return None if uid == 4321 else f"u{uid}"

    for pid, uid in [(80, 1000), (81, 1000), (82, 4321), (83, 4321)]:
        proc.add(pid, uid=uid)
    r = HolderReader(proc.root, tmp_path / "pods", user_of=lookup)
    users = [h.user if (h := r.read(pid, None)) else "gone" for pid in (80, 81, 82, 83)]
    assert users == ["u1000", "u1000", None, None]
    assert asked == [1000, 4321]


def test_the_wire_form_drops_what_is_unknown() -> None:
    holder = Holder(5, "python3", 1000, None, 1_700_000_123.956789, 300, container_id=CID)
    assert holder.to_wire() == {
        "pid": 5,
        "executable": "python3",
        "uid": 1000,
        "started_at": "2023-11-14T22:15:23Z",
        "container_id": CID,
    }, "memory is the sample's, not the description's; the start is RFC 3339 in whole seconds"


def test_the_wire_form_keeps_to_the_bounds() -> None:
    holder = Holder(
        6,
        "tab\there",
        0,
        "u" * 300,
        86_400.0,  # booted with the clock at 1970: a start the server would refuse
        None,
        container_id="c" * 200,
        pod_uid="p" * 200,
        namespace="n" * 300,
        pod="q" * 300,
        job_id="9" * 200,
        job_step="s" * 200,
        command="python3 -c 'line one\nline two' " + "x" * 2000,
    )
    wire = holder.to_wire()
    assert "started_at" not in wire
    assert wire["executable"] == "tab\ufffdhere"
    assert [len(wire[k]) for k in ("user", "namespace", "pod")] == [NAME_CHARS] * 3
    assert [len(wire[k]) for k in ("container_id", "pod_uid", "job_id", "job_step")] == [ID_CHARS] * 4
    assert len(wire["command"]) == COMMAND_CHARS and "\n" not in wire["command"]
    assert (NAME_CHARS, ID_CHARS, COMMAND_CHARS) == (253, 128, 1024)


def test_the_default_roots(tmp_path: Path) -> None:
    r = HolderReader()
    assert (r.proc_root, r.pods_root, r.with_args) == (Path("/proc"), Path("/var/log/pods"), False)
    me = r.read(os.getpid(), None)
    assert me is not None and me.started_at is not None
    this = psutil.Process()
    assert (me.executable, me.uid) == (this.name()[:15], os.getuid())
    assert me.started_at == pytest.approx(this.create_time(), abs=0.02)
    assert r.errors == {}
