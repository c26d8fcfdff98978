"""analysis.compare: which requests each per-arm row counts, and the A/A floors that bound those rows."""
from __future__ import annotations

import copy
import shutil
from pathlib import Path

import numpy as np
import pytest
from analysis_records import make_run, record, write_jsonl

from analysis.compare import compare, matched_pairs
from analysis.load import read_jsonl
from analysis.rundir import load_run

QUICKSTART = Path(__file__).parent / "data" / "quickstart_run"
LATENCY = ("tpot_p50", "tpot_mean", "tpot_p90", "inter_p50", "inter_p90", "ttft_p50", "e2e_p90")
RATES = ("throughput", "completed", "throughput_equal_window")
N_BOOT = 300


def _compare(run: Path):
    r = load_run(run)
    return compare(r.runs_of("off"), r.runs_of("on"), "off", "on", n_boot=N_BOOT,
                   duration_s=r.manifest["recipe"]["load"]["benchmark_duration_s"])


def with_fast_extras(tmp_path: Path, n: int = 6) -> Path:
    """The quickstart run, plus n requests only `on` completed: later turns of its sessions, prefix-cache hits
    (TTFT 20 ms, TPOT 3 ms), as a faster arm sends them before the window ends (the real quickstart: 11 such,
    TTFT 15-31 ms). Each ends before the arm's last request, so the measured window stays as it was."""
    run = tmp_path / "qs"
    shutil.copytree(QUICKSTART, run)
    export = run / "arms" / "on" / "aiperf" / "profile_export.jsonl"
    lines = read_jsonl(export)
    extras = []
    for i, src in enumerate(lines[:n]):
        x = copy.deepcopy(src)
        meta, m = x["metadata"], x["metrics"]
        meta.update(turn_index=20 + i, x_request_id=f"extra-{i}")
        latency = 20.0 + 3.0 * (m["output_sequence_length"]["value"] - 1)
        m["time_to_first_token"]["value"], m["inter_token_latency"]["value"] = 20.0, 3.0
        m["request_latency"]["value"] = latency
        meta["request_end_ns"] = meta["request_start_ns"] + int(latency * 1e6)
        extras.append(x)
    write_jsonl(export, lines + extras)
    return run


def test_latency_rows_count_only_the_requests_both_arms_completed(tmp_path):
    """Fast requests only one arm sent pulled its own percentiles (quickstart TTFT p50 180 -> 80 ms, -56% with a CI
    off 0, where the same requests went 180 -> 126): the latency rows must not move with them, the context
    columns must, and the rate rows count them."""
    base = _compare(QUICKSTART).arm_table.set_index("key")
    c = _compare(with_fast_extras(tmp_path))
    assert (c.match_counts["only_b"], c.match_counts["only_a"]) == (6, 1)   # the fixture's own: 1 only in off
    t = c.arm_table.set_index("key")
    for key in LATENCY:
        assert t.loc[key, ["a", "b", "delta_pct", "lo", "hi"]].tolist() == pytest.approx(
            base.loc[key, ["a", "b", "delta_pct", "lo", "hi"]].tolist(), nan_ok=True), key
        assert t.loc[key, "basis"] == "matched" and t.loc[key, "n"] == 9, key
    # by hand: each arm's median over the 9 matched pairs
    pairs = matched_pairs(c.a_runs, c.b_runs).query("status == 'matched'")
    assert t.loc["tpot_p50", ["a", "b"]].tolist() == pytest.approx(
        [np.percentile(pairs["tpot_ms_a"], 50), np.percentile(pairs["tpot_ms_b"], 50)])
    assert t.loc["ttft_p50", ["a", "b"]].tolist() == pytest.approx(
        [np.percentile(pairs["ttft_ms_a"], 50), np.percentile(pairs["ttft_ms_b"], 50)])
    # the context columns: each arm's own requests, the 6 fast ones included in on's
    own_on = c.b_runs[0].records.query("ok")
    assert t.loc["ttft_p50", "b_all"] == pytest.approx(np.percentile(own_on["ttft_ms"], 50))
    assert t.loc["ttft_p50", "b_all"] < t.loc["ttft_p50", "b"] and t.loc["tpot_p50", "b_all"] < t.loc["tpot_p50", "b"]
    for key in RATES:
        assert t.loc[key, "basis"] == "all" and np.isnan(t.loc[key, "n"])
        assert t.loc[key, ["a", "b"]].tolist() == pytest.approx(t.loc[key, ["a_all", "b_all"]].tolist())
    assert t.loc["completed", ["a", "b"]].tolist() == [10.0, 15.0]


