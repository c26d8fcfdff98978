"""Per-arm metrics and matched-request comparison: pure DataFrame -> DataFrame functions.

Input frames are `analysis.load` record frames (one row per profiling request,
with `occurrence` from `add_match_key`). Percentiles are numpy's default
(linear interpolation between order statistics), the same as `np.percentile`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from analysis import stats
from analysis.load import root_sessions

if TYPE_CHECKING:
    import pandas as pd

KEY = ["conversation_id", "turn_index", "occurrence"]


def percentile(values, q: float) -> float:
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    return float(np.percentile(v, q)) if len(v) else float("nan")


@dataclass(frozen=True)
class ArmData:
    """One arm, all its runs pooled: completed requests, total measured seconds, number of runs."""
    frame: "pd.DataFrame"
    window_s: float
    n_runs: int = 1

    @property
    def ok(self) -> "pd.DataFrame":
        return self.frame[self.frame["ok"]]


@dataclass(frozen=True)
class MetricSpec:
    key: str
    label: str
    column: str
    make_stat: Callable[[ArmData | None], stats.Stat]   # None for a per-request row over matched requests
    higher_is_better: bool = False
    no_ci: str = ""   # why the row gets no CI, where a session bootstrap would misstate its uncertainty
    # A per-request latency statistic: compared over matched requests (matched_arm_deltas), since requests only the
    # faster arm got to send (late turns, prefix-cache hits) move an arm's own percentile without the kernel moving
    # any request. A rate (False) is compared over each arm's own requests: more requests served is its point.
    per_request: bool = True


ARM_METRICS = [
    MetricSpec("tpot_p50", "TPOT p50 (ms)", "tpot_ms", lambda d: stats.quantile_stat(50)),
    MetricSpec("tpot_mean", "TPOT mean (ms)", "tpot_ms", lambda d: stats.mean_stat),
    MetricSpec("tpot_p90", "TPOT p90 (ms)", "tpot_ms", lambda d: stats.quantile_stat(90)),
    MetricSpec("inter_p50", "Interactivity at TPOT p50 (tok/s/user)", "tpot_ms",
               lambda d: stats.inverse_quantile_stat(50), higher_is_better=True),
    MetricSpec("inter_p90", "Interactivity at TPOT p90 (tok/s/user)", "tpot_ms",
               lambda d: stats.inverse_quantile_stat(90), higher_is_better=True),
    MetricSpec("ttft_p50", "TTFT p50 (ms)", "ttft_ms", lambda d: stats.quantile_stat(50)),
    MetricSpec("e2e_p90", "E2E latency p90 (ms)", "latency_ms", lambda d: stats.quantile_stat(90)),
    # The own window ends at the arm's last request's end, set by one request (quickstart: off's last three
    # ends 60.8, 61.7, 65.4 s); a session bootstrap holds that denominator fixed, so its CI was far too narrow
    # (identical calibration runs moved this row -12.9%, -11.5%, +37.9%). The equal-window row has the CI.
    MetricSpec("throughput", "Output throughput, own window (context) (tok/s)", "osl",
               lambda d: stats.rate_stat(d.window_s), higher_is_better=True,
               no_ci="its window ends at one request's end; see the equal-window row", per_request=False),
    MetricSpec("completed", "Requests completed (per run)", "one",
               lambda d: stats.rate_stat(d.n_runs), higher_is_better=True, per_request=False),
]


def _sample(d: ArmData, spec: MetricSpec, sessions: list) -> stats.Sample:
    ok = d.ok
    vals = np.ones(len(ok)) if spec.column == "one" else ok[spec.column].to_numpy(float)
    keep = np.isfinite(vals)
    return stats.make_sample(vals[keep], root_sessions(ok["conversation_id"])[keep], sessions, spec.make_stat(d))


def arm_deltas(a: ArmData, b: ArmData, n_boot: int = stats.N_BOOT, seed: int = stats.SEED) -> "pd.DataFrame":
    """metric | a | b | delta_pct | lo | hi for every ARM_METRICS entry over each arm's own completed requests,
    CIs by paired session bootstrap. Where the arms completed different requests, a per-request row's delta
    compares different requests: matched_arm_deltas gives those rows over the same ones."""
    import pandas as pd

    sessions = sorted({*root_sessions(a.ok["conversation_id"]), *root_sessions(b.ok["conversation_id"])}, key=str)
    rows = []
    for spec in ARM_METRICS:
        d = stats.paired_bootstrap(_sample(a, spec, sessions), _sample(b, spec, sessions), len(sessions), n_boot, seed)
        if spec.no_ci:
            d = stats.Delta(d.a, d.b, d.pct, float("nan"), float("nan"), d.sessions, spec.no_ci)
        rows.append({"key": spec.key, "metric": spec.label, "a": d.a, "b": d.b, "delta_pct": d.pct,
                     "lo": d.lo, "hi": d.hi, "sessions": d.sessions, "why": d.why,
                     "higher_is_better": spec.higher_is_better})
    return pd.DataFrame(rows)


def matched_arm_deltas(m: "pd.DataFrame", n_boot: int = stats.N_BOOT, seed: int = stats.SEED) -> "pd.DataFrame":
    """metric | n | a | b | delta_pct | lo | hi for the per-request ARM_METRICS entries over the matched requests of
    `m` (match_requests, or several stacked: analysis.compare.matched_pairs): each arm's statistic over the same
    requests. A resample draws sessions and gives a request's two values its session's weight in both arms, so
    pairs stay together; stacked launch pairs replay the same sessions and share one draw, as the verdict's do."""
    import pandas as pd

    pairs = m[m["status"] == "matched"]
    sess = root_sessions(pairs["conversation_id"])
    sessions = sorted(set(sess), key=str)
    rows = []
    for spec in (s for s in ARM_METRICS if s.per_request):
        xa, xb = pairs[f"{spec.column}_a"].to_numpy(float), pairs[f"{spec.column}_b"].to_numpy(float)
        keep = np.isfinite(xa) & np.isfinite(xb)
        stat = spec.make_stat(None)  # a per-request statistic reads no arm-level figure (window, runs)
        if keep.any():
            d = stats.paired_bootstrap(stats.make_sample(xa[keep], sess[keep], sessions, stat),
                                       stats.make_sample(xb[keep], sess[keep], sessions, stat),
                                       len(sessions), n_boot, seed)
        else:
            nan = float("nan")
            d = stats.Delta(nan, nan, nan, nan, nan, 0, "no request completed in both arms")
        rows.append({"key": spec.key, "metric": spec.label, "n": int(keep.sum()), "a": d.a, "b": d.b,
                     "delta_pct": d.pct, "lo": d.lo, "hi": d.hi, "sessions": d.sessions, "why": d.why,
                     "higher_is_better": spec.higher_is_better})
    return pd.DataFrame(rows)


