"""analysis.metrics on frames small enough to check by hand."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from analysis_records import record

from analysis.load import add_match_key, profiling_only, records_frame
from analysis.metrics import (ArmData, arm_deltas, match_counts, match_requests, matched_arm_deltas, matched_deltas,
                              percentile, per_request_delta)


def frame(lines):
    return add_match_key(profiling_only(records_frame(lines)))


def test_percentile_linear_by_hand():
    v = [10, 20, 30, 40]
    assert percentile(v, 50) == 25.0           # h = 1.5 -> 20 + 0.5 * 10
    assert percentile(v, 90) == pytest.approx(37.0)   # h = 2.7 -> 30 + 0.7 * 10
    assert percentile(v, 0) == 10 and percentile(v, 100) == 40
    assert percentile([5.0, float("nan"), 7.0], 50) == 6.0   # NaN ignored
    assert math.isnan(percentile([], 50))


def test_arm_table_point_estimates_by_hand():
    # Two sessions, two turns each; window 2 s; off TPOT 4,6,8,10 and on half of it.
    off = frame([record("s0", 0, 0, tpot=4), record("s0", 1, 100, tpot=6),
                 record("s1", 0, 0, tpot=8), record("s1", 1, 100, tpot=10)])
    on = frame([record("s0", 0, 0, tpot=2), record("s0", 1, 100, tpot=3),
                record("s1", 0, 0, tpot=4), record("s1", 1, 100, tpot=5)])
    t = arm_deltas(ArmData(off, 2.0), ArmData(on, 2.0), n_boot=200).set_index("key")
    assert t.loc["tpot_p50", ["a", "b"]].tolist() == [7.0, 3.5]
    assert t.loc["tpot_mean", ["a", "b"]].tolist() == [7.0, 3.5]
    assert t.loc["tpot_p90", "a"] == pytest.approx(9.4)                  # h = 2.7 -> 8 + 0.7 * 2
    assert t.loc["inter_p50", ["a", "b"]].tolist() == pytest.approx([1000 / 7, 1000 / 3.5])
    assert t.loc["inter_p50", "delta_pct"] == pytest.approx(100.0)
    assert t.loc["tpot_p50", "delta_pct"] == pytest.approx(-50.0)
    assert t.loc["throughput", "a"] == pytest.approx(4 * 11 / 2.0)       # 4 requests x 11 tokens / 2 s
    assert t.loc["completed", ["a", "b"]].tolist() == [4.0, 4.0]
    assert t.loc["ttft_p50", "delta_pct"] == 0.0
    # Two sessions are too few for a session bootstrap: no CI rather than a false one.
    assert t.loc["tpot_mean", "sessions"] == 2 and t["lo"].isna().all() and t["hi"].isna().all()


def test_ci_collapses_when_every_request_halves():
    off = frame([record(f"s{i}", 0, 0, tpot=4 + i) for i in range(6)])
    on = frame([record(f"s{i}", 0, 0, tpot=(4 + i) / 2) for i in range(6)])
    t = arm_deltas(ArmData(off, 1.0), ArmData(on, 1.0), n_boot=200).set_index("key")
    # Every session-resample halves too, so the CI collapses on -50% for every TPOT statistic.
    for key in ("tpot_p50", "tpot_mean", "tpot_p90"):
        assert t.loc[key, ["delta_pct", "lo", "hi"]].tolist() == pytest.approx([-50.0, -50.0, -50.0])


def test_own_window_throughput_gets_no_ci():
    """The own window ends at the last request's end, which a session bootstrap holds fixed: no CI, and the
    row says where to look instead."""
    off = frame([record(f"s{i}", 0, 0, tpot=4 + i) for i in range(6)])
    on = frame([record(f"s{i}", 0, 0, tpot=(4 + i) / 2) for i in range(6)])
    t = arm_deltas(ArmData(off, 2.0), ArmData(on, 1.0), n_boot=200).set_index("key")
    assert t.loc["throughput", "delta_pct"] == pytest.approx(100.0)
    assert np.isnan(t.loc["throughput", "lo"]) and np.isnan(t.loc["throughput", "hi"])
    assert "equal-window row" in t.loc["throughput", "why"]
    assert np.isfinite(t.loc["completed", "lo"])


def test_matched_arm_rows_by_hand_leave_out_requests_one_arm_sent():
    # Six sessions; on 10% faster on each request both completed, plus a fast second turn (a prefix-cache hit) in
    # every session that only on got to send. Over the matched requests: medians 12.5 -> 11.25, -10%, and every
    # session resample scales by 0.9, so the CI collapses on -10%. On's own median (1, 1, ..., 9, ..., 13.5) is 5.
    off = frame([record(f"s{i}", 0, 0, tpot=10 + i, ttft=100) for i in range(6)])
    on = frame([record(f"s{i}", 0, 0, tpot=0.9 * (10 + i), ttft=90) for i in range(6)]
               + [record(f"s{i}", 1, 50, tpot=1, ttft=15) for i in range(6)])
    t = matched_arm_deltas(match_requests(off, on), n_boot=200).set_index("key")
    assert list(t.index) == ["tpot_p50", "tpot_mean", "tpot_p90", "inter_p50", "inter_p90", "ttft_p50", "e2e_p90"]
    assert t.loc["tpot_p50", ["n", "a", "b"]].tolist() == pytest.approx([6, 12.5, 11.25])
    assert t.loc["tpot_p50", ["delta_pct", "lo", "hi"]].tolist() == pytest.approx([-10.0, -10.0, -10.0])
    assert t.loc["ttft_p50", ["a", "b", "delta_pct"]].tolist() == pytest.approx([100.0, 90.0, -10.0])
    assert t.loc["inter_p50", "delta_pct"] == pytest.approx(100 / 0.9 - 100)
    assert t["sessions"].eq(6).all()
    own = arm_deltas(ArmData(off, 1.0), ArmData(on, 1.0), n_boot=200).set_index("key")
    assert own.loc["tpot_p50", "b"] == pytest.approx(5.0)                  # (1 + 9) / 2: the extras pull it down


def test_match_with_repeated_keys_and_unmatched_requests():
    # c0/0 runs twice in both arms (retry or re-dispatch): the k-th occurrence pairs with the k-th.
    a = frame([record("c0", 0, 0, tpot=10), record("c0", 0, 50, tpot=20), record("c1", 0, 0, tpot=30),
               record("c2", 0, 0, tpot=40), record("c3", 0, 0, error="500")])
    b = frame([record("c0", 0, 60, tpot=18), record("c0", 0, 5, tpot=9), record("c1", 0, 0, error="500"),
               record("c3", 0, 0, tpot=5), record("c4", 0, 0, tpot=7)])
    m = match_requests(a, b)
    assert match_counts(m) == {"matched": 2, "only_a": 1, "only_b": 1, "failed_a": 1, "failed_b": 1,
                               "failed_both": 0, "errored_a": 1, "errored_b": 1}
    pairs = m[m["status"] == "matched"].sort_values("occurrence")
    assert pairs[["tpot_ms_a", "tpot_ms_b"]].values.tolist() == [[10, 9], [20, 18]]
    assert sorted(per_request_delta(m).round(6).tolist()) == [-10.0, -10.0]
    st = m.set_index(["conversation_id", "occurrence"])["status"]
    assert st[("c1", 0)] == "failed_b" and st[("c3", 0)] == "failed_a"
    assert st[("c2", 0)] == "only_a" and st[("c4", 0)] == "only_b"


def test_matched_deltas_by_hand():
    a = frame([record("s0", 0, 0, tpot=10, ttft=20), record("s1", 0, 0, tpot=20, ttft=20),
               record("s2", 0, 0, tpot=30, ttft=20)])
    b = frame([record("s0", 0, 0, tpot=9, ttft=20), record("s1", 0, 0, tpot=16, ttft=21),
               record("s2", 0, 0, tpot=33, ttft=19)])
    t = matched_deltas(match_requests(a, b), n_boot=200).set_index("key")
    row = t.loc["tpot_ms"]
    assert row["n"] == 3 and row["a"] == 20.0 and row["b"] == pytest.approx(58 / 3)
    assert row["delta_pct"] == pytest.approx((58 / 3 - 20) / 20 * 100)
    assert row["median_req_delta_pct"] == pytest.approx(-10.0)          # -10%, -20%, +10%
    assert (row["faster"], row["slower"]) == (2, 1) and row["sign_p"] == pytest.approx(1.0)
    assert row["sessions"] == 3 and np.isnan(row["lo"])                  # 3 sessions: below MIN_SESSIONS
    lat = t.loc["latency_ms"]                                             # latency = ttft + 10 * tpot
    assert lat["a"] == pytest.approx(220.0) and lat["b"] == pytest.approx((110 + 181 + 349) / 3)


def test_sign_test_counts_sessions_not_requests():
    """Twenty requests faster, all in two sessions: two signs, p = 0.5, not 20 signs, p = 2e-6."""
    a = frame([record(f"s{i % 2}", i, 0, tpot=10) for i in range(20)])
    b = frame([record(f"s{i % 2}", i, 0, tpot=9) for i in range(20)])
    row = matched_deltas(match_requests(a, b), n_boot=200).set_index("key").loc["tpot_ms"]
    assert (row["faster"], row["slower"]) == (20, 0) and row["sign_p"] == pytest.approx(0.5)



def test_a_subagent_conversation_is_one_session_with_its_parent():
    """aiperf names a subagent's conversation `<session>::sa:<agent>`: its requests hang on the parent's, so
    s0 and its two subagents are one unit for the sign test and the bootstrap, not three."""
    ids = ["s0", "s0::sa:agent_001", "s0::sa:agent_002", "s1", "s1::fa:000"]
    a = frame([record(c, 0, 0, tpot=10) for c in ids])
    b = frame([record(c, 0, 0, tpot=9) for c in ids])
    row = matched_deltas(match_requests(a, b), n_boot=200).set_index("key").loc["tpot_ms"]
    assert row["sessions"] == 2 and row["sign_p"] == pytest.approx(0.5)   # 2 signs, not 5 (p 0.0625)
    assert arm_deltas(ArmData(a, 1.0), ArmData(b, 1.0), n_boot=200)["sessions"].eq(2).all()

def test_matched_deltas_empty_when_nothing_matches():
    a = frame([record("s0", 0, 0)])
    b = frame([record("s1", 0, 0)])
    assert matched_deltas(match_requests(a, b)).empty
    assert isinstance(per_request_delta(match_requests(a, b)), pd.Series)
