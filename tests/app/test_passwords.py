"""The admin password hash: made, parsed and checked; bad hashes are refused with a reason."""

from __future__ import annotations

import pytest

from app.passwords import DEFAULT_N, hash_password, parse_hash, verify_password

FAST = 2**10  # the lowest cost parse_hash accepts; keeps the tests quick


def test_a_hash_checks_its_password_only() -> None:
    stored = hash_password("correct horse", n=FAST)
    assert verify_password("correct horse", stored)
    assert not verify_password("correct horse ", stored)
    assert not verify_password("", stored)


def test_each_hash_has_its_own_salt_and_no_dollar_sign() -> None:
    a, b = hash_password("pw", n=FAST), hash_password("pw", n=FAST)
    assert a != b
    assert "$" not in a and a.startswith(f"scrypt:{FAST}:8:1:")


def test_the_default_cost() -> None:
    assert parse_hash(hash_password("pw")).n == DEFAULT_N


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("hunter2", "not a password hash"),
        ("bcrypt:1024:8:1:c2FsdHNhbHQ:a2V5a2V5a2V5a2V5a2V5a2V5", "not a password hash"),
        ("scrypt:x:8:1:c2FsdHNhbHQ:a2V5a2V5a2V5a2V5a2V5a2V5", "whole numbers"),
        ("scrypt:1000:8:1:c2FsdHNhbHQ:a2V5a2V5a2V5a2V5a2V5a2V5", "power of two"),
        (f"scrypt:{2**24}:8:1:c2FsdHNhbHQ:a2V5a2V5a2V5a2V5a2V5a2V5", "power of two"),
        ("scrypt:1024:8:1:c2E:a2V5a2V5a2V5a2V5a2V5a2V5", "too short"),
    ],
)
def test_bad_hashes_say_what_is_wrong(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_hash(text)


def test_empty_or_huge_passwords_are_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        hash_password("")
    with pytest.raises(ValueError, match="longer"):
        hash_password("x" * 2000)
    assert not verify_password("x" * 2000, hash_password("x", n=FAST))
