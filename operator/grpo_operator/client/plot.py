"""A line chart for the terminal (pure: series in, text out; no I/O, no dependency).

Each series gets its own marker; consecutive points of one attempt are joined by dots; a gang restart is a dotted
column with `↻N` (attempt N) above it. x is the training step, y the value; both axes are labelled with their range.
`ascii=True` draws with plain ASCII for terminals that cannot show the Unicode glyphs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Optional

from .history import Series

MIN_WIDTH = 24  # narrower terminals get this width (a chart of 10 columns still reads; fewer does not)
MIN_HEIGHT = 4
_UNICODE = {"markers": "●×+◆○▲■*", "line": "·", "restart": "┆", "axis_y": "┤", "corner": "└", "axis_x": "─",
            "tick": "┴", "again": "↻"}
_ASCII = {"markers": "*x+o#@%&", "line": ".", "restart": ":", "axis_y": "|", "corner": "+", "axis_x": "-",
          "tick": "+", "again": "^"}


def fmt(v: float) -> str:
    """A short axis label: 4 significant digits, no exponent for everyday magnitudes."""
    if v == 0:
        return "0"
    if 1e-3 <= abs(v) < 1e6:
        text = f"{v:.4g}"
        return text if "e" not in text else f"{v:.0f}"
    return f"{v:.2e}"


def _y_range(values: Sequence[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if hi - lo < 1e-12 * max(1.0, abs(lo), abs(hi)):  # flat line: centre it
        pad = abs(lo) * 0.1 or 0.5
        return lo - pad, hi + pad
    return lo, hi


def chart(title: str, lines: Sequence[Series], restarts: Sequence[tuple[int, int]] = (), width: int = 80,
          height: int = 12, ascii: bool = False) -> str:
    """The chart of `lines` (points (attempt, step, value)) in at most max(width, MIN_WIDTH) columns.

    restarts: (attempt, first step) of each attempt after the first, marked on the chart. Series without points are
    listed in the legend as "no data"; if no series has a point the chart says so instead of drawing."""
    g = _ASCII if ascii else _UNICODE
    width, height = max(width, MIN_WIDTH), max(height, MIN_HEIGHT)
    points = [p for s in lines for p in s.points if math.isfinite(p[2])]
    if not points:
        return f"{title}: no data (no progress line has this metric yet)"
    lo, hi = _y_range([p[2] for p in points])
    labels = [fmt(hi), fmt((lo + hi) / 2), fmt(lo)]
    gutter = max(len(x) for x in labels) + 1
    cols = width - gutter - 1
    steps = [p[1] for p in points] + [s for _, s in restarts]
    x0, x1 = min(steps), max(steps)

    def col(step: int) -> int:
        return 0 if x1 == x0 else round((step - x0) / (x1 - x0) * (cols - 1))

    def row(v: float) -> int:
        return round((hi - v) / (hi - lo) * (height - 1))

    grid = [[" "] * cols for _ in range(height)]
    top = [" "] * cols
    for attempt, step in restarts:
        c = col(step)
        for r in range(height):
            grid[r][c] = g["restart"]
        tag = f"{g['again']}{attempt}"
        start = min(c, cols - len(tag))
        top[start:start + len(tag)] = list(tag)
    for i, s in enumerate(lines):
        _draw(grid, s, g["markers"][i % len(g["markers"])], g["line"], col, row)
    out = [title, " " * gutter + " " + "".join(top).rstrip()] if restarts else [title]
    for r in range(height):
        label = labels[0] if r == 0 else labels[2] if r == height - 1 else labels[1] if r == (height - 1) // 2 else ""
        out.append(f"{label:>{gutter - 1}} {g['axis_y']}{''.join(grid[r])}".rstrip())
    axis = [g["axis_x"]] * cols
    for _, step in restarts:
        axis[col(step)] = g["tick"]
    out.append(" " * (gutter - 1) + " " + g["corner"] + "".join(axis))
    left, right = f"step {x0}", str(x1)
    pad = max(1, cols + 1 - len(left) - len(right))
    out.append(" " * gutter + (left + " " * pad + right if x1 != x0 else left))
    out += _legend(lines, g["markers"], width)
    return "\n".join(out)


def _draw(grid: list[list[str]], s: Series, marker: str, dot: str, col: Callable[[int], int],
          row: Callable[[float], int]) -> None:
    """The series' points (the mean of those sharing a column) with dots between consecutive columns of one attempt."""
    cells: dict[tuple[int, int], list[float]] = {}
    for attempt, step, v in s.points:
        if math.isfinite(v):
            cells.setdefault((attempt, col(step)), []).append(v)
    prev: Optional[tuple[int, int, float]] = None
    for (attempt, c), vs in sorted(cells.items()):
        v = sum(vs) / len(vs)
        if prev is not None and prev[0] == attempt and c - prev[1] > 1:
            for k in range(prev[1] + 1, c):
                y = prev[2] + (v - prev[2]) * (k - prev[1]) / (c - prev[1])
                if grid[row(y)][k] == " ":
                    grid[row(y)][k] = dot
        grid[row(v)][c] = marker
        prev = (attempt, c, v)


def _legend(lines: Sequence[Series], markers: str, width: int) -> list[str]:
    entries = []
    for i, s in enumerate(lines):
        finite = [p for p in s.points if math.isfinite(p[2])]
        last = f"{fmt(finite[-1][2])} at step {finite[-1][1]}" if finite else "no data"
        entries.append(f"{markers[i % len(markers)]} {s.name} ({last})")
    out, cur = [], ""
    for e in entries:  # wrapped to the width
        if cur and len(cur) + 3 + len(e) > width:
            out.append(cur)
            cur = ""
        cur = f"{cur}   {e}" if cur else e
    return out + ([cur] if cur else [])
