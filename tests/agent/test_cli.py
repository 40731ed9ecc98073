"""The command line as an operator meets it: real processes, one readable line on failure, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from app.ingest.schemas import IngestBatchIn
from tests.conftest import make_token

from .imds_server import ImdsServer, closed_port_url
from .live_server import LiveServer

NO_DRIVER = "gpufleet-agent: NVML library not found: is the NVIDIA driver installed?"


def agent(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "agent.env").write_text("")
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_AGENT_")},
        "GPUFLEET_AGENT_CONFIG": str(tmp_path / "agent.env"),
        "GPUFLEET_AGENT_STATE_DIR": str(tmp_path / "state"),
        "GPUFLEET_AGENT_IMDS": "off",
        "GPUFLEET_AGENT_HOST_ID": "test-host",
    }


def test_once_prints_a_batch_the_server_accepts(env: dict[str, str]) -> None:
    result = agent("--fake-nvml", "p4d-mig", "once", "--interval", "0.2", env=env)
    assert result.returncode == 0, result.stderr
    batch = IngestBatchIn.model_validate(json.loads(result.stdout))
    assert len(batch.gpus) == 8 and len(batch.intervals) == 1
    assert batch.instance.instance_id == "test-host" and batch.instance.lifecycle == "on-prem"
    assert result.stderr == ""


def holders_by_device(document: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Each sample's holders, described in full, by device UUID (devices without holders left out)."""
    table = {h["id"]: h for h in document.get("holders", [])}
    [interval] = document["intervals"]
    return {
        s["uuid"]: [{**table[ref["ref"]], **ref} for ref in s["holders"]] for s in interval["samples"] if "holders" in s
    }


