"""The demo fleet's past, written through the bulk write path (`upsert_inventory`, `write_samples`).

Each simulated instance's inventory is what the real agent collector reports when it reads that instance's
fake NVML: one interval is collected on a simulated clock, and its layout and its readings (which figures
each device has, where its utilization comes from) shape every row of history. The figures themselves are
the fake's exact ones (`FakeNvml.truth`), so the history ends where the live agents, reading the same
scenarios, carry on. Intervals are 5 minutes long until `FINE_SPAN_S` before the end and as long as the live
agents' interval after, so an hour-long chart of the recent past is as fine as the live data that follows.

The history has holders too (`store_holders`, in each chunk's transaction): the processes the agent's own
holder reader finds in the fake's /proc tree, as the live agents find them. A row whose figures say the device
has processes refers to them, with the memory the reading gave; a row without, to none ("(none)" in a report by
holder). The fake starts each process some hours before the epoch, inside the history, so a row before that
start refers to an earlier run of the same process, started as long before the history began: no process
holds a device before it started, and the one the live agents see carries on from the history's rows (the
"since" of /gpus/idle is the start the fake gives).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import NamedTuple

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from agent import fake_nvml
from agent.batch import build_batch
from agent.collect import Collector
from agent.collect.holders import Holder
from agent.collect.model import Interval, Reading
from agent.config import AgentConfig
from agent.nvml import Nvml
from agent.run import holder_reader
from agent.spool import new_batch_id

from ..db import session_scope
from ..ingest.schemas import IngestBatchIn
from ..models import Instance
from ..sources import UTIL_SOURCES
from ..store.holders import HolderRefs, HolderRow, store_holders
from ..store.inventory import touch_instance, upsert_inventory
from ..store.samples import StageRow, write_samples
from .fleet import DAY, GRID_S, HOUR, DemoFleet, SimInstance

DAYS = 14
"""Days of history the demo starts with. An earlier run of a process started this long before the fake's start
for it: before the history begins."""
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


Held = tuple[tuple[int, int | None], ...]
"""A device's holders as a row refers to them: (slot, used MiB) each."""


@dataclass(frozen=True, slots=True)
class _Holding:
    """A device's holders: `later` for rows that start at or after `switch` (UTC epoch s, when the fake started
    them), `earlier` (their earlier runs) for rows before."""

    switch: float
    earlier: Held
    later: Held

    def at(self, a: float) -> Held:
        return self.later if a >= self.switch else self.earlier


@dataclass
class HolderBook:
    """The holders of a fleet's history, numbered from 0 (their slot in every `store_holders` call) with the
    instance each runs on."""

    described: list[tuple[str, Holder]] = field(default_factory=list)

    def add(self, instance_id: str, holder: Holder) -> int:
        self.described.append((instance_id, holder))
        return len(self.described) - 1

    def rows(self, instance_pks: Mapping[str, int]) -> list[HolderRow]:
        """Every holder so far as `store_holders` takes it; those of an instance not in `instance_pks` are left
        out (no row refers to them)."""
        return [
            # As the agent sends the start: whole seconds.
            HolderRow.of(slot, instance_pks[iid], h, None if h.started_at is None else _utc(int(h.started_at)))
            for slot, (iid, h) in enumerate(self.described)
            if iid in instance_pks
        ]


