"""The agent under bench/agent.py's measure: `python -m bench.metered_agent run` is `gpufleet-agent run` with the
simulated NVML behind a meter, which adds up the CPU time its calls take and publishes the sum in the file named by
GPUFLEET_BENCH_METER. This module imports nothing the agent would not, so the agent's memory is measured as it is.
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

METER = struct.Struct("<dq")
"""The shared file's content: the simulated NVML's CPU time so far (s) and the calls it answered."""


class FakeMeter:
    """The simulated NVML behind a proxy that adds up the CPU time (this thread's) its calls take: every nvml*
    function and the C entry points `_nvmlGetFunctionPointer` hands out. A call made from inside another is
    the outer one's. With a `board` (a mapped file), the sums are written there after every call."""

    def __init__(self, lib: Any, board: mmap.mmap | None = None) -> None:
        self._lib = lib
        self._board = board
        self.spent_s: float = 0.0
        self.calls = 0
        self._inside = False

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._lib, name)
        if name.startswith(("nvml", "_nvml")) and callable(value) and not isinstance(value, type):
            value = self._lookup(self.timed(value)) if name == "_nvmlGetFunctionPointer" else self.timed(value)
        self.__dict__[name] = value  # looked up once, as the agent looks constants and functions up often
        return value

    def timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self._inside:
                return fn(*args, **kwargs)
            self._inside = True
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent_s += time.thread_time() - start
                self.calls += 1
                self._inside = False
                if self._board is not None:
                    METER.pack_into(self._board, 0, self.spent_s, self.calls)

        call.__name__ = getattr(fn, "__name__", "nvml")  # the agent counts failures under the function's name
        return call

    def _lookup(self, lookup: Callable[[str], Any]) -> Callable[[str], Any]:
        entry_points: dict[str, Any] = {}

        def find(symbol: str) -> Any:
            if symbol not in entry_points:
                entry_points[symbol] = self.timed(lookup(symbol))
            return entry_points[symbol]

        return find


def metering_cost_s(calls: int = 50_000) -> tuple[float, float]:
    """What metering one call costs, s: the part the meter counts as the simulation's (its own clock reads) and
    the whole of it (the proxy, the clock reads, the shared file), both taken on a call that does nothing."""
    with tempfile.TemporaryFile() as f:
        f.write(bytes(METER.size))
        f.flush()
        board = mmap.mmap(f.fileno(), METER.size)
        probe = FakeMeter(None, board)
        noop = probe.timed(_nothing)
        plain = _nothing  # the same call, unmetered
        start = time.thread_time()
        for _ in range(calls):
            plain()
        bare = time.thread_time() - start
        start = time.thread_time()
        for _ in range(calls):
            noop()
        whole = time.thread_time() - start - bare
        board.close()
    return probe.spent_s / calls, whole / calls


def _nothing() -> None:
    pass


def read_meter(path: Path) -> tuple[float, int]:
    spent, calls = METER.unpack(path.read_bytes()[: METER.size])
    return float(spent), int(calls)


def main(argv: list[str] | None = None) -> int:
    """`gpufleet-agent` (argv) with the simulated NVML behind a meter that publishes in the file named by
    GPUFLEET_BENCH_METER."""
    from agent import fake_nvml
    from agent.cli import main as agent_main

    with open(os.environ["GPUFLEET_BENCH_METER"], "r+b") as f:
        board = mmap.mmap(f.fileno(), METER.size)
    load = fake_nvml.load

    def load_metered(*args: Any, **kwargs: Any) -> Any:
        return FakeMeter(load(*args, **kwargs), board)

    fake_nvml.load = load_metered
    return agent_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
