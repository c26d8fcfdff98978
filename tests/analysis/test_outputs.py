"""Output identity between two arms, by hand: identical fraction and first differing position."""
from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.outputs import first_difference, identity_summary, output_identity


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
