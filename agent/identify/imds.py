"""A small IMDSv2 client: session token, then GETs under `/latest/meta-data/` and `/latest/dynamic/`.

Standard library only. Every request has a timeout and bypasses any proxy from the environment: the
metadata service is link-local and a proxy would either fail or answer for some other machine.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..httpclient import HttpError, request

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
            answer = request(
                method,
                url,
                body=b"" if method == "PUT" else None,
                headers=headers,
                timeout_s=self.timeout_s,
                use_proxy=False,
                max_body=_MAX_BODY_BYTES,
            )
        except HttpError as exc:
            why = str(exc)
            raise ImdsUnavailable(f"IMDS not reachable at {self.base_url} ({why[:1].lower() + why[1:]})") from None
        # IMDS never redirects, and redirects are not followed: a 3xx is just an unexpected status.
        return answer.status, answer.body.decode("utf-8", "replace") if 200 <= answer.status < 300 else ""
