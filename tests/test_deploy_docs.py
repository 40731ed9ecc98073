"""docs/deploy.md stays true: its systemd unit is one systemd accepts, for the command it documents."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "deploy.md"


def test_the_server_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"
    if not Path(analyze).exists():
        pytest.fail("systemd-analyze not found: install Debian's `systemd` package (apt-get install systemd)")
    [unit_text] = re.findall(r"```ini\n(.*?)```", DOC.read_text(), re.S)
    assert "ExecStart=/opt/gpufleet/bin/gpufleet serve" in unit_text
    # verify checks that the programs and files named exist: point them into the temporary folder.
    exe = tmp_path / "bin" / "gpufleet"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    env_file = tmp_path / "server.env"
    env_file.write_text("GPUFLEET_PORT=8000\n")
    unit = tmp_path / "gpufleet.service"
    unit.write_text(
        unit_text.replace("/opt/gpufleet/bin/gpufleet", str(exe)).replace("/etc/gpufleet/server.env", str(env_file))
    )
    env = {**os.environ, "SYSTEMD_LOG_LEVEL": "notice", "SYSTEMD_LOG_COLOR": "0", "SYSTEMD_PAGER": ""}
    done = subprocess.run(
        [analyze, "verify", "--man=no", str(unit)], env=env, capture_output=True, text=True, timeout=120
    )
    output = done.stdout + done.stderr
    ours = [line for line in output.splitlines() if unit.name in line or str(tmp_path) in line]
    assert done.returncode == 0 and not ours, output
