"""Are two arms' outputs the same? Pure DataFrame -> DataFrame, for any pair of output records.

Under greedy decoding an exact kernel gives the same output as the baseline, token for token; a kernel
whose numerics differ moves an argmax somewhere and the outputs part from there on. So the two figures
that matter are the fraction of identical outputs and, for the rest, the first position where they differ
(early: the answer changed; late: a tail drifted). Positions are in units of `split` (whitespace words by
default, which are tokens for the emulator; pass a tokenizer's encode for real engines, or compare
token-id lists directly).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

Split = Callable[[object], Sequence]


def _words(x) -> Sequence:
    return x.split() if isinstance(x, str) else list(x)


def first_difference(a: Sequence, b: Sequence) -> int | None:
    """Index of the first differing unit; len of the shorter one if it is a prefix; None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def output_identity(a: "pd.DataFrame", b: "pd.DataFrame", key: Sequence[str] = ("id", "repeat"),
                    col: str = "output", split: Split = _words) -> "pd.DataFrame":
    """Inner join of two arms' output records on `key` -> key... | len_a | len_b | identical | first_diff.

    Rows with a missing output in either arm (failed requests) are dropped: they say nothing of the
    kernel. `first_diff` is NaN where the outputs are identical."""
    import pandas as pd

    key = list(key)
    m = a[key + [col]].merge(b[key + [col]], on=key, suffixes=("_a", "_b"))
    m = m[m[f"{col}_a"].notna() & m[f"{col}_b"].notna()]
    ua = [split(x) for x in m[f"{col}_a"]]
    ub = [split(x) for x in m[f"{col}_b"]]
    first = [first_difference(x, y) for x, y in zip(ua, ub)]
    return pd.DataFrame({**{k: m[k].to_numpy() for k in key}, "len_a": [len(x) for x in ua],
                         "len_b": [len(y) for y in ub], "identical": [f is None for f in first],
                         "first_diff": [np.nan if f is None else float(f) for f in first]})


def identity_summary(pairs: "pd.DataFrame") -> dict:
    """{n, identical, fraction_identical, median_first_diff, min_first_diff} of an output_identity frame."""
    n = len(pairs)
    same = int(pairs["identical"].sum()) if n else 0
    diffs = pairs["first_diff"].dropna()
    return {"n": n, "identical": same, "fraction_identical": same / n if n else float("nan"),
            "median_first_diff": float(diffs.median()) if len(diffs) else float("nan"),
            "min_first_diff": float(diffs.min()) if len(diffs) else float("nan")}
