"""`gpufleet report`: GET /api/v1/report from a running server, printed as a table, CSV or JSON.

Standard library only (urllib): the command needs no server dependencies and no database. Every failure is a
`ReportClientError` carrying one line and an exit code: 2 for bad usage and 4xx answers, 1 when the server
cannot be reached or fails (5xx).
"""

from __future__ import annotations

import codecs
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.client import HTTPException, HTTPResponse
from pathlib import Path
from typing import Any, TextIO

from .. import __version__

DEFAULT_URL = "http://127.0.0.1:8000"
PATH = "/api/v1/report"
FORMATS = ("table", "csv", "json")
USAGE = 2
UNREACHABLE = 1


class ReportClientError(Exception):
    """A failure to print as one line; `code` is the exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Server:
    url: str
    """Base URL, without a trailing slash."""
    token: str | None
    """None: ask without one (a server with GPUFLEET_AUTH=off lets this machine read)."""
    timeout_s: float = 60.0


def resolve_server(
    url: str | None, token: str | None, token_file: str | None, timeout_s: float, env: dict[str, str] | None = None
) -> Server:
    """The server and token from the options, else GPUFLEET_URL / GPUFLEET_TOKEN, else the defaults."""
    env = dict(os.environ) if env is None else env
    base = (url or env.get("GPUFLEET_URL") or DEFAULT_URL).strip().rstrip("/")
    try:
        parts = urllib.parse.urlsplit(base)
        _port = parts.port
    except ValueError as exc:
        raise ReportClientError(f"bad --url {base!r}: {exc}", USAGE) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ReportClientError(f"--url must be an http:// or https:// URL, got {base!r}", USAGE)
    if token and token_file:
        raise ReportClientError("give --token or --token-file, not both", USAGE)
    if token_file:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ReportClientError(f"cannot read --token-file {token_file}: {_reason(exc)}", USAGE) from None
        if not token:
            raise ReportClientError(f"--token-file {token_file} is empty", USAGE)
    token = (token or env.get("GPUFLEET_TOKEN") or "").strip() or None
    # Checked here so that no later error message can carry the secret (or whatever file was given instead).
    if token is not None and (not all(33 <= ord(c) <= 126 for c in token) or len(token) > 4096):
        raise ReportClientError("the token is not one word of printable ASCII: is it the right value or file?", USAGE)
    if not 0 < timeout_s < 86400:
        raise ReportClientError("--timeout must be above 0 and under 86400 seconds", USAGE)
    return Server(base, token, timeout_s)


def query(
    *,
    start: str | None = None,
    end: str | None = None,
    window: str | None = None,
    group_by: Sequence[str] = (),
    region: Sequence[str] = (),
    instance_type: Sequence[str] = (),
    lifecycle: Sequence[str] = (),
    tag: Sequence[str] = (),
    fmt: str = "json",
) -> list[tuple[str, str]]:
    """The report's query string as pairs; repeated options become repeated parameters."""
    pairs: list[tuple[str, str]] = [(k, v) for k, v in (("start", start), ("end", end), ("window", window)) if v]
    for name, values in (
        ("group_by", group_by),
        ("region", region),
        ("instance_type", instance_type),
        ("lifecycle", lifecycle),
        ("tag", tag),
    ):
        pairs += [(name, v) for v in values]
    pairs.append(("format", fmt))
    return pairs


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None) or exc
    text = str(getattr(reason, "strerror", None) or reason).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _error_message(status: int, body: bytes) -> str:
    """The server's `{"error", "detail"}` answer as one line; anything else as its HTTP status."""
    try:
        answer = json.loads(body)
        parts = [f"{d['field']}: {d['message']}" for d in answer.get("detail") or []]
        message = str(answer["error"]) + (" (" + "; ".join(parts) + ")" if parts else "")
    except (ValueError, KeyError, TypeError, AttributeError):
        message = f"HTTP {status}"
    return message.replace("\n", " ")


@contextmanager
def open_report(server: Server, params: list[tuple[str, str]]) -> Iterator[HTTPResponse]:
    """The server's 200 answer, open for reading; ReportClientError for anything else."""
    url = f"{server.url}{PATH}?{urllib.parse.urlencode(params)}"
    headers = {"User-Agent": f"gpufleet/{__version__}"}
    if server.token is not None:
        headers["Authorization"] = f"Bearer {server.token}"
    request = urllib.request.Request(url, headers=headers)
    try:
        response = urllib.request.urlopen(request, timeout=server.timeout_s)
    except urllib.error.HTTPError as exc:
        try:
            with exc:
                body = exc.read()
        except (OSError, HTTPException):
            body = b""
        code = USAGE if 400 <= exc.code < 500 else UNREACHABLE
        message = f"{server.url} answered {exc.code}: {_error_message(exc.code, body)}"
        if exc.code == 401 and server.token is None:
            message += "; give --token, --token-file or GPUFLEET_TOKEN (scope read)"
        raise ReportClientError(message, code) from None
    except (urllib.error.URLError, OSError, HTTPException) as exc:
        raise ReportClientError(f"cannot reach {server.url}: {_reason(exc)}", UNREACHABLE) from None
    except ValueError:  # a URL that cannot go into a request; its message may quote the headers, so not shown
        raise ReportClientError(f"cannot ask {server.url}: not a URL an HTTP request can be made to", USAGE) from None
    with response:
        yield response


