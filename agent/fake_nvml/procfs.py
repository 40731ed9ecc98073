"""The simulated host's /proc and kubelet's pod log folders, written as real files for the agent's holder reader.

Every process of a scenario has an `Owner`, made here from the scenario's `Who`: the user, the executable and
its arguments, when it started, and the cgroup paths of the Slurm job, Docker container, Kubernetes pod or
login session it runs in, in the scenario's cgroup version. `write_tree` puts them where the agent looks:
`<root>/proc/<pid>/{comm,stat,status,cgroup,cmdline}` and `<root>/proc/stat` (its `btime` line), and
`<root>/pods/<namespace>_<pod>_<uid>/<container>/` for pods.

File formats follow proc(5): `stat` is one line whose second field is the command name in parentheses and
whose 22nd is the start in clock ticks after boot; `status` has `Uid:` with real, effective, saved and
filesystem ids; `cmdline` holds the arguments, each ended by NUL. The cgroup paths are those `agent.collect.
cgroups` cites: Slurm's task/cgroup plugin (slurm.schedmd.com/cgroups.html, cgroup_v2.html), Docker's
cgroupfs and systemd drivers (docs.docker.com/engine/containers/runmetrics/), kubelet's pod cgroups
(kubernetes pkg/kubelet/cm/cgroup_manager_linux.go) with containerd's `cri-containerd-<id>.scope`, and
systemd's `user.slice/user-<uid>.slice/session-<n>.scope` for a login session.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .curves import HOUR, key_of, mix, uuid_of
from .model import Owner, Proc
from .scenarios import Who

HZ = os.sysconf("SC_CLK_TCK")  # the agent turns start ticks into seconds with the same figure
UPTIME_S = 12 * 86_400 + 4_321  # the simulated host booted this long before the epoch
# Kubernetes names pods from this alphabet, without vowels and look-alikes (k8s.io/apimachinery
# pkg/util/rand, SafeEncodeString): a ReplicaSet's hash, then five characters for the pod (generateName).
_POD_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
# The cgroup v1 hierarchies a hybrid host lists (hierarchy id, controllers); the unified one comes last, empty.
_V1 = ((12, "freezer"), (11, "memory"), (10, "devices"), (9, "cpuset"), (8, "pids"), (7, "cpu,cpuacct"))
_SLURM_TASK_LEVEL = frozenset({"memory", "devices"})  # task/cgroup confines these per task, the rest per step
_SLURM_STEP_LEVEL = frozenset({"freezer", "cpuset"})


@dataclass(frozen=True, slots=True)
class ProcTree:
    """Where a simulated host's processes were written, and its passwd: uid -> user name."""

    proc_root: Path
    pods_root: Path
    users: dict[int, str]


def owner(who: Who, key: int, task: int, cgroup_version: int) -> Owner:
    """The identity of one process that `who` runs on one device. `key` names the device (its container or pod
    is that device's own); `task` is the process's rank in the scenario (its Slurm task)."""
    container = "".join(f"{mix(key ^ n):016x}" for n in range(4))
    paths: dict[str, str]
    pod_dir = None
    if who.slurm_job is not None:
        job = f"job_{who.slurm_job}/step_{who.slurm_step}"
        if cgroup_version == 1:
            base = f"/slurm/uid_{who.uid}/{job}"
            paths = {c: f"{base}/task_{task}" for c in _SLURM_TASK_LEVEL} | {c: base for c in _SLURM_STEP_LEVEL}
            paths["name=systemd"] = "/system.slice/slurmd.service"
        else:
            paths = {"": f"/system.slice/slurmstepd.scope/{job}/user/task_{task}"}
    elif who.pod is not None:
        namespace, workload = who.pod
        pod_uid = uuid_of(key ^ 0x9D)
        replica_set = _encode(key_of(namespace, workload), 10)
        pod_dir = f"{namespace}_{workload}-{replica_set}-{_encode(key, 5)}_{pod_uid}"
        if cgroup_version == 1:
            paths = {"": f"/kubepods/burstable/pod{pod_uid}/{container}"}
        else:
            level = "kubepods.slice/kubepods-burstable.slice"
            pod = f"kubepods-burstable-pod{pod_uid.replace('-', '_')}.slice"
            paths = {"": f"/{level}/{pod}/cri-containerd-{container}.scope"}
    elif who.docker:
        paths = {"": f"/docker/{container}" if cgroup_version == 1 else f"/system.slice/docker-{container}.scope"}
    else:
        session = f"/user.slice/user-{who.uid}.slice/session-{3 + key % 5}.scope"
        paths = {"": session} if cgroup_version == 2 else {"memory": session, "pids": session, "name=systemd": session}
    return Owner(
        comm=who.executable[:15],  # the kernel keeps 15 bytes of the name (TASK_COMM_LEN 16, with the NUL)
        uid=who.uid,
        user=who.user,
        cmdline=who.args or (who.executable,),
        age_s=who.age_h * HOUR,
        cgroup=_cgroup_file(paths, cgroup_version),
        pod_dir=pod_dir,
        container=who.pod[1] if who.pod is not None else None,
    )


