"""The server's own metrics: ingest batches, samples and latency, database errors.

Each app has a registry of its own (tests build many apps in one process). With several worker processes,
prometheus_client's multiprocess mode keeps every process's counters in files under
`PROMETHEUS_MULTIPROC_DIR` and a scrape, answered by any one worker, sums them; `gpufleet serve` sets that
folder up (docs/metrics.md, "Several workers").
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from sqlalchemy.exc import SQLAlchemyError
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import ApiError
from .access import RecentReaders

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

INGEST_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Upper bounds of the ingest latency histogram, s: a stored batch takes a few ms to tens of ms."""

ACCEPTED = ("stored", "duplicate")
REJECT_REASONS = {
    400: "malformed",
    401: "unauthorized",
    403: "forbidden",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid",
}
FAILED = "error"
"""Reason of a request that did not complete: a failure on the server's side (database down), or the client
went away before its body arrived."""
SHED = "shed"
"""Reason of a request refused with 503 because the ingest path was at one of its limits (docs/ingest-protocol.md,
"Limits and load shedding")."""
DB_ERROR_DURING = ("request", "scrape", "upkeep")


def multiprocess_dir() -> str | None:
    """The multiprocess folder prometheus_client uses in this process, if any."""
    return os.environ.get(MULTIPROC_ENV) or None


@dataclass
class IngestTally:
    """What one ingest request came to, filled in as it goes and counted when it ends."""

    samples: int | None = None
    """Samples in the batch, once its body parsed."""
    status: str | None = None
    """stored or duplicate, once accepted."""
    stored: int = 0
    """Samples stored."""
    reason: str | None = None
    """Why it was refused, where the status does not say (SHED)."""

    def accept(self, status: str, stored: int) -> None:
        self.status = status
        self.stored = stored


class _Chain:
    """Several collectors read in order, as one."""

    def __init__(self, collectors: Iterable[Collector]) -> None:
        self.collectors = list(collectors)

    def collect(self) -> Iterator[Metric]:
        for c in self.collectors:
            yield from c.collect()


class ServerMetrics:
    """The registry of one app and the instruments the ingest path, the upkeep loop and requests update."""

    def __init__(self, multiprocess_dir: str | None = None) -> None:
        # `*_created` series only double the number of series; nothing here reads them.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.multiprocess_dir = multiprocess_dir
        self.readers = RecentReaders()
        """Tokens /metrics let through lately (app/metrics/access.py)."""
        self.registry = CollectorRegistry()
        r = self.registry
        self.batches_accepted = Counter(
            "gpufleet_ingest_batches_accepted",
            "Ingest batches acknowledged, by status: stored, or duplicate (stored before, acknowledged again).",
            ["status"],
            registry=r,
        )
        self.batches_rejected = Counter(
            "gpufleet_ingest_batches_rejected",
            "Ingest requests refused, by reason: malformed, unauthorized, forbidden, too_large, "
            "unsupported_media_type, invalid (schema or checks), shed (at a load limit: 503), error (failed on the "
            "server's side, or the client went away).",
            ["reason"],
            registry=r,
        )
        self.samples_accepted = Counter(
            "gpufleet_ingest_samples_accepted", "Samples stored by the ingest path.", registry=r
        )
        self.samples_rejected = Counter(
            "gpufleet_ingest_samples_rejected",
            "Samples in refused batches whose body parsed (a body that did not parse counts no samples).",
            registry=r,
        )
        self.ingest_latency = Histogram(
            "gpufleet_ingest_duration_seconds",
            "Time to answer one ingest request, from its arrival (body upload included) to the answer, s.",
            buckets=INGEST_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.database_errors = Counter(
            "gpufleet_database_errors",
            "Database errors, by when they happened: request (any HTTP request, ingest included), scrape "
            "(reading the fleet for /metrics), upkeep (partition maintenance).",
            ["during"],
            registry=r,
        )
        # Every label value from the start: a series that appears only on its first event hides the rate.
        for status in ACCEPTED:
            self.batches_accepted.labels(status)
        for reason in [*REJECT_REASONS.values(), SHED, FAILED]:
            self.batches_rejected.labels(reason)
        for during in DB_ERROR_DURING:
            self.database_errors.labels(during)

    @contextmanager
    def observe_ingest(self) -> Iterator[IngestTally]:
        """Count one ingest request by how it ends: accepted (the tally says how) or with an exception."""
        started = time.perf_counter()
        tally = IngestTally()
        try:
            yield tally
        except ApiError as exc:
            self._rejected(tally.reason or REJECT_REASONS.get(exc.status_code, FAILED), tally)
            raise
        except BaseException:
            self._rejected(FAILED, tally)
            raise
        else:
            if tally.status is not None:
                self.batches_accepted.labels(tally.status).inc()
                self.samples_accepted.inc(tally.stored)
        finally:
            self.ingest_latency.observe(time.perf_counter() - started)

    def _rejected(self, reason: str, tally: IngestTally) -> None:
        self.batches_rejected.labels(reason).inc()
        if tally.samples:
            self.samples_rejected.inc(tally.samples)

    def database_error(self, during: str) -> None:
        assert during in DB_ERROR_DURING, during
        self.database_errors.labels(during).inc()

    def own_collectors(self) -> list[Collector]:
        """This process's metrics, or every worker's in multiprocess mode. Process, platform and GC metrics
        describe one process, so they are left out there: a scrape reaches an arbitrary worker."""
        if self.multiprocess_dir is not None:
            merged = CollectorRegistry()
            MultiProcessCollector(merged, path=self.multiprocess_dir)  # type: ignore[no-untyped-call]
            return [merged]
        return [self.registry, PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR]

    def exposition(self, *first: Collector) -> bytes:
        """The Prometheus text format of `first` then the server's own metrics. `first` is read before the
        counters, so a database error it counts is in the same answer."""
        return generate_latest(_Chain([*first, *self.own_collectors()]))


class CountDatabaseErrors:
    """ASGI middleware: a request that fails with a database error adds to the counter, then fails as before."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        except SQLAlchemyError:
            self.metrics.database_error("request")
            raise
