"""What each rule's condition finds in the fleet right now (docs/alerts.md, "What each condition finds"): one
`Finding` per subject (a GPU, a slice, an instance, a tag value) for which the condition holds, within the rule's
scope.

Read from one `Snapshot` per evaluation (app/alerts/snapshot.py), shared by every rule: what a condition finds is
worked out once, however short, and each rule keeps what has held for its own `for` and lies in its scope. The
figures are the analysis's own (app/analyse): the idle list's stretches and dollars, the MIG page's under-used
slices and free capacity, the waste of each instance as the waste page sums it by tag.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from ..analyse.price_now import mean_price
from .rules import Rule, Scope
from .snapshot import Snapshot, load_snapshot
from .words import day_rate, gpu_words, hours_between, places, slice_words, span

__all__ = ["CONDITIONS", "Finding", "Snapshot", "find", "load_snapshot", "within"]


@dataclass(frozen=True)
class Finding:
    """A subject for which a rule's condition holds now."""

    subject: str
    """Stable key: gpu:<uuid>, slice:<uuid>, mig-free:<gpu uuid>, instance:<instance id>, tag:<key>=<value>."""
    since: datetime
    """When the condition started holding (the start of the idle stretch, the last sample ...)."""
    what: str
    """One line saying what holds: "GPU 0 (NVIDIA A10G) idle for 3.2 h"."""
    instance_pk: int | None = None
    instance_id: str | None = None
    """EC2 instance id, when the subject is on one instance."""
    instance_name: str | None = None
    """Its Name tag, hostname or id."""
    device_id: int | None = None
    """The GPU or slice row id, when one."""
    device: str | None = None
    """The GPU or slice in words: "GPU 0 (NVIDIA A10G)", "slice 1g.10gb on GPU 2"."""
    usd_so_far: float | None = None
    """What the stretch has cost so far, USD; None without a price."""
    usd_per_day: float | None = None
    """What it costs per day while it stays so, USD/day; None without a price."""
    holders: tuple[str, ...] = ()
    """Users whose processes hold the GPU or slice; empty: no one known."""
    tags: dict[str, str] = field(default_factory=dict)
    """The instance's tags (owner routing reads them)."""
    lifecycle: str | None = None
    """spot, on-demand, on-prem (the stop action's guard reads it)."""
    capacity_block: bool = False
    """The instance runs in a Capacity Block for ML (the stop action's guard reads it)."""
    page: str = "/"
    """Dashboard path that shows it: /instances/<id>, /waste?group_by=tag:team ..."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Condition-specific figures kept in the incident's details (util %, hours, threshold ...)."""


# Applying a rule ---------------------------------------------------------------------------------------------------


def find(snapshot: Snapshot, rule: Rule) -> list[Finding]:
    """The subjects for which `rule`'s condition holds now, for at least its `for`, within its scope; oldest first.
    ValueError for a condition this server does not know."""
    condition = CONDITIONS.get(rule.condition)
    if condition is None:
        raise ValueError(f"unknown condition {rule.condition!r}")
    found = within(snapshot, rule.scope, condition(snapshot, rule))
    found.sort(key=lambda f: (f.since, f.subject))
    return found


def within(snapshot: Snapshot, scope: Scope, findings: Iterable[Finding]) -> list[Finding]:
    """Those of `findings` in the scope: their instance passes its instance filters (a tag's waste was filtered
    instance by instance before it was summed), and, when it names users, one of them holds their GPU or slice. A
    finding held by no one, or about what no one can hold (free MIG capacity, a tag's waste), is in no scope that
    names users."""
    filters, users = scope.filters(), set(scope.users)
    instances = snapshot.fleet.instances
    passing: dict[int, bool] = {}  # per instance: thousands of findings sit on a few hundred instances
    out = []
    for f in findings:
        pk = f.instance_pk
        if pk is not None:
            ok = passing.get(pk)
            if ok is None:
                ok = passing[pk] = snapshot.passes(filters, instances[pk])
            if not ok:
                continue
        if not users or not users.isdisjoint(f.holders):
            out.append(f)
    return out


