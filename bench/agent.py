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

The simulation's share is measured in that same run: the agent runs as `python -m bench.metered_agent`,
which puts the simulated NVML behind a meter that adds up the CPU time (of the calling thread) of
every call into it and publishes the sum in a small shared file. So the share is taken at the agent's own
cadence, with the caches as cold as the agent finds them between two intervals. `fake_nvml_cpu_ms_per_interval`
is that share and `agent_cpu_ms_per_interval` the total less it and less what the metering itself costs: what the
agent would cost over real NVML, whose calls are C calls. `cpu_ms_per_interval` stays the whole measured figure.
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
from pathlib import Path
from typing import Any

if not __package__:  # run as `python bench/X.py`: import `bench` and `app` from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.database import connect, open_scratch, prepare_database
from bench.harness import ROOT, BenchError, free_port, log, quiet, run_and_report, start_server, stop_server, wait_ready
from bench.metered_agent import METER, metering_cost_s, read_meter

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


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """User + system CPU of a process, all its threads, or of its thread `tid`, s (10 ms resolution)."""
    with open(f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise BenchError("no VmHWM in /proc status")


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
        GPUFLEET_BENCH_METER=str(tmp / "meter"),
    )
    (tmp / "meter").write_bytes(bytes(METER.size))
    (tmp / "agent.env").write_text("")
    agent_log = tmp / "agent.log"
    with open(agent_log, "wb") as err:
        command = [sys.executable, "-m", "bench.metered_agent", "run"]
        agent = subprocess.Popen(command, cwd=ROOT, env=env, stderr=err)
    stack.callback(lambda: None if agent.poll() is not None else agent.kill())

    deadline = time.monotonic() + 60 + args.warmup * args.interval * 4
    while journaled(agent_log) < args.warmup:
        if agent.poll() is not None or time.monotonic() > deadline:
            raise BenchError(f"agent did not warm up:\n{agent_log.read_text()[-2000:]}")
        time.sleep(args.interval / 4)
    start_count, start_cpu, start_wall = journaled(agent_log), cpu_seconds(agent.pid), time.monotonic()
    start_fake, start_main = read_meter(tmp / "meter"), cpu_seconds(agent.pid, agent.pid)
    log(f"measuring {args.intervals} intervals of {args.interval:g} s")
    while journaled(agent_log) < start_count + args.intervals:
        if agent.poll() is not None:
            raise BenchError(f"agent exited:\n{agent_log.read_text()[-2000:]}")
        time.sleep(args.interval / 4)
    end_count, end_cpu, end_wall = journaled(agent_log), cpu_seconds(agent.pid), time.monotonic()
    end_fake, end_main = read_meter(tmp / "meter"), cpu_seconds(agent.pid, agent.pid)
    rss = peak_rss_mib(agent.pid)
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
    counted_s, whole_s = metering_cost_s()
    calls = end_fake[1] - start_fake[1]
    fake_ms = (end_fake[0] - start_fake[0] - calls * counted_s) * 1000 / measured
    metering_ms = calls * whole_s * 1000 / measured
    result = {
        "scenario": args.scenario,
        "holders": args.holders,
        "interval_s": args.interval,
        "intervals_measured": measured,
        "cpu_ms_per_interval": round(total_ms, 2),
        "fake_nvml_cpu_ms_per_interval": round(fake_ms, 2),
        "agent_cpu_ms_per_interval": round(total_ms - fake_ms - metering_ms, 2),
        "metering_cpu_ms_per_interval": round(metering_ms, 2),
        # The main thread collects, journals and seals; the sender thread posts (its figure is the rest).
        "sender_cpu_ms_per_interval": round((end_cpu - start_cpu - end_main + start_main) * 1000 / measured, 2),
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
