"""The dashboard's 24-hour chart, drawn on the server as inline SVG (no JavaScript, nothing from another host).

Two panels share the time axis: GPUs reserved (the hourly average) above, credits burned (ledger charges) below.
Each has its own y axis from 0 to a round maximum; every bar carries a ``<title>`` (the browser's tooltip), and the
whole figure a ``<title>`` (its accessible name) and ``<desc>`` for screen readers. No ``aria-labelledby``: the
title names the clusters, and Playwright's ``get_by_label("Cluster")`` (the top bar's selector) would match it. Coordinates are computed in ``Decimal`` like the
values they draw, and colours come from ``console/static/console/dashboard.css`` (light and dark themes).
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from console.dashboard import HourBucket

WIDTH, LEFT, RIGHT = 760, 64, 16
PANEL, GAP, TOP, BOTTOM = 96, 40, 24, 44
_TENTH = Decimal("0.1")


def nice_ceiling(value: Decimal) -> Decimal:
    """The smallest of 1, 2, 5 × 10^k at least ``value`` (1 for 0 or less): the top of an axis."""
    if value <= 0:
        return Decimal(1)
    exponent = value.adjusted()
    for step in (1, 2, 5, 10):
        top = Decimal(step).scaleb(exponent)
        if top >= value:
            return top
    return Decimal(10).scaleb(exponent)  # pragma: no cover: 10 × 10^k is always enough


def _n(value: Decimal | int) -> str:
    """A coordinate, one decimal place."""
    return str(Decimal(value).quantize(_TENTH))


def _plain(value: Decimal) -> str:
    """``value`` without exponent or trailing zeros (``1E+1`` -> ``10``, ``2.50`` -> ``2.5``)."""
    text = format(value, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _panel(rows: list[str], *, top: int, values: Sequence[Decimal], label: str, unit: str, css: str,
           hours: Sequence[str]) -> None:
    """Append one panel (axis, grid, bars) whose plot area starts at ``top``."""
    peak = nice_ceiling(max(values, default=Decimal(0)))
    plot = WIDTH - LEFT - RIGHT
    slot = Decimal(plot) / max(len(values), 1)
    bottom = top + PANEL
    rows.append(f'<text class="gs-chart-axis-title" x="{LEFT}" y="{top - 8}">{escape(label)}</text>')
    for fraction in (Decimal(0), Decimal("0.5"), Decimal(1)):
        y = bottom - PANEL * fraction
        tick = (peak * fraction).normalize()
        rows.append(f'<line class="gs-chart-grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{_n(y)}" y2="{_n(y)}"/>')
        rows.append(f'<text class="gs-chart-tick" x="{LEFT - 6}" y="{_n(y + 4)}" text-anchor="end">{escape(_plain(tick))}</text>')
    for i, value in enumerate(values):
        height = Decimal(PANEL) * value / peak
        x = LEFT + slot * i + slot * Decimal("0.15")
        rows.append(
            f'<rect class="{css}" x="{_n(x)}" y="{_n(bottom - height)}" width="{_n(slot * Decimal("0.7"))}" height="{_n(height)}">'
            f"<title>{escape(hours[i])}: {escape(_plain(value))} {escape(unit)}</title></rect>"
        )
    rows.append(f'<line class="gs-chart-axis" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{bottom}" y2="{bottom}"/>')
    rows.append(f'<line class="gs-chart-axis" x1="{LEFT}" x2="{LEFT}" y1="{top}" y2="{bottom}"/>')


def usage_chart_svg(buckets: Sequence[HourBucket], *, scope: str = "all clusters") -> SafeString:
    """Inline SVG of ``buckets`` (oldest first, from ``console.dashboard.usage_chart``).

    Args:
        buckets: the hours to draw.
        scope: what the figures cover, for the accessible title ("all clusters", "cluster lab-c1").

    Returns:
        The ``<svg>`` element, safe to put in a template (every text in it is escaped).
    """
    hours = [b.start.strftime("%H:00 UTC") for b in buckets]
    gpus = [b.gpus_reserved for b in buckets]
    credits = [b.credits_burned for b in buckets]
    height = TOP + 2 * PANEL + GAP + BOTTOM
    first = buckets[0].start.strftime("%Y-%m-%d %H:00 UTC") if buckets else ""
    title = f"GPUs reserved and credits burned per hour, last {len(buckets)} hours, {scope}"
    desc = (
        f"Hourly bars from {first}: GPUs reserved (hourly average) peaked at {_plain(max(gpus, default=Decimal(0)))}; "
        f"credits burned in all {_plain(sum(credits, Decimal(0)))}."
    )
    rows = [
        f'<svg class="gs-chart" role="img" viewBox="0 0 {WIDTH} {height}" '
        f'preserveAspectRatio="xMidYMid meet" xmlns="http://www.w3.org/2000/svg">',
        f'<title id="gs-chart-title">{escape(title)}</title>',
        f'<desc id="gs-chart-desc">{escape(desc)}</desc>',
    ]
    _panel(rows, top=TOP, values=gpus, label="GPUs reserved (hourly average)", unit="GPUs", css="gs-bar-gpus", hours=hours)
    second = TOP + PANEL + GAP
    _panel(rows, top=second, values=credits, label="Credits burned (ledger charges)", unit="credits", css="gs-bar-credits",
           hours=hours)
    slot = Decimal(WIDTH - LEFT - RIGHT) / max(len(buckets), 1)
    for i, hour in enumerate(hours):
        if i % 3 == 0 or i == len(hours) - 1:
            x = LEFT + slot * i + slot / 2
            rows.append(f'<text class="gs-chart-tick" x="{_n(x)}" y="{second + PANEL + 16}" text-anchor="middle">{escape(hour[:5])}</text>')
    rows.append(
        f'<text class="gs-chart-axis-title" x="{_n(Decimal(LEFT + WIDTH - RIGHT) / 2)}" y="{height - 6}" text-anchor="middle">'
        "hour starting (UTC)</text>"
    )
    rows.append("</svg>")
    return mark_safe("\n".join(rows))  # noqa: S308 - every interpolated text above is escaped
