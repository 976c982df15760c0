"""Comments per day: the series of one article and its chart, an SVG drawn here.

:func:`comments_per_day` is the one place that reads the per-day counter
(``blog.article.comments_per_day``, a counter per period: the article's public comments
per day): one exact read of the range (``get_series``, one statement), zero-filled.
"""

from __future__ import annotations

import datetime as dt

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from blog.models import comments_per_day as per_day

Series = list[tuple[dt.date, int]]

WIDTH = 640
HEIGHT = 200
MARGIN = 28  # room for the axis labels


def comments_per_day(article_id: int, *, until: dt.date, days: int) -> Series:
    """Public comments of the article on each of the ``days`` days ending with ``until``,
    oldest first; a day without comments is 0 (exact: stored values plus pending deltas)."""
    first = until - dt.timedelta(days=days - 1)
    return per_day.get_series(article_id, first, until + dt.timedelta(days=1))


def svg_chart(series: Series, *, title: str) -> SafeString:
    """A bar chart of the series: one bar per day, the highest value on the y axis, the
    first, middle and last dates under the bars. Every bar carries its day and value
    (``data-day``, ``data-value``) and a tooltip."""
    top = max((value for _, value in series), default=0)
    plot_w = WIDTH - 2 * MARGIN
    plot_h = HEIGHT - 2 * MARGIN
    step = plot_w / max(len(series), 1)
    bars = []
    for i, (day, value) in enumerate(series):
        height = 0.0 if top == 0 else plot_h * value / top
        bars.append(
            (
                day.isoformat(),
                value,
                f"{MARGIN + i * step + step * 0.1:.1f}",
                f"{MARGIN + plot_h - height:.1f}",
                f"{step * 0.8:.1f}",
                f"{height:.1f}",
                day.isoformat(),
                value,
            )
        )
    rects = format_html_join(
        "",
        '<rect class="bar" data-day="{}" data-value="{}" x="{}" y="{}" width="{}" height="{}">'
        "<title>{}: {}</title></rect>",
        bars,
    )
    labelled = sorted({0, len(series) // 2, len(series) - 1}) if series else []
    labels = format_html_join(
        "",
        '<text x="{}" y="{}" font-size="11" text-anchor="middle">{}</text>',
        (
            (f"{MARGIN + i * step + step / 2:.1f}", HEIGHT - MARGIN + 16, series[i][0].isoformat())
            for i in labelled
        ),
    )
    return format_html(
        '<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" width="{w}" '
        'height="{h}" viewBox="0 0 {w} {h}" aria-label="{title}">'
        "<title>{title}</title>"
        '<line x1="{m}" y1="{base}" x2="{right}" y2="{base}" stroke="#888"/>'
        '<text class="top" x="{lx}" y="{m}" font-size="11" text-anchor="end">{top}</text>'
        '<text x="{lx}" y="{base}" font-size="11" text-anchor="end">0</text>'
        '<g fill="#4a7ab7">{rects}</g>{labels}</svg>',
        w=WIDTH,
        h=HEIGHT,
        title=title,
        m=MARGIN,
        base=MARGIN + plot_h,
        right=WIDTH - MARGIN,
        lx=MARGIN - 4,
        top=top,
        rects=rects,
        labels=labels,
    )
