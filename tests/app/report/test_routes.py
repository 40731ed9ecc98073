"""GET /api/v1/report on constructed data: known answers in JSON and CSV, the same numbers as the dashboard."""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from bs4 import BeautifulSoup
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from app.report.schemas import ReportOut
from app.settings import Settings
from app.web.templating import num, pct, usd
from tests.conftest import make_token
from tests.factories import gpu, mig_slice, unsized_slice
from tests.feeding import P4D_PER_GPU_HOUR, Feeder, busy, holders_story, idle

H = timedelta(hours=1)
URL = "/api/v1/report"


@pytest.fixture
def read_token(sessions: sessionmaker[Session]) -> str:
    return make_token(sessions, "read")


@pytest.fixture
def story(feeder: Feeder) -> dict[str, Any]:
    """Two whole past hours: an idle p4d GPU (team vision) and a g5 at 40% (team nlp, spot)."""
    start = feeder.t0
    feeder.feed(
        [gpu(0)], start=start, hours=2, fn=idle, instance_id="i-p4d", hostname="p4d-host", tags={"team": "vision"}
    )
    feeder.feed(
        [gpu(0)],
        start=start,
        hours=2,
        fn=busy(40),
        instance_id="i-g5",
        hostname="g5-host",
        instance_type="g5.xlarge",
        lifecycle="spot",
        tags={"team": "nlp"},
    )
    # The dashboard shows instances by name, the report by id.
    return {"start": start, "end": start + 2 * H, "names": {"i-p4d": "p4d-host", "i-g5": "g5-host"}}


def get(client: TestClient, token: str, **params: Any) -> Any:
    return client.get(URL, params=params, headers={"Authorization": f"Bearer {token}"})


def test_json_known_answers(client: TestClient, read_token: str, story: dict[str, Any]) -> None:
    r = get(client, read_token, start=story["start"].isoformat(), end=story["end"].isoformat(), group_by="tag:team")
    assert r.status_code == 200, r.text
    body = r.json()
    rows = {row["group"]["tag:team"]: row for row in body["rows"]}
    vision = rows["vision"]
    assert vision["gpu_hours"] == pytest.approx(2.0)
    assert vision["idle_h"] == pytest.approx(2.0)
    assert vision["idle_cost"] == pytest.approx(2 * P4D_PER_GPU_HOUR, abs=1e-5)
    assert vision["currency"] == "USD" and vision["price_source"] == "catalog on-demand"
    nlp = rows["nlp"]
    assert nlp["avg_util_pct"] == pytest.approx(40.0)
    assert nlp["unused_cost"] == pytest.approx(0.6 * nlp["cost"], abs=1e-5)
    assert body["totals"]["cost"] == pytest.approx(vision["cost"] + nlp["cost"], abs=1e-5)


def test_csv_has_a_header_one_row_per_group_and_totals(
    client: TestClient, read_token: str, story: dict[str, Any]
) -> None:
    r = get(
        client,
        read_token,
        start=story["start"].isoformat(),
        end=story["end"].isoformat(),
        group_by="instance_type,region",
        format="csv",
    )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/csv")
    table = list(csv.DictReader(io.StringIO(r.text)))
    assert [t["instance_type"] for t in table] == ["p4d.24xlarge", "g5.xlarge", "TOTAL"]
    assert table[0]["region"] == "us-east-1"
    assert float(table[0]["idle_cost"]) == pytest.approx(2 * P4D_PER_GPU_HOUR, abs=1e-5)
    assert datetime.fromisoformat(table[0]["start"]) == story["start"]
    # Accept: text/csv chooses CSV too.
    r2 = client.get(
        URL,
        params={"start": story["start"].isoformat(), "end": story["end"].isoformat()},
        headers={"Authorization": f"Bearer {read_token}", "Accept": "text/csv"},
    )
    assert r2.headers["content-type"].startswith("text/csv")


def test_report_equals_dashboard(client: TestClient, read_token: str, story: dict[str, Any]) -> None:
    params = {"window": "24h", "group_by": "instance_type"}
    body = get(client, read_token, **params).json()
    page = client.get("/waste", params=params, headers={"Authorization": f"Bearer {read_token}"})
    doc = BeautifulSoup(page.text, "html.parser")
    total_waste, total_cost = doc.select_one("[data-figure=total-waste]"), doc.select_one("[data-figure=total-cost]")
    assert total_waste is not None and total_cost is not None
    waste = body["totals"]["idle_cost"] + body["totals"]["idle_held_cost"]
    assert total_waste.get_text(strip=True) == f"${waste:,.2f}"
    assert total_cost.get_text(strip=True) == f"${body['totals']['cost']:,.2f}"


