"""The demo's live agents: the real gpufleet agent, one per simulated instance, each in a thread of its own.

Each reads its instance's fake NVML scenario on the wall clock, finds its identity and tags in the simulated
instance metadata (IMDSv2, `app.demo.imds`), journals and spools as on a host, and posts to the demo's
server over HTTP with its signed instance identity (the demo's ingest token rides along as a fallback). A spot
instance's agent stops while the fleet says the instance is away and starts again, with a fresh NVML, when it
is back.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from agent import fake_nvml
from agent.config import AgentConfig
from agent.identify import IdentityResolver
from agent.nvml import Nvml, NvmlUnavailable
from agent.run import STOP_FLUSH_S, Agent

from .fleet import DemoFleet, SimInstance
from .imds import MetadataServer

log = logging.getLogger("gpufleet.demo")


@dataclass(frozen=True)
class SimulatedHostConfig(AgentConfig):
    """Agent settings for a simulated host: its host name is the instance's, not this machine's."""

    hostname: str = ""

    def host_name(self) -> str:
        return self.hostname


@dataclass
class _Running:
    thread: threading.Thread
    stop: threading.Event


class LiveAgents:
    """The agents of `fleet`, posting to `server_url` with the token in `token_file`, every `interval_s` s."""

    def __init__(
        self,
        fleet: DemoFleet,
        *,
        server_url: str,
        token_file: Path,
        metadata: MetadataServer,
        state_dir: Path,
        interval_s: int,
    ) -> None:
        self.fleet = fleet
        self.server_url = server_url
        self.token_file = token_file
        self.metadata = metadata
        self.state_dir = state_dir
        self.interval_s = interval_s
        self._running: dict[str, _Running] = {}

    def config(self, inst: SimInstance) -> SimulatedHostConfig:
        return SimulatedHostConfig(
            server_url=self.server_url,
            token_file=self.token_file,
            interval_s=float(self.interval_s),
            # One interval per batch: the dashboard moves with every interval.
            batch_intervals=1,
            state_dir=self.state_dir / inst.instance_id,
            spool_max_mib=16.0,
            backoff_max_s=30.0,
            imds="on",
            imds_url=self.metadata.url_for(inst.instance_id),
            imds_timeout_s=2.0,
            hostname=inst.hostname,
        )

    def clear_state(self) -> None:
        """Forget what agents of an earlier run left in their spools: the history has covered that time."""
        shutil.rmtree(self.state_dir, ignore_errors=True)

    @property
    def running(self) -> int:
        return sum(r.thread.is_alive() and not r.stop.is_set() for r in self._running.values())

    def sync(self, now: float) -> None:
        """Start the agent of every instance that is up at `now` and not running; stop those whose instance
        is away."""
        for inst in self.fleet.instances:
            up = self.fleet.online(inst, now)
            current = self._running.get(inst.instance_id)
            alive = current is not None and current.thread.is_alive()
            if up and not alive:
                self._start(inst)
            elif not up and current is not None and not current.stop.is_set():
                current.stop.set()

    def stop(self) -> None:
        """Stop every agent; each seals and delivers what it holds, as a stopping agent does."""
        for r in self._running.values():
            r.stop.set()
        deadline = time.monotonic() + STOP_FLUSH_S + 5.0
        for r in self._running.values():
            r.thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self._running.clear()

    def _start(self, inst: SimInstance) -> None:
        stop = threading.Event()
        thread = threading.Thread(target=self._run, args=(inst, stop), name=f"agent-{inst.instance_id}", daemon=True)
        self._running[inst.instance_id] = _Running(thread, stop)
        thread.start()

    def _run(self, inst: SimInstance, stop: threading.Event) -> None:
        config = self.config(inst)
        lib = fake_nvml.load(inst.scenario, clock=time.time, seed=inst.nvml_seed, epoch=self.fleet.epoch)
        try:
            nvml = Nvml.open(lib)
        except NvmlUnavailable as exc:
            log.error("agent of %s cannot start: %s", inst.instance_id, exc)
            return
        try:
            Agent(config, nvml, IdentityResolver(config)).run(stop)
        except Exception:
            log.exception("agent of %s stopped on an error", inst.instance_id)
        finally:
            nvml.close()
