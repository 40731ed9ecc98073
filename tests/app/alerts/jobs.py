"""Running an alert job beside the same job on a database that is not there: the job must do its work, and the
other must log the outage once and go on (it never dies)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import Engine

from app.db import make_engine
from tests.app.alerts.receivers import free_port

Job = Callable[[Engine], "asyncio.Task[None]"]


@contextmanager
def dead_database() -> Iterator[Engine]:
    """An engine on a port nothing listens on."""
    down = make_engine(f"postgresql://postgres@127.0.0.1:{free_port()}/gone", pool_size=1)
    try:
        yield down
    finally:
        down.dispose()


def run_beside_outage(
    job: Job, engine: Engine, until: Callable[[], bool], caplog: pytest.LogCaptureFixture, *, timeout_s: float = 15
) -> None:
    """`job` on `engine` and on a dead database at once, until `until()` holds (or `timeout_s`), then half a second
    more of rounds of both; neither may have ended by itself. Log records of gpufleet.alerts land in `caplog`."""

    async def run(down: Engine) -> None:
        jobs = [job(engine), job(down)]
        deadline = time.monotonic() + timeout_s
        while not until() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # several more rounds of both
        assert not any(j.done() for j in jobs)
        for j in jobs:
            j.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)

    with dead_database() as down, caplog.at_level(logging.INFO, logger="gpufleet.alerts"):
        asyncio.run(run(down))
