"""The primary per-request estimate of the kernel's effect on decode time per token.

Why not the ratio of matched means: a request whose decode overlapped another session's long prefill in
one arm only (chunked prefill interleaves them) is several times slower there, and the mean follows such
requests. The primary estimate works on each matched request's log-ratio r = log(tpot_b / tpot_a):
log makes 2x slower and 2x faster symmetric, and a robust centre of the r's ignores the few outliers.
It is reported as a percentage, (exp(centre) - 1) * 100: "a typical request got this much slower".

Candidates (all written for bootstrap weights, like analysis.stats): the median, a trimmed mean, the
Hodges-Lehmann estimate (median of pairwise averages), and the plain mean of r (not robust; kept as
a control). PRIMARY names the one chosen on recorded runs (BENCHMARKS.md, "Verdict calibration").

CI = centre +- t x its standard error (small_sample_factor says why t; `estimate` why the
standard error is read from the replicates' 16-84% range). The bootstrap resamples whole sessions
(analysis.stats). When an arm pair ran more than once (ABBA: off/on and off.2/on.2), every launch replays
the same sessions, so a replicate draws sessions once and gives a session the same weight in every launch
(a session's own difficulty is shared by the launches); the launch-to-launch drift, which no session
draw can see, comes from the spread of the per-launch centres with the unbiased divisor L - 1, and the
two combine with Welch-Satterthwaite degrees of freedom (launch_variance says how). The CI then covers
what another set of launches of the same sessions would give, not only these launches.
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


def session_weights(session: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """[n_boot, n] bootstrap multiplicity of each row: sessions drawn with replacement, one draw for all
    launches (launches replay the same sessions, so a session id names one conversation in each)."""
    rng = np.random.default_rng(seed)
    sess, si = np.unique(session.astype(str), return_inverse=True)
    return rng.multinomial(len(sess), np.full(len(sess), 1 / len(sess)), size=n_boot)[:, si]


def t975(df: float) -> float:
    """Student's t 97.5% quantile at fractional df (Welch-Satterthwaite), linear between the table's whole
    dfs: t is convex in df, so this errs wide."""
    df = max(float(df), 1.0)
    if df >= len(T975) - 1:
        return float(Z95 + (Z95 ** 3 + Z95) / (4 * df))
    lo = int(df)
    return float(T975[lo] + (T975[lo + 1] - T975[lo]) * (df - lo))


def _se(reps: np.ndarray) -> np.ndarray:
    """Half the 16-84% range per column (`estimate` says why not the SD)."""
    lo16, hi84 = np.nanpercentile(reps, [15.87, 84.13], axis=0)
    return (hi84 - lo16) / 2


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
    se_launch: float = 0.0   # the launch drift inside se_log (assumed for one launch pair), which no window shrinks
    k: float = float("nan")  # CI half-width / se_log: t x sqrt(G / (G - 1)) (one launch pair) or Welch's t (several)
    launch_pcts: tuple = ()  # per-launch centres, percent, when launches repeat

    def excludes_zero(self) -> bool:
        return bool(self.lo > 0 or self.hi < 0)

    @property
    def width(self) -> float:
        return self.hi - self.lo

    def mde_log(self) -> float:
        """Smallest true effect (log units) this noise would detect 80% of the time at the 5% level: the
        CI's half-width multiplier plus the normal's 80% quantile, times the standard error."""
        k = self.k if np.isfinite(self.k) else small_sample_factor(self.sessions)
        return float((k + Z80) * self.se_log)

    def launches_disagree(self) -> bool:
        """More than half the variance is the launches' spread beyond what request noise explains: the CI is
        then set by a handful of launches, and is wide for that reason."""
        return bool(self.launches > 1 and self.se_launch ** 2 > 0.5 * self.se_log ** 2)

    def mde_pct(self) -> float:
        return float(np.expm1(self.mde_log()) * 100)


def _pct(x):
    return (np.exp(x) - 1) * 100


def estimate(lr: "pd.DataFrame", name: str = PRIMARY, n_boot: int = stats.N_BOOT, seed: int = stats.SEED,
             level: float = 95.0, launch_sd: float = LAUNCH_SD_LOG) -> Estimate:
    """One estimator's centre and session bootstrap CI from a log_ratios frame; with a single launch pair,
    2 x launch_sd^2 joins the variance (LAUNCH_SD_LOG says why), with several the launches' own spread does
    (launch_variance)."""
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
    if level != 95.0:
        raise ValueError(f"level: {level} is not supported; allowed: 95.0 (the t table is for 95%)")
    w = session_weights(sess, n_boot, seed)
    reps = np.concatenate([stat(v, w[s:s + stats.CHUNK]) for s in range(0, n_boot, stats.CHUNK)])
    # The standard error from the replicates' central 68% (half the 16-84% range), not their SD: a robust
    # centre jumps in the rare replicate that draws an outlier's session many times, and those few
    # replicates would set an SD; for a normal spread the two agree.
    se = float(_se(reps))
    if n_launch == 1:
        se_launch = float(np.sqrt(2) * launch_sd)
        se = float(np.hypot(se, se_launch))
        k = small_sample_factor(n_sess, level)
        launch_pcts: tuple = ()
    else:
        var, var_launch, df, centres = launch_variance(v, sess, launch, w, se ** 2, stat)
        se, se_launch, k = float(np.sqrt(var)), float(np.sqrt(var_launch)), t975(df)
        launch_pcts = tuple(float(_pct(c)) for c in centres)
    half = k * se
    return Estimate(name, float(_pct(centre)), float(_pct(centre - half)), float(_pct(centre + half)), se,
                    len(v), n_sess, n_launch, se_launch, k, launch_pcts)


def launch_variance(v, sess, launch, w, var_boot: float, stat: stats.Stat):
    """Several launch pairs -> (variance of the centre, its launch-drift part, Welch-Satterthwaite df,
    per-launch centres). With per-launch centres c_l = S + d_l + e_l (S: the sessions' shared part, d_l:
    launch drift, e_l: that launch's own request noise), the pooled centre's variance is
    Var(S) + Var(d + e) / L. The joint session bootstrap measures Var(S) + Var(e) / L (var_boot) and, from
    the replicates' per-launch centres, Var(e) / L alone (v_e); the launches' spread s^2 / L (divisor
    L - 1) measures Var(d + e) / L with L - 1 df. So: V = max(0, var_boot - v_e) [G - 1 df] + max(s^2 / L,
    v_e) [L - 1 df]. Flooring the launch term at v_e, its known noise part, keeps two launches that agree
    by chance from reading as no drift: without it, two launches under 1% drift alarmed 9% of the time at
    a nominal 5% (simulated; tests/analysis/test_estimate.py checks the floored rule's coverage)."""
    ids = sorted(set(map(str, launch)))
    lab = launch.astype(str)
    g, n_l = len(set(map(str, sess))), len(ids)
    infl = g / (g - 1)   # the bootstrap's plug-in divisor G understates a variance by (G - 1) / G
    centres = np.array([stat(v[lab == i], np.ones((1, int((lab == i).sum()))))[0] for i in ids])
    per = np.stack([np.concatenate([stat(v[lab == i], w[s:s + stats.CHUNK][:, lab == i])
                                    for s in range(0, len(w), stats.CHUNK)]) for i in ids], axis=1)
    dev = per - np.nanmean(per, axis=1, keepdims=True)
    v_e = float(np.sum(_se(dev) ** 2)) / (n_l * (n_l - 1)) * infl
    v_s = max(0.0, var_boot * infl - v_e)
    v_l = max(float(np.var(centres, ddof=1)) / n_l, v_e)
    var = v_s + v_l
    df = var ** 2 / (v_s ** 2 / (g - 1) + v_l ** 2 / (n_l - 1))
    return var, v_l - v_e, df, centres


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
    sessions); the launch drift (se_launch: assumed for one launch pair, measured over repeated ones) stays.
    inf where the drift alone is too large for `target_pct`: then only more launch pairs can show it. With
    repeated launches the CI's multiplier (Welch's t) is held at this run's, though it would change too."""
    k = (e.k if np.isfinite(e.k) else small_sample_factor(e.sessions)) + Z80
    if not (np.isfinite(e.se_log) and target_pct > 0):
        return float("nan")
    se_requests_sq = e.se_log ** 2 - e.se_launch ** 2
    room = (np.log1p(target_pct / 100) / k) ** 2 - e.se_launch ** 2
    if room <= 0:
        return float("inf")
    return float(window_s * se_requests_sq / room)
