"""The primary per-request estimate of the kernel's effect on decode time per token.

Why not the ratio of matched means: a request whose decode overlapped another session's long prefill in
one arm only (chunked prefill interleaves them) is several times slower there, and the mean follows such
requests. The primary estimate works on each matched request's log-ratio r = log(tpot_b / tpot_a):
log makes 2x slower and 2x faster symmetric, and a robust centre of the r's ignores the few outliers.
It is reported as a percentage, (exp(centre) - 1) * 100: "a typical request got this much slower".

Candidates (all written for bootstrap weights, like analysis.stats): the median, a trimmed mean, the
Hodges-Lehmann estimate (median of pairwise averages), and the plain mean of r (not robust; kept as
a control). PRIMARY names the one chosen on recorded runs (BENCHMARKS.md, "Verdict calibration").

CI = centre +- t x its bootstrap standard error (small_sample_factor says why t; `estimate` why the
standard error is read from the replicates' 16-84% range). The bootstrap resamples
whole sessions (analysis.stats); when an arm pair ran more than once (ABBA: off/on and off.2/on.2), each
replicate first draws launches with replacement, then sessions within each, so the CI carries
launch-to-launch variance as well as request noise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from analysis import stats
from analysis.load import root_sessions

if TYPE_CHECKING:
    import pandas as pd

TRIM = 0.2            # fraction cut from each end by the trimmed mean
HL_MAX_PAIRS = 600    # Hodges-Lehmann's pairwise table is O(n^2) per replicate; above this, subsample
Z95, Z80 = 1.959964, 0.841621   # two-sided 5% test; 80% power
# One server launch's drift of the typical decode time per token, log units: what a session bootstrap
# inside one launch cannot see. Measured on the CPU emulator's quickstart (BENCHMARKS.md, "Verdict
# calibration"): across 12 launches of each arm, A/A centres (Hodges-Lehmann) spread by 0.39-0.47%
# against a within-launch standard error of 0.25-0.39%: sqrt((0.39^2 - 0.25^2) / 2) ~ 0.2% per launch.
# A single A/B run has two launches (off, on), so its CI adds 2 x LAUNCH_SD_LOG^2 in quadrature; where
# arms repeat (ABBA) the launch bootstrap measures it instead. A GPU host drifts more: repeat arms there.
LAUNCH_SD_LOG = 0.002
# Student's t 97.5% quantiles for 0..30 degrees of freedom (index = df; df 0 unused): scipy.stats.t.ppf
# (0.975, df) rounded to 3 places (scipy is not a dependency). Past 30: z + (z^3 + z) / (4 df), within 0.003.
T975 = (np.inf, 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052,
        2.048, 2.045, 2.042)


def trimmed_mean_stat(v: np.ndarray, w: np.ndarray, trim: float = TRIM) -> np.ndarray:
    """Per row of w [b, n] (v sorted): mean of the expanded sample without floor(trim * N) values
    at each end. A value straddling a cut counts for the copies inside it."""
    w = np.atleast_2d(w).astype(float)
    hi_cum = np.cumsum(w, axis=1)
    lo_cum = hi_cum - w
    total = hi_cum[:, -1:]
    k = np.floor(trim * total)
    keep = np.clip(np.minimum(hi_cum, total - k) - np.maximum(lo_cum, k), 0, None)
    tot = keep.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(tot > 0, (keep @ v) / tot, np.nan)


def hodges_lehmann_stat(v: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per row of w: the median of the Walsh averages (x_i + x_j) / 2, i <= j, of the expanded sample.
    Copies of one value pair with each other too: w_i (w_i + 1) / 2 pairs on the diagonal."""
    w = np.atleast_2d(w).astype(float)
    i, j = np.triu_indices(len(v))
    walsh = (v[i] + v[j]) / 2
    order = np.argsort(walsh, kind="stable")
    pw = np.where(i == j, w[:, i] * (w[:, i] + 1) / 2, w[:, i] * w[:, j])
    return stats.weighted_quantile(walsh[order], pw[:, order], 50)


