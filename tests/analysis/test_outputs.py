"""Output identity between two arms, by hand: identical fraction, first differing position, logprob drift."""
from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.outputs import drift_summary, first_difference, identity_summary, logprob_drift, output_identity


def test_first_difference():
    assert first_difference("a b c".split(), "a b c".split()) is None
    assert first_difference("a b c".split(), "a x c".split()) == 1
    assert first_difference("a b".split(), "a b c".split()) == 2     # a prefix differs where it stops
    assert first_difference([1, 2, 3], [1, 2, 4]) == 2                 # token ids work the same


def test_output_identity_and_summary():
    a = pd.DataFrame({"id": ["q1", "q2", "q3", "q4"], "repeat": 0,
                      "output": ["one two three", "one two three", "x y", None]})
    b = pd.DataFrame({"id": ["q1", "q2", "q3", "q4", "q5"], "repeat": 0,
                      "output": ["one two three", "one two four", "z y", "a", "b"]})
    m = output_identity(a, b)
    assert list(m["id"]) == ["q1", "q2", "q3"]           # q4 failed in a, q5 only in b: not compared
    assert list(m["identical"]) == [True, False, False]
    assert m["first_diff"].tolist()[1:] == [2.0, 0.0] and np.isnan(m["first_diff"][0])
    s = identity_summary(m)
    assert (s["n"], s["identical"], s["min_first_diff"], s["median_first_diff"]) == (3, 1, 0.0, 1.0)
    assert s["fraction_identical"] == 1 / 3
    ids = output_identity(a.assign(output=[[1, 2], [1, 2], [3], None]), b.assign(output=[[1, 2], [1], [3], [0], [0]]),
                          split=list)
    assert ids["identical"].tolist() == [True, False, True]


def test_logprob_drift_compares_only_the_tokens_both_arms_chose():
    a = pd.DataFrame({"id": ["q1", "q2", "q3", "q4"], "repeat": 0,
                      "tokens": [["a", "b", "c"], ["a", "b", "c"], ["x"], None],
                      "token_logprobs": [[-0.5, -1.0, -2.0], [-0.5, -1.0, -2.0], [-0.1], None]})
    b = pd.DataFrame({"id": ["q1", "q2", "q3", "q4"], "repeat": 0,
                      "tokens": [["a", "b", "c"], ["a", "b", "z"], ["y"], ["a"]],
                      "token_logprobs": [[-0.5, -1.0, -2.0], [-0.5, -1.25, -9.0], [-0.1], [-1.0]]})
    d = logprob_drift(a, b)
    assert list(d["id"]) == ["q1", "q2", "q3"]          # q4 has no logprobs in a
    # q1 the same throughout; q2 shares "a b" (its third token differs: -9.0 is not compared); q3 shares nothing
    assert d["shared"].tolist() == [3, 2, 0] and d["moved"].tolist() == [0, 1, 0]
    assert d["max_abs"].tolist()[:2] == [0.0, 0.25] and np.isnan(d["max_abs"][2])
    s = drift_summary(d)
    assert (s["n"], s["shared"], s["moved"], s["max_abs"], s["median_max_abs"]) == (3, 5, 1, 0.25, 0.125)
    assert s["fraction_moved"] == 1 / 5


def test_logprob_drift_without_logprob_columns_is_empty():
    a = pd.DataFrame({"id": ["q1"], "repeat": 0, "output": ["a"]})
    assert logprob_drift(a, a).empty and drift_summary(logprob_drift(a, a))["n"] == 0
