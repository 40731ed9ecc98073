"""A sample's JSON made directly (`Reading.to_json`) is the text `json.dumps` writes for its dictionary."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from agent.collect.holders import Holder
from agent.collect.model import Interval, Reading

FLOATS = st.none() | st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**40), 2**40)
INTS = st.none() | st.integers(-(2**63), 2**63)


def refs(holders: tuple[Holder, ...]) -> list[dict[str, int]]:
    return [{"ref": n, "used_mib": h.used_mib} if h.used_mib is not None else {"ref": n} for n, h in enumerate(holders)]


def refs_json(holders: tuple[Holder, ...]) -> str:
    held = refs(holders)
    return json.dumps(held, separators=(",", ":")) if held else ""


def holder(pid: int, used_mib: int | None) -> Holder:
    return Holder(pid=pid, started_at=None, executable="python3", uid=1000, user="asmith", used_mib=used_mib)


@given(
    uuid=st.text(),
    source=st.sampled_from(["none", "nvml.util", "nvml.gpm", 'odd "source"\n']),
    util=FLOATS,
    sm=FLOATS,
    gr=FLOATS,
    power=FLOATS,
    mem=INTS,
    temp=INTS,
    clock=INTS,
    ecc=INTS,
    procs=INTS,
    procs_mem=INTS,
    held=st.lists(st.none() | st.integers(0, 2**20), max_size=3),
)
def test_a_sample_s_json_is_what_json_dumps_writes(
    uuid: str,
    source: str,
    util: float | None,
    sm: float | None,
    gr: float | None,
    power: float | None,
    mem: int | None,
    temp: int | None,
    clock: int | None,
    ecc: int | None,
    procs: int | None,
    procs_mem: int | None,
    held: list[int | None],
) -> None:
    reading = Reading(
        uuid,
        util=util,
        util_source=source,
        sm_active=sm,
        gr_active=gr,
        mem_used_mib=mem,
        power_w=power,
        temp_c=temp,
        sm_clock_mhz=clock,
        ecc_uncorrected=ecc,
        procs=procs,
        procs_mem_mib=procs_mem,
        holders=tuple(holder(n + 1, m) for n, m in enumerate(held)),
    )
    assert reading.to_json(refs_json) == json.dumps(reading.to_wire(refs), separators=(",", ":"))
    assert reading.to_json() == json.dumps(reading.to_wire(), separators=(",", ":"))


def test_an_interval_s_record_holds_its_samples_json() -> None:
    readings = [Reading("GPU-a", util=12.345, util_source="nvml.util", power_w=math.pi), Reading("MIG-b", procs=0)]
    interval = Interval(start=datetime(2026, 11, 24, 17, tzinfo=UTC), duration_s=10.00049, gpus=(), readings=readings)
    record = interval.to_record()
    wire = interval.to_wire()
    assert {**record, "samples": json.loads(record["samples"])} == wire
    assert record["samples"] == json.dumps(wire["samples"], separators=(",", ":"))
