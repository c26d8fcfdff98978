"""Report figures (matplotlib, Agg backend, PNG). Each function draws one figure and saves it to `path`."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

COLORS = {0: "#4c72b0", 1: "#dd8452", 2: "#55a868", 3: "#c44e52"}


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


def tpot_cdf(tpot_by_arm: dict[str, np.ndarray], path: Path) -> Path:
    """Empirical CDF of per-request TPOT, one line per arm."""
    fig, ax = _figure("TPOT per request: CDF", "TPOT (ms)", "fraction of requests")
    for i, (label, v) in enumerate(tpot_by_arm.items()):
        v = np.sort(np.asarray(v, float))
        ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=f"{label} (n={len(v)})",
                color=COLORS[i % 4])
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


def tpot_over_time(frames: dict[str, "pd.DataFrame"], path: Path) -> Path:
    """Per-request TPOT against seconds since the arm run's first request, one series per arm run."""
    fig, ax = _figure("TPOT over the measured window", "seconds since first request", "TPOT (ms)")
    for i, (label, f) in enumerate(frames.items()):
        f = f.sort_values("start_ns")
        t = (f["start_ns"] - f["start_ns"].min()) / 1e9
        ax.plot(t, f["tpot_ms"], ".", ms=3, alpha=0.5, color=COLORS[i % 4])
        # A rolling median shows drift (thermal, cache warm-up) that single points hide.
        roll = f["tpot_ms"].rolling(max(1, len(f) // 10), min_periods=1, center=True).median()
        ax.plot(t, roll, "-", color=COLORS[i % 4], label=label)
    ax.legend()
    return _save(fig, path)


def step_time_distribution(steps_by_arm: dict[str, np.ndarray], path: Path, unit: str) -> Path:
    """Emulator: distribution of modelled step (speculative cycle) time per arm."""
    fig, ax = _figure("Emulator step time per arm", f"step time ({unit}, log scale)", "cycles")
    vals = [np.asarray(v, float) for v in steps_by_arm.values()]
    pos = np.concatenate([v[v > 0] for v in vals]) if vals else np.array([])
    # Prefill cycles are 10-100x longer than decode cycles: log bins keep both visible.
    bins = np.geomspace(pos.min(), pos.max() * 1.001, 50) if len(pos) and pos.max() > pos.min() else 40
    for i, (label, v) in enumerate(zip(steps_by_arm, vals)):
        ax.hist(v[v > 0], bins=bins, alpha=0.5, label=label, color=COLORS[i % 4])
    if len(pos):
        ax.set_xscale("log")
    ax.legend()
    return _save(fig, path)


def predicted_vs_measured(pred: np.ndarray, meas: np.ndarray, path: Path) -> Path:
    """Kernel in the loop: cost-model attention time against the kernel's measured time."""
    fig, ax = _figure("Attention time: predicted vs measured", "predicted (us)", "measured (us)")
    ax.plot(pred, meas, ".", ms=3, alpha=0.6, color=COLORS[0])
    hi = float(np.nanmax(np.concatenate([pred, meas]))) if len(pred) else 1.0
    ax.plot([0, hi], [0, hi], "k--", lw=1, label="y = x")
    ax.legend()
    return _save(fig, path)
