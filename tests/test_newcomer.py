"""A newcomer's first minutes: the README's two commands, read from the README itself, run as written in a fresh
copy of the repository with a fresh virtual environment.

Slow (two `pip install`s), so it runs only with GPUFLEET_NEWCOMER=1; `.ci/run` sets it when CI=true. The copy
is every file git tracks or would track, in a temporary folder, so the commands' `.venv` is a new one. The
environment is this one without gpufleet settings, plus GPUFLEET_DATA_DIR and GPUFLEET_PORT, so the demo keeps
its data in the temporary folder and takes a free port. The first command (install, then `gpufleet demo`) runs
until the dashboard answers, then gets Ctrl-C. The second (install the dev extras, then pytest) runs with
`PYTEST_ADDOPTS=--collect-only`: it shows that the install works and that every test module imports, without
running the suite, this test included, a second time inside itself.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.demo_process import DemoProcess, get, postgres_processes

pytestmark = [
    pytest.mark.newcomer,
    pytest.mark.skipif(os.environ.get("GPUFLEET_NEWCOMER") != "1", reason="slow (two installs): GPUFLEET_NEWCOMER=1"),
]

ROOT = Path(__file__).resolve().parent.parent


def readme_command(which: str) -> str:
    """The README's `run` or `test` command, as CI reads it."""
    out = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "readme_command.py"), which], check=True, capture_output=True, text=True
    )
    return out.stdout.strip()


def copy_checkout(to: Path) -> None:
    """Every file git tracks or would track (untracked, not ignored), as it is in the working tree."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the working tree
        target = to / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)


def newcomer_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUFLEET_", "VIRTUAL_ENV", "PYTEST_"))}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if "/.venv/" not in p)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env.update(GPUFLEET_DATA_DIR=str(home / "data"), GPUFLEET_PORT=str(port))
    return env


def test_the_readme_commands_work_in_a_fresh_checkout(tmp_path: Path) -> None:
    checkout = tmp_path / "gpufleet"
    copy_checkout(checkout)
    env = newcomer_env(tmp_path)
    run, test = readme_command("run"), readme_command("test")
    assert "gpufleet demo" in run and "pytest" in test

    demo = DemoProcess(["bash", "-c", run], env=env, cwd=checkout)
    try:
        url = demo.wait_for_url(timeout_s=900)
        assert "Fleet overview" in get(url)
        assert demo.interrupt(timeout_s=60) == 0, demo.output
        assert "gpufleet demo: stopped" in demo.output
        assert postgres_processes(tmp_path) == []
    finally:
        demo.kill()

    tests = subprocess.run(
        ["bash", "-c", test],
        cwd=checkout,
        env={**env, "PYTEST_ADDOPTS": "--collect-only"},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-3000:]
    assert re.search(r"\d+ tests collected", tests.stdout), tests.stdout[-2000:]
