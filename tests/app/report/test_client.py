"""`gpufleet report` against a real server on a TCP port: table, CSV and JSON, and every failure as one line."""

from __future__ import annotations

import csv
import io
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from app.cli import main
from app.report.client import DEFAULT_URL, ReportClientError, query, render_table, resolve_server
from app.settings import Settings
from tests.agent.live_server import LiveServer
from tests.conftest import make_token
from tests.factories import gpu
from tests.feeding import P4D_PER_GPU_HOUR, Feeder, busy, idle

H = timedelta(hours=1)


@pytest.fixture
def live_server(settings: Settings, engine: object) -> Iterator[LiveServer]:
    with LiveServer(settings) as server:
        yield server


@pytest.fixture
def read_token(sessions: sessionmaker[Session]) -> str:
    return make_token(sessions, "read")


@pytest.fixture
def fleet(feeder: Feeder) -> dict[str, Any]:
    """Two past hours: an idle p4d GPU (team vision) and a g5 at 40% (team nlp)."""
    start = feeder.t0
    feeder.feed([gpu(0)], start=start, hours=2, fn=idle, instance_id="i-p4d", tags={"team": "vision"})
    feeder.feed(
        [gpu(0)], start=start, hours=2, fn=busy(40), instance_id="i-g5", instance_type="g5.xlarge", tags={"team": "nlp"}
    )
    return {"start": start.isoformat(), "end": (start + 2 * H).isoformat()}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["report", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_table_csv_and_json_agree_with_the_api(
    capsys: pytest.CaptureFixture[str],
    live_server: LiveServer,
    client: TestClient,
    read_token: str,
    fleet: dict[str, Any],
) -> None:
    window = ["--start", fleet["start"], "--end", fleet["end"]]
    server = ["--url", live_server.url, "--token", read_token]

    code, out, err = run(capsys, *server, *window, "--group-by", "tag:team", "--format", "json")
    assert code == 0, err
    body = json.loads(out)
    api = client.get(
        "/api/v1/report",
        params={"start": fleet["start"], "end": fleet["end"], "group_by": "tag:team"},
        headers={"Authorization": f"Bearer {read_token}"},
    ).json()
    assert body == api

    code, out, err = run(capsys, *server, *window, "--group-by", "tag:team", "--format", "csv")
    assert code == 0, err
    table = list(csv.DictReader(io.StringIO(out)))
    assert [t["tag:team"] for t in table] == ["vision", "nlp", "TOTAL"]
    assert float(table[0]["idle_cost"]) == pytest.approx(2 * P4D_PER_GPU_HOUR, abs=1e-5)

    code, out, err = run(capsys, *server, *window, "--group-by", "instance_type", "--group-by", "tag:team")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].endswith("UTC, money in USD")
    header, vision, nlp, rule, total = lines[1:]
    assert header.split()[:4] == ["INSTANCE_TYPE", "TAG:TEAM", "GPU-H", "UTIL"]
    assert vision.split()[:2] == ["p4d.24xlarge", "vision"]
    assert f"{2 * P4D_PER_GPU_HOUR:.2f}" in vision.split()
    assert nlp.split()[:3] == ["g5.xlarge", "nlp", "2.0"]
    assert "40.0%" in nlp.split()
    assert set(rule) <= {"-", " "}
    assert total.split()[0] == "TOTAL"
    cost = api["totals"]["cost"]
    assert total.split()[-5] == f"{cost:,.2f}"
    # Columns line up: every number ends where its header does.
    assert len({len(line) for line in (header, vision, nlp, total)}) == 1


def test_filters_and_window_reach_the_server(
    capsys: pytest.CaptureFixture[str], live_server: LiveServer, read_token: str, fleet: dict[str, Any]
) -> None:
    args = ["--url", live_server.url + "/", "--token", read_token, "--window", "24h", "--format", "json"]
    code, out, err = run(capsys, *args, "--tag", "team:nlp", "--instance-type", "g5.xlarge", "--region", "us-east-1")
    assert code == 0, err
    body = json.loads(out)
    assert [r["group"]["instance_type"] for r in body["rows"]] == ["g5.xlarge"]
    code, out, err = run(capsys, *args, "--lifecycle", "spot")
    assert code == 0 and json.loads(out)["rows"] == []


