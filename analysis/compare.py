"""One A/B comparison: side a (baseline, "off") against side b ("on"), each one or more arm runs.

Repeats of an arm (ABBA, or `repeats: 2`) are pooled for the per-arm table's rate rows and its all-request
context values; matched requests pair the k-th run of a with the k-th run of b, and give the per-arm table's
latency rows as well as the matched table; the first two runs of any side that ran twice give the A/A noise floor.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from analysis import estimate as est
from analysis import stats, window
from analysis.load import root_sessions
from analysis.metrics import (ArmData, arm_deltas, match_counts, match_requests, matched_arm_deltas, matched_deltas,
                              per_request_delta)
from analysis.rundir import ArmRun

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class Comparison:
    a_label: str
    b_label: str
    a_runs: list[ArmRun]
    b_runs: list[ArmRun]
    # key | metric | basis | n | a | b | delta_pct | lo | hi | ... | a_all | b_all | floor (arm_rows)
    arm_table: "pd.DataFrame"
    matched: "pd.DataFrame"          # metric | n | a | b | delta_pct | lo | hi | ... | floor
    match_counts: dict[str, int]
    request_deltas: "pd.Series"      # matched per-request TPOT delta %
    aa_source: str | None = None     # which runs gave the noise floor
    notes: list[str] = field(default_factory=list)
    primary: est.Estimate | None = None          # the verdict's estimate (analysis.estimate.PRIMARY)
    candidates: "pd.DataFrame | None" = None     # every estimator on the same pairs, for the report
    primary_floor: float | None = None           # A/A noise floor of the primary estimate
    window_s: float = float("nan")               # the matched runs' measured window (first pair)
    arm_own: "pd.DataFrame | None" = None        # every arm_table row over each arm's own requests, with CIs


def pool(runs: list[ArmRun]) -> ArmData:
    import pandas as pd

    frame = pd.concat([r.records.assign(arm_run=r.name) for r in runs], ignore_index=True)
    return ArmData(frame=frame, window_s=sum(r.window_s for r in runs), n_runs=len(runs))


def matched_pairs(a_runs: list[ArmRun], b_runs: list[ArmRun]) -> "pd.DataFrame":
    """match_requests for each (k-th a run, k-th b run), stacked; `pair` names the runs."""
    import pandas as pd

    parts = [match_requests(ra.records, rb.records).assign(pair=f"{ra.name}|{rb.name}")
             for ra, rb in zip(a_runs, b_runs)]
    return pd.concat(parts, ignore_index=True)


def arm_rows(a_runs: list[ArmRun], b_runs: list[ArmRun], n_boot: int, seed: int,
             duration_s: float | None = None) -> tuple["pd.DataFrame", "pd.DataFrame"]:
    """(the per-arm table, the same rows over each arm's own requests).

    The table's per-request latency rows (TPOT, interactivity, TTFT, E2E) take a, b, delta and CI over matched
    requests (basis "matched", n pairs); its rate rows over each arm's own requests (basis "all"). a_all / b_all
    hold every row's value over each arm's own completed requests, for context: a faster arm sends requests the
    other never reached (quickstart: 11 late turns, all prefix-cache hits), which move its own percentiles."""
    import pandas as pd

    own = arm_deltas(pool(a_runs), pool(b_runs), n_boot, seed)
    own = pd.concat([own, pd.DataFrame([equal_window_row(a_runs, b_runs, duration_s, n_boot, seed)])],
                    ignore_index=True)
    table = own.assign(basis="all", n=np.nan, a_all=own["a"], b_all=own["b"]).set_index("key")
    matched = matched_arm_deltas(matched_pairs(a_runs, b_runs), n_boot, seed).set_index("key")
    cols = ["n", "a", "b", "delta_pct", "lo", "hi", "sessions", "why"]
    table.loc[matched.index, cols] = matched[cols]
    table.loc[matched.index, "basis"] = "matched"
    return table.reset_index(), own


def aa_floors(sides: list[list[ArmRun]], n_boot: int, seed: int,
              duration_s: float | None = None) -> tuple[dict, dict, str | None]:
    """Noise floor per arm metric and per matched metric from every side that ran twice (max over sides). An arm
    row's floor comes from arm_rows of the two runs, so it counts the requests its row counts (matched or all)."""
    arm_floor: dict[str, float] = {}
    matched_floor: dict[str, float] = {}
    used = []
    for runs in sides:
        if len(runs) < 2:
            continue
        r1, r2 = runs[0], runs[1]
        used.append(f"{r1.name} vs {r2.name}")
        for row in arm_rows([r1], [r2], n_boot, seed, duration_s)[0].itertuples():
            f = stats.noise_floor(stats.Delta(row.a, row.b, row.delta_pct, row.lo, row.hi))
            if np.isfinite(f):  # a row without an A/A CI has no floor ("n/a"), not a floor of 0
                arm_floor[row.key] = max(arm_floor.get(row.key, 0.0), f)
        md = matched_deltas(match_requests(r1.records, r2.records), n_boot, seed)
        for row in md.itertuples():
            f = stats.noise_floor(stats.Delta(row.a, row.b, row.delta_pct, row.lo, row.hi))
            if np.isfinite(f):
                matched_floor[row.key] = max(matched_floor.get(row.key, 0.0), f)
    return arm_floor, matched_floor, (", ".join(used) or None)


def primary_floor(sides: list[list[ArmRun]], n_boot: int, seed: int) -> float | None:
    """The primary estimate's A/A noise floor: max over sides that ran twice, None if none did."""
    floors = [stats.noise_floor(est.estimate(est.log_ratios(match_requests(runs[0].records, runs[1].records)),
                                             est.PRIMARY, n_boot, seed))
              for runs in sides if len(runs) >= 2]
    return max(floors) if floors else None


def equal_window_row(a_runs: list[ArmRun], b_runs: list[ArmRun], duration_s: float | None,
                     n_boot: int, seed: int) -> dict:
    """Arm-table row: output tokens per second inside the same window W in every arm run."""
    w = window.equal_window([r.window_s for r in a_runs + b_runs], duration_s)
    sessions = sorted({s for r in a_runs + b_runs for s in root_sessions(r.records["conversation_id"])},
                      key=str)

    def sample(runs: list[ArmRun]) -> stats.Sample:
        vals, sess = [], []
        for r in runs:
            t = window.tokens_in_window(r.records, window.window_start_ns(r.records, r.phase_window_ns), w)
            vals.append(t.to_numpy())
            sess.append(root_sessions(r.records.loc[t.index, "conversation_id"]))
        return stats.make_sample(np.concatenate(vals), np.concatenate(sess), sessions, stats.rate_stat(w * len(runs)))

    d = stats.paired_bootstrap(sample(a_runs), sample(b_runs), len(sessions), n_boot, seed)
    return {"key": "throughput_equal_window", "metric": f"Output throughput, equal {w:.0f} s window (tok/s)",
            "a": d.a, "b": d.b, "delta_pct": d.pct, "lo": d.lo, "hi": d.hi, "sessions": d.sessions, "why": d.why,
            "higher_is_better": True}


def unusable_tpot_notes(runs: list[ArmRun]) -> list[str]:
    """A note per arm run with completed requests whose TPOT is there but is no measurement (inf, 0, negative):
    analysis.load counts them as having no TPOT, so every table, plot and the verdict leave them out alike."""
    notes, seen = [], set()
    for r in runs:
        if r.name in seen:  # one folder on both sides of a comparison of a run with itself
            continue
        seen.add(r.name)
        f = r.records
        bad = f.loc[~f["cancelled"] & f["error"].isna() & f["tpot_ms"].notna() & ~f["ok"], "tpot_ms"]
        if len(bad):
            values = ", ".join(sorted({f"{v:g}" for v in bad}))
            notes.append(f"arm run `{r.name}`: {len(bad)} completed request(s) with a TPOT that is not a positive "
                         f"finite number ({values}) left out of every table, plot and the verdict, as requests with "
                         "no TPOT are (Load counts them under no TPOT)")
    return notes


def compare(a_runs: list[ArmRun], b_runs: list[ArmRun], a_label: str, b_label: str,
            n_boot: int = stats.N_BOOT, seed: int = stats.SEED, duration_s: float | None = None) -> Comparison:
    arm_table, arm_own = arm_rows(a_runs, b_runs, n_boot, seed, duration_s)
    m = matched_pairs(a_runs, b_runs)
    matched = matched_deltas(m, n_boot, seed)
    lr = est.log_ratios(m)
    candidates = est.compare_estimators(lr, n_boot, seed) if len(lr) else None
    primary = est.estimate(lr, est.PRIMARY, n_boot, seed) if len(lr) else None
    # Dedupe: in a two-run comparison the same folder could appear on both sides' lists.
    sides = [a_runs] if [r.paths for r in a_runs] == [r.paths for r in b_runs] else [a_runs, b_runs]
    arm_floor, matched_floor, source = aa_floors(sides, n_boot, seed, duration_s)
    arm_table["floor"] = arm_table["key"].map(arm_floor)
    if not matched.empty:
        matched["floor"] = matched["key"].map(matched_floor)
    notes = unusable_tpot_notes([*a_runs, *b_runs])
    if len(a_runs) != len(b_runs):
        notes.append(f"{a_label} ran {len(a_runs)}x and {b_label} {len(b_runs)}x; matched requests use the "
                     f"first {min(len(a_runs), len(b_runs))} run(s) of each")
    return Comparison(a_label, b_label, a_runs, b_runs, arm_table, matched, match_counts(m),
                      per_request_delta(m), source, notes, primary, candidates,
                      primary_floor(sides, n_boot, seed), a_runs[0].window_s, arm_own)
