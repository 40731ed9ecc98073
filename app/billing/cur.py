"""Reads Cost and Usage Report 2.0 Parquet files (AWS Data Exports): the EC2 instance-hours of GPU instance types
and what each cost, summed per instance and UTC hour (docs/billing.md).

Column meanings are those of the CUR 2.0 table dictionary (https://docs.aws.amazon.com/cur/latest/userguide/
table-dictionary-cur2.html); line item types those of the line item columns (.../userguide/Lineitem-columns.html)
and of the Savings Plans lines (.../userguide/cur-sp.html).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache, reduce
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..pricing.catalog import load_catalog
from .tables import PURCHASES

REQUIRED_COLUMNS = (
    "bill_payer_account_id", "bill_billing_period_start_date", "line_item_usage_account_id", "line_item_line_item_type",
    "line_item_product_code", "line_item_usage_type", "line_item_resource_id", "line_item_usage_start_date",
    "line_item_usage_end_date", "line_item_usage_amount", "line_item_unblended_cost", "line_item_availability_zone",
    "product_instance_type", "product_region_code", "pricing_term", "savings_plan_savings_plan_effective_cost",
    "reservation_effective_cost",
)  # fmt: skip
# The net variants have values when the account has discounts (EDP, private pricing): used wherever they do.
NET = {
    "line_item_unblended_cost": "line_item_net_unblended_cost",
    "savings_plan_savings_plan_effective_cost": "savings_plan_net_savings_plan_effective_cost",
    "reservation_effective_cost": "reservation_net_effective_cost",
}
# The capacity reservation columns are there when the export includes capacity reservation data.
OPTIONAL_COLUMNS = (
    *NET.values(), "capacity_reservation_capacity_reservation_arn", "capacity_reservation_capacity_reservation_status",
    "capacity_reservation_capacity_reservation_type",
)  # fmt: skip
_TIMES = ("bill_billing_period_start_date", "line_item_usage_start_date", "line_item_usage_end_date")
_NUMBERS = tuple(c for c in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS) if c.endswith(("_cost", "_amount")))

GPU_FAMILIES = (
    *("p2", "p3", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en", "p6", "p6e"),
    *("g3", "g3s", "g4dn", "g4ad", "g5", "g5g", "g6", "g6e", "g6f", "gr6", "gr6f"),
)
"""EC2 GPU families, for types the shipped catalog lacks: `p6-b200.48xlarge` is of family p6."""
GPU_TYPE = rf"^({'|'.join(GPU_FAMILIES)})(-[a-z0-9]+)?\.[a-z0-9]+$"

# Usage lines of running instances; usage types carry a region prefix outside us-east-1 (`USE2-BoxUsage:p5.48xlarge`).
USAGE_LINES = ("Usage", "DiscountedUsage", "SavingsPlanCoveredUsage")
INSTANCE_USAGE = r"^([A-Za-z0-9]+-)?(BoxUsage|SpotUsage|DedicatedUsage|HostBoxUsage|SchedUsage|CapacityBlockUsage)(:|$)"
_HOUR = timedelta(hours=1)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

Export = tuple[str, date]
"""(payer account, first day of the billing period): one export of one month."""


class CurError(Exception):
    """A file that is not a usable CUR 2.0 export. `str()` is one line: the file, then the problem."""

    def __init__(self, name: str, problem: str) -> None:
        self.name = name
        self.problem = problem
        super().__init__(f"{name}: {problem}")


@dataclass(frozen=True)
class BilledHour:
    """One instance's billed UTC hour: `usage_h` instance-hours (h) that cost `usd` (USD) in all."""

    instance_id: str
    hour: datetime
    payer_account: str
    billing_period: date
    usage_account: str | None
    instance_type: str
    region: str | None
    availability_zone: str | None
    purchase: str
    usage_h: float
    usd: float
    reservation_id: str | None
    reservation_kind: str | None


@dataclass
class Billed:
    """What the files read bill, per export: its instance-hours, the CUR lines they came from, and warnings."""

    hours: dict[Export, list[BilledHour]]
    lines: dict[Export, int]
    warnings: dict[Export, list[str]]
    pricing: dict[Export, list[str]]  # the Capacity Block rates its hours were priced at: "<block> <fee>/<hours>"


