"""analysis.stats: weighted quantiles, sign test, session bootstrap calibration, noise floor."""
from __future__ import annotations

import numpy as np
import pytest

from analysis import stats


# -- weighted quantile == np.percentile of the expanded sample -------------------------------

def test_weighted_quantile_by_hand():
    v = np.array([1.0, 2.0, 3.0, 4.0])
    # weights [2,0,1,1] -> sample [1,1,3,4]; p50 = (1+3)/2 = 2; p90: h = 3*0.9 = 2.7 -> 3 + 0.7*(4-3) = 3.7
    w = np.array([[2, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]])
    assert stats.weighted_quantile(v, w, 50)[:2].tolist() == [2.0, 2.5]
    assert stats.weighted_quantile(v, w, 90)[0] == pytest.approx(3.7)
    assert np.isnan(stats.weighted_quantile(v, w, 50)[2])


def test_weighted_quantile_matches_numpy_on_random_weights():
    rng = np.random.default_rng(0)
    v = np.sort(rng.normal(size=17))
    w = rng.integers(0, 4, size=(40, 17))
    w[w.sum(axis=1) == 0, 0] = 1
    for q in (0, 10, 50, 90, 99, 100):
        expected = [np.percentile(np.repeat(v, row), q) for row in w]
        np.testing.assert_allclose(stats.weighted_quantile(v, w, q), expected)


def test_mean_and_rate_stats():
    v = np.array([1.0, 2.0, 6.0])
    w = np.array([[1, 1, 1], [0, 3, 1]])
    np.testing.assert_allclose(stats.mean_stat(v, w), [3.0, 12.0 / 4])
    np.testing.assert_allclose(stats.rate_stat(2.0)(v, w), [4.5, 6.0])
    np.testing.assert_allclose(stats.inverse_quantile_stat(50)(np.array([4.0, 5.0]), np.ones((1, 2))), [1000 / 4.5])


# -- sign test against hand-computed binomial tails -------------------------------------------

@pytest.mark.parametrize("diffs, expected", [
    ([-1, -2, -3, -4, 1], (4, 1, 12 / 32)),           # n=5, k=1: 2 * (1 + 5) / 32
    ([-1] * 10, (10, 0, 2 / 1024)),                   # n=10, k=0
    ([-1, 1, -1, 1], (2, 2, 1.0)),                    # balanced: capped at 1
    ([-1, -1, -1, 1, 1, 0, 0], (3, 2, 1.0)),          # ties dropped; n=5, k=2: 2*16/32 = 1
    ([-1] * 7 + [1], (7, 1, 2 * 9 / 256)),            # n=8, k=1: 2 * (1 + 8) / 256
    ([], (0, 0, 1.0)),
])
def test_sign_test_hand_values(diffs, expected):
    neg, pos, p = stats.sign_test(diffs)
    assert (neg, pos) == expected[:2]
    assert p == pytest.approx(expected[2])


# -- session bootstrap: calibration on synthetic sessions with a known effect -----------------

N_SESSIONS, TURNS, BASE_MS = 30, 4, 10.0


def synthetic_pair(rng, effect: float, noise: float):
    """Two arms over the same sessions: value = base * (1 + effect?) * session factor * request noise.

    The session factor is shared by both arms (same trace); turns within a session are
    correlated through it. b is a pure scale of a's distribution, so every quantile's and the
    mean's true delta is exactly `effect`.
    """
    sess = np.repeat(np.arange(N_SESSIONS), TURNS)
    u = rng.lognormal(0.0, 0.3, N_SESSIONS)[sess]
    a = BASE_MS * u * (1 + rng.normal(0, noise, len(sess)))
    b = BASE_MS * (1 + effect) * u * (1 + rng.normal(0, noise, len(sess)))
    return a, b, sess


def one_trial(seed: int, effect: float, noise: float, stat: stats.Stat, n_boot: int = 600) -> stats.Delta:
    rng = np.random.default_rng(seed)
    a, b, sess = synthetic_pair(rng, effect, noise)
    sl = list(range(N_SESSIONS))
    return stats.paired_bootstrap(stats.make_sample(a, sess, sl, stat), stats.make_sample(b, sess, sl, stat),
                                  N_SESSIONS, n_boot=n_boot, seed=seed + 1000)


