"""Price pieces kept in this process (app/billing/prices.py `price_pieces`): read once per change to the prices
they come from, not on every page view or alert evaluation. Every change to the bill's prices or the spot price
history moves `price_pieces_version` (a statement trigger, migration 0018), which is part of the key."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.orm import Session

from .prices import PricedInstance, PricePiece, price_pieces
from .tables import PRICE_PIECES_VERSION_SQL


class PiecesMemo:
    """Price pieces read so far in this process, by database, version of their sources (`price_pieces_version`,
    which every change to the bill's prices or the spot price history moves), span and instances: a page reads them
    once per import or spot price read, not on every view. The version is read before the pieces, so the pieces kept
    under a version are never older than it. Holds the `size` latest reads."""

    def __init__(self, size: int = 32) -> None:
        self._lock = threading.Lock()
        self._size = size
        self._kept: OrderedDict[Hashable, dict[int, list[PricePiece]]] = OrderedDict()

    def get(self, key: Hashable) -> dict[int, list[PricePiece]] | None:
        with self._lock:
            found = self._kept.get(key)
            if found is None:
                return None
            self._kept.move_to_end(key)
        return {pk: list(ps) for pk, ps in found.items()}

    def put(self, key: Hashable, pieces: Mapping[int, list[PricePiece]]) -> None:
        with self._lock:
            self._kept[key] = {pk: list(ps) for pk, ps in pieces.items()}
            while len(self._kept) > self._size:
                self._kept.popitem(last=False)


PIECES = PiecesMemo()


def kept_pieces(
    session: Session,
    wanted: Sequence[PricedInstance],
    start: datetime,
    end: datetime,
    *,
    memo: PiecesMemo = PIECES,
) -> dict[int, list[PricePiece]]:
    """`price_pieces(session, wanted, start, end)`, from `memo` when read before under the same version of the
    prices (a copy: callers may change it)."""
    version = session.execute(text(PRICE_PIECES_VERSION_SQL)).scalar()
    if version is None:
        return price_pieces(session, wanted, start, end)
    key = (str(session.get_bind().engine.url), version, start, end, tuple(wanted))
    found = memo.get(key)
    if found is None:
        found = price_pieces(session, wanted, start, end)
        memo.put(key, found)
    return found