@dataclass(slots=True)
class _Hour:
    export: Export
    usage_account: str | None
    instance_type: str
    region: str | None
    availability_zone: str | None
    purchase: str  # of the first line; `mix` has the hours of each once a second purchase shows
    usage_h: float = 0.0
    usd: float = 0.0
    block_h: float = 0.0  # of usage_h, in a Capacity Block: priced from its upfront fee
    reservation_id: str | None = None
    reservation_kind: str | None = None
    mix: dict[str, float] | None = None


@lru_cache(maxsize=1)
def _catalog_types() -> pa.Array:
    return pa.array(sorted(load_catalog()), pa.string())


def is_gpu_instance_type(name: str) -> bool:
    """A type of the shipped catalog, or of a known EC2 GPU family."""
    return name in load_catalog() or re.match(GPU_TYPE, name) is not None


def _reservation_id(arn: str | None) -> str | None:
    """`cr-0abc` from `arn:aws:ec2:<region>:<account>:capacity-reservation/cr-0abc`, or from the id itself."""
    return arn.rsplit("/", 1)[-1] if arn else None


def _and(*masks: pa.Array) -> pa.Array:
    """True where every mask is; NULL counts as false."""
    return pc.fill_null(reduce(pc.and_kleene, masks), False)


def _account(column: pa.Array) -> pa.Array:
    """Account ids as text; a 12-digit id read as a number gets its leading zeros back."""
    if pa.types.is_integer(column.type):
        return pc.utf8_lpad(column.cast(pa.string()), width=12, padding="0")
    return column.cast(pa.string())


