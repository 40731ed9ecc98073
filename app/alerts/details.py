"""What an incident keeps of the finding it is about (`alert_incidents.details`), and the finding read back from
it: enough to write its later messages, and the /alerts and snooze pages, when the finding itself is gone."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import orjson

from .findings import Finding

FIGURES = ("what", "usd_so_far", "usd_per_day", "holders", "extra")
"""What of an incident's details follows its finding; the rest (names, tags, lifecycle, page) is kept from when it
opened."""


def details_of(finding: Finding) -> dict[str, Any]:
    """What an incident keeps of its finding (`alert_incidents.details`), as JSON: enough to write its later
    messages when the finding is gone."""
    out = {
        "what": finding.what,
        "instance_id": finding.instance_id,
        "instance_name": finding.instance_name,
        "device": finding.device,
        "usd_so_far": finding.usd_so_far,
        "usd_per_day": finding.usd_per_day,
        "holders": list(finding.holders),
        "tags": dict(finding.tags),
        "lifecycle": finding.lifecycle,
        "capacity_block": finding.capacity_block,
        "page": finding.page,
        "extra": finding.extra,
    }
    # The condition's figures may hold dates or numbers of any kind: JSON takes their text.
    loaded: dict[str, Any] = orjson.loads(orjson.dumps(out, default=str, option=orjson.OPT_NON_STR_KEYS))
    return loaded


def finding_of(
    subject: str, since: datetime, instance_pk: int | None, device_id: int | None, details: Mapping[str, Any]
) -> Finding:
    """The finding an incident was last evaluated on, from its row."""
    return Finding(
        subject=subject,
        since=since,
        what=str(details.get("what") or subject),
        instance_pk=instance_pk,
        instance_id=details.get("instance_id"),
        instance_name=details.get("instance_name"),
        device_id=device_id,
        device=details.get("device"),
        usd_so_far=details.get("usd_so_far"),
        usd_per_day=details.get("usd_per_day"),
        holders=tuple(details.get("holders") or ()),
        tags=dict(details.get("tags") or {}),
        lifecycle=details.get("lifecycle"),
        capacity_block=bool(details.get("capacity_block")),
        page=str(details.get("page") or "/"),
        extra=dict(details.get("extra") or {}),
    )
