"""analysis.load and analysis.rundir on hand-made aiperf lines and the committed real fixture."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from analysis.load import (AnalysisError, add_match_key, outcome_counts, profiling_only, read_jsonl,
                           records_frame, server_metrics_frame, window_seconds)
from analysis.rundir import arm_run_table, expected_arms, load_run
from analysis_records import record, write_jsonl

FIXTURE = Path(__file__).parent / "data" / "run_small"


def test_records_frame_keeps_errors_and_drops_warmup_only_on_request():
    lines = [record("c0", 0, 0, phase="warmup"), record("c0", 0, 10, tpot=4.0), record("c1", 0, 11, error="500"),
             record("c2", 0, 12, cancelled=True), record("c3", 0, 13, tpot=None, osl=1)]
    df = records_frame(lines)
    assert len(df) == 5 and df["ok"].tolist() == [True, True, False, False, False]
    prof = profiling_only(df)
    assert prof["conversation_id"].tolist() == ["c0", "c1", "c2", "c3"]
    assert outcome_counts(prof) == {"total": 4, "completed": 1, "cancelled": 1, "failed": 1, "no_tpot": 1}
    assert prof.loc[0, "tpot_ms"] == 4.0 and prof.loc[0, "latency_ms"] == 20.0 + 4.0 * 10


def test_match_key_numbers_repeats_in_dispatch_order_not_file_order():
    # c0/0 dispatched three times; file order differs from start order.
    df = records_frame([record("c0", 0, 30), record("c0", 0, 10), record("c0", 1, 15), record("c0", 0, 20)])
    keyed = add_match_key(df)
    got = list(zip(keyed["turn_index"], keyed["start_ns"] - keyed["start_ns"].min(), keyed["occurrence"]))
    assert got == [(0, 0, 0), (1, 5_000_000, 0), (0, 10_000_000, 1), (0, 20_000_000, 2)]


def test_window_prefers_phase_bounds():
    df = records_frame([record("c0", 0, 0, latency=100), record("c1", 0, 400, latency=600)])
    assert window_seconds(df) == pytest.approx(1.0)
    # the records run from T0 to T0 + 1 s; the phase from T0 - 0.5 s: it ends at its last request's end, not a
    # grace period later (T0 + 5 s), nor is its start moved
    t0 = int(df["start_ns"].min())
    assert window_seconds(df, (t0 - 500_000_000, t0 + 5_000_000_000)) == pytest.approx(1.5)
    assert window_seconds(df, (t0 - 500_000_000, t0 + 800_000_000)) == pytest.approx(1.3)


def test_read_jsonl_names_bad_line(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(AnalysisError, match=r"x\.jsonl:2: not valid JSON"):
        read_jsonl(p)


def test_server_metrics_frame_gauges_avg_counters_rate():
    doc = {"metrics": {
        "sglang:num_running_reqs": {"type": "gauge", "series": [{"stats": {"avg": 2.0}}, {"stats": {"avg": 4.0}}]},
        "sglang:generation_tokens": {"type": "counter", "series": [{"stats": {"total": 9, "rate": 3.0}}]},
        "sglang:ttft": {"type": "histogram", "series": [{"stats": {}}]}}}
    df = server_metrics_frame(doc)
    assert df.set_index("name")["value"].to_dict() == {"sglang:num_running_reqs": 3.0, "sglang:generation_tokens": 3.0}


def test_arm_run_table_from_manifest_or_folders():
    m = {"arm_runs": [{"name": "off", "arm": "off", "order": 1}, {"name": "on.2", "arm": "on", "order": 2}]}
    assert arm_run_table(m, []) == [{"name": "off", "arm": "off", "order": 1}, {"name": "on.2", "arm": "on", "order": 2}]
    assert arm_run_table({}, ["off", "off.2", "on"])[1] == {"name": "off.2", "arm": "off", "order": 2}
    assert expected_arms({"plan": {"arms": {"base": {}, "new": {}}}}) == ["base", "new"]
    assert expected_arms({}) == ["off", "on"]


def test_load_run_on_real_fixture():
    run = load_run(FIXTURE)
    assert run.arms == ["off", "on"]
    assert [r.name for r in run.runs_of("off")] == ["off", "off.2"]
    on = run.runs_of("on")[0]
    # Real aiperf export: 2 warmup records excluded, 36 profiling (12 sessions x 3 turns), every 11th got HTTP 500.
    assert on.warmup_records == 2
    assert on.counts["total"] == 36 and on.counts["failed"] == 3 and on.counts["completed"] == 33
    assert 0.5 < on.window_s < 5
    assert set(on.server["name"]) >= {"sglang:num_running_reqs", "sglang:spec_accept_length"}


def test_missing_arm_and_empty_export_and_not_a_run_dir(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    shutil.rmtree(run / "arms" / "on")
    # the manifest says its load finished: the files are gone, and a resume (which skips done stages) cannot help
    with pytest.raises(AnalysisError, match=r"arm 'on' has no aiperf export at arms/on/aiperf/profile_export\.jsonl, "
                                            r"though its load stage is recorded as done: the raw files were deleted"):
        load_run(run)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["stages"]["on"]["load"]["status"] = "running"   # a run killed during the on arm's load
    (run / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(AnalysisError, match=r"arm 'on' has no aiperf export \(expected arms/on/aiperf/profile_export"
                                            r"\.jsonl\); finish it with `pipeline run --resume "):
        load_run(run)
    shutil.copy(FIXTURE / "manifest.json", run / "manifest.json")
    shutil.copytree(FIXTURE / "arms" / "on", run / "arms" / "on")
    export = run / "arms" / "on" / "aiperf" / "profile_export.jsonl"
    write_jsonl(export, [x for x in read_jsonl(export) if x["metadata"]["benchmark_phase"] == "warmup"])
    with pytest.raises(AnalysisError, match=r"profile_export\.jsonl: 0 profiling records \(2 warmup/other\)"):
        load_run(run)
    (tmp_path / "empty").mkdir()
    with pytest.raises(AnalysisError, match=r"empty is not a run directory \(no manifest\.json and no arms/\)"):
        load_run(tmp_path / "empty")
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "sweep.json").write_text("{}")
    with pytest.raises(AnalysisError, match=r"sweep is a sweep dir: its report is .*sweep_report\.md .*"
                                            r"`pipeline report .*/sweep/runs/POINT` reports one point"):
        load_run(tmp_path / "sweep")
    with pytest.raises(AnalysisError, match=r"run dir .*nowhere: no such directory"):
        load_run(tmp_path / "nowhere")
