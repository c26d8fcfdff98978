"""The primary estimate: each statistic on a frame small enough to check by hand, and the estimator's
calibration (false alarms, power) on synthetic data with a known effect."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis import estimate as est


def test_trimmed_mean_cuts_a_fifth_at_each_end():
    v = np.array([1.0, 2.0, 3.0, 4.0, 100.0])
    assert est.trimmed_mean_stat(v, np.ones((1, 5)))[0] == pytest.approx(3.0)         # mean(2, 3, 4)
    # Weights [2, 1, 1, 1, 0] expand to [1, 1, 2, 3, 4]; cut one at each end: mean(1, 2, 3) = 2.
    assert est.trimmed_mean_stat(v, np.array([[2, 1, 1, 1, 0]]))[0] == pytest.approx(2.0)
    # Ten values, cut two at each end: a value's copies straddle the cut ([1]*3 + [2]*4 + [3]*3 -> 1, 2*4, 3).
    assert est.trimmed_mean_stat(np.array([1.0, 2.0, 3.0]), np.array([[3, 4, 3]]))[0] == pytest.approx(2.0)


def test_hodges_lehmann_is_the_median_of_walsh_averages():
    v = np.array([0.0, 1.0, 3.0])
    # Walsh averages: 0, .5, 1.5, 1, 2, 3 -> median (1 + 1.5) / 2.
    assert est.hodges_lehmann_stat(v, np.ones((1, 3)))[0] == pytest.approx(1.25)
    # Weights [2, 1, 0] expand to [0, 0, 1]: Walsh averages 0, 0, 0, .5, .5, 1 -> median .25.
    assert est.hodges_lehmann_stat(v, np.array([[2, 1, 0]]))[0] == pytest.approx(0.25)


def _pairs(a, b, sessions):
    return pd.DataFrame({"conversation_id": sessions, "tpot_ms_a": a, "tpot_ms_b": b, "status": "matched"})


def test_log_ratios_drop_unusable_pairs_and_estimate_gives_percent():
    p = _pairs([10, 10, 10, 0, np.nan, 10], [9, 9, 9, 9, 9, 9], ["s0", "s1", "s2", "s3", "s4", "s5"])
    lr = est.log_ratios(p)
    assert list(lr["session"]) == ["s0", "s1", "s2", "s5"]
    np.testing.assert_allclose(lr["r"], np.log(0.9))
    lr = est.log_ratios(_pairs([10.0] * 6, [9.0] * 6, [f"s{i}" for i in range(6)]))
    for name in est.ESTIMATORS:  # every request 10% faster: every centre, and its CI, is -10%
        e = est.estimate(lr, name, n_boot=50, launch_sd=0)
        assert (e.pct, e.lo, e.hi, e.n, e.sessions) == pytest.approx((-10.0, -10.0, -10.0, 6, 6))


def test_too_few_sessions_give_no_ci():
    e = est.estimate(est.log_ratios(_pairs([10.0, 10.0], [9.0, 8.0], ["s0", "s1"])), "median", n_boot=50)
    assert e.pct == pytest.approx((np.sqrt(0.9 * 0.8) - 1) * 100) and np.isnan(e.lo) and e.sessions == 2


def test_session_weights_move_whole_sessions_across_launches():
    """Launches replay the same sessions: one draw of sessions per replicate, a session's weight the same in
    every launch and on every row (the launch drift comes from the launches' spread, not from the draw)."""
    session = np.array(["a", "a", "b", "c", "a", "b"])
    w = est.session_weights(session, n_boot=300, seed=1)
    assert (w[:, 0] == w[:, 1]).all() and (w[:, 0] == w[:, 4]).all() and (w[:, 2] == w[:, 5]).all()
    assert (w[:, [0, 2, 3]].sum(axis=1) == 3).all()      # 3 sessions, 3 drawn
    one = est.session_weights(np.array(["a", "b", "c", "d"]), n_boot=100, seed=1)
    assert (one.sum(axis=1) == 4).all()


def test_small_sample_factor_and_detectable_effect():
    # t(0.975, 9) = 2.262, times sqrt(10 / 9).
    assert est.small_sample_factor(10) == pytest.approx(2.262 * np.sqrt(10 / 9), abs=1e-3)
    assert est.small_sample_factor(1000) == pytest.approx(1.963, abs=1e-3)   # t(999) 1.9623 x 1.0005
    with pytest.raises(ValueError, match=r"level: 90.0 is not supported; allowed: 95.0"):
        est.small_sample_factor(10, 90.0)
    e = est.Estimate("median", -5.0, -8.0, -2.0, se_log=0.01, n=100, sessions=10, launches=1)
    assert e.mde_log() == pytest.approx((2.262 * np.sqrt(10 / 9) + 0.8416) * 0.01, abs=1e-4)
    # The window that detects an effect equal to the MDE is this one; half the effect needs 4x.
    assert est.window_for_effect(60.0, e, e.mde_pct()) == pytest.approx(60.0)
    assert est.window_for_effect(60.0, e, np.expm1(e.mde_log() / 2) * 100) == pytest.approx(240.0)
    # The launch drift in se_log does not shrink: here 0.6% of the 1% is drift, so half the MDE needs
    # (1 - 0.36) / (0.25 - 0.36) < 0 -> no window, and a quarter less than the MDE needs 0.64 / (0.5625 - 0.36).
    d = est.Estimate("median", -5.0, -8.0, -2.0, se_log=0.01, n=100, sessions=10, launches=1, se_launch=0.006)
    assert est.window_for_effect(60.0, d, d.mde_pct()) == pytest.approx(60.0)
    assert est.window_for_effect(60.0, d, np.expm1(d.mde_log() / 2) * 100) == float("inf")
    assert est.window_for_effect(60.0, d, np.expm1(d.mde_log() * 0.75) * 100) == pytest.approx(
        60.0 * 0.64 / (0.5625 - 0.36))


def synth(rng, effect_pct, n_sessions=10, per_session=8, outlier_p=0.08):
    """Agentic-like matched pairs: a per-session offset (sessions differ in context), request noise, and
    a few requests that sat behind another session's prefill in one arm only (log-ratio +-0.5..1.5)."""
    rows = []
    for s in range(n_sessions):
        u = rng.normal(0, 0.03)
        for _ in range(per_session):
            r = np.log1p(effect_pct / 100) + u + rng.normal(0, 0.05)
            if rng.random() < outlier_p:
                r += rng.choice([-1, 1]) * rng.uniform(0.5, 1.5)
            rows.append((f"s{s}", 0, r))
    return pd.DataFrame(rows, columns=["session", "launch", "r"])


@pytest.mark.parametrize("effect, lo, hi", [(0.0, 0.0, 0.10), (-7.0, 0.9, 1.0)])
def test_primary_calibration_on_synthetic_data(effect, lo, hi):
    """At no effect the primary CI excludes 0 about 5% of the time (<= 10% allowed over 60 draws: the
    binomial spread at 5% is +-2.8 pts); at the quickstart's ~7% it nearly always does, centred on -7%."""
    rng = np.random.default_rng(11)
    es = [est.estimate(synth(rng, effect), est.PRIMARY, n_boot=300, seed=k) for k in range(60)]
    rate = np.mean([e.excludes_zero() for e in es])
    assert lo <= rate <= hi, rate
    assert np.median([e.pct for e in es]) == pytest.approx(effect, abs=0.7)


def test_repeated_launches_widen_the_ci_by_their_disagreement():
    """ABBA: two launch pairs, each internally exact (every request -10%, then every request -5%). Within
    one launch the CI collapses; pooled, launches are resampled too, so the CI spans both."""
    sessions = [f"s{i}" for i in range(6)]
    one = pd.DataFrame({"session": sessions, "launch": "off|on", "r": np.log(0.90)})
    two = pd.DataFrame({"session": sessions, "launch": "off.2|on.2", "r": np.log(0.95)})
    alone = est.estimate(one, "median", n_boot=400, launch_sd=0)
    assert (alone.lo, alone.hi, alone.launches) == pytest.approx((-10.0, -10.0, 1))
    both = est.estimate(pd.concat([one, two]), "median", n_boot=400)
    assert both.launches == 2 and both.n == 12
    assert both.lo < -10.0 and both.hi > -5.0, both
    # One launch pair: the launch drift a session bootstrap cannot see joins in quadrature, 2 x 0.2%^2.
    drift = est.estimate(one, "median", n_boot=400)
    half = est.small_sample_factor(6) * np.sqrt(2) * est.LAUNCH_SD_LOG
    assert (drift.lo, drift.hi) == pytest.approx(((0.9 * np.exp(-half) - 1) * 100, (0.9 * np.exp(half) - 1) * 100))


def launches(rng, n_launch, drift, shared=0.0, n_sessions=10, per_session=10, noise=0.02):
    """Null-effect log-ratios of `n_launch` launch pairs replaying the same sessions: a drift per launch
    (SD `drift`), a session effect shared by every launch (SD `shared`), request noise."""
    u = rng.normal(0, shared, n_sessions)
    rows = [(f"s{s}", f"L{k}", d + u[s] + rng.normal(0, noise))
            for k in range(n_launch) for d in [rng.normal(0, drift)] for s in range(n_sessions)
            for _ in range(per_session)]
    return pd.DataFrame(rows, columns=["session", "launch", "r"])


@pytest.mark.parametrize("n_launch, drift, shared", [(2, 0.01, 0.0), (3, 0.01, 0.0), (2, 0.005, 0.01)])
def test_repeated_launch_ci_covers_launch_drift(n_launch, drift, shared):
    """Launch drift (1% a launch, against 0.2% of request noise in a launch's centre) is what repeated launches
    are for: at no effect the CI excludes 0 about 5% of the time (<= 10% allowed over 200 draws: the binomial
    spread at 5% is +-1.5 pts). Resampling launches with replacement alarmed 25% (two launches) and 14% (three)."""
    rng = np.random.default_rng(7)
    alarms = [est.estimate(launches(rng, n_launch, drift, shared), est.PRIMARY, n_boot=200, seed=t).excludes_zero()
              for t in range(200)]
    assert np.mean(alarms) <= 0.10, np.mean(alarms)


def test_two_launches_that_disagree_give_a_wide_ci_and_say_so():
    """Two launch pairs 4 points apart, each internally tight: the spread of two launches has one degree of
    freedom, so the CI is Student's t(1) wide and the estimate says the launches disagree."""
    rng = np.random.default_rng(3)
    lr = pd.concat([pd.DataFrame({"session": [f"s{s}" for s in range(10) for _ in range(5)], "launch": name,
                                  "r": np.log(c) + rng.normal(0, 0.005, 50)}) for name, c in (("A", 0.90), ("B", 0.94))])
    e = est.estimate(lr, est.PRIMARY, n_boot=400)
    assert e.launches == 2 and e.launches_disagree()
    assert e.launch_pcts == pytest.approx((-10.0, -6.0), abs=0.5)
    assert e.k == pytest.approx(est.T975[1], rel=0.02)        # df ~ 1
    assert e.lo < -10.0 - 10 and e.hi > -6.0 + 10, e
    # The drift is measured, and no window shrinks it: no window detects 5% (once se_launch was 0 for repeated
    # launches, and a longer window seemed to shrink the drift too).
    assert e.se_launch == pytest.approx(0.02, rel=0.15)
    assert est.window_for_effect(60.0, e, 5.0) == float("inf")
