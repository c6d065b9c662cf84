"""Line charts as inline SVG text: the training curves of report.html, drawn in Python so the page
needs no script and no network for them.

    line_chart("Loss", [Series("loss", [(1, 2.5), (2, 2.1), (3, 1.9)], "#2563eb")])

returns one `<svg>` element: a frame, the y axis' min and max, the first and last step on the x
axis, and one `<polyline data-series="loss">` per series, one point per (step, value) in order.
The highest value sits at the top of the plot area, the lowest at its bottom.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 460, 200
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 26, 28  # margins: room for the y labels, the title and the x labels


@dataclass(frozen=True)
class Series:
    name: str
    points: list[tuple[int, float]]  # (step, value), in step order
    color: str


def _label(value: float) -> str:
    return f"{value:.4g}"


def line_chart(title: str, series: list[Series]) -> str:
    """An SVG line chart of `series` on shared axes; empty series are left out."""
    series = [s for s in series if s.points]
    steps = [x for s in series for x, _ in s.points]
    values = [y for s in series for _, y in s.points]
    x0, x1 = min(steps), max(steps)
    y0, y1 = min(values), max(values)
    if y1 == y0:  # a flat line in the middle, not a division by zero
        y0, y1 = y0 - 0.5 * (abs(y0) or 1), y1 + 0.5 * (abs(y1) or 1)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(step: int) -> float:
        return LEFT + (plot_w * (step - x0) / (x1 - x0) if x1 > x0 else plot_w / 2)

    def y(value: float) -> float:
        return TOP + plot_h * (y1 - value) / (y1 - y0)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}">',
             f'<text x="{LEFT}" y="16" class="chart-title">{escape(title)}</text>',
             f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" class="frame"/>',
             f'<text x="{LEFT - 6}" y="{TOP + 4}" text-anchor="end">{_label(y1)}</text>',
             f'<text x="{LEFT - 6}" y="{TOP + plot_h}" text-anchor="end">{_label(y0)}</text>',
             f'<text x="{LEFT}" y="{HEIGHT - 10}">step {x0}</text>',
             f'<text x="{WIDTH - RIGHT}" y="{HEIGHT - 10}" text-anchor="end">step {x1}</text>']
    for s in series:
        points = " ".join(f"{x(a):.2f},{y(b):.2f}" for a, b in s.points)
        parts.append(f'<polyline data-series="{escape(s.name)}" points="{points}" fill="none" '
                     f'stroke="{s.color}" stroke-width="1.6"/>')
        if len(s.points) <= 50:  # sparse series (eval loss, short runs): each point visible
            parts.extend(f'<circle cx="{x(a):.2f}" cy="{y(b):.2f}" r="2.5" fill="{s.color}"/>' for a, b in s.points)
    if len(series) > 1:  # a legend, right-aligned in the title row
        at = WIDTH - RIGHT
        for s in reversed(series):
            parts.append(f'<text x="{at}" y="16" text-anchor="end" fill="{s.color}">{escape(s.name)}</text>')
            at -= 9 * len(s.name) + 12
    parts.append("</svg>")
    return "".join(parts)
