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


def new_figure(width: float = 9.0, height: float = 3.2) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def draw_stage_bar(ax: Any, stage_s: dict, extra: dict | None = None, title: str = "") -> None:
    """One horizontal stacked bar of thread seconds per stage (plus e.g. consumer wait)."""
    items = [(k, stage_s.get(k, 0.0)) for k in STAGES]
    items += list((extra or {}).items())
    total = sum(v for _, v in items) or 1.0
    left = 0.0
    for name, v in items:
        ax.barh([0], [v / total], left=left, color=STAGE_COLORS.get(name, "#999999"), label=name)
        if v / total > 0.06:
            ax.text(left + v / total / 2, 0, f"{name}\n{100 * v / total:.0f}%", ha="center",
                    va="center", fontsize=8, color="white")
        left += v / total
    ax.set_xlim(0, 1)
    ax.set_yticks([])
    ax.set_xlabel("share of thread time")
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=len(items), fontsize=8, frameon=False)


def draw_throughput(ax: Any, t_s: Any, samples_per_s: Any, title: str = "throughput") -> None:
    ax.plot(t_s, samples_per_s, color="#4c72b0", marker=".", lw=1.5)
    ax.set_xlabel("seconds")
    ax.set_ylabel("samples/s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=10)


def plot_stats(stats: Any, fig: Any = None) -> Any:
    if fig is None:
        fig = new_figure()
    else:
        fig.clear()
    ax1, ax2 = fig.subplots(1, 2, width_ratios=[1, 1.3])
    wait = {"wait": stats.consumer_wait_s} if stats.consumer_wait_s else None
    draw_stage_bar(ax1, stats.stage_total_s, wait, title="stage breakdown")
    draw_throughput(ax2, stats.series["t_s"], stats.series["samples_per_s"])
    return fig