def _dashboard_rows(html: str) -> dict[str, list[str]]:
    """The /waste table: label -> cells (GPU-hours, util, unknown, offline, cost, idle, idle-held, unused, wasted)."""
    doc = BeautifulSoup(html, "html.parser")
    rows = {}
    for tr in doc.select("#waste-table tbody tr"):
        cells = [td.get_text(strip=True) for td in tr.select("td")]
        rows[cells[0]] = cells[1:10]
    total = doc.select_one("#waste-table tfoot tr")
    assert total is not None
    rows["TOTAL"] = [td.get_text(strip=True) for td in total.select("td")][:9]
    return rows


@pytest.mark.parametrize(
    "params",
    [
        {"window": "24h", "group_by": "tag:team"},
        {"window": "7d", "group_by": "instance"},
        {"window": "24h", "group_by": "gpu_model", "lifecycle": "spot"},
        {"start": "{start}", "end": "{end}", "group_by": "region", "tag": "team:vision"},
    ],
)
def test_every_row_equals_the_dashboard(
    client: TestClient, read_token: str, story: dict[str, Any], params: dict[str, str]
) -> None:
    """Each group's money, hours and utilization as the /waste page shows them, for the same query string."""
    params = {k: v.format(start=story["start"].isoformat(), end=story["end"].isoformat()) for k, v in params.items()}
    body = get(client, read_token, **params).json()
    page = client.get("/waste", params=params, headers={"Authorization": f"Bearer {read_token}"})
    assert page.status_code == 200
    shown = _dashboard_rows(page.text)
    report_rows = [
        (story["names"].get(row["group"][params["group_by"]], row["group"][params["group_by"]]), row)
        for row in body["rows"]
    ]
    assert {label for label, _r in report_rows} | {"TOTAL"} == set(shown)
    for label, f in [*report_rows, ("TOTAL", body["totals"])]:
        cells = shown[label]
        assert cells[0] == num(f["gpu_hours"], 1), label
        assert cells[1] == pct(f["avg_util_pct"]), label
        assert cells[3] == num(f["offline_h"], 1), label
        money = [f["cost"], f["idle_cost"], f["idle_held_cost"], f["unused_cost"], f["idle_cost"] + f["idle_held_cost"]]
        assert cells[4:9] == [usd(v) for v in money], label
    # The CSV carries the same figures as the JSON.
    table = list(csv.DictReader(io.StringIO(get(client, read_token, **params, format="csv").text)))
    assert [t[params["group_by"]] for t in table] == [r["group"][params["group_by"]] for r in body["rows"]] + ["TOTAL"]
    for t, (_label, f) in zip(table, [*report_rows, ("TOTAL", body["totals"])], strict=True):
        assert float(t["cost"]) == pytest.approx(f["cost"], abs=1e-6)
        assert float(t["idle_cost"]) == pytest.approx(f["idle_cost"], abs=1e-6)


def test_json_follows_the_documented_schema(client: TestClient, read_token: str, story: dict[str, Any]) -> None:
    body = get(client, read_token, window="24h", group_by=["instance", "tag:team"]).json()
    report = ReportOut.model_validate(body)
    assert len(report.rows) == 2
    assert set(report.rows[0].group) == {"instance", "tag:team"}


def test_csv_is_spreadsheet_friendly(
    client: TestClient, read_token: str, feeder: Feeder, story: dict[str, Any]
) -> None:
    """UTF-8 labels, plain numbers, ISO times, a formula-like label shown as text; streamed, not sized."""
    feeder.feed(
        [gpu(0)], start=story["start"], hours=1, fn=busy(1), instance_id="i-odd", tags={"team": "=cmd|' /C calc'!A0"}
    )
    feeder.feed([gpu(0)], start=story["start"], hours=1, fn=idle, instance_id="i-utf", tags={"team": "Zürich 研究"})
    r = get(client, read_token, window="24h", group_by="tag:team", format="csv")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/csv; charset=utf-8"
    assert "content-length" not in r.headers
    assert r.headers["content-disposition"].startswith('attachment; filename="gpufleet-report-')
    text = r.content.decode("utf-8")
    assert not text.startswith("\ufeff")
    table = list(csv.DictReader(io.StringIO(text)))
    teams = [t["tag:team"] for t in table]
    assert "Zürich 研究" in teams
    assert "'=cmd|' /C calc'!A0" in teams
    for t in table:
        assert datetime.fromisoformat(t["start"]) < datetime.fromisoformat(t["end"])
        assert "." not in t["end"], "whole seconds"
        for column in ("gpu_hours", "cost", "idle_cost", "unused_cost", "offline_h"):
            assert re.fullmatch(r"-?\d+(\.\d+)?", t[column]), (column, t[column])


