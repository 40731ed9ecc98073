"""The demo fleet's past, written through the bulk write path (`upsert_inventory`, `write_samples`).

Each simulated instance's inventory is what the real agent collector reports when it reads that instance's
fake NVML: one interval is collected on a simulated clock, and its layout and its readings (which figures
each device has, where its utilization comes from) shape every row of history. The figures themselves are
the fake's exact ones (`FakeNvml.truth`), so the history ends where the live agents, reading the same
scenarios, carry on. Intervals are 5 minutes long until `FINE_SPAN_S` before the end and as long as the live
agents' interval after, so an hour-long chart of the recent past is as fine as the live data that follows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from agent import fake_nvml
from agent.batch import build_batch
from agent.collect import Collector
from agent.collect.model import Reading
from agent.nvml import Nvml
from agent.spool import new_batch_id

from ..db import session_scope
from ..ingest.schemas import IngestBatchIn
from ..models import Instance
from ..sources import UTIL_SOURCES
from ..store.inventory import touch_instance, upsert_inventory
from ..store.samples import StageRow, write_samples
from .fleet import GRID_S, HOUR, DemoFleet, SimInstance

FINE_SPAN_S = 2 * HOUR
"""The last stretch of history written at the live interval, s: hour-long charts read raw samples."""
CHUNK_S = 6 * HOUR
"""History goes in one transaction per this much time, s, oldest first."""
_SAMPLES = UTIL_SOURCES["nvml.samples"]
_RATE = UTIL_SOURCES["nvml.rate"]


class _SimClock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class _Device(NamedTuple):
    """How one device's rows are made: which figures the agent reports for it, and where util comes from."""

    uuid: str
    device_id: int
    source: int
    util: bool
    sm_active: bool
    gr_active: bool
    memory: bool
    power: bool
    temp: bool
    clock: bool
    ecc: int | None
    procs: bool
    procs_mem: bool


class Host:
    """One simulated instance as its history is written: inventory and rows from its fake NVML."""

    def __init__(self, fleet: DemoFleet, inst: SimInstance, interval_s: int) -> None:
        self.inst = inst
        self.interval_s = interval_s
        clock = _SimClock(float(fleet.epoch))
        self.lib = fake_nvml.load(inst.scenario, clock=clock, seed=inst.nvml_seed, epoch=fleet.epoch)
        nvml = Nvml.open(self.lib)
        try:
            collector = Collector(nvml, clock=clock, wall_clock=lambda: datetime.fromtimestamp(clock.t, UTC))
            collector.start()
            clock.t += interval_s
            interval = collector.collect()
            collector.close()
        finally:
            nvml.close()
        self.gpus = [g.to_wire() for g in interval.gpus]
        self._template = {r.uuid: r for r in interval.readings}
        self._devices: list[_Device] = []

    def batch(self) -> IngestBatchIn:
        """The inventory as the agent's batches carry it (no intervals)."""
        document = build_batch(
            batch_id=new_batch_id(),
            instance=self.inst.identity().to_wire(),
            gpus=self.gpus,
            intervals=[],
            events=[],
            interval_s=float(self.interval_s),
        )
        return IngestBatchIn.model_validate(document)

    def register(self, device_ids: Mapping[str, int]) -> None:
        """Plan the rows of every device, now that the server has given each its id."""
        self._devices = [_plan(r, device_ids[uuid]) for uuid, r in self._template.items()]

    def rows(self, a: float, b: float, ts: datetime, out: list[StageRow]) -> None:
        """Append the rows of the interval [a, b) (UTC epoch s) that starts at `ts`."""
        truth = self.lib.truth(a, b)
        dur = b - a
        for d in self._devices:
            t = truth[d.uuid]
            util = round(t.util, 2) if d.util else None
            source = d.source
            if source == _RATE and util:
                source = _SAMPLES  # the buffer runs dry only while the GPU is idle
            out.append(
                (
                    ts,
                    d.device_id,
                    dur,
                    t.mem_used_mib if d.memory else None,
                    util,
                    round(t.sm_active, 2) if d.sm_active else None,
                    round(t.power_w) if d.power and t.power_w is not None else None,
                    t.temp_c if d.temp else None,
                    t.procs if d.procs else None,
                    source,
                    round(t.util, 2) if d.gr_active else None,
                    d.ecc,
                    t.procs_mem_mib if d.procs_mem else None,
                    t.sm_clock_mhz if d.clock else None,
                )
            )


