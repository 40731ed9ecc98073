"""Price pieces: billed hours merged into stretches, spot history where the bill does not reach, and capacity paid
while the instance was not billed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from app.billing.prices import BILLED, SPOT_HISTORY, PricedInstance, PricePiece, price_pieces, remake_billed_prices
from app.billing.tables import billed_hours, billed_prices, spot_price_reads, spot_prices

T0 = datetime(2026, 11, 2, tzinfo=UTC)
H = timedelta(hours=1)
SPOT = PricedInstance(1, "i-0spot", "spot", "g5.xlarge", "us-east-1b")
BLOCK = PricedInstance(2, "i-0block", "on-demand", "p5.48xlarge", "us-east-1a")


def bill(session: Session, instance_id: str, hours: dict[int, float], kind: str | None = None) -> None:
    session.execute(
        insert(billed_hours),
        [
            {
                "instance_id": instance_id,
                "hour": T0 + h * H,
                "payer_account": "123456789012",
                "billing_period": T0.date().replace(day=1),
                "instance_type": "g5.xlarge",
                "purchase": "spot" if kind is None else "capacity block",
                "usage_h": 1.0,
                "usd": usd,
                "reservation_kind": kind,
            }
            for h, usd in hours.items()
        ],
    )


def test_consecutive_hours_at_one_price_are_one_stretch(session: Session) -> None:
    bill(session, "i-0spot", {0: 0.4, 1: 0.4, 2: 0.5, 4: 0.5})
    remake_billed_prices(session)
    rows = session.execute(select(billed_prices.c.starts, billed_prices.c.ends, billed_prices.c.usd_per_hour)).all()
    assert sorted((r.starts - T0) / H for r in rows) == [0, 2, 4]
    assert {((r.ends - r.starts) / H, r.usd_per_hour) for r in rows} == {(2, 0.4), (1, 0.5)}


def test_spot_history_prices_the_hours_the_bill_does_not_reach(session: Session) -> None:
    bill(session, "i-0spot", {0: 0.4, 1: 0.4})
    remake_billed_prices(session)
    session.execute(
        insert(spot_prices),
        [
            {"instance_type": "g5.xlarge", "availability_zone": "us-east-1b", "ts": T0 - 5 * H, "usd_per_hour": 0.4},
            {"instance_type": "g5.xlarge", "availability_zone": "us-east-1b", "ts": T0 + 2.25 * H, "usd_per_hour": 0.6},
        ],
    )
    pieces = price_pieces(session, [SPOT], T0, T0 + 4 * H)[SPOT.pk]
    assert pieces == [
        PricePiece(T0, T0 + 2 * H, 0.4, BILLED),
        PricePiece(T0 + 2 * H, T0 + 3 * H, 0.55, SPOT_HISTORY),  # 15 min at 0.40, 45 at 0.60
        PricePiece(T0 + 3 * H, T0 + 4 * H, 0.6, SPOT_HISTORY),
    ]


def test_capacity_paid_between_two_billed_hours_is_one_piece_paid_offline(session: Session) -> None:
    bill(session, "i-0block", {0: 31.464, 5: 31.464}, kind="capacity block")
    remake_billed_prices(session)
    pieces = price_pieces(session, [BLOCK], T0, T0 + 8 * H)[BLOCK.pk]
    assert [(p.start, p.end, p.paid_offline) for p in pieces] == [
        (T0, T0 + H, True),
        (T0 + H, T0 + 5 * H, True),
        (T0 + 5 * H, T0 + 6 * H, True),
    ]
    assert {p.usd_per_hour for p in pieces} == {31.464}


def test_an_on_demand_instance_without_a_bill_has_no_pieces(session: Session) -> None:
    assert price_pieces(session, [BLOCK], T0, T0 + H) == {}


def test_the_last_spot_price_read_holds_until_the_next_read(session: Session) -> None:
    session.execute(
        insert(spot_prices).values(instance_type="g5.xlarge", availability_zone="us-east-1b", ts=T0, usd_per_hour=0.4)
    )
    session.execute(
        insert(spot_price_reads).values(instance_type="g5.xlarge", availability_zone="us-east-1b", read_until=T0 + H)
    )
    pieces = price_pieces(session, [SPOT], T0, T0 + 3 * H)[SPOT.pk]
    assert pieces == [PricePiece(T0, T0 + 3 * H, 0.4, SPOT_HISTORY)]


def test_an_hour_the_history_covers_in_part_is_priced_over_that_part(session: Session) -> None:
    session.execute(
        insert(spot_prices).values(
            instance_type="g5.xlarge", availability_zone="us-east-1b", ts=T0 + 0.5 * H, usd_per_hour=0.4
        )
    )
    pieces = price_pieces(session, [SPOT], T0, T0 + 48 * H)[SPOT.pk]
    assert pieces == [PricePiece(T0, T0 + 48 * H, 0.4, SPOT_HISTORY)]
