"""GET /api/v1/report under any combination of parameters: a report (200) or a 4xx naming what is wrong,
never a server error."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import Session, sessionmaker

from app.report.schemas import ReportOut
from app.report.service import FIGURE_COLUMNS
from tests.conftest import make_token
from tests.factories import gpu, mig_slice
from tests.feeding import Feeder, busy, held, idle

URL = "/api/v1/report"
PARAMS = ("start", "end", "window", "group_by", "region", "instance_type", "lifecycle", "tag", "format")
NOW = datetime.now(UTC)

# Any text a query string can carry (no lone surrogates: they cannot be UTF-8 encoded).
any_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)
header_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=60)
offsets = st.builds(
    lambda minutes: timezone(timedelta(minutes=minutes)), st.integers(min_value=-23 * 60 - 59, max_value=23 * 60 + 59)
)
near = st.datetimes(min_value=(NOW - timedelta(days=40)).replace(tzinfo=None), max_value=NOW.replace(tzinfo=None))
anywhen = st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59))


def _iso(t: datetime, tz: timezone | None, sep: str) -> str:
    return (t.replace(tzinfo=tz) if tz is not None else t).isoformat(sep=sep)


times = st.one_of(
    st.builds(_iso, near, st.none() | offsets, st.sampled_from(["T", " "])),
    st.builds(_iso, anywhen, st.none() | offsets | st.just(UTC), st.just("T")),
    st.builds(lambda t: t.strftime("%Y-%m-%d"), near),
    st.builds(lambda t: t.strftime("%Y-%m-%dT%H:%M:%SZ"), near),
    st.integers().map(str),
    any_text,
)
group_names = st.sampled_from(
    ["instance", "instance_type", "region", "availability_zone", "lifecycle", "gpu", "slice", "gpu_model"]
)
tag_keys = st.one_of(st.sampled_from(["team", "Name", "", " ", ":", "a:b", "ü", "env,x"]), any_text)
group_by = st.one_of(
    group_names,
    tag_keys.map(lambda k: f"tag:{k}"),
    st.lists(group_names | tag_keys.map(lambda k: f"tag:{k}"), max_size=10).map(",".join),
    any_text,
)
values: dict[str, st.SearchStrategy[str]] = {
    "start": times,
    "end": times,
    "window": st.one_of(st.sampled_from(["1h", "6h", "24h", "7d", "30d", "", "0h", "-1d", "99999999999d"]), any_text),
    "group_by": group_by,
    "region": st.one_of(st.sampled_from(["us-east-1", "eu-west-1", ""]), any_text),
    "instance_type": st.one_of(st.sampled_from(["p4d.24xlarge", "g5.xlarge"]), any_text),
    "lifecycle": st.one_of(st.sampled_from(["spot", "on-demand", "on-prem", "reserved", ""]), any_text),
    "tag": st.one_of(st.sampled_from(["team:vision", "team=nlp", "team:", ":x", "novalue", "k:v:w"]), any_text),
    "format": st.one_of(st.sampled_from(["json", "csv", "JSON", "xml", ""]), any_text),
}
pairs = st.lists(
    st.one_of(
        st.sampled_from(PARAMS).flatmap(lambda name: st.tuples(st.just(name), values[name])),
        st.tuples(any_text, any_text),
    ),
    max_size=8,
)
accepts = st.one_of(
    st.none(),
    st.sampled_from(["text/csv", "application/json", "text/csv;q=0.9, application/json;q=0.1", "*/*", "text/csv;q=x"]),
    header_text,
)


@pytest.fixture
def tokens(sessions: sessionmaker[Session]) -> dict[str, str]:
    return {"read": make_token(sessions, "read"), "ingest": make_token(sessions, "ingest")}


@pytest.fixture
def small_fleet(feeder: Feeder) -> None:
    """An idle p4d, a busy spot g5 and a MIG GPU with an unpartitioned slice, over the last few hours."""
    start = feeder.t0
    feeder.feed([gpu(0), gpu(1)], start=start, hours=2, fn=idle, instance_id="i-p4d", tags={"team": "vision"})
    feeder.feed(
        [gpu(0)],
        start=start,
        hours=3,
        step_s=300,
        fn=busy(60),
        instance_id="i-g5",
        instance_type="g5.xlarge",
        lifecycle="spot",
        region="eu-west-1",
        tags={"team": "nlp", "Name": "Zürich"},
    )
    mig = gpu(0, mig=True, slices=[mig_slice(1, "3g.20gb"), mig_slice(2, "2g.10gb")], unpartitioned=2)
    feeder.feed([mig], start=start, hours=1, step_s=300, fn=held, instance_id="i-mig", tags={})


def _check(r: Any, fmt_csv: bool) -> None:
    event(f"status {r.status_code}")
    assert r.status_code < 500, r.text
    if r.status_code == 200:
        if r.headers["content-type"].startswith("text/csv"):
            table = list(csv.reader(io.StringIO(r.text)))
            assert table[0][:2] == ["start", "end"] and table[0][-len(FIGURE_COLUMNS) :] == list(FIGURE_COLUMNS)
            assert "TOTAL" in table[-1]
            assert all(len(row) == len(table[0]) for row in table)
        else:
            assert not fmt_csv
            ReportOut.model_validate(r.json())
        return
    assert 400 <= r.status_code < 500
    body = r.json()
    assert isinstance(body["error"], str) and body["error"]
    if r.status_code == 400:
        problem = body["detail"][0]
        assert problem["field"] in PARAMS and problem["message"]


@pytest.mark.usefixtures("small_fleet")
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=pairs, accept=accepts, who=st.sampled_from(["read", "read", "read", "ingest", "none", "junk"]))
def test_any_parameters_answer_a_report_or_a_4xx(
    client: TestClient, tokens: dict[str, str], query: list[tuple[str, str]], accept: str | None, who: str
) -> None:
    headers = {}
    if who in tokens:
        headers["Authorization"] = f"Bearer {tokens[who]}"
    elif who == "junk":
        headers["Authorization"] = "Bearer gpf_junk"
    if accept is not None:
        headers["Accept"] = accept
    r = client.get(URL, params=tuple(query), headers=headers)
    fmt = dict(query).get("format")
    _check(r, fmt == "csv")
    if who != "read":
        assert r.status_code in (401, 403)


@pytest.mark.usefixtures("small_fleet")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    start=near,
    hours=st.integers(min_value=-48, max_value=24 * 45),
    by=st.lists(group_names | st.sampled_from(["tag:team", "tag:Name"]), min_size=1, max_size=3, unique=True),
    fmt=st.sampled_from(["json", "csv"]),
)
def test_valid_windows_and_groupings_answer_200(
    client: TestClient, tokens: dict[str, str], start: datetime, hours: int, by: list[str], fmt: str
) -> None:
    """Well-formed windows inside retention and 400 days: 200 when end follows start, else 400 naming end."""
    end = start + timedelta(hours=hours)
    query = {"start": start.isoformat(), "end": end.isoformat(), "group_by": by, "format": fmt}
    r = client.get(URL, params=query, headers={"Authorization": f"Bearer {tokens['read']}"})
    _check(r, fmt == "csv")
    if hours > 0:
        assert r.status_code == 200, r.text
    else:
        assert r.status_code == 400 and r.json()["detail"][0]["field"] == "end"