def _held_for(snapshot: Snapshot, rule: Rule, found: list[Finding]) -> list[Finding]:
    """Those of `found` that have held since at least the rule's `for` before now."""
    cutoff = snapshot.now - timedelta(hours=rule.for_hours or 0.0)
    return [f for f in found if f.since <= cutoff]


# gpu_idle -----------------------------------------------------------------------------------------------------------


def _idle_gpus(snapshot: Snapshot) -> list[Finding]:
    idle = snapshot.idle
    holders = snapshot.holders(g.gpu.pk for g in idle)
    where = places(snapshot, [g.gpu.instance for g in idle])
    out = []
    for g in idle:
        words, hours = gpu_words(g.gpu), hours_between(g.since, snapshot.now)
        out.append(
            Finding(
                subject=f"gpu:{g.gpu.uuid}",
                since=g.since,
                what=f"{words} {g.state} for {span(hours)}",
                device_id=g.gpu.pk,
                device=words,
                usd_so_far=g.burned_usd,
                usd_per_day=g.usd_per_day,
                holders=holders[g.gpu.pk],
                extra={
                    "state": g.state,
                    "hours": hours,
                    "idle_hours": g.idle_hours,
                    "idle_held_hours": g.held_s / 3600,
                    "usd_per_hour": g.usd_per_hour,
                    "price_source": g.price_source,
                    "mem_used_mib": g.latest.mem_used_mib if g.latest else None,
                    "procs": g.latest.procs if g.latest else None,
                },
                **where[g.gpu.instance.pk],
            )
        )
    return out


def gpu_idle(snapshot: Snapshot, rule: Rule) -> list[Finding]:
    """A passthrough GPU idle or idle-held (docs/waste.md, "States") since at least `for` ago: the stretch the idle
    list shows, from the end of its last busy interval, on an instance that reports now. Dollars: what the stretch
    burned so far, and its price now per day. The idle GPUs are read once, however short their stretch, and each
    rule keeps those idle for its own `for`."""
    return _held_for(snapshot, rule, snapshot.memo("gpu_idle", lambda: _idle_gpus(snapshot)))


# slice_underused ----------------------------------------------------------------------------------------------------


def _underused(snapshot: Snapshot, hours: float) -> list[Finding]:
    window, picked = snapshot.underused(hours)
    if not picked:
        return []
    instances = [s.gpu.instance for s in picked]
    holders = snapshot.holders(s.slot.slice.pk for s in picked)
    pieces = snapshot.pieces(instances, window.start)
    where = places(snapshot, instances)
    rates: dict[tuple[int, datetime], float | None] = {}
    judged = {
        "window_start": window.start.isoformat(),
        "window_end": min(window.end, snapshot.now).isoformat(),
        "underused_util_pct": snapshot.thresholds.underused_util_pct,
    }
    over = span(hours)
    out = []
    for s in picked:
        sl, unit = s.slot.slice, s.unit
        figures, words = unit.figures(), slice_words(sl)
        inst, start = sl.gpu.instance, max(window.start, sl.first_seen)
        if (inst.pk, start) not in rates:
            rates[inst.pk, start] = mean_price(inst, pieces.get(inst.pk, ()), start, snapshot.now)[0]
        rate = rates[inst.pk, start] if unit.sized else None  # a slice of unknown size has unknown GPU-hours
        out.append(
            Finding(
                subject=f"slice:{sl.uuid}",
                since=max(window.start, sl.first_seen),
                what=f"{words} under-used over the last {over}: {s.slot.reason}",
                device_id=sl.pk,
                device=words,
                usd_so_far=None if rate is None else rate * figures.gpu_hours,
                usd_per_day=day_rate(s.usd_per_hour),
                holders=holders[sl.pk],
                extra={
                    "reason": s.slot.reason,
                    "profile": sl.profile_label,
                    "avg_util_pct": unit.avg_util,
                    "no_process_pct": unit.no_proc_s / unit.covered_s * 100 if unit.covered_s > 0 else None,
                    "no_process_usd": None if rate is None else rate * figures.no_proc_h,
                    **judged,
                },
                **where[sl.gpu.instance.pk],
            )
        )
    return out