def _read_all(server: Server, response: HTTPResponse) -> bytes:
    try:
        return response.read()
    except (OSError, HTTPException) as exc:
        raise ReportClientError(f"{server.url}: the answer broke off: {_reason(exc)}", UNREACHABLE) from None


def fetch_json(server: Server, params: list[tuple[str, str]]) -> dict[str, Any]:
    with open_report(server, params) as response:
        body = _read_all(server, response)
    try:
        report = json.loads(body)
    except ValueError:
        report = None
    if not isinstance(report, dict) or not isinstance(report.get("rows"), list) or "totals" not in report:
        raise ReportClientError(f"{server.url} did not answer with a gpufleet report", UNREACHABLE)
    return report


def copy_csv(server: Server, params: list[tuple[str, str]], out: TextIO) -> None:
    """The CSV as it arrives, written to `out` without holding it all."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    with open_report(server, params) as response:
        if not response.headers.get("content-type", "").startswith("text/csv"):
            raise ReportClientError(f"{server.url} did not answer with a gpufleet report", UNREACHABLE)
        while True:
            try:
                chunk = response.read1(64 * 1024)
            except (OSError, HTTPException) as exc:
                raise ReportClientError(f"{server.url}: the answer broke off: {_reason(exc)}", UNREACHABLE) from None
            if not chunk:
                break
            out.write(decoder.decode(chunk))
    out.write(decoder.decode(b"", final=True))


# ---------------------------------------------------------------------------------------------------------
# The table


def _hours(v: Any) -> str:
    return "-" if v is None else f"{v:,.1f}"


def _pct(v: Any) -> str:
    return "-" if v is None else f"{v:.1f}%"


def _usd(v: Any) -> str:
    return "-" if v is None else f"{v:,.2f}"


def _wasted(f: dict[str, Any]) -> float | None:
    if f.get("idle_cost") is None or f.get("idle_held_cost") is None:
        return None
    return float(f["idle_cost"]) + float(f["idle_held_cost"])


# Header, how to read it from a row of figures, how to show it. Money is USD with two decimals.
TABLE_COLUMNS: tuple[tuple[str, Callable[[dict[str, Any]], Any], Callable[[Any], str]], ...] = (
    ("GPU-H", lambda f: f.get("gpu_hours"), _hours),
    ("UTIL", lambda f: f.get("avg_util_pct"), _pct),
    ("IDLE H", lambda f: f.get("idle_h"), _hours),
    ("IDLE-HELD H", lambda f: f.get("idle_held_h"), _hours),
    ("OFFLINE H", lambda f: f.get("offline_h"), _hours),
    ("COST", lambda f: f.get("cost"), _usd),
    ("IDLE", lambda f: f.get("idle_cost"), _usd),
    ("IDLE-HELD", lambda f: f.get("idle_held_cost"), _usd),
    ("WASTED", _wasted, _usd),
    ("UNUSED", lambda f: f.get("unused_cost"), _usd),
)


def render_table(report: dict[str, Any]) -> list[str]:
    """The report as aligned text lines: a title, a header, one line per group, a rule, then the totals."""
    group_by = [str(g) for g in report.get("group_by") or []] or ["group"]
    rows: list[dict[str, Any]] = report["rows"]
    lines: list[list[str]] = [[g.upper() for g in group_by] + [c[0] for c in TABLE_COLUMNS]]
    for row in rows:
        labels = [str((row.get("group") or {}).get(g, "")) for g in group_by]
        lines.append(labels + [show(get(row)) for _h, get, show in TABLE_COLUMNS])
    totals = report["totals"]
    total = ["TOTAL"] + [""] * (len(group_by) - 1) + [show(get(totals)) for _h, get, show in TABLE_COLUMNS]
    widths = [max(len(line[i]) for line in [*lines, total]) for i in range(len(total))]
    n = len(group_by)

    def fmt(cells: list[str]) -> str:
        text = [c.ljust(w) if i < n else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "  ".join(text).rstrip()

    start, end = str(report.get("start", ""))[:16], str(report.get("end", ""))[:16]
    currency = totals.get("currency") or "USD"
    out = [f"{start.replace('T', ' ')} to {end.replace('T', ' ')} UTC, money in {currency}", fmt(lines[0])]
    out += [fmt(line) for line in lines[1:]] if rows else ["(no data in this window)"]
    out.append("  ".join("-" * w for w in widths))
    out.append(fmt(total))
    return out
