"""The states every chart colours, their labels and classes, the hatch patterns, the state legend and the
100% state bar.

Colours come from `static/app.css` through the classes `state-<state>`, which set the CSS `color` that
fills, lines and stripes paint with. Unpartitioned and unknown are hatched over a light fill so they never
read as a solid colour.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from functools import lru_cache

from markupsafe import Markup, escape

from .svg import CHAR_W, CHART_ID, fmt, legend_layout, svg_open

ACTIVE = "active"
IDLE_HELD = "idle-held"
IDLE = "idle"
UNPARTITIONED = "unpartitioned"
UNKNOWN = "unknown"
OFFLINE = "offline"
STATES = (ACTIVE, IDLE_HELD, IDLE, UNPARTITIONED, UNKNOWN, OFFLINE)
"""Every state the dashboard colours, in the order bars and legends show them."""

STATE_LABELS = {
    ACTIVE: "active",
    IDLE_HELD: "idle, held",
    IDLE: "idle",
    UNPARTITIONED: "unpartitioned",
    UNKNOWN: "unknown",
    OFFLINE: "offline",
}
STATE_HELP = {
    ACTIVE: "Utilization at or above the idle bound.",
    IDLE_HELD: "Under the idle bound, but a process runs or memory is allocated.",
    IDLE: "Under the idle bound, no process, no memory held.",
    UNPARTITIONED: "MIG compute slices no instance was created on: idle capacity.",
    UNKNOWN: "The hardware reported no utilization figure: neither idle nor active.",
    OFFLINE: "No data came: instance stopped or agent down.",
}
HATCHED = frozenset({UNPARTITIONED, UNKNOWN})
"""States drawn striped (unpartitioned) or dotted (unknown) over a light fill."""


def state_class(state: str) -> str:
    """The CSS class of a state; anything unrecognised is drawn as unknown."""
    return f"state-{state}" if state in STATE_LABELS else "state-unknown"


def state_label(state: str) -> str:
    return STATE_LABELS.get(state, state)


def check_states(states: Iterable[str]) -> None:
    """Raise ValueError naming any state the dashboard does not know."""
    unknown = set(states) - set(STATES)
    if unknown:
        raise ValueError(f"unknown state(s): {', '.join(sorted(unknown))}")


def hatch_defs() -> str:
    """`<defs>` with this chart's two hatch patterns, `<id>-unpartitioned` (stripes) and `<id>-unknown` (dots).

    A pattern's content takes its colour from where the pattern is defined, so each carries its state class.
    """
    return (
        f'<defs><pattern id="{CHART_ID}-{UNPARTITIONED}" class="hatch-fill {state_class(UNPARTITIONED)}" '
        'patternUnits="userSpaceOnUse" width="5" height="5"><rect width="5" height="5"/>'
        '<path class="stripe" d="M-1,1L1,-1M0,5L5,0M4,6L6,4"/></pattern>'
        f'<pattern id="{CHART_ID}-{UNKNOWN}" class="hatch-fill {state_class(UNKNOWN)}" '
        'patternUnits="userSpaceOnUse" width="4" height="4"><rect width="4" height="4"/>'
        '<circle class="speck" cx="2" cy="2" r="1.1"/></pattern></defs>'
    )


def paint(state: str) -> str:
    """The `fill` (or `stroke`) of a state's shapes: its hatch pattern, or the colour its class sets."""
    return f"url(#{CHART_ID}-{state})" if state in HATCHED else "currentColor"


