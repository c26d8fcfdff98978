"""Report figures (matplotlib, Agg backend, PNG). Each function draws one figure and saves it to `path`."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

COLORS = {0: "#4c72b0", 1: "#dd8452", 2: "#55a868", 3: "#c44e52"}
# One colour per side of the comparison, in every figure of a report and in the sweep's pareto plot: the
# baseline (a: `off` unless --arms says otherwise) blue, the candidate (b: `on`) orange. A colour taken from a
# series' position instead gave ABBA's `on` orange in the CDF (two series) and green in TPOT over time (off,
# off.2, on, on.2). A repeat of an arm keeps its hue, lighter and in another line style, so four series still
# read as two arms.
ARM_COLORS = (COLORS[0], COLORS[1])
REPEAT_LINESTYLES = ("-", "--", ":", "-.")
Style = dict  # matplotlib keyword arguments of one series: color, ls


def arm_style(side: int, repeat: int = 0) -> Style:
    """Colour and line style of a side's (0 baseline, 1 candidate) repeat-th run (0: its first, or the arm
    pooled): the arm's colour mixed 30% a repeat towards white, at most 60%."""
    rgb = np.array([int(ARM_COLORS[side][i:i + 2], 16) / 255 for i in (1, 3, 5)])
    mix = min(0.3 * repeat, 0.6)
    color = "#" + "".join(f"{round(v * 255):02x}" for v in rgb + (1 - rgb) * mix)
    return {"color": color, "ls": REPEAT_LINESTYLES[repeat % len(REPEAT_LINESTYLES)]}


def comparison_styles(sides: Sequence[tuple[str, Sequence[str]]]) -> dict[str, Style]:
    """{series name: style} for (label, names of its runs in order) of the baseline then the candidate: the
    label (a series pooling the arm's runs) and its first run in the arm's style, each later run a repeat."""
    styles = {}
    for side, (label, names) in enumerate(sides):
        styles.update({name: arm_style(side, k) for k, name in enumerate(names)})
        styles[label] = arm_style(side)
    return styles


def _figure(title: str, xlabel: str, ylabel: str):
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def tpot_cdf(tpot_by_arm: dict[str, np.ndarray], path: Path, styles: dict[str, Style]) -> Path:
    """Empirical CDF of per-request TPOT, one line per arm, styled by `styles` (comparison_styles). Each arm's
    own completed requests, not the matched ones: the faster arm also reaches requests the other never sent."""
    fig, ax = _figure("TPOT per request: CDF, each arm's own requests (not matched)",
                      "TPOT (ms, log scale)", "fraction of requests")
    for label, v in tpot_by_arm.items():
        v = np.sort(np.asarray(v, float))
        ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=f"{label} (n={len(v)})",
                **styles[label])
    # A long slow tail (5-10x the median) on a linear axis squashes the body, where the arms differ.
    if any(np.nanmin(np.asarray(v, float), initial=np.inf) > 0 for v in tpot_by_arm.values()):
        ax.set_xscale("log")
        _plain_log_ticks(ax.xaxis)
    ax.legend()
    return _save(fig, path)


