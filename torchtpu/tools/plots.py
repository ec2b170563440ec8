"""The one place torchtpu draws charts: `python -m torchtpu.tools.report` and the benchmarks' `--plot`.

Charts are PNG files drawn by matplotlib's Agg renderer on a figure of their own (no pyplot, so no GUI
backend, no global figure list, and a program's own matplotlib settings are left alone). matplotlib is
imported only when a chart is drawn; without it every function raises `PlotsUnavailable`, whose message
says what to install.

    bar_chart(path, title, labels, values, ylabel)                  one bar per label
    grouped_bar_chart(path, title, labels, {name: values}, ylabel)  side by side per label
    stacked_bar_chart(path, title, labels, {name: values}, ylabel)  on top of each other per label
    line_chart(path, title, {name: (xs, ys)}, xlabel, ylabel)       lines, optionally with the peak marked
    draw(path, Bars(...), Lines(...), ...)                          several charts in one PNG
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

PALETTE = ("#4878d0", "#ee854a", "#6acc64", "#d65f5f", "#956cb4", "#8c613c", "#dc7ec0", "#797979",
           "#d5bb67", "#82c6e2")
GREY = "#9a9a9a"


class PlotsUnavailable(RuntimeError):
    """matplotlib is not installed."""


@dataclasses.dataclass
class Bars:
    """A bar chart. One series: plain bars; several: side by side per label, or `stacked`.
    A value of None leaves its bar out (a mode that did not run)."""

    title: str
    labels: Sequence[str]
    series: dict[str, Sequence[float | None]]
    ylabel: str = ""              # the value axis' label (the x axis when horizontal)
    stacked: bool = False
    horizontal: bool = False      # long labels (op names) read better down the side, first at the top
    log: bool = False             # a log value axis, for values spanning decades
    notes: Sequence[str] | None = None   # a short text at the end of each label's bar ("12 calls")
    colors: Sequence[str] | None = None  # one per label (a single series) or per series
    reference: float | None = None       # a dashed line across the chart at this value (a target)
    reference_label: str = ""
    empty_text: str = "no data"          # shown instead when there is nothing to draw


@dataclasses.dataclass
class Lines:
    """Lines through (x, y) points, one per series."""

    title: str
    series: dict[str, tuple[Sequence[float], Sequence[float]]]
    xlabel: str = ""
    ylabel: str = ""
    xlog: int | None = None       # log x axis with this base (2 for message sizes)
    xticks: Sequence[tuple[float, str]] | None = None  # (x, label) ticks instead of matplotlib's
    ylog: bool = False
    steps: bool = False           # a value holds until the next point (memory after each step)
    markers: bool = True
    mark_peak: bool = False       # mark and label each series' largest y
    peak_format: str = "{y:g}"    # the peak's label, given x and y
    empty_text: str = "no data"


def _figure(width: float, height: float, rows: int = 1, columns: int = 1):
    """A figure rendered by Agg, with its axes."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise PlotsUnavailable(f"charts need matplotlib ({error}); pip install matplotlib "
                               "(it is in torchtpu's [test] and [bench] extras)") from None
    figure = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    axes = [figure.add_subplot(rows, columns, i + 1) for i in range(rows * columns)]
    return figure, axes


def _plain_log_ticks(axis) -> None:
    """Tick labels on a log axis as plain numbers (20, 0.5), not powers of ten."""
    from matplotlib.ticker import FuncFormatter

    def minor(value: float, _) -> str:  # 2 and 5 of each decade, so the labels do not crowd
        if value <= 0:
            return ""
        leading = round(value / 10 ** math.floor(math.log10(value) + 1e-9))
        return f"{value:g}" if leading in (2, 5) else ""

    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(FuncFormatter(minor))


def _empty(ax, title: str, text: str) -> None:
    ax.set_title(title)
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color=GREY, fontsize=12)
    ax.set_xticks([])
    ax.set_yticks([])