def _encode(value: int, length: int) -> str:
    out = []
    for _ in range(length):
        value, digit = divmod(value, len(_POD_ALPHABET))
        out.append(_POD_ALPHABET[digit])
    return "".join(out)


def _cgroup_file(paths: dict[str, str], version: int) -> str:
    """A `/proc/<pid>/cgroup` file. `paths` maps a v1 controller to its path ("" for every controller not named,
    or the single v2 path)."""
    if version == 2:
        return f"0::{paths['']}\n"
    default = paths.get("", "/")
    lines = [f"{n}:{c}:{paths.get(c, default)}\n" for n, c in _V1]
    lines.append(f"1:name=systemd:{paths.get('name=systemd', default)}\n")
    lines.append("0::/\n")  # the hybrid layout's empty unified hierarchy
    return "".join(lines)


def write_tree(root: Path, procs: Iterable[Proc], epoch_wall_s: float) -> ProcTree:
    """Write the entries of `procs` that have an owner under `root`, as of the epoch `epoch_wall_s` (UTC epoch
    seconds). Entries already there are rewritten; the host booted `UPTIME_S` before the epoch."""
    proc_root, pods_root = root / "proc", root / "pods"
    proc_root.mkdir(parents=True, exist_ok=True)
    pods_root.mkdir(exist_ok=True)
    boot = int(epoch_wall_s) - UPTIME_S
    (proc_root / "stat").write_text(
        f"cpu  4705 356 584 3699176 23 0 29 0 0 0\nintr 1234567 0 9\nctxt 8765432\nbtime {boot}\nprocesses 48213\n"
        "procs_running 2\nprocs_blocked 0\n"
    )
    users = {0: "root"}
    for proc in procs:
        o = proc.owner
        if o is None:
            continue
        users[o.uid] = o.user
        start = round(max(UPTIME_S - o.age_s, 1.0) * HZ)
        folder = proc_root / str(proc.pid)
        folder.mkdir(exist_ok=True)
        (folder / "comm").write_text(o.comm + "\n")
        (folder / "stat").write_text(_stat_line(proc.pid, o.comm, start))
        (folder / "status").write_text(
            f"Name:\t{o.comm}\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{proc.pid}\nNgid:\t0\nPid:\t{proc.pid}\n"
            f"PPid:\t1\nTracerPid:\t0\nUid:\t{o.uid}\t{o.uid}\t{o.uid}\t{o.uid}\n"
            f"Gid:\t{o.uid}\t{o.uid}\t{o.uid}\t{o.uid}\nThreads:\t24\n"
        )
        (folder / "cgroup").write_text(o.cgroup)
        (folder / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in o.cmdline))
        if o.pod_dir is not None and o.container is not None:
            (pods_root / o.pod_dir / o.container).mkdir(parents=True, exist_ok=True)
    return ProcTree(proc_root, pods_root, users)


def _stat_line(pid: int, comm: str, start_ticks: int) -> str:
    # Fields 3-52 of proc(5): state, ppid, pgrp, session, tty, tpgid, flags, faults and times, priority, nice,
    # threads, itrealvalue, then starttime (22), vsize, rss; the rest are 0 here.
    after = ["S", "1", str(pid), str(pid), "0", "-1", "4194560"] + ["0"] * 43
    after[15], after[17], after[19] = "20", "24", str(start_ticks)
    after[20], after[21] = "35651584000", "1048576"
    return f"{pid} ({comm}) {' '.join(after)}\n"
