"""The demo command's parts that decide before anything slow starts: its folder, port, options and token."""

from __future__ import annotations

import json
import socket
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from app.auth import list_tokens, revoke_token
from app.cli import main
from app.db import session_scope
from app.demo import run
from app.demo.fleet import STORIES_DIGEST, make_fleet


def test_one_demo_per_folder(tmp_path: Path) -> None:
    with (
        run.folder_lock(tmp_path),
        pytest.raises(run.DemoError, match="another gpufleet demo is running"),
        run.folder_lock(tmp_path),
    ):
        pass
    with run.folder_lock(tmp_path):  # free again
        pass


def test_a_taken_port_is_reported_before_anything_starts() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with (
            pytest.raises(run.DemoError, match=f"cannot listen on 127.0.0.1:{port}.*--port"),
            run.listening_socket("127.0.0.1", port),
        ):
            pass


def test_the_folder_remembers_its_fleet(tmp_path: Path) -> None:
    assert run.read_state(tmp_path) is None
    fleet = make_fleet(10, seed=4, epoch=1_768_402_800)
    run.write_state(tmp_path, fleet)
    assert run.read_state(tmp_path) == {"instances": 10, "seed": 4, "epoch": 1_768_402_800}
    state = json.loads((tmp_path / run.STATE_FILE).read_text())
    assert state["stories"] == STORIES_DIGEST
    (tmp_path / run.STATE_FILE).write_text(json.dumps({**state, "stories": "older"}))
    assert run.read_state(tmp_path) is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--instances", "3"], "gpufleet: the demo fleet has 10 to 500 instances, not 3\n"),
        (["--interval-s", "7"], "gpufleet: --interval-s must be one of 5, 10, 15, 20, 30, 60\n"),
        (["--port", "0"], "gpufleet: bad setting GPUFLEET_PORT: Input should be greater than or equal to 1\n"),
    ],
)
def test_bad_options_end_in_one_line(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--data-dir", str(tmp_path), *args]) == 2
    assert capsys.readouterr().err == message
    assert not (tmp_path / "pgdata").exists()


def test_the_agents_token_is_kept_while_it_lives(sessions: sessionmaker[Session], tmp_path: Path) -> None:
    path = tmp_path / run.TOKEN_FILE
    run.agent_token(sessions, path)
    secret = path.read_text().strip()
    assert secret.startswith("gpf_")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    run.agent_token(sessions, path)
    assert path.read_text().strip() == secret
    with session_scope(sessions) as session:
        revoke_token(session, run.TOKEN_NAME, now=datetime.now(UTC))
    run.agent_token(sessions, path)
    assert path.read_text().strip() != secret
    with session_scope(sessions) as session:
        names = [(t.name, t.scope, t.revoked_at is None) for t in list_tokens(session)]
    assert names == [(run.TOKEN_NAME, "ingest", False), (f"{run.TOKEN_NAME}-2", "ingest", True)]