def test_once_says_who_holds_each_gpu(env: dict[str, str]) -> None:
    # A Tuesday at noon in UTC-5: p4d-train's job runs in office hours only.
    result = agent(
        "--fake-nvml", "p4d-train", "--fake-clock", "2026-11-24T17:00:00Z", "once", "--interval", "0.2", env=env
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    IngestBatchIn.model_validate(document)
    held = holders_by_device(document)
    assert set(held) == {g["uuid"] for g in document["gpus"]}
    for [h] in held.values():
        assert (h["user"], h["uid"], h["executable"], h["job_id"], h["job_step"]) == (
            "mchen",
            1207,
            "python3",
            "48213",
            "0",
        )
        assert h["started_at"] == "2026-11-24T14:00:00Z" and "command" not in h and h["used_mib"] >= 30000

    result = agent("--fake-nvml", "p5-inference", "once", "--interval", "0.2", env=env)
    document = json.loads(result.stdout)
    held = holders_by_device(document)
    slices = {s["uuid"] for g in document["gpus"] for s in g["slices"]}
    assert len(held) == 25 and set(held) <= slices, "the slices hold them, not their MIG-mode GPUs"
    assert {(h["namespace"], h["executable"], h["pod"][:18]) for [h] in held.values()} == {
        ("inference", "vllm", "vllm-llama-3-1-8b-")
    }

    env["GPUFLEET_AGENT_HOLDER_ARGS"] = "on"
    result = agent("--fake-nvml", "g5-notebook", "once", "--interval", "0.2", env=env)
    [[kernel]] = holders_by_device(json.loads(result.stdout)).values()
    assert (kernel["user"], kernel["executable"], kernel["used_mib"]) == ("asmith", "python3", 9216)
    assert kernel["command"].startswith("/home/asmith/.venv/bin/python3 -m ipykernel_launcher -f ")

    env["GPUFLEET_AGENT_HOLDERS"] = "off"
    result = agent("--fake-nvml", "g5-notebook", "once", "--interval", "0.2", env=env)
    assert "holders" not in result.stdout


def test_a_fake_clock_that_is_no_time_is_a_usage_error(env: dict[str, str]) -> None:
    result = agent("--fake-nvml", "p4d-train", "--fake-clock", "noon", "once", env=env)
    assert result.returncode == 2 and "expected a time like 2026-11-24T15:00:00Z, got 'noon'" in result.stderr


def test_once_names_the_ec2_instance_from_imds(env: dict[str, str]) -> None:
    with ImdsServer(tags={"team": "ml"}) as imds:
        env.update(GPUFLEET_AGENT_IMDS="on", GPUFLEET_AGENT_IMDS_URL=imds.url)
        result = agent("--fake-nvml", "g5-idle", "once", "--interval", "0.2", env=env)
    assert result.returncode == 0, result.stderr
    instance = json.loads(result.stdout)["instance"]
    assert instance["instance_id"] == "i-0abc1234def567890"
    assert instance["tags"] == {"team": "ml"} and instance["lifecycle"] == "spot"


@pytest.mark.parametrize("command", [["run"], ["once", "--interval", "0.1"], ["doctor"]])
def test_no_driver_is_one_line_and_non_zero(env: dict[str, str], command: list[str]) -> None:
    env.update(GPUFLEET_AGENT_SERVER_URL="http://127.0.0.1:9", GPUFLEET_AGENT_TOKEN="gpf_x")
    result = agent("--fake-nvml", "no-driver", *command, env=env)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout
    if command == ["doctor"]:
        assert "FAIL  NVML: NVML library not found: is the NVIDIA driver installed?" in result.stdout.splitlines()
    else:
        assert result.stderr.strip() == NO_DRIVER


def test_the_real_library_on_a_host_without_a_driver(env: dict[str, str]) -> None:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this host has an NVIDIA driver")
    result = agent("once", "--interval", "0.1", env=env)
    assert (result.returncode, result.stderr.strip(), result.stdout) == (3, NO_DRIVER, "")


def test_doctor_all_good(env: dict[str, str], live_server: LiveServer, sessions: sessionmaker[Session]) -> None:
    env.update(GPUFLEET_AGENT_SERVER_URL=live_server.url, GPUFLEET_AGENT_TOKEN=make_token(sessions, "ingest"))
    result = agent("--fake-nvml", "p5-mig", "doctor", env=env)
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stdout
    assert all(line.startswith("ok  ") for line in lines), lines
    assert any("driver 550.127.05" in line for line in lines)
    assert any("8 x NVIDIA H100 80GB HBM3; 8 in MIG mode with 24 slices" in line for line in lines)
    assert any("nvml.gpm on" in line for line in lines)
    assert "ok    Holders: 20 of 20 processes described; users ubuntu" in lines
    assert "ok    Token: accepted for ingest" in lines


@pytest.mark.parametrize(
    ("scope", "expected"),
    [
        (None, "FAIL  Token: the server does not know this token (HTTP 401)"),
        ("read", "FAIL  Token: the token lacks the ingest scope (HTTP 403)"),
    ],
)
def test_doctor_spots_a_bad_token(
    env: dict[str, str], live_server: LiveServer, sessions: sessionmaker[Session], scope: str | None, expected: str
) -> None:
    token = make_token(sessions, scope) if scope else "gpf_unknown"
    env.update(GPUFLEET_AGENT_SERVER_URL=live_server.url, GPUFLEET_AGENT_TOKEN=token)
    result = agent("--fake-nvml", "g5-idle", "doctor", env=env)
    assert result.returncode == 1
    assert expected in result.stdout.splitlines()


def test_doctor_spots_an_unreachable_server(env: dict[str, str]) -> None:
    env.update(GPUFLEET_AGENT_SERVER_URL=closed_port_url(), GPUFLEET_AGENT_TOKEN="gpf_x")
    result = agent("--fake-nvml", "g5-idle", "doctor", env=env)
    assert result.returncode == 1
    assert any(line.startswith("FAIL  Server:") and "not reachable" in line for line in result.stdout.splitlines())


def test_doctor_with_imds_required_but_absent(env: dict[str, str]) -> None:
    env.update(GPUFLEET_AGENT_IMDS="on", GPUFLEET_AGENT_IMDS_URL=closed_port_url(), GPUFLEET_AGENT_IMDS_TIMEOUT_S="0.3")
    result = agent("--fake-nvml", "g5-idle", "doctor", env=env)
    assert result.returncode == 1
    assert any(line.startswith("FAIL  Identity:") for line in result.stdout.splitlines())


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("GPUFLEET_AGENT_INTERVAL_S", "often", "GPUFLEET_AGENT_INTERVAL_S: expected a number, got 'often'"),
        ("GPUFLEET_AGENT_INTERVAL_S", "-1", "GPUFLEET_AGENT_INTERVAL_S: must be a number above 0, got '-1'"),
        ("GPUFLEET_AGENT_SERVER_URL", "gpufleet:8000", "GPUFLEET_AGENT_SERVER_URL: expected http(s)://host[:port]"),
        ("GPUFLEET_AGENT_IMDS", "maybe", "GPUFLEET_AGENT_IMDS: expected auto, on or off, got 'maybe'"),
        ("GPUFLEET_AGENT_BATCH_INTERVALS", "0", "GPUFLEET_AGENT_BATCH_INTERVALS: must be between 1 and 360, got 0"),
        ("GPUFLEET_AGENT_HOLDERS", "maybe", "GPUFLEET_AGENT_HOLDERS: expected on or off, got 'maybe'"),
    ],
)
def test_bad_settings_are_one_line(env: dict[str, str], setting: str, value: str, message: str) -> None:
    env[setting] = value
    result = agent("--fake-nvml", "g5-idle", "once", env=env)
    assert result.returncode == 2
    assert result.stderr.startswith("gpufleet-agent: " + message)
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_env_file_is_read_and_the_environment_wins(env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "agent.env").write_text('GPUFLEET_AGENT_HOST_ID="from-file"\nGPUFLEET_AGENT_TAGS=team=ml\n')
    del env["GPUFLEET_AGENT_HOST_ID"]
    result = agent("--fake-nvml", "g5-idle", "once", "--interval", "0.1", env=env)
    instance = json.loads(result.stdout)["instance"]
    assert (instance["instance_id"], instance["tags"]) == ("from-file", {"team": "ml"})
    env["GPUFLEET_AGENT_HOST_ID"] = "from-env"
    result = agent("--fake-nvml", "g5-idle", "once", "--interval", "0.1", env=env)
    assert json.loads(result.stdout)["instance"]["instance_id"] == "from-env"


