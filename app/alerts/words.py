"""How findings name what they are about: durations, GPUs and slices in words, and the instance fields of a finding
(app/alerts/findings.py)."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any
from urllib.parse import quote

from ..analyse.fleet import GpuInfo, InstanceInfo, SliceInfo
from .snapshot import Snapshot


def span(hours: float) -> str:
    """A duration in words: "40 min", "3.2 h", "4.5 d"."""
    if hours < 1:
        return f"{max(0.0, hours) * 60:.0f} min"
    return f"{hours:.1f} h" if hours < 48 else f"{hours / 24:.1f} d"


def gpu_words(gpu: GpuInfo) -> str:
    return f"GPU {gpu.gpu_index} ({gpu.name})"


def slice_words(sl: SliceInfo) -> str:
    return f"slice {sl.profile_label} (GI {sl.gpu_instance_id}) on {gpu_words(sl.gpu)}"


def instance_page(inst: InstanceInfo) -> str:
    return "/instances/" + quote(inst.instance_id, safe="")


def places(snapshot: Snapshot, instances: Collection[InstanceInfo]) -> dict[int, dict[str, Any]]:
    """Per instance (pk), the Finding fields that say where: one read of their Capacity Blocks."""
    unique = list({i.pk: i for i in instances}.values())
    blocks = snapshot.capacity_blocks(unique)
    return {
        inst.pk: {
            "instance_pk": inst.pk,
            "instance_id": inst.instance_id,
            "instance_name": inst.name,
            "tags": dict(inst.tags),
            "lifecycle": inst.lifecycle,
            "capacity_block": blocks[inst.pk],
            "page": instance_page(inst),
        }
        for inst in unique
    }


def hours_between(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds() / 3600


def day_rate(rate: float | None) -> float | None:
    return None if rate is None else rate * 24
