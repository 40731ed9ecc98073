"""bench/compare.py: an earlier result line against a new one, old result formats included."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.compare import Change, against, changes, last_json, summary, table
from bench.harness import BenchError


def figures(p95: float, status: int = 200) -> dict[str, object]:
    return {"p50_ms": p95 / 2, "p95_ms": p95, "bytes": 1000, "status": status}


def test_last_json_is_the_last_object_line(tmp_path: Path) -> None:
    out = tmp_path / "run.txt"
    out.write_text('bench: starting\n{"runs": 1}\nbench: done\n42\n{"runs": 2}\nnot json {\n')
    assert last_json(out) == {"runs": 2}


def test_last_json_without_a_result_fails(tmp_path: Path) -> None:
    out = tmp_path / "run.txt"
    out.write_text("bench: failed: no database\n")
    with pytest.raises(BenchError, match="no result line"):
        last_json(out)
    with pytest.raises(BenchError, match="cannot read"):
        last_json(tmp_path / "missing.txt")


def test_an_old_result_with_pages_and_fragments_only() -> None:
    old = {"pages": {"/?window=24h": figures(20.0)}, "fragments": {"/?window=24h": figures(10.0)}}
    new = {
        "pages": {"/?window=24h": figures(21.0), "/heatmap?window=7d": figures(30.0)},
        "fragments": {"/?window=24h": figures(30.0)},
        "json": {"/?window=24h": figures(5.0)},
    }
    found = changes(old, new)
    assert [(c.url, c.way) for c in found] == [("/?window=24h", "page"), ("/?window=24h", "fragment")]
    assert found[1].ratio == 3.0
    assert [c.slower for c in found] == [False, True]


@pytest.mark.parametrize(
    ("old", "new", "slower"),
    [
        (100.0, 111.0, True),  # 11 % and 11 ms
        (100.0, 109.0, False),  # 9 ms but only 9 %
        (20.0, 24.0, False),  # 20 % but only 4 ms
        (20.0, 26.0, True),
        (50.0, 30.0, False),
    ],
)
def test_slower_means_ten_percent_and_five_ms(old: float, new: float, slower: bool) -> None:
    assert Change("/", "page", old, new, 200, 200).slower is slower


def test_a_changed_status_is_not_slower() -> None:
    change = Change("/heatmap?window=7d", "page", 2.0, 80.0, 404, 200)
    assert not change.slower
    assert "status 404 -> 200" in table([change])


def test_summary_names_each_slower_url_once(tmp_path: Path) -> None:
    found = [
        Change("/mig?window=24h", "page", 10.0, 30.0, 200, 200),
        Change("/mig?window=24h", "json", 10.0, 30.0, 200, 200),
        Change("/waste?window=24h", "page", 10.0, 10.5, 200, 200),
    ]
    result = summary(found, tmp_path / "old.txt")
    assert result["slower"] == ["/mig?window=24h"]
    assert result["compared"] == 3
    assert [w["way"] for w in result["slower_ways"]] == ["page", "json"]


def test_against_prints_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = {"reports": {"30d instance json": figures(100.0)}}
    new = {"reports": {"30d instance json": figures(150.0)}}
    assert against(tmp_path / "old.txt", old, new)["slower"] == ["30d instance json"]
    err = capsys.readouterr().err
    assert "old p95 ms" in err and "30d instance json" in err and "slower" in err
