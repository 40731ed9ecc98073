"""The simulated hosts' /proc: every scenario process has an entry, read back as the agent reads a real host."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest

from agent import fake_nvml
from agent.collect.cgroups import parse_cgroup
from agent.collect.holders import Holder, HolderReader, parse_btime, parse_stat
from agent.fake_nvml import SCENARIOS, FakeNvml
from agent.fake_nvml.procfs import HZ, UPTIME_S

from .conftest import Clock

EPOCH = 1_795_000_000.0  # 2026-11-18T11:06:40Z, UTC epoch seconds


def scenario_procs(lib: FakeNvml) -> list[tuple[int, int]]:
    """(pid, MiB) of every process the scenario has, running now or not."""
    return [(p.pid, p.used_bytes >> 20) for g in lib._gpus for p in g.procs]


def read_all(lib: FakeNvml, root: Path, *, with_args: bool = False) -> dict[int, Holder]:
    """Every scenario process as the agent's reader sees it in the tree written under `root`."""
    tree = lib.proc_tree(root)
    reader = HolderReader(tree.proc_root, tree.pods_root, user_of=tree.users.get, with_args=with_args)
    reader.begin_interval()
    found: dict[int, Holder] = {}
    for pid, mib in scenario_procs(lib):
        holder = reader.read(pid, mib)
        assert holder is not None, f"no /proc entry for {pid}"
        found[pid] = holder
    assert reader.errors == {}
    return found


@pytest.mark.parametrize("scenario", sorted(set(SCENARIOS) - {"no-driver", "no-gpu"}))
def test_every_scenario_process_has_a_proc_entry(scenario: str, tmp_path: Path) -> None:
    lib = fake_nvml.load(scenario, clock=Clock(EPOCH))
    found = read_all(lib, tmp_path)
    assert all(h.executable and h.user and h.started_at for h in found.values())
    assert len(found) == len(scenario_procs(lib)), "no two processes share a PID"


def test_the_tree_is_what_proc_5_says(tmp_path: Path) -> None:
    lib = fake_nvml.load("p4d-train", clock=Clock(EPOCH))
    tree = lib.proc_tree(tmp_path)
    boot = parse_btime((tree.proc_root / "stat").read_text())
    assert boot == int(EPOCH) - UPTIME_S
    pid = scenario_procs(lib)[0][0]
    folder = tree.proc_root / str(pid)
    assert sorted(os.listdir(folder)) == ["cgroup", "cmdline", "comm", "stat", "status"]
    start = parse_stat((folder / "stat").read_text())
    assert start is not None and boot + start / HZ == EPOCH - 3 * 3600, "started 3 h before the epoch"
    assert (folder / "cmdline").read_bytes() == b"python3\0-u\0train.py\0--config\0llama-7b.yaml\0"
    assert (folder / "comm").read_text() == "python3\n"


def test_p4d_train_is_one_slurm_job_on_cgroup_v1(tmp_path: Path) -> None:
    lib = fake_nvml.load("p4d-train", clock=Clock(EPOCH))
    found = read_all(lib, tmp_path, with_args=True)
    assert {(h.user, h.uid, h.executable, h.job_id, h.job_step) for h in found.values()} == {
        ("mchen", 1207, "python3", "48213", "0")
    }
    cgroups = [(tmp_path / "proc" / str(pid) / "cgroup").read_text() for pid in found]
    assert all(text.startswith("12:freezer:/slurm/uid_1207/job_48213/step_0\n") for text in cgroups)
    tasks = {text.split("\n")[1].rsplit("/", 1)[1] for text in cgroups}
    assert tasks == {f"task_{n}" for n in range(8)}, "one task per GPU"


def test_p5_inference_serves_from_one_pod_per_slice_on_cgroup_v2(tmp_path: Path) -> None:
    lib = fake_nvml.load("p5-inference", clock=Clock(EPOCH))
    found = list(read_all(lib, tmp_path).values())
    assert len(found) == 25 and len({h.pod_uid for h in found}) == 25
    for h in found:
        assert (h.namespace, h.user, h.executable) == ("inference", "root", "vllm")
        assert h.pod is not None and h.pod.startswith("vllm-llama-3-1-8b-")
        assert h.container_id is not None and len(h.container_id) == 64
        folder = f"inference_{h.pod}_{h.pod_uid}"
        assert (tmp_path / "pods" / folder / "vllm-llama-3-1-8b").is_dir()
    text = (tmp_path / "proc" / str(found[0].pid) / "cgroup").read_text()
    assert text.startswith("0::/kubepods.slice/kubepods-burstable.slice/") and text.count("\n") == 1