def _draw_bars(ax, chart: Bars) -> None:
    labels = list(chart.labels)
    for name, values in chart.series.items():
        if len(values) != len(labels):
            raise ValueError(f"series {name!r} has {len(values)} values for {len(labels)} labels")
    series = {name: values for name, values in chart.series.items() if any(v is not None for v in values)}
    names = list(series)
    if not labels or not names:
        _empty(ax, chart.title, chart.empty_text)
        return
    positions = list(range(len(labels)))
    grouped = len(names) > 1 and not chart.stacked
    width = 0.8 / len(names) if grouped else 0.7
    bottoms = [0.0] * len(labels)
    bar = ax.barh if chart.horizontal else ax.bar
    ends = [0.0] * len(labels)  # where each label's bars end, for the notes
    for i, (name, values) in enumerate(series.items()):
        offset = (i - (len(names) - 1) / 2) * width if grouped else 0.0
        kept = [(p, v, bottoms[p]) for p, v in zip(positions, values) if v is not None]
        if chart.colors is not None and len(names) == 1:
            color = [chart.colors[p % len(chart.colors)] for p, _, _ in kept]
        else:  # a series keeps its color when another has no values
            slot = list(chart.series).index(name)
            color = (chart.colors or PALETTE)[slot % len(chart.colors or PALETTE)]
        xs = [p + offset for p, _, _ in kept]
        heights = [v for _, v, _ in kept]
        base = [b for _, _, b in kept] if chart.stacked else None
        options = {"left": base} if chart.horizontal else {"bottom": base}
        bar(xs, heights, width, color=color, label=name if len(names) > 1 else None, **options)
        for p, v, b in kept:
            if chart.stacked:
                bottoms[p] = b + v
            ends[p] = max(ends[p], (b if chart.stacked else 0.0) + v)
    if chart.horizontal:
        ax.set_yticks(positions, labels)
        ax.invert_yaxis()
        ax.set_xlabel(chart.ylabel)
    else:
        ax.set_xticks(positions, labels, rotation=30 if max(map(len, labels)) > 10 else 0,
                      ha="right" if max(map(len, labels)) > 10 else "center")
        ax.set_ylabel(chart.ylabel)
    if chart.log:
        (ax.set_xscale if chart.horizontal else ax.set_yscale)("log")
        _plain_log_ticks(ax.xaxis if chart.horizontal else ax.yaxis)
    if chart.notes:
        for p, note in zip(positions, chart.notes):
            if note and ends[p] > 0:
                if chart.horizontal:
                    ax.annotate(f" {note}", (ends[p], p), va="center", ha="left", fontsize=8)
                else:
                    ax.annotate(note, (p, ends[p]), xytext=(0, 2), textcoords="offset points",
                                va="bottom", ha="center", fontsize=8)
        # room for the notes past the longest bar
        if chart.horizontal and not chart.log:
            ax.set_xlim(right=max(ends) * 1.25)
        elif not chart.log:
            ax.set_ylim(top=max(ends) * 1.12)
    if chart.reference is not None:
        line = ax.axvline if chart.horizontal else ax.axhline
        line(chart.reference, color="black", linestyle="--", linewidth=1, label=chart.reference_label or None)
    if len(names) > 1 or chart.reference_label:
        ax.legend(fontsize=8)
    ax.grid(axis="x" if chart.horizontal else "y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.set_title(chart.title)


def _draw_lines(ax, chart: Lines) -> None:
    series = {name: (list(xs), list(ys)) for name, (xs, ys) in chart.series.items() if len(xs)}
    if not series:
        _empty(ax, chart.title, chart.empty_text)
        return
    for i, (name, (xs, ys)) in enumerate(series.items()):
        if len(xs) != len(ys):
            raise ValueError(f"series {name!r} has {len(xs)} x values and {len(ys)} y values")
        color = PALETTE[i % len(PALETTE)]
        marker = "o" if chart.markers and len(xs) <= 60 else None
        if chart.steps:
            ax.step(xs, ys, where="post", color=color, marker=marker, markersize=3, label=name)
        else:
            ax.plot(xs, ys, color=color, marker=marker, markersize=4, label=name)
        if chart.mark_peak:
            top = max(range(len(ys)), key=ys.__getitem__)
            ax.plot([xs[top]], [ys[top]], marker="v", color="black", markersize=8, linestyle="none")
            right_half = xs[top] > (min(xs) + max(xs)) / 2
            ax.annotate(chart.peak_format.format(x=xs[top], y=ys[top]), (xs[top], ys[top]),
                        xytext=(-8 if right_half else 8, 6), textcoords="offset points", fontsize=8,
                        ha="right" if right_half else "left")
    if chart.xlog:
        ax.set_xscale("log", base=chart.xlog)
    if chart.xticks is not None:
        ax.set_xticks([x for x, _ in chart.xticks], [label for _, label in chart.xticks])
        ax.minorticks_off()
    if chart.ylog:
        ax.set_yscale("log")
        _plain_log_ticks(ax.yaxis)
    elif chart.mark_peak:
        ax.set_ylim(bottom=0, top=max(max(ys) for _, ys in series.values()) * 1.15 or 1)
    ax.set_xlabel(chart.xlabel)
    ax.set_ylabel(chart.ylabel)
    ax.set_title(chart.title)
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize=8)


