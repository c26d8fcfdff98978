"""Calibration tooling: resampled A/A splits, real A/A pairs from runs, and the fixed-false-alarm width."""
from __future__ import annotations

import numpy as np
import pandas as pd
from analysis_records import make_run, record

from analysis import calibrate
from analysis.rundir import load_run


def test_sign_flip_split_centres_and_flips_whole_sessions():
    lr = pd.DataFrame({"session": ["a", "a", "b", "b", "c"], "launch": 0,
                       "r": np.log([0.9, 0.8, 0.9, 1.0, 0.9])})
    out = calibrate.sign_flip_split(lr, seed=3)
    centred = lr["r"] - lr["r"].median()                     # the median is log(0.9)
    np.testing.assert_allclose(np.abs(out["r"]), np.abs(centred))
    ratio = (out["r"] / centred).where(centred != 0)
    assert ratio.groupby(lr["session"]).nunique().max() == 1    # one sign per session
    splits = [calibrate.sign_flip_split(lr, seed=s)["r"].iloc[1] for s in range(20)]
    assert {np.sign(x) for x in splits} == {-1.0, 1.0}           # both signs occur over seeds


def test_aa_frames_pair_repeats_inside_a_run_and_arms_across_runs(tmp_path):
    recs = [record(f"s{i}", 0, 100.0 * i, tpot=10.0 + i) for i in range(6)]
    r1 = load_run(make_run(tmp_path / "r1", {"off": recs, "on": recs, "off.2": recs}))
    r2 = load_run(make_run(tmp_path / "r2", {"off": recs, "on": recs}))
    names = [n for n, _ in calibrate.aa_frames([r1, r2])]
    assert names == ["r1:off vs off.2", "r1:off vs r2:off", "r1:on vs r2:on"]
    assert all(len(f) == 6 for _, f in calibrate.aa_frames([r1, r2]))


def test_width_at_fixed_false_alarms_uses_the_null_spread():
    rng = np.random.default_rng(0)

    def frame(shift):
        return pd.DataFrame({"session": [f"s{i % 8}" for i in range(64)], "launch": 0,
                             "r": shift + rng.normal(0, 0.05, 64)})

    table = calibrate.width_at_fixed_false_alarms([frame(-0.07)] * 3, [frame(0.0) for _ in range(20)], n_boot=200)
    assert list(table["estimator"]) == ["median", "trimmed_mean", "hodges_lehmann", "mean_log"]
    assert (table["k_at_5pct"] > 0).all() and (table["k_at_5pct"] < 4).all()
    assert (table["detected"] == 3).all()                       # -7% against ~0.6% of noise per session
    assert calibrate.md_table(table).startswith("| estimator | k_at_5pct |")
    assert (table["median_width"] > 0).all()