class CurReader:
    """Reads CUR 2.0 files one after another and sums their GPU instance-hours; `billed()` gives the result."""

    def __init__(self, batch_rows: int = 65_536) -> None:
        self.batch_rows = batch_rows
        self._hours: dict[tuple[str, int], _Hour] = {}  # by instance and hour (POSIX microseconds)
        self._lines: dict[Export, int] = defaultdict(int)
        self._warnings: dict[Export, list[str]] = defaultdict(list)
        self._fees: dict[tuple[str, str], float] = defaultdict(float)  # (payer, block): upfront fee, USD
        self._fee_export: dict[tuple[str, str], Export] = {}
        self._unused: dict[tuple[str, str], float] = defaultdict(float)  # (payer, block): idle instance-hours, h

    def read(self, path: Path, name: str) -> frozenset[Export]:
        """Check one file and add its lines; returns the exports it has lines of. `name` is how messages call it."""
        try:
            with path.open("rb") as f:
                head = f.read(4)
        except OSError as exc:
            raise CurError(name, exc.strerror or str(exc)) from exc
        if head != b"PAR1":
            raise CurError(name, "not a Parquet file")
        exports: set[Export] = set()
        try:
            parquet = pq.ParquetFile(path)
            columns = _check_schema(name, parquet.schema_arrow)
            for batch in parquet.iter_batches(batch_size=self.batch_rows, columns=columns):
                self._batch(_Batch(name, batch), exports)
        except (pa.ArrowException, OSError) as exc:
            first = (str(exc).strip() or type(exc).__name__).splitlines()[0]
            raise CurError(name, f"truncated or damaged Parquet file ({first})") from exc
        return frozenset(exports)

    def _batch(self, b: _Batch, exports: set[Export]) -> None:
        payer = _account(b.get("bill_payer_account_id"))
        period = b.times("bill_billing_period_start_date")
        pairs = pa.table({"p": payer, "d": period}).group_by(["p", "d"]).aggregate([])
        found = zip(pairs["p"].to_pylist(), pairs["d"].to_pylist(), strict=True)
        exports.update((p, d.date()) for p, d in found if p and d)

        # A line without payer, period or start cannot be placed: taken as not EC2.
        start = b.times("line_item_usage_start_date")
        placed = (pc.is_valid(payer), pc.is_valid(period), pc.is_valid(start))
        ec2 = _and(pc.equal(b.get("line_item_product_code"), "AmazonEC2"), *placed)
        usage_type = b.get("line_item_usage_type")
        instance = _and(
            ec2,
            pc.starts_with(b.get("line_item_resource_id"), "i-"),
            pc.is_in(b.get("line_item_line_item_type"), pa.array(USAGE_LINES)),
            pc.match_substring_regex(usage_type, INSTANCE_USAGE),
        )
        if pc.any(instance).as_py():
            _check_hourly(b, instance, start, b.times("line_item_usage_end_date"))
            named = b.get("product_instance_type")
            itype = pc.if_else(
                _and(pc.not_equal(named, "")), named, pc.replace_substring_regex(usage_type, "^[^:]*:", "")
            )
            gpu = pc.or_kleene(pc.is_in(itype, _catalog_types()), pc.match_substring_regex(itype, GPU_TYPE))
            keep = _and(instance, gpu)
            if pc.any(keep).as_py():
                self._keep(b, keep, payer, period, start, itype)
        self._reservations(b, ec2, payer, period)

    def _keep(
        self, b: _Batch, keep: pa.Array, payer: pa.Array, period: pa.Array, start: pa.Array, itype: pa.Array
    ) -> None:
        columns = {
            "payer": payer,
            "period": period.cast(pa.date32()),
            "hour": pc.floor_temporal(start, unit="hour").cast(pa.int64()),
            "itype": itype,
            "instance": b.get("line_item_resource_id"),
            "account": _account(b.get("line_item_usage_account_id")),
            "line_type": b.get("line_item_line_item_type"),
            "usage_type": b.get("line_item_usage_type"),
            "term": b.get("pricing_term"),
            "region": b.get("product_region_code"),
            "zone": b.get("line_item_availability_zone"),
            "amount": b.number("line_item_usage_amount"),
            "cost": b.net("line_item_unblended_cost"),
            "sp": b.net("savings_plan_savings_plan_effective_cost"),
            "ri": b.net("reservation_effective_cost"),
            "cr_arn": b.get("capacity_reservation_capacity_reservation_arn"),
            "cr_type": b.get("capacity_reservation_capacity_reservation_type"),
        }
        kept = pa.table(columns).filter(keep)
        rows = zip(*(kept[c].to_pylist() for c in columns), strict=True)
        for p, d, hour, itype, iid, account, lt, ut, term, region, zone, amount, cost, sp, ri, arn, cr_type in rows:
            export = (p, d)
            if lt == "SavingsPlanCoveredUsage":
                usd, purchase = sp, "savings plan"  # the negation line offsets the unblended cost: not read
            elif lt == "DiscountedUsage":
                usd, purchase = ri, "reserved"
            else:
                usd, purchase = cost, None
            # The dictionary names two kinds: On-Demand Capacity Reservations and Capacity Blocks for ML.
            block = "block" in (cr_type or "").lower() if arn else "CapacityBlock" in ut
            kind = "capacity block" if block else "capacity reservation" if arn else None
            if purchase is None:
                spot = term == "Spot" or "SpotUsage" in ut
                purchase = "spot" if spot else kind or "on-demand"
            amount = amount or 0.0
            acc = self._hours.get((iid, hour))
            if acc is None:
                acc = self._hours[(iid, hour)] = _Hour(export, account, itype, region, zone, purchase)
            elif acc.mix is not None or purchase != acc.purchase:
                if acc.mix is None:
                    acc.mix = {acc.purchase: acc.usage_h}
                acc.mix[purchase] = acc.mix.get(purchase, 0.0) + amount
            acc.usage_h += amount
            acc.usd += usd or 0.0
            if kind is not None:
                acc.reservation_id = _reservation_id(arn) or acc.reservation_id
                acc.reservation_kind = kind
                if kind == "capacity block":
                    acc.block_h += amount
            self._lines[export] += 1

    def _reservations(self, b: _Batch, ec2: pa.Array, payer: pa.Array, period: pa.Array) -> None:
        """Capacity Block upfront fees, and the block hours no instance ran in: the fee is spread over both."""
        line_type, usage_type = b.get("line_item_line_item_type"), b.get("line_item_usage_type")
        fee = _and(ec2, pc.match_substring(usage_type, "CapacityBlockFee"), pc.not_equal(line_type, "Tax"))
        status = pc.utf8_lower(b.get("capacity_reservation_capacity_reservation_status"))
        block = pc.match_substring(pc.utf8_lower(b.get("capacity_reservation_capacity_reservation_type")), "block")
        unused = _and(ec2, pc.equal(status, "unused"), block)
        wanted = pc.or_(fee, unused)
        if not pc.any(wanted).as_py():
            return
        columns = {
            "payer": payer,
            "period": period,
            "fee": fee,
            "arn": pc.coalesce(b.get("capacity_reservation_capacity_reservation_arn"), b.get("line_item_resource_id")),
            "cost": b.net("line_item_unblended_cost"),
            "amount": b.number("line_item_usage_amount"),
        }
        kept = pa.table(columns).filter(wanted)
        for p, d, is_fee, arn, cost, amount in zip(*(kept[c].to_pylist() for c in columns), strict=True):
            rid = _reservation_id(arn)
            if rid is None:
                if is_fee:
                    self._warnings[(p, d.date())].append(f"a Capacity Block fee of ${cost or 0:,.2f} names no block")
            elif is_fee:
                self._fees[(p, rid)] += cost or 0.0
                self._fee_export.setdefault((p, rid), (p, d.date()))
            else:
                self._unused[(p, rid)] += amount or 0.0

    def billed(self) -> Billed:
        """The instance-hours of every export read. A Capacity Block's hours cost its upfront fee divided by the
        block's instance-hours (used and unused) in the files read, on top of what the bill says they cost."""
        block_h: dict[tuple[str, str], float] = defaultdict(float, self._unused)
        for acc in self._hours.values():
            if acc.block_h and acc.reservation_id:
                block_h[(acc.export[0], acc.reservation_id)] += acc.block_h
        rates: dict[tuple[str, str], tuple[float, str]] = {}  # USD/h, and how it was worked out
        pricing: dict[Export, set[str]] = defaultdict(set)
        warnings = defaultdict(list, {k: list(v) for k, v in self._warnings.items()})
        for key, fee in self._fees.items():
            if block_h.get(key, 0.0) > 0:
                rates[key] = (fee / block_h[key], f"{key[1]} {fee!r}/{block_h[key]!r}")
            else:
                warnings[self._fee_export[key]].append(
                    f"Capacity Block {key[1]}: upfront fee ${fee:,.2f} but none of its hours in the files read"
                )
        unpriced: dict[tuple[Export, str], float] = defaultdict(float)
        hours: dict[Export, list[BilledHour]] = defaultdict(list)
        for (iid, hour), acc in self._hours.items():
            usd = acc.usd
            if acc.block_h:
                rate = rates.get((acc.export[0], acc.reservation_id or ""))
                if rate is None:
                    unpriced[(acc.export, acc.reservation_id or "without a reservation id")] += acc.block_h
                else:
                    usd += acc.block_h * rate[0]
                    pricing[acc.export].add(rate[1])
            purchase = acc.purchase
            if acc.mix is not None:
                purchase = max(acc.mix.items(), key=lambda kv: (kv[1], -PURCHASES.index(kv[0])))[0]
            payer, period = acc.export
            hours[acc.export].append(
                BilledHour(
                    iid, EPOCH + timedelta(microseconds=hour), payer, period, acc.usage_account, acc.instance_type,
                    acc.region, acc.availability_zone, purchase, acc.usage_h, usd, acc.reservation_id,
                    acc.reservation_kind,
                )
            )  # fmt: skip
        for (export, rid), h in sorted(unpriced.items()):
            warnings[export].append(
                f"Capacity Block {rid}: {h:,.4g} instance-hours with no upfront fee in the files read to price them "
                "from; kept at their billed cost"
            )
        exports = set(hours) | set(self._lines) | set(warnings)
        return Billed(
            hours={e: hours.get(e, []) for e in exports},
            lines={e: self._lines.get(e, 0) for e in exports},
            warnings={e: warnings[e] for e in exports if warnings.get(e)},
            pricing={e: sorted(p) for e, p in pricing.items()},
        )