def _size(chart: Bars | Lines) -> tuple[float, float]:
    """A figure size that fits the chart's labels."""
    if isinstance(chart, Lines):
        return 8.0, 4.2
    n = max(len(chart.labels), 1)
    if chart.horizontal:
        longest = max((len(label) for label in chart.labels), default=10)
        return 5.5 + min(longest, 60) * 0.07, 1.4 + 0.32 * n * (1 if chart.stacked else max(1, len(chart.series) * 0.6))
    return max(6.0, 1.5 + n * (0.55 + 0.35 * (len(chart.series) if not chart.stacked else 1))), 4.5


def draw(path: str, *charts: Bars | Lines, title: str | None = None, columns: int | None = None) -> str:
    """Draws `charts` side by side (`columns` per row, default all in one row) into the PNG at `path`."""
    if not charts:
        raise ValueError("draw() needs at least one chart")
    columns = columns or len(charts)
    rows = math.ceil(len(charts) / columns)
    sizes = [_size(c) for c in charts]
    width = max(w for w, _ in sizes) * columns
    height = max(h for _, h in sizes) * rows + (0.4 if title else 0)
    figure, axes = _figure(width, height, rows, columns)
    for ax, chart in zip(axes, charts):
        (_draw_bars if isinstance(chart, Bars) else _draw_lines)(ax, chart)
    for ax in axes[len(charts):]:
        ax.set_visible(False)
    if title:
        figure.suptitle(title)
    figure.savefig(path, format="png")
    return path


def bar_chart(path: str, title: str, labels: Sequence[str], values: Sequence[float | None], ylabel: str = "",
              **options) -> str:
    """One bar per label. Options: those of `Bars` (horizontal, log, notes, colors, reference, ...)."""
    return draw(path, Bars(title, labels, {"": values}, ylabel, **options))


def grouped_bar_chart(path: str, title: str, labels: Sequence[str], series: dict[str, Sequence[float | None]],
                      ylabel: str = "", **options) -> str:
    """For each label, one bar per series side by side (series in the legend)."""
    return draw(path, Bars(title, labels, series, ylabel, **options))


def stacked_bar_chart(path: str, title: str, labels: Sequence[str], stacks: dict[str, Sequence[float]],
                      ylabel: str = "", **options) -> str:
    """For each label, the series' values on top of each other (compile time under execute time)."""
    return draw(path, Bars(title, labels, stacks, ylabel, stacked=True, **options))


def line_chart(path: str, title: str, series: dict[str, tuple[Sequence[float], Sequence[float]]], xlabel: str = "",
               ylabel: str = "", **options) -> str:
    """One line per series through its (xs, ys). Options: those of `Lines` (steps, mark_peak, xlog, ...)."""
    return draw(path, Lines(title, series, xlabel, ylabel, **options))