ESTIMATORS: dict[str, stats.Stat] = {
    "median": stats.quantile_stat(50),
    "trimmed_mean": trimmed_mean_stat,
    "hodges_lehmann": hodges_lehmann_stat,
    "mean_log": stats.mean_stat,
}
PRIMARY = "trimmed_mean"   # BENCHMARKS.md, "Verdict calibration": narrowest CI at a fixed 5% false-alarm rate


def log_ratios(pairs: "pd.DataFrame", col: str = "tpot_ms") -> "pd.DataFrame":
    """Matched pairs (analysis.metrics.match_requests rows) -> session | launch | r, one row per pair with
    both values finite and positive. `launch` is the `pair` column when present (one per arm-run pair)."""
    import pandas as pd

    m = pairs[pairs["status"] == "matched"] if "status" in pairs else pairs
    a, b = m[f"{col}_a"].to_numpy(float), m[f"{col}_b"].to_numpy(float)
    keep = np.isfinite(a) & np.isfinite(b) & (a > 0) & (b > 0)
    launch = m["pair"].to_numpy()[keep] if "pair" in m else np.zeros(int(keep.sum()), dtype=int)
    return pd.DataFrame({"session": root_sessions(m["conversation_id"])[keep], "launch": launch,
                         "r": np.log(b[keep] / a[keep])})


