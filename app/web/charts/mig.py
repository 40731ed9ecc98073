"""MIG slice layouts: a GPU as 7 compute-slice columns with its slice instances and free capacity on them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup

from .states import STATE_LABELS, block, state_label
from .svg import fmt, svg_open


@dataclass(frozen=True)
class MigSlot:
    """A block of a MIG layout: a slice instance, or compute slices nobody created one on."""

    start: int
    """First compute-slice column, 0-6."""
    size: int
    """Compute slices it spans, 1-7."""
    label: str
    state: str
    detail: str
    """Tooltip text."""

    def __post_init__(self) -> None:
        if not (0 <= self.start <= 6 and 1 <= self.size <= 7 and self.start + self.size <= 7):
            raise ValueError(f"MIG slot {self.label!r} at {self.start}+{self.size} does not fit in 7 columns")
        if self.state not in STATE_LABELS:
            raise ValueError(f"MIG slot {self.label!r} has unknown state {self.state!r}")


def mig_layout_svg(
    slots: Sequence[MigSlot], *, width: int = 168, height: int = 28, title: str = "MIG layout"
) -> Markup:
    """A GPU as 7 compute-slice columns with its slice instances (and unpartitioned capacity) on them."""
    pad = 1.5
    col = (width - 2 * pad) / 7
    summary = "; ".join(f"{s.label} {state_label(s.state)}" for s in sorted(slots, key=lambda s: s.start))
    out = svg_open("chart-mig", width, height, title, f"{title}: {summary or 'no slices'}")
    out.append(f'<rect class="gpu" x="0.5" y="0.5" width="{width - 1}" height="{height - 1}" rx="2"/><g class="cols">')
    for i in range(1, 7):
        cx = fmt(pad + i * col)
        out.append(f'<line x1="{cx}" x2="{cx}" y1="{pad}" y2="{fmt(height - pad)}"/>')
    out.append("</g>")
    inner_h = height - 2 * pad - 2
    for slot in slots:
        x = pad + slot.start * col + 1
        w = slot.size * col - 2
        tooltip = slot.detail or f"{slot.label}: {state_label(slot.state)}"
        out.append(block(slot.state, x, pad + 1, w, inner_h, kind="slot", tooltip=tooltip, text=slot.label))
    out.append("</svg>")
    return Markup("".join(out))