class Host:
    """One simulated instance as its history is written: inventory and rows from its fake NVML."""

    def __init__(self, fleet: DemoFleet, inst: SimInstance, interval_s: int, book: HolderBook | None = None) -> None:
        self.inst = inst
        self.interval_s = interval_s
        block = fleet.block(inst)
        self.launched = None if block is None else float(block.start)
        """When the instance was launched, UTC epoch s, if not before the history (a Capacity Block's)."""
        self.book = HolderBook() if book is None else book
        self.instance_pk: int | None = None
        self._clock = _SimClock(float(fleet.epoch))
        self.lib = fake_nvml.load(inst.scenario, clock=self._clock, seed=inst.nvml_seed, epoch=fleet.epoch)
        # The live agents' own reader of who holds a device, on the fake's /proc tree: the same holders.
        self._reader = holder_reader(AgentConfig(), self.lib)
        interval = self._collect(float(fleet.epoch + interval_s))
        self.gpus = [g.to_wire() for g in interval.gpus]
        self._template = {r.uuid: r for r in interval.readings}
        self._devices: list[_Device] = []
        self._holding: dict[str, _Holding] = {}
        self._looked: set[str] = set()
        self._take_holders(interval)

    def _collect(self, end: float) -> Interval:
        """One interval of the real collector on the fake, ending at clock time `end`: it reads the process
        lists at `end`."""
        self._clock.t = end - self.interval_s
        nvml = Nvml.open(self.lib)
        try:
            collector = Collector(
                nvml,
                clock=self._clock,
                wall_clock=lambda: datetime.fromtimestamp(self._clock.t, UTC),
                holders=self._reader,
            )
            collector.start()
            self._clock.t = end
            interval = collector.collect()
            collector.close()
        finally:
            nvml.close()
        return interval

    def _take_holders(self, interval: Interval) -> None:
        """Number the holders `interval`'s readings list on devices whose holders are not yet known."""
        for r in interval.readings:
            if not r.holders or r.uuid in self._holding:
                continue
            starts = [h.started_at for h in r.holders if h.started_at is not None]
            switch = min(starts, default=-math.inf)
            earlier = tuple((self.book.add(self.inst.instance_id, _earlier(h)), h.used_mib) for h in r.holders)
            later = tuple((self.book.add(self.inst.instance_id, h), h.used_mib) for h in r.holders)
            self._holding[r.uuid] = _Holding(switch, earlier, later)

    def _holders_of(self, uuid: str, a: float, b: float) -> _Holding | None:
        """The holders of a device whose row [a, b) says it has processes. A device that had none when the
        template was collected (work in office hours, at night) is looked at once, in the middle of this row."""
        holding = self._holding.get(uuid)
        if holding is None and uuid not in self._looked:
            self._looked.add(uuid)
            self._take_holders(self._collect((a + b) / 2))
            holding = self._holding.get(uuid)
        return holding

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

    def register(self, device_ids: Mapping[str, int], instance_pk: int | None = None) -> None:
        """Plan the rows of every device, now that the server has given each its id (and the instance its row,
        which the holders name)."""
        self._devices = [_plan(r, device_ids[uuid]) for uuid, r in self._template.items()]
        self.instance_pk = instance_pk

    def rows(self, a: float, b: float, ts: datetime, out: list[StageRow], refs: HolderRefs | None = None) -> None:
        """Append the rows of the interval [a, b) (UTC epoch s) that starts at `ts`; with `refs`, each row's
        references to the holders of its device, by the row's place in `out`."""
        truth = self.lib.truth(a, b)
        dur = b - a
        for d in self._devices:
            t = truth[d.uuid]
            util = round(t.util, 2) if d.util else None
            source = d.source
            if source == _RATE and util:
                source = _SAMPLES  # the buffer runs dry only while the GPU is idle
            procs = t.procs if d.procs else None
            if refs is not None and procs and self.instance_pk is not None:
                holding = self._holders_of(d.uuid, a, b)
                if holding is not None:
                    refs.add_sample(len(out), holding.at(a))
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
                    procs,
                    source,
                    round(t.util, 2) if d.gr_active else None,
                    d.ecc,
                    t.procs_mem_mib if d.procs_mem else None,
                    t.sm_clock_mhz if d.clock else None,
                )
            )


def _earlier(h: Holder) -> Holder:
    """The run of `h` before the fake's start for it: started `DAYS` earlier, so before the history begins."""
    return h if h.started_at is None else replace(h, started_at=h.started_at - DAYS * DAY)


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
    """Every instance's host, numbering their holders in one book."""
    book = HolderBook()
    return [Host(fleet, inst, interval_s, book) for inst in fleet.instances]


def _utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def register(sessions: sessionmaker[Session], hosts: Iterable[Host], *, first: float) -> None:
    """Make (or find) every instance, GPU and slice, as each agent's first batch would, and plan the rows. They
    are first seen at `first` (UTC epoch s), or when launched if later."""
    with session_scope(sessions) as session:
        for host in hosts:
            at = _utc(max(first, host.launched or first))
            result = upsert_inventory(session, host.batch(), first=at, last=at)
            host.register(result.device_ids, result.instance_pk)


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
    holder_refs: int = 0
    """References from rows to their devices' holders."""
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
    book = hosts[0].book if hosts else HolderBook()
    assert all(h.book is book for h in hosts), "one holder book (make_hosts): slots are unique within it"
    pks = {h.inst.instance_id: h.instance_pk for h in hosts if h.instance_pk is not None}

    def write(rows: list[StageRow], holders: list[HolderRow], refs: HolderRefs) -> None:
        with session_scope(sessions) as session:
            write_samples(session, rows, mem_held_mib=mem_held_mib)
            store_holders(session, holders, refs)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="demo-history") as writer:
        pending: Future[None] | None = None
        chunk = math.floor(begin / CHUNK_S) * CHUNK_S
        while chunk < end:
            c0, c1 = chunk, min(end, chunk + CHUNK_S)
            chunk += CHUNK_S
            rows: list[StageRow] = []
            refs = HolderRefs()
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
                    host.rows(x, y, ts, rows, refs)
                    newest[inst.instance_id] = y
            if not rows:
                continue
            # Taken here, not in the writer's thread: the next chunk may find more holders meanwhile.
            holders = book.rows(pks) if refs.ords else []
            if pending is not None:
                pending.result()
            pending = writer.submit(write, rows, holders, refs)
            written.rows += len(rows)
            written.holder_refs += len(refs.ords)
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