@pytest.mark.parametrize("stat", [stats.mean_stat, stats.quantile_stat(50)], ids=["mean", "p50"])
def test_ci_covers_known_effect_in_at_least_90_of_100(stat):
    effect = -0.05
    covered = sum(d.lo <= effect * 100 <= d.hi for d in (one_trial(s, effect, 0.05, stat) for s in range(100)))
    assert covered >= 90, covered


def test_ci_excludes_zero_when_effect_is_3x_the_noise():
    noise = 0.04
    deltas = [one_trial(s, 3 * noise, noise, stats.mean_stat) for s in range(100)]
    assert all(d.lo > 0 for d in deltas)


def test_ci_power_and_false_positives_at_3_standard_errors():
    """Sharper: 'noise' = the spread of the delta estimate itself, measured by A/A trials."""
    aa = [one_trial(s, 0.0, 0.15, stats.mean_stat) for s in range(100)]
    false_pos = sum(d.excludes_zero() for d in aa)
    se = np.std([d.pct for d in aa]) / 100
    ab = [one_trial(s, 3 * se, 0.15, stats.mean_stat) for s in range(100, 200)]
    power = sum(d.lo > 0 for d in ab)
    assert false_pos <= 10, false_pos          # nominal 5%
    assert power >= 70, power                  # nominal ~85% for a two-sided 5% test at 3 SE


def test_matched_ratio_bootstrap_covers_effect():
    covered = 0
    for s in range(100):
        a, b, sess = synthetic_pair(np.random.default_rng(s), 0.10, 0.05)
        d = stats.paired_ratio_bootstrap(a, b, sess, n_boot=600, seed=s)
        covered += d.lo <= 10.0 <= d.hi
    assert covered >= 90, covered


def test_bootstrap_is_deterministic_and_point_estimate_is_plain():
    a, b, sess = synthetic_pair(np.random.default_rng(3), 0.1, 0.05)
    d1 = stats.paired_ratio_bootstrap(a, b, sess, n_boot=300, seed=5)
    d2 = stats.paired_ratio_bootstrap(a, b, sess, n_boot=300, seed=5)
    assert d1 == d2
    assert d1.pct == pytest.approx((b.mean() - a.mean()) / a.mean() * 100)
    assert d1.lo < d1.pct < d1.hi


def test_noise_floor_is_largest_abs_bound():
    assert stats.noise_floor(stats.Delta(1, 1, 0.5, -2.0, 3.0)) == 3.0
    assert stats.noise_floor(stats.Delta(1, 1, -4.0, -6.5, -1.0)) == 6.5


def test_an_arm_with_fewer_than_min_sessions_gets_no_ci():
    """Ten sessions between the arms, but b has one request in one session: b's median cannot vary as a
    session bootstrap assumes, and a third of the replicates draw none of b (its median undefined). No CI."""
    s = [f"s{i}" for i in range(10)]
    a = stats.make_sample(np.arange(10, 20.0), s, s, stats.quantile_stat(50))
    b = stats.make_sample([12.0], ["s0"], s, stats.quantile_stat(50))
    d = stats.paired_bootstrap(a, b, 10, n_boot=200)
    assert d.pct == pytest.approx((12.0 - 14.5) / 14.5 * 100)
    assert np.isnan(d.lo) and np.isnan(d.hi) and d.sessions == 1
    assert d.why == f"< {stats.MIN_SESSIONS} sessions"


def test_a_ci_is_not_built_from_the_replicates_that_happened_to_be_defined():
    """Each arm has 10 sessions, but a's median is 0 in any replicate that draws 6+ of its zero sessions (a
    delta over 0: undefined); dropping those replicates would give a CI of the lucky draws."""
    s = [f"s{i}" for i in range(10)]
    a = stats.make_sample([0.0] * 5 + [1.0] * 5, s, s, stats.quantile_stat(50))
    b = stats.make_sample([1.0] * 10, s, s, stats.quantile_stat(50))
    d = stats.paired_bootstrap(a, b, 10, n_boot=400)
    assert np.isnan(d.lo) and np.isnan(d.hi) and d.sessions == 10
    assert d.why.startswith("undefined in ") and d.why.endswith("% of resamples"), d.why
    from analysis.formatting import fmt_delta
    assert fmt_delta(d.pct, d.lo, d.hi, d.why) == f"{d.pct:+.1f}% [no CI: {d.why}]"