def test_token_from_a_file_or_the_environment(
    capsys: pytest.CaptureFixture[str],
    live_server: LiveServer,
    read_token: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(read_token + "\n")
    code, out, err = run(capsys, "--url", live_server.url, "--token-file", str(token_file))
    assert code == 0, err
    assert "(no data in this window)" in out and out.splitlines()[-1].split()[0] == "TOTAL"

    monkeypatch.setenv("GPUFLEET_URL", live_server.url)
    monkeypatch.setenv("GPUFLEET_TOKEN", read_token)
    code, out, err = run(capsys, "--format", "csv")
    assert code == 0, err
    assert out.startswith("start,end,instance_type,gpu_hours,")


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--start", "yesterday"], "start"),
        (["--start", "2026-11-20T00:00:00Z", "--end", "2026-11-19T00:00:00Z"], "end"),
        (["--group-by", "colour"], "group_by"),
        (["--tag", "novalue"], "tag"),
        (["--window", "2d"], "window"),
    ],
)
def test_a_bad_parameter_is_the_servers_message_and_exit_2(
    capsys: pytest.CaptureFixture[str], live_server: LiveServer, read_token: str, argv: list[str], field: str
) -> None:
    code, _out, err = run(capsys, "--url", live_server.url, "--token", read_token, *argv)
    assert code == 2
    line = one_line(err)
    assert line.startswith(f"gpufleet: {live_server.url} answered 400: bad report parameter ({field}: ")