def test_aa_floor_counts_the_requests_its_row_counts(tmp_path):
    """off.2 repeats off 2% slower on every request, and also completes six fast requests off never sent. The
    floor that bounds a matched row is the matched A/A delta: +2% for the latencies (each resample scales by 1.02,
    so the CI collapses on it), 1 - 1/1.02 for interactivity; the extras widened the all-request floor."""
    def arm(scale, extra=False):
        lines = [record(f"s{i}", 0, 10.0 * i, tpot=(10.0 + i) * scale, ttft=(100.0 + 10 * i) * scale)
                 for i in range(6)]
        return lines + ([record(f"s{i}", 1, 200.0, tpot=1.0, ttft=5.0) for i in range(6)] if extra else [])

    run = make_run(tmp_path / "aa", {"off": arm(1.0), "on": arm(0.9), "off.2": arm(1.02, extra=True)})
    r = load_run(run)
    t = compare(r.runs_of("off"), r.runs_of("on"), "off", "on", n_boot=N_BOOT).arm_table.set_index("key")
    for key in ("tpot_p50", "tpot_mean", "tpot_p90", "ttft_p50", "e2e_p90"):
        assert t.loc[key, "floor"] == pytest.approx(2.0), key
    for key in ("inter_p50", "inter_p90"):
        assert t.loc[key, "floor"] == pytest.approx(100 * (1 - 1 / 1.02)), key
    # the rows themselves: on is 10% faster on every matched request
    assert t.loc["tpot_p50", ["delta_pct", "lo", "hi"]].tolist() == pytest.approx([-10.0, -10.0, -10.0])
    # a rate row's floor still counts each run's own requests: off.2 completed 12 to off's 6
    assert t.loc["completed", "floor"] > 50


def test_no_matched_request_leaves_latency_rows_empty_and_the_verdict_on_own_requests(tmp_path):
    """Arms that completed no request in common: the latency rows have nothing to pair (n/a, 0 matched), the
    context columns keep each arm's own figures, and the verdict falls back to TPOT p50 of each arm's own
    requests, as it did before the rows moved to matched requests."""
    from analysis.report import arm_table_md, verdict

    run = make_run(tmp_path / "apart", {"off": [record(f"a{i}", 0, 0, tpot=10.0 + i) for i in range(6)],
                                        "on": [record(f"b{i}", 0, 0, tpot=8.0 + i) for i in range(6)]})
    r = load_run(run)
    c = compare(r.runs_of("off"), r.runs_of("on"), "off", "on", n_boot=N_BOOT)
    t = c.arm_table.set_index("key")
    assert (t.loc[list(LATENCY), "n"] == 0).all() and t.loc[list(LATENCY), ["a", "b", "delta_pct"]].isna().all().all()
    assert t.loc["tpot_p50", ["a_all", "b_all"]].tolist() == [12.5, 10.5]
    row = next(x for x in arm_table_md(c) if x.startswith("| TPOT p50 (ms)"))
    assert row == "| TPOT p50 (ms) | 0 matched | n/a | n/a | n/a | no repeat | 12.50 / 10.50 |"
    # 12 sessions, 6 in each arm: the own-request TPOT p50 row has its CI, which the fallback verdict quotes
    own = c.arm_own.set_index("key").loc["tpot_p50"]
    assert verdict(c).startswith(f"**Verdict:** on vs off: TPOT p50 {own['delta_pct']:+.1f}% [")
    assert verdict(c).endswith("no request completed in both arms.")