def state_legend(
    states: Iterable[str],
    *,
    x: float,
    y: float,
    right: float,
    left: float | None = None,
    blank: str | None = None,
) -> tuple[list[str], int]:
    """A legend of swatches and labels from (x, y), wrapping at `right` to rows that start at `left` (default
    `x`), 14 units apart; `blank` labels a last, empty swatch (what no data looks like). Needs `hatch_defs()`
    in the chart. Returns its parts and how many rows it takes."""
    entries = [(s, state_label(s)) for s in states]
    if blank is not None:
        entries.append(("", blank))
    places = legend_layout([14 + len(label) * CHAR_W for _, label in entries], x, x if left is None else left, right)
    out = ['<g class="legend">']
    for (state, label), (ex, row) in zip(entries, places, strict=True):
        ry = y + 14 * row
        swatch = (
            f'class="key-swatch {state_class(state)}" fill="{paint(state)}"'
            if state
            else 'class="key-swatch blank" fill="none"'
        )
        out.append(
            f'<rect {swatch} x="{fmt(ex)}" y="{fmt(ry)}" width="10" height="10"/>'
            f'<text x="{fmt(ex + 14)}" y="{fmt(ry + 9)}">{escape(label)}</text>'
        )
    out.append("</g>")
    return out, 1 + max((row for _, row in places), default=0)


@lru_cache(maxsize=256)
def hatch_path(w: float, h: float, spacing: float = 5.0) -> str:
    """Path data of `/` diagonals across a w x h rectangle at the origin, clipped to it (no clipPath ids to
    collide); kept per size, since a MIG page draws hundreds of blocks of a few sizes."""
    parts: list[str] = []
    c = spacing
    while c < w + h:
        u1, u2 = max(0.0, c - h), min(w, c)
        parts.append(f"M{fmt(u1)},{fmt(c - u1)}L{fmt(u2)},{fmt(c - u2)}")
        c += spacing
    return "".join(parts)


def block(state: str, x: float, y: float, w: float, h: float, *, kind: str, tooltip: str, text: str) -> str:
    """A state-coloured rectangle (striped or dotted where the state is hatched) with a tooltip and a label."""
    hatch = ""
    if state in HATCHED:
        d = hatch_path(round(w, 1), round(h, 1))
        hatch = f'<path class="hatch" transform="translate({fmt(x)},{fmt(y)})" d="{d}"/>'
    label = ""
    if text and len(text) * CHAR_W + 4 <= w and h >= 12:
        label = f'<text x="{fmt(x + w / 2)}" y="{fmt(y + h / 2)}" dy="3.5" text-anchor="middle">{escape(text)}</text>'
    return (
        f'<g class="{kind} {state_class(state)}"><title>{escape(tooltip)}</title>'
        f'<rect x="{fmt(x)}" y="{fmt(y)}" width="{fmt(w)}" height="{fmt(h)}"/>{hatch}{label}</g>'
    )


def state_bar_svg(
    shares: Mapping[str, float], *, width: int = 320, height: int = 16, label: str = "Time by state"
) -> Markup:
    """One 100% bar of `shares` (any non-negative weights: fractions, seconds, dollars) in `STATES` order."""
    check_states(shares)
    if any(v < 0 or not math.isfinite(v) for v in shares.values()):
        raise ValueError("shares must be finite and non-negative")
    total = sum(shares.values())
    parts = [f"{state_label(s)} {100 * shares[s] / total:.1f}%" for s in STATES if total > 0 and shares.get(s, 0) > 0]
    out = svg_open("chart-statebar", width, height, label, f"{label}: {', '.join(parts) or 'no data'}")
    if total <= 0:
        out.append(f'<rect class="empty" x="0.5" y="0.5" width="{width - 1}" height="{height - 1}"/>')
        out.append("</svg>")
        return Markup("".join(out))
    cum = 0.0
    x = 0.0
    for state in STATES:
        share = shares.get(state, 0.0)
        if share <= 0:
            continue
        cum += share
        # Edges from the running sum, so the segments always add up to the full width.
        end = round(width * cum / total, 1)
        w = end - x
        pct = 100 * share / total
        tooltip = f"{state_label(state)}: {pct:.1f}%"
        out.append(block(state, x, 0, w, height, kind="seg", tooltip=tooltip, text=f"{pct:.0f}%"))
        x = end
    out.append("</svg>")
    return Markup("".join(out))