def slice_underused(snapshot: Snapshot, rule: Rule) -> list[Finding]:
    """A MIG slice under-used over the last `for` (in whole hours covering it; docs/waste.md: no process in 99% of
    its time, or an average utilization under GPUFLEET_UNDERUSED_UTIL_PCT) that has existed at least that long, on
    an instance that reports now. Since: the start of that window (or the slice's first sight, if later). Dollars:
    its GPU-hours in the window at the mean price over it (price pieces where the bill or spot history knows it,
    its own price elsewhere), and its price now per day. One read of the MIG devices' usage per `for` serves every
    rule of that `for`."""
    hours = rule.for_hours or 0.0
    return snapshot.memo(("slice_underused", hours), lambda: _underused(snapshot, hours))


# mig_unpartitioned --------------------------------------------------------------------------------------------------


def _free_capacity(snapshot: Snapshot) -> list[Finding]:
    free = snapshot.free_capacity
    if not free:
        return []
    instances = list({f.view.gpu.instance.pk: f.view.gpu.instance for f in free}.values())
    pieces = snapshot.pieces(instances, min(f.since for f in free))
    where = places(snapshot, instances)
    out = []
    for f in free:
        gpu, n = f.view.gpu, f.view.free_slices or 0
        hours = hours_between(f.since, snapshot.now)
        rate, _sources = mean_price(gpu.instance, pieces.get(gpu.instance.pk, ()), f.since, snapshot.now)
        words = gpu_words(gpu)
        out.append(
            Finding(
                subject=f"mig-free:{gpu.uuid}",
                since=f.since,
                what=f"{n} of 7 compute slices of {words} in no slice for {span(hours)}",
                device_id=gpu.pk,
                device=words,
                usd_so_far=None if rate is None else rate * n / 7 * hours,
                usd_per_day=day_rate(f.view.free_usd_per_hour),
                extra={"free_slices": n, "hours": hours, "usd_per_hour": f.view.free_usd_per_hour},
                **where[gpu.instance.pk],
            )
        )
    return out


def mig_unpartitioned(snapshot: Snapshot, rule: Rule) -> list[Finding]:
    """Compute slices of a MIG GPU that reports now in no slice, since its layout last changed (the newest slice
    made or retired on it, its MIG mode turned on, or its first sight) at least `for` ago. A GPU whose layout is
    not known in full has no known free capacity, and is never found. Dollars: the free share of its price, mean
    over that time so far (offline hours included), and now per day."""
    return _held_for(snapshot, rule, snapshot.memo("mig_unpartitioned", lambda: _free_capacity(snapshot)))


# agent_offline ------------------------------------------------------------------------------------------------------


def _silent(snapshot: Snapshot) -> list[Finding]:
    silent = snapshot.silent
    if not silent:
        return []
    holders = snapshot.instance_holders(silent)
    prices = snapshot.prices(silent)
    pieces = snapshot.pieces(silent, min(i.last_seen for i in silent))
    where = places(snapshot, silent)
    out = []
    for inst in silent:
        hours = hours_between(inst.last_seen, snapshot.now)
        rate, _sources = mean_price(inst, pieces.get(inst.pk, ()), inst.last_seen, snapshot.now)
        gpus = inst.price.gpus
        out.append(
            Finding(
                subject=f"instance:{inst.instance_id}",
                since=inst.last_seen,
                what=f"agent silent for {span(hours)}, last data {inst.last_seen:%Y-%m-%d %H:%M} UTC",
                usd_so_far=None if rate is None or not gpus else rate * gpus * hours,
                usd_per_day=day_rate(prices[inst.pk].usd_per_instance_hour),
                holders=holders[inst.pk],
                extra={
                    "hours": hours,
                    "last_seen": inst.last_seen.isoformat(),
                    "gone_after_h": snapshot.thresholds.gone_after_h,
                    "agent_version": inst.agent_version,
                    "priced_as": "running: what the instance costs if it still runs",
                },
                **where[inst.pk],
            )
        )
    return out


def agent_offline(snapshot: Snapshot, rule: Rule) -> list[Finding]:
    """An instance whose agent has sent nothing for at least `for` (and GPUFLEET_OFFLINE_AFTER_S), while it is
    not taken as gone: silent for GPUFLEET_GONE_AFTER_H, or silent after a spot interruption notice. A `for` of
    GONE_AFTER_H or more never holds. Since: its last data. Dollars: what the whole instance costs if it still runs,
    over the silence so far and now per day. Holders: who held its GPUs as of its last data."""
    return _held_for(snapshot, rule, snapshot.memo("agent_offline", lambda: _silent(snapshot)))


