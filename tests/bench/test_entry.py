"""Every benchmark starts both ways its usage lines give, `python -m bench.X` and `python bench/X.py`, from the
repository root, and answers `--help` without importing the database driver or the app (so this stays fast)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARIES = frozenset(
    {
        "__init__",
        "batches",
        "compare",
        "database",
        "fleet",
        "fleet_db",
        "fleet_bill",
        "fleet_load",
        "fleet_samples",
        "harness",
        "ingest_clients",
        "instances",
        "metered_agent",  # the agent under bench/agent.py's measure, started by it
        "storage",
    }
)
"""Modules of bench/ that the benchmarks import; every other module there is a benchmark."""
BENCHMARKS = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if p.stem not in LIBRARIES)
HEAVY = frozenset({"psycopg", "sqlalchemy", "app", "fastapi", "pydantic", "alembic", "uvicorn", "jinja2"})
"""Top-level packages a benchmark imports only once it runs (each costs a good part of a second)."""


def command(name: str, way: str) -> list[str]:
    if way == "module":
        return [sys.executable, "-X", "importtime", "-m", f"bench.{name}", "--help"]
    return [sys.executable, "-X", "importtime", f"bench/{name}.py", "--help"]


def imported(importtime: str) -> set[str]:
    """Top-level packages named in `-X importtime` output."""
    return {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in importtime.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }


def test_the_library_list_is_current() -> None:
    missing = sorted(name for name in LIBRARIES if not (ROOT / "bench" / f"{name}.py").is_file())
    assert not missing, f"bench/ has no such modules any more: {missing}"
    assert BENCHMARKS


@pytest.mark.parametrize("way", ["module", "script"])
@pytest.mark.parametrize("name", BENCHMARKS)
def test_help(name: str, way: str) -> None:
    # Nothing from outside may make `bench` importable: only the benchmark's own start-up may.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH", "PYTHONSTARTUP")}
    done = subprocess.run(command(name, way), cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    errors = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("import time:"))
    assert done.returncode == 0, errors[-3000:]
    assert done.stdout.startswith("usage: "), done.stdout[:500]
    assert "--help" in done.stdout
    usage = " ".join(done.stdout.split())
    assert f"python -m bench.{name}" in usage and f"python bench/{name}.py" in usage, "usage lines give both ways"
    heavy = sorted(imported(done.stderr) & HEAVY)
    assert not heavy, f"--help imported {heavy}"
