"""`gpufleet demo` as a separate process, the way a person runs it: wait for its URL, read pages, press Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

URL_LINE = re.compile(r"gpufleet demo: open (http://\S+/)")


class DemoProcess:
    """`argv` started in a session of its own, its output collected as it comes."""

    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path | None = None) -> None:
        self.proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:
            for line in self.proc.stdout:
                self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for_url(self, timeout_s: float) -> str:
        """The dashboard URL the demo prints once everything runs."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                found = URL_LINE.search(line)
                if found:
                    return found.group(1)
            if self.proc.poll() is not None:
                self._reader.join(timeout=5)
                raise AssertionError(f"the demo exited ({self.proc.returncode}) before its URL:\n{self.output}")
            time.sleep(0.2)
        raise AssertionError(f"no URL within {timeout_s:g} s:\n{self.output}")

    def demo_pid(self) -> int:
        """The `gpufleet demo` process itself: the one started, or its descendant when a shell started it."""
        procs = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        for p in procs:
            try:
                cmdline = p.cmdline()
            except psutil.Error:
                continue
            if any(part.endswith("gpufleet") for part in cmdline) and "demo" in cmdline:
                return int(p.pid)
        raise AssertionError(f"no gpufleet demo process among {[p.pid for p in procs]}")

    def interrupt(self, timeout_s: float) -> int:
        """Ctrl-C: SIGINT to the demo; its exit code once the started process has ended."""
        os.kill(self.demo_pid(), signal.SIGINT)
        try:
            code = self.proc.wait(timeout=timeout_s)
        finally:
            self._reader.join(timeout=5)
        return code

    def kill(self) -> None:
        """The last resort after a failure: nothing of the test may outlive it."""
        if self.proc.poll() is None:
            with_children = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
            for p in with_children:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def get(url: str, timeout_s: float = 30.0, *, accept: str | None = None) -> str:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=timeout_s) as answer:
        body: bytes = answer.read()
    return body.decode()


def postgres_processes(data_dir: Path) -> list[psutil.Process]:
    """PostgreSQL servers whose data folder lies under `data_dir`."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmdline = p.info.get("cmdline") or []
        if any(str(data_dir) in part for part in cmdline) and any("postgres" in part for part in cmdline):
            found.append(p)
    return found


def samples_accepted(base_url: str) -> float:
    """Samples the demo's server has taken in through its ingest API, from /metrics."""
    found = re.search(r"^gpufleet_ingest_samples_accepted_total (\S+)$", get(base_url + "metrics"), re.M)
    assert found, "no ingest counter on /metrics"
    return float(found.group(1))