def test_a_missing_named_config_file(env: dict[str, str], tmp_path: Path) -> None:
    env["GPUFLEET_AGENT_CONFIG"] = str(tmp_path / "nope.env")
    result = agent("--fake-nvml", "g5-idle", "once", env=env)
    assert (result.returncode, result.stderr.strip()) == (
        2,
        f"gpufleet-agent: config file {tmp_path}/nope.env does not exist",
    )


def test_run_needs_a_server_and_a_token(env: dict[str, str]) -> None:
    result = agent("--fake-nvml", "g5-idle", "run", env=env)
    assert result.returncode == 2 and "GPUFLEET_AGENT_SERVER_URL is not set" in result.stderr
    env["GPUFLEET_AGENT_SERVER_URL"] = "https://gpufleet.example.com"
    result = agent("--fake-nvml", "g5-idle", "run", env=env)
    assert result.returncode == 2 and "no ingest token" in result.stderr


def test_install_into_an_image_root(env: dict[str, str], tmp_path: Path) -> None:
    root = tmp_path / "image"
    binary = root / "opt/gpufleet-agent/bin/gpufleet-agent"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    result = agent(
        "install",
        "--root",
        str(root),
        "--exec-path",
        "/opt/gpufleet-agent/bin/gpufleet-agent",
        "--server-url",
        "https://gpufleet.example.com",
        "--token",
        "gpf_abc",
        env=env,
    )
    assert result.returncode == 0, result.stderr
    unit = (root / "etc/systemd/system/gpufleet-agent.service").read_text()
    assert "ExecStart=/opt/gpufleet-agent/bin/gpufleet-agent run" in unit
    assert "GPUFLEET_AGENT_TOKEN=gpf_abc" in (root / "etc/gpufleet/agent.env").read_text()


def test_a_misspelt_setting_is_refused(env: dict[str, str]) -> None:
    env["GPUFLEET_AGENT_SERVER_ULR"] = "https://gpufleet.example.com"
    result = agent("--fake-nvml", "g5-idle", "once", env=env)
    assert result.returncode == 2
    assert result.stderr.startswith("gpufleet-agent: unknown setting GPUFLEET_AGENT_SERVER_ULR")


