"""analysis/sweep.py: per-arm CIs checked by hand, and the sweep summary built from a recorded run dir."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from analysis import stats
from analysis.compare import compare
from analysis.formatting import fmt, fmt_delta
from analysis.load import read_jsonl
from analysis.rundir import load_run
from analysis.sweep import arm_ci, four_point_md, pareto_plot, provenance_md, summary_frame, sweep_report_md
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
    assert "| TTFT p50 (ms), matched; < 0 better |" in md
    assert "`off_<key>_all` / `on_<key>_all` give each arm's value" in md
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


def test_the_sweep_report_defines_its_delta_and_titles_the_table_by_its_point_count(tmp_path):
    """Delta = (on - off) / off and which sign is better are stated; headers are readable with units; the table
    in the reference's layout is titled by the points it has; the provenance block comes from the manifest."""
    df, _ = summary_frame([{"point": "c8", "run_dir": str(RUN), "gpus": 2}])
    md = sweep_report_md("s", df, {"c8": "done"}, tmp_path, None, run_dirs={"c8": RUN})
    assert "Delta = (on - off) / off" in md and "negative for times (TPOT, TTFT) and positive for rates" in md
    assert "## Per-point table: 1 point (the layout of the MI355X reference's four-point table)" in md
    assert "Four-point table" not in md and "| tpot_p50_matched |" not in md
    assert "| output throughput, equal window (tok/s), all requests; > 0 better |" in md
    manifest = load_run(RUN).manifest
    load = manifest["recipe"]["load"]
    assert f"- commit: {manifest['git_sha'][:12]}" in md and f"- trace: `{load['trace']}`" in md
    assert f"- window: {load['benchmark_duration_s']} s measured" in md


def test_provenance_lists_per_point_values_where_points_differ(tmp_path):
    for point, conc in (("c4", 4), ("c8", 8)):
        shutil.copytree(RUN, tmp_path / point)
        m = json.loads((tmp_path / point / "manifest.json").read_text())
        m["recipe"]["load"]["concurrency"] = conc
        (tmp_path / point / "manifest.json").write_text(json.dumps(m))
    lines = provenance_md({"c4": tmp_path / "c4", "c8": tmp_path / "c8"})
    assert "- concurrency: c4: 4; c8: 8" in lines and sum(line.startswith("- commit: ") for line in lines) == 1


def test_the_pareto_plot_has_a_panel_of_the_paired_deltas_with_cis(tmp_path, monkeypatch):
    from analysis import plots

    figs, save = {}, plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: figs.setdefault("f", fig) and save(fig, path))
    df, _ = summary_frame([{"point": "c8", "run_dir": str(RUN), "gpus": 2}])
    pareto_plot(df, tmp_path / "pareto.png")
    left, right = figs["f"].axes
    assert right.get_ylabel() == "delta = (on - off) / off (%)"
    on = df[df["arm"] == "on"].iloc[0]
    bars = {c.get_label(): c for c in right.containers}
    tpot = bars["matched TPOT, the verdict (< 0 better)"]
    assert tpot.lines[0].get_ydata()[0] == pytest.approx(on["d_matched_tpot"])
    (segs,) = tpot.lines[2]  # the CI bar spans the verdict's CI
    assert sorted(segs.get_segments()[0][:, 1]) == pytest.approx([on["d_matched_tpot_lo"], on["d_matched_tpot_hi"]])
    # every point labelled at p50 and p90, in legible text
    assert [t.get_text() for t in left.texts] == ["c8"] * 4 and min(t.get_fontsize() for t in left.texts) >= 8
    assert min(t.get_fontsize() for t in left.get_legend().get_texts()) >= 9
