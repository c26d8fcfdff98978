"""Statistics for A/B deltas: session-clustered bootstrap, sign test, A/A noise floor.

Why sessions, not requests: turns of one agentic session share a growing
context, so their latencies are correlated; resampling single requests would
pretend there is more independent data than there is and give CIs too narrow.
A bootstrap replicate draws whole sessions with replacement, which is the same
as giving every request the multiplicity of its session: a weight matrix
W [B, n_requests]. Every statistic below is written for such weights, so one
code path gives the point estimate (W = ones) and all B replicates, vectorised.

Both arms replay the same trace, so a session id names the same conversation in
either arm; a replicate reuses one session draw for both arms (paired), which
cancels per-session differences (context length) out of the delta.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from math import comb
from typing import Callable

import numpy as np

N_BOOT = 2000
SEED = 20240917          # fixed: the same run dir gives the same CIs every time
CHUNK = 256              # replicates per block, to bound memory at [CHUNK, n_requests]
# Below this many sessions a session bootstrap has too few distinct resamples to mean anything
# (2 sessions give 3 distinct draws); the report then says "no CI" rather than a confident range. Counted per
# arm: an arm's statistic varies only with its own sessions, and the other arm's do not make up for them.
MIN_SESSIONS = 5
# A replicate whose delta is undefined (an arm drew none of its sessions, or its statistic was 0) cannot just be
# dropped: the CI would then describe only the draws that happened to work. With MIN_SESSIONS sessions in an arm,
# missing all of them happens in about e^-5 = 0.7% of replicates; past this share the report gives no CI.
MAX_UNDEFINED_SHARE = 0.01

# A statistic maps (values [n], weights [b, n]) -> [b]; values are pre-sorted where it matters.
Stat = Callable[[np.ndarray, np.ndarray], np.ndarray]


def weighted_quantile(sorted_values: np.ndarray, weights: np.ndarray, q: float) -> np.ndarray:
    """Per row of `weights` [b, n]: np.percentile(np.repeat(sorted_values, w), q) (linear method).

    Rank r of the expanded sample is the first index whose cumulative weight exceeds r.
    Rows with zero total weight give NaN.
    """
    w = np.atleast_2d(weights)
    cum = np.cumsum(w, axis=1)                       # [b, n]
    total = cum[:, -1]
    h = (total - 1) * (q / 100.0)
    lo = np.floor(h)
    hi = np.minimum(lo + 1, total - 1)
    n = len(sorted_values)
    idx_lo = np.minimum((cum <= lo[:, None]).sum(axis=1), n - 1)
    idx_hi = np.minimum((cum <= hi[:, None]).sum(axis=1), n - 1)
    v_lo, v_hi = sorted_values[idx_lo], sorted_values[idx_hi]
    out = v_lo + (h - lo) * (v_hi - v_lo)
    return np.where(total > 0, out, np.nan)


def quantile_stat(q: float) -> Stat:
    return lambda v, w: weighted_quantile(v, w, q)


def inverse_quantile_stat(q: float, scale: float = 1000.0) -> Stat:
    """scale / quantile: interactivity (tok/s/user) from TPOT in ms."""
    return lambda v, w: scale / weighted_quantile(v, w, q)


def mean_stat(v: np.ndarray, w: np.ndarray) -> np.ndarray:
    w = np.atleast_2d(w)
    tot = w.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(tot > 0, (w @ v) / tot, np.nan)


def rate_stat(denominator: float) -> Stat:
    """Weighted sum / denominator: output tokens per second of window, requests per run."""
    return lambda v, w: (np.atleast_2d(w) @ v) / denominator


@dataclass(frozen=True)
class Sample:
    """One arm's values for one statistic, with each value's session index into a shared session list."""
    values: np.ndarray       # [n], sorted ascending
    sessions: np.ndarray     # [n] int, index into the session list
    stat: Stat


def make_sample(values, sessions, session_list: list, stat: Stat) -> Sample:
    values = np.asarray(values, dtype=float)
    pos = {s: i for i, s in enumerate(session_list)}
    idx = np.array([pos[s] for s in sessions], dtype=np.int64)
    order = np.argsort(values, kind="stable")
    return Sample(values[order], idx[order], stat)


def session_draws(n_sessions: int, n_boot: int, seed: int) -> np.ndarray:
    """[n_boot, n_sessions] multiplicity of each session in each replicate."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_sessions, np.full(n_sessions, 1.0 / n_sessions), size=n_boot)