def test_bad_or_missing_tokens(
    capsys: pytest.CaptureFixture[str],
    live_server: LiveServer,
    sessions: sessionmaker[Session],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.delenv("GPUFLEET_TOKEN", raising=False)
    code, _out, err = run(capsys, "--url", live_server.url, "--token", "gpf_not-a-token")
    assert code == 2 and one_line(err) == f"gpufleet: {live_server.url} answered 401: unknown token"
    ingest = make_token(sessions, "ingest")
    code, _out, err = run(capsys, "--url", live_server.url, "--token", ingest)
    assert code == 2 and "answered 403: token scope 'ingest' does not allow 'read'" in one_line(err)
    # No token: asked without one, and the server's 401 comes back with what to give.
    code, _out, err = run(capsys, "--url", live_server.url)
    assert code == 2 and one_line(err).startswith(f"gpufleet: {live_server.url} answered 401: ")
    assert one_line(err).endswith("; give --token, --token-file or GPUFLEET_TOKEN (scope read)")
    code, _out, err = run(capsys, "--url", live_server.url, "--token-file", "/nonexistent/token")
    assert code == 2 and one_line(err).startswith("gpufleet: cannot read --token-file /nonexistent/token")
    code, _out, err = run(capsys, "--url", live_server.url, "--token", "a", "--token-file", "/nonexistent/token")
    assert code == 2 and one_line(err) == "gpufleet: give --token or --token-file, not both"
    # The wrong file: refused before any request, and nothing of it is shown.
    wrong = tmp_path / "notes.txt"
    wrong.write_text("secret-one\nsecret-two\n")
    code, _out, err = run(capsys, "--url", live_server.url, "--token-file", str(wrong))
    assert code == 2 and "not one word of printable ASCII" in one_line(err) and "secret" not in err


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_an_unreachable_server_is_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    code, _out, err = run(capsys, "--url", url, "--token", "gpf_x")
    assert code == 1
    assert one_line(err).startswith(f"gpufleet: cannot reach {url}: ")
    code, _out, err = run(capsys, "--url", "ftp://example.com", "--token", "gpf_x")
    assert code == 2 and "--url must be an http:// or https:// URL" in one_line(err)
    code, _out, err = run(capsys, "--url", "http://127.0.0.1:notaport", "--token", "gpf_x")
    assert code == 2 and one_line(err).startswith("gpufleet: bad --url 'http://127.0.0.1:notaport': ")


class _Failing(BaseHTTPRequestHandler):
    """A server that is not well: 503 with an HTML page, or a 200 that is not a report."""

    def do_GET(self) -> None:
        broken = "window=1h" in self.path
        status, body, kind = (
            (200, b"<html>hello</html>", "text/html") if broken else (503, b"<h1>down</h1>", "text/html")
        )
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def failing_server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_failing_server_is_exit_1(capsys: pytest.CaptureFixture[str], failing_server: str) -> None:
    code, _out, err = run(capsys, "--url", failing_server, "--token", "gpf_x")
    assert code == 1 and one_line(err) == f"gpufleet: {failing_server} answered 503: HTTP 503"
    code, _out, err = run(capsys, "--url", failing_server, "--token", "gpf_x", "--window", "1h")
    assert code == 1 and one_line(err) == f"gpufleet: {failing_server} did not answer with a gpufleet report"
    code, out, err = run(capsys, "--url", failing_server, "--token", "gpf_x", "--window", "1h", "--format", "csv")
    assert code == 1 and out == "" and "did not answer with a gpufleet report" in one_line(err)


def test_the_installed_command_prints_no_traceback() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "report", "--url", url, "--token", "gpf_x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and done.stdout == ""
    assert one_line(done.stderr).startswith(f"gpufleet: cannot reach {url}")


def test_query_and_server_defaults() -> None:
    assert query(group_by=["instance", "tag:team"], tag=["team:a", "env:b"], window="7d", fmt="csv") == [
        ("window", "7d"),
        ("group_by", "instance"),
        ("group_by", "tag:team"),
        ("tag", "team:a"),
        ("tag", "env:b"),
        ("format", "csv"),
    ]
    server = resolve_server(None, None, None, 60.0, env={"GPUFLEET_TOKEN": " gpf_env "})
    assert (server.url, server.token) == (DEFAULT_URL, "gpf_env")
    server = resolve_server("https://x.example/", "gpf_arg", None, 5.0, env={"GPUFLEET_URL": "http://other"})
    assert (server.url, server.token, server.timeout_s) == ("https://x.example", "gpf_arg", 5.0)
    with pytest.raises(ReportClientError) as exc:
        resolve_server(None, "gpf_x", None, 0.0, env={})
    assert exc.value.code == 2


def test_table_of_an_empty_report_and_missing_figures() -> None:
    totals = {"gpu_hours": 0.0, "avg_util_pct": None, "cost": 1234.5, "idle_cost": 0.0, "idle_held_cost": 0.0}
    report = {
        "start": "2026-11-01T00:00:00+00:00",
        "end": "2026-11-08T00:00:00+00:00",
        "group_by": ["region"],
        "rows": [],
        "totals": totals | {"currency": "USD"},
    }
    lines = render_table(report)
    assert lines[0] == "2026-11-01 00:00 to 2026-11-08 00:00 UTC, money in USD"
    assert lines[2] == "(no data in this window)"
    total = lines[-1].split()
    assert total[0] == "TOTAL" and total[2] == "-" and "1,234.50" in total


def test_no_token_is_enough_where_the_server_has_auth_off(
    capsys: pytest.CaptureFixture[str],
    settings: Settings,
    engine: object,
    fleet: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GPUFLEET_TOKEN", raising=False)
    with LiveServer(settings.model_copy(update={"auth": "off"})) as open_server:
        code, out, err = run(capsys, "--url", open_server.url, "--window", "24h", "--format", "json")
    assert code == 0, err
    assert {r["group"]["instance_type"] for r in json.loads(out)["rows"]} == {"p4d.24xlarge", "g5.xlarge"}
