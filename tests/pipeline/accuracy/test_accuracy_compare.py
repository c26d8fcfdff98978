"""Paired comparisons on tables small enough to check by hand."""
from __future__ import annotations

import json
from math import comb

import pandas as pd
import pytest

from pipeline.accuracy.compare import (RepeatsResult, compare_files, compare_records, mcnemar,
                                       mcnemar_exact_p, no_difference_ci, output_divergence, paired_repeats,
                                       sign_flip_p)


@pytest.mark.parametrize("b, c, want", [
    (1, 6, 0.125),             # 2 * (C(7,0) + C(7,1)) / 2^7 = 16/128
    (6, 1, 0.125),
    (0, 5, 0.0625),            # 2 / 2^5
    (2, 8, 0.109375),          # 2 * (1 + 10 + 45) / 1024
    (3, 3, 1.0),               # 2 * 42/64 > 1: capped
    (0, 1, 1.0),
    (0, 0, 1.0),
])
def test_mcnemar_exact_p(b, c, want):
    assert mcnemar_exact_p(b, c) == pytest.approx(want, abs=1e-12)


def test_mcnemar_negative_count():
    with pytest.raises(ValueError, match="discordant counts must be >= 0, got b=-1, c=2"):
        mcnemar_exact_p(-1, 2)


def _rec(qid, correct, *, repeat=0, failed=False, output=None, extracted=None):
    return {"id": qid, "repeat": repeat, "correct": correct, "failed": failed,
            "output": output if output is not None else f"out {qid} {correct}",
            "extracted": extracted, "gold": "1"}


def _gsm_arms():
    # 3 both right, 1 off-only, 6 on-only, 2 both wrong, 1 failed in on, 1 only in off.
    pattern = [(1, 1)] * 3 + [(1, 0)] + [(0, 1)] * 6 + [(0, 0)] * 2
    off = [_rec(f"q{i}", bool(a)) for i, (a, _) in enumerate(pattern)]
    on = [_rec(f"q{i}", bool(b)) for i, (_, b) in enumerate(pattern)]
    off += [_rec("qf", True), _rec("q_off_only", True)]
    on += [_rec("qf", False, failed=True)]
    return off, on


def test_mcnemar_table_and_discordant():
    off, on = _gsm_arms()
    r = mcnemar(off, on)
    assert (r.n_pairs, r.both_correct, r.off_only, r.on_only, r.both_wrong) == (12, 3, 1, 6, 2)
    assert r.p_value == pytest.approx(0.125)
    assert (r.accuracy_off, r.accuracy_on) == (4 / 12, 9 / 12)
    assert r.delta == pytest.approx(5 / 12)
    assert (r.n_excluded_failed, r.n_unmatched) == (1, 1)
    assert [d.id for d in r.discordant] == ["q3", "q4", "q5", "q6", "q7", "q8", "q9"]
    assert (r.discordant[0].off, r.discordant[0].on) == (1.0, 0.0)
    assert mcnemar(pd.DataFrame(off), pd.DataFrame(on)) == r


def test_mcnemar_refuses_repeats():
    off = [_rec("q1", True, repeat=0), _rec("q1", True, repeat=1)]
    with pytest.raises(ValueError, match="question 'q1' has repeats > 0; .*use paired_repeats"):
        mcnemar(off, off)


def test_sign_flip_exact_by_hand():
    assert sign_flip_p([1, 1, 1])[0] == pytest.approx(2 / 8)
    assert sign_flip_p([1, 1, 1, 0, 0])[0] == pytest.approx(2 / 8)   # zeros carry no sign
    # +-0.5 +-0.25 +-0.25: |sum| >= 1 only for all-plus and all-minus.
    assert sign_flip_p([0.5, 0.25, 0.25])[0] == pytest.approx(2 / 8)
    assert sign_flip_p([1, -1]) == (1.0, "exact sign-flip")
    assert sign_flip_p([0, 0]) == (1.0, "exact sign-flip")


def test_sign_flip_monte_carlo_matches_binomial():
    # 20 diffs of +-1 with 15 positive: p = P(|2X - 20| >= 10), X ~ Bin(20, 1/2).
    exact = 2 * sum(comb(20, j) for j in range(15, 21)) / 2 ** 20
    p, method = sign_flip_p([1] * 15 + [-1] * 5, n_resamples=100_000, seed=1)
    assert method.startswith("monte-carlo") and p == pytest.approx(exact, abs=0.004)
    assert sign_flip_p([1] * 15 + [-1] * 5, seed=1) == (p, method)   # seeded: repeatable


def test_paired_repeats_by_hand():
    # R=2. Means off [1, .5, 0], on [1, 1, .5]: diffs [0, .5, .5].
    off = [_rec("a", True, repeat=0), _rec("a", True, repeat=1),
           _rec("b", True, repeat=0), _rec("b", False, repeat=1),
           _rec("c", False, repeat=0), _rec("c", False, repeat=1)]
    on = [_rec("a", True, repeat=0), _rec("a", True, repeat=1),
          _rec("b", True, repeat=0), _rec("b", True, repeat=1),
          _rec("c", True, repeat=0), _rec("c", False, repeat=1)]
    r = paired_repeats(off, on)
    assert (r.n_questions, r.n_nonzero) == (3, 2)
    assert (r.mean_off, r.mean_on, r.delta) == pytest.approx((0.5, 5 / 6, 1 / 3))
    assert r.p_value == pytest.approx(0.5)     # +-.5 +-.5: |sum| >= 1 in 2 of 4
    assert [d.id for d in r.discordant] == ["b", "c"]
    assert r.ci_low <= r.delta <= r.ci_high and 0 <= r.ci_low


