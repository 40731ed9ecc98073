from __future__ import annotations

import gzip
import itertools
import json
import os
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pynvml
import pytest

from agent import fake_nvml
from agent.collect import Collector
from agent.config import AgentConfig, ConfigError, load_config
from agent.doctor import _spool_check
from agent.identify import IdentityResolver
from agent.nvml import Nvml
from agent.run import Agent, holder_reader
from agent.send import Poster

from .receiver import Receiver


def test_the_loop_keeps_its_cadence_when_collection_is_slow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    interval_s = 0.1
    real_collect = Collector.collect

    def slow_collect(self: Collector) -> object:
        time.sleep(0.04)  # 40 % of the interval spent collecting
        return real_collect(self)

    monkeypatch.setattr(Collector, "collect", slow_collect)
    config = AgentConfig(state_dir=tmp_path, interval_s=interval_s, batch_intervals=1000, imds="off", host_id="h")
    agent = Agent(config, Nvml.open(fake_nvml.load("p5")), IdentityResolver(config))
    stop = threading.Event()
    worker = threading.Thread(target=agent.run, args=(stop,))
    started = time.monotonic()
    worker.start()
    time.sleep(2.05)
    stop.set()
    worker.join(10)
    elapsed = time.monotonic() - started
    # A loop that slept a full interval after each collection would manage about 2.05 / 0.14 = 14.
    assert agent.intervals >= int(elapsed / interval_s) - 3
    assert agent.skipped_ticks == 0
    [sealed] = agent.spool.pending()  # the open batch was sealed on stop
    body = agent.spool.read(sealed)
    assert body is not None
    intervals = json.loads(gzip.decompress(body))["intervals"]
    starts = [datetime.fromisoformat(i["start"]) for i in intervals]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(starts)]
    assert all(abs(g - d["duration_s"]) < 0.002 for g, d in zip(gaps, intervals, strict=False)), "back to back"
    assert sum(gaps) / len(gaps) == pytest.approx(interval_s, abs=0.01)


def _wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_pending_mig_mode_change_releases_nvml_until_it_is_done(tmp_path: Path) -> None:
    """Enabling MIG on an A100 waits for a GPU reset, which an open NVML client blocks. The agent lets go of NVML,
    says why, and picks up the new layout once the change is done."""
    lib = fake_nvml.load("p4d-mig")
    config = AgentConfig(state_dir=tmp_path, interval_s=0.1, batch_intervals=1000, imds="off", host_id="h")
    agent = Agent(config, Nvml.open(lib), IdentityResolver(config), mig_recheck_s=0.2)
    stop = threading.Event()
    worker = threading.Thread(target=agent.run, args=(stop,))
    worker.start()
    try:
        _wait_for(lambda: agent.intervals >= 3)
        lib.request_mig_mode(4, True)
        with pytest.raises(fake_nvml.InUse):
            lib.reset_gpu(4)  # the agent still holds NVML: an administrator's reset fails
        _wait_for(lambda: agent.released and lib.clients == 0)
        lib.reset_gpu(4)
        lib.create_gpu_instance(4, "3g.20gb")
        _wait_for(lambda: not agent.released and agent.collector.gpus[4].mig_mode)
        collected = agent.intervals
        _wait_for(lambda: agent.intervals >= collected + 2)
    finally:
        stop.set()
        worker.join(10)
    batches = []
    for sealed in agent.spool.pending():
        body = agent.spool.read(sealed)
        assert body is not None
        batches.append(json.loads(gzip.decompress(body)))
    events = [e for b in batches for e in b["events"]]
    [pending] = [e for e in events if e["kind"] == "mig_mode_change_pending"]
    assert pending["details"] == {
        "gpu_index": 4,
        "gpu_uuid": batches[0]["gpus"][4]["uuid"],
        "current": "disabled",
        "pending": "enabled",
    }
    [done] = [e for e in events if e["kind"] == "mig_mode_change_done"]
    assert done["details"]["now"] == "enabled"
    gpu4 = batches[-1]["gpus"][4]
    assert gpu4["mig_mode"] and [s["profile"] for s in gpu4["slices"]] == ["3g.20gb"]
    assert gpu4["unpartitioned_slices"] == 4
    assert batches[-1]["intervals"], "collecting again"
    durations = [i["duration_s"] for b in batches for i in b["intervals"]]
    assert min(durations) > 0.05, "the cadence starts again with the new layout, no stub interval"


