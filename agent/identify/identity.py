"""Who this host is (an EC2 instance via IMDSv2, or the agent's settings) and EC2 spot / rebalance notices."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import quote

from ..config import AgentConfig, host_id_from_name
from .imds import ImdsClient, ImdsUnavailable
from .signed import read_signed_identity

log = logging.getLogger("gpufleet.agent.identify")

AUTO_RETRY_S = 600.0
"""imds=auto: after IMDS failed to answer, seconds before it is tried again."""
TAGS_REFRESH_S = 600.0
"""Seconds between re-reads of the EC2 tags (they can change while the instance runs)."""
EVENTS_INTERVAL_S = 5.0
"""Least seconds between two reads of the spot / rebalance notices (AWS suggests polling every 5 s)."""

# Signs, readable without privileges, that this machine is an EC2 instance (Xen and Nitro families).
EC2_HINTS: tuple[tuple[str, str], ...] = (
    ("/sys/devices/virtual/dmi/id/sys_vendor", "amazon ec2"),
    ("/sys/devices/virtual/dmi/id/board_asset_tag", "i-"),
    ("/sys/hypervisor/uuid", "ec2"),
)

# The server's InstanceIn limits; a batch beyond them would be rejected whole.
MAX_TAGS = 64
MAX_TAG_KEY_CHARS = 128
MAX_TAG_VALUE_CHARS = 256
_MAX_DETAIL_CHARS = 500
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Identity:
    """This host as the server sees it. `price_usd_per_hour` is in US dollars per hour."""

    instance_id: str
    hostname: str | None = None
    instance_type: str | None = None
    region: str | None = None
    availability_zone: str | None = None
    lifecycle: str | None = None
    """"spot", "on-demand", "on-prem", or None when unknown."""
    ami_id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    price_usd_per_hour: float | None = None
    source: str = "config"
    """"imds" or "config"."""

    def to_wire(self) -> dict[str, object]:
        """The ingest batch's `instance` object: None values left out, `tags` always present."""
        wire: dict[str, object] = {"instance_id": self.instance_id}
        optional: dict[str, object | None] = {
            "hostname": self.hostname,
            "instance_type": self.instance_type,
            "region": self.region,
            "availability_zone": self.availability_zone,
            "lifecycle": self.lifecycle,
            "ami_id": self.ami_id,
        }
        wire.update({key: value for key, value in optional.items() if value is not None})
        wire["tags"] = dict(self.tags)
        if self.price_usd_per_hour is not None:
            wire["price_usd_per_hour"] = self.price_usd_per_hour
        return wire


class IdentityUnavailable(Exception):
    """imds=on and IMDS cannot answer; the message is one readable line. The caller retries later."""


@dataclass(frozen=True)
class _Ec2Static:
    """The IMDS fields that never change while an instance runs."""

    instance_id: str
    instance_type: str | None
    region: str | None
    availability_zone: str | None
    lifecycle: str | None
    ami_id: str | None


