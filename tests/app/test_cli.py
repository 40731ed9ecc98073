"""The `gpufleet` command: tokens, migrate, and `serve` on an embedded or a given database."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from sqlalchemy import Engine, text

from app.cli import is_loopback_host, main
from app.migrate import head_revision
from app.passwords import verify_password


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_token_create_list_revoke(capsys: pytest.CaptureFixture[str], database_url: str, engine: Engine) -> None:
    db = ["--database-url", database_url]
    code, out, err = run(capsys, "token", "create", "--name", "fleet-a", "--scope", "ingest", *db)
    assert code == 0
    secret = out.strip()
    assert secret.startswith("gpf_") and "shown only once" in err
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT secret_sha256, hint FROM api_tokens")).one()
    assert secret not in stored.secret_sha256 and stored.hint == secret[:8]

    code, out, _ = run(capsys, "token", "list", *db)
    assert code == 0 and "fleet-a" in out and "active" in out and secret not in out

    code, _, err = run(capsys, "token", "create", "--name", "fleet-a", "--scope", "read", *db)
    assert code == 2 and err.strip() == "gpufleet: a token named 'fleet-a' already exists"

    code, out, _ = run(capsys, "token", "revoke", "fleet-a", *db)
    assert code == 0 and "revoked" in out
    code, out, _ = run(capsys, "token", "list", *db)
    assert "revoked" in out

    code, _, err = run(capsys, "token", "revoke", "nobody", *db)
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_unreachable_database_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "token", "list", "--database-url", "postgresql://x@127.0.0.1:1/none")
    assert code == 2
    assert err.startswith("gpufleet: cannot reach the database:")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_migrate_is_idempotent(capsys: pytest.CaptureFixture[str], database_url: str) -> None:
    code, out, _ = run(capsys, "migrate", "--database-url", database_url)
    assert code == 0 and f"at schema {head_revision()}" in out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(env_extra: dict[str, str], *args: str) -> tuple[subprocess.Popen[str], int, list[str]]:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")} | env_extra
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--port", str(port), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: list[str] = []
    deadline = time.monotonic() + 60
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip())
        if "serving on" in line:
            break
    for _ in range(100):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if r.status == 200:
                    return proc, port, lines
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("server did not become ready: " + "\n".join(lines))


def _postgres_for(pgdata: Path) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["name", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "postgres" in (p.info["name"] or "") and str(pgdata) in cmd:
            found.append(p)
    return found


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_serve_embedded_starts_and_stops_cleanly(tmp_path: Path, stop_signal: signal.Signals) -> None:
    proc, port, lines = _serve({"GPUFLEET_DATA_DIR": str(tmp_path)})
    pgdata = tmp_path / "pgdata"
    assert any(f"data in {pgdata}" in line for line in lines)
    assert any(f"http://127.0.0.1:{port}/" in line for line in lines)
    assert _postgres_for(pgdata), "embedded PostgreSQL should be running"
    proc.send_signal(stop_signal)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "gpufleet: stopped" in out and "Traceback" not in out
    assert _postgres_for(pgdata) == []


def test_serve_with_database_url_starts_no_embedded(tmp_path: Path, database_url: str) -> None:
    proc, _port, lines = _serve({"GPUFLEET_DATA_DIR": str(tmp_path / "data")}, "--database-url", database_url)
    proc.send_signal(signal.SIGTERM)
    _out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert not (tmp_path / "data").exists()
    assert not any("embedded" in line for line in lines)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.1.7", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("gpufleet.internal", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def test_serve_refuses_auth_off_on_an_address_others_reach(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_AUTH", "off")
    before = signal.getsignal(signal.SIGTERM)
    try:
        code, out, err = run(capsys, "serve", "--host", "0.0.0.0", "--database-url", "postgresql://unused@x/y")
    finally:
        signal.signal(signal.SIGTERM, before)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "GPUFLEET_AUTH=off is refused on 0.0.0.0" in err


def test_serve_with_auth_off_warns_and_serves_this_host(tmp_path: Path, database_url: str) -> None:
    env = {"GPUFLEET_AUTH": "off", "GPUFLEET_DATA_DIR": str(tmp_path)}
    proc, port, lines = _serve(env, "--database-url", database_url)
    try:
        assert any("WARNING: authentication is OFF (GPUFLEET_AUTH=off)" in line for line in lines), lines
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/gpus/idle", timeout=10) as r:
            assert r.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_hash_password_reads_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("correct horse\n"))
    code, out, err = run(capsys, "hash-password")
    assert code == 0 and "GPUFLEET_ADMIN_PASSWORD_HASH" in err
    assert verify_password("correct horse", out.strip())
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n"))
    code, out, err = run(capsys, "hash-password")
    assert (code, out, err) == (2, "", "gpufleet: the password is empty\n")
