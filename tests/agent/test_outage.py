"""The loss-free path end to end: a real agent process, a real server, an outage and a `kill -9`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

from sqlalchemy import Engine, text

from .live_server import LiveServer

INTERVAL_S = 0.25


def start_agent(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "agent", "run"], env=env, stdout=subprocess.DEVNULL, stderr=stderr
        )


def journaled(log: Path) -> list[datetime]:
    starts = []
    for line in log.read_text().splitlines():
        if "journaled interval" in line:
            starts.append(datetime.fromisoformat(line.split("journaled interval ")[1].split(" ")[0]))
    return starts


def wait_for(predicate: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_every_interval_arrives_exactly_once_across_an_outage_and_a_kill(
    live_server: LiveServer, ingest_token: str, engine: Engine, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "GPUFLEET_AGENT_CONFIG": str(tmp_path / "agent.env"),
        "GPUFLEET_AGENT_SERVER_URL": live_server.url,
        "GPUFLEET_AGENT_TOKEN": ingest_token,
        "GPUFLEET_AGENT_INTERVAL_S": str(INTERVAL_S),
        "GPUFLEET_AGENT_BATCH_INTERVALS": "3",
        "GPUFLEET_AGENT_STATE_DIR": str(tmp_path / "state"),
        "GPUFLEET_AGENT_BACKOFF_MAX_S": "0.5",
        "GPUFLEET_AGENT_IMDS": "off",
        "GPUFLEET_AGENT_HOST_ID": "outage-host",
        "GPUFLEET_AGENT_FAKE_NVML": "p4d-mig",
        "GPUFLEET_AGENT_LOG_LEVEL": "debug",
        "TMPDIR": str(tmp_path),  # the simulated host's /proc tree: a killed agent cannot remove it
    }
    (tmp_path / "agent.env").write_text("# settings come from the environment in this test\n")
    spool = tmp_path / "state" / "spool"

    first = start_agent(env, tmp_path / "first.log")
    wait_for(lambda: len(journaled(tmp_path / "first.log")) >= 6)
    live_server.stop()
    wait_for(lambda: len(list(spool.glob("*.gz"))) >= 2)  # sealed batches pile up during the outage
    journal = tmp_path / "state" / "open.jsonl"
    wait_for(lambda: journal.exists() and b'"t":"interval"' in journal.read_bytes())
    first.send_signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL

    second = start_agent(env, tmp_path / "second.log")
    wait_for(lambda: len(journaled(tmp_path / "second.log")) >= 4)
    live_server.start()
    wait_for(lambda: not list(spool.glob("*.gz")))
    second.send_signal(signal.SIGTERM)
    assert second.wait(20) == 0
    assert not list(spool.glob("*.gz")), "the stopping agent delivers what it sealed"
    assert not (tmp_path / "state" / "open.jsonl").exists()

    logged = journaled(tmp_path / "first.log") + journaled(tmp_path / "second.log")
    with engine.connect() as conn:
        device_id = conn.execute(text("SELECT id FROM gpus WHERE gpu_index = 4")).scalar_one()
        stored = [r[0] for r in conn.execute(text("SELECT ts FROM samples WHERE device_id = :d"), {"d": device_id})]
        per_device = conn.execute(text("SELECT count(*) FROM samples GROUP BY device_id")).scalars().all()
    duplicates = [ts for ts, n in Counter(stored).items() if n > 1]
    assert duplicates == []
    missing = set(logged) - set(stored)
    assert missing == set(), f"{len(missing)} journaled intervals never arrived"
    # At most the interval journaled in the instant of the kill, before its log line was written.
    assert len(set(stored) - set(logged)) <= 1
    assert len(set(per_device)) == 1, "every device has a sample in every interval"
    assert "recovered" in (tmp_path / "second.log").read_text()
