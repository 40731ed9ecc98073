"""EC2 DescribeSpotPriceHistory answered from a history the test seeds, by the local moto server
(tests/aws_server.py) and through the real boto3 client.

moto's own answer is one fixed price per offering, so `spot_history` (a pytest fixture) replaces moto's handler of
that action for the test: it answers from `SpotHistory.add`'s prices with EC2's rules (EC2 API reference,
DescribeSpotPriceHistory): InstanceTypes, ProductDescriptions, AvailabilityZone and the `availability-zone`,
`instance-type` and `product-description` filters narrow the answer; StartTime/EndTime give the changes inside the
range plus, per pool, the last change before StartTime (the price in force at the start); MaxResults (1 to 1000,
default 1000) and NextToken page it. A regional endpoint knows only its own region's zones. Newest first.

`fail_next` makes the next calls fail (throttling, HTTP 500, UnauthorizedOperation); `calls` records what each
call asked, for assertions.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from typing import Any, Literal

import pytest
from moto.core.responses import ActionResult
from moto.ec2.exceptions import EC2ClientError
from moto.ec2.responses.spot_instances import SpotInstances

from tests.aws_server import AwsServer

Fault = Literal["throttle", "server-error", "unauthorized"]
FILTERS = {"availability-zone": "availability_zone", "instance-type": "instance_type", "product-description": "product"}
MAX_RESULTS = 1000


@dataclass(frozen=True)
class SpotPriceEntry:
    instance_type: str
    availability_zone: str
    ts: datetime
    usd_per_hour: float
    product: str = "Linux/UNIX"


@dataclass(frozen=True)
class SpotCall:
    """What one DescribeSpotPriceHistory call asked, and how it was answered: `answered` entries, or `fault`."""

    region: str
    instance_types: tuple[str, ...]
    products: tuple[str, ...]
    availability_zone: str | None
    filters: dict[str, tuple[str, ...]]
    start: datetime | None
    end: datetime | None
    max_results: int | None
    next_token: str | None
    answered: int = 0
    fault: Fault | None = None


def _aware(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime), value
    # moto hands the request's timestamps over without a zone; the wire format is UTC.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _wire_time(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _server_error() -> tuple[str, dict[str, Any]]:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>InternalError</Code>'
        "<Message>The service had an internal error (injected by the test).</Message></Error></Errors>"
        "<RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>"
    )
    return body, {"status": 500, "Content-Type": "text/xml"}


class SpotHistory:
    """The seeded history and the faults to come; the moto server's thread reads it, the test writes it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: list[SpotPriceEntry] = []
        self._faults: deque[Fault] = deque()
        self.calls: list[SpotCall] = []

    def add(
        self, instance_type: str, zone: str, ts: datetime, usd_per_hour: float, product: str = "Linux/UNIX"
    ) -> None:
        """A price change: from `ts` on, the pool's price is `usd_per_hour` USD/h."""
        assert ts.tzinfo is not None
        with self._lock:
            self._entries.append(SpotPriceEntry(instance_type, zone, ts.astimezone(UTC), usd_per_hour, product))

    def seed(self, entries: Iterable[tuple[str, str, datetime, float]]) -> None:
        for instance_type, zone, ts, usd in entries:
            self.add(instance_type, zone, ts, usd)

    def fail_next(self, n: int, fault: Fault) -> None:
        """The next `n` calls (HTTP requests: the SDK's retries count) fail with `fault`."""
        with self._lock:
            self._faults.extend([fault] * n)

    @property
    def faults_left(self) -> int:
        with self._lock:
            return len(self._faults)

    def _select(self, call: SpotCall) -> list[SpotPriceEntry]:
        def wanted(e: SpotPriceEntry) -> bool:
            if not e.availability_zone.startswith(call.region):
                return False
            if call.instance_types and e.instance_type not in call.instance_types:
                return False
            if call.products and e.product not in call.products:
                return False
            if call.availability_zone and e.availability_zone != call.availability_zone:
                return False
            for name, values in call.filters.items():
                value = getattr(e, FILTERS[name])
                if not any(fnmatchcase(value, pattern) for pattern in values):
                    return False
            return call.end is None or e.ts <= call.end

        candidates = [e for e in self._entries if wanted(e)]
        if call.start is None:
            return candidates
        inside = [e for e in candidates if e.ts >= call.start]
        before: dict[tuple[str, str, str], SpotPriceEntry] = {}
        for e in candidates:
            key = (e.instance_type, e.availability_zone, e.product)
            if e.ts < call.start and (key not in before or e.ts > before[key].ts):
                before[key] = e
        return inside + list(before.values())

    def answer(self, handler: SpotInstances) -> ActionResult | tuple[str, dict[str, Any]]:
        """moto's handler for the action: `handler` is the request's response object."""
        filters = handler._filters_from_querystring()
        for name in filters:
            if name not in FILTERS:
                raise EC2ClientError("InvalidParameterValue", f"The filter '{name}' is invalid")
        max_results = handler._get_param("MaxResults")
        if max_results is not None and not 1 <= int(max_results) <= MAX_RESULTS:
            raise EC2ClientError("InvalidParameterValue", f"MaxResults must be 1 to {MAX_RESULTS}: {max_results}")
        call = SpotCall(
            region=handler.region,
            instance_types=tuple(handler._get_param("InstanceTypes", []) or []),
            products=tuple(handler._get_param("ProductDescriptions", []) or []),
            availability_zone=handler._get_param("AvailabilityZone"),
            filters={name: tuple(values) for name, values in filters.items()},
            start=_aware(handler._get_param("StartTime")),
            end=_aware(handler._get_param("EndTime")),
            max_results=None if max_results is None else int(max_results),
            next_token=handler._get_param("NextToken") or None,
        )
        with self._lock:
            fault = self._faults.popleft() if self._faults else None
            if fault is not None:
                self.calls.append(SpotCall(**{**call.__dict__, "fault": fault}))
            else:
                entries = sorted(self._select(call), key=lambda e: e.ts, reverse=True)
        if fault == "throttle":
            raise EC2ClientError("RequestLimitExceeded", "Request limit exceeded (injected by the test).")
        if fault == "unauthorized":
            raise EC2ClientError(
                "UnauthorizedOperation", "You are not authorized to perform this operation (injected by the test)."
            )
        if fault == "server-error":
            return _server_error()
        offset = 0
        if call.next_token is not None:
            if not call.next_token.isdigit():
                raise EC2ClientError("InvalidNextToken", "The token is not valid")
            offset = int(call.next_token)
        size = call.max_results or MAX_RESULTS
        page = entries[offset : offset + size]
        more = offset + size < len(entries)
        with self._lock:
            self.calls.append(SpotCall(**{**call.__dict__, "answered": len(page)}))
        history = [
            {
                "AvailabilityZone": e.availability_zone,
                "InstanceType": e.instance_type,
                "ProductDescription": e.product,
                "SpotPrice": f"{e.usd_per_hour:.6f}",
                "Timestamp": _wire_time(e.ts),
            }
            for e in page
        ]
        return ActionResult({"SpotPriceHistory": history, "NextToken": str(offset + size) if more else ""})


@pytest.fixture
def spot_history(aws: AwsServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[SpotHistory]:
    """The local AWS server, answering DescribeSpotPriceHistory from a history the test seeds."""
    history = SpotHistory()

    def describe_spot_price_history(self: SpotInstances) -> ActionResult | tuple[str, dict[str, Any]]:
        return history.answer(self)

    monkeypatch.setattr(SpotInstances, "describe_spot_price_history", describe_spot_price_history)
    yield history