class IdentityResolver:
    """Resolves and caches the host identity according to `config.imds` ("auto", "on" or "off").

    `clock` is monotonic seconds (caching, rate limits, token lifetime); `wall_clock` stamps events.
    Safe to share between threads.
    """

    def __init__(
        self,
        config: AgentConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._config = config
        self._clock = clock
        self._wall_clock = wall_clock
        self._client = (
            None if config.imds == "off" else ImdsClient(config.imds_url, timeout_s=config.imds_timeout_s, clock=clock)
        )
        self._lock = threading.Lock()
        self._config_identity: Identity | None = None
        self._static: _Ec2Static | None = None
        self._imds_tags: dict[str, str] = {}
        self._ec2_identity: Identity | None = None
        self._tags_read_at = 0.0
        self._next_try_at: float | None = None
        self._last_error: str | None = None
        self._events_read_at: float | None = None
        self._seen_notices: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        self._signed: str | None = None
        self._signed_next_try: float | None = None

    def identity(self) -> Identity:
        """The current identity. Blocks at most about two IMDS timeouts; raises IdentityUnavailable (imds=on)."""
        with self._lock:
            return self._resolve()

    def poll_events(self) -> list[dict[str, object]]:
        """New spot-interruption / rebalance notices as wire events, each returned once. Never raises.

        Only on EC2, i.e. once `identity()` has been answered by IMDS; reads at most every 5 s and returns []
        in between.
        """
        with self._lock:
            if self._client is None or self._static is None:
                return []
            now = self._clock()
            if self._events_read_at is not None and now - self._events_read_at < EVENTS_INTERVAL_S:
                return []
            self._events_read_at = now
            events: list[dict[str, object]] = []
            for kind, path in (
                ("spot_interruption", "spot/instance-action"),
                ("rebalance_recommendation", "events/recommendations/rebalance"),
            ):
                try:
                    body = self._client.get(path)
                except ImdsUnavailable as exc:
                    log.debug("could not read %s: %s", path, exc)
                    continue
                if body is None or not body.strip():
                    continue
                details = _notice_details(kind, body)
                key = (kind, tuple(sorted(details.items())))
                if key in self._seen_notices:
                    continue
                self._seen_notices.add(key)
                log.warning("EC2 %s notice: %s", kind.replace("_", " "), details)
                events.append({"ts": self._timestamp(), "kind": kind, "details": dict(details)})
            return events

    def signed_identity(self) -> str | None:
        """The `X-Gpufleet-Instance-Identity` value for batches (agent.identify.signed), or None off EC2 and while
        IMDS gives no signed document. Read once and kept: the document does not change while the instance runs.
        A failed read is tried again after AUTO_RETRY_S seconds. Never raises."""
        with self._lock:
            if self._client is None or self._static is None or self._signed is not None:
                return self._signed
            now = self._clock()
            if self._signed_next_try is not None and now < self._signed_next_try:
                return None
            try:
                self._signed = read_signed_identity(self._client)
            except ImdsUnavailable as exc:
                log.debug("could not read the signed instance identity: %s", exc)
            if self._signed is None:
                self._signed_next_try = now + AUTO_RETRY_S
            return self._signed

    def describe(self) -> str:
        """One line for `gpufleet-agent doctor`: what IMDS said, or why the settings are used instead."""
        if self._client is None:
            ident = self.identity()
            host = ident.hostname or ident.instance_id
            named = f"host {host}" if ident.instance_id == host else f"host {host}, id {ident.instance_id}"
            return f"IMDS: off; {named} (on-prem)"
        try:
            ident = self.identity()
        except IdentityUnavailable as exc:
            if self._config.imds == "on":
                return f"IMDS: {_reason(self._last_error)}; required by GPUFLEET_AGENT_IMDS=on"
            return f"IMDS: {exc}"
        if ident.source == "imds":
            parts = [ident.instance_id, ident.instance_type, ident.availability_zone or ident.region, ident.lifecycle]
            count = len(ident.tags)
            return "IMDS: " + " ".join(p for p in parts if p) + f", {count} tag{'' if count == 1 else 's'}"
        what = "host id" if self._config.host_id else "host name"
        return f"IMDS: {_reason(self._last_error)}; using {what} {ident.instance_id}"

    def _resolve(self) -> Identity:
        if self._client is None:
            return self._from_config()
        now = self._clock()
        if self._static is None:
            if self._config.imds != "on" and self._next_try_at is not None and now < self._next_try_at:
                return self._from_config()
            try:
                self._static = self._read_static(self._client)
            except ImdsUnavailable as exc:
                return self._imds_failed(exc)
            if self._last_error is not None:
                log.info("IMDS answered at %s after all", self._client.base_url)
            self._last_error = None
            self._refresh_tags(self._client, now)
            log.info("identified as EC2 instance %s", self._static.instance_id)
        elif now - self._tags_read_at >= TAGS_REFRESH_S:
            self._refresh_tags(self._client, now)
        if self._ec2_identity is None:
            self._ec2_identity = self._from_ec2(self._static)
        return self._ec2_identity

    def _imds_failed(self, exc: ImdsUnavailable) -> Identity:
        first = self._last_error is None
        self._last_error = str(exc)
        if self._config.imds == "on":
            log.debug("IMDS is required and did not answer: %s", exc)
            raise IdentityUnavailable(f"{exc}; IMDS is required (GPUFLEET_AGENT_IMDS=on)") from None
        hint = looks_like_ec2()
        if hint is not None:
            # Reporting under the host name now and the instance id later would split one instance in two.
            raise IdentityUnavailable(
                f"{exc}; {hint} says this is an EC2 instance, so the agent waits for IMDS "
                "(GPUFLEET_AGENT_IMDS=off uses the host name instead)"
            ) from None
        # Measured after the attempt, which may itself have waited for a timeout.
        self._next_try_at = self._clock() + AUTO_RETRY_S
        fallback = self._from_config()
        log.log(
            logging.INFO if first else logging.DEBUG,
            "%s; identifying as %s from the settings, next try in %d min",
            exc,
            fallback.instance_id,
            AUTO_RETRY_S // 60,
        )
        return fallback

    def _read_static(self, client: ImdsClient) -> _Ec2Static:
        instance_id = _text(client.get("instance-id"))
        if instance_id is None:
            raise ImdsUnavailable(f"IMDS at {client.base_url} has no instance-id")
        availability_zone = _text(client.get("placement/availability-zone"))
        region = _text(client.get("placement/region")) or _region_from_document(client)
        cycle = _text(client.get("instance-life-cycle"))
        return _Ec2Static(
            instance_id=instance_id,
            instance_type=_text(client.get("instance-type")),
            region=region,
            availability_zone=availability_zone,
            # "scheduled" instances, and whatever AWS adds later, are billed like on-demand ones.
            lifecycle=None if cycle is None else ("spot" if cycle.lower() == "spot" else "on-demand"),
            ami_id=_text(client.get("ami-id")),
        )

    def _refresh_tags(self, client: ImdsClient, now: float) -> None:
        """Re-read the instance tags; on failure keep the previous ones until the next refresh."""
        self._tags_read_at = now
        try:
            listing = client.get("tags/instance")
            tags: dict[str, str] = {}
            # None: instance metadata tags are not enabled, which is the EC2 default.
            for key in (listing or "").splitlines():
                key = key.strip()
                if key:
                    value = client.get("tags/instance/" + quote(key, safe=""))
                    if value is not None:
                        tags[key] = value
        except ImdsUnavailable as exc:
            log.warning("could not read the EC2 tags (%s); keeping %d known ones", exc, len(self._imds_tags))
            return
        if tags != self._imds_tags:
            self._imds_tags = tags
            self._ec2_identity = None

    def _from_ec2(self, static: _Ec2Static) -> Identity:
        config = self._config
        return Identity(
            instance_id=static.instance_id,
            hostname=config.host_name() or None,
            instance_type=static.instance_type or config.instance_type,
            region=static.region or config.region,
            availability_zone=static.availability_zone,
            lifecycle=static.lifecycle,
            ami_id=static.ami_id,
            tags=_wire_tags(self._imds_tags, config.tags),
            price_usd_per_hour=config.price_usd_per_hour,
            source="imds",
        )

    def _from_config(self) -> Identity:
        if self._config_identity is None:
            config = self._config
            host = config.host_name().strip() or None
            self._config_identity = Identity(
                instance_id=config.host_id or host_id_from_name(host or "") or "unknown-host",
                hostname=host,
                instance_type=config.instance_type,
                region=config.region,
                availability_zone=None,
                lifecycle="on-prem",
                ami_id=None,
                tags=_wire_tags({}, config.tags),
                price_usd_per_hour=config.price_usd_per_hour,
                source="config",
            )
        return self._config_identity

    def _timestamp(self) -> str:
        seen = self._wall_clock()
        if seen.tzinfo is None:
            seen = seen.replace(tzinfo=UTC)
        return seen.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _text(value: str | None) -> str | None:
    if value is None:
        return None
    return value.strip() or None


def _region_from_document(client: ImdsClient) -> str | None:
    """Older IMDS versions lack placement/region; the identity document always has it."""
    try:
        document = json.loads(client.get_dynamic("instance-identity/document") or "null")
    except ValueError:
        return None
    region = document.get("region") if isinstance(document, dict) else None
    if not isinstance(region, str):
        return None
    return region.strip() or None


def _wire_tags(imds_tags: Mapping[str, str], config_tags: Mapping[str, str]) -> dict[str, str]:
    """IMDS tags over the configured ones, trimmed to what the server accepts (IMDS tags kept first)."""
    merged = dict(imds_tags)
    merged.update({key: value for key, value in config_tags.items() if key not in imds_tags})
    tags: dict[str, str] = {}
    for key, value in merged.items():
        if not key or len(key) > MAX_TAG_KEY_CHARS:
            log.warning("tag %r skipped: keys must be 1 to %d characters", key[:40], MAX_TAG_KEY_CHARS)
            continue
        if _CONTROL.search(key) or _CONTROL.search(value):
            # The server refuses control characters in tags, and would refuse the whole batch for one.
            log.warning("tag %r skipped: keys and values must not contain control characters", key[:40])
            continue
        if len(tags) == MAX_TAGS:
            log.warning("only the first %d of %d tags are sent", MAX_TAGS, len(merged))
            break
        tags[key] = value[:MAX_TAG_VALUE_CHARS]
    return tags


def _notice_details(kind: str, body: str) -> dict[str, str]:
    try:
        notice = json.loads(body)
    except ValueError:
        notice = None
    if not isinstance(notice, dict):
        # Unexpected shape, but a notice all the same: pass it on rather than lose an interruption.
        return {"raw": " ".join(body.split())[:_MAX_DETAIL_CHARS]}
    names = {"action": "action", "time": "time"} if kind == "spot_interruption" else {"noticeTime": "notice_time"}
    details = {wire: str(notice[imds])[:_MAX_DETAIL_CHARS] for imds, wire in names.items() if imds in notice}
    return details or {"raw": " ".join(body.split())[:_MAX_DETAIL_CHARS]}


def _reason(error: str | None) -> str:
    """An ImdsUnavailable message without its leading "IMDS ", to follow "IMDS: "."""
    if not error:
        return "no answer yet"
    return error.removeprefix("IMDS ").removeprefix("at ")


def looks_like_ec2(hints: tuple[tuple[str, str], ...] | None = None) -> str | None:
    """The first file whose content marks this machine as an EC2 instance, or None."""
    for path, prefix in EC2_HINTS if hints is None else hints:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                if f.read(64).strip().lower().startswith(prefix):
                    return path
        except OSError:
            continue
    return None
