"""One A/B comparison: side a (baseline, "off") against side b ("on"), each one or more arm runs.

Repeats of an arm (ABBA, or `repeats: 2`) are pooled for the per-arm table;
matched requests pair the k-th run of a with the k-th run of b; the first two
runs of any side that ran twice give the A/A noise floor.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from analysis import stats
from analysis.metrics import ArmData, arm_deltas, match_counts, match_requests, matched_deltas, per_request_delta
from analysis.rundir import ArmRun

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class Comparison:
    a_label: str
    b_label: str
    a_runs: list[ArmRun]
    b_runs: list[ArmRun]
    arm_table: "pd.DataFrame"        # metric | a | b | delta_pct | lo | hi | floor
    matched: "pd.DataFrame"          # metric | n | a | b | delta_pct | lo | hi | ... | floor
    match_counts: dict[str, int]
    request_deltas: "pd.Series"      # matched per-request TPOT delta %
    aa_source: str | None = None     # which runs gave the noise floor
    notes: list[str] = field(default_factory=list)


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


def aa_floors(sides: list[list[ArmRun]], n_boot: int, seed: int) -> tuple[dict, dict, str | None]:
    """Noise floor per arm metric and per matched metric from every side that ran twice (max over sides)."""
    arm_floor: dict[str, float] = {}
    matched_floor: dict[str, float] = {}
    used = []
    for runs in sides:
        if len(runs) < 2:
            continue
        r1, r2 = runs[0], runs[1]
        used.append(f"{r1.name} vs {r2.name}")
        for row in arm_deltas(pool([r1]), pool([r2]), n_boot, seed).itertuples():
            f = stats.noise_floor(stats.Delta(row.a, row.b, row.delta_pct, row.lo, row.hi))
            arm_floor[row.key] = max(arm_floor.get(row.key, 0.0), f)
        md = matched_deltas(match_requests(r1.records, r2.records), n_boot, seed)
        for row in md.itertuples():
            f = stats.noise_floor(stats.Delta(row.a, row.b, row.delta_pct, row.lo, row.hi))
            matched_floor[row.key] = max(matched_floor.get(row.key, 0.0), f)
    return arm_floor, matched_floor, (", ".join(used) or None)


def compare(a_runs: list[ArmRun], b_runs: list[ArmRun], a_label: str, b_label: str,
            n_boot: int = stats.N_BOOT, seed: int = stats.SEED) -> Comparison:
    arm_table = arm_deltas(pool(a_runs), pool(b_runs), n_boot, seed)
    m = matched_pairs(a_runs, b_runs)
    matched = matched_deltas(m, n_boot, seed)
    # Dedupe: in a two-run comparison the same folder could appear on both sides' lists.
    sides = [a_runs] if [r.paths for r in a_runs] == [r.paths for r in b_runs] else [a_runs, b_runs]
    arm_floor, matched_floor, source = aa_floors(sides, n_boot, seed)
    arm_table["floor"] = arm_table["key"].map(arm_floor)
    if not matched.empty:
        matched["floor"] = matched["key"].map(matched_floor)
    notes = []
    if len(a_runs) != len(b_runs):
        notes.append(f"{a_label} ran {len(a_runs)}x and {b_label} {len(b_runs)}x; matched requests use the "
                     f"first {min(len(a_runs), len(b_runs))} run(s) of each")
    return Comparison(a_label, b_label, a_runs, b_runs, arm_table, matched, match_counts(m),
                      per_request_delta(m), source, notes)
