"""The CUR 2.0 reader: which lines it keeps, what each instance-hour costs, and the one-line error of a bad file."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from app.billing.cur import BilledHour, CurError, CurReader, is_gpu_instance_type
from app.billing.cur_writer import (
    CurLine,
    capacity_block_fee_line,
    capacity_reservation_arn,
    cur_table,
    instance_hour_lines,
    unused_capacity_line,
    write_cur,
)
from tests.app.billing.cur_lines import BLOCK, DROPPED, EXPECTED, H0, NOV, PAYER, month_lines


def read(*files: Path, batch_rows: int = 65_536) -> dict[tuple[str, datetime], BilledHour]:
    reader = CurReader(batch_rows=batch_rows)
    for f in files:
        reader.read(f, f.name)
    return {(h.instance_id, h.hour): h for hours in reader.billed().hours.values() for h in hours}


def test_each_purchase_is_priced_as_the_bill_says(tmp_path: Path) -> None:
    path = write_cur(tmp_path / "nov.parquet", month_lines(hours=2))
    reader = CurReader()
    assert reader.read(path, "nov") == {(PAYER, NOV)}
    billed = reader.billed()
    hours = {(h.instance_id, h.hour): h for h in billed.hours[(PAYER, NOV)]}
    assert {iid for iid, _ in hours} == set(EXPECTED)
    assert not {iid for iid, _ in hours} & set(DROPPED)
    for (iid, hour), h in hours.items():
        e = EXPECTED[iid]
        assert hour in (H0, H0 + timedelta(hours=1)) and h.hour.tzinfo is UTC
        assert (h.purchase, h.usd, h.usage_h) == (e.purchase, e.usd_per_hour, 1.0), iid
        assert (h.reservation_id, h.reservation_kind) == (e.reservation_id, e.reservation_kind), iid
        assert (h.instance_type, h.region, h.availability_zone) == (e.instance_type, "us-east-1", "us-east-1a")
        assert (h.payer_account, h.billing_period, h.usage_account) == (PAYER, NOV, PAYER)
    # One line per instance-hour kept; the Savings Plan negation, fee, unused capacity and tax are not.
    assert billed.lines == {(PAYER, NOV): 2 * len(EXPECTED)}
    assert billed.warnings == {}


def test_net_costs_win_where_they_have_a_value(tmp_path: Path) -> None:
    od = instance_hour_lines("i-0a", "g6.xlarge", H0, purchase="on-demand", usd=0.8)
    sp = instance_hour_lines("i-0b", "g6.xlarge", H0, purchase="savings plan", usd=0.5, on_demand_usd=0.8)
    ri = instance_hour_lines("i-0c", "g6.xlarge", H0, purchase="reserved", usd=0.4)
    lines = [
        replace(od[0], net_unblended_cost=0.72),
        replace(sp[0], savings_plan_net_effective_cost=0.45),
        sp[1],
        replace(ri[0], reservation_net_effective_cost=0.36),
        *instance_hour_lines("i-0d", "g6.xlarge", H0, purchase="on-demand", usd=0.8),  # net column NULL
    ]
    hours = read(write_cur(tmp_path / "f.parquet", lines))
    assert {iid: h.usd for (iid, _), h in hours.items()} == {"i-0a": 0.72, "i-0b": 0.45, "i-0c": 0.36, "i-0d": 0.8}


def test_an_hour_of_several_lines_is_summed_and_bought_as_most_of_it(tmp_path: Path) -> None:
    spot = instance_hour_lines("i-0a", "g5.xlarge", H0, purchase="spot", usd=0.125, hours=0.25)
    od = instance_hour_lines("i-0a", "g5.xlarge", H0, purchase="on-demand", usd=0.75, hours=0.75)
    h = read(write_cur(tmp_path / "f.parquet", spot + od))[("i-0a", H0)]
    assert (h.usage_h, h.usd, h.purchase) == (1.0, 0.875, "on-demand")


def test_a_savings_plan_negation_is_not_counted_even_when_it_names_the_instance(tmp_path: Path) -> None:
    covered, negation = instance_hour_lines("i-0a", "p5.48xlarge", H0, purchase="savings plan", usd=60.0,
                                            on_demand_usd=98.32)  # fmt: skip
    hours = read(write_cur(tmp_path / "f.parquet", [covered, replace(negation, resource_id="i-0a")]))
    assert hours[("i-0a", H0)].usd == 60.0


def test_a_capacity_block_fee_is_spread_over_its_hours_across_months(tmp_path: Path) -> None:
    arn = capacity_reservation_arn(BLOCK)
    last = datetime(2026, 10, 31, 23, tzinfo=UTC)
    oct_lines = [
        capacity_block_fee_line(arn, "p5.48xlarge", last - timedelta(days=2), usd=300.0),
        *instance_hour_lines("i-0a", "p5.48xlarge", last, purchase="capacity block", usd=0.0, reservation_arn=arn),
    ]
    nov_lines = [
        *instance_hour_lines("i-0a", "p5.48xlarge", H0, purchase="capacity block", usd=0.0, reservation_arn=arn),
        unused_capacity_line(arn, "p5.48xlarge", H0, hours=1.0, usd=0.0, block=True),
    ]
    hours = read(write_cur(tmp_path / "oct.parquet", oct_lines), write_cur(tmp_path / "nov.parquet", nov_lines))
    assert [hours[("i-0a", last)].usd, hours[("i-0a", H0)].usd] == [100.0, 100.0]

    # Without the fee (bought in a month not read) the hours keep their billed cost, and the import says so.
    reader = CurReader()
    reader.read(tmp_path / "nov.parquet", "nov")
    billed = reader.billed()
    assert [h.usd for h in billed.hours[(PAYER, NOV)]] == [0.0]
    assert billed.warnings[(PAYER, NOV)] == [
        f"Capacity Block {BLOCK}: 1 instance-hours with no upfront fee in the files read to price them from; "
        "kept at their billed cost"
    ]


def test_gpu_instance_types() -> None:
    assert all(map(is_gpu_instance_type, ["p5.48xlarge", "g4ad.xlarge", "p6-b200.48xlarge", "gr6.4xlarge"]))
    assert not any(map(is_gpu_instance_type, ["m5.large", "inf2.xlarge", "trn1.32xlarge", "c7g.large", "p5"]))


def test_reads_batch_by_batch(tmp_path: Path) -> None:
    lines = month_lines(hours=30)
    one = read(write_cur(tmp_path / "one.parquet", lines))
    many = read(write_cur(tmp_path / "many.parquet", lines, row_group_size=50), batch_rows=16)
    assert one == many and len(one) == 30 * len(EXPECTED)


def test_zoned_timestamps_numeric_account_ids_and_dictionaries_are_read(tmp_path: Path) -> None:
    table = cur_table(instance_hour_lines("i-0a", "g5.xlarge", H0, purchase="on-demand", usd=1.0))
    for name in ("bill_billing_period_start_date", "line_item_usage_start_date", "line_item_usage_end_date"):
        table = table.set_column(
            table.schema.get_field_index(name), name, table[name].cast(pa.timestamp("us", tz="UTC"))
        )
    account = table.schema.get_field_index("bill_payer_account_id")
    table = table.set_column(account, "bill_payer_account_id", pa.array([12345678901], pa.int64()))
    usage = table.schema.get_field_index("line_item_usage_type")
    table = table.set_column(usage, "line_item_usage_type", table["line_item_usage_type"].dictionary_encode())
    pq.write_table(table, tmp_path / "f.parquet")
    h = read(tmp_path / "f.parquet")[("i-0a", H0)]
    assert (h.payer_account, h.usd) == ("012345678901", 1.0)


def _legacy(path: Path) -> None:
    """A legacy CUR in Parquet: the same line item names, but a column per product attribute and per tag."""
    table = cur_table(month_lines(hours=1)).drop_columns(["product", "resource_tags", "cost_category", "discount"])
    pq.write_table(table.append_column("resource_tags_user_team", pa.nulls(table.num_rows, pa.string())), path)


def _truncated(path: Path) -> None:
    write_cur(path, month_lines(hours=3))
    path.write_bytes(path.read_bytes()[:-300])


def _daily(path: Path) -> None:
    day = datetime(2026, 11, 3, tzinfo=UTC)
    lines = instance_hour_lines("i-0a", "p5.48xlarge", day, purchase="on-demand", usd=2359.68, hours=24.0)
    write_cur(path, [replace(line, end=day + timedelta(days=1)) for line in lines])


def _text_costs(path: Path) -> None:
    table = cur_table(month_lines(hours=1))
    at = table.schema.get_field_index("line_item_unblended_cost")
    pq.write_table(table.set_column(at, "line_item_unblended_cost", table[at].cast(pa.string())), path)


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda p: p.write_text("identity_line_item_id,line_item_usage_start_date\n"), "not a Parquet file"),
        (_truncated, "truncated or damaged Parquet file ("),
        (_legacy, "a legacy Cost and Usage Report, not CUR 2.0 (no map column `product`)"),
        (
            lambda p: write_cur(p, month_lines(hours=1), omit=["line_item_resource_id"]),
            "not a CUR 2.0 export with the columns gpufleet needs: no line_item_resource_id (turn on 'Include "
            "resource IDs' in the export)",
        ),
        (
            lambda p: write_cur(p, month_lines(hours=1), omit=["pricing_term", "reservation_effective_cost"]),
            "not a CUR 2.0 export with the columns gpufleet needs: no pricing_term, reservation_effective_cost",
        ),
        (
            _daily,
            "the line of i-0a from 2026-11-03 00:00 UTC bills 24 h: gpufleet needs an hourly export "
            "(time granularity: Hourly)",
        ),
        (_text_costs, "column line_item_unblended_cost is of type string, not a number"),
    ],
    ids=["not-parquet", "truncated", "legacy", "no-resource-ids", "missing-columns", "daily", "text-costs"],
)
def test_a_bad_file_is_one_line_naming_it(tmp_path: Path, make: object, problem: str) -> None:
    path = tmp_path / "export-00001.snappy.parquet"
    make(path)  # type: ignore[operator]
    with pytest.raises(CurError) as caught:
        CurReader().read(path, str(path))
    message = str(caught.value)
    assert message.startswith(f"{path}: {problem}")
    assert "\n" not in message and caught.value.name == str(path)


def test_a_month_long_line_that_is_not_instance_usage_is_no_granularity_problem(tmp_path: Path) -> None:
    tax = CurLine(start=datetime(2026, 11, 1, tzinfo=UTC), end=datetime(2026, 12, 1, tzinfo=UTC), line_item_type="Tax")
    hours = read(write_cur(tmp_path / "f.parquet", [tax, *month_lines(hours=1)]))
    assert len(hours) == len(EXPECTED)
