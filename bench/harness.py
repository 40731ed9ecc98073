"""What every benchmark shares: progress on stderr, one JSON result line, the server under test, timed GETs.

A benchmark's `run(args, stack)` sets up what it needs, registers the undoing of it on `stack`, and returns its
figures; `run_and_report` prints them as the last line of stdout. Only the standard library is imported here
(psycopg, SQLAlchemy and the app are imported by the functions that use them, in every bench module), so a
benchmark answers `--help` at once.

A benchmark also runs as `python bench/X.py`; it then puts the repository root first on `sys.path` before it
imports `bench.` or `app.`, with these lines above its other imports:

    if not __package__:  # run as `python bench/X.py`: import `bench` and `app` from the repository root
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WARMUP = 3
"""Untimed requests sent before the timed ones of a URL."""

Run = Callable[[argparse.Namespace, contextlib.ExitStack], dict[str, Any]]


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


class BenchError(Exception):
    """A benchmark that cannot go on: `run_and_report` prints the message as one line and exits with 1."""


def quiet(what: str, fn: Callable[[], object]) -> Callable[[], None]:
    """`fn` as a cleanup step: a failure is logged, and the other cleanup steps still run."""

    def run() -> None:
        try:
            fn()
        except Exception as exc:
            log(f"cleanup: {what} failed: {exc}")

    return run


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (`q` in 0..1) of sorted values; NaN for none."""
    if not sorted_values:
        return math.nan
    k = max(0, min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[k]


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run_and_report(run: Run, args: argparse.Namespace) -> int:
    """Run a benchmark, clean up whatever it set up, and print its figures as the last line (one JSON)."""
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with contextlib.ExitStack() as stack:
            result = run(args, stack)
    except BenchError as exc:
        log(f"failed: {exc}")
        return 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    print(json.dumps(result), flush=True)
    return 0


def readable(run: Run) -> Run:
    """`run`, with a database, HTTP or file error turned into one line for `run_and_report` to print."""

    def wrapped(args: argparse.Namespace, stack: contextlib.ExitStack) -> dict[str, Any]:
        import psycopg
        from sqlalchemy.exc import SQLAlchemyError

        try:
            return run(args, stack)
        except (psycopg.Error, SQLAlchemyError, OSError, http.client.HTTPException) as exc:
            message = str(getattr(exc, "orig", None) or exc).strip().splitlines()
            raise BenchError(f"{type(exc).__name__}: {message[0] if message else ''}") from exc

    return wrapped


# --------------------------------------------------------------------------------------------------------------
# Processes: the server under test, CPU accounting


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_server(url: str, port: int, workers: int, log_path: Path) -> subprocess.Popen[bytes]:
    """`gpufleet serve` on `url`, in a session of its own, its output (access lines included) in `log_path`."""
    env = dict(os.environ, GPUFLEET_DATABASE_URL=url, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "app.cli", "serve", "--database-url", url, "--port", str(port)]
    cmd += ["--workers", str(workers)]
    # Access log lines go to a file: one per request would flood the terminal.
    with open(log_path, "wb") as out:
        return subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_ready(proc: subprocess.Popen[bytes], port: int, log_path: Path, timeout: float = 120.0) -> None:
    """Until /readyz answers 200; BenchError if the server exits first or `timeout` (s) passes."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise BenchError(f"server exited with {proc.returncode}:\n{tail(log_path)}")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", "/readyz")
            response = conn.getresponse()
            response.read()
            if response.status == 200:
                return
        except (OSError, http.client.HTTPException):
            pass
        finally:
            conn.close()
        time.sleep(0.2)
    raise BenchError(f"server not ready after {timeout:.0f} s:\n{tail(log_path)}")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            log("server did not stop within 30 s of SIGTERM; killing its process group")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # Its session is its own (start_new_session): anything left in that group is a stray worker of ours.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no server log)"


def server_log_problems(path: Path) -> tuple[int, list[str]]:
    """Lines of the server log that are neither access lines for 2xx answers nor start/stop chatter: their
    count and the first ten."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return 0, []
    bad = [
        line
        for line in text.splitlines()
        if ("Traceback" in line or "ERROR" in line or "WARNING" in line or "Exception" in line)
        or ('HTTP/1.1"' in line and '" 2' not in line)
    ]
    return len(bad), bad[:10]


def first_traceback(path: Path, limit: int = 40) -> str:
    """The first traceback of the server log, to tell why a page answered 500."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    start = next((i for i, line in enumerate(lines) if line.startswith("Traceback")), None)
    if start is None:
        return ""
    block: list[str] = []
    for line in lines[start : start + limit]:
        block.append(line)
        if len(block) > 1 and line and not line[0].isspace() and not line.startswith(("Traceback", "During", "The ")):
            break
    return "\n".join(block)


def log_server_problems(log_path: Path) -> int:
    """Log the server log's problem lines (the first four) and its first traceback; returns the problem count."""
    problems, lines = server_log_problems(log_path)
    for line in lines[:4]:
        log(f"server log: {line}")
    trace = first_traceback(log_path)
    if trace:
        log("first traceback in the server log:\n" + trace)
    return problems


def _proc_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds of the process and of its children it has reaped)."""
    tick = os.sysconf("SC_CLK_TCK")
    table: dict[int, tuple[int, float]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        rest = stat.rsplit(")", 1)[1].split()
        table[int(entry.name)] = (int(rest[1]), sum(int(x) for x in rest[11:15]) / tick)
    return table


def tree_cpu(root: int) -> float | None:
    """CPU seconds used by a process and all its descendants (reaped ones included), or None if it is gone."""
    table = _proc_table()
    if root not in table:
        return None
    children: dict[int, list[int]] = {}
    for pid, (ppid, _cpu) in table.items():
        children.setdefault(ppid, []).append(pid)
    total = 0.0
    todo = [root]
    while todo:
        pid = todo.pop()
        total += table[pid][1]
        todo.extend(children.get(pid, []))
    return total


# --------------------------------------------------------------------------------------------------------------
# Timed GETs


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    seconds: float
    """Until the whole answer was read."""
    content_type: str


class Client:
    """Sequential GETs with a bearer token over one kept-alive connection, as a script would send them."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.auth = {"Authorization": f"Bearer {token}"}
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)

    def get(self, path: str, headers: dict[str, str] | None = None) -> Answer:
        for attempt in range(2):
            t = time.perf_counter()
            try:
                self.conn.request("GET", path, headers={**(headers or {}), **self.auth})
                response = self.conn.getresponse()
                body = response.read()
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
                if attempt:
                    raise
                continue
            took = time.perf_counter() - t
            return Answer(response.status, body, took, response.getheader("Content-Type") or "")
        raise BenchError(f"GET {path}: no answer")

    def close(self) -> None:
        self.conn.close()


