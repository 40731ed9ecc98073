"""Which tokens /metrics lets through while the database cannot check them."""

from __future__ import annotations

from app.metrics.access import RecentReaders


def test_a_checked_token_is_known_for_a_while() -> None:
    readers = RecentReaders()
    assert not readers.knows("Bearer gpf_a")
    readers.remember("Bearer gpf_a")
    assert readers.knows("Bearer gpf_a")
    assert not readers.knows("Bearer gpf_b")
    readers.forget("Bearer gpf_a")
    assert not readers.knows("Bearer gpf_a")


def test_memory_expires() -> None:
    readers = RecentReaders(remember_s=0.0)
    readers.remember("Bearer gpf_a")
    assert not readers.knows("Bearer gpf_a")


def test_no_header_is_never_known() -> None:
    readers = RecentReaders()
    readers.remember(None)
    readers.remember("")
    assert not readers.knows(None) and not readers.knows("")


def test_memory_is_bounded() -> None:
    readers = RecentReaders()
    for i in range(1000):
        readers.remember(f"Bearer gpf_{i}")
    assert readers.knows("Bearer gpf_0")
    assert not readers.knows("Bearer gpf_999")