class _Batch:
    """One batch of a file: columns by name (absent optional ones read as NULL), converted with errors that name
    the file."""

    def __init__(self, name: str, batch: pa.RecordBatch) -> None:
        self.name = name
        self.batch = batch

    def get(self, column: str) -> pa.Array:
        if column not in self.batch.schema.names:
            return pa.nulls(self.batch.num_rows, pa.string())
        values = self.batch.column(column)
        return values.dictionary_decode() if pa.types.is_dictionary(values.type) else values

    def number(self, column: str) -> pa.Array:
        if column not in self.batch.schema.names:
            return pa.nulls(self.batch.num_rows, pa.float64())
        return self.batch.column(column).cast(pa.float64())

    def net(self, column: str) -> pa.Array:
        """The net variant of a cost column where it has a value (it includes discounts), else the column."""
        return pc.coalesce(self.number(NET[column]), self.number(column))

    def times(self, column: str) -> pa.Array:
        """UTC times, microseconds, without a zone: from timestamps of any unit and zone (none means UTC), dates,
        epoch milliseconds or ISO 8601 text."""
        values = self.batch.column(column)
        try:
            if pa.types.is_integer(values.type):
                values = values.cast(pa.int64()).cast(pa.timestamp("ms"))
            elif pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
                values = values.cast(pa.timestamp("us", tz="UTC"))
            return values.cast(pa.timestamp("us"))
        except pa.ArrowInvalid as exc:
            raise CurError(self.name, f"column {column}: {str(exc).splitlines()[0]}") from exc


