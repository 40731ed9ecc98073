"""The server's own metrics: how an ingest request is counted, one registry per app, and counts summed over
worker processes in multiprocess mode (in child processes, and through `gpufleet serve --workers 2`)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from app.errors import ApiError
from app.metrics.server import FAILED, ServerMetrics
from tests.app.metrics.conftest import parse
from tests.conftest import make_token
from tests.factories import batch, gpu


def sample(m: ServerMetrics, name: str, **labels: str) -> float:
    return m.registry.get_sample_value(name, labels) or 0.0


def test_an_accepted_batch_counts_its_samples() -> None:
    m = ServerMetrics()
    with m.observe_ingest() as tally:
        tally.samples = 12
        tally.accept("stored", 12)
    with m.observe_ingest() as tally:
        tally.accept("duplicate", 0)
    assert sample(m, "gpufleet_ingest_batches_accepted_total", status="stored") == 1
    assert sample(m, "gpufleet_ingest_batches_accepted_total", status="duplicate") == 1
    assert sample(m, "gpufleet_ingest_samples_accepted_total") == 12
    assert sample(m, "gpufleet_ingest_samples_rejected_total") == 0
    assert sample(m, "gpufleet_ingest_duration_seconds_count") == 2


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (ApiError(400, "body is not valid JSON"), "malformed"),
        (ApiError(401, "unknown token"), "unauthorized"),
        (ApiError(403, "scope"), "forbidden"),
        (ApiError(413, "too large"), "too_large"),
        (ApiError(415, "gzip only"), "unsupported_media_type"),
        (ApiError(422, "invalid batch"), "invalid"),
        (ApiError(418, "a status nobody sends"), FAILED),
        (RuntimeError("database gone"), FAILED),
    ],
)
def test_a_refused_batch_is_counted_by_reason(error: Exception, reason: str) -> None:
    m = ServerMetrics()
    with pytest.raises(type(error)), m.observe_ingest() as tally:
        tally.samples = 5
        raise error
    assert sample(m, "gpufleet_ingest_batches_rejected_total", reason=reason) == 1
    assert sample(m, "gpufleet_ingest_samples_rejected_total") == 5
    assert sample(m, "gpufleet_ingest_duration_seconds_count") == 1
    assert sum(sample(m, "gpufleet_ingest_batches_accepted_total", status=s) for s in ("stored", "duplicate")) == 0


def test_each_app_counts_on_its_own() -> None:
    a, b = ServerMetrics(), ServerMetrics()
    a.database_error("upkeep")
    assert sample(a, "gpufleet_database_errors_total", during="upkeep") == 1
    assert sample(b, "gpufleet_database_errors_total", during="upkeep") == 0


_CHILD = textwrap.dedent(
    """
    import os, sys
    from app.metrics.server import ServerMetrics
    m = ServerMetrics(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    if sys.argv[1] == "count":
        with m.observe_ingest() as tally:
            tally.accept("stored", 10)
        m.database_error("request")
    else:
        sys.stdout.write(m.exposition().decode())
    """
)


def test_multiprocess_mode_sums_every_process(tmp_path: Path) -> None:
    env = os.environ | {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}

    def child(what: str) -> str:
        done = subprocess.run([sys.executable, "-c", _CHILD, what], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    child("count")
    child("count")
    got = parse(child("expose"))
    assert got.value("gpufleet_ingest_batches_accepted_total", status="stored") == 2
    assert got.value("gpufleet_ingest_samples_accepted_total") == 20
    assert got.value("gpufleet_database_errors_total", during="request") == 2
    assert got.value("gpufleet_ingest_duration_seconds_count") == 2
    # One process's CPU and memory would pass for the whole server's: left out.
    assert "process_cpu_seconds" not in got.families


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _request(port: int, path: str, token: str, body: dict[str, Any] | None = None) -> str:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method="POST" if data else "GET")
    req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as r:
        return str(r.read().decode())


def test_serve_with_two_workers_counts_across_them(
    tmp_path: Path, database_url: str, sessions: sessionmaker[Session]
) -> None:
    read, ingest = make_token(sessions, "read"), make_token(sessions, "ingest")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUFLEET_", "PROMETHEUS_"))}
    env |= {"TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app.cli",
            "serve",
            "--port",
            str(port),
            "--workers",
            "2",
            "--database-url",
            database_url,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                _request(port, "/readyz", read)
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "server did not start"
                time.sleep(0.2)
        [folder] = list(tmp_path.glob("gpufleet-metrics-*"))
        posted = 6
        for i in range(posted):
            _request(port, "/api/v1/ingest", ingest, batch([gpu(0)], intervals=2, instance_id=f"i-w{i}"))
        for _ in range(4):
            got = parse(_request(port, "/metrics", read))
            assert got.value("gpufleet_ingest_batches_accepted_total", status="stored") == posted
            assert got.value("gpufleet_ingest_samples_accepted_total") == 2 * posted
            assert got.value("gpufleet_database_up") == 1
        # Both workers keep their counters there. Which worker takes a connection is the kernel's choice: on a
        # busy machine one can take the first dozen, so ask until both have answered (or a minute has passed).
        deadline = time.monotonic() + 60
        while len({p.name.rsplit("_", 1)[-1] for p in folder.glob("counter_*.db")}) < 2:
            assert time.monotonic() < deadline, "one worker answered every request for a minute"
            _request(port, "/metrics", read)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert not folder.exists(), "the metrics folder outlived the server"