def match_requests(a: "pd.DataFrame", b: "pd.DataFrame") -> "pd.DataFrame":
    """Outer join of two arms' records on (conversation_id, turn_index, occurrence).

    Adds `status`: "matched" (both completed), "only_a"/"only_b" (dispatched in
    one arm only), "failed_a"/"failed_b"/"failed_both" (dispatched in both, not
    completed in the named arm).
    """
    m = a.merge(b, on=KEY, how="outer", suffixes=("_a", "_b"), indicator=True)
    ok_a = m["ok_a"].astype("boolean").fillna(False).astype(bool)
    ok_b = m["ok_b"].astype("boolean").fillna(False).astype(bool)
    status = np.select(
        [m["_merge"] == "left_only", m["_merge"] == "right_only", ok_a & ok_b, ~ok_a & ~ok_b, ~ok_a],
        ["only_a", "only_b", "matched", "failed_both", "failed_a"], default="failed_b")
    return m.drop(columns="_merge").assign(status=status)


def match_counts(m: "pd.DataFrame") -> dict[str, int]:
    """Pairs by status, and `errored_a`/`errored_b`: the failed_a/failed_b pairs whose failure was an error, not a
    cancellation at the window's end. Those are left out of every matched delta, so the verdict must name them."""
    counts = m["status"].value_counts().to_dict()
    out = {k: int(counts.get(k, 0)) for k in ("matched", "only_a", "only_b", "failed_a", "failed_b", "failed_both")}
    for side in ("a", "b"):
        errored = (m["status"] == f"failed_{side}") & m[f"error_{side}"].notna() & ~m[f"cancelled_{side}"].astype(bool)
        out[f"errored_{side}"] = int(errored.sum())
    return out


MATCHED_METRICS = [
    ("tpot_ms", "Decode time per token (ms)"),
    ("latency_ms", "Request latency (ms)"),
    ("ttft_ms", "TTFT (ms)"),
]


def matched_deltas(m: "pd.DataFrame", n_boot: int = stats.N_BOOT, seed: int = stats.SEED) -> "pd.DataFrame":
    """Per matched metric: n, mean before (a) / after (b), delta % of means [CI], median per-request
    delta %, how many requests got faster / slower, and a sign test over sessions."""
    import pandas as pd

    pairs = m[m["status"] == "matched"]
    rows = []
    for col, label in MATCHED_METRICS:
        xa, xb = pairs[f"{col}_a"].to_numpy(float), pairs[f"{col}_b"].to_numpy(float)
        keep = np.isfinite(xa) & np.isfinite(xb)
        xa, xb, sess = xa[keep], xb[keep], root_sessions(pairs["conversation_id"])[keep]
        if len(xa) == 0:
            continue
        d = stats.paired_ratio_bootstrap(xa, xb, sess, n_boot, seed)
        faster, slower, _ = stats.sign_test(xb - xa)
        p = stats.session_sign_test(xb - xa, sess)
        rows.append({"key": col, "metric": label, "n": int(len(xa)), "a": d.a, "b": d.b, "delta_pct": d.pct,
                     "lo": d.lo, "hi": d.hi, "sessions": d.sessions, "median_req_delta_pct": percentile(stats.delta_pct(xa, xb), 50),
                     "faster": faster, "slower": slower, "sign_p": p})
    return pd.DataFrame(rows)


def per_request_delta(m: "pd.DataFrame", col: str = "tpot_ms") -> "pd.Series":
    """Matched requests' per-request delta % of `col` (b over a)."""
    pairs = m[m["status"] == "matched"]
    return (pairs[f"{col}_b"] - pairs[f"{col}_a"]) / pairs[f"{col}_a"] * 100.0
