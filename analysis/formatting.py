"""How the report writes numbers: values, deltas with their CI, and the A/A noise floor.

Shared by the report's tables (report.py) and the placement section (placement.py), so a number
reads the same in every table.
"""
from __future__ import annotations

import numpy as np

from analysis import stats


def fmt(v: float) -> str:
    if v is None or not np.isfinite(v):
        return "n/a"
    return f"{v:.1f}" if abs(v) >= 100 else f"{v:.2f}" if abs(v) >= 1 else f"{v:.3g}"


def fmt_delta(pct: float, lo: float, hi: float, why: str | None = None) -> str:
    """why: the reason a delta has no CI (stats.Delta.why); without one, too few sessions."""
    if not np.isfinite(pct):
        return "n/a"
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return f"{pct:+.1f}% [no CI: {why or f'< {stats.MIN_SESSIONS} sessions'}]"
    if hi - lo <= 1e-9 * max(1.0, abs(pct)):
        # Every resample gave the same delta: each session did the same work in both arms (a rate over the same
        # completed requests), so the delta is the windows' ratio and a CI of no width would read as certainty.
        return f"{pct:+.1f}% [no spread]"
    return f"{pct:+.1f}% [{lo:+.1f}, {hi:+.1f}]"


def fmt_floor(v, has_repeat: bool = True) -> str:
    if not has_repeat:
        return "no repeat"
    return f"±{v:.1f}%" if v is not None and np.isfinite(v) else "n/a"