def test_output_divergence():
    off = [_rec("a", True, output="same text"), _rec("b", True, output="abcdef"),
           _rec("c", True, output="xyz"), _rec("d", True, output="long")]
    on = [_rec("a", True, output="same text"), _rec("b", True, output="abcXef"),
          _rec("c", True, output="xyz and more"), _rec("d", True, failed=True)]
    r = output_divergence(off, on)
    assert (r.n_pairs, r.n_identical, r.n_differ) == (3, 1, 2)
    assert r.diverged == (("b", 0, 3), ("c", 0, 3))
    assert r.median_first_diff_char == 3.0 and r.fraction_differ == pytest.approx(2 / 3)


def test_compare_records_picks_the_test_and_formats_a_cell():
    off, on = _gsm_arms()
    for r in (*off, *on):
        r["correct_strict"] = r["correct"]
    c = compare_records("gsm8k", off, on)
    assert c.test == mcnemar(off, on) and c.strict.p_value == pytest.approx(0.125)
    assert c.cell() == ("McNemar exact p=0.125 (off-only 1, on-only 6, n=12); strict p=0.125; "
                        "outputs differ 7/12; 2 unpaired/failed excluded")
    assert "|" not in str(c)
    rep_off = [_rec("a", True, repeat=k) for k in range(2)]
    rep_on = [_rec("a", k == 0, repeat=k) for k in range(2)]
    g = compare_records("gpqa_diamond", rep_off, rep_on)
    assert isinstance(g.test, RepeatsResult) and g.strict is None
    assert g.cell().startswith("paired sign-flip p=1, 95% CI [-50.0, -50.0] pp; 1 of 1 questions differ")


def test_compare_files_reads_jsonl(tmp_path):
    off, on = _gsm_arms()
    pa, pb = tmp_path / "off.jsonl", tmp_path / "on.jsonl"
    pa.write_text("".join(json.dumps(r) + "\n" for r in off))
    pb.write_text("".join(json.dumps(r) + "\n" for r in on))
    assert compare_files("gpqa_diamond", pa, pb).test == mcnemar(off, on)


def test_paired_difference_ci_tango():
    from pipeline.accuracy.compare import Z_95, paired_difference_ci

    # No discordant pair: the score interval solves n d / (1 - d) = z^2, so +-z^2 / (n + z^2), by hand;
    # a bootstrap would give [0, 0] here.
    half = Z_95 ** 2 / (14 + Z_95 ** 2)
    assert paired_difference_ci(0, 0, 14) == pytest.approx((-half, half), abs=1e-9)
    assert half == pytest.approx(0.2153, abs=1e-4)
    # Fagerland, Lydersen & Laake's two examples (off_only, on_only, n); the limits were checked against
    # Tango's statistic with its constrained MLE found by a grid search (|z| = 1.960 at both ends).
    assert paired_difference_ci(7, 1, 21) == pytest.approx((-0.5172, -0.0260), abs=1e-4)
    assert paired_difference_ci(16, 6, 161) == pytest.approx((-0.1240, -0.0054), abs=1e-4)
    assert paired_difference_ci(6, 16, 161) == pytest.approx((0.0054, 0.1240), abs=1e-4)  # arms swapped
    assert paired_difference_ci(0, 5, 5)[1] == 1.0 and paired_difference_ci(5, 0, 5)[0] == -1.0
    with pytest.raises(ValueError, match="need 0 <= off_only \\+ on_only <= n and n > 0, got off_only=3, "
                                         "on_only=2, n=4"):
        paired_difference_ci(3, 2, 4)


def test_paired_accuracy_is_over_the_tested_pairs():
    """The headline accuracies and delta come from the test's pairs: a question failed in one arm (qf) or
    asked in one only (q_off_only) is in neither arm's accuracy, and the CI is around that delta."""
    from pipeline.accuracy.compare import Z_95, paired_difference_ci

    off, on = _gsm_arms()
    for r in (*off, *on):
        r["correct_strict"] = r["correct"]
    p = compare_records("gsm8k", off, on).paired_accuracy()
    assert (p["n"], p["off"], p["on"], p["delta"]) == (12, 4 / 12, 9 / 12, pytest.approx(5 / 12))
    assert (p["strict_off"], p["strict_on"]) == (4 / 12, 9 / 12)
    assert p["ci_low"] < p["delta"] < p["ci_high"] and p["ci_method"] == "Tango score"
    m = mcnemar(off, on)
    assert (p["ci_low"], p["ci_high"]) == (m.ci_low, m.ci_high) == paired_difference_ci(1, 6, 12)
    # repeats where no question's mean moved: not the bootstrap's [0, 0] but the bound 0 of 2 questions allows
    same = [_rec(q, k == 0, repeat=k) for q in "ab" for k in range(2)]
    g = compare_records("gpqa_diamond", same, same).paired_accuracy()
    assert (g["n"], g["off"], g["on"], g["delta"]) == (2, 0.5, 0.5, 0)
    assert (g["ci_low"], g["ci_high"]) == no_difference_ci(2)
    assert g["ci_high"] == pytest.approx(paired_difference_ci(0, 0, 2)[1]) == pytest.approx(Z_95 ** 2 / (2 + Z_95 ** 2))
    assert g["ci_method"] == "no question differs: Wilson bound" and "strict_off" not in g