def test_accept_header_chooses_the_format(client: TestClient, read_token: str) -> None:
    def kind(accept: str, **params: str) -> str:
        headers = {"Authorization": f"Bearer {read_token}", "Accept": accept}
        r = client.get(URL, params=params, headers=headers)
        assert r.status_code == 200
        return str(r.headers["content-type"]).split(";")[0]

    assert kind("text/csv") == "text/csv"
    assert kind("text/csv, */*;q=0.1") == "text/csv"
    assert kind("application/json;q=0.5, text/csv") == "text/csv"
    assert kind("text/csv;q=0.4, application/json") == "application/json"
    assert kind("text/csv, application/json") == "application/json"
    assert kind("text/html") == "application/json"
    assert kind("text/csv;q=oops") == "text/csv"
    assert kind("text/csv", format="json") == "application/json"


def test_a_window_older_than_the_rollups_is_refused(
    client: TestClient, read_token: str, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = datetime.now(UTC) - timedelta(days=settings.rollup_retention_days + 2)
    r = get(client, read_token, start=old.isoformat(), end=(old + timedelta(days=1)).isoformat())
    assert r.status_code == 400
    problem = r.json()["detail"][0]
    assert problem["field"] == "start"
    assert "go back to" in problem["message"] and "GPUFLEET_ROLLUP_RETENTION_DAYS=400" in problem["message"]

    state = client.app.state.gpufleet  # type: ignore[attr-defined]
    monkeypatch.setattr(state, "settings", settings.model_copy(update={"rollup_retention_days": 7}))
    assert get(client, read_token, window="7d").status_code == 200
    r = get(client, read_token, window="30d")
    assert r.status_code == 400
    assert r.json()["detail"][0]["field"] == "window"
    r = get(client, read_token)
    assert r.status_code == 200, "the default window, 7 days, is inside 7 days of retention"


def test_openapi_describes_parameters_responses_and_examples(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    op = schema["paths"][URL]["get"]
    params = {p["name"]: p for p in op["parameters"]}
    assert set(params) == {
        "start",
        "end",
        "window",
        "group_by",
        "region",
        "instance_type",
        "lifecycle",
        "tag",
        "format",
    }
    for p in params.values():
        assert p["in"] == "query" and p["description"] and "example" in p
    assert params["group_by"]["schema"]["type"] == "array" and params["group_by"]["explode"] is True
    ok = op["responses"]["200"]["content"]
    assert ok["application/json"]["schema"] == {"$ref": "#/components/schemas/ReportOut"}
    ReportOut.model_validate(ok["application/json"]["example"])
    example_csv = list(csv.DictReader(io.StringIO(ok["text/csv"]["example"])))
    assert example_csv[-1]["instance_type"] == "TOTAL"
    for code in ("400", "401", "403"):
        content = op["responses"][code]["content"]["application/json"]
        assert content["schema"] == {"$ref": "#/components/schemas/ErrorOut"}
        assert set(content["example"]) == {"error", "detail"}
    assert "ReportOut" in schema["components"]["schemas"]
    assert client.get("/docs").status_code == 200


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"start": "yesterday"}, "start"),
        ({"start": "2026-11-20T00:00:00Z", "end": "2026-11-19T00:00:00Z"}, "end"),
        ({"group_by": "colour"}, "group_by"),
        ({"group_by": "region,region"}, "group_by"),
        ({"format": "xml"}, "format"),
        ({"tag": "novalue"}, "tag"),
        ({"tag": ":value"}, "tag"),
        ({"group_by": "tag:"}, "group_by"),
        ({"group_by": ",".join(f"tag:k{i}" for i in range(9))}, "group_by"),
        ({"window": "2d"}, "window"),
        ({"window": "24h", "start": "2026-11-01"}, "window"),
        ({"end": "2026-11-01"}, "start"),
        ({"start": "2026-01-01", "end": "2027-06-01"}, "end"),
        ({"start": "0001-01-01T00:00:00+01:00"}, "start"),
        ({"start": "2026-11-01", "end": "9999-12-31T23:59:59"}, "end"),
        ({"lifecycle": "reserved"}, "lifecycle"),
    ],
)
def test_bad_parameters_are_400_naming_the_field(
    client: TestClient, read_token: str, params: dict[str, str], field: str
) -> None:
    r = get(client, read_token, **params)
    assert r.status_code == 400
    problem = r.json()["detail"][0]
    assert problem["field"] == field
    assert problem["message"]