def test_an_unknown_scenario_is_a_usage_error(env: dict[str, str]) -> None:
    result = agent("--fake-nvml", "p9", "once", env=env)
    assert result.returncode == 2 and "known: g5-batch, g5-forgotten, g5-idle, g5-notebook, g6e-busy" in result.stderr


def test_proxies_in_the_env_file_reach_a_shell_run(env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "agent.env").write_text(
        "https_proxy=http://127.0.0.1:9\nGPUFLEET_AGENT_SERVER_URL=https://gpufleet.example.com\n"
    )
    env.pop("https_proxy", None)
    env.pop("HTTPS_PROXY", None)
    env["GPUFLEET_AGENT_TOKEN"] = "gpf_x"
    result = agent("--fake-nvml", "g5-idle", "doctor", env=env)
    [server] = [line for line in result.stdout.splitlines() if "Server:" in line]
    assert "refused" in server.lower(), server  # went to the proxy on port 9, not to the internet


def test_once_on_an_unprivileged_p4d_names_a100_40gb_profiles_and_loses_no_slice(env: dict[str, str]) -> None:
    result = agent("--fake-nvml", "p4d-mig-unprivileged", "once", "--interval", "0.2", env=env)
    assert result.returncode == 0, result.stderr
    gpus = json.loads(result.stdout)["gpus"]
    profiles = {s["profile"] for g in gpus for s in g["slices"]}
    assert profiles == {"1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "1c.2g.10gb"}
    assert sum(len(g["slices"]) for g in gpus) == 15
    assert [g["unpartitioned_slices"] for g in gpus[:4]] == [0, 1, 0, 2]
    denied = gpus[0]["permission_denied"]
    assert {(d["figure"], d["grant"]) for d in denied} == {("mem_used_mib", "mig-monitor"), ("procs", "mig-monitor")}


def test_doctor_says_per_gpu_what_to_grant(env: dict[str, str]) -> None:
    result = agent("--fake-nvml", "p4d-mig-unprivileged", "doctor", env=env)
    lines = result.stdout.splitlines()
    warnings = [line for line in lines if line.startswith("WARN  Privileges")]
    assert [w.split(":")[1].strip() for w in warnings] == [f"GPU {i}" for i in range(4)]
    assert all("grant the MIG monitor capability" in w and "nvidia-modprobe -f" in w for w in warnings)
    calls = [line for line in lines if "Calls: GPU" in line]
    assert [c.startswith("WARN") for c in calls] == [True] * 4 + [False] * 4
    assert "no_permission: nvmlDeviceGetMemoryInfo, nvmlDeviceGetComputeRunningProcesses_v3" in calls[0]
    assert calls[4].startswith("ok    Calls: GPU 4: 16 of 16 answered")
    assert result.returncode == 1  # no server configured; a warning alone does not fail


def test_doctor_json_is_a_capability_report_that_replays(env: dict[str, str], tmp_path: Path) -> None:
    result = agent("--fake-nvml", "p5-mig", "doctor", "--json", env=env)
    report = json.loads(result.stdout)
    assert report["format"] == "gpufleet-capability-report" and report["driver"] == "550.127.05"
    assert report["gpus"][0]["calls"]["nvmlGpmMigSampleGet"] == "ok"
    assert {c["status"] for c in report["checks"]} >= {"ok", "fail"}
    path = tmp_path / "p5-mig.json"
    path.write_text(result.stdout)
    again = agent("--fake-nvml", f"report:{path}", "once", "--interval", "0.2", env=env)
    assert again.returncode == 0, again.stderr
    assert len(json.loads(again.stdout)["gpus"]) == 8


def test_a_report_that_cannot_be_read_is_a_usage_error(env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{")
    result = agent("--fake-nvml", f"report:{tmp_path / 'bad.json'}", "once", env=env)
    assert result.returncode == 2
    assert result.stderr.startswith("gpufleet-agent: cannot read the capability report") and result.stderr[-1] == "\n"
    assert result.stderr.count("\n") == 1
