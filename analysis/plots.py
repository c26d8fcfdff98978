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
    """Empirical CDF of per-request TPOT, one line per arm, styled by `styles` (comparison_styles)."""
    fig, ax = _figure("TPOT per request: CDF", "TPOT (ms)", "fraction of requests")
    for label, v in tpot_by_arm.items():
        v = np.sort(np.asarray(v, float))
        ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=f"{label} (n={len(v)})",
                **styles[label])
    ax.legend()
    return _save(fig, path)


def delta_histogram(deltas: np.ndarray, path: Path, label: str) -> Path:
    """Histogram of matched per-request TPOT delta %, with zero and the median marked."""
    d = np.asarray(deltas, float)
    d = d[np.isfinite(d)]
    fig, ax = _figure(f"Matched requests: TPOT delta {label} (n={len(d)})", "TPOT delta (%)", "requests")
    ax.hist(d, bins=max(10, min(60, len(d) // 4)), color=COLORS[0], alpha=0.8)
    ax.axvline(0, color="black", lw=1)
    if len(d):
        ax.axvline(float(np.median(d)), color=COLORS[3], ls="--", label=f"median {np.median(d):+.1f}%")
        ax.legend()
    return _save(fig, path)


def tpot_over_time(frames: dict[str, "pd.DataFrame"], path: Path, styles: dict[str, Style]) -> Path:
    """Per-request TPOT against seconds since the arm run's first request, one series per arm run, styled by
    `styles` (comparison_styles)."""
    fig, ax = _figure("TPOT over the measured window", "seconds since first request", "TPOT (ms)")
    for label, f in frames.items():
        f = f.sort_values("start_ns")
        t = (f["start_ns"] - f["start_ns"].min()) / 1e9
        ax.plot(t, f["tpot_ms"], ".", ms=3, alpha=0.5, color=styles[label]["color"])
        # A rolling median shows drift (thermal, cache warm-up) that single points hide.
        roll = f["tpot_ms"].rolling(max(1, len(f) // 10), min_periods=1, center=True).median()
        ax.plot(t, roll, label=label, **styles[label])
    ax.legend()
    return _save(fig, path)


def step_time_distribution(steps_by_arm: dict[str, np.ndarray], path: Path, unit: str,
                           styles: dict[str, Style]) -> Path:
    """Emulator: distribution of modelled step (speculative cycle) time per arm, coloured by `styles`."""
    fig, ax = _figure("Emulator step time per arm", f"step time ({unit}, log scale)", "cycles")
    vals = [np.asarray(v, float) for v in steps_by_arm.values()]
    pos = np.concatenate([v[v > 0] for v in vals]) if vals else np.array([])
    # Prefill cycles are 10-100x longer than decode cycles: log bins keep both visible.
    bins = np.geomspace(pos.min(), pos.max() * 1.001, 50) if len(pos) and pos.max() > pos.min() else 40
    for label, v in zip(steps_by_arm, vals):
        ax.hist(v[v > 0], bins=bins, alpha=0.5, label=label, color=styles[label]["color"])
    if len(pos):
        ax.set_xscale("log")
    ax.legend()
    return _save(fig, path)


def predicted_vs_measured(pred: np.ndarray, meas: np.ndarray, path: Path, style: Style) -> Path:
    """Kernel in the loop: cost-model attention time against the kernel's measured time, in the arm's colour."""
    fig, ax = _figure("Attention time: predicted vs measured", "predicted (us)", "measured (us)")
    ax.plot(pred, meas, ".", ms=3, alpha=0.6, color=style["color"])
    hi = float(np.nanmax(np.concatenate([pred, meas]))) if len(pred) else 1.0
    ax.plot([0, hi], [0, hi], "k--", lw=1, label="y = x")
    ax.legend()
    return _save(fig, path)
