"""The values of an alert rule's fields that need more than a type: durations, URLs and email addresses. Each check
raises ValueError with a message for the field it is used on."""

from __future__ import annotations

import math
import re
from urllib.parse import urlsplit

_UNITS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([wdhms])")
_PARTS = re.compile(r"(?:\d+(?:\.\d+)?\s*[wdhms]\s*)+")
MAX_DURATION_S = 366 * 86400
DURATION_HELP = "use 30m, 2h, 1d, 1w, a combination such as 1h30m, or a number of hours"


def parse_duration_s(value: object) -> int:
    """A duration as whole seconds: a string of w/d/h/m/s parts ("1h30m") or a number of hours (2, 0.5, "2").
    Raises ValueError saying what is wrong (empty, negative, unknown unit, over 366 days)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"expected a duration: {DURATION_HELP}")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"a duration cannot be negative or infinite, got {value}")
        seconds = float(value) * 3600
    else:
        text = value.strip().lower()
        if not text:
            raise ValueError(f"empty duration: {DURATION_HELP}")
        if text.startswith("-"):
            raise ValueError(f"a duration cannot be negative, got {value!r}")
        if _NUMBER.fullmatch(text):
            seconds = float(text) * 3600
        elif _PARTS.fullmatch(text):
            seconds = sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(text))
        else:
            raise ValueError(f"not a duration: {value[:40]!r}; {DURATION_HELP}")
    if seconds > MAX_DURATION_S:
        raise ValueError(f"at most 366 days, got {value!r}")
    return round(seconds)


def format_duration(seconds: int) -> str:
    """Whole seconds as the shortest duration string that reads back the same: 5400 -> "1h30m", 0 -> "0"."""
    if seconds <= 0:
        return "0"
    parts = []
    for unit, size in _UNITS.items():
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


_EMAIL = re.compile(r"[^@\s<>()\[\],;:\"\\]+@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9-]+)*")
MAX_URL = 2000


def check_url(value: str) -> str:
    """An http(s) URL with a host, stripped; ValueError otherwise."""
    url = value.strip()
    if not url:
        raise ValueError("empty URL")
    if len(url) > MAX_URL:
        raise ValueError(f"a URL is at most {MAX_URL} characters")
    if any(c.isspace() or ord(c) < 0x20 for c in url):
        raise ValueError("a URL cannot contain spaces or control characters")
    try:
        parts = urlsplit(url)
        _port = parts.port
    except ValueError as exc:
        raise ValueError(f"not a URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"expected an http:// or https:// URL, got {url[:60]!r}")
    if not parts.hostname:
        raise ValueError(f"the URL has no host: {url[:60]!r}")
    return url


def check_email(value: str) -> str:
    """An address such as ada@example.com, stripped; ValueError otherwise (a sanity check, not RFC 5322)."""
    address = value.strip()
    if len(address) > 254 or not _EMAIL.fullmatch(address):
        raise ValueError(f"not an email address: {value[:60]!r}")
    return address
