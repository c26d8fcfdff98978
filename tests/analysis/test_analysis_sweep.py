"""analysis/sweep.py: per-arm CIs checked by hand, and the sweep summary built from a recorded run dir."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from analysis import stats
from analysis.compare import compare
from analysis.formatting import fmt, fmt_delta
from analysis.load import read_jsonl
from analysis.rundir import load_run
from analysis.sweep import arm_ci, four_point_md, pareto_plot, summary_frame, sweep_report_md
from analysis_records import write_jsonl

RUN = Path(__file__).parent / "data" / "quickstart_run"


def test_arm_ci_sum_per_window_by_hand():
    # five sessions, two requests each; rate_stat(2): total / 2 s = (10 * 3) / 2 = 15
    values = np.full(10, 3.0)
    sessions = np.repeat(list("abcde"), 2)
    est, lo, hi = arm_ci(values, sessions, stats.rate_stat(2.0))
    assert est == 15.0
    # every session contributes the same 6 tokens, so every resample of 5 sessions totals the same
    assert lo == pytest.approx(15.0) and hi == pytest.approx(15.0)


def test_arm_ci_spreads_with_unequal_sessions_and_needs_five():
    values = np.array([1.0, 2.0, 3.0, 4.0, 100.0])
    est, lo, hi = arm_ci(values, np.array(list("abcde")), stats.quantile_stat(50))
    assert est == 3.0 and lo < est < hi and 1.0 <= lo and hi <= 100.0
    est4, lo4, hi4 = arm_ci(values[:4], np.array(list("abcd")), stats.quantile_stat(50))
    assert est4 == 2.5 and np.isnan(lo4) and np.isnan(hi4)   # < MIN_SESSIONS: no CI, as in report.md


def test_summary_of_a_recorded_run_matches_its_report(tmp_path):
    df, failed = summary_frame([{"point": "c8", "run_dir": str(RUN), "gpus": 2}])
    assert list(df["arm"]) == ["off", "on"] and not failed
    run = load_run(RUN)
    duration = run.manifest["recipe"]["load"]["benchmark_duration_s"]
    c = compare([r for r in run.arm_runs if r.arm == "off"], [r for r in run.arm_runs if r.arm == "on"], "off", "on",
                duration_s=duration)
    tput = c.arm_table.set_index("key").loc["throughput_equal_window"]
    on = df[df["arm"] == "on"].iloc[0]
    # the same deltas and CIs as the single-run report, and its verdict as the matched TPOT delta
    assert on["d_throughput_equal_window"] == pytest.approx(tput["delta_pct"])
    assert on["d_throughput_equal_window_lo"] == pytest.approx(tput["lo"])
    assert (on["d_matched_tpot"], on["d_matched_tpot_lo"], on["matched_n"]) == pytest.approx(
        (c.primary.pct, c.primary.lo, c.primary.n))
    # per GPU: the arm's equal-window throughput halved; interactivity = 1000 / TPOT p50
    assert on["tput_per_gpu"] == pytest.approx(tput["b"] / 2)
    assert on["inter_p50"] == pytest.approx(c.arm_table.set_index("key").loc["inter_p50", "b_all"])
    for arm in ("off", "on"):
        r = df[df["arm"] == arm].iloc[0]
        assert r["inter_p50_lo"] <= r["inter_p50"] <= r["inter_p50_hi"]
        assert r["tput_per_gpu_lo"] <= r["tput_per_gpu"] <= r["tput_per_gpu_hi"]

    png = pareto_plot(df, tmp_path / "plots" / "pareto.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = four_point_md(df)
    assert table[0].startswith("| point | matched TPOT delta") and table[2].startswith("| c8 | ")
    md = sweep_report_md("s", df, {"c8": "done", "c16": "missing"}, tmp_path, png)
    assert "| c16 | missing |" in md and "![pareto](plots/pareto.png)" in md


def test_latency_columns_say_they_count_matched_requests(tmp_path):
    """The CSV's latency deltas now come from matched requests: their columns carry `_matched` (an old
    `d_tpot_p50` held each arm's own requests, and must not reappear meaning something else), each arm's own value
    sits in `_all`, the rate column keeps its name, and the sweep report says which is which."""
    df, _ = summary_frame([{"point": "c8", "run_dir": str(RUN), "gpus": 2}])
    run = load_run(RUN)
    c = compare(run.runs_of("off"), run.runs_of("on"), "off", "on",
                duration_s=run.manifest["recipe"]["load"]["benchmark_duration_s"])
    t, on = c.arm_table.set_index("key"), df[df["arm"] == "on"].iloc[0]
    for key in ("tpot_p50", "tpot_p90", "inter_p50", "inter_p90", "ttft_p50"):
        assert f"d_{key}" not in df.columns and f"off_{key}" not in df.columns
        assert [on[f"d_{key}_matched"], on[f"d_{key}_matched_lo"], on[f"off_{key}_matched"],
                on[f"on_{key}_matched"]] == pytest.approx(t.loc[key, ["delta_pct", "lo", "a", "b"]].tolist())
        assert [on[f"off_{key}_all"], on[f"on_{key}_all"]] == pytest.approx(t.loc[key, ["a_all", "b_all"]].tolist())
    assert on["d_throughput_equal_window"] == pytest.approx(t.loc["throughput_equal_window", "delta_pct"])
    md = sweep_report_md("s", df, {"c8": "done"}, tmp_path, None)
    assert "| ttft_p50_matched |" in md and "`off_<key>_all` / `on_<key>_all` give each arm's value" in md
    assert f"| c8 | {fmt_delta(on['d_matched_tpot'], on['d_matched_tpot_lo'], on['d_matched_tpot_hi'])} | " \
           f"{fmt(t.loc['tpot_p50', 'a'])} / {fmt(t.loc['tpot_p50', 'b'])} (" in md


def test_a_run_that_cannot_be_analysed_is_left_out_with_its_reason(tmp_path):
    """A finished run whose load measured nothing (its own report failed on it) must not sink the other points;
    its reason names the run dir as the sweep does, relative to the sweep dir."""
    sweep_dir = tmp_path / "s"
    shutil.copytree(RUN, sweep_dir / "runs/c8")
    shutil.copytree(RUN, sweep_dir / "runs/c16")
    export = sweep_dir / "runs/c16/arms/on/aiperf/profile_export.jsonl"
    records = read_jsonl(export)
    for r in records:
        r["metadata"]["benchmark_phase"] = "warmup"
    write_jsonl(export, records)
    df, failed = summary_frame([{"point": p, "run_dir": sweep_dir / "runs" / p, "gpus": 2} for p in ("c16", "c8")],
                               sweep_dir)
    assert list(df["point"]) == ["c8", "c8"] and list(df["run_dir"]) == ["runs/c8", "runs/c8"]
    assert list(failed) == ["c16"]
    assert failed["c16"].startswith("runs/c16/arms/on/aiperf/profile_export.jsonl: 0 profiling records"), failed
