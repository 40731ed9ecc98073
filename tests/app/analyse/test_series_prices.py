"""The price pieces a process keeps (app/analyse/series_prices.py `load_pieces`): read again after any change to
the bill's prices or the spot price history, whoever makes it, and reused until then."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import delete, insert, text, update
from sqlalchemy.orm import Session, sessionmaker

from app.analyse.series_prices import PiecesMemo, load_pieces
from app.analyse.window import Window
from app.billing.prices import remake_billed_prices
from app.billing.tables import PRICE_PIECES_VERSION_SQL, spot_price_reads, spot_prices
from app.db import session_scope
from tests.app.analyse.conftest import Analyst, Feeder, idle
from tests.app.analyse.test_priced import bill
from tests.factories import gpu

H = timedelta(hours=1)
POOL = {"instance_type": "g5.xlarge", "availability_zone": "us-east-1b"}


def test_pieces_are_kept_until_their_sources_change(
    feeder: Feeder, sessions: sessionmaker[Session], analyst: Analyst
) -> None:
    t0 = feeder.t0
    feeder.feed(
        [gpu(0, name="NVIDIA A10G")],
        start=t0,
        hours=3,
        fn=idle,
        instance_id="i-0e00000000000000e",
        instance_type="g5.xlarge",
        lifecycle="spot",
        availability_zone="us-east-1b",
    )
    with session_scope(sessions) as s:
        s.execute(insert(spot_prices).values(**POOL, ts=t0 - 24 * H, usd_per_hour=0.40))
    memo = PiecesMemo()
    window = Window(t0, t0 + 3 * H, t0 + 3 * H, "test")

    def read() -> list[float]:
        with session_scope(sessions) as s:
            pieces = load_pieces(s, analyst.fleet(s, window), window.start, window.end, memo=memo)
            return [p.usd_per_hour for ps in pieces.values() for p in ps]

    def version() -> int:
        with session_scope(sessions) as s:
            return int(s.execute(text(PRICE_PIECES_VERSION_SQL)).scalar_one())

    assert read() == [0.40]
    # Kept: the same read again returns the kept pieces, even when they are changed by the caller.
    with session_scope(sessions) as s:
        kept = load_pieces(s, analyst.fleet(s, window), window.start, window.end, memo=memo)
        next(iter(kept.values())).clear()
    assert read() == [0.40]

    before = version()
    with session_scope(sessions) as s:
        s.execute(update(spot_prices).values(usd_per_hour=0.45))
    assert version() != before and read() == [0.45]

    before = version()
    with session_scope(sessions) as s:  # the bill covers the first hour: billed first
        bill(s, "i-0e00000000000000e", "g5.xlarge", {t0: 0.5}, None)
        remake_billed_prices(s)
    assert version() != before and set(read()) == {0.45, 0.5}

    before = version()
    with session_scope(sessions) as s:
        s.execute(insert(spot_price_reads).values(**POOL, read_until=t0 + H))
    assert version() != before

    before = version()
    with session_scope(sessions) as s:
        s.execute(delete(spot_prices))
        s.execute(text("TRUNCATE billed_prices"))
    assert version() != before and read() == []
