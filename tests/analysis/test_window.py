"""Output throughput over equal windows: hand-checked token counts, and a pair of arms that differ only
in how far their last request spilled into the grace period."""
from __future__ import annotations

import json

import pandas as pd
import pytest
from analysis_records import T0, make_run, record

from analysis import window
from analysis.load import records_frame
from analysis.report import write_report


def test_tokens_in_window_by_hand():
    # First token at 1.0 s, ten more spread over (1.0, 2.0]: a 1.5 s window holds 1 + 10 * 0.5 = 6.
    df = records_frame([record("s0", 0, 0, tpot=100.0, ttft=1000.0, osl=11)])
    assert window.tokens_in_window(df, T0, 1.5).tolist() == pytest.approx([6.0])
    assert window.tokens_in_window(df, T0, 5.0).tolist() == pytest.approx([11.0])
    assert window.tokens_in_window(df, T0, 0.5).tolist() == pytest.approx([0.0])   # before its first token
    assert window.tokens_in_window(df, T0 + 1.5e9, 5.0).tolist() == pytest.approx([5.0])   # a late start
    failed = records_frame([record("s1", 0, 0, error="boom")])
    assert window.tokens_in_window(failed.assign(ok=failed["ok"].astype(bool)), T0, 5.0).empty


def test_equal_window_is_the_shortest_and_never_past_the_duration():
    assert window.equal_window([123.7, 150.0], None) == 123.7
    assert window.equal_window([123.7, 150.0], 120) == 120.0
    assert window.window_start_ns(pd.DataFrame({"start_ns": [5, 3]}), None) == 3.0
    assert window.window_start_ns(pd.DataFrame({"start_ns": [5, 3]}), (1, 9)) == 1.0


def _phase(run, arm, end_s):
    path = run / "arms" / arm / "aiperf" / "phase_manifest.json"
    path.write_text(json.dumps({"phases": [{"phase_kind": "profiling", "start_ns": T0,
                                            "end_ns": T0 + int(end_s * 1e9)}]}))


def test_grace_period_spill_alone_changes_no_equal_window_throughput(tmp_path):
    """Both arms serve the same tokens at the same times up to the 120 s duration. In `on` the last request,
    in flight at 120 s, goes on generating into the grace period (window 149.9 s); in `off` it ended at
    123.7 s. tokens / window calls that -5.8%; the equal 120 s window sees no change."""
    common = [record(f"s{i}", 0, 1000.0 * i, tpot=50.0, osl=201) for i in range(8)]   # 10.0 s each
    tail = dict(tpot=100.0, ttft=20.0)
    off = common + [record("s0", 1, 100_000.0, osl=238, **tail)]   # ends at 100.02 + 23.7 = 123.72 s
    on = common + [record("s0", 1, 100_000.0, osl=500, **tail)]    # ends at 100.02 + 49.9 = 149.92 s
    run = make_run(tmp_path / "spill", {"off": off, "on": on}, recipe={"load": {"benchmark_duration_s": 120}})
    _phase(run, "off", 123.72)
    _phase(run, "on", 149.92)
    md = write_report(run, n_boot=100).read_text()
    old = next(x for x in md.splitlines() if x.startswith("| Output throughput, own window (context) (tok/s)"))
    assert "| 14.92 | 14.06 | -5.8% [" in old       # (1608 + 238) / 123.72 vs (1608 + 500) / 149.92
    row = next(x for x in md.splitlines() if x.startswith("| Output throughput, equal 120 s window"))
    # 8 x 201 tokens + 1 + (120 - 100.02) / 0.1 = 1608 + 200.8 tokens in 120 s, in both arms.
    assert row.startswith("| Output throughput, equal 120 s window (tok/s) | all (9 / 9) | 15.07 | 15.07 | "
                          "+0.0% [no spread]")


def test_a_rate_over_the_same_requests_shows_no_spread_where_per_request_times_keep_their_ci(tmp_path):
    """Both arms complete the same 8 requests with the same tokens, in windows that differ as their TPOTs do:
    every session resample gives the windows' ratio, so the throughput row may not print a zero-width CI as if
    it were certain. Their TPOTs differ request by request, so that row keeps a CI with width."""
    off = [record(f"s{i}", 0, 1000.0 * i, tpot=50.0 + i, osl=201) for i in range(8)]
    on = [record(f"s{i}", 0, 1000.0 * i, tpot=48.0 + 2 * (i % 3), osl=201) for i in range(8)]
    run = make_run(tmp_path / "same", {"off": off, "on": on})
    md = write_report(run, n_boot=200).read_text()
    row = next(x for x in md.splitlines() if x.startswith("| Output throughput, own window (context) (tok/s)"))
    a, b, delta = row.split(" | ")[2:5]   # after the metric and the requests it counts
    # This own-window row now has no CI at all (its window ends at one request's end: analysis.metrics), which
    # is stricter than "no spread"; the equal-window row above still prints "no spread".
    assert delta == f"{(float(b) / float(a) - 1) * 100:+.1f}% [no CI: its window ends at one request's end; see " \
        "the equal-window row]", row
    row = next(x for x in md.splitlines() if x.startswith("| TPOT mean (ms)"))
    lo, hi = (float(v) for v in row.split("[")[1].split("]")[0].split(","))
    assert lo < hi, row
    assert 'A delta marked "no spread"' in md
