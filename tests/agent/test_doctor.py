"""doctor's holders line: what the agent found of the processes NVML lists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.config import AgentConfig
from agent.doctor import Check, run_checks


def holders_line(tmp_path: Path, scenario: str, **settings: Any) -> Check:
    config = AgentConfig(fake_nvml=scenario, imds="off", host_id="h", state_dir=tmp_path / "state", **settings)
    [check] = [c for c in run_checks(config) if c.name == "Holders"]
    return check


def test_doctor_says_who_holds_the_gpus(tmp_path: Path) -> None:
    check = holders_line(tmp_path, "p5-inference")
    assert (check.status, check.message) == ("ok", "25 of 25 processes described; users root; 25 in pods")
    assert holders_line(tmp_path, "g5-idle").message == "no compute process running"
    assert holders_line(tmp_path, "g5-idle", holders=False).message == "off (GPUFLEET_AGENT_HOLDERS)"


def test_doctor_warns_when_no_process_is_in_the_proc_it_reads(tmp_path: Path) -> None:
    check = holders_line(tmp_path, "p5", proc_root=tmp_path)  # as in a container with a PID namespace of its own
    assert check.status == "warn"
    assert check.message.startswith(f"none of the 8 processes NVML lists is in {tmp_path}: read the host's /proc")