@dataclass(frozen=True)
class Timing:
    """`runs` timed GETs of one URL: percentiles in ms, and what the answers were."""

    p50_ms: float
    p95_ms: float
    size: int
    """Of the last answer's body, bytes."""
    status: int
    """The most common status."""
    statuses: dict[int, int]
    content_type: str
    """The last answer's Content-Type."""
    last_body: bytes

    def figures(self) -> dict[str, Any]:
        """The entry of a result line's timing table."""
        return {
            "p50_ms": self.p50_ms,
            "p95_ms": self.p95_ms,
            "bytes": self.size,
            "status": self.status,
            "content_type": self.content_type,
        }


def time_get(
    client: Client, path: str, headers: dict[str, str] | None = None, *, runs: int, warmup: int = WARMUP
) -> Timing:
    """`warmup` untimed GETs, then `runs` timed ones, one after another."""
    for _ in range(warmup):
        client.get(path, headers)
    times: list[float] = []
    statuses: Counter[int] = Counter()
    last: Answer | None = None
    for _ in range(runs):
        last = client.get(path, headers)
        times.append(last.seconds * 1000.0)
        statuses[last.status] += 1
    if last is None:
        raise BenchError(f"GET {path}: no timed request (runs must be positive)")
    times.sort()
    if len(statuses) > 1:
        log(f"WARNING: {path} answered {dict(statuses)}")
    return Timing(
        p50_ms=round(statistics.median(times), 2),
        p95_ms=round(percentile(times, 0.95), 2),
        size=len(last.body),
        status=statuses.most_common(1)[0][0],
        statuses=dict(statuses),
        content_type=last.content_type,
        last_body=last.body,
    )
