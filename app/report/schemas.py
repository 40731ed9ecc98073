"""What GET /api/v1/report answers, for the OpenAPI schema. The route builds its JSON from plain dicts
(app/report/service.py); tests check that every answer validates against these models."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field


class FiguresOut(BaseModel):
    """The figures of one group, or of all of them. Hours are GPU-equivalent hours (a MIG slice counts its
    compute slices / 7 of an hour per hour); money is USD over priced GPU-hours only."""

    model_config = ConfigDict(extra="forbid")

    gpu_hours: float | None = Field(description="GPU-hours covered by data, h.")
    avg_util_pct: float | None = Field(description="Mean utilization over hours with a figure, %; null if none.")
    util_unknown_share: float | None = Field(
        description="Share of the GPU-hours with no utilization figure, 0-1; null with no GPU-hours."
    )
    active_h: float | None = Field(description="GPU-hours active, h.")
    idle_held_h: float | None = Field(description="GPU-hours idle with memory or a process held, h.")
    idle_h: float | None = Field(description="GPU-hours idle (free MIG capacity included), h.")
    unknown_h: float | None = Field(description="GPU-hours in an unknown state, h.")
    offline_h: float | None = Field(description="GPU-hours with the instance offline (not priced), h.")
    cost: float | None = Field(description="Cost of the covered GPU-hours, USD.")
    idle_cost: float | None = Field(description="Cost of the idle GPU-hours, USD.")
    idle_held_cost: float | None = Field(description="Cost of the idle-held GPU-hours, USD.")
    unused_cost: float | None = Field(description="Cost x (1 - utilization) over hours with a figure, USD.")
    unpriced_gpu_hours: float | None = Field(description="GPU-hours with no price, left out of every USD figure.")
    unsized_slice_hours: float | None = Field(
        description="Hours of MIG slices whose size the agent could not read: their share of a GPU is unknown, so "
        "they are left out of GPU-hours and every USD figure, h."
    )
    free_unknown_hours: float | None = Field(
        description="Hours of MIG GPUs whose layout the agent could not read in full: none of that time counts as "
        "unpartitioned (idle) capacity, h."
    )
    currency: str = Field(description="Always USD.")
    price_source: str = Field(description="Where the prices came from, sources joined by '; '.")
    price_source_shares: str = Field(
        description="Each kind of price source with its share of the cost, largest first, e.g. 'billed 80%; catalog "
        "20%' (kinds: billed, spot history, agent, price file, catalog; docs/billing.md)."
    )
    price_sources: dict[str, float] = Field(
        description="The same shares as numbers, 0-1, by kind of price source; empty when nothing is priced."
    )


class ReportRowOut(FiguresOut):
    group: dict[str, str] = Field(description="The group's value for each grouping, by group_by name.")


class ReportOut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    start: datetime = Field(description="Start of the window, on a UTC hour.")
    end: datetime = Field(description="End of the window, or now when the window reaches the present.")
    group_by: list[str] = Field(description="The groupings, in the order asked for.")
    billed_until: datetime | None = Field(
        description="The imported AWS bill covers time up to here; later hours are priced from spot history or "
        "the instance's own price (docs/billing.md). Null before any import."
    )
    rows: list[ReportRowOut] = Field(description="One row per group, the largest waste first.")
    totals: FiguresOut
