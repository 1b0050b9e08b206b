"""Charts as inline SVG strings: horizontal bars and stacked monthly bars, negatives below the axis.

Every label is HTML-escaped; a label longer than fits is cut with an ellipsis and its full text
(with the value) is in a `<title>` tooltip. Amounts are Decimal; the caller says how to print one
(`value_text`), so money is shown by the one money rule (`seedance_tasks.cost.money.display`). Output depends only on the input,
so the same data renders the same bytes.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Sequence
from decimal import Decimal

from seedance_tasks.cost.money import display

POSITIVE = "#3b6ea8"
NEGATIVE = "#b5473a"
PALETTE = ("#3b6ea8", "#e08a2c", "#4b9c5a", "#8a5fb0", "#c9a227", "#2f9ea5", "#d0607f", "#7a8b3a",
           "#a0522d", "#5470c6")
OTHER = "#9aa3ad"
UNALLOCATED = "#cf4b3e"
_FONT = "font-family='system-ui,sans-serif' font-size='12'"


money = display  # the one money rule, under the name the pages and charts use
BIDI_CONTROLS = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def escape(text: str, quote: bool = True) -> str:
    """`html.escape` of `text`, each Unicode bidi control in it shown as its code (`<U+202E>`): a name
    from data cannot reorder how it reads (an owner `\u202egnp.exe` would show as `exe.png`)."""
    return html.escape(BIDI_CONTROLS.sub(lambda found: f"<U+{ord(found.group()):04X}>", text), quote)


def clip(label: str, chars: int) -> str:
    """`label` cut to at most `chars` characters, an ellipsis marking a cut."""
    return label if len(label) <= chars else label[: max(chars - 1, 1)] + "…"


def _text(x: float, y: float, label: str, chars: int, anchor: str = "start", extra: str = "") -> str:
    shown = clip(label, chars)
    tip = f"<title>{escape(label)}</title>" if shown != label else ""
    return (f"<text x='{x:.1f}' y='{y:.1f}' text-anchor='{anchor}' {_FONT}{extra}>{tip}"
            f"{escape(shown)}</text>")


def _nice_step(span: Decimal) -> Decimal:
    """A round tick step (1, 2 or 5 x 10^k) giving about four ticks over `span`."""
    if span <= 0:
        return Decimal(1)
    raw = span / 4
    exponent = raw.adjusted()
    base = Decimal(1).scaleb(exponent)
    for factor in (1, 2, 5, 10):
        if base * factor >= raw:
            return base * factor
    return base * 10


def hbars(title: str, items: Sequence[tuple[str, Decimal]], value_text: Callable[[Decimal], str],
          *, width: int = 760, label_chars: int = 30) -> str:
    """Horizontal bars of labelled amounts; negative ones grow left of the zero line, in red."""
    if not items:
        return f"<p class='none'>{escape(title)}: nothing to show.</p>"
    row, label_w, value_w = 22, 7 * label_chars + 16, 150
    low = min(Decimal(0), *(value for _, value in items))
    high = max(Decimal(0), *(value for _, value in items))
    span = (high - low) or Decimal(1)
    plot = width - label_w - value_w
    zero = label_w + float(-low / span) * plot
    height = row * len(items) + 8
    parts = [f"<svg class='chart' role='img' aria-label='{escape(title)}' width='{width}' height='{height}' "
             f"viewBox='0 0 {width} {height}' xmlns='http://www.w3.org/2000/svg'>"]
    for index, (label, value) in enumerate(items):
        y = index * row + 4
        length = float(abs(value) / span) * plot
        x = zero - length if value < 0 else zero
        colour = NEGATIVE if value < 0 else POSITIVE
        tip = f"{escape(label)}: {escape(value_text(value))}"
        parts.append(_text(label_w - 8, y + 15, label, label_chars, "end"))
        parts.append(f"<rect x='{x:.1f}' y='{y + 3}' width='{max(length, 0.5):.1f}' height='{row - 6}' "
                     f"fill='{colour}'><title>{tip}</title></rect>")
        text_x = (zero + length + 6) if value >= 0 else (zero + 6)
        parts.append(f"<text x='{text_x:.1f}' y='{y + 15}' {_FONT}>{escape(value_text(value))}</text>")
    parts.append(f"<line x1='{zero:.1f}' x2='{zero:.1f}' y1='2' y2='{height - 2}' stroke='#555'/>")
    parts.append("</svg>")
    return "".join(parts)


def stacked(title: str, columns: Sequence[str], series: Sequence[tuple[str, str, Sequence[Decimal | None]]],
            value_text: Callable[[Decimal], str], *, width: int = 860, height: int = 300) -> str:
    """Stacked vertical bars, one per column (month): each series (name, colour, values) is a segment.

    Positive amounts stack up from the zero line, negative ones down from it; a None value is a
    column without data (labelled "no data"). A legend names every series (long names cut, full
    name in a tooltip); every segment's tooltip says series, column and amount.
    """
    if not columns or not series:
        return f"<p class='none'>{escape(title)}: nothing to show.</p>"
    left, right, top, bottom, legend_w = 90, 10, 12, 40, 190
    plot_w = width - left - right - legend_w
    plot_h = height - top - bottom
    ups = [sum((max(values[i] or 0, 0) for _, _, values in series), Decimal(0)) for i in range(len(columns))]
    downs = [sum((min(values[i] or 0, 0) for _, _, values in series), Decimal(0)) for i in range(len(columns))]
    high, low = max(Decimal(0), *ups), min(Decimal(0), *downs)
    step = _nice_step(high - low)
    high = (high / step).to_integral_value(rounding="ROUND_CEILING") * step
    low = (low / step).to_integral_value(rounding="ROUND_FLOOR") * step
    if high == low:  # every amount zero: an axis from 0 to one step
        high = low + step
    span = (high - low) or Decimal(1)

    def y_of(value: Decimal) -> float:
        return top + float((high - value) / span) * plot_h

    parts = [f"<svg class='chart' role='img' aria-label='{escape(title)}' width='{width}' height='{height}' "
             f"viewBox='0 0 {width} {height}' xmlns='http://www.w3.org/2000/svg'>"]
    tick = low
    while tick <= high:
        y = y_of(tick)
        parts.append(f"<line x1='{left}' x2='{left + plot_w}' y1='{y:.1f}' y2='{y:.1f}' stroke='#e3e3e3'/>")
        parts.append(f"<text x='{left - 6}' y='{y + 4:.1f}' text-anchor='end' {_FONT}>"
                     f"{escape(value_text(tick))}</text>")
        tick += step
    slot = plot_w / len(columns)
    bar = min(slot * 0.7, 60)
    for index, column in enumerate(columns):
        x = left + index * slot + (slot - bar) / 2
        up, down = Decimal(0), Decimal(0)
        empty = all(values[index] is None for _, _, values in series)
        for name, colour, values in series:
            value = values[index]
            if not value:
                continue
            if value > 0:
                y0, y1, up = y_of(up + value), y_of(up), up + value
            else:
                y0, y1, down = y_of(down), y_of(down + value), down + value
            parts.append(f"<rect x='{x:.1f}' y='{y0:.1f}' width='{bar:.1f}' height='{max(y1 - y0, 0.5):.1f}' "
                         f"fill='{colour}'><title>{escape(name)}, {escape(column)}: "
                         f"{escape(value_text(value))}</title></rect>")
        parts.append(_text(x + bar / 2, top + plot_h + 16, column, 10, "middle"))
        if empty:
            parts.append(f"<text x='{x + bar / 2:.1f}' y='{y_of(Decimal(0)) - 6:.1f}' text-anchor='middle' "
                         f"{_FONT} fill='#888'>no data</text>")
    zero = y_of(Decimal(0))
    parts.append(f"<line x1='{left}' x2='{left + plot_w}' y1='{zero:.1f}' y2='{zero:.1f}' stroke='#333'/>")
    legend_x = left + plot_w + 16
    for index, (name, colour, _) in enumerate(series[: plot_h // 18]):
        y = top + index * 18
        parts.append(f"<rect x='{legend_x}' y='{y}' width='12' height='12' fill='{colour}'/>")
        parts.append(_text(legend_x + 18, y + 11, name, 24))
    parts.append("</svg>")
    return "".join(parts)


def colours(names: Sequence[str]) -> list[str]:
    """A colour per series name: the palette in order; "other" grey, "(unallocated)" red."""
    result, index = [], 0
    for name in names:
        if name == "(other owners)":
            result.append(OTHER)
        elif name == "(unallocated)":
            result.append(UNALLOCATED)
        else:
            result.append(PALETTE[index % len(PALETTE)])
            index += 1
    return result


def line(title: str, points: Sequence[tuple[int, Decimal]], value_text: Callable[[Decimal], str],
         *, x_label: str = "step", width: int = 520, height: int = 160) -> str:
    """A small line chart of (x, amount) points, x increasing (e.g. cost so far over steps): the
    axis from zero to the largest amount, the first and last x labelled, the last amount printed."""
    if len(points) < 2:
        return f"<p class='none'>{escape(title)}: not enough steps to draw.</p>"
    left, right, top, bottom = 90, 16, 10, 28
    plot_w, plot_h = width - left - right, height - top - bottom
    low_x, high_x = points[0][0], points[-1][0]
    high = max(Decimal(0), *(value for _, value in points))
    low = min(Decimal(0), *(value for _, value in points))
    span, span_x = (high - low) or Decimal(1), (high_x - low_x) or 1

    def xy(x: int, value: Decimal) -> str:
        return f"{left + (x - low_x) / span_x * plot_w:.1f},{top + float((high - value) / span) * plot_h:.1f}"

    parts = [f"<svg class='chart' role='img' aria-label='{escape(title)}' width='{width}' height='{height}' "
             f"viewBox='0 0 {width} {height}' xmlns='http://www.w3.org/2000/svg'><title>{escape(title)}</title>"]
    for value in (high, low) if low < 0 else (high, Decimal(0)):
        y = top + float((high - value) / span) * plot_h
        parts.append(f"<line x1='{left}' x2='{left + plot_w}' y1='{y:.1f}' y2='{y:.1f}' stroke='#e3e3e3'/>")
        parts.append(f"<text x='{left - 6}' y='{y + 4:.1f}' text-anchor='end' {_FONT}>"
                     f"{escape(value_text(value))}</text>")
    parts.append(f"<polyline fill='none' stroke='{POSITIVE}' stroke-width='2' points='"
                 + " ".join(xy(x, value) for x, value in points) + "'/>")
    base = top + plot_h + 18
    parts.append(f"<text x='{left}' y='{base}' {_FONT}>{escape(f'{x_label} {low_x:,}')}</text>")
    parts.append(f"<text x='{left + plot_w}' y='{base}' text-anchor='end' {_FONT}>"
                 f"{escape(f'{x_label} {high_x:,}: {value_text(points[-1][1])}')}</text>")
    parts.append("</svg>")
    return "".join(parts)
