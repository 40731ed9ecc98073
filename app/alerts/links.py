"""The links in alert messages: to a dashboard page, and the signed snooze link of an incident (docs/alerts.md,
"Snooze"). They start with GPUFLEET_PUBLIC_URL, the dashboard's address as recipients reach it; unset, with the
address `gpufleet serve` binds, which only suits a server reached at that address (a laptop, a demo)."""

from __future__ import annotations

import socket
from datetime import datetime
from functools import lru_cache
from ipaddress import ip_address

from ..settings import Settings
from .snooze import LINK_TTL, sign

SNOOZE_PATH = "/alerts/snooze/"
WILDCARDS = ("", "0.0.0.0", "::")


@lru_cache(maxsize=1)
def _machine_name() -> str:
    # A name lookup per message would cost a DNS round trip each: the machine's name does not change while it runs.
    return socket.getfqdn()


def base_url(settings: Settings) -> str:
    """`https://gpufleet.example.com` (no trailing slash): GPUFLEET_PUBLIC_URL, else `http://<host>:<port>` of
    `serve`. A wildcard address (0.0.0.0, ::) is no place to send a browser to: the machine's name stands in."""
    if settings.public_url:
        return settings.public_url.rstrip("/")
    host = settings.host.strip().strip("[]")
    if host in WILDCARDS:
        host = _machine_name()
    try:
        if ip_address(host).version == 6:
            host = f"[{host}]"
    except ValueError:
        pass  # a name
    return f"http://{host}:{settings.port}"


def page_url(settings: Settings, path: str) -> str:
    """The absolute URL of a dashboard path such as `/instances/i-0abc` or `/waste?group_by=tag:team`."""
    if not path.startswith("/") or path.startswith("//"):
        raise ValueError(f"not a path on the dashboard: {path!r}")
    return base_url(settings) + path


def snooze_url(settings: Settings, key: bytes, incident_id: int, *, now: datetime) -> str:
    """The link that snoozes `incident_id`, signed with `key` (app.alerts.snooze.signing_key) and working for
    LINK_TTL (7 days) from `now`, the time of the message that carries it."""
    return page_url(settings, SNOOZE_PATH + sign(key, incident_id, now=now, ttl=LINK_TTL))
