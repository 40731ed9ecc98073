"""A small IMDSv2 client: session token, then GETs under `/latest/meta-data/` and `/latest/dynamic/`.

Standard library only. Every request has a timeout and bypasses any proxy from the environment: the
metadata service is link-local and a proxy would either fail or answer for some other machine.
"""

from __future__ import annotations

import http.client
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable

log = logging.getLogger("gpufleet.agent.identify")

TOKEN_PATH = "/latest/api/token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
MAX_TOKEN_TTL_S = 21600
# Metadata bodies are tiny (the identity document is under 1 KiB); this only guards against a rogue answer.
_MAX_BODY_BYTES = 1 << 20

REFUSED_MESSAGE = "IMDS refused the request (403): metadata access is disabled for this instance"


class ImdsUnavailable(Exception):
    """IMDS did not answer usefully: no answer, timeout, 403, or a failed token flow. One readable line."""


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """IMDS never redirects; following one would hand the session token to another host."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


class ImdsClient:
    """IMDSv2 client with a cached session token.

    `timeout_s` bounds every socket operation of every request, in seconds. `token_ttl_s` is the token
    lifetime asked for, in seconds (1 to 21600); the token is renewed shortly before it runs out, as
    measured by `clock` (monotonic seconds).
    """

    def __init__(
        self,
        base_url: str = "http://169.254.169.254",
        *,
        timeout_s: float = 1.0,
        token_ttl_s: int = MAX_TOKEN_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 1 <= token_ttl_s <= MAX_TOKEN_TTL_S:
            raise ValueError(f"token_ttl_s must be between 1 and {MAX_TOKEN_TTL_S}, got {token_ttl_s}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be above 0, got {timeout_s}")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = float(timeout_s)
        self._token_ttl_s = token_ttl_s
        self._clock = clock
        # An empty ProxyHandler overrides the default one that reads http_proxy / HTTP_PROXY.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirects())
        self._token: str | None = None
        self._token_renew_at = 0.0

    def get(self, path: str) -> str | None:
        """`/latest/meta-data/<path>`: the body, or None when the item does not exist (404)."""
        return self._get("meta-data/" + path.lstrip("/"))

    def get_dynamic(self, path: str) -> str | None:
        """`/latest/dynamic/<path>`: the body, or None when the item does not exist (404)."""
        return self._get("dynamic/" + path.lstrip("/"))

    def _get(self, path: str) -> str | None:
        url = f"{self.base_url}/latest/{path}"
        for attempt in (1, 2):
            status, body = self._request("GET", url, {TOKEN_HEADER: self._session_token()})
            if 200 <= status < 300:
                return body
            if status == 404:
                return None
            if status == 403:
                raise ImdsUnavailable(REFUSED_MESSAGE)
            if status == 401 and attempt == 1:
                # The token expired early or IMDS restarted: one fresh token, one more try.
                log.debug("IMDS answered 401 for %s; renewing the token", path)
                self._token = None
                continue
            if status == 401:
                raise ImdsUnavailable(f"IMDS at {self.base_url} rejected a freshly issued token (401) for {path}")
            raise ImdsUnavailable(f"IMDS at {self.base_url} answered HTTP {status} for {path}")
        raise AssertionError("unreachable")

    def _session_token(self) -> str:
        now = self._clock()
        if self._token is None or now >= self._token_renew_at:
            self._token = self._put_token()
            # Renew a little early so a token never expires between our check and the server's.
            margin_s = min(60.0, self._token_ttl_s * 0.1)
            self._token_renew_at = now + self._token_ttl_s - margin_s
        return self._token

    def _put_token(self) -> str:
        status, body = self._request("PUT", self.base_url + TOKEN_PATH, {TTL_HEADER: str(self._token_ttl_s)})
        token = body.strip()
        if 200 <= status < 300 and token:
            return token
        if status == 403:
            raise ImdsUnavailable(REFUSED_MESSAGE)
        if 200 <= status < 300:
            raise ImdsUnavailable(f"IMDS at {self.base_url} returned an empty session token")
        if status in (404, 405):
            raise ImdsUnavailable(f"IMDS at {self.base_url} does not offer IMDSv2 tokens (HTTP {status})")
        raise ImdsUnavailable(f"IMDS at {self.base_url} refused a session token (HTTP {status})")

    def _request(self, method: str, url: str, headers: dict[str, str]) -> tuple[int, str]:
        """One request: (HTTP status, body text). Network trouble raises ImdsUnavailable."""
        try:
            request = urllib.request.Request(url, data=b"" if method == "PUT" else None, headers=headers, method=method)
            with self._opener.open(request, timeout=self.timeout_s) as response:
                raw: bytes = response.read(_MAX_BODY_BYTES)
                return int(response.status), raw.decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            exc.close()
            return exc.code, ""
        except (OSError, http.client.HTTPException, ValueError) as exc:  # URLError is an OSError; bad URLs: ValueError
            raise ImdsUnavailable(f"IMDS not reachable at {self.base_url} ({self._why(exc)})") from None

    def _why(self, exc: BaseException) -> str:
        reason: object = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if isinstance(reason, TimeoutError):
            return f"timed out after {self.timeout_s} s"
        if isinstance(reason, ConnectionRefusedError):
            return "connection refused"
        if isinstance(reason, OSError) and reason.strerror:
            return reason.strerror[:1].lower() + reason.strerror[1:]
        text = " ".join(str(reason).split())
        return text or type(reason).__name__
