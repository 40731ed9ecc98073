"""OpenAPI descriptions of the query parameters that app/params.py reads, for the report and the pages.

The parameters are read by hand (so that every bad value answers 400 naming its parameter) and described to
OpenAPI through each route's `openapi_extra`, from here.
"""

from __future__ import annotations

from typing import Any

from .analyse.window import PRESETS


def query_param(name: str, description: str, example: Any, *, repeat: bool = False) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    if repeat:
        schema = {"type": "array", "items": schema}
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
        "example": example,
        **({"style": "form", "explode": True} if repeat else {}),
    }


def window_params(default: str, *, retention_note: bool = False) -> list[dict[str, Any]]:
    """`start`, `end` and `window`; `default` names the window used without any of them."""
    kept = " Must not be before the oldest rollups kept (`GPUFLEET_ROLLUP_RETENTION_DAYS`)." if retention_note else ""
    return [
        query_param(
            "start",
            "Start of the window, ISO 8601 (UTC when no offset is given), rounded down to the hour. With neither "
            f"`start` nor `window`: the last {default}.{kept}",
            "2026-11-01T00:00:00Z",
        ),
        query_param(
            "end", "End of the window, ISO 8601, rounded up to the hour; needs `start`. Default: now.", "2026-11-08"
        ),
        query_param(
            "window",
            f"Instead of `start`/`end`, a preset as on the dashboard: {', '.join(PRESETS)}. "
            "7d and 30d start at a UTC midnight.",
            "30d",
        ),
    ]


FILTER_PARAMS = [
    query_param("region", "Only instances in these regions (repeatable).", ["us-east-1"], repeat=True),
    query_param("instance_type", "Only instances of these types (repeatable).", ["p4d.24xlarge"], repeat=True),
    query_param(
        "lifecycle",
        "Only instances of these lifecycles: spot, on-demand, on-prem (repeatable).",
        ["spot"],
        repeat=True,
    ),
    query_param(
        "tag",
        "Only instances with this tag, `key:value` (or `key=value`); repeated, every one must match.",
        ["team:vision"],
        repeat=True,
    ),
]

TABLE_PARAMS = [
    query_param("sort", "The column the table is ordered by (the page's column keys; unknown: the default).", "waste"),
    query_param("dir", "asc or desc (default desc).", "desc"),
    query_param("page", "Page of the table, from 1; 100 rows a page (past the end: the last page).", "1"),
]