def _plan(r: Reading, device_id: int) -> _Device:
    return _Device(
        uuid=r.uuid,
        device_id=device_id,
        source=UTIL_SOURCES[r.util_source],
        util=r.util is not None,
        sm_active=r.sm_active is not None,
        gr_active=r.gr_active is not None,
        memory=r.mem_used_mib is not None,
        power=r.power_w is not None,
        temp=r.temp_c is not None,
        clock=r.sm_clock_mhz is not None,
        ecc=r.ecc_uncorrected,
        procs=r.procs is not None,
        procs_mem=r.procs_mem_mib is not None,
    )


def make_hosts(fleet: DemoFleet, interval_s: int) -> list[Host]:
    return [Host(fleet, inst, interval_s) for inst in fleet.instances]


def _utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def register(sessions: sessionmaker[Session], hosts: Iterable[Host], *, first: float) -> None:
    """Make (or find) every instance, GPU and slice, as each agent's first batch would, and plan the rows."""
    with session_scope(sessions) as session:
        for host in hosts:
            result = upsert_inventory(session, host.batch(), first=_utc(first), last=_utc(first))
            host.register(result.device_ids)


def last_seen(sessions: sessionmaker[Session]) -> dict[str, float]:
    """When each instance's newest data ends, UTC epoch s: history or live agents carry on from there."""
    with session_scope(sessions) as session:
        rows = session.execute(select(Instance.instance_id, Instance.last_seen)).all()
    return {str(i): seen.timestamp() for i, seen in rows}


def spans(t0: float, t1: float, *, fine_from: float, fine_s: int) -> list[tuple[float, float]]:
    """Back-to-back intervals over [t0, t1): ending on the 5-minute grid before `fine_from` and on the `fine_s`
    grid after; an interval that would be shorter than a second joins the next one."""
    out: list[tuple[float, float]] = []
    t = t0
    while t < t1:
        step = GRID_S if t < fine_from else fine_s
        end: float = (math.floor(t / step) + 1) * step
        if end - t < 1.0:
            end += step
        end = min(end, t1)
        out.append((t, end))
        t = end
    return out


@dataclass
class Written:
    rows: int = 0
    transactions: int = 0


def write_history(
    sessions: sessionmaker[Session],
    fleet: DemoFleet,
    hosts: list[Host],
    *,
    starts: Mapping[str, float],
    end: float,
    fine_s: int,
    mem_held_mib: int,
) -> Written:
    """Every instance's samples from its start in `starts` (UTC epoch s) to `end`, leaving out the hours a
    spot instance is away, oldest first; then each instance is seen up to its newest interval. One chunk is
    written while the next is made, so the database and Python work side by side."""
    written = Written()
    fine_from = math.floor((end - FINE_SPAN_S) / GRID_S) * GRID_S
    begin = min((starts[h.inst.instance_id] for h in hosts), default=end)
    newest: dict[str, float] = {}
    stamps: dict[float, datetime] = {}

    def write(rows: list[StageRow]) -> None:
        with session_scope(sessions) as session:
            write_samples(session, rows, mem_held_mib=mem_held_mib)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="demo-history") as writer:
        pending: Future[None] | None = None
        chunk = math.floor(begin / CHUNK_S) * CHUNK_S
        while chunk < end:
            c0, c1 = chunk, min(end, chunk + CHUNK_S)
            chunk += CHUNK_S
            rows: list[StageRow] = []
            for host in hosts:
                inst = host.inst
                a = max(c0, starts[inst.instance_id])
                if a >= c1:
                    continue
                away = fleet.offline(inst, a, c1)
                for x, y in spans(a, c1, fine_from=fine_from, fine_s=fine_s):
                    middle = (x + y) / 2
                    if any(g0 <= middle < g1 for g0, g1 in away):
                        continue
                    ts = stamps.get(x)
                    if ts is None:
                        ts = stamps[x] = _utc(x)
                    host.rows(x, y, ts, rows)
                    newest[inst.instance_id] = y
            if not rows:
                continue
            if pending is not None:
                pending.result()
            pending = writer.submit(write, rows)
            written.rows += len(rows)
            written.transactions += 1
        if pending is not None:
            pending.result()
    _seen(sessions, hosts, newest)
    return written


def _seen(sessions: sessionmaker[Session], hosts: list[Host], newest: Mapping[str, float]) -> None:
    with session_scope(sessions) as session:
        pks = {str(i): int(pk) for i, pk in session.execute(select(Instance.instance_id, Instance.id))}
        for host in hosts:
            iid = host.inst.instance_id
            if iid in newest and iid in pks:
                seen = _utc(newest[iid])
                touch_instance(session, pks[iid], first=seen, last=seen, agent_errors={})