def test_a_batch_set_aside_is_reported_in_a_later_batch_and_by_doctor(tmp_path: Path) -> None:
    config = AgentConfig(state_dir=tmp_path, interval_s=0.05, batch_intervals=2, imds="off", host_id="h")
    with Receiver() as receiver:
        receiver.poison_first = True
        agent = Agent(
            config, Nvml.open(fake_nvml.load("g5-idle")), IdentityResolver(config), poster=Poster(receiver.url, "gpf_x")
        )
        assert agent.sender is not None
        agent.sender.backoff_base_s = 0.01
        agent.sender.set_aside_after = 3

        def reported() -> list[dict[str, object]]:
            return [e for b in list(receiver.stored.values()) for e in b["events"] if e["kind"] == "batch_set_aside"]

        stop = threading.Event()
        worker = threading.Thread(target=agent.run, args=(stop,))
        worker.start()
        try:
            _wait_for(lambda: bool(reported()))
        finally:
            stop.set()
            worker.join(10)
    [poison] = receiver.poison
    assert receiver.ids()[:3] == [poison] * 3
    assert receiver.stored and poison not in receiver.stored, "a newer batch went, carrying the report"
    [event] = reported()
    assert event["details"]["batch_id"] == poison and event["details"]["tries"] == 3  # type: ignore[index]
    [aside] = agent.spool.aside()
    body = agent.spool.read(aside)
    assert body is not None and json.loads(gzip.decompress(body))["batch_id"] == poison, "kept for later"
    assert agent.spool.events() == [], "journaled once"
    check = _spool_check(config)
    assert check.status == "warn" and "1 set aside after repeated server errors" in check.message


def test_holders_follow_the_settings_and_a_simulated_host_has_its_own_proc(tmp_path: Path) -> None:
    lib = fake_nvml.load("g5-notebook")
    [pid] = [p.pid for g in lib._gpus for p in g.procs]
    assert holder_reader(AgentConfig(holders=False), lib) is None
    reader = holder_reader(AgentConfig(), lib)
    assert reader is not None and not reader.with_args
    assert reader.proc_root == lib.proc_tree().proc_root != Path("/proc")
    found = reader.read(pid, 9216)
    assert found is not None and (found.user, found.executable, found.command) == ("asmith", "python3", None)

    mine = holder_reader(AgentConfig(proc_root=tmp_path / "host-proc", holder_args=True), lib)
    assert mine is not None and mine.with_args
    assert (mine.proc_root, mine.pods_root) == (tmp_path / "host-proc", Path("/var/log/pods")), "set roots win"
    real = holder_reader(AgentConfig(), pynvml)
    assert real is not None and (real.proc_root, real.pods_root) == (Path("/proc"), Path("/var/log/pods"))


def test_holder_settings_are_switches(tmp_path: Path) -> None:
    config = load_config(
        {
            "GPUFLEET_AGENT_HOLDERS": "off",
            "GPUFLEET_AGENT_HOLDER_ARGS": "Yes",
            "GPUFLEET_AGENT_PROC_ROOT": "/host/proc",
            "GPUFLEET_AGENT_PODS_ROOT": "/host/var/log/pods",
        },
        config_file=Path(os.devnull),
    )
    assert (config.holders, config.holder_args) == (False, True)
    assert (config.proc_root, config.pods_root) == (Path("/host/proc"), Path("/host/var/log/pods"))
    defaults = load_config({}, config_file=Path(os.devnull))
    assert (defaults.holders, defaults.holder_args, defaults.proc_root) == (True, False, Path("/proc"))
    with pytest.raises(ConfigError, match="GPUFLEET_AGENT_HOLDER_ARGS: expected on or off, got 'sometimes'"):
        load_config({"GPUFLEET_AGENT_HOLDER_ARGS": "sometimes"}, config_file=Path(os.devnull))


def test_the_service_sends_who_holds_each_gpu(tmp_path: Path) -> None:
    config = AgentConfig(state_dir=tmp_path, interval_s=0.05, batch_intervals=1000, imds="off", host_id="h")
    agent = Agent(config, Nvml.open(fake_nvml.load("g5-notebook")), IdentityResolver(config))
    stop = threading.Event()
    worker = threading.Thread(target=agent.run, args=(stop,))
    worker.start()
    _wait_for(lambda: agent.intervals >= 3)
    stop.set()
    worker.join(10)
    [sealed] = agent.spool.pending()
    body = agent.spool.read(sealed)
    assert body is not None
    doc = json.loads(gzip.decompress(body))
    [described] = doc["holders"]
    assert (described["id"], described["user"], described["executable"]) == (0, "asmith", "python3")
    assert "command" not in described
    refs = [s["holders"] for iv in doc["intervals"] for s in iv["samples"]]
    assert len(refs) == len(doc["intervals"]) >= 3 and all(r == [{"ref": 0, "used_mib": 9216}] for r in refs)
    assert "errors" not in doc["agent"]
