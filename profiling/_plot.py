"""matplotlib drawings of ``Stats`` and ``Report`` (imported only when something is drawn).

NOTE [ Figures without pyplot ]
The drawings build ``matplotlib.figure.Figure`` objects directly instead of going through
``pyplot``: nothing is registered with a GUI backend (so it works headless and in worker
threads), and a notebook shows the returned figure once (IPython's inline formatter renders
``Figure`` objects) instead of twice (pyplot's auto-display plus the returned value).
"""

from __future__ import annotations

from typing import Any

from ..stats import STAGES

# One colour per stage, stable across every drawing (and the dashboard).
STAGE_COLORS = {
    "read": "#4c72b0",
    "decode": "#dd8452",
    "transform": "#55a868",
    "python": "#c44e52",
    "collate": "#8172b3",
    "wait": "#937860",
}


# Text sizes in points; a figure 10 inches wide shown 980 px wide renders a point at about
# 1.36 px, so the smallest text (ticks, 9 pt) is about 12 px on screen.
TITLE_PT = 11
LABEL_PT = 10
TICK_PT = 9


def new_figure(width: float = 10.0, height: float = 3.4) -> Any:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig


def _style(ax: Any) -> None:
    ax.tick_params(labelsize=TICK_PT)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def draw_stage_bar(ax: Any, stage_s: dict, extra: dict | None = None, title: str = "") -> None:
    """One horizontal bar of stage shares, each segment labelled with its percentage.

    Segments too narrow for their label are named in the legend, which lists every stage
    with its share and sits inside the axes (nothing is clipped when the figure is saved).
    ``extra`` adds segments that are not stages (e.g. consumer wait), shown after them.
    """
    items = [(k, stage_s.get(k, 0.0)) for k in STAGES]
    items += list((extra or {}).items())
    total = sum(v for _, v in items)
    left = 0.0
    for name, v in items:
        frac = v / total if total > 0 else 0.0
        ax.barh([0.6], [frac], left=left, height=0.7, color=STAGE_COLORS.get(name, "#999999"),
                label=f"{name} {100 * frac:.0f}%")
        if frac >= 0.14:  # narrower segments are named with their share in the legend
            ax.text(left + frac / 2, 0.6, f"{100 * frac:.0f}%", ha="center", va="center", fontsize=LABEL_PT,
                    color="white", fontweight="bold")
        left += frac
    ax.set_xlim(0, 1)
    ax.set_ylim(-1.1, 1.0)
    ax.set_yticks([])
    ax.set_xticks([0, 0.25, 0.5, 0.75, 1.0], ["0", "25%", "50%", "75%", "100%"])
    ax.set_xlabel("share of stage thread time", fontsize=LABEL_PT)
    _style(ax)
    ax.spines["left"].set_visible(False)
    if title:
        ax.set_title(title, fontsize=TITLE_PT)
    if total <= 0:
        ax.text(0.5, 0.6, "no stage time recorded", ha="center", va="center", fontsize=LABEL_PT)
        return
    ax.legend(loc="lower center", ncol=3, fontsize=TICK_PT, frameon=False, handlelength=1.0,
              columnspacing=1.0, borderaxespad=0.1)


def draw_throughput(ax: Any, t_s: Any, samples_per_s: Any, dur_s: Any = None, title: str = "throughput") -> None:
    """Delivered samples/s per part of the window, as steps (one level per part).

    A part is drawn as a level over its whole length, so even a one-part window shows a
    segment, not a lone point.
    """
    t_s = list(t_s)
    rates = list(samples_per_s)
    if dur_s is None:
        dur_s = [b - a for a, b in zip([0.0, *t_s[:-1]], t_s)]
    starts = [t - d for t, d in zip(t_s, dur_s)]
    if rates:
        xs = [*starts, t_s[-1]]
        ys = [*rates, rates[-1]]
        ax.step(xs, ys, where="post", color="#4c72b0", lw=1.8, label="delivered")
    ax.set_xlabel("seconds into the measured window", fontsize=LABEL_PT)
    ax.set_ylabel("samples/s", fontsize=LABEL_PT)
    ax.set_ylim(0, 1.25 * max(rates, default=1.0) or 1.0)
    if t_s:
        ax.set_xlim(starts[0], t_s[-1])
    ax.grid(alpha=0.3)
    _style(ax)
    ax.set_title(title, fontsize=TITLE_PT)


def figure_svg(fig: Any, text: bool = True) -> str:
    """The figure as an inline SVG string that scales to its container's width.

    With ``text``, labels stay text (small, fast, crisp) in matplotlib's sans-serif stack,
    which ends in the generic ``sans-serif``, so a browser never falls back to a serif font;
    otherwise they are paths (identical everywhere, larger and slower).
    """
    import io
    import re

    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none" if text else "path"}):
        fig.savefig(buf, format="svg")
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r'<svg([^>]*?) width="[^"]*" height="[^"]*"', r'<svg\1 width="100%" style="max-width:980px;height:auto"',
                 svg, count=1)
    return svg


def plot_stats(stats: Any, fig: Any = None) -> Any:
    if fig is None:
        fig = new_figure()
    else:
        fig.clear()
    ax1, ax2 = fig.subplots(1, 2, width_ratios=[1, 1.3])
    draw_stage_bar(ax1, stats.stage_total_s, title="stage shares (this epoch)")
    ser = stats.series
    draw_throughput(ax2, ser["t_s"], ser["samples_per_s"], ser.get("dur_s"), title="produced throughput")
    ax2.set_xlabel("seconds into the epoch", fontsize=LABEL_PT)
    return fig
