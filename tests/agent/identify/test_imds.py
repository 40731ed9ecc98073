"""ImdsClient against the local IMDSv2 stand-in."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from agent.identify import ImdsClient, ImdsUnavailable
from tests.agent.imds_server import DEFAULT_METADATA, ImdsServer, closed_port_url


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def imds() -> Iterator[ImdsServer]:
    with ImdsServer(tags={"team": "ml"}) as server:
        yield server


def test_get_reuses_one_token(imds: ImdsServer) -> None:
    client = ImdsClient(imds.url)
    assert client.get("instance-id") == DEFAULT_METADATA["instance-id"]
    assert client.get("placement/availability-zone") == "us-east-1a"
    assert client.get("tags/instance/team") == "ml"
    assert imds.token_puts == 1


def test_missing_item_is_none(imds: ImdsServer) -> None:
    client = ImdsClient(imds.url)
    assert client.get("no/such/item") is None
    assert client.get_dynamic("instance-identity/pkcs7") is None


def test_get_dynamic(imds: ImdsServer) -> None:
    imds.dynamic["instance-identity/document"] = '{"region": "eu-west-1"}'
    assert ImdsClient(imds.url).get_dynamic("instance-identity/document") == '{"region": "eu-west-1"}'
    assert imds.count("dynamic/instance-identity/document") == 1


def test_401_renews_the_token_once(imds: ImdsServer) -> None:
    client = ImdsClient(imds.url)
    assert client.get("instance-id") is not None
    imds.expire_tokens()
    assert client.get("instance-type") == "p4d.24xlarge"
    assert imds.token_puts == 2
    assert imds.count("meta-data/instance-type") == 2


def test_401_after_a_fresh_token_gives_up(imds: ImdsServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tokens are issued but never accepted.
    monkeypatch.setattr(imds, "_tokens", _Forgetful())
    with pytest.raises(ImdsUnavailable, match=r"401"):
        ImdsClient(imds.url).get("instance-id")
    assert imds.token_puts == 2
    assert imds.count("meta-data/instance-id") == 2


class _Forgetful(dict[str, float]):
    def __setitem__(self, key: str, value: float) -> None:
        pass


def test_token_renewed_before_its_ttl(imds: ImdsServer) -> None:
    clock = FakeClock()
    client = ImdsClient(imds.url, token_ttl_s=100, clock=clock)
    client.get("instance-id")
    clock.now += 85
    client.get("instance-id")
    assert imds.token_puts == 1
    clock.now += 10  # 5 s before the TTL runs out: renew rather than risk a 401
    client.get("instance-id")
    assert imds.token_puts == 2


def test_token_request_carries_the_ttl(imds: ImdsServer) -> None:
    ImdsClient(imds.url, token_ttl_s=300).get("instance-id")
    request = urllib.request.Request(imds.url + "/latest/api/token", data=b"", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=2)
    info.value.close()
    assert info.value.code == 400
    assert imds.token_puts == 2


def test_403_disabled(imds: ImdsServer) -> None:
    imds.disable()
    with pytest.raises(ImdsUnavailable, match=r"^IMDS refused the request \(403\): metadata access is disabled"):
        ImdsClient(imds.url).get("instance-id")


def test_403_on_get(imds: ImdsServer) -> None:
    client = ImdsClient(imds.url)
    client.get("instance-id")
    imds.disable()
    with pytest.raises(ImdsUnavailable, match=r"403"):
        client.get("instance-id")


def test_nothing_listening() -> None:
    url = closed_port_url()
    with pytest.raises(ImdsUnavailable) as info:
        ImdsClient(url).get("instance-id")
    assert str(info.value) == f"IMDS not reachable at {url} (connection refused)"


def test_slow_server_times_out() -> None:
    with ImdsServer(delay_s=3.0) as slow:
        client = ImdsClient(slow.url, timeout_s=0.2)
        started = time.monotonic()
        with pytest.raises(ImdsUnavailable, match=r"timed out after 0\.2 s"):
            client.get("instance-id")
        assert time.monotonic() - started < 1.0


def test_proxy_variables_are_ignored(imds: ImdsServer, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", closed_port_url())
    monkeypatch.setenv("HTTP_PROXY", closed_port_url())
    assert ImdsClient(imds.url).get("instance-id") == DEFAULT_METADATA["instance-id"]


def test_bad_url_is_unavailable() -> None:
    with pytest.raises(ImdsUnavailable, match=r"^IMDS not reachable at nonsense \(not an http\(s\) URL"):
        ImdsClient("nonsense").get("instance-id")


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="token_ttl_s"):
        ImdsClient(token_ttl_s=0)
    with pytest.raises(ValueError, match="timeout_s"):
        ImdsClient(timeout_s=0)
