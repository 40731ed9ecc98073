"""The admin password: kept only as a scrypt hash (`gpufleet hash-password`), checked in constant time.

A hash reads `scrypt:N:r:p:SALT:KEY`, with SALT and KEY in unpadded URL-safe base64. It holds no `$`, which
shells, systemd unit files and docker-compose would otherwise try to expand.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

SCHEME = "scrypt"
# 2**15 x 8 x 128 bytes = 32 MiB and about 0.1 s per check: slow for a guesser, cheap for a login form.
DEFAULT_N = 2**15
DEFAULT_R = 8
DEFAULT_P = 1
_KEY_BYTES = 32
_SALT_BYTES = 16
MAX_PASSWORD_CHARS = 1024


@dataclass(frozen=True)
class PasswordHash:
    n: int
    r: int
    p: int
    salt: bytes
    key: bytes

    def __str__(self) -> str:
        return ":".join((SCHEME, str(self.n), str(self.r), str(self.p), _b64(self.salt), _b64(self.key)))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _derive(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    # maxmem: room for the 128 x N x r bytes scrypt needs, whatever parameters a stored hash carries.
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, dklen=_KEY_BYTES, maxmem=256 * n * r + 2**20)


def hash_password(password: str, *, n: int = DEFAULT_N, r: int = DEFAULT_R, p: int = DEFAULT_P) -> str:
    """The text to put in `GPUFLEET_ADMIN_PASSWORD_HASH` for `password` (a fresh random salt each time)."""
    if not password:
        raise ValueError("the password is empty")
    if len(password) > MAX_PASSWORD_CHARS:
        raise ValueError(f"the password is longer than {MAX_PASSWORD_CHARS} characters")
    salt = secrets.token_bytes(_SALT_BYTES)
    return str(PasswordHash(n, r, p, salt, _derive(password, salt, n, r, p)))


def parse_hash(text: str) -> PasswordHash:
    """A stored hash, or ValueError saying what is wrong with it."""
    parts = text.strip().split(":")
    if len(parts) != 6 or parts[0] != SCHEME:
        raise ValueError("not a password hash made by `gpufleet hash-password` (scrypt:N:r:p:salt:key)")
    try:
        n, r, p = (int(x) for x in parts[1:4])
        salt, key = _unb64(parts[4]), _unb64(parts[5])
    except ValueError:
        raise ValueError("password hash: N, r and p must be whole numbers, salt and key base64") from None
    # Bounds keep a mistyped hash from making every login take minutes or gigabytes.
    if not (2**10 <= n <= 2**20 and n & (n - 1) == 0) or not 1 <= r <= 32 or not 1 <= p <= 16:
        raise ValueError("password hash: N must be a power of two from 1024 to 1048576, r 1-32, p 1-16")
    if len(salt) < 8 or len(key) < 16:
        raise ValueError("password hash: salt or key too short")
    return PasswordHash(n, r, p, salt, key)


def verify_password(password: str, stored: str) -> bool:
    """True when `password` matches the hash `stored`; the keys are compared in constant time."""
    parsed = parse_hash(stored)
    if not password or len(password) > MAX_PASSWORD_CHARS:
        return False
    return hmac.compare_digest(_derive(password, parsed.salt, parsed.n, parsed.r, parsed.p), parsed.key)
