"""Engine behaviour the write path depends on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from app.db import make_engine, make_sessionmaker
from app.store.samples import write_samples


def _row(device_id: int, ts: datetime) -> tuple[object, ...]:
    return (ts, device_id, 10.0, 100, 5.0, None, 200, 40, 1, 1, None, None, None, None)


def test_a_rolled_back_first_batch_does_not_break_the_connection(database_url: str, engine: object) -> None:
    """The staging table is made inside the first transaction on a connection; if that transaction rolls
    back, the next one on the same connection must make it again."""
    own = make_engine(database_url, pool_size=1)
    try:
        sessions = make_sessionmaker(own)
        ts = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
        with sessions() as s:
            write_samples(s, [_row(900001, ts)], mem_held_mib=256)
            s.rollback()
        with sessions() as s:
            write_samples(s, [_row(900001, ts)], mem_held_mib=256)
            s.commit()
        with own.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM samples WHERE device_id = 900001")).scalar_one() == 1
    finally:
        own.dispose()


def test_sessions_speak_utc_without_jit(database_url: str) -> None:
    engine = make_engine(database_url, pool_size=1)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SHOW TimeZone")).scalar_one() == "UTC"
            assert conn.execute(text("SHOW jit")).scalar_one() == "off"
    finally:
        engine.dispose()