def test_reading_needs_a_read_token(client: TestClient, ingest_token: str, read_token: str) -> None:
    assert client.get(URL).status_code == 401
    assert get(client, ingest_token).status_code == 403
    assert get(client, read_token).status_code == 200


def test_default_window_is_the_last_seven_days(client: TestClient, read_token: str) -> None:
    body = get(client, read_token).json()
    start = datetime.fromisoformat(body["start"])
    assert datetime.now(UTC) - start < timedelta(days=7, hours=1)
    assert datetime.now(UTC) - start > timedelta(days=6)


def test_capacity_of_unknown_size_is_unknown_not_zero(client: TestClient, read_token: str, feeder: Feeder) -> None:
    """A MIG GPU with an idle 3g slice, an idle slice of unknown size and 2 slices reported free: the report
    prices the 3g slice only, gives the rest as null figures, and says how many hours it left out."""
    start = feeder.t0
    g = gpu(0, mig=True, slices=[mig_slice(1, "3g.20gb"), unsized_slice(2)], unpartitioned=2)
    feeder.feed([g], start=start, hours=2, fn=idle, instance_id="i-mig")
    window = {"start": start.isoformat(), "end": (start + 2 * H).isoformat()}
    body = get(client, read_token, group_by="slice", **window).json()
    ReportOut.model_validate(body)
    rows = {row["group"]["slice"]: row for row in body["rows"]}
    sized = rows["i-mig GPU 0 3g.20gb (GI 1)"]
    assert sized["cost"] == pytest.approx(2 * 3 / 7 * P4D_PER_GPU_HOUR, abs=1e-5)
    for label, hours in (("i-mig GPU 0 unknown (GI 2)", "unsized_slice_hours"), ("i-mig GPU 0 unpartitioned", None)):
        row = rows[label]
        assert row["gpu_hours"] is row["cost"] is row["idle_cost"] is row["idle_h"] is None, label
        if hours:
            assert row[hours] == pytest.approx(2.0)
    assert rows["i-mig GPU 0 unpartitioned"]["free_unknown_hours"] == pytest.approx(2.0)
    totals = body["totals"]
    assert totals["cost"] == totals["idle_cost"] == pytest.approx(sized["cost"], abs=1e-5)
    assert totals["gpu_hours"] == pytest.approx(2 * 3 / 7)
    assert (totals["unsized_slice_hours"], totals["free_unknown_hours"]) == pytest.approx((2.0, 2.0))
    table = list(csv.DictReader(io.StringIO(get(client, read_token, group_by="slice", format="csv", **window).text)))
    unsized = next(t for t in table if t["slice"] == "i-mig GPU 0 unknown (GI 2)")
    assert unsized["gpu_hours"] == unsized["cost"] == ""


def test_report_by_holder_in_json_and_csv(client: TestClient, read_token: str, feeder: Feeder) -> None:
    story = holders_story(feeder)
    span = {"start": story["start"].isoformat(), "end": story["end"].isoformat()}
    body = get(client, read_token, **span, group_by="user").json()
    rows = {r["group"]["user"]: r for r in body["rows"]}
    assert set(rows) == {"ana", "root", "mchen", "(none)"}
    assert rows["ana"]["idle_held_cost"] == pytest.approx(P4D_PER_GPU_HOUR, abs=1e-5)
    assert rows["ana"]["avg_util_pct"] == pytest.approx(20.0)
    assert rows["(none)"]["idle_cost"] == pytest.approx(2 * P4D_PER_GPU_HOUR, abs=1e-5)
    assert sum(r["cost"] for r in body["rows"]) == pytest.approx(body["totals"]["cost"], abs=1e-5)

    both = get(client, read_token, **span, group_by=["namespace", "instance_type"]).json()
    assert {(r["group"]["namespace"], r["group"]["instance_type"]) for r in both["rows"]} == {
        ("inference", "p4d.24xlarge"),
        ("(no namespace)", "p4d.24xlarge"),
        ("(no namespace)", "g5.xlarge"),
        ("(none)", "p4d.24xlarge"),
    }

    text = get(client, read_token, **span, group_by="job", format="csv").text
    table = list(csv.DictReader(io.StringIO(text)))
    jobs = {r["job"]: r for r in table}
    assert set(jobs) == {"48213", "(no job)", "(none)", "TOTAL"}
    assert float(jobs["48213"]["avg_util_pct"]) == pytest.approx(40.0)
