"""Agent cost benchmark: the real `gpufleet-agent run` on the `p4d-mig` fake host, posting to a real server.

    .venv/bin/python -m bench.agent [--intervals 240] [--interval 0.25] [--database-url URL]
    (or .venv/bin/python bench/agent.py with the same options)

The issue's cost point for holders, 8 GPUs of 7 MIG slices with 3 processes each, is `--scenario
p5-mig-crowded`: the simulated host writes its processes' /proc entries and the agent reads them, as it reads
/proc on a real host. `--holders off` measures the same run without them.

Measures the agent process alone (all its threads: collection, journal, gzip, HTTP): CPU time per
interval over the measured window, after a warm-up, and its peak resident memory (VmHWM). The simulated
NVML runs inside the agent process in Python, so its cost is included; real NVML calls are C calls. At the
end the agent is stopped with SIGTERM and the database is checked: every interval the agent collected
must be stored exactly once. Progress goes to stderr; the last line on stdout is one JSON object.

The simulation's share is measured apart, in this process: the agent's collector runs the same scenario for
as many intervals, on a clock that steps one interval between collections, and every call into the simulated
NVML is timed with this thread's CPU clock (less what the timing itself costs). `fake_nvml_cpu_ms_per_interval`
is that share and `agent_cpu_ms_per_interval` the total less it: what the agent would cost over real NVML,
whose calls are C calls. `cpu_ms_per_interval` stays the whole measured figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if not __package__:  # run as `python bench/X.py`: import `bench` and `app` from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.database import connect, open_scratch, prepare_database
from bench.harness import ROOT, BenchError, free_port, log, quiet, run_and_report, start_server, stop_server, wait_ready

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--intervals", type=int, default=240, help="measured intervals (at least 60)")
    p.add_argument("--interval", type=float, default=0.25, help="collection interval, s")
    p.add_argument("--warmup", type=int, default=8, help="intervals before measuring starts")
    p.add_argument("--batch-intervals", type=int, default=3, help="intervals per batch")
    p.add_argument("--scenario", default="p4d-mig")
    p.add_argument("--holders", choices=("on", "off"), default="on", help="say who holds each device (from /proc)")
    p.add_argument("--database-url", help="a PostgreSQL server to create a scratch database on")
    args = p.parse_args(argv)
    if args.intervals < 60:
        p.error("--intervals must be at least 60")
    return args


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, all its threads, s (10 ms resolution)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def thread_cpu(pid: int) -> dict[int, float]:
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{t}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out[int(t)] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return out


def peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise BenchError("no VmHWM in /proc status")


class FakeMeter:
    """The simulated NVML behind a proxy that adds up the CPU time (this thread's) its calls take: every nvml*
    function and the C entry points `_nvmlGetFunctionPointer` hands out. A call made from inside another is
    the outer one's."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
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

        call.__name__ = getattr(fn, "__name__", "nvml")  # the agent counts failures under the function's name
        return call

    def _lookup(self, lookup: Callable[[str], Any]) -> Callable[[str], Any]:
        entry_points: dict[str, Any] = {}

        def find(symbol: str) -> Any:
            if symbol not in entry_points:
                entry_points[symbol] = self.timed(lookup(symbol))
            return entry_points[symbol]

        return find

    def overhead_s(self, calls: int = 20_000) -> float:
        """CPU time one timed call of nothing records: the timing's own share of each call's figure."""
        probe = FakeMeter(None)
        noop = probe.timed(lambda: None)
        for _ in range(calls):
            noop()
        return probe.spent_s / calls


def fake_share(args: argparse.Namespace) -> float:
    """The simulated NVML's CPU time per interval, ms, over `args.intervals` collections of the scenario, in
    this process (see the module's description)."""
    from agent import fake_nvml
    from agent.collect import Collector
    from agent.config import load_config
    from agent.nvml import Nvml
    from agent.run import holder_reader

    stepped = [time.time(), time.monotonic()]  # the clock's reading at the last step, and when it was taken

    def clock() -> float:  # time runs within an interval; between two, it jumps to the next one's end
        return stepped[0] + time.monotonic() - stepped[1]

    meter = FakeMeter(fake_nvml.load(args.scenario, clock=clock))
    config = load_config({"GPUFLEET_AGENT_HOLDERS": args.holders}, config_file=Path(os.devnull))
    nvml = Nvml.open(meter)
    collector = Collector(nvml, clock=clock, holders=holder_reader(config, meter))
    collector.start()
    try:
        for k in range(args.warmup + args.intervals):
            if k == args.warmup:
                meter.spent_s, meter.calls = 0.0, 0
            stepped[:] = [stepped[0] + args.interval, time.monotonic()]
            collector.collect()
        spent: float = meter.spent_s - meter.calls * meter.overhead_s()
    finally:
        collector.close()
        nvml.close()
    return max(spent, 0.0) * 1000 / int(args.intervals)


def journaled(log_path: Path) -> int:
    return sum("journaled interval" in line for line in log_path.read_text(errors="replace").splitlines())


def run(args: argparse.Namespace, stack: contextlib.ExitStack) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="gpufleet-bench-agent-"))
    stack.callback(quiet("remove temporary folder", lambda: shutil.rmtree(tmp, ignore_errors=True)))
    url = open_scratch(args.database_url, tmp, stack).url
    token = prepare_database(url)
    port = free_port()
    server_log = tmp / "server.log"
    server = start_server(url, port, 1, server_log)
    stack.callback(quiet("stop server", lambda: stop_server(server)))
    wait_ready(server, port, server_log)
    log(f"server ready on port {port}")

    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_AGENT_")}
    env.update(
        GPUFLEET_AGENT_CONFIG=str(tmp / "agent.env"),
        GPUFLEET_AGENT_SERVER_URL=f"http://127.0.0.1:{port}",
        GPUFLEET_AGENT_TOKEN=token,
        GPUFLEET_AGENT_INTERVAL_S=str(args.interval),
        GPUFLEET_AGENT_BATCH_INTERVALS=str(args.batch_intervals),
        GPUFLEET_AGENT_STATE_DIR=str(tmp / "state"),
        GPUFLEET_AGENT_IMDS="off",
        GPUFLEET_AGENT_HOST_ID="bench-host",
        GPUFLEET_AGENT_FAKE_NVML=args.scenario,
        GPUFLEET_AGENT_HOLDERS=args.holders,
        GPUFLEET_AGENT_LOG_LEVEL="debug",
    )
    (tmp / "agent.env").write_text("")
    agent_log = tmp / "agent.log"
    with open(agent_log, "wb") as err:
        agent = subprocess.Popen([sys.executable, "-m", "agent", "run"], cwd=ROOT, env=env, stderr=err)
    stack.callback(lambda: None if agent.poll() is not None else agent.kill())

    deadline = time.monotonic() + 60 + args.warmup * args.interval * 4
    while journaled(agent_log) < args.warmup:
        if agent.poll() is not None or time.monotonic() > deadline:
            raise BenchError(f"agent did not warm up:\n{agent_log.read_text()[-2000:]}")
        time.sleep(args.interval / 4)
    start_count, start_cpu, start_wall = journaled(agent_log), cpu_seconds(agent.pid), time.monotonic()
    t_start = thread_cpu(agent.pid)
    log(f"measuring {args.intervals} intervals of {args.interval:g} s")
    while journaled(agent_log) < start_count + args.intervals:
        if agent.poll() is not None:
            raise BenchError(f"agent exited:\n{agent_log.read_text()[-2000:]}")
        time.sleep(args.interval / 4)
    end_count, end_cpu, end_wall = journaled(agent_log), cpu_seconds(agent.pid), time.monotonic()
    rss = peak_rss_mib(agent.pid)
    t_end = thread_cpu(agent.pid)
    log("threads: " + str({t: round((t_end[t] - t_start.get(t, 0)) * 1000 / args.intervals, 2) for t in t_end}))
    agent.send_signal(signal.SIGTERM)
    if agent.wait(30) != 0:
        raise BenchError(f"agent exited with {agent.returncode}:\n{agent_log.read_text()[-2000:]}")
    collected = journaled(agent_log)
    left = list((tmp / "state" / "spool").glob("*.gz"))

    with connect(url) as conn:
        rows, intervals, duplicates = conn.execute(
            "SELECT count(*), count(DISTINCT ts), "
            "(SELECT count(*) FROM (SELECT 1 FROM samples GROUP BY device_id, ts HAVING count(*) > 1) d) FROM samples"
        ).fetchone() or (0, 0, 0)
        batches = conn.execute("SELECT count(*) FROM ingest_batches").fetchone()
    measured = end_count - start_count
    total_ms = (end_cpu - start_cpu) * 1000 / measured
    log("measuring the simulated NVML's share")
    fake_ms = fake_share(args)
    result = {
        "scenario": args.scenario,
        "holders": args.holders,
        "interval_s": args.interval,
        "intervals_measured": measured,
        "cpu_ms_per_interval": round(total_ms, 2),
        "fake_nvml_cpu_ms_per_interval": round(fake_ms, 2),
        "agent_cpu_ms_per_interval": round(total_ms - fake_ms, 2),
        "cpu_percent_of_one_core": round((end_cpu - start_cpu) / (end_wall - start_wall) * 100, 2),
        "rss_mib": round(rss, 1),
        "samples_per_interval": round(rows / max(intervals, 1), 1),
        "intervals_collected": collected,
        "intervals_stored": intervals,
        "duplicate_samples": duplicates,
        "batches_stored": batches[0] if batches else 0,
        "left_in_spool": len(left),
    }
    if intervals != collected or duplicates or left:
        raise BenchError(f"delivery check failed: {json.dumps(result)}")
    return result


def main(argv: list[str] | None = None) -> int:
    return run_and_report(run, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
