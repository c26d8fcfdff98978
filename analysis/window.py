"""Output throughput over equal windows: tokens emitted inside the same fixed-length window in each arm.

Why: aiperf's window ends when its last in-flight request ends (or the grace period runs out), so an arm
whose requests spill into the grace period measures over a longer window, and tokens / window then
differs between arms that served the same tokens at the same rate. Counting the tokens each arm emitted
in [start, start + W), with the same W for both, removes that.

A request's token timeline is taken from its record: the first token at start + TTFT, the other
osl - 1 tokens spread evenly up to its end (the same assumption as aiperf's inter-token latency).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd


def tokens_in_window(records: "pd.DataFrame", t0_ns: float, window_s: float) -> "pd.Series":
    """Per completed record: output tokens emitted in [t0, t0 + window). Index as `records`."""
    ok = records[records["ok"]]
    t1 = t0_ns + window_s * 1e9
    first = ok["start_ns"].to_numpy(float) + ok["ttft_ms"].to_numpy(float) * 1e6
    end = ok["end_ns"].to_numpy(float)
    osl = ok["osl"].to_numpy(float)
    first_in = ((first >= t0_ns) & (first < t1)).astype(float)
    span = end - first
    overlap = np.clip(np.minimum(end, t1) - np.maximum(first, t0_ns), 0, None)
    # The decode tokens arrive over (first, end]; a zero span puts them all at `first`.
    frac = np.where(span > 0, overlap / np.where(span > 0, span, 1), first_in)
    return ok.assign(_t=first_in + (osl - 1).clip(min=0) * frac)["_t"]


def window_start_ns(records: "pd.DataFrame", phase_window_ns: tuple[int, int] | None) -> float:
    """The profiling phase's start when aiperf recorded it, else the first request's start."""
    if phase_window_ns is not None and phase_window_ns[1] > phase_window_ns[0]:
        return float(phase_window_ns[0])
    return float(records["start_ns"].min())


def equal_window(windows_s: list[float], duration_s: float | None) -> float:
    """The common window: the recipe's benchmark duration when known, never longer than any arm's."""
    w = min(windows_s)
    return float(min(w, duration_s)) if duration_s and duration_s > 0 else float(w)
