"""The agent's HTTP client: one request, one connection, explicit timeouts, on `http.client`.

`urllib.request` would cost the agent about 2 MiB of resident memory for features it does not use. Proxies
are honoured the way curl does (`https_proxy`, `http_proxy`, `no_proxy`) for the server, and never for
the instance metadata service.
"""

from __future__ import annotations

import contextlib
import http.client
import math
import os
import ssl
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit


class HttpError(Exception):
    """The request got no HTTP answer: refused, timed out, TLS failure, bad URL. One readable line."""


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    headers: dict[str, str]


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a `Retry-After` header: delay-seconds or an HTTP date (RFC 9110, 10.2.3), against
    `now` (Unix seconds). None when absent or unreadable; a date in the past gives 0."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000": the RFC's dates are GMT
        when = when.replace(tzinfo=UTC)
    seconds = when.timestamp() - now
    return max(0.0, seconds) if math.isfinite(seconds) else None


def tls_context(ca_bundle: str | None = None) -> ssl.SSLContext:
    """Certificate and host-name checks on; `ca_bundle` (a PEM file) replaces the system's trust store."""
    return ssl.create_default_context(cafile=ca_bundle)


def _proxy_for(scheme: str, host: str) -> str | None:
    env = os.environ
    no_proxy = env.get("no_proxy") or env.get("NO_PROXY") or ""
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if entry == "*" or (entry and (host == entry.lstrip(".") or host.endswith("." + entry.lstrip(".")))):
            return None
    return env.get(f"{scheme}_proxy") or env.get(f"{scheme.upper()}_PROXY") or None


def request(
    method: str,
    url: str,
    *,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 10.0,
    context: ssl.SSLContext | None = None,
    use_proxy: bool = True,
    max_body: int = 1 << 20,
) -> Response:
    """Send one request and read the answer (at most `max_body` bytes of it). Raises HttpError only when
    there is no HTTP answer at all; any status code is a Response."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HttpError(f"not an http(s) URL: {url!r}")
    host = parts.hostname
    port = parts.port or (443 if parts.scheme == "https" else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    proxy = _proxy_for(parts.scheme, host) if use_proxy else None
    conn: http.client.HTTPConnection
    try:
        if proxy:
            p = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
            conn = http.client.HTTPConnection(p.hostname or "", p.port or 80, timeout=timeout_s)
            if parts.scheme == "https":
                conn = http.client.HTTPSConnection(
                    p.hostname or "", p.port or 80, timeout=timeout_s, context=context or tls_context()
                )
                conn.set_tunnel(host, port)
            else:
                target = url
        elif parts.scheme == "https":
            conn = http.client.HTTPSConnection(host, port, timeout=timeout_s, context=context or tls_context())
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    except ValueError as exc:
        raise HttpError(f"bad URL {url!r}: {exc}") from None
    try:
        # A server may answer from the headers alone (401, 413, 503) and close before the body is in; its
        # answer is then already on the socket, and worth more than the broken pipe.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.request(method, target, body=body, headers=headers or {})
        answer = conn.getresponse()
        data = answer.read(max_body)
        return Response(answer.status, data, {k.lower(): v for k, v in answer.getheaders()})
    except TimeoutError:
        raise HttpError(f"timed out after {timeout_s:g} s") from None
    except ssl.SSLError as exc:
        raise HttpError(f"TLS failed: {exc.reason or exc}") from None
    except (OSError, http.client.HTTPException) as exc:
        raise HttpError(getattr(exc, "strerror", None) or str(exc) or type(exc).__name__) from None
    finally:
        conn.close()