def launch_session_weights(launch: np.ndarray, session: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """[n_boot, n] bootstrap multiplicity of each row: launches drawn with replacement (when more than
    one), then sessions drawn with replacement within each launch."""
    rng = np.random.default_rng(seed)
    launches, li = np.unique(launch.astype(str), return_inverse=True)
    w = np.zeros((n_boot, len(session)))
    lw = (rng.multinomial(len(launches), np.full(len(launches), 1 / len(launches)), size=n_boot)
          if len(launches) > 1 else np.ones((n_boot, 1)))
    for k in range(len(launches)):
        rows = li == k
        sess, si = np.unique(session[rows].astype(str), return_inverse=True)
        draws = rng.multinomial(len(sess), np.full(len(sess), 1 / len(sess)), size=n_boot)
        w[:, rows] = draws[:, si] * lw[:, k:k + 1]
    return w


@dataclass(frozen=True)
class Estimate:
    name: str
    pct: float        # (exp(centre) - 1) * 100
    lo: float         # 95% CI, percent; NaN with fewer than stats.MIN_SESSIONS sessions
    hi: float
    se_log: float     # bootstrap standard error of the centre (half its 16-84% range), log units
    n: int            # matched pairs
    sessions: int
    launches: int
    se_launch: float = 0.0   # the assumed launch drift inside se_log (one launch pair), which no window shrinks

    def excludes_zero(self) -> bool:
        return bool(self.lo > 0 or self.hi < 0)

    @property
    def width(self) -> float:
        return self.hi - self.lo

    def mde_log(self) -> float:
        """Smallest true effect (log units) this noise would detect 80% of the time at the 5% level: the
        CI's half-width multiplier plus the normal's 80% quantile, times the standard error."""
        return float((small_sample_factor(self.sessions) + Z80) * self.se_log)

    def mde_pct(self) -> float:
        return float(np.expm1(self.mde_log()) * 100)


def _pct(x):
    return (np.exp(x) - 1) * 100


def estimate(lr: "pd.DataFrame", name: str = PRIMARY, n_boot: int = stats.N_BOOT, seed: int = stats.SEED,
             level: float = 95.0, launch_sd: float = LAUNCH_SD_LOG) -> Estimate:
    """One estimator's centre and session(-and-launch) bootstrap CI from a log_ratios frame; with a
    single launch pair, 2 x launch_sd^2 joins the variance (LAUNCH_SD_LOG says why)."""
    stat = ESTIMATORS[name]
    lr = lr.sort_values("r", kind="stable")
    if name == "hodges_lehmann" and len(lr) > HL_MAX_PAIRS:
        lr = lr.sample(HL_MAX_PAIRS, random_state=seed).sort_values("r", kind="stable")
    v, sess, launch = lr["r"].to_numpy(float), lr["session"].to_numpy(), lr["launch"].to_numpy()
    n_sess, n_launch = len(set(map(str, sess))), len(set(map(str, launch)))
    if len(v) == 0:
        return Estimate(name, np.nan, np.nan, np.nan, np.nan, 0, 0, 0)
    centre = float(stat(v, np.ones((1, len(v))))[0])
    if n_sess < stats.MIN_SESSIONS:
        return Estimate(name, float(_pct(centre)), np.nan, np.nan, np.nan, len(v), n_sess, n_launch)
    w = launch_session_weights(launch, sess, n_boot, seed)
    reps = np.concatenate([stat(v, w[s:s + stats.CHUNK]) for s in range(0, n_boot, stats.CHUNK)])
    # The standard error from the replicates' central 68% (half the 16-84% range), not their SD: a robust
    # centre jumps in the rare replicate that draws an outlier's session many times, and those few
    # replicates would set an SD; for a normal spread the two agree.
    lo16, hi84 = np.percentile(reps[np.isfinite(reps)], [15.87, 84.13])
    se = float(hi84 - lo16) / 2
    se_launch = float(np.sqrt(2) * launch_sd) if n_launch == 1 else 0.0
    se = float(np.hypot(se, se_launch))
    half = small_sample_factor(n_sess, level) * se
    return Estimate(name, float(_pct(centre)), float(_pct(centre - half)), float(_pct(centre + half)), se,
                    len(v), n_sess, n_launch, se_launch)


def small_sample_factor(n_sessions: int, level: float = 95.0) -> float:
    """Multiplier of the bootstrap standard error for the CI's half-width: Student's t with G - 1 degrees
    of freedom, times sqrt(G / (G - 1)), G = sessions. Why: with ~10 sessions a percentile session
    bootstrap under-covers (its replicates see fewer distinct sessions than the population has); on
    synthetic A/A data it claimed an effect 13-17% of the time at a nominal 5% (tests/analysis/
    test_estimate.py keeps the corrected rate at 5% or under)."""
    if level != 95.0:
        raise ValueError(f"level: {level} is not supported; allowed: 95.0 (the table below is for 95%)")
    g = max(n_sessions, 2)
    df = g - 1
    t = T975[df] if df < len(T975) else Z95 + (Z95 ** 3 + Z95) / (4 * df)
    return float(t * np.sqrt(g / (g - 1)))


def compare_estimators(lr: "pd.DataFrame", n_boot: int = stats.N_BOOT, seed: int = stats.SEED) -> "pd.DataFrame":
    """estimator | pct | lo | hi | width | excludes_zero, for every candidate on one log_ratios frame."""
    import pandas as pd

    rows = []
    for name in ESTIMATORS:
        e = estimate(lr, name, n_boot, seed)
        rows.append({"estimator": name, "pct": e.pct, "lo": e.lo, "hi": e.hi, "width": e.width,
                     "excludes_zero": e.excludes_zero(), "n": e.n, "sessions": e.sessions})
    return pd.DataFrame(rows)


def window_for_effect(window_s: float, e: Estimate, target_pct: float) -> float:
    """Window length that would detect `target_pct` at this noise: the requests' part of the standard error
    narrows as 1/sqrt(matched requests), and matched requests grow in proportion to the window (same load, same
    sessions); the launch drift (se_launch) stays. inf where the drift alone is too large for `target_pct`: then
    only repeated arms (ABBA) can show it."""
    k = small_sample_factor(e.sessions) + Z80
    if not (np.isfinite(e.se_log) and target_pct > 0):
        return float("nan")
    se_requests_sq = e.se_log ** 2 - e.se_launch ** 2
    room = (np.log1p(target_pct / 100) / k) ** 2 - e.se_launch ** 2
    if room <= 0:
        return float("inf")
    return float(window_s * se_requests_sq / room)