def test_the_notebook_is_a_users_kernel_outside_any_container(tmp_path: Path) -> None:
    lib = fake_nvml.load("g5-notebook", clock=Clock(EPOCH))
    [holder] = read_all(lib, tmp_path, with_args=True).values()
    assert (holder.user, holder.uid, holder.executable, holder.container_id, holder.job_id) == (
        "asmith",
        1003,
        "python3",
        None,
        None,
    )
    assert holder.command is not None and "ipykernel_launcher" in holder.command
    assert scenario_procs(lib) == [(holder.pid, 9216)]


@pytest.mark.parametrize(("scenario", "version"), [("g5-batch", 1), ("p4d-shared", 1), ("p4d-mig", 2), ("p5", 2)])
def test_cgroup_files_are_written_in_the_hosts_version(scenario: str, version: int, tmp_path: Path) -> None:
    lib = fake_nvml.load(scenario, clock=Clock(EPOCH))
    lib.proc_tree(tmp_path)
    for pid, _ in scenario_procs(lib):
        text = (tmp_path / "proc" / str(pid) / "cgroup").read_text()
        assert (text.startswith("0::") and text.count("\n") == 1) == (version == 2)
    ids = parse_cgroup((tmp_path / "proc" / str(scenario_procs(lib)[0][0]) / "cgroup").read_text())
    assert (ids.container_id is not None) == (scenario != "p5"), "p4d-mig's first process runs in Docker"
    assert (ids.pod_uid is not None) == (scenario == "p4d-shared")


def test_the_same_scenario_and_seed_write_the_same_identities(tmp_path: Path) -> None:
    first = read_all(fake_nvml.load("p5-inference", clock=Clock(EPOCH)), tmp_path / "a")
    again = read_all(fake_nvml.load("p5-inference", clock=Clock(EPOCH)), tmp_path / "b")
    other = read_all(fake_nvml.load("p5-inference", clock=Clock(EPOCH), seed=1), tmp_path / "c")
    assert first == again
    assert {h.pod for h in first.values()}.isdisjoint(h.pod for h in other.values())


def test_a_process_a_test_adds_has_no_entry(tmp_path: Path) -> None:
    lib = fake_nvml.load("g5-idle", clock=Clock(EPOCH))
    lib.add_process(0, 4242, 100)
    tree = lib.proc_tree(tmp_path)
    assert not (tree.proc_root / "4242").exists()
    assert os.listdir(tree.proc_root) == ["stat"]


def test_the_default_folder_is_the_librarys_own_and_goes_with_it() -> None:
    lib = fake_nvml.load("g5-notebook", clock=Clock(EPOCH))
    tree = lib.proc_tree()
    assert lib.proc_tree().proc_root == tree.proc_root, "one folder per library, rewritten in place"
    root = tree.proc_root.parent
    assert root.name.startswith("gpufleet-fake-proc-") and root.is_dir()
    del lib
    gc.collect()
    assert not root.exists()


def test_a_clock_that_is_not_utc_dates_processes_from_now(tmp_path: Path) -> None:
    lib = fake_nvml.load("g5-notebook", clock=Clock(1000.0))
    [holder] = read_all(lib, tmp_path).values()
    assert holder.started_at is not None and holder.started_at > EPOCH - 86_400 * 365


def test_devices_may_name_who_runs_on_them(tmp_path: Path) -> None:
    lib = fake_nvml.load("p4d-mig", clock=Clock(EPOCH))
    found = read_all(lib, tmp_path)
    idle_held = [found[p.pid] for p in lib._gpus[6].procs]
    assert [(h.user, h.used_mib) for h in idle_held] == [("asmith", 30000)], "a notebook holds the idle GPU"
    first_slice = [found[p.pid] for p in lib._gpus[0].procs if p.gi_id == 7]
    assert [(h.user, h.container_id is not None) for h in first_slice] == [("ubuntu", True)]
    others = [h for h in found.values() if h not in idle_held + first_slice]
    assert {(h.user, h.container_id) for h in others} == {("ubuntu", None)}, "the rest: login sessions"