# spot_interruption --------------------------------------------------------------------------------------------------


def _noticed(snapshot: Snapshot) -> list[Finding]:
    noticed = snapshot.noticed
    if not noticed:
        return []
    instances = [inst for inst, _notice in noticed]
    holders = snapshot.instance_holders(instances)
    prices = snapshot.prices(instances)
    where = places(snapshot, instances)
    out = []
    for inst, notice in noticed:
        action, at = notice.details.get("action"), notice.details.get("time")
        plan = f": {action} at {at}" if action and at else f": {action}" if action else ""
        out.append(
            Finding(
                subject=f"instance:{inst.instance_id}",
                since=notice.ts,
                what=f"spot interruption notice{plan}",
                usd_per_day=day_rate(prices[inst.pk].usd_per_instance_hour),
                holders=holders[inst.pk],
                extra={"notice_ts": notice.ts.isoformat(), **notice.details},
                **where[inst.pk],
            )
        )
    return out


def spot_interruption(snapshot: Snapshot, rule: Rule) -> list[Finding]:
    """A spot interruption notice the instance's agent reported in the last hour (snapshot.NOTICE_H), while the
    instance is not gone: it still reports, or has been silent for less than GPUFLEET_OFFLINE_AFTER_S (after that
    a noticed instance is taken as gone, and the incident closes). Since: the notice. Holders: who loses work;
    dollars: the instance's price now per day."""
    return snapshot.memo("spot_interruption", lambda: _noticed(snapshot))


# tag_waste ----------------------------------------------------------------------------------------------------------


def tag_waste(snapshot: Snapshot, rule: Rule) -> list[Finding]:
    """A value of the rule's tag whose instances in scope wasted (idle and idle-held cost, as the waste page grouped
    by that tag shows) more than `usd_per_day` a day over the last 24 h (whole hours covering it, scaled to 24 h).
    Instances without the tag count as one more value. Since: the start of those 24 h. One read of the day per
    instance serves every tag_waste rule, whatever its tag or scope."""
    key, limit = rule.tag_key, rule.usd_per_day
    if not key or limit is None:
        raise ValueError(f"rule {rule.name!r}: tag_waste needs a tag and usd_per_day")
    window = snapshot.day
    hours = window.hours
    out = []
    for value, acc in snapshot.tag_sums(key, rule.scope.filters()).items():
        per_day = acc.waste / hours * 24 if hours > 0 else 0.0
        if per_day <= limit:
            continue
        label = f"{key}={value}" if value is not None else f"(no {key} tag)"
        query = [("group_by", f"tag:{key}"), ("window", "24h")]
        if value is not None:
            query.append(("tag", f"{key}:{value}"))
        out.append(
            Finding(
                subject=f"tag:{key}={value}" if value is not None else f"tag:{key}",
                since=window.start,
                what=f"{label} wasted ${acc.waste:,.2f} in the last {span(hours)}: ${per_day:,.2f} a day, "
                f"over ${limit:,.2f}",
                usd_so_far=acc.waste,
                usd_per_day=per_day,
                tags={key: value} if value is not None else {},
                page="/waste?" + urlencode(query),
                extra={
                    "tag": key,
                    "value": value,
                    "hours": hours,
                    "threshold_usd_per_day": limit,
                    "idle_usd": acc.idle,
                    "idle_held_usd": acc.idle_held,
                    "gpu_hours": acc.gpu_hours,
                    "instances": acc.instances,
                },
            )
        )
    return out


CONDITIONS: dict[str, Callable[[Snapshot, Rule], list[Finding]]] = {
    "gpu_idle": gpu_idle,
    "slice_underused": slice_underused,
    "mig_unpartitioned": mig_unpartitioned,
    "agent_offline": agent_offline,
    "tag_waste": tag_waste,
    "spot_interruption": spot_interruption,
}
"""What each condition finds, before the rule's scope."""