def _plain_log_ticks(axis) -> None:
    """Label a log axis 2, 3, 5, 10, 20, 30 ... rather than 10^0, 10^1: TPOT spans one or two decades."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(subs=(1, 2, 3, 5)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


# Ticks of the delta histogram's log-ratio axis, in percent: each is exp(log-ratio) - 1.
# Pairs mirror each other in log-ratio: -50% and +100% are both a factor of 2.
DELTA_TICKS_PCT = (-90, -75, -50, -25, 0, 33, 100, 300, 900)
NEUTRAL = "#8c8c8c"  # a distribution of on-over-off deltas belongs to neither arm: neither arm's colour
VERDICT_COLOR = "#c44e52"


def delta_histogram(deltas: np.ndarray, path: Path, label: str,
                    verdict: tuple[float, float, float] | None = None,
                    verdict_name: str = "verdict") -> Path:
    """Histogram of matched per-request TPOT deltas, delta = (b - a) / a in % per request, drawn on a log-ratio
    axis (ticks in %) so that +100% and -50%, the same factor of two, sit equally far from 0. Zero and the median
    are marked; `verdict`: (estimate, lo, hi) in % of the report's primary estimate (a trimmed mean of the same
    log-ratios) and its 95% CI, drawn as a line and a band. label: "b vs a" (as "on vs off")."""
    d = np.asarray(deltas, float)
    d = d[np.isfinite(d) & (d > -100)]  # log(1 + d/100) needs a positive ratio
    r = np.log1p(d / 100)
    b, _, a = label.partition(" vs ")
    xlabel = (f"TPOT delta per matched request, ({b} - {a}) / {a} (log-ratio axis); < 0: {b} faster"
              if a else "TPOT delta per matched request (log-ratio axis); < 0: faster")
    fig, ax = _figure(f"Matched requests: TPOT delta {label} (n={len(d)})", xlabel, "requests")
    if len(r):
        lo, hi = min(r.min(), 0.0), max(r.max(), 0.0)
        ax.hist(r, bins=np.linspace(lo, hi + 1e-9, max(10, min(60, len(r) // 4)) + 1), color=NEUTRAL, alpha=0.8)
    ax.axvline(0, color="black", lw=1)
    if len(r):
        ax.axvline(float(np.median(r)), color="black", ls=":", lw=1.2, label=f"median {np.median(d):+.1f}%")
    if verdict is not None and np.isfinite(verdict[0]):
        est, lo_pct, hi_pct = verdict
        ax.axvline(np.log1p(est / 100), color=VERDICT_COLOR, lw=1.8,
                   label=f"{verdict_name} {est:+.1f}% [{lo_pct:+.1f}, {hi_pct:+.1f}]")
        if np.isfinite(lo_pct) and np.isfinite(hi_pct):
            ax.axvspan(np.log1p(lo_pct / 100), np.log1p(hi_pct / 100), color=VERDICT_COLOR, alpha=0.2,
                       label="95% CI")
    left, right = ax.get_xlim()
    ticks = [t for t in DELTA_TICKS_PCT if left <= np.log1p(t / 100) <= right]
    ax.set_xticks([np.log1p(t / 100) for t in ticks], [f"{t:+d}%" if t else "0" for t in ticks])
    if ax.get_legend_handles_labels()[0]:
        ax.set_ylim(top=ax.get_ylim()[1] * 1.4)  # headroom: the legend must not hide the bars near 0
        ax.legend(loc="upper left")
    return _save(fig, path)


def _segments(t: np.ndarray) -> list[slice]:
    """Runs of sorted start times with no gap over max(3 s, 10 x the median gap): a line (and a rolling median)
    must not bridge a stretch where no request started."""
    gaps = np.diff(t)
    if not len(gaps):
        return [slice(0, len(t))]
    cut = np.flatnonzero(gaps > max(3.0, 10 * float(np.median(gaps)))) + 1
    edges = [0, *cut.tolist(), len(t)]
    return [slice(i, j) for i, j in zip(edges[:-1], edges[1:])]


def tpot_over_time(frames: dict[str, "pd.DataFrame"], path: Path, styles: dict[str, Style]) -> Path:
    """Per-request TPOT against seconds since the arm run's first request, one series per arm run, styled by
    `styles` (comparison_styles): its requests as dots and a centred rolling median, broken where no request
    started for a while (_segments), on a log y so that a few 5-10x outliers do not flatten the rest."""
    fig, ax = _figure("TPOT over the measured window (dots: requests; lines: rolling median)",
                      "seconds since first request (request start)", "TPOT (ms, log scale)")
    for label, f in frames.items():
        f = f.sort_values("start_ns")
        t = ((f["start_ns"] - f["start_ns"].min()) / 1e9).to_numpy(float)
        y = f["tpot_ms"].to_numpy(float)
        ax.plot(t, y, ".", ms=3, alpha=0.5, color=styles[label]["color"])
        # A rolling median shows drift (thermal, cache warm-up) that single points hide.
        w = max(1, len(f) // 10)
        xs, ys = [], []
        for seg in _segments(t):
            roll = f["tpot_ms"].iloc[seg].rolling(w, min_periods=1, center=True).median()
            xs += [*t[seg], np.nan]
            ys += [*roll.to_numpy(float), np.nan]
        ax.plot(xs, ys, label=f"{label}: rolling median, {w} request{'s' * (w > 1)}", **styles[label])
    if len(frames) and all((f["tpot_ms"] > 0).all() for f in frames.values() if len(f)):
        ax.set_yscale("log")
        _plain_log_ticks(ax.yaxis)
    ax.legend()
    return _save(fig, path)


# A cycle log's unit -> the unit the plot shows and the factor: decode cycles are ~10 ms, prefill cycles 0.1-1 s,
# and "1e4 us" reads worse than "10 ms".
SHOWN_UNIT = {"us": ("ms", 1e-3), "ns": ("ms", 1e-6)}


def step_time_distribution(steps_by_arm: dict[str, np.ndarray], path: Path, unit: str,
                           styles: dict[str, Style]) -> Path:
    """Emulator: distribution of modelled step (speculative cycle) time per arm, coloured by `styles`: outlines
    over a light fill, so that where the arms overlap both stay visible; log x and log y, so that the few
    prefill cycles (10-100x longer, 1-5% of cycles) show beside the decode cycles."""
    from matplotlib.colors import to_rgba
    from matplotlib.patches import Patch

    shown, k = SHOWN_UNIT.get(unit, (unit, 1.0))
    fig, ax = _figure("Emulator step time per arm", f"step time ({shown}, log scale)", "cycles (log scale)")
    vals = [np.asarray(v, float) * k for v in steps_by_arm.values()]
    pos = np.concatenate([v[v > 0] for v in vals]) if vals else np.array([])
    bins = np.geomspace(pos.min(), pos.max() * 1.001, 50) if len(pos) and pos.max() > pos.min() else 40
    handles = []
    for label, v in zip(steps_by_arm, vals):
        color = styles[label]["color"]
        name = f"{label} (n={int((v > 0).sum())})"
        ax.hist(v[v > 0], bins=bins, color=color, alpha=0.15, label=name)
        ax.hist(v[v > 0], bins=bins, histtype="step", lw=1.5, color=color)
        handles.append(Patch(facecolor=to_rgba(color, 0.15), edgecolor=color, lw=1.5, label=name))
    if len(pos):
        ax.set_xscale("log")
        ax.set_yscale("log")
        _plain_log_ticks(ax.xaxis)
    ax.legend(handles=handles)
    return _save(fig, path)


def predicted_vs_measured(pred: np.ndarray, meas: np.ndarray, path: Path, style: Style) -> Path:
    """Kernel in the loop: cost-model attention time against the kernel's measured time, in the arm's colour."""
    fig, ax = _figure("Attention time: predicted vs measured", "predicted (us)", "measured (us)")
    ax.plot(pred, meas, ".", ms=3, alpha=0.6, color=style["color"])
    hi = float(np.nanmax(np.concatenate([pred, meas]))) if len(pred) else 1.0
    ax.plot([0, hi], [0, hi], "k--", lw=1, label="y = x")
    ax.legend()
    return _save(fig, path)