def _check_schema(name: str, schema: pa.Schema) -> list[str]:
    """The columns to read, or CurError: a legacy CUR, a missing column, a column of the wrong type."""
    names = set(schema.names)
    product = schema.field("product").type if "product" in names else None
    # CUR 2.0 has a fixed schema where `product` is a map; the legacy CUR gives each product attribute and each
    # tag a column of its own ("Migrating from CUR to Data Exports CUR 2.0", dataexports-migrate.html).
    map_typed = product is not None and (pa.types.is_map(product) or pa.types.is_list(product))
    if not map_typed and any(n.startswith(("line_item_", "lineItem/", "identity_", "bill_")) for n in names):
        raise CurError(
            name,
            "a legacy Cost and Usage Report, not CUR 2.0 (no map column `product`): "
            "create a CUR 2.0 export in AWS Data Exports (docs/billing.md)",
        )
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        hint = " (turn on 'Include resource IDs' in the export)" if "line_item_resource_id" in missing else ""
        raise CurError(name, f"not a CUR 2.0 export with the columns gpufleet needs: no {', '.join(missing)}{hint}")
    for column in (c for c in (*_TIMES, *_NUMBERS) if c in names):
        t, time = schema.field(column).type, column in _TIMES
        kinds = (pa.types.is_timestamp, pa.types.is_date, pa.types.is_string) if time else (pa.types.is_floating,)
        kinds += (pa.types.is_integer,) if time else (pa.types.is_integer, pa.types.is_decimal)
        if not any(is_kind(t) for is_kind in kinds):
            raise CurError(name, f"column {column} is of type {t}, not a {'time' if time else 'number'}")
    return [c for c in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS) if c in names]


def _check_hourly(b: _Batch, instance: pa.Array, start: pa.Array, end: pa.Array) -> None:
    """Instance usage lines of an hourly export each lie within one UTC hour."""
    limit = pc.add(pc.floor_temporal(start, unit="hour"), pa.scalar(_HOUR, pa.duration("us")))
    longer = _and(instance, pc.greater(end, limit))
    if pc.any(longer).as_py():
        at = pc.index(longer, True).as_py()
        first, last = start[at].as_py(), end[at].as_py()
        span = (last - first).total_seconds() / 3600
        raise CurError(
            b.name,
            f"the line of {b.get('line_item_resource_id')[at].as_py()} from {first:%Y-%m-%d %H:%M} UTC bills "
            f"{span:g} h: gpufleet needs an hourly export (time granularity: Hourly)",
        )


__all__ = ["GPU_FAMILIES", "Billed", "BilledHour", "CurError", "CurReader", "Export", "is_gpu_instance_type"]
