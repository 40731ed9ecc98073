"""Query parameters: windows, filters, groupings, a page's table order, the heatmap's rows; one error type."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from starlette.datastructures import QueryParams

from app.params import MAX_GROUPINGS, BadParameter, page_query, parse_filters, parse_group_by, parse_window

NOW = datetime(2026, 11, 21, 14, 25, 10, tzinfo=UTC)


@pytest.mark.parametrize(
    ("window", "start", "end", "param"),
    [
        ("2w", None, None, "window"),
        (None, "yesterday", None, "start"),
        (None, "2026-11-20T00:00:00Z", "2026-11-19T00:00:00Z", "end"),
        (None, None, "2026-11-19T00:00:00Z", "start"),
        ("24h", "2026-11-20T00:00:00Z", None, "window"),
        (None, "2024-01-01T00:00:00Z", None, "end"),
        # Times at the ends of the calendar, which rounding to whole hours would push past it.
        (None, "0001-01-01T00:30:00+01:00", None, "start"),
        (None, "9999-12-31T22:00:00Z", "9999-12-31T23:30:00Z", "start"),
        (None, "9999-12-29T00:00:00Z", "9999-12-31T23:30:00Z", "end"),
    ],
)
def test_bad_windows_name_the_parameter(window: str | None, start: str | None, end: str | None, param: str) -> None:
    with pytest.raises(BadParameter) as err:
        parse_window(window, start, end, now=NOW)
    assert err.value.param == param


def test_naive_times_are_utc() -> None:
    w = parse_window(None, "2026-11-20T10:00", None, now=NOW)
    assert w.start == datetime(2026, 11, 20, 10, tzinfo=UTC)
    assert w.end == datetime(2026, 11, 21, 15, tzinfo=UTC)


def test_filters() -> None:
    f = parse_filters(region=["us-east-1", "", "us-east-1"], lifecycle=["spot"], tag=["team:ml", "env=prod"])
    assert f.regions == ("us-east-1",)
    assert f.tags == (("team", "ml"), ("env", "prod"))
    assert f.match(region="us-east-1", instance_type="x", lifecycle="spot", tags={"team": "ml", "env": "prod"})
    assert not f.match(region="us-east-1", instance_type="x", lifecycle="spot", tags={"team": "ml"})
    with pytest.raises(BadParameter, match="lifecycle"):
        parse_filters(lifecycle=["reserved"])
    with pytest.raises(BadParameter, match="tag"):
        parse_filters(tag=["novalue"])
    assert parse_window("24h", None, None, now=NOW).now - NOW == timedelta(0)


def test_group_by_names() -> None:
    assert parse_group_by([]) == ["instance_type"]
    assert parse_group_by(["region, tag:team", "instance"]) == ["region", "tag:team", "instance"]
    for bad in (["colour"], ["tag:"], ["region", "region"], [",".join(f"tag:k{i}" for i in range(MAX_GROUPINGS + 1))]):
        with pytest.raises(BadParameter) as exc:
            parse_group_by(bad)
        assert exc.value.param == "group_by"


def test_page_query_reads_what_the_page_takes() -> None:
    q = page_query(QueryParams("window=7d&sort=waste&dir=asc&page=3&tag=team:a"), now=NOW)
    assert (q.window.label, q.sort, q.dir, q.page, q.filters.tags) == ("7d", "waste", "asc", 3, (("team", "a"),))
    # group_by and rows count only on the pages that take them.
    assert page_query(QueryParams("group_by=nope&rows=nope"), now=NOW).group_by == "instance_type"
    heat = page_query(QueryParams("rows=tag:team"), now=NOW, default_window="7d", rows=True)
    assert heat.rows == "tag:team" and heat.window.label == "7d"
    assert page_query(QueryParams("group_by=tag:team"), now=NOW, group_by=True).group_by == "tag:team"


@pytest.mark.parametrize(
    ("query", "param", "options"),
    [
        ("dir=sideways", "dir", {}),
        ("page=0", "page", {}),
        ("page=x", "page", {}),
        ("window=2w", "window", {}),
        ("lifecycle=reserved", "lifecycle", {}),
        ("group_by=colour", "group_by", {"group_by": True}),
        ("group_by=region,instance", "group_by", {"group_by": True}),
        ("rows=rack", "rows", {"rows": True}),
        ("rows=tag:", "rows", {"rows": True}),
    ],
)
def test_a_bad_page_parameter_is_named(query: str, param: str, options: dict[str, bool]) -> None:
    with pytest.raises(BadParameter) as err:
        page_query(QueryParams(query), now=NOW, **options)
    assert err.value.param == param