def delta_pct(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return (b - a) / a * 100.0


@dataclass(frozen=True)
class Delta:
    a: float
    b: float
    pct: float          # (b - a) / a, percent
    lo: float           # 95% CI of pct; NaN when fewer than MIN_SESSIONS sessions
    hi: float
    sessions: int = 0   # distinct sessions behind the estimate (the smaller arm's count)
    why: str = ""       # why there is no CI, when lo and hi are NaN

    def excludes_zero(self) -> bool:
        return bool(self.lo > 0 or self.hi < 0)


def paired_bootstrap(a: Sample, b: Sample, n_sessions: int, n_boot: int = N_BOOT, seed: int = SEED,
                     level: float = 95.0) -> Delta:
    """Delta % of b over a with a session-clustered percentile-bootstrap CI."""
    pa = float(a.stat(a.values, np.ones((1, len(a.values))))[0])
    pb = float(b.stat(b.values, np.ones((1, len(b.values))))[0])
    pct = float(delta_pct(np.float64(pa), np.float64(pb)))
    nan = float("nan")
    present = min(len(np.unique(a.sessions)), len(np.unique(b.sessions)))
    if present < MIN_SESSIONS:
        return Delta(pa, pb, pct, nan, nan, present, f"< {MIN_SESSIONS} sessions")
    draws = session_draws(n_sessions, n_boot, seed)
    reps = []
    for s in range(0, n_boot, CHUNK):
        c = draws[s:s + CHUNK]
        reps.append(delta_pct(a.stat(a.values, c[:, a.sessions]), b.stat(b.values, c[:, b.sessions])))
    d = np.concatenate(reps)
    undefined = float(np.mean(~np.isfinite(d)))
    if undefined > MAX_UNDEFINED_SHARE:
        return Delta(pa, pb, pct, nan, nan, present, f"undefined in {undefined:.0%} of resamples")
    tail = (100.0 - level) / 2
    lo, hi = np.percentile(d[np.isfinite(d)], [tail, 100 - tail])
    return Delta(pa, pb, pct, float(lo), float(hi), present)


def paired_ratio_bootstrap(a: np.ndarray, b: np.ndarray, sessions: np.ndarray, n_boot: int = N_BOOT,
                           seed: int = SEED) -> Delta:
    """Matched pairs: delta % of mean(b) over mean(a), CI by resampling sessions of the pairs."""
    uniq, idx = np.unique(np.asarray(sessions), return_inverse=True)
    a, b = np.asarray(a, float), np.asarray(b, float)
    sa = Sample(a, idx, mean_stat)
    sb = Sample(b, idx, mean_stat)
    return paired_bootstrap(sa, sb, len(uniq), n_boot, seed)


def session_sign_test(diffs, sessions) -> float:
    """The sign test's p over sessions, each its requests' median difference: a session's turns share a context
    and move together, so 94 requests in 13 sessions are 13 signs, not 94."""
    import pandas as pd

    by_session = pd.Series(np.asarray(diffs, dtype=float)).groupby(np.asarray(sessions).astype(str)).median()
    return sign_test(by_session.to_numpy())[2]


def sign_test(diffs) -> tuple[int, int, float]:
    """Exact two-sided sign test on paired differences (b - a); ties dropped.

    Returns (n_negative, n_positive, p). p = P(|X - n/2| >= |k - n/2|), X ~ Bin(n, 1/2).
    """
    d = np.asarray(diffs, dtype=float)
    d = d[np.isfinite(d) & (d != 0)]
    neg, pos = int((d < 0).sum()), int((d > 0).sum())
    n = neg + pos
    if n == 0:
        return 0, 0, 1.0
    k = min(neg, pos)
    tail = sum(comb(n, i) for i in range(k + 1))
    return neg, pos, float(min(Fraction(1), Fraction(2 * tail, 2 ** n)))


def noise_floor(aa: Delta) -> float:
    """Smallest effect an A/A comparison can tell from drift: the largest |delta| inside its 95% CI."""
    return float(max(abs(aa.lo), abs(aa.hi)))
