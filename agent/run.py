"""The service loop: collect on a fixed cadence, journal, seal, and hand batches to the sender thread.

The cadence is deadline-based: the k-th interval ends at start + k x interval on the monotonic clock, so the
loop's own work never makes it drift. If the host stalls past whole deadlines (suspended VM, overloaded
box), the missed ticks are skipped and the next interval is simply longer: its duration says so, and
nothing is lost.

A MIG mode change waits for a GPU reset, which an open NVML client blocks ("In use by another client", NVIDIA
MIG user guide). When NVML reports one pending, the agent says so in an event, lets go of NVML and keeps
delivering its spool; every `mig_recheck_s` it opens NVML for a moment to see whether the change is done,
and collects again, from the new layout, once it is.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from . import __version__
from .batch import Batcher
from .collect import Collector
from .collect.holders import HolderReader
from .config import DEFAULT_PODS_ROOT, DEFAULT_PROC_ROOT, AgentConfig
from .identify import Identity, IdentityResolver, IdentityUnavailable
from .nvml import Nvml, NvmlUnavailable
from .send import Poster, Sender
from .spool import JOURNAL, Journal, Spool

log = logging.getLogger("gpufleet.agent")

EVENT_POLL_S = 5.0  # AWS's advice for watching spot/instance-action; also how often the sample buffer is read
STOP_FLUSH_S = 5.0  # how long a stopping agent keeps trying to deliver what it holds
MIG_RECHECK_S = 30.0  # how often a released agent looks whether a pending MIG mode change is done


def holder_reader(config: AgentConfig, lib: Any) -> HolderReader | None:
    """The reader of who holds each device, as configured; None with holders off. A simulated host (fake NVML)
    whose processes have /proc entries of their own is read from those, unless the roots were set."""
    if not config.holders:
        return None
    proc_root, pods_root, user_of = config.proc_root, config.pods_root, None
    simulated = getattr(lib, "proc_tree", None)
    if callable(simulated) and (proc_root, pods_root) == (DEFAULT_PROC_ROOT, DEFAULT_PODS_ROOT):
        tree = simulated()
        proc_root, pods_root, user_of = tree.proc_root, tree.pods_root, tree.users.get
    return HolderReader(proc_root, pods_root, with_args=config.holder_args, user_of=user_of)


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        nvml: Nvml,
        resolver: IdentityResolver,
        *,
        poster: Poster | None = None,
        clock: Callable[[], float] = time.monotonic,
        backoff_base_s: float = 1.0,
        mig_recheck_s: float = MIG_RECHECK_S,
    ) -> None:
        self.config = config
        self.nvml = nvml
        self.resolver = resolver
        self.clock = clock
        self.spool = Spool(
            config.spool_dir,
            max_bytes=int(config.spool_max_mib * 1024 * 1024),
            max_age_s=config.spool_max_age_h * 3600,
        )
        self.batcher = Batcher(
            self.spool,
            Journal(config.state_dir / JOURNAL),
            batch_intervals=config.batch_intervals,
            interval_s=config.interval_s,
        )
        url = config.ingest_url
        if poster is None and url is not None:
            poster = Poster(url, config.bearer_token(), ca_bundle=config.ca_bundle, timeout_s=config.http_timeout_s)
        if poster is not None and poster.identity is None:
            poster.identity = resolver.signed_identity  # the X-Gpufleet-Instance-Identity header, on EC2
        self.sender = (
            Sender(self.spool, poster, backoff_base_s=backoff_base_s, backoff_max_s=config.backoff_max_s)
            if poster is not None
            else None
        )
        self.holders = holder_reader(config, nvml.lib)
        self.collector = Collector(nvml, clock=clock, holders=self.holders)
        self.mig_recheck_s = mig_recheck_s
        self.released = False
        """True while NVML is let go for a pending MIG mode change."""
        self.intervals = 0
        self.skipped_ticks = 0
        self._last_identity: Identity | None = None

    def run(self, stop: threading.Event) -> None:
        """Collect until `stop` is set; then seal the open batch and give delivery a last short chance."""
        recovered = self.batcher.recover()
        sender_thread = None
        if self.sender is not None:
            sender_thread = threading.Thread(target=self.sender.run, args=(stop,), name="sender", daemon=True)
            sender_thread.start()
        identity = self._identity(stop)
        if identity is None:
            return
        self.collector.start()
        log.info(
            "collecting every %g s from %d GPUs (%d MIG slices) as %s; spool %s%s",
            self.config.interval_s,
            len(self.collector.gpus),
            sum(len(g.slices) for g in self.collector.gpus),
            identity.instance_id,
            self.config.spool_dir,
            " (recovered a batch from the previous run)" if recovered else "",
        )
        self._seal(self.batcher.add_events([self._event("agent_start", {"version": __version__})], identity.to_wire()))
        began = self.clock()
        tick = 0
        try:
            while True:
                tick += 1
                deadline = began + tick * self.config.interval_s
                if self._wait_until(deadline, stop):
                    break
                behind = self.clock() - deadline
                if behind > self.config.interval_s:
                    skipped = math.floor(behind / self.config.interval_s)
                    tick += skipped
                    self.skipped_ticks += skipped
                self._one_interval()
                if self.collector.pending_mig_changes():
                    if not self._release_for_mig_change(stop):
                        break
                    # The new collector's first interval began when it started: keep the cadence from there.
                    began, tick = self.clock(), 0
        finally:
            self._shutdown(stop, sender_thread)

    def _wait_until(self, deadline: float, stop: threading.Event) -> bool:
        """Sleep to the deadline, looking for spot notices every few seconds on the way; True if stopped."""
        while True:
            left = deadline - self.clock()
            if left <= 0:
                return stop.is_set()
            if stop.wait(min(left, EVENT_POLL_S)):
                return True
            if deadline - self.clock() > 0.5:
                self._events()
                if not self.released:
                    self.collector.poll()

    def _events(self) -> None:
        events = self.resolver.poll_events()
        if events:
            self._record_events(events)
        self._delivery_events()

    def _delivery_events(self) -> None:
        """Journal the events the sender thread left in the spool (a batch set aside, or delivered at last);
        they leave the spool only once journaled."""
        events = self.spool.events()
        if not events:
            return
        try:
            self._seal(self.batcher.add_events(events, self._current_identity().to_wire()))
        except OSError as exc:
            log.error("cannot write to the spool at %s: %s", self.config.state_dir, exc)
            return
        self.spool.discard_events(len(events))

    def _one_interval(self) -> None:
        interval = self.collector.collect()
        self.intervals += 1
        instance = self._current_identity().to_wire()
        try:
            sealed = self.batcher.add(interval, instance, self.nvml.take_errors())
            log.debug(
                "journaled interval %s (%.3f s, %d samples)",
                interval.start.isoformat(),
                interval.duration_s,
                len(interval.readings),
            )
        except OSError as exc:
            log.error("cannot write to the spool at %s: %s", self.config.state_dir, exc)
            return
        self._seal(sealed)
        self._events()

    def _release_for_mig_change(self, stop: threading.Event) -> bool:
        """Let go of NVML until no MIG mode change is pending, then collect from the new layout. False if the
        agent was stopped meanwhile."""
        pending = self.collector.pending_mig_changes()
        details = [
            {
                "gpu_index": gpu.index,
                "gpu_uuid": gpu.uuid,
                "current": "enabled" if gpu.mig_mode else "disabled",
                "pending": "enabled" if gpu.mig_pending else "disabled",
            }
            for gpu in pending
        ]
        self._record_events([self._event("mig_mode_change_pending", d) for d in details])
        log.warning(
            "MIG mode change pending on GPU %s: NVML released so the GPU can be reset; collection resumes once "
            "the change is done (checked every %g s)",
            ", ".join(str(d["gpu_index"]) for d in details),
            self.mig_recheck_s,
        )
        self.collector.close()
        self.nvml.close()
        self.released = True
        while True:
            if self._wait_until(self.clock() + self.mig_recheck_s, stop):
                return False
            try:
                nvml = Nvml.open(self.nvml.lib)
            except NvmlUnavailable as exc:
                log.warning("NVML cannot be opened again yet: %s", exc)
                continue
            collector = Collector(nvml, clock=self.clock, holders=self.holders)
            collector.start()
            if collector.pending_mig_changes():
                collector.close()
                nvml.close()
                continue
            self.nvml, self.collector, self.released = nvml, collector, False
            modes = {g.index: "enabled" if g.mig_mode else "disabled" for g in collector.gpus}
            self._record_events(
                [
                    self._event("mig_mode_change_done", {**d, "now": modes.get(int(d["gpu_index"]), "gone")})
                    for d in details
                ]
            )
            log.info("MIG mode change done; collecting again from %d GPUs", len(collector.gpus))
            return True

    def _record_events(self, events: list[dict[str, Any]]) -> None:
        try:
            self._seal(self.batcher.add_events(events, self._current_identity().to_wire()))
        except OSError as exc:
            log.error("cannot write to the spool at %s: %s", self.config.state_dir, exc)

    def _seal(self, sealed: list[Any]) -> None:
        if sealed and self.sender is not None:
            self.sender.wake.set()

    def _identity(self, stop: threading.Event) -> Identity | None:
        """The host's identity; with IMDS required, wait for it (logging why) rather than guess."""
        delay = 1.0
        while True:
            try:
                identity = self.resolver.identity()
                self._last_identity = identity
                return identity
            except IdentityUnavailable as exc:
                log.warning("waiting for the instance identity: %s", exc)
            if stop.wait(delay):
                return None
            delay = min(60.0, delay * 2)

    def _current_identity(self) -> Identity:
        with contextlib.suppress(IdentityUnavailable):  # keep the identity this run already established
            self._last_identity = self.resolver.identity()
        assert self._last_identity is not None
        return self._last_identity

    def _event(self, kind: str, details: dict[str, Any]) -> dict[str, Any]:
        return {"ts": datetime.now(UTC).isoformat().replace("+00:00", "Z"), "kind": kind, "details": details}

    def _shutdown(self, stop: threading.Event, sender_thread: threading.Thread | None) -> None:
        self._delivery_events()
        try:
            self.batcher.flush()
        except OSError as exc:
            log.error("cannot seal the open batch: %s (it stays in the journal)", exc)
        self.batcher.journal.close()
        self.collector.close()
        if sender_thread is not None and self.sender is not None:
            stop.set()
            self.sender.wake.set()
            sender_thread.join(timeout=STOP_FLUSH_S)
        sender_busy = sender_thread is not None and sender_thread.is_alive()
        if self.sender is not None and self.sender.failures == 0 and not sender_busy:
            self.sender.poster.timeout_s = min(self.sender.poster.timeout_s, STOP_FLUSH_S)
            # A server that answered a moment ago gets one short chance at what was just sealed.
            last = threading.Event()
            timer = threading.Timer(STOP_FLUSH_S, last.set)
            timer.start()
            try:
                self.sender.send_pending(last)
            finally:
                timer.cancel()
        waiting, aside = len(self.spool.pending()), len(self.spool.aside())
        log.info(
            "stopped after %d intervals; %d batches wait in the spool for the next start%s",
            self.intervals,
            waiting + aside,
            f" ({aside} of them set aside after repeated server errors)" if aside else "",
        )
