"""Who a process belongs to, read from the paths in its `/proc/<pid>/cgroup`: container, Kubernetes pod, Slurm job.

Pure parsing, no I/O. Both cgroup versions: v1 writes one `hierarchy-id:controllers:path` line per hierarchy,
v2 a single `0::path` line; hybrid hosts write both. Every path is read segment by segment, and the first path
that names a figure gives it, so controllers left at `/` and the `name=systemd` line do no harm.

Layouts recognised, with where each name comes from:
- Docker: `/docker/<id>` (cgroupfs driver) and `/system.slice/docker-<id>.scope` (systemd driver), v1 and v2
  (docs.docker.com/engine/containers/runmetrics/, "Find the cgroup for a given container").
- Kubernetes: kubelet's pod cgroup is `/kubepods/[burstable|besteffort/]pod<uid>` with the cgroupfs driver, and
  `kubepods.slice/kubepods-[burstable-|besteffort-]pod<uid with _ for ->.slice` with the systemd driver;
  guaranteed pods have no QoS level (kubernetes pkg/kubelet/cm/cgroup_manager_linux.go, `ToSystemd` and
  `escapeSystemdCgroupName`; the pod-resource-management design proposal). The container below it is
  `<id>` with cgroupfs and `cri-containerd-<id>.scope`, `crio-<id>.scope` or `docker-<id>.scope` with systemd;
  CRI-O with crun can add a `container` level under the scope, which is skipped.
- Podman: `machine.slice/libpod-<id>.scope` (systemd) or `libpod-<id>` (cgroupfs); its monitor's
  `libpod-conmon-<id>.scope` is no container (containers/podman, libpod's cgroup and conmon unit names).
- Slurm: `/slurm/uid_<uid>/job_<id>/step_<step>/task_<n>` with cgroup/v1 and
  `/system.slice/[<node>_]slurmstepd.scope/job_<id>/step_<step>/user/task_<n>` with cgroup/v2, the node prefix
  where one host runs several slurmd (slurm.schedmd.com/cgroups.html and cgroup_v2.html). Steps are numbers or
  batch, extern, interactive. A `job_<id>` folder counts only below a segment naming slurm.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_CONTAINER = re.compile(r"(?:(?:docker|cri-containerd|crio|libpod)-)?([0-9a-f]{64})(?:\.scope)?")
# The pod level's last segment, in both drivers' spellings; kubelet's --cgroup-root may prefix the systemd one.
_POD = re.compile(r"(?:^|-)pod([0-9a-f][0-9a-f_-]*)(?:\.slice)?$")
_JOB = re.compile(r"job_([0-9]+)")
_STEP = re.compile(r"step_(.+)")


@dataclass(frozen=True, slots=True)
class CgroupIds:
    """What a process's cgroups say of it: a 64-hex container id, a Kubernetes pod UID (with dashes), a Slurm
    job id and step. None where the layout does not say."""

    container_id: str | None = None
    pod_uid: str | None = None
    job_id: str | None = None
    job_step: str | None = None


NOTHING = CgroupIds()


def cgroup_paths(text: str) -> list[str]:
    """The distinct paths of a `/proc/<pid>/cgroup` file, v1 or v2, in the order written."""
    paths: list[str] = []
    for line in text.splitlines():
        parts = line.split(":", 2)  # a path may itself hold ':'
        if len(parts) == 3 and parts[2] not in paths:
            paths.append(parts[2])
    return paths


def parse_path(path: str) -> CgroupIds:
    """The ids one cgroup path names."""
    segments = [s for s in path.split("/") if s]
    container = pod = job = step = None
    kubepods = slurm = False
    for i, segment in enumerate(segments):
        found = _CONTAINER.fullmatch(segment)
        if found:
            container = found.group(1)  # the innermost wins: a pod's container under a kind node's
            continue
        if segment.startswith("kubepods") or "-kubepods" in segment:
            kubepods = True
        if "slurm" in segment:
            slurm = True
        if kubepods and pod is None:
            found = _POD.search(segment)
            if found:
                pod = found.group(1).replace("_", "-")
                continue
        if slurm and job is None:
            found = _JOB.fullmatch(segment)
            if found:
                job = found.group(1)
                following = segments[i + 1] if i + 1 < len(segments) else ""
                found = _STEP.fullmatch(following)
                step = found.group(1) if found else None
    return CgroupIds(container, pod, job, step)


def parse_cgroup(text: str) -> CgroupIds:
    """The ids a `/proc/<pid>/cgroup` file names, each from the first path that has it."""
    container = pod = job = step = None
    for path in cgroup_paths(text):
        ids = parse_path(path)
        container = container or ids.container_id
        pod = pod or ids.pod_uid
        if job is None and ids.job_id is not None:
            job, step = ids.job_id, ids.job_step
    if container is None and pod is None and job is None:
        return NOTHING
    return CgroupIds(container, pod, job, step)
